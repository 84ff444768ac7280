"""llama-np: a LLaMA/Mistral decoder in NumPy that measures itself against the speed of light."""

import os

# OpenBLAS's idle threads spin 2**28 cycles (~0.1 s here) after every call before they
# sleep: a core kept busy after each prompt, taken from the decode kernels that follow
# and from other programs. 2**20 cycles (~1 ms) still bridges the gaps between the
# products of one forward pass. Read when NumPy loads OpenBLAS: it takes effect when
# llama_np is imported before NumPy, as the CLI and the scripts do.
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "20")

from .api import LLM, load
from .config import Config
from .errors import LlamaNpError, UsageError
from .generate import Stats
from .kvcache import KVCache

__all__ = ["LLM", "Config", "KVCache", "LlamaNpError", "Stats", "UsageError", "load"]
