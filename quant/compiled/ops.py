"""The small operations of a decode step between the matrix products, one compiled call
each instead of three to six NumPy calls (a NumPy call costs ~1 us whatever its size;
a call here ~0.3 us). float32 throughout."""

from __future__ import annotations

import numpy as np

from .attention import exp_neg
from .jit import kernel


@kernel
def rmsnorm(x, weight, eps, out):
    """out = x / sqrt(mean(x^2) + eps) * weight; x, weight, out (dim,) float32"""
    s = np.float32(0)
    for i in range(x.shape[0]):
        s += x[i] * x[i]
    inv = np.float32(1) / np.sqrt(s / np.float32(x.shape[0]) + np.float32(eps))
    for i in range(x.shape[0]):
        out[i] = x[i] * inv * weight[i]


@kernel
def swiglu(gate_up, out):
    """out = silu(gate) * up for gate_up = [gate | up] (2 * hidden,), out (hidden,):
    silu(g) = g * sigmoid(g), with sigmoid from exp(-|g|) so that no exp overflows."""
    n = out.shape[0]
    for i in range(n):
        g = gate_up[i]
        e = exp_neg(-abs(g))
        sig = np.float32(1) / (np.float32(1) + e)
        if g < 0:
            sig = e * sig
        out[i] = g * sig * gate_up[n + i]
