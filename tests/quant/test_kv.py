"""KV-cache stores: what they keep, what they give back, what they occupy."""

from __future__ import annotations

import numpy as np
import pytest

from quant import QuantError
from quant.kv import KV_FORMATS, kv_store_class, lazy_zeros

# bytes per slot per KV head, head_dim 64: f32 4 B, f16 2 B, q8_0 1 B + a 2-byte scale per 32
SLOT_BYTES = {"f32": 256, "f16": 128, "q8_0": 64 + 4}
REL_ERR = {"f32": 0.0, "f16": 2.0**-11, "q8_0": 1 / 254 + 2.0**-11 * 127 / 127}


@pytest.mark.parametrize("tiled", [False, True])
@pytest.mark.parametrize("fmt", sorted(KV_FORMATS))
def test_write_read_round_trip(fmt, tiled):
    x = np.random.default_rng(0).standard_normal((3, 5, 64)).astype(np.float32) * 4
    store = kv_store_class(fmt)(3, 32, 64, tiled=tiled)
    store.write(7, x.transpose(1, 0, 2))  # written (T, n_kv, hd), read (n_kv, T, hd)
    got = store.load(7, 12)
    assert got.dtype == np.float32 and got.shape == x.shape
    amax = np.abs(x).reshape(3, 5, 2, 32).max(-1, keepdims=True)
    scale = np.broadcast_to(amax, (3, 5, 2, 32)).reshape(x.shape) if fmt == "q8_0" else np.abs(x)
    assert (np.abs(got - x) <= REL_ERR[fmt] * scale * 1.01 + 1e-7).all()
    assert type(store).slot_nbytes(3, 64) == 3 * SLOT_BYTES[fmt]
    # a tiled read touches whole tiles of 16 slots: 0..16 reads tiles 0 and 1
    assert store.stored_nbytes(12) == 3 * (16 if tiled else 12) * SLOT_BYTES[fmt]
    assert store.stored_nbytes(17) == 3 * (32 if tiled else 17) * SLOT_BYTES[fmt]
    # the shape rule is what the arrays really occupy: 32 slots, 2 whole tiles
    assert (
        sum(a.nbytes for a in store.arrays()) == store.stored_nbytes(32) == 32 * 3 * SLOT_BYTES[fmt]
    )


@pytest.mark.parametrize("shape", [(3, 8192, 64), (2, 0, 32), (1, 1, 1)])
def test_lazy_zeros_are_writable_zeros(shape):
    a = lazy_zeros(shape, np.int8)
    assert a.shape == shape and a.dtype == np.int8 and a.flags.writeable
    assert not a.any()
    if a.size:
        a[-1, -1, -1] = 5
        assert a.sum() == 5


@pytest.mark.parametrize("tiled", [False, True])
@pytest.mark.parametrize("fmt", sorted(KV_FORMATS))
def test_unwritten_slots_read_as_zero(fmt, tiled):
    store = kv_store_class(fmt)(2, 8, 32, tiled=tiled)
    store.write(0, np.ones((1, 2, 32), np.float32))
    got = store.load(0, 8)
    assert np.allclose(got[:, 0], 1, rtol=1e-2) and not got[:, 1:].any()


def test_f16_saturates_instead_of_overflowing():
    store = kv_store_class("f16")(1, 2, 32)
    store.write(0, np.full((1, 1, 32), 1e6, np.float32))  # (T, n_kv, hd)
    assert (store.load(0, 1) == 65504.0).all()


def test_q8_0_needs_whole_blocks():
    with pytest.raises(QuantError, match="head_dim divisible by 32"):
        kv_store_class("q8_0")(2, 4, 48)


def test_unknown_kv_format():
    with pytest.raises(QuantError, match="unknown KV cache format 'q3'"):
        kv_store_class("q3")
