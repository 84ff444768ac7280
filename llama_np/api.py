"""The Python API: load a model, generate text, read logits. The CLI is a thin layer on it.

import llama_np
llm = llama_np.load("path/to/checkpoint")          # a directory, a .gguf file or an alias
print(llm.generate("Once upon a time", n_predict=32, temp=0))
logits = llm.logits(llm.tokenize("Hello"))         # (T, vocab) float32
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

from quant import arena, parallel
from quant.backends import Backend, BackendUnavailable, get_backend, numpy_backend

from .config import Config
from .errors import LlamaNpError, UsageError
from .generate import Stats, generate
from .hub import resolve_model
from .kvcache import KVCache
from .loader import build_weights, open_source
from .model import Transformer
from .sampling import Sampler, SamplerSettings
from .tokenizer import Tokenizer


def default_threads() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def set_threads(n: int | None) -> int:
    """Threads for the kernels (BLAS); returns the number set."""
    n = n or default_threads()
    threadpool_limits(n, user_api="blas")
    return n


def choose_backend(kernels: str = "auto") -> Backend:
    """The kernel backend: "numpy", "numba", or "auto" (numba when it is importable). A
    compiled backend whose kernels cannot be compiled here is an error when asked for by
    name; under "auto" it falls back to NumPy with a note."""
    try:
        return get_backend(kernels)
    except BackendUnavailable as e:
        if kernels != "auto":
            raise UsageError(str(e)) from None
        print(f"llama-np: note: {e}; running the NumPy kernels", file=sys.stderr)
        return numpy_backend()


def start_kernels(model: Transformer, threads: int) -> str:
    """Put the weights in one huge-page arena, then choose how `threads` cores run the
    kernels; returns how, for reports.

    Compiled backend: every decode kernel splits its rows over `threads` numba threads;
    BLAS gets `threads` threads for prefill's matrix products.
    NumPy backend: float32 matrices go to BLAS, which threads them itself (faster than a
    hand-over between processes: 35.3 vs 38.5 ms/token on SmolLM2 f32). Every other format
    converts its codes in NumPy, one core per call, so its rows are split between
    `threads` processes (quant.parallel), each with one BLAS thread."""
    model.arena = arena.pack(model.weights.matrices())
    if model.backend.name == "numba":
        from quant import compiled

        parallel.stop()
        threadpool_limits(threads, user_api="blas")
        return f"{model.backend.threading()}, {compiled.set_threads(threads)} threads"
    leaves = [p for w in model.weights.matrices() for p in w.leaves()]
    needs_team = any(w.fmt != "f32" for w in leaves)
    if needs_team and parallel.start(model.weights.matrices(), threads):
        threadpool_limits(1, user_api="blas")
        return f"numpy, {parallel.active()} processes"
    parallel.stop()
    threadpool_limits(threads, user_api="blas")
    return f"numpy, BLAS {threads} threads"


class LLM:
    """A model with its tokenizer."""

    def __init__(
        self, model: Transformer, tokenizer: Tokenizer | None, path: Path, kernels: str = ""
    ) -> None:
        self.model = model
        self._tokenizer = tokenizer
        self.path = path
        self.kernels = kernels  # what runs the kernels, e.g. "numba omp, 2 threads"

    @property
    def config(self) -> Config:
        return self.model.config

    @property
    def tokenizer(self) -> Tokenizer:
        if self._tokenizer is None:
            raise LlamaNpError(f"{self.path}: the checkpoint has no tokenizer")
        return self._tokenizer

    def tokenize(self, text: str, bos: bool | None = None) -> list[int]:
        return self.tokenizer.encode(text, bos)

    def detokenize(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids))

    def new_cache(
        self, ctx: int | None = None, window: int | None = None, kv: str = "f32"
    ) -> KVCache:
        """A KV cache for one sequence: `ctx` positions (default: the model's context),
        `window` forces a sliding window, `kv` is the cache's storage format."""
        return self.model.new_cache(ctx, window, kv)

    def logits(self, ids: Sequence[int], cache: KVCache | None = None) -> np.ndarray:
        """Logits at every position of `ids` in one batched pass: (T, vocab) float32."""
        cache = cache if cache is not None else self.new_cache(max(len(ids), 1))
        return self.model.forward(np.asarray(ids), cache, all_logits=True)

    def step(self, token: int, cache: KVCache) -> np.ndarray:
        """One decode step: the logits after `token`, appended to `cache`. (vocab,)"""
        return self.model.forward(np.asarray([token]), cache)

    def stream(
        self,
        prompt: str | Sequence[int],
        n_predict: int = 128,
        *,
        stop: Sequence[str] = (),
        cache: KVCache | None = None,
        ctx: int | None = None,
        window: int | None = None,
        kv: str = "f32",
        stats: Stats | None = None,
        **sampling: Any,
    ) -> Iterator[str]:
        """Text pieces as they are generated. `sampling` takes SamplerSettings' fields
        (temp, top_k, top_p, min_p, repeat_penalty, repeat_last_n, seed)."""
        if isinstance(prompt, str) and not prompt:
            raise UsageError("the prompt is empty")
        ids = self.tokenize(prompt) if isinstance(prompt, str) else list(prompt)
        cache = cache if cache is not None else self.new_cache(ctx, window, kv)
        sampler = Sampler(SamplerSettings(**sampling))
        return generate(self.model, self.tokenizer, ids, cache, sampler, n_predict, stop, stats)

    def generate(self, prompt: str | Sequence[int], n_predict: int = 128, **kwargs: Any) -> str:
        """The whole generated text at once; same arguments as `stream`."""
        return "".join(self.stream(prompt, n_predict, **kwargs))


def load(
    model: str | Path | None = None,
    *,
    weights: str | None = None,
    head: str | None = None,
    threads: int | None = None,
    kernels: str = "auto",
    progress: bool = False,
) -> LLM:
    """Load a checkpoint directory, a .gguf file or a model alias (default: smollm2-135m,
    pulled on first use). `weights` converts every matrix to that format at load time (None
    keeps them as stored); `head` gives the LM head its own format; `kernels` is "auto"
    (compiled when numba is installed), "numba" or "numpy"."""
    threads = set_threads(threads)
    backend = choose_backend(kernels)
    src = open_source(resolve_model(model), backend)
    w = build_weights(src.config, src.tensors, weights, head, progress=progress, backend=backend)
    model = Transformer(src.config, w, backend)
    return LLM(model, src.tokenizer, src.path, start_kernels(model, threads))
