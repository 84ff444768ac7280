"""The one-call decode step and the calls one by one run the same compiled kernels when the
one call was compiled first: a fresh process with an empty kernel cache compiles it, then
the calls one by one, which find its row kernels compiled. In a file of its own: it
compiles a model's one-call step anew (100-125 s on a 2-vCPU Zen 4), and the
test workers (scripts/test.sh) take a file at a time."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from tests.helpers import CompilerCheck
from tests.llama_np.model.test_decode_layers import decode, model_for

# (case, kernels, KV format, which path runs first). One sequence's step: the one call
# first, then the calls one by one, which find its row kernels compiled. Other formats, KV
# stores, x's types and batches of 2-4 are held within float32 roundings across the paths
# (test_decode_layers.py: compiled in any order, or loaded from the disk cache); that no
# kernel gets a second specialization on any path, every model kind's and a batch's, in
# test_compiled.py (test_no_kernel_specialized_twice_for_one_type). Not here: a batch's
# step the other way round (the calls one by one first), which compiled the few-vector
# walker too, ~95 of this check's ~235 s (Zen 4, 2026-11-29). A second case, each
# direction the other way round, doubled the check again.
ORDERS = [("q4_1 + q8_0 v, window", "numba-int8", "f32", "one call")]

# The walker's kernels for what this case's model has none of (recurrent mixers, experts
# and their routing, per-layer inputs): compiled into the walker, never run by either
# path, so they are loaded from (or compiled into) the suite's own kernel cache, not
# compiled anew here: ~35 of the check's ~150 s (Zen 4, 2026-12-07).
UNUSED = [("quant.compiled.layers", "mixer_phase"), ("quant.compiled.layers", "experts_product"),
          ("quant.compiled.layers", "experts_phase"), ("quant.compiled.layers", "per_layer_add"),
          ("quant.compiled.ops", "route")]  # fmt: skip


def cached_in(folder: str) -> None:
    """UNUSED's kernels cached in `folder` (the suite's kernel cache), not in this
    process's NUMBA_CACHE_DIR."""
    import numba

    from quant.compiled.jit import OUT_OF_LINE, lock_cache

    saved = numba.config.CACHE_DIR
    numba.config.CACHE_DIR = folder
    try:
        for key in UNUSED:
            OUT_OF_LINE[key].enable_caching()
            lock_cache(OUT_OF_LINE[key])
    finally:
        numba.config.CACHE_DIR = saved


def compile_orders(suite_cache: str) -> None:
    """Run in a fresh process with an empty kernel cache (test_the_same_bits_with_the_one_
    call_compiled_first): compile one path before the other, hold them equal, and check
    that no out-of-line kernel was compiled twice for argument types that differ only in a
    literal value, an integer's sign or width, or an array's write flag. The prompt is one
    token, so that the path compiled first is the step's own (a longer one compiles the
    batch kernels of a prompt first: ~20 s)."""
    from quant import compiled
    from quant.compiled.jit import duplicate_specializations

    # the backend's warm-up would compile every format's kernels first (minutes on 2 cores,
    # and the rows ahead of either path): here each path compiles what it calls
    compiled.warm_up = lambda *args, **kwargs: None
    cached_in(suite_cache)
    for case, kernels, kv, first in ORDERS:
        model = model_for(case, kernels)
        order = [True, False] if first == "one call" else [False, True]
        a, b = (decode(model, kv, one_call, prompt=[1])[0] for one_call in order)
        assert np.array_equal(a, b), (case, kernels, kv, first)
    assert not duplicate_specializations(), duplicate_specializations()


@pytest.mark.slow
def test_the_same_bits_with_the_one_call_compiled_first(tmp_path) -> None:
    """The one call and the calls one by one run the same compiled row kernels when the one
    call was compiled first into an empty kernel cache: compiled for types that differ
    only in a literal (a caller's constant `add=False`), a kernel once became a second
    specialization that LLVM optimized apart, and the two paths gave logits different in
    the 7th digit on some CPUs and runs (after a run that had cached part of the kernels)."""
    check = CompilerCheck("compile-order", "llama_np/model/test_compile_order.py",
                          "llama_np/model/test_decode_layers.py")  # fmt: skip
    check.skip_if_passed()
    from quant.compiled.jit import cache_folder

    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path))
    code = ("from tests.llama_np.model.test_compile_order import compile_orders; "
            f"compile_orders({str(cache_folder())!r})")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=900)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    check.record()
