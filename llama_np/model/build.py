"""From a checkpoint's tensors to the model's weights: check every tensor against the
config, put each matrix in the format asked for and the backend's layout (once, at load
time), stack the matrices that read the same input, and pack them into one arena."""

from __future__ import annotations

import numpy as np
from tqdm import tqdm

from llama_arch import MIXER_VECTORS, Config, layer_matrices, layer_vectors
from llama_arch.families import FAMILIES
from llama_np.errors import LlamaNpError
from llama_np.model.transformer import ConvMixer, DeltaMixer, Experts, Layer, Weights
from quant import Matrix, Weight, arena, stacked
from quant.backends import Backend, numpy_backend

Tensor = Weight | np.ndarray  # a matrix in some format, or a float32 vector (norms, biases)


def layer_tensor_names(i: int, c: Config) -> dict[str, str]:
    """The Hugging Face names of layer i's tensors, by role (llama_arch.tensors; phi3's
    fused q, k, v and gate, up as the roles wqkv and w_gate_up)."""
    p = f"model.layers.{i}."
    if c.arch == "lfm2":
        return lfm2_names(p, c.mixer(i))
    sandwich = c.pre_norm and c.post_norm  # post_attention_layernorm is then the post-norm
    names = {
        "wq": p + "self_attn.q_proj.weight",
        "wk": p + "self_attn.k_proj.weight",
        "wv": p + "self_attn.v_proj.weight",
        "wo": p + "self_attn.o_proj.weight",
        "w_gate": p + "mlp.gate_proj.weight",
        "w_up": p + "mlp.up_proj.weight",
        "w_down": p + "mlp.down_proj.weight",
    }
    if c.n_experts > 1:  # the experts' MLPs instead (expert_names)
        names = {k: v for k, v in names.items() if not k.startswith(("w_gate", "w_up", "w_down"))}
    if c.arch == "phi3":
        names = {k: v for k, v in names.items() if k in ("wo", "w_down")}
        names |= {"wqkv": p + "self_attn.qkv_proj.weight",
                  "w_gate_up": p + "mlp.gate_up_proj.weight"}  # fmt: skip
    if c.pre_norm:
        mlp_norm = "pre_feedforward_layernorm" if sandwich else "post_attention_layernorm"
        names |= {"attn_norm": p + "input_layernorm.weight", "mlp_norm": f"{p}{mlp_norm}.weight"}
    if c.post_norm:
        names |= {"attn_post_norm": p + "post_attention_layernorm.weight",
                  "mlp_post_norm": p + "post_feedforward_layernorm.weight"}  # fmt: skip
    if c.mixer(i) == "delta":
        return {k: v for k, v in names.items() if k[0] != "w" or k.startswith("w_")} | delta_names(
            p
        )
    if c.qk_norm:
        names |= {"q_norm": p + "self_attn.q_norm.weight", "k_norm": p + "self_attn.k_norm.weight"}
    if c.ple_dim:
        names |= {"ple_gate": p + "per_layer_input_gate.weight",
                  "ple_proj": p + "per_layer_projection.weight",
                  "ple_norm": p + "post_per_layer_input_norm.weight"}  # fmt: skip
    if c.layer_scalar:
        names["layer_scalar"] = p + "layer_scalar"
    if c.kv_source(i) != i:  # a shared KV layer: no keys or values of its own
        names = {k: v for k, v in names.items() if k not in ("wk", "wv", "k_norm")}
    biases = {f"b{x}": f"{p}self_attn.{x}_proj.bias" for x in "qkv"} if c.qkv_bias else {}
    return names | biases | expert_names(p, c)


def delta_names(p: str) -> dict[str, str]:
    """A gated delta net's tensors (Qwen3.5's linear_attn): "a" is llama-np's name for
    -exp(A_log), the decay rates, as a GGUF stores them (hf_hybrid makes it)."""
    a = p + "linear_attn."
    return {"d_qkv": a + "in_proj_qkv.weight", "d_z": a + "in_proj_z.weight",
            "d_b": a + "in_proj_b.weight", "d_a": a + "in_proj_a.weight",
            "wo": a + "out_proj.weight", "conv": a + "conv1d.weight", "dt_bias": a + "dt_bias",
            "a": a + "A", "d_norm": a + "norm.weight"}  # fmt: skip


