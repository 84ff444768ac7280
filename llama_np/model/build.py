"""From a checkpoint's tensors to the model's weights: check every tensor against the
config, put each matrix in the format asked for and the backend's layout (once, at load
time), stack the matrices that read the same input, and pack them into one arena."""

from __future__ import annotations

import numpy as np
from tqdm import tqdm

from llama_arch import Config, layer_matrices, layer_vectors
from llama_np.errors import LlamaNpError
from llama_np.model.transformer import Experts, Layer, Weights
from quant import Matrix, Weight, arena, stack_rows
from quant.backends import Backend, numpy_backend

Tensor = Weight | np.ndarray  # a matrix in some format, or a float32 vector (norms, biases)


def layer_tensor_names(i: int, c: Config) -> dict[str, str]:
    """The Hugging Face names of layer i's tensors, by role (llama_arch.tensors; phi3's
    fused q, k, v and gate, up as the roles wqkv and w_gate_up)."""
    p = f"model.layers.{i}."
    gemma = c.arch in ("gemma2", "gemma3")
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
        mlp_norm = "pre_feedforward_layernorm" if gemma else "post_attention_layernorm"
        names |= {"attn_norm": p + "input_layernorm.weight", "mlp_norm": f"{p}{mlp_norm}.weight"}
    if c.post_norm:
        names |= {"attn_post_norm": p + "post_attention_layernorm.weight",
                  "mlp_post_norm": p + "post_feedforward_layernorm.weight"}  # fmt: skip
    if c.qk_norm:
        names |= {"q_norm": p + "self_attn.q_norm.weight", "k_norm": p + "self_attn.k_norm.weight"}
    biases = {f"b{x}": f"{p}self_attn.{x}_proj.bias" for x in "qkv"} if c.qkv_bias else {}
    return names | biases | expert_names(p, c)


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


def layer_shapes(c: Config) -> dict[str, tuple[int, ...]]:
    """The shape of each of a layer's tensors by role, the fused ones included (an
    expert's role, w_gate.E, has w_gate's shape: role_shape)."""
    shapes: dict[str, tuple[int, ...]] = dict(layer_matrices(c))
    shapes["wqkv"] = (c.q_dim + 2 * c.kv_dim, c.dim)
    shapes["w_gate_up"] = (2 * c.hidden_dim, c.dim)
    shapes["router"] = (c.n_experts, c.dim)
    return shapes | {k: (n,) for k, n in layer_vectors(c).items()}


def role_shape(shapes: dict[str, tuple[int, ...]], role: str) -> tuple[int, ...]:
    return shapes[role.split(".")[0]]


NORM_PLUS_ONE = ("gemma2", "gemma3")  # transformers' Gemma RMSNorm: x * (1 + w)


def hf_norms(c: Config, tensors: dict[str, Tensor]) -> dict[str, Tensor]:
    """A Hugging Face checkpoint's norm weights as the forward pass multiplies by them:
    Gemma's stored w as 1 + w (in float32, as transformers adds them; llama.cpp's converter
    stores the sum in the GGUF)."""
    if c.arch not in NORM_PLUS_ONE:
        return tensors
    out = dict(tensors)
    for name, t in tensors.items():
        if name.endswith("norm.weight") and isinstance(t, np.ndarray):
            out[name] = np.float32(1) + np.asarray(t, np.float32)
    return out


def _get(tensors: dict[str, Tensor], name: str, shape: tuple[int, ...]) -> Tensor:
    if name not in tensors:
        raise LlamaNpError(f"the checkpoint has no tensor {name!r}")
    t = tensors[name]
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
    shapes = layer_shapes(c)
    layers = []
    for i in range(c.n_layers):
        names = layer_tensor_names(i, c).items()
        layers.append({k: _get(tensors, n, role_shape(shapes, k)) for k, n in names})
    embed = _get(tensors, "model.embed_tokens.weight", (c.vocab_size, c.dim))
    tied = c.tie_embeddings or "lm_head.weight" not in tensors
    head = None if tied else _get(tensors, "lm_head.weight", (c.vocab_size, c.dim))
    norm = _get(tensors, "model.norm.weight", (c.dim,))
    return layers, {"embed": embed, "norm": norm, "head": head}


def vector(v: np.ndarray | None) -> np.ndarray | None:
    """A norm weight or bias as the kernels take it: float32, contiguous, writable (a
    file's read-only memory map would type a compiled kernel apart from the one-call
    decode step's copies: a specialization of its own, optimized apart); None: none."""
    return None if v is None else np.array(v, np.float32)


def _assemble(c: Config, layers: list[dict], embed: Matrix, head: Matrix,
              norm: np.ndarray) -> Weights:  # fmt: skip
    out = []
    for m in layers:
        bias = vector(np.concatenate([m["bq"], m["bk"], m["bv"]])) if c.qkv_bias else None
        v = {k: vector(m.get(k)) for k in ("attn_norm", "mlp_norm", "attn_post_norm",
                                           "mlp_post_norm", "q_norm", "k_norm")}  # fmt: skip
        experts = None
        if c.n_experts > 1:
            experts = Experts(m["router"], [m[f"w_gate_up.{e}"] for e in range(c.n_experts)],
                              [m[f"w_down.{e}"] for e in range(c.n_experts)])  # fmt: skip
        out.append(Layer(wqkv=m["wqkv"], wo=m["wo"], w_gate_up=m.get("w_gate_up"),
                         w_down=m.get("w_down"), qkv_bias=bias, experts=experts, **v))  # fmt: skip
    return Weights(embed=embed, layers=out, norm=vector(norm), lm_head=head)


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
    todo = sum(isinstance(v, Weight) for r in layers for v in r.values()) + 2 - tied
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
        if "wqkv" not in m:  # stored fused (phi3): as it is
            m["wqkv"] = stack_rows([m.pop("wq"), m.pop("wk"), m.pop("wv")])
        for e in [None] if c.n_experts <= 1 else range(c.n_experts):
            at = "" if e is None else f".{e}"
            if f"w_gate_up{at}" not in m:
                m[f"w_gate_up{at}"] = stack_rows([m.pop(f"w_gate{at}"), m.pop(f"w_up{at}")])
    bar.close()
    keys = [[k for k, v in m.items() if isinstance(v, Matrix)] for m in layers]
    matrices = [embed, head] + [m.pop(k) for m, ks in zip(layers, keys, strict=True) for k in ks]
    del embed, head  # pack frees each matrix once it is in the arena
    (embed, head, *rest), _ = arena.pack(matrices)  # the arrays keep the arena alive
    for m, ks in zip(layers, keys, strict=True):
        m.update(zip(ks, rest[: len(ks)], strict=True))
        rest = rest[len(ks) :]
    return _assemble(c, layers, embed, head, glob["norm"])
