"""The GGUF files the peers run: llama-np's model converted to another GGML type with the
gguf package, and what a decode step of llama.cpp reads from such a file at rest. Shared
by compare_peers.py and peers_batch.py (which imports this, never compare_peers)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from bench.sol import estimate
from llama_arch import Config


def gguf_bytes_per_token(path: Path, config: Config, pos: int) -> float:
    """What a decode step reads from a GGUF at rest: every matrix and vector as stored
    (the embedding table once for its row, counted as that row, unless it is also the
    head; of a mixture of experts' stacked tensors the k of E experts a token is routed
    to), plus llama.cpp's default float16 KV cache at `pos`."""
    import gguf

    total = 0.0
    tensors = gguf.GGUFReader(path).tensors
    tied = not any(t.name == "output.weight" for t in tensors)
    for t in tensors:
        if t.name == "token_embd.weight":
            row = t.n_bytes / int(t.shape[1])
            total += row + (t.n_bytes if tied else 0)
        elif "_exps." in t.name:  # blk.N.ffn_*_exps: every expert's rows, stacked
            total += t.n_bytes * config.experts_per_token / config.n_experts
        else:
            total += t.n_bytes
    return total + estimate(config, "f32", kv="f16", pos=pos).kv_bytes


def write_gguf(src: Path, dst: Path, qtype: str) -> Path:
    """The same weights as `src` in another GGML type (via float32), metadata copied."""
    import gguf
    from gguf.quants import dequantize, quantize

    if dst.exists():
        return dst
    reader = gguf.GGUFReader(src)
    w = gguf.GGUFWriter(str(dst), reader.fields["general.architecture"].contents())
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        sub = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(field.name, field.contents(), field.types[0], sub_type=sub)
    target = gguf.GGMLQuantizationType[qtype]
    for t in reader.tensors:
        values = dequantize(t.data, t.tensor_type).reshape([int(n) for n in reversed(t.shape)])
        kind = target if values.ndim == 2 else gguf.GGMLQuantizationType.F32
        w.add_tensor(t.name, quantize(values.astype(np.float32), kind), raw_dtype=kind)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst
