"""The int8-activation product in NumPy: the reference the compiled integer kernels
(quant.compiled.intdot) are held to, written for clarity, not speed.

llama.cpp multiplies a quantized matrix by x rounded to int8 in blocks of 32 (its
vec_dot_type), the products summed exactly in integers and scaled once per block:

    x block:  d = max|x| / 127,  xq = rint(x * (127 / max|x|)),  s = sum(xq)
    q8_0      y += w_d d (q . xq)
    q4_0      y += w_d d ((q - 8) . xq)
    q4_1      y += w_d d (q . xq) + w_m d s

All in float32 but the dot products (int32).
"""

from __future__ import annotations

import numpy as np

from .blocks import BLOCK
from .errors import QuantError

INT8_FORMATS = ("q8_0", "q4_0", "q4_1")  # the formats with an integer kernel


def quantize_x(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """x (nb * 32,) float32 -> xq (nb, 32) int8, d (nb,) float32, s (nb,) int32."""
    blocks = np.asarray(x, np.float32).reshape(-1, BLOCK)
    amax = np.abs(blocks).max(axis=1)
    with np.errstate(divide="ignore"):
        inv = np.where(amax > 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    xq = np.rint(blocks * inv[:, None]).astype(np.int8)
    return xq, (amax / np.float32(127)).astype(np.float32), xq.sum(axis=1, dtype=np.int32)


def integer_codes(fmt: str, codes: np.ndarray) -> np.ndarray:
    """A format's stored codes (rows, nb * code_bytes) as integers (rows, nb, 32): q8_0's
    int8, the 4-bit formats' 0..15 (element j in the low nibble of byte j of its block,
    element j + 16 in the high one)."""
    rows = codes.shape[0]
    if fmt == "q8_0":
        return codes.view(np.int8).reshape(rows, -1, BLOCK).astype(np.int32)
    b = codes.view(np.uint8).reshape(rows, -1, BLOCK // 2).astype(np.int32)
    return np.concatenate([b & 15, b >> 4], axis=2)


def matvec(fmt: str, arrays: dict[str, np.ndarray], x: np.ndarray) -> np.ndarray:
    """y = W @ x with x rounded to int8, W given by its canonical arrays (Weight.export():
    codes, float16 scales and mins)."""
    if fmt not in INT8_FORMATS:
        raise QuantError(f"no int8 product for {fmt} (only {', '.join(INT8_FORMATS)})")
    xq, d, s = quantize_x(x)
    q = integer_codes(fmt, arrays["codes"])
    if fmt == "q4_0":
        q = q - 8
    dots = np.einsum("rbj,bj->rb", q, xq.astype(np.int32))  # exact, int32
    scale = arrays["scales"].astype(np.float32) * d  # (rows, nb)
    y = (scale * dots.astype(np.float32)).sum(axis=1, dtype=np.float32)
    if fmt == "q4_1":
        y += (arrays["mins"].astype(np.float32) * (d * s.astype(np.float32))).sum(axis=1)
    return y.astype(np.float32)