def lfm2_names(p: str, mixer: str) -> dict[str, str]:
    """LFM2's layer: norms before the mixer and the MLP, the MLP as w1, w3, w2; a short
    convolution's in_proj, conv and out_proj, or attention with per-head q and k norms."""
    names = {"attn_norm": p + "operator_norm.weight", "mlp_norm": p + "ffn_norm.weight",
             "w_gate": p + "feed_forward.w1.weight", "w_up": p + "feed_forward.w3.weight",
             "w_down": p + "feed_forward.w2.weight"}  # fmt: skip
    if mixer == "conv":
        return names | {"c_in": p + "conv.in_proj.weight", "conv": p + "conv.conv.weight",
                        "wo": p + "conv.out_proj.weight"}  # fmt: skip
    a = p + "self_attn."
    return names | {"wq": a + "q_proj.weight", "wk": a + "k_proj.weight",
                    "wv": a + "v_proj.weight", "wo": a + "out_proj.weight",
                    "q_norm": a + "q_layernorm.weight",
                    "k_norm": a + "k_layernorm.weight"}  # fmt: skip


PLE_NAMES = {
    "ple_embed": "model.embed_tokens_per_layer.weight",
    "ple_proj": "model.per_layer_model_projection.weight",
    "ple_norm": "model.per_layer_projection_norm.weight",
}  # gemma4's, by role


def ple_shapes(c: Config) -> dict[str, tuple[int, ...]]:
    """Gemma 4's per-layer embeddings: the table (a row of every layer's per token), the
    projection of the embedding beside it, its norm."""
    width = c.n_layers * c.ple_dim
    return {"ple_embed": (c.vocab_size, width), "ple_proj": (width, c.dim),
            "ple_norm": (c.ple_dim,)}  # fmt: skip


def final_norm_name(c: Config) -> str:
    """The final norm's Hugging Face name (LFM2 calls it the embedding norm)."""
    return "model.embedding_norm.weight" if c.arch == "lfm2" else "model.norm.weight"


def expert_names(p: str, c: Config) -> dict[str, str]:
    """A mixture of experts' router and experts (the roles router, w_gate.E, w_up.E,
    w_down.E), in the one naming io.safetensors.expert_names and io.gguf give them."""
    if c.n_experts <= 1:
        return {}
    names = {"router": p + "mlp.gate.weight"}
    for e in range(c.n_experts):
        for role, proj in (("w_gate", "gate_proj"), ("w_up", "up_proj"), ("w_down", "down_proj")):
            names[f"{role}.{e}"] = f"{p}mlp.experts.{e}.{proj}.weight"
    return names


def layer_shapes(c: Config, i: int = 0) -> dict[str, tuple[int, ...]]:
    """The shape of each of layer i's tensors by role, the fused ones included (an
    expert's role, w_gate.E, has w_gate's shape: role_shape)."""
    shapes: dict[str, tuple[int, ...]] = dict(layer_matrices(c, i))
    shapes["wqkv"] = (c.q_dim + 2 * c.kv_dim, c.dim)
    shapes["w_gate_up"] = (2 * c.hidden_dim, c.dim)
    shapes["router"] = (c.n_experts, c.dim)
    return shapes | {k: (n,) for k, n in layer_vectors(c, i).items()}


def role_shape(shapes: dict[str, tuple[int, ...]], role: str) -> tuple[int, ...]:
    return shapes[role.split(".")[0]]


def hf_norms(c: Config, tensors: dict[str, Tensor]) -> dict[str, Tensor]:
    """A Hugging Face checkpoint's norm weights as the forward pass multiplies by them:
    Gemma's and Qwen3.5's stored w as 1 + w (in float32, as transformers adds them;
    llama.cpp's converter stores the sum in the GGUF); a delta net's A_log as the decay
    rates -exp(A_log) (what a GGUF stores)."""
    out = dict(tensors)
    for name, t in tensors.items():
        if name.endswith("linear_attn.A_log"):
            out[name.removesuffix("_log")] = -np.exp(np.asarray(t, np.float32))
            del out[name]
        # Qwen3.5's delta net's output norm is x * w, its others x * (1 + w)
        plus_one = FAMILIES[c.arch].norm_plus_one and not name.endswith("linear_attn.norm.weight")
        if plus_one and name.endswith("norm.weight") and isinstance(t, np.ndarray):
            out[name] = np.float32(1) + np.asarray(t, np.float32)
    return out


