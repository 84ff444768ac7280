"""GGML's block formats, as GGUF files store them: one table row per format, and the
decoders and quantizers every kernel backend shares, bit for bit the `gguf` package's
reference (gguf.quants).

    q8_0  blocks of 32, 34 bytes: d f16, 32 int8 q: x = d q               8.5 bits/weight
    q4_0  blocks of 32, 18 bytes: d f16, 16 bytes of nibbles: x = d (q - 8)        4.5
    q4_1  blocks of 32, 20 bytes: d, m f16, nibbles: x = d q + m                   5.0
    q5_0  blocks of 32, 22 bytes: d f16, 4 bytes of fifth bits, 16 bytes of nibbles
          x = d (q - 16)                                                  5.5
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

In the 4-bit codes element j of a block is the low nibble of byte j, element j + 16 the
high nibble. Every format decodes, per sub-block s, to integer codes c and two float32
numbers: x = D_s c + M_s (D_s = d sc exactly, M_s = -dmin m, or 0). `decode` returns
that form: the NumPy kernels multiply it, the int8 reference (quant.intdot) too; the
compiled kernels decode the stored bytes in registers.

Words: a *block* is the format's unit at rest (32 weights, or a K-quant's super-block of
256); a *sub-block* the run of weights sharing one scale (and min).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from .errors import QuantError

# Values in a block of the 32-value formats (ggml's QK8_0, QK4_0 ...): also the run of
# x that the integer products round with one scale (quant.intdot), and a q8_0 KV block.
BLOCK = 32


@dataclass(frozen=True)
class Layout:
    """A GGML block format: what one block holds."""

    fmt: str
    weights: int  # per block
    nbytes: int  # per block at rest
    sub: int  # weights per sub-block (one scale, one min)
    has_min: bool  # M_s is not always 0
    halves: tuple[int, ...]  # byte offsets of the float16 scales (d, and m or dmin)
    type_id: int  # GGUF's tensor type (ggml.h's enum ggml_type)

    @property
    def bits_per_weight(self) -> float:
        return 8 * self.nbytes / self.weights

    @property
    def quantizable(self) -> bool:
        """Whether a float matrix can be quantized to it (K-quants are read as stored)."""
        return self.weights == 32


LAYOUTS = {
    lay.fmt: lay
    for lay in (
        Layout("q8_0", 32, 34, 32, False, (0,), 8),
        Layout("q4_0", 32, 18, 32, False, (0,), 2),
        Layout("q4_1", 32, 20, 32, True, (0, 2), 3),
        Layout("q5_0", 32, 22, 32, False, (0,), 6),
        Layout("q5_1", 32, 24, 32, True, (0, 2), 7),
        Layout("q2_k", 256, 84, 16, True, (80, 82), 10),
        Layout("q3_k", 256, 110, 16, False, (108,), 11),
        Layout("q4_k", 256, 144, 32, True, (0, 2), 12),
        Layout("q5_k", 256, 176, 32, True, (0, 2), 13),
        Layout("q6_k", 256, 210, 16, False, (208,), 14),
    )
}
# GGUF's tensor type ids of every format llama-np reads
GGML_TYPES = {0: "f32", 1: "f16", 30: "bf16"} | {lay.type_id: f for f, lay in LAYOUTS.items()}


def random_blocks(fmt: str, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """Valid blocks of `fmt` for a (rows, cols) matrix: random codes and sub-scales, and
    float16 scales (random bytes there could be NaN) that put the values at ~1e-2; the
    K-quants' super-scales are 32x smaller, as their 6-bit sub-scales multiply them. A
    min (q4_1, q5_1) is minus half the codes' range times d. Each block's scales take a
    random sign: codes of 0..15 less 8 average -0.5, and without the sign every row of a
    4-bit matrix would share that offset, which makes a synthetic model's hidden states
    alike whatever the token (a router then sends every token to the same experts)."""
    lay = LAYOUTS[fmt]
    raw = rng.integers(0, 256, (rows, cols // lay.weights, lay.nbytes), dtype=np.uint8)
    size = 1e-3 if lay.weights == 32 else 1e-3 / 32
    sign = rng.choice(np.array([-1.0, 1.0]), raw.shape[:2])
    halves = [((rng.random(raw.shape[:2]) * 2 + 0.1) * size * sign).astype(np.float16)
              for _ in lay.halves]  # fmt: skip
    if lay.has_min and lay.weights == 32:  # q4_1, q5_1: the min -8 d or -16 d
        halves[1] = (halves[0] * np.float16(-8 if fmt == "q4_1" else -16)).astype(np.float16)
    for o, d in zip(lay.halves, halves, strict=True):
        raw[:, :, o : o + 2] = d.view(np.uint8).reshape(rows, -1, 2)
    return raw.reshape(rows, -1)


def check_blocks(fmt: str, shape: tuple[int, int], raw: np.ndarray) -> np.ndarray:
    """The blocks of a (rows, cols) matrix as (rows, bytes per row) uint8, or a clear error
    when they cannot be: the one shape check of every block format, in every backend."""
    lay, (rows, cols) = LAYOUTS[fmt], shape
    if cols % lay.weights:
        raise QuantError(f"{fmt}: the row length {cols} is not a multiple of {lay.weights}")
    raw = np.ascontiguousarray(raw).view(np.uint8)
    if raw.size != rows * (cols // lay.weights * lay.nbytes):
        raise QuantError(f"{fmt}: {raw.size} bytes do not fit a {rows} x {cols} matrix")
    return raw.reshape(rows, -1)


def assemble(halves: list[np.ndarray], codes: np.ndarray) -> np.ndarray:
    """Blocks of 32 (rows, nb * bytes) from their float16 scale (and min), (rows, nb)
    each, and their codes (rows, nb * code bytes), in GGUF's order: halves, then codes."""
    rows, nb = halves[0].shape
    parts = [
        np.ascontiguousarray(h, np.float16).view(np.uint8).reshape(rows, nb, 2) for h in halves
    ]
    parts.append(np.ascontiguousarray(codes).view(np.uint8).reshape(rows, nb, -1))
    return np.concatenate(parts, axis=2).reshape(rows, -1)


