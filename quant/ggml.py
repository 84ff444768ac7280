"""GGML's 5-bit and K-quant formats as stored in GGUF files, read bit for bit as the `gguf`
package's reference (gguf.quants.dequantize) reads them.

    q5_0  blocks of 32, 22 bytes: d f16, 4 bytes of fifth bits, 16 bytes of nibbles
          x = d (q - 16)                                                  5.5 bits/weight
    q5_1  blocks of 32, 24 bytes: d, m f16, fifth bits, nibbles: x = d q + m     6.0
    q2_k  super-blocks of 256, 84 bytes: 16 sub-blocks of 16, a 4-bit scale and a 4-bit
          min each under f16 d, dmin; 2-bit q: x = d sc q - dmin m        2.625
    q3_k  110 bytes: 16 sub-blocks of 16, 6-bit signed scales under d; 3-bit q as 2 low
          bits and a high bit that subtracts 4 when clear: x = d (sc - 32) q    3.4375
    q4_k  144 bytes: 8 sub-blocks of 32, 6-bit scale and min under d, dmin; 4-bit q:
          x = d sc q - dmin m                                             4.5
    q5_k  176 bytes: as q4_k with a fifth bit per weight                  5.5
    q6_k  210 bytes: 16 sub-blocks of 16, int8 scales under d; 6-bit q: x = d sc (q - 32)
                                                                          6.5625

Every one of them decodes, per sub-block s, to integer codes c and two float32 numbers:
x = D_s c + M_s (D_s = d sc exactly, M_s = -dmin m, or 0). `decode` returns that form,
from which both kernel backends work: the NumPy one keeps it (int8 codes, a float32 scale
and min per sub-block), the compiled one decodes the stored bytes in registers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Self

import numpy as np

from .base import check_float_matrix
from .blocks import BlockWeight, pack_nibbles
from .errors import QuantError


@dataclass(frozen=True)
class Layout:
    """A GGUF block format: what one block holds and how it decodes."""

    fmt: str
    weights: int  # per (super-)block
    nbytes: int  # per (super-)block at rest
    sub: int  # weights per sub-block (one scale, one min)
    has_min: bool  # M_s is not always 0
    halves: tuple[int, ...]  # byte offsets of the float16 super-scales (d, dmin)

    @property
    def bits_per_weight(self) -> float:
        return 8 * self.nbytes / self.weights


LAYOUTS = {
    lay.fmt: lay
    for lay in (
        Layout("q5_0", 32, 22, 32, False, (0,)),
        Layout("q5_1", 32, 24, 32, True, (0, 2)),
        Layout("q2_k", 256, 84, 16, True, (80, 82)),
        Layout("q3_k", 256, 110, 16, False, (108,)),
        Layout("q4_k", 256, 144, 32, True, (0, 2)),
        Layout("q5_k", 256, 176, 32, True, (0, 2)),
        Layout("q6_k", 256, 210, 16, False, (208,)),
    )
}


def random_blocks(fmt: str, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """Valid blocks of `fmt` for a (rows, cols) matrix: random codes and sub-scales, and
    float16 scales (random bytes there could be NaN) that put the values at ~1e-2; the
    K-quants' super-scales are 32x smaller, as their 6-bit sub-scales multiply them."""
    lay = LAYOUTS[fmt]
    raw = rng.integers(0, 256, (rows, cols // lay.weights, lay.nbytes), dtype=np.uint8)
    size = 1e-3 if lay.weights == 32 else 1e-3 / 32
    for o in lay.halves:
        d = ((rng.random((rows, cols // lay.weights)) * 2 + 0.1) * size).astype(np.float16)
        raw[:, :, o : o + 2] = d.view(np.uint8).reshape(rows, -1, 2)
    return raw.reshape(rows, -1)


def _f16(raw: np.ndarray) -> np.ndarray:
    """Two bytes per row (n, 2) as float32, (n, 1)."""
    return np.ascontiguousarray(raw).view(np.float16).astype(np.float32)


def _bits(raw: np.ndarray, n: int) -> np.ndarray:
    """Bits 0..n-1 of each byte of raw (b, k) -> (b, n, k): [:, i, j] = bit i of byte j."""
    return (raw[:, None, :] >> np.arange(n, dtype=np.uint8)[None, :, None]) & np.uint8(1)


def _crumbs(raw: np.ndarray) -> np.ndarray:
    """The four 2-bit fields of each byte (b, k) -> (b, 4, k), lowest first."""
    return (raw[:, None, :] >> np.array([0, 2, 4, 6], np.uint8)[None, :, None]) & np.uint8(3)


def _nibbles(raw: np.ndarray) -> np.ndarray:
    """Low then high nibbles of each byte (b, k) -> (b, 2, k)."""
    return np.stack([raw & np.uint8(15), raw >> np.uint8(4)], axis=1)


def decode_q5(raw: np.ndarray, has_min: bool) -> tuple[np.ndarray, ...]:
    """q5_0 / q5_1 blocks (b, 22 or 24) -> codes (b, 32) int8, D (b, 1), M (b, 1)"""
    d = _f16(raw[:, 0:2])
    o = 4 if has_min else 2
    m = _f16(raw[:, 2:4]) if has_min else np.zeros_like(d)
    high = _bits(raw[:, o : o + 4], 8).transpose(0, 2, 1).reshape(-1, 32)  # bit j of the word
    q = _nibbles(raw[:, o + 4 : o + 20]).reshape(-1, 32) | (high << np.uint8(4))
    codes = q.astype(np.int8) - np.int8(0 if has_min else 16)
    return codes, d, m


def _scale_min_k4(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The 6-bit scales and mins of q4_k / q5_k (b, 12) -> (b, 8) each (gguf.quants)."""
    d, m, m_d = scales[:, 0:4], scales[:, 4:8], scales[:, 8:12]
    sc = np.concatenate([d & 0x3F, (m_d & 0x0F) | ((d >> 2) & 0x30)], axis=-1)
    mn = np.concatenate([m & 0x3F, (m_d >> 4) | ((m >> 2) & 0x30)], axis=-1)
    return sc, mn


def decode_k(raw: np.ndarray, fmt: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """K-quant super-blocks (b, nbytes) -> codes (b, 256) int8, D and M (b, 256 / sub)."""
    b = raw.shape[0]
    if fmt == "q2_k":
        sc, q, d, dmin = raw[:, :16], raw[:, 16:80], _f16(raw[:, 80:82]), _f16(raw[:, 82:84])
        codes = _crumbs(q.reshape(b * 2, 32)).reshape(b, 256)
        return codes.astype(np.int8), d * (sc & 15), -(dmin * (sc >> 4))
    if fmt == "q3_k":
        hmask, q, packed, d = raw[:, :32], raw[:, 32:96], raw[:, 96:108], _f16(raw[:, 108:110])
        low = (_nibbles(packed[:, :8]).reshape(b, 16)) & np.uint8(15)
        high = _crumbs(packed[:, 8:12]).reshape(b, 16)
        sc = (low | (high << np.uint8(4))).astype(np.int8) - np.int8(32)
        q2 = _crumbs(q.reshape(b * 2, 32)).reshape(b, 256).astype(np.int8)
        h = _bits(hmask, 8).reshape(b, 256).astype(np.int8)
        return q2 - np.int8(4) * (np.int8(1) - h), d * sc, np.zeros((b, 16), np.float32)
    if fmt in ("q4_k", "q5_k"):
        d, dmin = _f16(raw[:, 0:2]), _f16(raw[:, 2:4])
        sc, mn = _scale_min_k4(raw[:, 4:16])
        if fmt == "q4_k":
            q = _nibbles(raw[:, 16:144].reshape(b * 4, 32)).reshape(b, 256)
        else:
            high = _bits(raw[:, 16:48], 8).reshape(b, 256)
            q = _nibbles(raw[:, 48:176].reshape(b * 4, 32)).reshape(b, 256) | (high << np.uint8(4))
        return q.astype(np.int8), d * sc, -(dmin * mn)
    if fmt == "q6_k":
        ql, qh, sc, d = raw[:, :128], raw[:, 128:192], raw[:, 192:208], _f16(raw[:, 208:210])
        low = _nibbles(ql.reshape(b * 2, 64)).reshape(b, 256)  # per half: 64 low, 64 high
        high = _crumbs(qh.reshape(b * 2, 32)).reshape(b, 256)
        q = (low | (high << np.uint8(4))).astype(np.int8) - np.int8(32)
        return q, d * sc.view(np.int8), np.zeros((b, 16), np.float32)
    raise QuantError(f"not a K-quant: {fmt}")


def decode(raw: np.ndarray, fmt: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Blocks (b, nbytes) of `fmt` -> codes (b, weights) int8, D and M (b, weights / sub)
    float32, with x = D c + M per sub-block, bit for bit gguf.quants' values."""
    raw = np.ascontiguousarray(raw, dtype=np.uint8)
    with np.errstate(over="ignore", invalid="ignore"):
        if fmt in ("q5_0", "q5_1"):
            codes, d, m = decode_q5(raw, fmt == "q5_1")
        else:
            codes, d, m = decode_k(raw, fmt)
    return codes, d.astype(np.float32), m.astype(np.float32)


def quantize_q5(blocks: np.ndarray, has_min: bool) -> np.ndarray:
    """Blocks of 32 float32 (b, 32) -> GGML q5_0 / q5_1 bytes, by the arithmetic of
    gguf.quants (GGML's reference)."""
    b = blocks.shape[0]
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        if has_min:
            lo = blocks.min(axis=-1, keepdims=True)
            d = (blocks.max(axis=-1, keepdims=True) - lo) / np.float32(31)
            inv = np.where(d == 0, np.float32(0), np.float32(1) / d)
            q = np.trunc((blocks - lo) * inv + np.float32(0.5)).astype(np.uint8).clip(0, 31)
        else:
            imax = np.abs(blocks).argmax(axis=-1)[:, None]
            d = np.take_along_axis(blocks, imax, axis=-1) / np.float32(-16)
            inv = np.where(d == 0, np.float32(0), np.float32(1) / d)
            q = np.trunc(blocks * inv + np.float32(16.5)).astype(np.uint8).clip(0, 31)
        d16 = d.astype(np.float16)
        m16 = lo.astype(np.float16) if has_min else None
    if not np.isfinite(d16).all() or (m16 is not None and not np.isfinite(m16).all()):
        raise QuantError("values too large for a float16 block scale")
    nibbles = pack_nibbles((q & np.uint8(15)).reshape(b, 1, 32))
    high = np.packbits(q >> np.uint8(4), axis=-1, bitorder="little")  # (b, 4)
    head = [d16.view(np.uint8)] + ([m16.view(np.uint8)] if has_min else [])
    return np.concatenate([*head, high, nibbles], axis=-1)


class GGMLWeight(BlockWeight):
    """A GGUF format of this module in the NumPy backend's layout: decoded once at load
    into int8 codes with a float32 scale (and min) per sub-block, so the kernels of
    quant.blocks multiply it as they multiply q8_0. The stored bytes are kept for export.
    In memory that is 8 bits per weight plus the scales; the meter counts it."""

    layout: ClassVar[Layout]

    def __init__(
        self,
        shape: tuple[int, int],
        codes: np.ndarray,
        scales: np.ndarray,
        mins: np.ndarray | None = None,
        raw: np.ndarray | None = None,
    ) -> None:
        super().__init__(shape, codes, scales, mins)
        self.raw = raw  # (rows, blocks * nbytes) as stored in GGUF

    @classmethod
    def from_blocks(cls, shape: tuple[int, int], raw: np.ndarray) -> Self:
        rows, cols = shape
        lay = cls.layout
        if cols % lay.weights:
            raise QuantError(f"{cls.fmt}: the row length {cols} is not a multiple of {lay.weights}")
        raw = np.ascontiguousarray(raw, dtype=np.uint8).reshape(rows, -1)
        if raw.shape[1] != cols // lay.weights * lay.nbytes:
            raise QuantError(f"{cls.fmt}: {raw.shape[1]} bytes per row do not fit {cols} weights")
        codes, d, m = decode(raw.reshape(-1, lay.nbytes), cls.fmt)
        codes = codes.reshape(rows, cols).view(np.uint8)
        d, m = d.reshape(rows, -1), m.reshape(rows, -1)
        return cls(shape, codes, d, m if lay.has_min else None, raw)

    @classmethod
    def random(cls, shape: tuple[int, int], rng: np.random.Generator) -> Self:
        """Random codes, sane float16 scales."""
        return cls.from_blocks(shape, random_blocks(cls.fmt, shape[0], shape[1], rng))

    def to_blocks(self) -> np.ndarray:
        return self.raw

    def export(self) -> dict[str, np.ndarray]:
        return {"blocks": self.raw}

    @classmethod
    def from_arrays(cls, shape: tuple[int, int], arrays: dict[str, np.ndarray]) -> Self:
        if "blocks" not in arrays:
            raise QuantError(f"{cls.fmt}: missing array 'blocks'")
        return cls.from_blocks(shape, arrays["blocks"])

    @classmethod
    def nbytes_for(cls, shape: tuple[int, int]) -> int:
        """int8 codes, and a float32 scale (and min) per sub-block."""
        rows, cols = shape
        return rows * cols + rows * (cols // cls.block) * 4 * (2 if cls.has_min else 1)

    @classmethod
    def unpack(cls, codes: np.ndarray, out: np.ndarray) -> np.ndarray:
        np.copyto(out, codes.view(np.int8))
        return out

    @classmethod
    def from_float(cls, w: np.ndarray) -> Self:
        w = check_float_matrix(w, cls.fmt)
        if cls.fmt not in ("q5_0", "q5_1"):
            raise QuantError(
                f"{cls.fmt}: quantizing to K-quants is not supported (GGUF K-quant tensors "
                "load as stored); choose q8_0, q5_1, q5_0, q4_1 or q4_0"
            )
        rows, cols = w.shape
        if cols % 32:
            raise QuantError(f"{cls.fmt}: the input dimension {cols} is not a multiple of 32")
        raw = quantize_q5(w.reshape(-1, 32), cls.fmt == "q5_1").reshape(rows, -1)
        return cls.from_blocks(w.shape, raw)


# GGUF's tensor type ids of the formats llama-np reads (ggml.h's enum ggml_type)
GGML_TYPES = {
    0: "f32", 1: "f16", 30: "bf16", 8: "q8_0", 2: "q4_0", 3: "q4_1", 6: "q5_0", 7: "q5_1",
    10: "q2_k", 11: "q3_k", 12: "q4_k", 13: "q5_k", 14: "q6_k",
}  # fmt: skip


def _ggml_class(fmt: str) -> type[GGMLWeight]:
    lay = LAYOUTS[fmt]
    attrs = dict(
        fmt=fmt, layout=lay, block=lay.sub, code_bytes=lay.sub, has_min=lay.has_min,
        bits_per_weight=lay.bits_per_weight,
    )  # fmt: skip
    return type(f"{fmt.upper()}Weight", (GGMLWeight,), attrs)


GGML_FORMATS: dict[str, type[GGMLWeight]] = {fmt: _ggml_class(fmt) for fmt in LAYOUTS}
