"""One parallel region for a whole decode step: the threads share each phase's work through
atomic counters instead of starting a parallel loop per kernel.

A numba parallel loop costs ~3.5 us to start and end at 1 thread, ~6 us at 2 (measured
from compiled code, no Python), and a decode step of SmolLM2-135M runs five per layer:
~1 ms a token, 8-11% of a 4-bit one. Here the step starts one loop, one iteration per
thread, and each thread walks every phase of every layer (llama.cpp's graph threads do
the same). A phase is a list of work items (chunks of a product's rows, attention tasks);
the threads take items from the phase's counter until none is left, then wait until
every item is done: ~0.2 us per phase here.

Each phase has two counters: `next` (the first item no thread has taken) and `done`
(items finished). A thread adds what it finished to `done` once, after it found no item
left, then waits for `done` to reach the count. So a phase never waits for a thread that
has not taken an item: if the threading layer ran the iterations one after another, the
first would do all the work and the second would find it done; no deadlock.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.core.extending import intrinsic

from .jit import kernel

NEXT, DONE = 0, 1  # a phase's counters
LINE = 8  # int64 per phase: each phase's counters on a cache line of their own


def _at(context, builder, sig, args):
    """The address of counter j of phase k of `sync` (phases, LINE) int64."""
    sync, k, j = args
    ary = context.make_array(sig.args[0])(context, builder, sync)
    return cgutils.get_item_pointer(context, builder, sig.args[0], ary, [k, j])


@intrinsic
def fetch_add(typingctx, sync, k, j, v):
    """sync[k, j] += v atomically (sequentially consistent); returns the old value."""

    def codegen(context, builder, sig, args):
        return builder.atomic_rmw("add", _at(context, builder, sig, args[:3]), args[3], "seq_cst")

    return types.int64(sync, types.int64, types.int64, types.int64), codegen


@intrinsic
def load_acquire(typingctx, sync, k, j):
    """sync[k, j], read atomically: what other threads wrote before their fetch_add is
    visible after it."""

    def codegen(context, builder, sig, args):
        return builder.load_atomic(_at(context, builder, sig, args), "acquire", 8)

    return types.int64(sync, types.int64, types.int64), codegen


@intrinsic
def pause(typingctx):
    """The spin-wait hint (x86 `pause`): lets the other hyperthread run, saves power."""

    def codegen(context, builder, sig, args):
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), []), "llvm.x86.sse2.pause"
        )
        builder.call(fn, [])
        return context.get_dummy_value()

    return types.none(), codegen


@kernel(inline=True)
def take(sync, k, grain, n):
    """The first of the next `grain` items of phase k (>= n: none left)."""
    return fetch_add(sync, k, NEXT, grain) if load_acquire(sync, k, NEXT) < n else n


@kernel(inline=True)
def finish(sync, k, finished, n):
    """Report `finished` items of phase k done, then wait until all n are."""
    if finished:
        fetch_add(sync, k, DONE, finished)
    while load_acquire(sync, k, DONE) < n:
        pause()


@kernel(inline=True)
def grain_of(n, threads):
    """Items per take for n items: about four takes per thread, so a thread the system
    stalls leaves its share to the others, at a few atomic operations per phase."""
    return max(1, -(-n // (4 * threads)))
