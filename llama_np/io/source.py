"""A model on disk, opened: its config, its tensors by Hugging Face name (matrices already
in their format and the kernel backend's layout), and its tokenizer. A checkpoint
directory of safetensors, a .safetensors file inside one, or a .gguf file."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from llama_arch import Config, read_config_json
from llama_np.errors import LlamaNpError, UsageError
from llama_np.io.safetensors import PICKLE_SUFFIXES, Checkpoint, load_hf_checkpoint, refuse_pickle
from llama_np.io.tokenizer import Tokenizer, load_tokenizer
from llama_np.model.build import Tensor, hf_norms
from quant.backends import Backend, numpy_backend

if TYPE_CHECKING:
    from llama_np.io.gguf import Header

# Metadata key under which `llama-np quantize` records each tensor's format and shape.
FORMATS_KEY = "llama_np.formats"
# ... and says its norm weights are stored as the forward pass multiplies by them (Gemma's
# 1 + w, as a GGUF holds them), not as transformers stores them.
NORMS_KEY = "llama_np.norms"


@dataclass
class Source:
    config: Config
    tensors: dict[str, Tensor]
    tokenizer: Tokenizer | None
    path: Path
    kind: str  # "hf" or "gguf"
    file_names: dict[str, str] = field(default_factory=dict)  # HF name -> the file's, if other

    def check_tensors(self) -> None:
        """--check-tensors: every value, block scale and min of every tensor is finite, or
        a one-line error naming the first tensor that is not, as the file names it."""
        for name, t in self.tensors.items():
            if isinstance(t, np.ndarray):
                bad = np.argwhere(~np.isfinite(t))
                where = tuple(int(i) for i in bad[0]) if len(bad) else None
            else:
                where = t.first_nonfinite()
            if where is not None:
                at = ", ".join(map(str, where))
                raise LlamaNpError(
                    f"{self.path.name}: tensor {self.file_names.get(name, name)} holds NaN or "
                    f"infinity at [{at}] (a value, or the scale or min of its block)"
                )


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
            out[name] = raw.as_weight(backend) if raw.data.ndim == 2 else raw.as_f32()
    return out


def checkpoint_shape(directory: Path) -> tuple[Config, list[dict[str, str]], str, str]:
    """A checkpoint directory's shape and formats, as `gguf_shape` gives a GGUF's: (config,
    per layer each matrix's format by role, the LM head's, the embedding's), from the
    safetensors headers and llama-np's format records, reading no weight."""
    from llama_np.io.gguf import format_plan
    from quant import SAFETENSORS_DTYPES

    ckpt = load_hf_checkpoint(directory)
    try:
        formats = json.loads(ckpt.metadata.get(FORMATS_KEY, "{}"))
    except json.JSONDecodeError as e:
        raise LlamaNpError(f"{directory}: bad '{FORMATS_KEY}' metadata ({e})") from None

    def fmt_of(name: str) -> str:
        if name in formats:
            return formats[name]["format"]
        if name not in ckpt.tensors:
            raise LlamaNpError(f"{directory}: the checkpoint has no tensor {name!r}")
        return SAFETENSORS_DTYPES.get(ckpt.tensors[name].dtype, "?")

    embed = fmt_of("model.embed_tokens.weight")
    head = embed if ckpt.config.tie_embeddings else fmt_of("lm_head.weight")
    return ckpt.config, format_plan(ckpt.config, fmt_of), head, embed


def peek_config(path: str | Path) -> Header | None:
    """Read only a model's config, refusing (one line) what the engine does not run before
    anything is compiled or read: a GGUF's header (returned, for open_source to read the
    tensors it indexes), a checkpoint's config.json."""
    from llama_np.io.gguf import read_header

    path = Path(path)
    if path.suffix == ".gguf" and path.is_file():
        return read_header(path)
    if path.is_dir() and (path / "config.json").is_file():
        read_config_json(path / "config.json")
    return None


def open_source(
    path: str | Path, backend: Backend | None = None, header: Header | None = None
) -> Source:
    """Open a model; quantized matrices are laid out for `backend` (default: NumPy's) as
    they are read. `header`: the GGUF's, when peek_config has read it."""
    from llama_np.io.gguf import load_gguf, read_header

    backend = backend or numpy_backend()
    path = Path(path)
    if not path.exists():
        raise UsageError(f"{path}: no such file or directory")
    if path.suffix in PICKLE_SUFFIXES:
        refuse_pickle(path)
    if path.suffix == ".gguf":
        config, tensors, tokenizer, names = load_gguf(header or read_header(path), backend)
        return Source(config, tensors, tokenizer, path, "gguf", names)
    directory = path if path.is_dir() else path.parent
    ckpt = load_hf_checkpoint(directory)
    tensors = hf_tensors(ckpt, backend)
    if ckpt.metadata.get(NORMS_KEY) != "as used":
        tensors = hf_norms(ckpt.config, tensors)
    return Source(ckpt.config, tensors, load_tokenizer(directory), directory, "hf")
