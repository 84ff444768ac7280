"""llama-np: a LLaMA/Mistral decoder in NumPy that measures itself against the speed of light."""

import os

# OpenBLAS's idle threads spin 2**28 cycles (~0.1 s here) after every call before they
# sleep: a core kept busy after each prompt, taken from the decode kernels that follow
# and from other programs. 2**20 cycles (~1 ms) still bridges the gaps between the
# products of one forward pass. Read when NumPy loads OpenBLAS: it takes effect when
# llama_np is imported before NumPy, as the CLI and the scripts do.
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "20")

from llama_arch import Config
from llama_np.api import LLM, load
from llama_np.errors import ERRORS, LlamaNpError, UsageError
from llama_np.generation.generate import Stats
from llama_np.model.kvcache import KVCache

__all__ = ["ERRORS", "LLM", "Config", "KVCache", "LlamaNpError", "Stats", "UsageError", "load"]
