"""From a path to a ready model: find the checkpoint, check every tensor against the config,
and put each matrix in the weight format asked for (once, at load time)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from quant import Weight, stack_rows
from quant.backends import Backend, numpy_backend

from .checkpoint import PICKLE_SUFFIXES, Checkpoint, load_hf_checkpoint, refuse_pickle
from .config import Config
from .errors import LlamaNpError, UsageError
from .model import Layer, Weights
from .tokenizer import Tokenizer, load_tokenizer

# Metadata key under which `llama-np quantize` records each tensor's format and shape.
FORMATS_KEY = "llama_np.formats"

Tensor = Weight | np.ndarray  # a matrix in some format, or a float32 vector (norms)


@dataclass
class Source:
    """A loaded checkpoint before weights are built: config, tensors by HF name, tokenizer."""

    config: Config
    tensors: dict[str, Tensor]
    tokenizer: Tokenizer | None
    path: Path
    kind: str  # "hf" or "gguf"


def hf_tensors(ckpt: Checkpoint, backend: Backend) -> dict[str, Tensor]:
    """Tensors by name: float matrices as stored, quantized ones rebuilt from their parts
    in the backend's layout."""
    try:
        formats = json.loads(ckpt.metadata.get(FORMATS_KEY, "{}"))
    except json.JSONDecodeError as e:
        raise LlamaNpError(f"{ckpt.path}: bad '{FORMATS_KEY}' metadata ({e})") from None
    out: dict[str, Tensor] = {}
    used: set[str] = set()
    for name, spec in formats.items():
        parts = {
            k[len(name) + 1 :]: t.data for k, t in ckpt.tensors.items() if k.startswith(name + ":")
        }
        used.update(f"{name}:{k}" for k in parts)
        try:
            cls = backend.weight_class(spec["format"])
            out[name] = cls.from_arrays(tuple(spec["shape"]), parts)
        except (KeyError, TypeError, ValueError) as e:
            raise LlamaNpError(f"{ckpt.path}: tensor {name!r} cannot be read ({e})") from None
    for name, raw in ckpt.tensors.items():
        if name not in used:
            out[name] = raw.as_weight() if raw.data.ndim == 2 else raw.as_f32()
    return out


def open_source(path: str | Path, backend: Backend | None = None) -> Source:
    """A checkpoint directory, a .safetensors file inside one, or a .gguf file; quantized
    matrices are laid out for `backend` (default: NumPy's) as they are read."""
    backend = backend or numpy_backend()
    path = Path(path)
    if not path.exists():
        raise UsageError(f"{path}: no such file or directory")
    if path.suffix in PICKLE_SUFFIXES:
        refuse_pickle(path)
    if path.suffix == ".gguf":
        from .gguf_loader import load_gguf

        return load_gguf(path, backend)
    directory = path if path.is_dir() else path.parent
    ckpt = load_hf_checkpoint(directory)
    tensors = hf_tensors(ckpt, backend)
    return Source(ckpt.config, tensors, load_tokenizer(directory), directory, "hf")


def layer_tensor_names(i: int, c: Config | None = None) -> dict[str, str]:
    """The HF names of layer i's tensors (with q, k, v biases when the config has them)."""
    p = f"model.layers.{i}."
    biases = {
        f"b{x}": f"{p}self_attn.{x}_proj.bias" for x in "qkv"
    } if c is not None and c.qkv_bias else {}  # fmt: skip
    return biases | {
        "attn_norm": p + "input_layernorm.weight",
        "wq": p + "self_attn.q_proj.weight",
        "wk": p + "self_attn.k_proj.weight",
        "wv": p + "self_attn.v_proj.weight",
        "wo": p + "self_attn.o_proj.weight",
        "mlp_norm": p + "post_attention_layernorm.weight",
        "w_gate": p + "mlp.gate_proj.weight",
        "w_up": p + "mlp.up_proj.weight",
        "w_down": p + "mlp.down_proj.weight",
    }


def _layer_shapes(c: Config) -> dict[str, tuple[int, ...]]:
    return {
        "bq": (c.q_dim,),
        "bk": (c.kv_dim,),
        "bv": (c.kv_dim,),
        "attn_norm": (c.dim,),
        "wq": (c.q_dim, c.dim),
        "wk": (c.kv_dim, c.dim),
        "wv": (c.kv_dim, c.dim),
        "wo": (c.dim, c.q_dim),
        "mlp_norm": (c.dim,),
        "w_gate": (c.hidden_dim, c.dim),
        "w_up": (c.hidden_dim, c.dim),
        "w_down": (c.dim, c.hidden_dim),
    }


def _get(tensors: dict[str, Tensor], name: str, shape: tuple[int, ...]) -> Tensor:
    if name not in tensors:
        raise LlamaNpError(f"the checkpoint has no tensor {name!r}")
    t = tensors[name]
    if tuple(t.shape) != shape or (len(shape) == 2) != isinstance(t, Weight):
        raise LlamaNpError(
            f"tensor {name!r} has shape {tuple(t.shape)}, the config implies {shape}"
        )
    return t


def build_weights(
    config: Config,
    tensors: dict[str, Tensor],
    fmt: str | None = None,
    head_fmt: str | None = None,
    progress: bool = False,
    backend: Backend | None = None,
) -> Weights:
    """Check every tensor's shape against the config before any compute, then convert the
    matrices to `fmt` (None keeps each as stored; the LM head may get its own format) in
    the backend's layout (default: NumPy's)."""
    c = config
    backend = backend or numpy_backend()
    for f in (fmt, head_fmt):
        if f is not None:
            backend.weight_class(f)  # an unknown format fails before any work
    names = [layer_tensor_names(i, c) for i in range(c.n_layers)]
    shapes = _layer_shapes(c)
    if not c.qkv_bias and (extra := next((n for n in tensors if n.endswith("_proj.bias")), None)):
        raise LlamaNpError(f"tensor {extra!r}: biases are not supported for {c.arch}")
    raw = [{k: _get(tensors, n[k], shapes[k]) for k in n} for n in names]
    embed = _get(tensors, "model.embed_tokens.weight", (c.vocab_size, c.dim))
    norm = _get(tensors, "model.norm.weight", (c.dim,))
    tied = c.tie_embeddings or "lm_head.weight" not in tensors
    head = embed if tied else _get(tensors, "lm_head.weight", (c.vocab_size, c.dim))

    todo = sum(1 for r in raw for v in r.values() if isinstance(v, Weight)) + 2 - tied
    bar = tqdm(total=todo, desc=f"weights -> {fmt}", unit="matrix", disable=not (progress and fmt))

    def to(w: Weight, f: str | None) -> Weight:
        out = backend.convert(w, f)
        bar.update()
        return out

    head_fmt = head_fmt or fmt
    embed_w = to(embed, head_fmt if tied else fmt)
    layers = []
    for r in raw:
        m = {k: to(v, fmt) if isinstance(v, Weight) else v for k, v in r.items()}
        bias = np.concatenate([m["bq"], m["bk"], m["bv"]]) if c.qkv_bias else None
        layers.append(
            Layer(
                attn_norm=m["attn_norm"],
                wqkv=stack_rows([m["wq"], m["wk"], m["wv"]]),
                qkv_bias=bias,
                wo=m["wo"],
                mlp_norm=m["mlp_norm"],
                w_gate_up=stack_rows([m["w_gate"], m["w_up"]]),
                w_down=m["w_down"],
            )
        )
    lm_head = embed_w if tied else to(head, head_fmt)
    bar.close()
    return Weights(embed=embed_w, layers=layers, norm=norm, lm_head=lm_head)
