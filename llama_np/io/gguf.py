"""GGUF files, read with the gguf package's memory-mapped reader.

Metadata becomes a Config (gguf_config.py: the architectures llama.cpp's converter writes
for the families the engine runs), tensors keep their stored
format (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K..Q6_K) unless the caller
converts them, and the vocabulary becomes a tokenizers-library
tokenizer: byte-level BPE (`gpt2`, with the pre-tokenizer `tokenizer.ggml.pre` names) or
sentencepiece-style BPE (`llama`, tokens and scores).

For the families llama.cpp runs with its NORM RoPE (llama, smollm3, granite) its converter
permutes the rows of the Q and K projections so that its RoPE can rotate adjacent pairs;
this engine rotates halves (transformers' convention), so the permutation is undone here,
on whole rows, which leaves quantized blocks intact.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from llama_arch import Config, layer_roles
from llama_np.errors import LlamaNpError
from llama_np.io.gguf_config import (
    Metadata,
    config_from_gguf,
    expert_tensor,
    gguf_name,
    hf_name,
)
from llama_np.io.gguf_vocab import tokenizer_from_gguf
from llama_np.io.tokenizer import HFTokenizer
from llama_np.model.build import Tensor, final_norm_name, layer_tensor_names
from quant import GGML_TYPES, QuantError
from quant.backends import Backend

if TYPE_CHECKING:
    from gguf import GGUFReader


def unpermute_rows(rows: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row permutation (transformers' _reverse_permute_weights)."""
    r = rows.shape[0]
    if r % (2 * n_head):
        raise LlamaNpError(f"cannot un-permute {r} rows over {n_head} heads")
    return rows.reshape(n_head, r // n_head // 2, 2, -1).swapaxes(1, 2).reshape(rows.shape)


def gguf_tensor(t: Any, n_head: int | None, backend: Backend) -> Tensor:
    """One GGUF tensor as a float32 vector or a Weight in its stored format, laid out for
    the backend."""
    fmt = GGML_TYPES.get(int(t.tensor_type))
    if fmt is None:
        kind = getattr(t.tensor_type, "name", t.tensor_type)
        supported = ", ".join(f.upper() for f in GGML_TYPES.values())
        raise LlamaNpError(
            f"tensor {t.name!r} has GGML type {kind}, which is not supported ({supported})"
        )
    shape = tuple(int(n) for n in reversed(t.shape))  # GGUF lists ne0 (the input dim) first
    data = t.data
    if len(shape) == 1:
        if fmt != "f32":
            raise LlamaNpError(f"tensor {t.name!r}: 1-D tensors must be F32, got {fmt}")
        return np.asarray(data, dtype=np.float32).reshape(shape)
    if len(shape) != 2:
        raise LlamaNpError(f"tensor {t.name!r} has {len(shape)} dimensions")
    raw = data.reshape(shape[0], -1)
    if n_head is not None:
        raw = unpermute_rows(raw, n_head)
    try:
        return backend.weight_class(fmt).from_raw(shape, raw)
    except QuantError as e:
        raise LlamaNpError(f"tensor {t.name!r}: {e}") from None


def _reader(path: Path) -> GGUFReader:
    """The `gguf` package's reader over a plain ndarray view of its memory map (a small
    slice of an np.memmap costs several times more: Python-level __getitem__ and
    __array_finalize__), its metadata arrays of strings and numbers parsed a slice a part
    into the package's own parts (_array_parts): Qwen2.5-Coder-0.5B's header, a
    151,936-token vocabulary and its merges, in 0.47 s where GGUFReader takes 7.0."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader

    class Reader(GGUFReader):
        def _get_field_parts(self, orig_offs: int, raw_type: int) -> tuple:
            return _array_parts(self, orig_offs, raw_type) or super()._get_field_parts(
                orig_offs, raw_type)  # fmt: skip

        def _build_tensors(self, start_offs: int, fields: list) -> None:
            """The tensors' views, once the file is known to hold all their bytes."""
            end = 0
            for field in fields:
                _, _, _, dims, dtype, offset = field.parts
                block, size = GGML_QUANT_SIZES[GGMLQuantizationType(dtype[0])]
                end = max(end, int(start_offs + offset[0]) + int(np.prod(dims)) * size // block)
            if end > len(self.data):
                raise Truncated(f"{path}: truncated: {len(self.data):,} bytes of the "
                                f"{end:,} its tensors need")  # fmt: skip
            super()._build_tensors(start_offs, fields)

        @property
        def data(self) -> np.ndarray:
            return self._array

        @data.setter
        def data(self, mapped: np.ndarray) -> None:
            self._array = np.asarray(mapped)  # still backed by the map: nothing is read

    return Reader(path, "r")


def _array_parts(reader: GGUFReader, start: int, raw_type: int) -> tuple | None:
    """GGUFReader._get_field_parts of an array of strings or numbers in this host's byte
    order: (its bytes, parts, the indices of its elements' parts, types), as the package
    makes them: the element type and count, then per element its length and bytes (a
    string) or its one-element array. None for any other field (the package's)."""
    from gguf import GGUFValueType as Kind

    if raw_type != Kind.ARRAY or reader.byte_order != "I" or sys.byteorder != "little":
        return None
    data = reader.data
    item_type = data[start : start + 4].view(np.uint32)
    count = data[start + 4 : start + 12].view(np.uint64)
    if len(item_type) != 1 or len(count) != 1:
        raise ValueError(f"an array at byte {start} runs past the end of the file")
    kind, n, at = Kind(int(item_type[0])), int(count[0]), start + 12
    parts: list[np.ndarray] = [item_type, count]
    if kind == Kind.STRING:
        view = memoryview(data)
        for _ in range(n):
            size = int.from_bytes(view[at : at + 8], "little")
            if at + 8 + size > len(data):
                raise ValueError(f"a string at byte {at} runs past the end of the file")
            parts += [data[at : at + 8].view(np.uint64), data[at + 8 : at + 8 + size]]
            at += 8 + size
        indices = list(range(3, 2 + 2 * n, 2))
    elif (scalar := reader.gguf_scalar_to_np.get(kind)) is not None:
        values = data[at : at + n * np.dtype(scalar).itemsize].view(scalar)
        if len(values) != n:
            raise ValueError(f"an array at byte {start} runs past the end of the file")
        parts += [values[i : i + 1] for i in range(n)]
        indices, at = list(range(2, 2 + n)), at + values.nbytes
    else:
        return None
    return at - start, parts, indices, [Kind.ARRAY] + ([kind] if n else [])


class Header(NamedTuple):
    """A GGUF file's metadata, its tensors by name (unread) and the config they make,
    checked: what the reader parses once per load (a 150,000-token vocabulary is ~200 MB
    of small arrays), the engine's refusal read before anything compiles."""

    meta: Metadata
    by_name: dict[str, Any]
    config: Config


def read_header(path: Path) -> Header:
    """A GGUF file's header, or one line saying why the engine does not run it."""
    reader = _open(path)
    meta = Metadata(reader, path)
    by_name = {t.name: t for t in reader.tensors}
    config = config_from_gguf(meta, by_name, path.name)
    check_present(config, set(by_name), path)
    return Header(meta, by_name, config)


def load_gguf(
    header: Header, backend: Backend
) -> tuple[Config, dict[str, Tensor], HFTokenizer, dict[str, str]]:
    """The config, the tensors by HF name in the backend's layout, the tokenizer, and the
    file's own name of each tensor (by HF name), for messages."""
    config = header.config
    tensors: dict[str, Tensor] = {}
    names: dict[str, str] = {}
    for name, t in header.by_name.items():
        if (stacked := expert_tensor(name)) is not None:  # every expert's, one 3-D tensor
            layer, proj = stacked
            for e, w in enumerate(gguf_experts(t, backend)):
                at = f"model.layers.{layer}.mlp.experts.{e}.{proj}.weight"
                tensors[at], names[at] = w, f"{name}[{e}] ({w.fmt.upper()})"
            continue
        hf, heads = hf_name(name, config)
        if hf is not None:
            tensors[hf] = gguf_tensor(t, heads, backend)
            names[hf] = f"{name} ({GGML_TYPES[int(t.tensor_type)].upper()})"
    return config, tensors, tokenizer_from_gguf(header.meta), names


def gguf_experts(t: Any, backend: Backend) -> list[Tensor]:
    """A mixture of experts' stacked tensor (ne = [cols, rows, experts]) as one matrix per
    expert in its stored format, views of the file where the layout allows."""
    fmt = GGML_TYPES.get(int(t.tensor_type))
    shape = tuple(int(n) for n in reversed(t.shape))  # (experts, rows, cols)
    if fmt is None or len(shape) != 3:
        raise LlamaNpError(f"tensor {t.name!r}: experts of type {t.tensor_type} and shape "
                           f"{shape} are not supported")  # fmt: skip
    raw = t.data.reshape(shape[0], shape[1], -1)
    try:
        return [backend.weight_class(fmt).from_raw(shape[1:], raw[e]) for e in range(shape[0])]
    except QuantError as e:
        raise LlamaNpError(f"tensor {t.name!r}: {e}") from None


class Truncated(LlamaNpError):
    """A GGUF file that ends before its tensors' data do (a download cut short)."""


def _open(path: Path) -> GGUFReader:
    try:
        return _reader(path)
    except Truncated:
        raise
    except Exception as e:  # the reader raises ValueError, KeyError, struct errors...
        raise LlamaNpError(f"{path}: not a valid GGUF file ({type(e).__name__}: {e})") from None


def check_present(c: Config, names: set[str], path: Path) -> None:
    """Every tensor the model needs is in the file, or one line naming the first missing
    one by the file's own name, before any weight is read."""
    needed = ["token_embd.weight", gguf_name(final_norm_name(c), c)]
    if not c.tie_embeddings:
        needed.append("output.weight")
    for i in range(c.n_layers):
        needed += [gguf_name(n, c) for n in layer_tensor_names(i, c).values()]
    for name in needed:
        if name not in names:
            raise LlamaNpError(f"{path}: the file has no tensor {name!r}, which its "
                               f"architecture {c.arch!r} needs")  # fmt: skip


def gguf_shape(path: Path) -> tuple[Config, list[dict[str, str]], str, str]:
    """What a GGUF file holds without reading its weights: (config, per layer the format
    of each matrix by role (llama_arch.ROLES), the LM head's format, the embedding's): the
    shape `sol` and `bench --endpoint` count bytes from."""
    header = read_header(path)
    config = header.config
    types = {n: GGML_TYPES.get(int(t.tensor_type), "?") for n, t in header.by_name.items()}
    plan = format_plan(config, lambda hf: types[gguf_name(hf, config)])
    embed = types["token_embd.weight"]
    return config, plan, types.get("output.weight", embed), embed


def format_plan(config: Config, fmt_of: Callable[[str], str]) -> list[dict[str, str]]:
    """Per layer the format of each matrix by role (llama_arch.ROLES), from `fmt_of` (a
    tensor's format by its Hugging Face name); an expert's role w_gate.E counts as the
    layer's w_gate, and fused roles (wqkv, w_gate_up) as their parts."""
    fused = {"wqkv": ("wq", "wk", "wv"), "w_gate_up": ("w_gate", "w_up")}
    plan = []
    for i in range(config.n_layers):
        layer: dict[str, str] = {}
        roles = layer_roles(config, i)
        for role, hf in layer_tensor_names(i, config).items():
            if role.split(".")[0] in roles or role in fused:
                for r in fused.get(role, (role,)):
                    layer[r.split(".")[0]] = fmt_of(hf)
        plan.append({r: layer[r] for r in roles})
    return plan
