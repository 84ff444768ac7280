"""Both cores for every kernel: a team of processes that split the rows of each matvec and
matmul.

Why processes: NumPy releases the GIL inside its loops, but on the machines this was
built on, waking a blocked Python thread costs 150-300 us (a futex wake of an idle vCPU),
more than a whole matvec of a small model. Two processes spinning on a word of shared
memory hand a job over in ~2 us. So after a model is loaded, `start()` forks workers that
share every weight copy-on-write (nothing is copied: weights are only read). A call
writes its input into shared memory, bumps a sequence number, computes its own share of
the rows, and spins until each worker has written its share next to it.

The handover relies on x86's ordering of stores (the input is visible before the
sequence number that announces it), so the team runs on x86-64 only; elsewhere the
kernels run in one process and BLAS uses its own threads.
"""

from __future__ import annotations

import atexit
import mmap
import os
import platform
import select
import signal
import time
from itertools import pairwise
from typing import TYPE_CHECKING

import numpy as np
from threadpoolctl import threadpool_limits

from .base import Workspace
from .errors import QuantError

if TYPE_CHECKING:
    from collections.abc import Callable

    from .base import Matrix

# control words: [seq, kind, n_weights, T, cols, error, done of rank 1..15,
# napping of rank 1..15], then ids
SEQ, KIND, NW, T, COLS, ERROR, DONE = 0, 1, 2, 3, 4, 5, 6
NAP = DONE + 16
IDS = NAP + 16  # up to 8 weights per job
MAX_RANKS = 16
MATVEC, MATMUL, STOP = 1, 2, 3
X_CAP = 1 << 22  # float32 input elements (16 MiB)
Y_CAP = 1 << 24  # float32 output elements (64 MiB), untouched pages cost nothing
# Seconds a worker spins after its last job before it sleeps: long enough to bridge the
# gaps between the products of a forward pass and between tokens, short enough that an
# idle llama-np gives its cores back at once.
IDLE_SPIN = 0.003


def supported() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64") and hasattr(os, "fork")


def balanced_cuts(splits: list[int], parts: int) -> list[tuple[int, int]]:
    """Cut rows 0..splits[-1] into `parts` ranges at allowed boundaries, as equal as they
    can be (a part may be empty when there are fewer pieces than parts)."""
    total, cuts = splits[-1], [0]
    for k in range(1, parts):
        target = total * k / parts
        cuts.append(max(cuts[-1], min(splits, key=lambda s: abs(s - target))))
    cuts.append(total)
    return list(pairwise(cuts))


