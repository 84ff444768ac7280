"""This machine, as every package sees it: the cores llama-np may use, and the project's
cache directory for what it computes or fetches once (models: llama_np.io.hub; bandwidth
probes: bench.probe; compiled kernels: quant.compiled) — $LLAMA_NP_CACHE, by default
~/.cache/llama-np. It lives in the lowest package so that each is written once."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    return Path(os.environ.get("LLAMA_NP_CACHE") or Path.home() / ".cache" / "llama-np")


def threads_label(n: int) -> str:
    """ "1 thread", "2 threads": for reports."""
    return f"{n} thread" if n == 1 else f"{n} threads"


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask), the default thread count."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1
