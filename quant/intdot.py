"""The int8-activation product in NumPy: the reference the compiled integer kernels
(quant.compiled.intdot) are held to, written for clarity, not speed.

llama.cpp multiplies a quantized matrix by x rounded to int8 in blocks of 32 (its
vec_dot_type), the products summed exactly in integers and scaled once per block:

    x block:  d = max|x| / 127,  xq = rint(x * (127 / max|x|)),  s = sum(xq)
    q8_0      y += w_d d (q . xq)
    q4_0      y += w_d d ((q - 8) . xq)
    q4_1      y += w_d d (q . xq) + w_m d s

and in general, for a format decoded to integer codes c with a float D and M per
sub-block (x = D c + M; quant.ggml for q5 and the K-quants, whose sub-blocks of 16
take their x block's d), y += D d (c . xq) + M d s over the sub-blocks. All in float32
but the dot products (int32). For the K-quants llama.cpp rounds x per 256 values (its
q8_K, one scale per super-block); here every format rounds x per 32, a finer rounding
at the same integer cost.
"""

from __future__ import annotations

import numpy as np

from . import ggml
from .blocks import BLOCK
from .errors import QuantError
from .ggml import LAYOUTS

# the formats with an integer kernel: every quantized one
INT8_FORMATS = ("q8_0", "q4_0", "q4_1", "q5_0", "q5_1", *(f for f in LAYOUTS if f.endswith("_k")))


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


def decoded(fmt: str, arrays: dict[str, np.ndarray]) -> tuple[np.ndarray, ...]:
    """Any quantized format as integer codes c (rows, cols) and float32 D, M per sub-block
    (rows, cols / sub), x = D c + M: the blocks formats from their codes and scales, the
    GGUF ones by quant.ggml's decoders (gguf.quants' values)."""
    if fmt in LAYOUTS:
        lay = LAYOUTS[fmt]
        raw = arrays["blocks"]
        rows = raw.shape[0]
        c, D, M = ggml.decode(raw.reshape(-1, lay.nbytes), fmt)
        return c.reshape(rows, -1).astype(np.int32), D.reshape(rows, -1), M.reshape(rows, -1)
    c = integer_codes(fmt, arrays["codes"])
    D = arrays["scales"].astype(np.float32)
    M = arrays["mins"].astype(np.float32) if fmt == "q4_1" else np.zeros_like(D)
    if fmt == "q4_0":
        c = c - 8
    return c.reshape(c.shape[0], -1), D, M


def matvec(fmt: str, arrays: dict[str, np.ndarray], x: np.ndarray) -> np.ndarray:
    """y = W @ x with x rounded to int8 per block of 32, W given by its canonical arrays
    (Weight.export()): per sub-block s of a row, D_s xd_s (c_s . xq_s) + M_s xd_s sum(xq_s),
    the dot products exact in int32, summed in float32."""
    if fmt not in INT8_FORMATS:
        raise QuantError(f"no int8 product for {fmt} (only {', '.join(INT8_FORMATS)})")
    xq, d, _ = quantize_x(x)
    c, D, M = decoded(fmt, arrays)
    rows, cols = c.shape
    sub = cols // D.shape[1]
    xs = xq.reshape(-1, sub).astype(np.int32)
    xd = np.repeat(d, BLOCK // sub) if sub < BLOCK else d
    dots = np.einsum("rsj,sj->rs", c.reshape(rows, -1, sub), xs)  # exact, int32
    y = ((D * xd) * dots.astype(np.float32)).sum(axis=1, dtype=np.float32)
    y += (M * (xd * xs.sum(axis=1).astype(np.float32))).sum(axis=1, dtype=np.float32)
    return y.astype(np.float32)
