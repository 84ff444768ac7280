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

The phases time themselves: the thread whose report completes a phase stores its clock (the
time-stamp counter) as the phase's release, and every thread adds the ticks it spun
waiting; the step's start is the earliest thread's. From those, `phase_seconds` splits a
step's time into each phase's duration (release to release) less the threads' mean wait,
and that wait: what `llama-np bench --profile` reports. A thread the system starts late
(it took no item) spins for nothing and moves no release, so the split holds then too.
"""

from __future__ import annotations

import functools
import platform
import time

import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.core.extending import intrinsic

from .jit import kernel

NEXT, DONE = 0, 1  # a phase's counters
RELEASE, WAITED = 2, 3  # its timers: the clock when it was done, its threads' ticks spun
EPOCH = 1 << 62  # a step's start is stored as EPOCH less its clock (`start`)
LINE = 8  # int64 per phase: each phase's counters on a cache line of their own
X86 = platform.machine().lower() in ("x86_64", "amd64", "i686", "i386")  # rdtsc (`clock`)


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
def fetch_max(typingctx, sync, k, j, v):
    """sync[k, j] = max(sync[k, j], v) atomically (signed)."""

    def codegen(context, builder, sig, args):
        return builder.atomic_rmw("max", _at(context, builder, sig, args[:3]), args[3], "seq_cst")

    return types.int64(sync, types.int64, types.int64, types.int64), codegen


@intrinsic
def clock(typingctx):
    """The time-stamp counter (x86 `rdtsc`: constant rate on these machines; ticks per
    second by `ticks_per_second`). Elsewhere 0: LLVM's cycle counter on Arm reads a
    register user code may not (a fault), so a step there times nothing (the profile puts
    it outside the kernels)."""

    def codegen(context, builder, sig, args):
        if not X86:
            return ir.Constant(ir.IntType(64), 0)
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.IntType(64), []), "llvm.readcyclecounter"
        )
        return builder.call(fn, [])

    return types.int64(), codegen


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
def start(sync):
    """Stamp this thread's start into the last row of `sync`: EPOCH less the earliest
    clock (a maximum, so that the row's zero is below every stamp)."""
    fetch_max(sync, sync.shape[0] - 1, RELEASE, EPOCH - clock())


@kernel(inline=True)
def finish(sync, k, finished, n):
    """Report `finished` items of phase k done, then wait until all n are (the report that
    completes the phase stamps its release; each thread adds the ticks it waited)."""
    t0 = clock()
    if finished and fetch_add(sync, k, DONE, finished) + finished == n:
        sync[k, RELEASE] = t0
    while load_acquire(sync, k, DONE) < n:
        pause()
    fetch_add(sync, k, WAITED, clock() - t0)


@kernel(inline=True)
def grain_of(n, threads):
    """Items per take for n items: about four takes per thread, so a thread the system
    stalls leaves its share to the others, at a few atomic operations per phase."""
    return max(1, -(-n // (4 * threads)))


@kernel
def now():
    """The time-stamp counter, for Python."""
    return clock()


@functools.cache
def ticks_per_second() -> float:
    """The time-stamp counter's rate, measured once against perf_counter over 20 ms."""
    now()  # compiled (or loaded) before the measurement
    c0, t0 = now(), time.perf_counter()
    time.sleep(0.02)
    c1, t1 = now(), time.perf_counter()
    return (c1 - c0) / (t1 - t0)


def phase_seconds(sync: np.ndarray, threads: int) -> tuple[np.ndarray, np.ndarray]:
    """Each phase's work and waits in seconds, from a step's `sync` whose last row holds
    its start (`start`; phases that did not run: zero). A phase lasts from the previous
    release (the step's start) to its own; its waits are the ticks its threads spun, over
    the threads; its work the rest. Together they add up to the step's time from its
    first thread's start to its last release."""
    release = sync[:, RELEASE].astype(np.float64)
    waited = sync[:, WAITED].astype(np.float64) / threads
    work, waits = np.zeros(len(release) - 1), np.zeros(len(release) - 1)
    prev = float(EPOCH - int(sync[-1, RELEASE]))  # (in integers: 2**62 is past float64's)
    for k in np.flatnonzero(release[:-1] > 0):
        lasted = release[k] - prev
        waits[k] = min(waited[k], lasted)
        work[k] = lasted - waits[k]
        prev = release[k]
    rate = ticks_per_second()
    return (work / rate, waits / rate) if rate else (work, waits)
