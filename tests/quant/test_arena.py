"""quant.arena.pack: copies of the matrices whose arrays live in one buffer."""

from __future__ import annotations

import numpy as np
import pytest

from quant import FORMATS, arena, stacked
from quant.arena import ALIGN


def aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


@pytest.mark.parametrize("fmt", ["f32", "f16", "q8_0", "q4_1", "q5_0", "q4_k", "q6_k"])
def test_pack_moves_exactly_what_the_matrix_is_read_from(fmt):
    rng = np.random.default_rng(0)
    w = FORMATS[fmt].random((8, 512), rng)
    x = rng.standard_normal(512).astype(np.float32)
    (packed,), buf = arena.pack([w])
    assert buf.nbytes == sum(aligned(a.nbytes) for a in w.arrays().values())  # no export copy
    for a in packed.arrays().values():
        assert np.shares_memory(a, buf) and a.ctypes.data % ALIGN == 0
    assert np.array_equal(packed.matvec(x), w.matvec(x))
    assert not any(np.shares_memory(a, buf) for a in w.arrays().values())  # w is untouched


def test_stacks_and_shared_matrices_stay_what_they_were():
    rng = np.random.default_rng(1)
    a, b = FORMATS["q8_0"].random((4, 64), rng), FORMATS["q4_0"].random((6, 64), rng)
    stack = stacked([a, b])
    packed, buf = arena.pack([stack, a])
    assert packed[0].parts[0] is packed[1]  # a matrix in two places is copied once
    assert buf.nbytes == sum(aligned(v.nbytes) for v in stack.arrays().values())
    x = rng.standard_normal(64).astype(np.float32)
    assert np.array_equal(packed[0].matvec(x), stack.matvec(x))


def test_read_only_arrays_stay_in_place():
    """A memory-mapped checkpoint stays in the page cache; nothing to pack."""
    w = FORMATS["f32"].random((4, 32), np.random.default_rng(2))
    w.w.flags.writeable = False
    (packed,), buf = arena.pack([w])
    assert buf is None and packed.w is w.w
