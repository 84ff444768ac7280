"""The project's cache directory, for what llama-np computes or fetches once: models
(llama_np.hub), bandwidth probes (bench.probe), compiled kernels (quant.compiled).
$LLAMA_NP_CACHE, by default ~/.cache/llama-np. It lives in this, the lowest package, so
that every package finds it in one place."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    return Path(os.environ.get("LLAMA_NP_CACHE") or Path.home() / ".cache" / "llama-np")
