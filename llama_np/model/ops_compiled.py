"""The forward pass's operations on the compiled backend: for one token (decode) each is one
compiled call, the matrix product with its RMSNorm, SwiGLU or residual addition fused in
(quant.compiled.ops.prologue); a prompt (several tokens) runs the NumPy reference, whose
batched matrix products are as fast as anything here."""

from __future__ import annotations

import numpy as np

from arch import Config
from llama_np.model.kvcache import KVCache, Span
from llama_np.model.ops import NumpyOps, Rotary
from quant import Matrix
from quant.compiled import attention, ops

NO_NORM, ZERO = np.zeros(1, np.float32), np.float32(0)


def product(w: Matrix, x: np.ndarray, out: np.ndarray, mode: int, norm: np.ndarray,
            eps: float, add: bool, dot: str) -> None:  # fmt: skip
    """out (=, or += when add) W @ prologue(x), x multiplied as `dot`: one kernel for a
    compiled matrix; for a stack of matrices in several formats, the prologue once, then
    one kernel per part."""
    if w.fused:
        w.matvec_into(x, out, norm, eps, mode, add, dot)
        return
    h, r0 = ops.prepare(x, norm, eps, mode), 0
    for p in w.leaves():
        r1 = r0 + p.shape[0]
        p.matvec_into(h, out[r0:r1], NO_NORM, ZERO, ops.PLAIN, add, dot)
        r0 = r1


class CompiledOps(NumpyOps):
    def __init__(self, dot: str) -> None:
        self.dot = dot  # x in quantized decode products: "f32" or "int8" (the backend's)

    def rotary(self, positions: np.ndarray, inv_freq: np.ndarray) -> Rotary:
        return Rotary(positions, inv_freq, matrix=False)

    def norm_linear(self, x: np.ndarray, norm: np.ndarray, eps: float, w: Matrix) -> np.ndarray:
        if x.shape[0] != 1:
            return super().norm_linear(x, norm, eps, w)
        out = np.empty((1, w.shape[0]), np.float32)
        product(w, x[0], out[0], ops.NORM, norm, eps, False, self.dot)
        return out

    def linear_add(self, x: np.ndarray, w: Matrix, inp: np.ndarray) -> np.ndarray:
        if x.shape[0] != 1:
            return super().linear_add(x, w, inp)
        product(w, inp[0], x[0], ops.PLAIN, NO_NORM, ZERO, True, self.dot)  # in place: x is ours
        return x

    def swiglu_linear_add(self, x: np.ndarray, w: Matrix, gate_up: np.ndarray) -> np.ndarray:
        if x.shape[0] != 1:
            return super().swiglu_linear_add(x, w, gate_up)
        product(w, gate_up[0], x[0], ops.SWIGLU, NO_NORM, ZERO, True, self.dot)
        return x

    def attention(
        self, c: Config, qkv: np.ndarray, cache: KVCache, layer: int, rot: Rotary, span: Span
    ) -> np.ndarray:
        """One token: RoPE, append and attend in one kernel, the cache read in its format."""
        if qkv.shape[0] != 1:
            return super().attention(c, qkv, cache, layer, rot, span)
        keys, values = cache.arrays(layer)
        out = np.empty((1, c.q_dim), np.float32)
        attention.attend(qkv[0], rot.cos[0], rot.sin[0], keys, values, span.slot, span.n_keys,
                         out[0])  # fmt: skip
        return out
