"""The block's operations for the compiled backend: a decode step (one token) runs each as
one compiled call (quant.compiled); a prompt (several tokens) runs the NumPy reference,
whose batched matrix products are as fast as anything here."""

from __future__ import annotations

import numpy as np

from quant.compiled import attention, ops

from .config import Config
from .kvcache import KVCache
from .ops import NumpyOps, Rotary


class CompiledOps(NumpyOps):
    def rotary(self, positions: np.ndarray, inv_freq: np.ndarray) -> Rotary:
        return Rotary(positions, inv_freq, matrix=False)

    def rmsnorm(self, x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
        if x.shape[0] != 1:
            return super().rmsnorm(x, weight, eps)
        out = np.empty_like(x)
        ops.rmsnorm(x[0], weight, eps, out[0])
        return out

    def swiglu(self, gate_up: np.ndarray) -> np.ndarray:
        if gate_up.shape[0] != 1:
            return super().swiglu(gate_up)
        out = np.empty((1, gate_up.shape[1] // 2), np.float32)
        ops.swiglu(gate_up[0], out[0])
        return out

    def attention(
        self, c: Config, qkv: np.ndarray, cache: KVCache, layer: int, rot: Rotary
    ) -> tuple[np.ndarray, int, int]:
        """One token: RoPE, append and attend in one kernel, the cache read in its format."""
        if qkv.shape[0] != 1:
            return super().attention(c, qkv, cache, layer, rot)
        s = cache.decode_slot(layer)
        out = np.empty((1, c.q_dim), np.float32)
        attention.attend(qkv[0], rot.cos[0], rot.sin[0], s.keys, s.values, s.slot, s.n, out[0])
        return out, s.read_nbytes, s.write_nbytes