def split(fmt: str, blocks: np.ndarray) -> tuple[list[np.ndarray], np.ndarray]:
    """The inverse of `assemble` for the blocks of 32 (rows, nb * nbytes): their float16
    scale (and min) bits, (rows, nb) uint16 each, and the bytes after them (rows, nb, k)."""
    lay = LAYOUTS[fmt]
    b = blocks.reshape(blocks.shape[0], -1, lay.nbytes)
    halves = [b[:, :, o : o + 2].copy().view(np.uint16)[:, :, 0] for o in lay.halves]
    return halves, b[:, :, 2 * len(halves) :]


def np_roundf(n: np.ndarray) -> np.ndarray:
    """C's roundf (half away from zero), as GGML and gguf.quants use it."""
    a = np.abs(n)
    floored = np.floor(a)
    return np.sign(n) * (floored + np.floor(2 * (a - floored)))


def pack_nibbles(q: np.ndarray) -> np.ndarray:
    """(..., 32) values 0..15 -> (..., 16) bytes: element j low, j + 16 high."""
    return q[..., :16] | (q[..., 16:] << np.uint8(4))


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


def decode_32(raw: np.ndarray, fmt: str) -> tuple[np.ndarray, ...]:
    """q8_0 / q4_0 / q4_1 blocks (b, 34, 18 or 20) -> codes (b, 32) int8, D (b, 1), M (b, 1)"""
    d = _f16(raw[:, 0:2])
    if fmt == "q8_0":
        return raw[:, 2:].view(np.int8), d, np.zeros_like(d)
    has_min = fmt == "q4_1"
    q = _nibbles(raw[:, 4 if has_min else 2 :]).reshape(-1, 32).astype(np.int8)
    if has_min:
        return q, d, _f16(raw[:, 2:4])
    return q - np.int8(8), d, np.zeros_like(d)


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
        if fmt in ("q8_0", "q4_0", "q4_1"):
            codes, d, m = decode_32(raw, fmt)
        elif fmt in ("q5_0", "q5_1"):
            codes, d, m = decode_q5(raw, fmt == "q5_1")
        else:
            codes, d, m = decode_k(raw, fmt)
    return codes, d.astype(np.float32), m.astype(np.float32)


