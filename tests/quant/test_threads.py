"""The NumPy backend's threads (quant.threads): products split over two threads equal
those on one (tests/quant/test_kernels.py runs every format both ways); here, what the
pool itself promises, and the BLAS threads the backend sets and gives back."""

from __future__ import annotations

import numpy as np
import pytest
from threadpoolctl import threadpool_info

from quant import FORMATS, threads
from quant.backends import numpy_backend


@pytest.fixture
def two_threads():
    threads.set_threads(2)
    yield
    threads.set_threads(1)


def test_every_item_runs_once(two_threads):
    seen: list[int] = []
    threads.for_each(seen.append, list(range(7)))
    assert sorted(seen) == list(range(7))


def test_a_thread_error_reaches_the_caller(two_threads):
    with pytest.raises(ZeroDivisionError):
        threads.for_each(lambda i: 1 // i, [3, 2, 1, 0])


def test_each_thread_has_its_own_scratch(two_threads):
    buffers: dict[int, int] = {}

    def work(i: int) -> None:
        buffers[i] = id(threads.scratch((4, 4)))

    threads.for_each(work, [0, 1])
    assert buffers[0] != buffers[1]


def test_the_backend_gives_blas_its_threads_back():
    def blas_threads():
        return [p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"]

    rng = np.random.default_rng(0)
    f32 = FORMATS["f32"].from_float(rng.standard_normal((8, 64)).astype(np.float32))
    q8 = FORMATS["q8_0"].from_float(rng.standard_normal((8, 64)).astype(np.float32))
    before = blas_threads()
    for matrices, blas, label in (([f32, q8], 1, "numpy, 2 threads"), ([f32], 2, "BLAS 2")):
        running = numpy_backend().start(matrices, 2)
        assert blas_threads() == [blas] * len(before) and label in running.label
        running.close()
        assert blas_threads() == before and threads._pool is None
