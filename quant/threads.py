"""The NumPy backend's threads: a product's row panels split over a pool of plain threads.

NumPy releases the GIL in its casts, its ufuncs and its matmul (BLAS), which are where a
quantized NumPy product spends its time, so two threads run two panels at once. Float32
matrices do not come here: BLAS threads them itself. Each thread keeps its own scratch
buffers: a fresh 4 MiB panel buffer per call would page-fault (SmolLM2 q8_0 decoded in
19.9 ms/token with reuse, 25.9 without, in the measurement that introduced reuse).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

_local = threading.local()
_pool: ThreadPoolExecutor | None = None
_threads = 1


def set_threads(n: int) -> int:
    """Run products on `n` threads from now on (1: in the calling thread)."""
    global _pool, _threads
    n = max(1, n)
    if n != _threads:
        if _pool is not None:
            _pool.shutdown()
        # the calling thread takes a share too (for_each): n - 1 more threads
        _pool = ThreadPoolExecutor(n - 1, thread_name_prefix="llama-np") if n > 1 else None
        _threads = n
    return n


def scratch(shape: tuple[int, ...], dtype: type = np.float32) -> np.ndarray:
    """A buffer of this shape that the calling thread reuses from call to call."""
    buffers = _local.__dict__.setdefault("buffers", {})
    buf = buffers.get((shape, dtype))
    if buf is None:
        buf = buffers[(shape, dtype)] = np.empty(shape, dtype)
    return buf


def for_each(work: Callable[[object], None], items: Sequence) -> None:
    """work(item) for every item, the items cut into one contiguous run per thread."""
    if _pool is None or len(items) < 2:
        for item in items:
            work(item)
        return
    n = min(_threads, len(items))
    runs = [items[len(items) * k // n : len(items) * (k + 1) // n] for k in range(n)]
    errors = np.geterr()  # NumPy's error handling is per thread: the caller's, on every one

    def run(part: Sequence) -> None:
        with np.errstate(**errors):
            for item in part:
                work(item)

    others = [_pool.submit(run, part) for part in runs[1:]]
    run(runs[0])  # the calling thread takes the first run
    for f in others:
        f.result()  # waits, and raises what the thread raised
