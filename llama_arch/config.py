"""The description of a llama-family decoder: a frozen dataclass, checked when built."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace

from .families import MOE, SUPPORTED  # noqa: F401  (the engine's families: families.py)


class ConfigError(ValueError):
    """A configuration that is malformed, or that the engine cannot run."""

    exit_code = 1


class UnsupportedModel(ConfigError):
    """An architecture (or a mixture of experts) the engine does not run: a usage error,
    said before any weight is read."""

    exit_code = 2


@dataclass(frozen=True)
class RopeScaling:
    """Frequency scaling of RoPE, as transformers' `rope_type` "linear", "llama3",
    "longrope" (phi3: each frequency divided by a factor of its own, the short ones within
    the original context, the long ones past it, and cos and sin times attention_factor)
    and "yarn" (olmo3's global layers: the low frequencies divided by factor, the high
    ones kept, a linear ramp between them by rotations in the original context, cos and
    sin times attention_factor)."""

    kind: str  # "linear", "llama3", "longrope" or "yarn"
    factor: float
    low_freq_factor: float = 1.0  # llama3: wavelengths above original_ctx / low are / factor
    high_freq_factor: float = 4.0  # llama3: wavelengths below original_ctx / high are kept
    original_max_position_embeddings: int = 8192
    short_factor: tuple[float, ...] | None = None  # longrope: per frequency, within the original
    long_factor: tuple[float, ...] | None = None  # longrope: per frequency, past it
    attention_factor: float = 1.0  # longrope, yarn: cos and sin times this
    beta_fast: float = 32.0  # yarn: rotations in the original context above which a
    beta_slow: float = 1.0  # frequency is kept, below which it is divided by factor
    truncate: bool = True  # yarn: the ramp's ends rounded to whole dims


# A layer's token mixer (Config.layer_types): attention with its KV cache, Qwen3.5's gated
# delta net (a linear-attention recurrence with a fixed state), LFM2's short convolution.
MIXERS = ("attention", "delta", "conv")


@dataclass(frozen=True)
class DeltaNet:
    """The shape of a gated delta net's layers (Qwen3.5's linear_attention): k_heads heads of
    queries and keys of k_dim, v_heads of values of v_dim (a multiple of k_heads: each key
    head serves v_heads / k_heads value heads), a causal depthwise convolution of `kernel`
    over q, k and v. A sequence keeps, per layer, a state of v_heads x k_dim x v_dim floats
    and the last kernel - 1 inputs of the convolution."""

    k_heads: int
    v_heads: int
    k_dim: int
    v_dim: int
    kernel: int = 4
    tiled: bool = False  # value head j reads key head j % k_heads (llama.cpp's GGUF order),
    # else j // (v_heads / k_heads) (transformers')

    @property
    def key_dim(self) -> int:
        return self.k_heads * self.k_dim

    @property
    def value_dim(self) -> int:
        return self.v_heads * self.v_dim

    @property
    def conv_dim(self) -> int:
        """The channels convolved: q, k and v."""
        return 2 * self.key_dim + self.value_dim

    @property
    def state_floats(self) -> int:
        return self.v_heads * self.k_dim * self.v_dim

    def key_head(self, j: int) -> int:
        """The key head value head j reads."""
        return j % self.k_heads if self.tiled else j // (self.v_heads // self.k_heads)


@dataclass(frozen=True)
class Config:
    arch: str  # "llama", "mistral" (adds a sliding window), "qwen2" (adds q, k, v biases)
    dim: int  # width of the residual stream (hidden_size)
    n_layers: int
    n_heads: int  # query heads
    n_kv_heads: int  # key/value heads; n_heads / n_kv_heads queries share one (GQA)
    head_dim: int  # may differ from dim / n_heads, so it is stored, not derived
    hidden_dim: int  # width of the SwiGLU MLP (intermediate_size; per expert)
    vocab_size: int
    max_seq_len: int = 4096  # context the model was trained for (max_position_embeddings)
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None
    sliding_window: int | None = None  # None: full attention
    tie_embeddings: bool = False  # the LM head reuses the token embedding table
    qkv_bias: bool = False  # qwen2: the q, k and v projections add a bias
    n_experts: int = 1  # MLP experts per layer (mixture of experts)
    experts_per_token: int = 1  # how many of them a token uses
    bos_id: int | None = 1
    eos_ids: tuple[int, ...] = (2,)
    # GGUF's rope_freqs tensor: each inverse frequency is divided by its factor (how
    # llama.cpp stores Llama 3's RoPE scaling); None when absent.
    rope_freq_factors: tuple[float, ...] | None = None
    name: str = "model"  # for reports: a preset's name, a checkpoint's directory
    # --- a family's switches on the one decoder block (transformers' modeling_<family>.py) ---
    qk_norm: str | None = None  # RMSNorm of q and k before RoPE: "head" over each head (qwen3,
    # gemma3), "all" over each whole projection (olmo2)
    pre_norm: bool = True  # RMSNorm before attention and before the MLP (olmo2: none)
    post_norm: bool = False  # RMSNorm of attention's and the MLP's output before each residual
    # add (gemma2, gemma3, olmo2)
    mlp_act: str = "silu"  # the MLP's gate: "silu" (SwiGLU) or "gelu_tanh" (GeGLU: gemma)
    embed_scale: float = 1.0  # the embedding times this (gemma: sqrt(dim); granite's multiplier)
    attn_scale: float | None = None  # the scores' scale; None: 1 / sqrt(head_dim) (gemma:
    # query_pre_attn_scalar ** -0.5; granite: attention_multiplier)
    attn_softcap: float | None = None  # gemma2: scores = cap * tanh(scores / cap)
    final_softcap: float | None = None  # gemma2, gemma3: logits = cap * tanh(logits / cap)
    residual_scale: float = 1.0  # granite: x + residual_multiplier * (attention or MLP)
    logits_scaling: float = 1.0  # granite: the logits divided by this
    rotary_dim: int | None = None  # phi3: RoPE turns a head's first rotary_dim dims (partial
    # rotary), the rest pass unchanged; None: all of head_dim
    rope_local_theta: float | None = None  # gemma3: the sliding layers' RoPE base (unscaled)
    sliding_layers: tuple[bool, ...] | None = None  # which layers the window applies to
    # (gemma2, gemma3: local and global layers); None: every layer, when there is a window
    rope_layers: tuple[bool, ...] | None = None  # smollm3: layers that turn q and k (False:
    # no position encoding at all); None: every layer
    norm_topk: bool = True  # mixture of experts: the k chosen experts' softmax weights
    # renormalized to sum 1 (mixtral, granitemoe; qwen3_moe and olmoe: norm_topk_prob)
    # --- hybrids: a token mixer per layer (MIXERS) ---
    layer_types: tuple[str, ...] | None = None  # each layer's mixer; None: every layer attends
    delta: DeltaNet | None = None  # the gated delta net's shape (qwen3_5)
    conv_kernel: int = 0  # the short convolution's width (lfm2's conv_L_cache)
    attn_gate: bool = False  # qwen3_5: q_proj makes a gate per head too; the attention's
    # output is multiplied by sigmoid(gate) before o_proj
    # --- gemma4: layers of two shapes, shared KV, per-layer embeddings ---
    global_head_dim: int | None = None  # the full (not sliding) layers' head_dim; None: head_dim
    rope_proportion: float | None = None  # the full layers' "proportional" RoPE: the first
    # int(p * head_dim / 2) of the frequencies theta^(-2j / head_dim) turn, the rest are 0
    v_norm: bool = False  # v RMS-normed over each head, without a weight
    kv_shared: int = 0  # the last kv_shared layers attend to the KV of the last earlier
    # layer of their kind (sliding or full) and compute and write none
    wide_shared_mlp: bool = False  # the shared layers' MLP twice hidden_dim wide
    ple_dim: int = 0  # per-layer embeddings' width per layer (0: none): a table of vocab x
    # (n_layers * ple_dim) read one row a token, a projection of the embedding beside it,
    # gated into each layer after its MLP
    layer_scalar: bool = False  # each layer's output times a scalar weight of its own

    @property
    def q_dim(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim

    @property
    def n_rep(self) -> int:
        """How many query heads read each key/value head."""
        return self.n_heads // self.n_kv_heads

    @property
    def rotary(self) -> int:
        """The dims of a head that RoPE turns."""
        return self.rotary_dim or self.head_dim

    def is_full(self, i: int) -> bool:
        """Layer i attends to every position (not one of the sliding layers)."""
        return self.sliding_layers is None or not self.sliding_layers[i]

    def layer_head_dim(self, i: int) -> int:
        """Layer i's head_dim (gemma4's full layers: global_head_dim)."""
        return self.global_head_dim if self.global_head_dim and self.is_full(i) else self.head_dim

    def kv_source(self, i: int) -> int:
        """The layer whose keys and values layer i attends to: itself, or for one of the
        last kv_shared layers the last layer before them of its kind."""
        first = self.n_layers - self.kv_shared
        if i < first:
            return i
        return max(j for j in range(first) if self.is_full(j) == self.is_full(i))

    def at(self, i: int) -> Config:
        """The config as layer i's attention and MLP see it: its head_dim, its MLP's
        width (the same config when every layer is alike: no hash of the config, which
        this is asked for every layer of every step)."""
        if not (self.global_head_dim or self.wide_shared_mlp):
            return self
        return _layer_config(self, i)

    def mixer(self, i: int) -> str:
        """Layer i's token mixer (MIXERS)."""
        return "attention" if self.layer_types is None else self.layer_types[i]

    @property
    def attention_layers(self) -> list[int]:
        """The layers that attend (and keep a KV cache)."""
        return [i for i in range(self.n_layers) if self.mixer(i) == "attention"]

    @property
    def recurrent(self) -> bool:
        """Some layer keeps a recurrent state instead of a KV cache: a sequence's cache then
        cannot be rewound (KVCache.truncate)."""
        return self.layer_types is not None and any(t != "attention" for t in self.layer_types)

    def layer_window(self, i: int, window: int | None = None) -> int | None:
        """Layer i's sliding window: `window` on every layer when given (a user's --window),
        else the model's own (its window on its sliding layers; None: full attention)."""
        if window is not None:
            return window
        if self.sliding_layers is not None and not self.sliding_layers[i]:
            return None
        return self.sliding_window

    def layer_rope(self, i: int) -> str:
        """Which RoPE layer i turns q and k with: "global" (rope_theta, with rope_scaling),
        "local" (gemma3's sliding layers: rope_local_theta, unscaled; whatever window a
        user sets) or "none" (NoPE)."""
        if self.rope_layers is not None and not self.rope_layers[i]:
            return "none"
        local = self.sliding_layers is not None and self.sliding_layers[i]
        return "local" if local and self.rope_local_theta is not None else "global"

    @property
    def layered(self) -> bool:
        """Layers differ in shape or take more than the residual stream (gemma4's two head
        sizes, shared KV, per-layer embeddings): a batch's one-call decode step declines
        them."""
        return bool(
            self.global_head_dim
            or self.kv_shared
            or self.ple_dim
            or self.v_norm
            or self.layer_scalar
        )

    @classmethod
    def from_dict(cls, d: dict) -> Config:
        """The inverse of dataclasses.asdict (a config sent as JSON: lists for tuples)."""
        d = dict(d)
        if d.get("rope_scaling") is not None:
            r = dict(d["rope_scaling"])
            for key in ("short_factor", "long_factor"):
                if r.get(key) is not None:
                    r[key] = tuple(r[key])
            d["rope_scaling"] = RopeScaling(**r)
        for key in ("eos_ids", "rope_freq_factors", "sliding_layers", "rope_layers", "layer_types"):
            if d.get(key) is not None:
                d[key] = tuple(d[key])
        if d.get("delta") is not None:
            d["delta"] = DeltaNet(**d["delta"])
        return cls(**d)

    def __post_init__(self) -> None:
        for key in ("dim", "n_layers", "n_heads", "n_kv_heads", "head_dim", "hidden_dim",
                    "vocab_size", "max_seq_len", "n_experts", "experts_per_token"):  # fmt: skip
            if getattr(self, key) < 1:
                raise ConfigError(f"config: {key} must be positive, got {getattr(self, key)}")
        if self.n_heads % self.n_kv_heads:
            raise ConfigError(
                f"config: num_attention_heads ({self.n_heads}) is not a multiple of "
                f"num_key_value_heads ({self.n_kv_heads})"
            )
        if self.head_dim % 2:
            raise ConfigError(f"config: head_dim must be even for RoPE, got {self.head_dim}")
        if self.sliding_window is not None and self.sliding_window < 1:
            raise ConfigError(f"config: sliding_window must be positive, got {self.sliding_window}")
        if not (math.isfinite(self.norm_eps) and self.norm_eps > 0):
            raise ConfigError(
                f"config: rms_norm_eps must be a positive number, got {self.norm_eps}"
            )
        if not (math.isfinite(self.rope_theta) and self.rope_theta > 0):
            raise ConfigError(
                f"config: rope_theta must be a positive number, got {self.rope_theta}"
            )
        self._check_switches()

    def _check_switches(self) -> None:
        if self.qk_norm not in (None, "head", "all"):
            raise ConfigError(f"config: qk_norm must be 'head' or 'all', got {self.qk_norm!r}")
        if self.mlp_act not in ("silu", "gelu_tanh"):
            raise ConfigError(f"config: unsupported MLP activation {self.mlp_act!r}")
        for key in ("embed_scale", "residual_scale", "logits_scaling", "attn_scale",
                    "attn_softcap", "final_softcap", "rope_local_theta"):  # fmt: skip
            v = getattr(self, key)
            if v is not None and not (math.isfinite(v) and v > 0):
                raise ConfigError(f"config: {key} must be a positive number, got {v}")
        if self.rotary_dim is not None and (self.rotary_dim % 2 or not 0 < self.rotary_dim
                                            <= self.head_dim):  # fmt: skip
            raise ConfigError(f"config: the rotary dims ({self.rotary_dim}) must be even and "
                              f"at most head_dim ({self.head_dim})")  # fmt: skip
        for key in ("sliding_layers", "rope_layers", "layer_types"):
            v = getattr(self, key)
            if v is not None and len(v) != self.n_layers:
                raise ConfigError(f"config: {key} names {len(v)} layers of {self.n_layers}")
        self._check_mixers()
        self._check_layered()
        r = self.rope_scaling
        if r is not None and r.kind == "longrope":
            for f in (r.short_factor, r.long_factor):
                if f is None or len(f) != self.rotary // 2 or not all(x > 0 for x in f):
                    raise ConfigError(f"config: longrope wants {self.rotary // 2} positive "
                                      "short and long factors")  # fmt: skip

    def _check_mixers(self) -> None:
        types = self.layer_types or ()
        if bad := next((t for t in types if t not in MIXERS), None):
            raise UnsupportedModel(f"config: a layer's mixer {bad!r} is not supported "
                                   f"(supported: {', '.join(MIXERS)})")  # fmt: skip
        d = self.delta
        if "delta" in types:
            if d is None:
                raise ConfigError("config: delta-net layers need the delta net's shape")
            if min(d.k_heads, d.v_heads, d.k_dim, d.v_dim, d.kernel) < 1:
                raise ConfigError(f"config: the delta net's dimensions must be positive: {d}")
            if d.v_heads % d.k_heads:
                raise ConfigError(f"config: linear_num_value_heads ({d.v_heads}) is not a "
                                  f"multiple of linear_num_key_heads ({d.k_heads})")  # fmt: skip
        if "conv" in types and self.conv_kernel < 1:
            raise ConfigError(f"config: conv_L_cache must be positive, got {self.conv_kernel}")

    def _check_layered(self) -> None:
        if self.global_head_dim is not None and (
            self.global_head_dim < 2 or self.global_head_dim % 2
        ):
            raise ConfigError(f"config: global_head_dim must be even, got {self.global_head_dim}")
        if self.rope_proportion is not None and not 0 <= self.rope_proportion <= 1:
            raise ConfigError(f"config: the full layers' partial_rotary_factor must be in "
                              f"[0, 1], got {self.rope_proportion}")  # fmt: skip
        if not 0 <= self.kv_shared < self.n_layers or self.ple_dim < 0:
            raise ConfigError(f"config: num_kv_shared_layers ({self.kv_shared}) must be below "
                              f"the layers ({self.n_layers})")  # fmt: skip
        if self.kv_shared:
            if self.layer_types is not None:
                raise ConfigError("config: shared KV layers in a hybrid are not supported")
            first = self.n_layers - self.kv_shared
            kinds = {self.is_full(j) for j in range(first)}
            if any(self.is_full(i) not in kinds for i in range(first, self.n_layers)):
                raise ConfigError("config: a shared KV layer has no earlier layer of its kind")


@functools.lru_cache(maxsize=256)
def _layer_config(c: Config, i: int) -> Config:
    """Config.at: layer i's head_dim and MLP width, the rest as the model's."""
    head_dim = c.layer_head_dim(i)
    wide = c.wide_shared_mlp and c.kv_source(i) != i
    hidden = 2 * c.hidden_dim if wide else c.hidden_dim
    if head_dim == c.head_dim and hidden == c.hidden_dim:
        return c
    return replace(c, head_dim=head_dim, hidden_dim=hidden, global_head_dim=None,
                   wide_shared_mlp=False)  # fmt: skip
