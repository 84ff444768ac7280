"""Hugging Face checkpoints: safetensors (single or sharded), memory-mapped, never pickle.

The safetensors library validates each file; its NumPy API copies tensors into RAM, so
the data is then mapped here with np.memmap at the offsets the header gives, and a
checkpoint never needs twice its size in memory.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from safetensors import SafetensorError, safe_open

from llama_arch import Config, read_config_json
from llama_np.errors import LlamaNpError
from quant import SAFETENSORS_DTYPES, Weight
from quant.backends import Backend
from quant.floats import bf16_to_f32

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
# safetensors dtype -> NumPy dtype of the raw data (BF16 stays raw uint16 bits)
_DTYPES = {
    "F32": np.float32, "F16": np.float16, "BF16": np.uint16, "I8": np.int8, "U8": np.uint8,
    "I16": np.int16, "U16": np.uint16, "I32": np.int32, "U32": np.uint32,
}  # fmt: skip


@dataclass
class RawTensor:
    dtype: str  # safetensors dtype name
    data: np.ndarray  # memory-mapped, read-only

    def as_f32(self) -> np.ndarray:
        if self.dtype == "BF16":
            return bf16_to_f32(self.data)
        return np.asarray(self.data, dtype=np.float32)

    def as_weight(self, backend: Backend) -> Weight:
        """A float matrix in its stored format and the backend's layout, without copying."""
        fmt = SAFETENSORS_DTYPES.get(self.dtype)
        if self.data.ndim != 2 or fmt is None:
            raise LlamaNpError(f"expected a 2-D float matrix, got {self.dtype} {self.data.shape}")
        return backend.weight_class(fmt).from_raw(self.data.shape, self.data)


@dataclass
class Checkpoint:
    config: Config
    tensors: dict[str, RawTensor]
    metadata: dict[str, str] = field(default_factory=dict)
    path: Path | None = None


def read_safetensors(path: Path) -> tuple[dict[str, RawTensor], dict[str, str]]:
    """All tensors of one .safetensors file as memory-mapped arrays, and its metadata."""
    try:
        with safe_open(str(path), framework="np") as f:  # validates header and offsets
            metadata = f.metadata() or {}
    except (SafetensorError, OSError) as e:
        raise LlamaNpError(f"{path}: not a valid safetensors file ({e})") from None
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header: dict[str, Any] = json.loads(f.read(n))
    header.pop("__metadata__", None)
    mm = np.memmap(path, dtype=np.uint8, mode="r")
    start = 8 + n
    tensors = {}
    for name, info in header.items():
        dtype = info["dtype"]
        if dtype not in _DTYPES:
            raise LlamaNpError(f"{path}: tensor {name!r} has unsupported dtype {dtype}")
        b, e = info["data_offsets"]
        data = mm[start + b : start + e].view(_DTYPES[dtype]).reshape(info["shape"])
        if not data.flags.aligned:  # BLAS wants aligned data; copy the rare misaligned one
            data = data.copy()
        tensors[name] = RawTensor(dtype, data)
    return tensors, metadata


def refuse_pickle(path: Path) -> None:
    raise LlamaNpError(
        f"{path}: pickle checkpoints (.bin/.pt/.pth) are not loaded, because loading them can "
        "execute code; convert the checkpoint to safetensors (e.g. with transformers' "
        "save_pretrained(..., safe_serialization=True))"
    )


def safetensors_files(directory: Path) -> list[Path]:
    """The checkpoint's .safetensors files, from the shard index when there is one."""
    index = directory / "model.safetensors.index.json"
    if index.exists():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
            names = sorted(set(weight_map.values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise LlamaNpError(f"{index}: not a valid shard index ({e})") from None
        files = [directory / n for n in names]
        missing = [str(f) for f in files if not f.exists()]
        if missing or any(Path(n).name != n for n in names):
            raise LlamaNpError(f"{index}: shard files missing or outside the directory: {missing}")
        return files
    files = sorted(directory.glob("*.safetensors"))
    if files:
        return files
    if any(p.suffix in PICKLE_SUFFIXES for p in directory.iterdir()):
        refuse_pickle(directory)
    raise LlamaNpError(f"{directory}: no .safetensors weights in this directory")


def load_hf_checkpoint(directory: Path) -> Checkpoint:
    """config.json plus every safetensors shard of a Hugging Face checkpoint directory."""
    config_path = directory / "config.json"
    if not config_path.exists():
        raise LlamaNpError(f"{directory}: no config.json (not a Hugging Face checkpoint)")
    config = read_config_json(config_path)
    tensors: dict[str, RawTensor] = {}
    metadata: dict[str, str] = {}
    for f in safetensors_files(directory):
        t, m = read_safetensors(f)
        tensors.update(t)
        metadata.update(m)
    return Checkpoint(config, expert_names(config.arch, language_model(tensors)), metadata,
                      directory)  # fmt: skip


MIXTRAL = {"block_sparse_moe.gate.": "mlp.gate.", ".w1.": ".gate_proj.", ".w3.": ".up_proj.",
           ".w2.": ".down_proj.", "block_sparse_moe.experts.": "mlp.experts."}  # fmt: skip


def expert_names(arch: str, tensors: dict[str, RawTensor]) -> dict[str, RawTensor]:
    """A mixture of experts' tensors under one naming: the router `mlp.gate`, each expert's
    `mlp.experts.E.{gate,up,down}_proj` (qwen3_moe's and olmoe's own). Mixtral's w1, w3, w2
    are gate, up and down; granitemoe stacks its experts in 3-D tensors (input_linear:
    gate rows then up rows; output_linear: down), cut here into views, expert by expert."""
    if arch == "mixtral":
        out = {}
        for name, t in tensors.items():
            if "block_sparse_moe." in name:
                for old, new in MIXTRAL.items():
                    name = name.replace(old, new)
            out[name] = t
        return out
    if arch != "granitemoe":
        return tensors
    out = {}
    for name, t in tensors.items():
        p, _, rest = name.partition("block_sparse_moe.")
        if rest == "router.layer.weight":
            out[p + "mlp.gate.weight"] = t
        elif rest in ("input_linear.weight", "output_linear.weight"):
            half = t.data.shape[1] // 2
            for e in range(t.data.shape[0]):
                at = f"{p}mlp.experts.{e}."
                if rest == "input_linear.weight":
                    out[at + "gate_proj.weight"] = RawTensor(t.dtype, t.data[e, :half])
                    out[at + "up_proj.weight"] = RawTensor(t.dtype, t.data[e, half:])
                else:
                    out[at + "down_proj.weight"] = RawTensor(t.dtype, t.data[e])
        else:
            out[name] = t
    return out


def language_model(tensors: dict[str, RawTensor]) -> dict[str, RawTensor]:
    """A multimodal checkpoint's language model (gemma3's Gemma3ForConditionalGeneration)
    under a plain one's names: "language_model." dropped, as llama.cpp's converter drops
    it (transformers saves "language_model.model.layers..." and reads
    "model.language_model.layers..."); the vision tower and projector left out."""
    if not any(n.startswith(("language_model.", "model.language_model.")) for n in tensors):
        return tensors
    return {n.replace("language_model.", "", 1): t for n, t in tensors.items()
            if "language_model." in n}  # fmt: skip
