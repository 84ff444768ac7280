"""llama-np: a LLaMA/Mistral decoder in NumPy that measures itself against the speed of light."""

from .api import LLM, load
from .config import Config
from .errors import LlamaNpError, UsageError
from .generate import Stats
from .kvcache import KVCache

__all__ = ["LLM", "Config", "KVCache", "LlamaNpError", "Stats", "UsageError", "load"]
