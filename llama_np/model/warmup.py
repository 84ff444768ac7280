"""Compiling before anything is timed. The compiled backend's kernels are compiled on a
machine's first run (minutes on 2 cores; later runs load them from the disk cache in about a
second): `load` compiles them, then runs a prompt and a decode step on a scratch cache, so
that no figure a command prints counts compile or cache-loading time.

A first run would otherwise sit silent for minutes: `CompileNotice` says what is happening
once the compiling phases have run for a second (a warm cache never shows it), then counts
the stages on a progress bar."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TextIO


class CompileNotice:
    """Progress of `stages` compile stages, shown only once the phases run inside `phase()`
    have lasted `after` seconds together. `timer(seconds, fn)` starts a cancellable timer
    (threading.Timer; a test's stub fires at once)."""

    def __init__(self, stages: int, where: str = "", after: float = 1.0,
                 timer: Callable = threading.Timer, out: TextIO | None = None) -> None:  # fmt: skip
        self.stages, self.where, self.after, self.timer = stages, where, after, timer
        self.out = out or sys.stderr
        self.done = 0
        self.bar = None  # the progress bar, once shown
        self._lock = threading.Lock()
        self._spent = 0.0  # seconds inside phases so far
        self._t0 = time.perf_counter()

    @contextmanager
    def phase(self) -> Iterator[None]:
        """A stretch of compiling (or loading compiled kernels): the notice shows once such
        stretches have lasted `after` seconds; loading weights between them does not count."""
        t0 = time.perf_counter()
        timer = self.timer(max(0.0, self.after - self._spent), self.show)
        timer.daemon = True
        timer.start()
        try:
            yield
        finally:
            timer.cancel()
            self._spent += time.perf_counter() - t0

    def show(self) -> None:
        from tqdm import tqdm

        with self._lock:
            if self.bar is not None:
                return
            where = f"; later runs load them from {self.where}" if self.where else ""
            print(f"llama-np: compiling the kernels for this CPU (once: a minute or several"
                  f"{where})", file=self.out, flush=True)  # fmt: skip
            self.bar = tqdm(total=self.stages, initial=self.done, desc="compiling", unit="stage",
                            file=self.out, leave=False, mininterval=0)  # fmt: skip

    def stage(self, name: str) -> None:
        """A stage begins: the one before it is done."""
        with self._lock:
            self.done = min(self.done + 1, self.stages)
            if self.bar is not None:
                self.bar.set_postfix_str(name, refresh=False)
                self.bar.update(1)

    def close(self) -> None:
        with self._lock:
            if self.bar is not None:
                self.bar.close()
                print(f"llama-np: kernels compiled in {time.perf_counter() - self._t0:.0f} s",
                      file=self.out, flush=True)  # fmt: skip
                self.bar = None
