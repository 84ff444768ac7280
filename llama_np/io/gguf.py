"""GGUF files, read with the gguf package's memory-mapped reader.

Metadata becomes a Config (architectures llama and qwen2), tensors keep their stored
format (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K..Q6_K) unless the caller
converts them, and the vocabulary becomes a tokenizers-library
tokenizer: byte-level BPE (`gpt2`, with the pre-tokenizer `tokenizer.ggml.pre` names) or
sentencepiece-style BPE (`llama`, tokens and scores).

llama.cpp's converter permutes the rows of the Q and K projections so that its RoPE can
rotate adjacent pairs; this engine rotates halves (transformers' convention), so the
permutation is undone here, on whole rows, which leaves quantized blocks intact.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from llama_arch import Config, config_from_hf
from llama_np.errors import LlamaNpError
from llama_np.io.gguf_vocab import tokenizer_from_gguf
from llama_np.io.tokenizer import HFTokenizer
from llama_np.model.build import Tensor
from quant import GGML_TYPES, QuantError
from quant.backends import Backend

if TYPE_CHECKING:
    from gguf import GGUFReader

LAYER_TENSORS = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
GLOBAL_TENSORS = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


def _has_kind(value: Any, kind: type) -> bool:
    if isinstance(value, bool):
        return kind is bool
    if kind is float:
        return isinstance(value, int | float)
    return isinstance(value, kind)


class Metadata:
    """Typed access to GGUF key/values, with errors that name the key."""

    def __init__(self, reader: Any, path: Path) -> None:
        self.fields, self.path = reader.fields, path

    def get(self, key: str, kind: type, default: Any = ...) -> Any:
        field = self.fields.get(key)
        if field is None:
            if default is ...:
                raise LlamaNpError(f"{self.path}: GGUF metadata has no '{key}'")
            return default
        try:
            value = field.contents()
        except Exception as e:  # a malformed field: the reader raises various errors
            raise LlamaNpError(f"{self.path}: GGUF metadata '{key}' is unreadable ({e})") from None
        if not _has_kind(value, kind):
            raise LlamaNpError(
                f"{self.path}: GGUF metadata '{key}' should be {kind.__name__}, "
                f"got {type(value).__name__}"
            )
        return float(value) if kind is float else value


ARCHITECTURES = ("llama", "qwen2")


def config_from_gguf(
    meta: Metadata, names: set[str], factors: np.ndarray | None, name: str = "model"
) -> Config:
    arch = meta.get("general.architecture", str)
    if arch not in ARCHITECTURES:
        raise LlamaNpError(
            f"{meta.path}: unsupported GGUF architecture {arch!r} "
            f"(supported: {', '.join(ARCHITECTURES)})"
        )
    a = arch + "."
    dim = meta.get(a + "embedding_length", int)
    n_heads = meta.get(a + "attention.head_count", int)
    head_dim = meta.get(a + "attention.key_length", int, dim // max(n_heads, 1))
    rot = meta.get(a + "rope.dimension_count", int, head_dim)
    if rot != head_dim:
        raise LlamaNpError(f"{meta.path}: partial RoPE ({rot} of {head_dim} dims) is not supported")
    scaling = meta.get(a + "rope.scaling.type", str, "none")
    if scaling not in ("none", "linear"):
        raise LlamaNpError(f"{meta.path}: unsupported RoPE scaling {scaling!r}")
    tokens = meta.fields.get("tokenizer.ggml.tokens")
    n_tokens = len(tokens.data) if tokens is not None else ...
    hf: dict[str, Any] = {
        "model_type": arch,
        "hidden_size": dim,
        "num_hidden_layers": meta.get(a + "block_count", int),
        "num_attention_heads": n_heads,
        "num_key_value_heads": meta.get(a + "attention.head_count_kv", int, n_heads),
        "head_dim": head_dim,
        "intermediate_size": meta.get(a + "feed_forward_length", int),
        "vocab_size": meta.get(a + "vocab_size", int, n_tokens),
        "max_position_embeddings": meta.get(a + "context_length", int),
        "rms_norm_eps": meta.get(a + "attention.layer_norm_rms_epsilon", float),
        "rope_theta": meta.get(a + "rope.freq_base", float, 10000.0),
        "sliding_window": meta.get(a + "attention.sliding_window", int, None),
        "tie_word_embeddings": "output.weight" not in names,
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id", int, None),
        "eos_token_id": meta.get("tokenizer.ggml.eos_token_id", int, None),
    }
    if scaling == "linear":
        hf["rope_scaling"] = {
            "rope_type": "linear",
            "factor": meta.get(a + "rope.scaling.factor", float),
        }
    c = config_from_hf(hf, name)
    if factors is not None:
        if factors.shape != (head_dim // 2,):
            raise LlamaNpError(
                f"{meta.path}: rope_freqs has {factors.shape[0]} factors, expected {head_dim // 2}"
            )
        c = replace(c, rope_freq_factors=tuple(float(f) for f in factors))
    return c


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
    """The `gguf` package's reader, over a plain ndarray view of its memory map: each of
    the ~250,000 small slices it takes while parsing a vocabulary costs several times
    more as an np.memmap (Python-level __getitem__ and __array_finalize__). SmolLM2's
    GGUF loads in 2.3-2.9 s instead of 4.8-7.3 s."""
    from gguf import GGUFReader  # imported when needed: ~0.2 s

    class Reader(GGUFReader):
        @property
        def data(self) -> np.ndarray:
            return self._array

        @data.setter
        def data(self, mapped: np.ndarray) -> None:
            self._array = np.asarray(mapped)  # still backed by the map: nothing is read

    return Reader(path, "r")


def load_gguf(
    path: Path, backend: Backend
) -> tuple[Config, dict[str, Tensor], HFTokenizer, dict[str, str]]:
    """The config, the tensors by HF name in the backend's layout, the tokenizer, and the
    file's own name of each tensor (by HF name), for messages."""
    try:
        reader = _reader(path)
    except Exception as e:  # the reader raises ValueError, KeyError, struct errors...
        raise LlamaNpError(f"{path}: not a valid GGUF file ({type(e).__name__}: {e})") from None
    meta = Metadata(reader, path)
    by_name = {t.name: t for t in reader.tensors}
    factors = None
    if "rope_freqs.weight" in by_name:
        factors = np.asarray(by_name["rope_freqs.weight"].data, np.float32).ravel()
    config = config_from_gguf(meta, set(by_name), factors, path.name)
    tensors: dict[str, Tensor] = {}
    names: dict[str, str] = {}
    for name, t in by_name.items():
        hf, heads = gguf_to_hf_name(name, config)
        if hf is not None:
            tensors[hf] = gguf_tensor(t, heads, backend)
            names[hf] = f"{name} ({GGML_TYPES[int(t.tensor_type)].upper()})"
    return config, tensors, tokenizer_from_gguf(meta), names


