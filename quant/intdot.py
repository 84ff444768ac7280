"""The int8-activation product in NumPy: the reference the compiled integer kernels
(quant.compiled.intdot) are held to, written for clarity, not speed.

llama.cpp multiplies a quantized matrix by x rounded to int8 in blocks of 32 (its
vec_dot_type), the products summed exactly in integers and scaled once per block:

    x block:  d = max|x| / 127,  xq = rint(x * (127 / max|x|)),  s = sum(xq)
    q8_0      y += w_d d (q . xq)
    q4_0      y += w_d d ((q - 8) . xq)
    q4_1      y += w_d d (q . xq) + w_m d s

and in general, for a format decoded to integer codes c with a float D and M per
sub-block (x = D c + M, quant.ggml.decode; the K-quants' sub-blocks of 16
take their x block's d), y += D d (c . xq) + M d s over the sub-blocks. All in float32
but the dot products (int32). For the K-quants llama.cpp rounds x per 256 values (its
q8_K, one scale per super-block); here every format rounds x per 32, a finer rounding
at the same integer cost.

With bits=16, x is rounded to int16 instead: d = max|x| / 16256 (= 127 * 128: the
compiled kernels hold x as two int8 halves, the high one within -127..127), the same
formulas; x's rounding error is 128 times smaller.
"""

from __future__ import annotations

import numpy as np

from . import ggml
from .errors import QuantError
from .ggml import BLOCK, LAYOUTS

# the formats with an integer kernel: every quantized one
INT8_FORMATS = tuple(LAYOUTS)


TOPS = {8: np.float32(127), 16: np.float32(16256)}  # x's largest integer, by bits


def quantize_x(x: np.ndarray, bits: int = 8) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """x (nb * 32,) float32 -> xq (nb, 32) int8 (int16 for bits=16), d (nb,) float32,
    s (nb,) int32. A block holding NaN or infinity: xq 0 and d NaN (every product with
    it NaN, as in float, never integers rounded from a NaN)."""
    top = TOPS[bits]
    blocks = np.asarray(x, np.float32).reshape(-1, BLOCK)
    finite = np.isfinite(blocks).all(axis=1)
    blocks = np.where(finite[:, None], blocks, 0)  # a block with NaN or infinity: zeros
    amax = np.abs(blocks).max(axis=1)
    with np.errstate(divide="ignore"):
        inv = np.where(amax > 0, top / amax, np.float32(0)).astype(np.float32)
    xq = np.rint(blocks * inv[:, None]).astype(np.int8 if bits == 8 else np.int16)
    d = np.where(finite, amax / top, np.float32(np.nan)).astype(np.float32)
    return xq, d, xq.sum(axis=1, dtype=np.int32)


def decoded(fmt: str, blocks: np.ndarray) -> tuple[np.ndarray, ...]:
    """Any quantized format's blocks (rows, bytes per row) as integer codes c (rows, cols)
    and float32 D, M per sub-block (rows, cols / sub), x = D c + M, by quant.ggml's
    decoders (gguf.quants' values)."""
    rows = blocks.shape[0]
    c, D, M = ggml.decode(blocks.reshape(-1, LAYOUTS[fmt].nbytes), fmt)
    return c.reshape(rows, -1).astype(np.int32), D.reshape(rows, -1), M.reshape(rows, -1)


def matvec(fmt: str, blocks: np.ndarray, x: np.ndarray, bits: int = 8) -> np.ndarray:
    """y = W @ x with x rounded to int8 (or int16) per block of 32, W given by its blocks as GGUF
    stores them (BlockFormat.to_blocks()): per sub-block s of a row,
    D_s xd_s (c_s . xq_s) + M_s xd_s sum(xq_s), the dot products exact in int32, summed in
    float32."""
    if fmt not in INT8_FORMATS:
        raise QuantError(f"no int8 product for {fmt} (only {', '.join(INT8_FORMATS)})")
    xq, d, _ = quantize_x(x, bits)
    c, D, M = decoded(fmt, blocks)
    rows, cols = c.shape
    sub = cols // D.shape[1]
    xs = xq.reshape(-1, sub).astype(np.int32)
    xd = np.repeat(d, BLOCK // sub) if sub < BLOCK else d
    dots = np.einsum("rsj,sj->rs", c.reshape(rows, -1, sub), xs)  # exact, int32
    y = ((D * xd) * dots.astype(np.float32)).sum(axis=1, dtype=np.float32)
    y += (M * (xd * xs.sum(axis=1).astype(np.float32))).sum(axis=1, dtype=np.float32)
    return y.astype(np.float32)