def _get(tensors: dict[str, Tensor], name: str, shape: tuple[int, ...],
         flat: bool = False) -> Tensor:  # fmt: skip
    """The tensor `name` checked against `shape`; `flat`: a recurrent mixer's own weights
    (a convolution's (channels, 1, kernel) or (channels, kernel)), flattened to float32."""
    if name not in tensors:
        raise LlamaNpError(f"the checkpoint has no tensor {name!r}")
    t = tensors[name]
    if flat:
        t = t.dequantize() if isinstance(t, Weight) else np.asarray(t, np.float32)
        if t.size != shape[0]:
            raise LlamaNpError(f"tensor {name!r} has shape {tuple(t.shape)}, the config "
                               f"implies {shape[0]} values")  # fmt: skip
        return t.reshape(-1)
    if tuple(t.shape) != shape or (len(shape) == 2) != isinstance(t, Weight):
        raise LlamaNpError(
            f"tensor {name!r} has shape {tuple(t.shape)}, the config implies {shape}"
        )
    return t


def checked_tensors(c: Config, tensors: dict[str, Tensor]) -> tuple[list[dict], dict]:
    """Every tensor the model needs, checked against the config before any compute: per
    layer by role, and the global ones ("embed", "norm", "head": None when tied)."""
    if not c.qkv_bias and (extra := next((n for n in tensors if n.endswith("_proj.bias")), None)):
        raise LlamaNpError(f"tensor {extra!r}: biases are not supported for {c.arch}")
    layers = []
    for i in range(c.n_layers):
        shapes, names = layer_shapes(c, i), layer_tensor_names(i, c).items()
        layers.append({k: _get(tensors, n, role_shape(shapes, k), k in MIXER_VECTORS)
                       for k, n in names})  # fmt: skip
    embed = _get(tensors, "model.embed_tokens.weight", (c.vocab_size, c.dim))
    tied = c.tie_embeddings or "lm_head.weight" not in tensors
    head = None if tied else _get(tensors, "lm_head.weight", (c.vocab_size, c.dim))
    norm = _get(tensors, final_norm_name(c), (c.dim,))
    ple = {}
    if c.ple_dim:
        ple = {k: _get(tensors, PLE_NAMES[k], shape) for k, shape in ple_shapes(c).items()}
    return layers, {"embed": embed, "norm": norm, "head": head} | ple


def vector(v: np.ndarray | None) -> np.ndarray | None:
    """A norm weight or bias as the kernels take it: float32, contiguous, writable (a
    file's read-only memory map would type a compiled kernel apart from the one-call
    decode step's copies: a specialization of its own, optimized apart); None: none."""
    return None if v is None else np.array(v, np.float32)


def _assemble(c: Config, layers: list[dict], embed: Matrix, head: Matrix,
              glob: dict) -> Weights:  # fmt: skip
    out = []
    for m in layers:
        bias = vector(np.concatenate([m["bq"], m["bk"], m["bv"]])) if c.qkv_bias else None
        v = {k: vector(m.get(k)) for k in ("attn_norm", "mlp_norm", "attn_post_norm",
                                           "mlp_post_norm", "q_norm", "k_norm", "ple_norm",
                                           "layer_scalar")}  # fmt: skip
        experts = None
        if c.n_experts > 1:
            experts = Experts(m["router"], [m[f"w_gate_up.{e}"] for e in range(c.n_experts)],
                              [m[f"w_down.{e}"] for e in range(c.n_experts)])  # fmt: skip
        out.append(Layer(wqkv=m.get("wqkv"), wo=m["wo"], w_gate_up=m.get("w_gate_up"),
                         w_down=m.get("w_down"), qkv_bias=bias, experts=experts,
                         mixer=mixer_of(c, m), ple_gate=m.get("ple_gate"),
                         ple_proj=m.get("ple_proj"), **v))  # fmt: skip
    return Weights(embed=embed, layers=out, norm=vector(glob["norm"]), lm_head=head,
                   ple_embed=glob.get("ple_embed"), ple_proj=glob.get("ple_proj"),
                   ple_norm=vector(glob.get("ple_norm")))  # fmt: skip