def gguf_shape(path: Path) -> tuple[Config, list[dict[str, str]], str, str]:
    """What a GGUF file holds without reading its weights: (config, per layer the format
    of each matrix by role (llama_arch.ROLES), the LM head's format, the embedding's): the
    shape `sol` and `bench --endpoint` count bytes from."""
    try:
        reader = _reader(path)
    except Exception as e:  # the reader raises ValueError, KeyError, struct errors...
        raise LlamaNpError(f"{path}: not a valid GGUF file ({type(e).__name__}: {e})") from None
    types = {t.name: GGML_TYPES.get(int(t.tensor_type), "?") for t in reader.tensors}
    config = config_from_gguf(Metadata(reader, path), set(types), None, path.name)
    roles = {"wq": "attn_q", "wk": "attn_k", "wv": "attn_v", "wo": "attn_output",
             "w_gate": "ffn_gate", "w_up": "ffn_up", "w_down": "ffn_down"}  # fmt: skip
    plan = []
    for i in range(config.n_layers):
        names = {r: f"blk.{i}.{n}.weight" for r, n in roles.items()}
        if missing := [n for n in names.values() if n not in types]:
            raise LlamaNpError(f"{path}: the file has no tensor {missing[0]!r}")
        plan.append({r: types[n] for r, n in names.items()})
    if "token_embd.weight" not in types:
        raise LlamaNpError(f"{path}: the file has no tensor 'token_embd.weight'")
    embed = types["token_embd.weight"]
    return config, plan, types.get("output.weight", embed), embed


def gguf_to_hf_name(name: str, c: Config) -> tuple[str | None, int | None]:
    """HF name of a GGUF tensor, and the head count to un-permute its rows by: Q and K of
    llama, which llama.cpp's converter permutes for its RoPE (not those of qwen2)."""
    if name in GLOBAL_TENSORS:
        return GLOBAL_TENSORS[name], None
    parts = name.split(".")
    if (
        len(parts) == 4
        and parts[0] == "blk"
        and parts[2] in LAYER_TENSORS
        and parts[3] in ("weight", "bias")
    ):
        heads = None
        if c.arch == "llama":
            heads = {"attn_q": c.n_heads, "attn_k": c.n_kv_heads}.get(parts[2])
        return f"model.layers.{parts[1]}.{LAYER_TENSORS[parts[2]]}.{parts[3]}", heads
    return None, None