class Team:
    def __init__(
        self, weights: list[Matrix], ranks: int, on_close: Callable[[], object] | None = None
    ) -> None:
        if not 2 <= ranks <= MAX_RANKS:
            raise QuantError(f"a team has 2 to {MAX_RANKS} processes, not {ranks}")
        self.ranks = ranks
        self.weights = list(weights)
        self.index = {id(w): i for i, w in enumerate(self.weights)}
        self.parts = [balanced_cuts(w.splits(), ranks) for w in self.weights]
        self.shm = mmap.mmap(-1, 8 * 64 + 4 * (X_CAP + Y_CAP), flags=mmap.MAP_SHARED)
        self.ctl = np.frombuffer(self.shm, np.int64, 64)
        self.wake = [os.pipe() for _ in range(ranks - 1)]  # (read, write) per worker
        self.x = np.frombuffer(self.shm, np.float32, X_CAP, offset=8 * 64)
        self.y = np.frombuffer(self.shm, np.float32, Y_CAP, offset=8 * 64 + 4 * X_CAP)
        self._plans: dict[tuple[int, ...], tuple[np.ndarray, list[int]]] = {}
        self.work = Workspace()  # each process uses its own copy after the fork
        self.pids: list[int] = []
        self.parent = os.getpid()
        for rank in range(1, ranks):
            pid = os.fork()
            if pid == 0:
                self._worker(rank, seen=0)  # never returns
            self.pids.append(pid)
        atexit.register(self.close)  # no worker outlives the program
        self.label = f"numpy, {ranks} processes"
        self.on_close = on_close  # e.g. give BLAS back the threads it had

    def matvecs(self, weights: list[Matrix], x: np.ndarray) -> list[np.ndarray]:
        """W @ x for several matrices of the same input width, in one hand-over."""
        if self.covers(weights) and x.size <= X_CAP and sum(w.shape[0] for w in weights) <= Y_CAP:
            return self.run(MATVEC, weights, x)
        return [w.matvec(x, self.work) for w in weights]

    def matmuls(self, weights: list[Matrix], x: np.ndarray) -> list[np.ndarray]:
        """x @ W.T for several matrices, in batches of rows of x that fit the shared buffers."""
        rows = sum(w.shape[0] for w in weights)
        if not self.covers(weights) or rows > Y_CAP:
            return [w.matmul(x, self.work) for w in weights]
        step = max(1, min(X_CAP // x.shape[1], Y_CAP // rows))
        parts = [self.run(MATMUL, weights, x[i : i + step]) for i in range(0, x.shape[0], step)]
        return [np.concatenate([p[k] for p in parts]) for k in range(len(weights))]

    # --- the caller's side -------------------------------------------------------------
    def covers(self, weights: list[Matrix]) -> bool:
        """Whether this team can run a job on these weights (not after it stopped)."""
        running = os.getpid() == self.parent and bool(self.pids)
        return running and all(id(w) in self.index for w in weights)

    def _plan(self, weights: list[Matrix]) -> tuple[np.ndarray, list[int]]:
        """For a group of weights used together: their ids and output offsets (per row of
        x). Cached: the same groups come back every token."""
        key = tuple(map(id, weights))
        plan = self._plans.get(key)
        if plan is None:
            ids = np.array([self.index[k] for k in key], np.int64)
            offsets = [0]
            for w in weights:
                offsets.append(offsets[-1] + w.shape[0])
            plan = self._plans[key] = (ids, offsets)
        return plan

    def run(self, kind: int, weights: list[Matrix], x: np.ndarray) -> list[np.ndarray]:
        """y = W @ x (MATVEC, x (cols,)) or x @ W.T (MATMUL, x (T, cols)) for each W."""
        ids, offsets = self._plan(weights)
        t = 1 if kind == MATVEC else x.shape[0]
        c = self.ctl
        seq = int(c[SEQ])
        self._wait(seq)  # an interrupted call may still be running
        self.x[: x.size] = x.reshape(-1)
        c[KIND], c[NW], c[T], c[COLS], c[ERROR] = kind, len(ids), t, weights[0].shape[1], 0
        c[IDS : IDS + len(ids)] = ids
        c[SEQ] = seq + 1
        self._share(0)
        self._wait(seq + 1)
        if c[ERROR]:
            raise QuantError(f"a kernel worker failed on job {seq + 1} (rank {int(c[ERROR])})")
        y = self.y
        if kind == MATVEC:
            return [y[a:b].copy() for a, b in pairwise(offsets)]
        return [y[t * a : t * b].reshape(t, b - a).copy() for a, b in pairwise(offsets)]

    def _wait(self, seq: int) -> None:
        c, spins = self.ctl, 0
        for rank in range(1, self.ranks):
            woken = False
            while c[DONE + rank - 1] < seq:
                if c[NAP + rank - 1] and not woken:  # asleep since its last job: wake it
                    os.write(self.wake[rank - 1][1], b"x")
                    woken = True
                spins += 1
                if spins % 1_000_000 == 0:
                    self._check_alive()

    def _check_alive(self) -> None:
        for pid in list(self.pids):
            try:
                gone = os.waitpid(pid, os.WNOHANG) != (0, 0)
            except ChildProcessError:
                gone = True
            if gone:
                self.pids.remove(pid)
                self.close()
                raise QuantError("a kernel worker process died; the team has stopped")

    # --- both sides --------------------------------------------------------------------
    def _share(self, rank: int) -> None:
        """This rank's rows of every weight of the current job."""
        c = self.ctl
        kind, t, cols, n = int(c[KIND]), int(c[T]), int(c[COLS]), int(c[NW])
        x = self.x[: t * cols]
        if kind == MATMUL:
            x = x.reshape(t, cols)
        o = 0
        for i in c[IDS : IDS + n].tolist():
            w = self.weights[i]
            r0, r1 = self.parts[i][rank]
            rows = w.shape[0]
            if r1 > r0:
                if kind == MATVEC:
                    w.matvec_rows(x, r0, r1, self.y[o + r0 : o + r1], self.work)
                else:
                    y = self.y[o : o + t * rows].reshape(t, rows)
                    w.matmul_rows(x, r0, r1, y[:, r0:r1], self.work)
            o += t * rows

    def _worker(self, rank: int, seen: int) -> None:
        """Serve jobs until told to stop. `seen`: the last sequence number handled, fixed
        before the fork (read after it, the parent's first job could already be there)."""
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C belongs to the parent
        threadpool_limits(1)
        last, idle_since = seen, time.perf_counter()
        c, wake = self.ctl, self.wake[rank - 1][0]
        try:
            while True:
                seq = int(c[SEQ])
                if seq == last:
                    if time.perf_counter() - idle_since > IDLE_SPIN:
                        self._sleep(rank, wake)
                        # woken by a job, or by the once-a-second check: spin only after jobs
                        idle_since = time.perf_counter() - IDLE_SPIN
                        if os.getppid() != self.parent:
                            break
                    continue
                last = seq
                if c[KIND] == STOP:
                    break
                try:
                    self._share(rank)
                except Exception:  # report, keep serving: the caller raises
                    c[ERROR] = rank
                c[DONE + rank - 1] = seq
                idle_since = time.perf_counter()
        finally:
            os._exit(0)

    def _sleep(self, rank: int, wake: int) -> None:
        """Block until the caller, waiting on this worker, writes to its pipe: an idle
        worker must not take cycles from other programs (a spinning neighbour stalls
        llama.cpp's or BLAS's own threads). The caller looks at the flag only while it
        waits for this worker's result, so a job posted just before the flag is set is
        noticed then: no wake-up is lost."""
        self.ctl[NAP + rank - 1] = 1
        select.select([wake], [], [], 1.0)  # wakes at least every second to check the parent
        self.ctl[NAP + rank - 1] = 0
        if select.select([wake], [], [], 0)[0]:
            os.read(wake, 4096)

    def close(self) -> None:
        """Stop the workers (once; a forked child never stops its parent's team)."""
        if os.getpid() != self.parent or not self.pids:
            return
        atexit.unregister(self.close)
        self.ctl[KIND] = STOP
        self.ctl[SEQ] += 1
        for _, w in self.wake:
            os.write(w, b"x")
        for pid in self.pids:
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass
        self.pids.clear()
        for fds in self.wake:
            for fd in fds:
                os.close(fd)
        if self.on_close:
            self.on_close()


class Solo:
    """The kernels in this process: what runs when there is no team."""

    ranks = 1

    def __init__(
        self, label: str = "one process", on_close: Callable[[], object] | None = None
    ) -> None:
        self.label = label  # how the kernels run, for reports
        self.work = Workspace()
        self.on_close = on_close

    def close(self) -> None:
        if self.on_close:
            self.on_close()
            self.on_close = None

    def matvecs(self, weights: list[Matrix], x: np.ndarray) -> list[np.ndarray]:
        return [w.matvec(x, self.work) for w in weights]

    def matmuls(self, weights: list[Matrix], x: np.ndarray) -> list[np.ndarray]:
        return [w.matmul(x, self.work) for w in weights]


def start(
    weights: list[Matrix], ranks: int, on_close: Callable[[], object] | None = None
) -> Team | Solo:
    """A team of `ranks` processes (at most MAX_RANKS) sharing `weights`, or Solo when
    ranks < 2 or the platform is not supported. `on_close` runs when it is closed."""
    if ranks < 2 or not supported():
        return Solo(on_close=on_close)
    return Team(weights, min(ranks, MAX_RANKS), on_close)