def quantize(w: np.ndarray, fmt: str) -> np.ndarray:
    """A float32 matrix (rows, cols) -> its blocks (rows, bytes per row) in `fmt`, by
    GGML's reference arithmetic (as gguf.quants.quantize). A subnormal scale has an
    infinite inverse; GGML computes codes anyway (and the float16 scale is then 0), so the
    reference's warnings are silenced, not its math."""
    lay = LAYOUTS[fmt]
    if not lay.quantizable:
        raise QuantError(
            f"{fmt}: quantizing to K-quants is not supported (GGUF K-quant tensors load as "
            "stored); choose q8_0, q5_1, q5_0, q4_1 or q4_0"
        )
    rows, cols = w.shape
    if cols % 32:
        raise QuantError(f"{fmt}: the input dimension {cols} is not a multiple of 32")
    blocks = w.reshape(-1, 32)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        q, d, m = QUANTIZERS[fmt](blocks)
        d16 = d.astype(np.float16)
        m16 = None if m is None else m.astype(np.float16)
    if not np.isfinite(d16).all() or (m16 is not None and not np.isfinite(m16).all()):
        raise QuantError(
            f"{fmt}: values too large for a float16 block scale (|x| up to {np.abs(w).max():.3g})"
        )
    halves = [d16.view(np.uint8)] + ([] if m16 is None else [m16.view(np.uint8)])
    return np.concatenate([*halves, q], axis=-1).reshape(rows, -1)


def _inverse(d: np.ndarray) -> np.ndarray:
    return np.where(d == 0, np.float32(0), np.float32(1) / d)


def quantize_q8_0(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, None]:
    """(b, 32) float32 -> codes (b, 32) as bytes, d (b, 1)."""
    d = np.abs(blocks).max(axis=-1, keepdims=True) / np.float32(127)
    return np_roundf(blocks * _inverse(d)).astype(np.int8).view(np.uint8), d, None


def _nibble_codes(q: np.ndarray, five: bool) -> np.ndarray:
    """Codes (b, 32) of 4 (or 5) bits -> their bytes: (fifth bits as 4 bytes) nibbles."""
    nibbles = pack_nibbles(q & np.uint8(15))
    if not five:
        return nibbles
    return np.concatenate([np.packbits(q >> np.uint8(4), axis=-1, bitorder="little"), nibbles], -1)


def _quantize_offset(blocks: np.ndarray, half: int) -> tuple[np.ndarray, np.ndarray, None]:
    """q4_0 (half 8) and q5_0 (half 16): the largest |x| maps to -half."""
    imax = np.abs(blocks).argmax(axis=-1)[:, None]
    d = np.take_along_axis(blocks, imax, axis=-1) / np.float32(-half)
    q = np.trunc(blocks * _inverse(d) + np.float32(half + 0.5)).astype(np.uint8)
    return _nibble_codes(q.clip(0, 2 * half - 1), half == 16), d, None


def _quantize_min(blocks: np.ndarray, top: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """q4_1 (top 15) and q5_1 (top 31): x = d q + min over the block's range."""
    lo = blocks.min(axis=-1, keepdims=True)
    d = (blocks.max(axis=-1, keepdims=True) - lo) / np.float32(top)
    q = np.trunc((blocks - lo) * _inverse(d) + np.float32(0.5)).astype(np.uint8)
    return _nibble_codes(q.clip(0, top), top == 31), d, lo


QUANTIZERS = {
    "q8_0": quantize_q8_0,
    "q4_0": functools.partial(_quantize_offset, half=8),
    "q4_1": functools.partial(_quantize_min, top=15),
    "q5_0": functools.partial(_quantize_offset, half=16),
    "q5_1": functools.partial(_quantize_min, top=31),
}
