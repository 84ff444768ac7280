"""The compiled kernel backend (numba): decode kernels that read every weight format and
the KV cache in their stored form at memory speed, on all cores.

Importing this package imports numba; `quant.backends` imports it only when asked for,
so everything works without numba, in NumPy.
"""

from __future__ import annotations

import functools

from .jit import kernel_cache, set_threads, take_turns, threading_layer

with kernel_cache():  # the kernels below are compiled into the project's cache: every
    # module that defines kernels, imported here (one imported later, by its first user,
    # would cache its kernels beside its source, keyed on its own file only, and keep the
    # machine code of helpers since changed: tests/quant/test_kernel_cache.py)
    from . import experts, fewlayers, peak, recurrent
    from .weights import FORMATS

from .simd import DOT_INSTRUCTION

__all__ = ["DOT_INSTRUCTION", "FORMATS", "experts", "fewlayers", "peak", "recurrent",
           "set_threads", "threading_layer"]  # fmt: skip


def warm_up(formats: dict, kv_formats: list[str], dot: str = "f32", progress=None) -> None:
    """Compile (or load from the disk cache) the kernels for these weight formats (name ->
    class), with x multiplied as `dot` in decode, and KV formats, now, on tiny inputs,
    so that a kernel that cannot be compiled on this CPU fails at load with one clear
    error, and the first token does not pay the compile time. `progress(stage)` is told
    each format's and KV format's name as its stage begins. Processes warming up an empty
    cache at once share the stages (jit.take_turns)."""
    import numpy as np

    rng = np.random.default_rng(0)
    # the one-call step first (~80 s cold on a Zen 4; a KV format's attention and a weight
    # format's products 0-20 s each), so that processes sharing the stages finish together
    stages = [("one-call step", _step_stage)]
    stages += [(f"kv {kv}", functools.partial(_kv_stage, kv, rng)) for kv in kv_formats]
    stages += [(name, functools.partial(_format_stage, cls, dot, rng)) for name, cls in
               formats.items()] + [("ops", _ops_stage)]  # fmt: skip
    take_turns(stages, dot, progress or (lambda stage: None))


def _format_stage(cls, dot: str, rng) -> None:
    """A weight format's products: one vector, each count of few vectors (fewdot.py), two
    passes of them, then the panels; and its rows (an embedding's)."""
    import numpy as np

    from .weights import SPLIT

    x = rng.standard_normal(256).astype(np.float32)
    w = cls.random((5, 256), rng)
    w.matvec(x, dot=dot)
    for b in range(1, SPLIT + 2):
        w.matmul(x[None].repeat(b, 0), dot=dot)
    w.rows(np.array([1]))


def _ops_stage() -> None:
    """The norms, gates, residuals and a mixture of experts' routing."""
    import numpy as np

    from . import ops

    x = np.random.default_rng(0).standard_normal(64).astype(np.float32)
    out = np.empty(64, np.float32)
    ops.rmsnorm(x, x, np.float32(1e-5), out)
    ops.prepare(x, x, np.float32(1e-5), ops.NORM)
    ops.prepare_rows(x[None], x, np.float32(1e-5), ops.NORM, out[None])
    for gate in (ops.SWIGLU, ops.GEGLU):
        ops.prepare_rows(x[None], x, np.float32(1e-5), gate, out[None, :32])
        ops.prepare(x, x, np.float32(1e-5), gate)
    ops.prepare_rows_shared(x[None], x, np.float32(1e-5), ops.NORM, out[None])
    ops.swiglu(x, out[:32])
    ops.residual(out.copy(), out.copy(), x, np.float32(1e-5), np.float32(1))
    sel, w = np.empty(2, np.int64), np.empty(2, np.float32)  # a mixture of experts' token
    ops.route(x[:8].copy(), 2, True, sel, w)
    ops.experts_add(out.copy(), np.ones((2, 64), np.float32), w, x, np.float32(1e-5),
                    np.float32(1), np.empty(64, np.float32))  # fmt: skip


def _kv_stage(kv: str, rng) -> None:
    """A KV format's attention, one sequence's and a batch's, as the calls one by one run
    it."""
    import numpy as np

    from ..kv import KV_FORMATS
    from . import attention, layers

    cos, sin = np.ones(16, np.float32), np.zeros(16, np.float32)
    none = np.zeros(0, np.float32)
    spec = attention.spec_of(none, none, 1e-5, 0.125, 0.0)
    out = np.empty(32, np.float32)
    keys, values = KV_FORMATS[kv](1, 16, 32, tiled=True), KV_FORMATS[kv](1, 16, 32)
    qkv = rng.standard_normal(3 * 32).astype(np.float32)
    stores = tuple(keys.arrays()), tuple(values.arrays())
    attention.attend(qkv, cos, sin, spec, *stores, 0, 1, out)
    kv_at = np.array([[layers.address(a) for a in stores[0] + stores[1]]] * 2, np.int64)
    two, pair = np.ones(2, np.int64), np.empty((2, 32), np.float32)
    layers.attend_batch(np.stack([qkv, qkv]), np.stack([cos, cos]), np.stack([sin, sin]),
                        spec, layers.layout_of(*stores), 32, kv_at, two - 1, two,
                        pair)  # fmt: skip


def _step_stage() -> None:
    """The one-call decode step (layers.decode_layers), one kernel for every KV format."""
    from ..kv import KV_FORMATS
    from . import layers

    keys, values = KV_FORMATS["f32"](1, 16, 32, tiled=True), KV_FORMATS["f32"](1, 16, 32)
    layers.warm_up(tuple(keys.arrays()), tuple(values.arrays()))