def taps(conv: np.ndarray, kernel: int) -> np.ndarray:
    """A depthwise convolution's weights, stored (channels, kernel), as the mixers take
    them: (kernel, channels), each tap's row contiguous along the channels."""
    return np.ascontiguousarray(vector(conv).reshape(-1, kernel).T)


def mixer_of(c: Config, m: dict) -> DeltaMixer | ConvMixer | None:
    """A layer's recurrent mixer from its tensors by role (None: it attends)."""
    if "d_in" in m:
        kernel = c.delta.kernel
        return DeltaMixer(m["d_in"], taps(m["conv"], kernel), vector(m["dt_bias"]),
                          vector(m["a"]), vector(m["d_norm"]))  # fmt: skip
    if "c_in" in m:
        return ConvMixer(m["c_in"], taps(m["conv"], c.conv_kernel))
    return None


def build_weights(
    config: Config,
    tensors: dict[str, Tensor],
    fmt: str | None = None,
    head_fmt: str | None = None,
    progress: bool = False,
    backend: Backend | None = None,
    consume: bool = False,
) -> Weights:
    """The model's weights: matrices converted to `fmt` (None keeps each as stored; the LM
    head may get its own format) in the backend's layout (default: NumPy's). `consume`:
    empty `tensors` once read, so that each matrix the arena has copied is freed (a file's
    matrices loaded in the compiled layout are already copies: held by `tensors` too, a
    model needed twice its size until built)."""
    c, backend = config, backend or numpy_backend()
    for f in (fmt, head_fmt):
        if f is not None:
            backend.weight_class(f)  # an unknown format fails before any work
    layers, glob = checked_tensors(c, tensors)
    if consume:
        tensors.clear()
    tied = glob["head"] is None
    ple = [k for k in ("ple_embed", "ple_proj") if k in glob]
    todo = sum(isinstance(v, Weight) for r in layers for v in r.values()) + 2 - tied + len(ple)
    bar = tqdm(
        total=todo,
        desc=f"weights -> {fmt}",
        unit="matrix",
        disable=None if progress and fmt else True,
    )

    def to(w: Weight, f: str | None) -> Weight:
        out = backend.convert(w, f)
        bar.update()
        return out

    head_fmt = head_fmt or fmt
    embed = to(glob["embed"], head_fmt if tied else fmt)
    head = embed if tied else to(glob["head"], head_fmt)
    for m in layers:  # the router stays float32, as llama.cpp keeps it
        m.update({k: to(v, "f32" if k == "router" else fmt) for k, v in m.items()
                  if isinstance(v, Weight)})  # fmt: skip
        if "d_qkv" in m:  # a delta net's input projections, one product
            m["d_in"] = stacked([m.pop(f"d_{x}") for x in ("qkv", "z", "b", "a")])
        elif "wq" in m:  # attention's, unless stored fused (phi3): as it is (a shared KV
            # layer's q alone)
            m["wqkv"] = stacked([m.pop(k) for k in ("wq", "wk", "wv") if k in m])
        for e in [None] if c.n_experts <= 1 else range(c.n_experts):
            at = "" if e is None else f".{e}"
            if f"w_gate_up{at}" not in m:
                m[f"w_gate_up{at}"] = stacked([m.pop(f"w_gate{at}"), m.pop(f"w_up{at}")])
    # the per-layer table read by rows as the embedding is, its projection as the layers
    extra = [to(glob.pop(k), head_fmt if tied and k == "ple_embed" else fmt) for k in ple]
    bar.close()
    keys = [[k for k, v in m.items() if isinstance(v, Matrix)] for m in layers]
    matrices = [embed, head, *extra]
    matrices += [m.pop(k) for m, ks in zip(layers, keys, strict=True) for k in ks]
    del embed, head, extra  # pack frees each matrix once it is in the arena
    (embed, head, *rest), _ = arena.pack(matrices)  # the arrays keep the arena alive
    glob |= dict(zip(ple, rest[: len(ple)], strict=True))
    rest = rest[len(ple) :]
    for m, ks in zip(layers, keys, strict=True):
        m.update(zip(ks, rest[: len(ks)], strict=True))
        rest = rest[len(ks) :]
    return _assemble(c, layers, embed, head, glob)
