"""The per-group work of the 4-bit and 5-bit integer kernels in vector registers
(quant.compiled.simd.groups) against NumPy: the blocks' scales times x's exactly, the
mins' correction within float32 rounding, and the rows' sums in their one order bit for bit.
Every length of a group's scales modulo 16 (the masked last step), and 1 to 4 rows."""

from __future__ import annotations

import numpy as np
import pytest

from quant.compiled.jit import kernel
from quant.compiled.simd.groups import group_scales16, put_sums4


@kernel
def scales_of(scales, mins, at, xd4, xs4, sc, corr):
    group_scales16(scales, mins, at, xd4, xs4, sc, corr)


@kernel
def sums_of(acc, at, extra, out, r0, nrows, add):
    put_sums4(acc, at, extra, out, r0, nrows, add)


@pytest.mark.parametrize("n", [4, 8, 12, 16, 20, 40, 72, 192])
def test_group_scales_in_registers(n: int) -> None:
    """Group 1 of 3 (its flat offset n): sc exactly the float16 scales times x's; corr the
    float16 mins times x's sums, summed per lane mod 16, then the 4 quarters in order."""
    rng = np.random.default_rng(n)
    scales = rng.standard_normal((3, n)).astype(np.float16)
    mins = rng.standard_normal((3, n)).astype(np.float16)
    xd4, xs4 = (rng.standard_normal(n).astype(np.float32) for _ in range(2))
    sc = np.full(n + 5, 7.0, np.float32)  # past n: untouched
    corr = np.zeros(4, np.float32)
    scales_of(scales.view(np.uint16), mins.view(np.uint16), n, xd4, xs4, sc[:n], corr)
    assert np.array_equal(sc[:n], scales[1].astype(np.float32) * xd4)
    assert (sc[n:] == 7).all()
    lanes = np.zeros(16)
    for j in range(n):
        lanes[j % 16] += float(mins[1, j]) * float(xs4[j])
    want = ((lanes[0:4] + lanes[4:8]) + lanes[8:12]) + lanes[12:16]
    np.testing.assert_allclose(corr, want, rtol=1e-5, atol=1e-5 * np.abs(lanes).sum())


@pytest.mark.parametrize("add", [False, True])
@pytest.mark.parametrize("nrows", [1, 2, 3, 4])
def test_put_sums_adds_each_rows_lanes_in_order(nrows: int, add: bool) -> None:
    """out[r0 + i] (+)= ((a0 + a1) + a2) + a3 + extra[i] for row i's 4 lanes at acc[at + 4 i],
    in float32 in exactly that order; out past nrows kept."""
    rng = np.random.default_rng(nrows + 10 * add)
    acc = (rng.standard_normal(40) * np.exp(4 * rng.standard_normal(40))).astype(np.float32)
    extra = rng.standard_normal(4).astype(np.float32)
    out = rng.standard_normal(11).astype(np.float32)
    before = out.copy()
    sums_of(acc, 16, extra, out, 3, nrows, add)
    a = acc[16:32].reshape(4, 4)
    s = ((a[:, 0] + a[:, 1]) + a[:, 2]) + a[:, 3] + extra
    want = before.copy()
    want[3 : 3 + nrows] = (before[3 : 3 + nrows] + s[:nrows]) if add else s[:nrows]
    assert np.array_equal(out, want)
