"""The Python API: load a model, generate text, read logits. The CLI is a thin layer on it.

import llama_np
llm = llama_np.load("path/to/checkpoint")          # a directory, a .gguf file or an alias
print(llm.generate("Once upon a time", n_predict=32, temp=0))
logits = llm.logits(llm.tokenize("Hello"))         # (T, vocab) float32
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from llama_arch import Config
from llama_np.errors import LlamaNpError, UsageError
from llama_np.generation.batch import BatchStats, generate_batch
from llama_np.generation.generate import Stats, generate
from llama_np.generation.sampling import Sampler, SamplerSettings
from llama_np.io.hub import DEFAULT_MODEL, MODELS, resolve_model
from llama_np.io.source import open_source, peek_config
from llama_np.io.tokenizer import Tokenizer
from llama_np.model.build import build_weights
from llama_np.model.kvcache import KVCache, check_batch_fits
from llama_np.model.transformer import Transformer
from llama_np.model.warmup import CompileNotice
from quant.backends import (
    COMPILE_PROGRESS,
    Backend,
    BackendUnavailable,
    get_backend,
    numpy_backend,
)
from quant.host import usable_cores


def choose_backend(kernels: str = "auto", notice: CompileNotice | None = None) -> Backend:
    """The kernel backend: "numpy", "numba", or "auto" (numba when it is importable). A
    compiled backend whose kernels cannot be compiled here is an error when asked for by
    name; under "auto" it falls back to NumPy with a note. `notice`: told the compile's
    stages."""
    token = COMPILE_PROGRESS.set(notice.stage if notice else None)
    try:
        with notice.phase() if notice else nullcontext():
            return get_backend(kernels)
    except BackendUnavailable as e:
        if kernels != "auto":
            raise UsageError(str(e)) from None
        print(f"llama-np: note: {e}; running the NumPy kernels", file=sys.stderr)
        return numpy_backend()
    finally:
        COMPILE_PROGRESS.reset(token)


def compile_notice(kernels: str, progress: bool) -> CompileNotice | None:
    """The notice a first run's compile shows (when `progress`, and the kernels may be
    compiled ones): the backend's stages and the model's warm-up."""
    from quant.backends import numba_importable, warm_up_stages

    if not progress or kernels == "numpy" or not numba_importable():
        return None
    from quant.compiled.jit import cache_folder

    folder = cache_folder()
    # an empty cache compiles everything: say so at once; a filled one loads its kernels in
    # a few seconds, and is said only if something is still compiled after ten
    cold = not folder.is_dir() or next(folder.rglob("*.nbi"), None) is None
    stages = warm_up_stages() + Transformer.WARM_UP_STAGES
    return CompileNotice(stages, str(folder), after=0.0 if cold else 10.0)


class LLM:
    """A model with its tokenizer. `close()` (or leaving a `with` block) stops its kernel
    threads (its kernels then run on one thread)."""

    def __init__(self, model: Transformer, tokenizer: Tokenizer | None, path: Path) -> None:
        self.model = model
        self._tokenizer = tokenizer
        self.path = path

    @property
    def kernels(self) -> str:
        """What runs the kernels, e.g. "numba omp, 2 threads"."""
        return self.model.kernels

    def close(self) -> None:
        self.model.close()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

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
        """Text pieces as they are generated. `ctx`: the context (default: the prompt and
        n_predict, at most the model's). `sampling` takes SamplerSettings' fields (temp,
        top_k, top_p, min_p, repeat_penalty, repeat_last_n, seed)."""
        if isinstance(prompt, str) and not prompt:
            raise UsageError("the prompt is empty")
        ids = self.tokenize(prompt) if isinstance(prompt, str) else list(prompt)
        # the context asked for decides Phi-3's longrope factors, as llama.cpp's n_ctx does
        ctx = ctx or min(self.config.max_seq_len, len(ids) + n_predict)
        cache = cache if cache is not None else self.new_cache(ctx, window, kv)
        sampler = Sampler(SamplerSettings(**sampling))
        return generate(self.model, self.tokenizer, ids, cache, sampler, n_predict, stop, stats)

    def generate(self, prompt: str | Sequence[int], n_predict: int = 128, **kwargs: Any) -> str:
        """The whole generated text at once; same arguments as `stream`."""
        return "".join(self.stream(prompt, n_predict, **kwargs))

    def generate_batch(
        self,
        prompts: Sequence[str | Sequence[int]],
        n_predict: int = 128,
        *,
        stop: Sequence[str] = (),
        ctx: int | None = None,
        window: int | None = None,
        kv: str = "f32",
        stats: BatchStats | None = None,
        **sampling: Any,
    ) -> list[str]:
        """The text after each prompt, the sequences decoded together (one step of all of
        them at a time, each weight read once per step). Sequence i samples with seed
        `seed + i` when a seed is given, so it gives exactly what `generate(prompts[i],
        seed=seed + i)` gives (greedy: what it gives alone). The same prompt given N times
        is prefilled once and its cache copied."""
        if not prompts:
            raise UsageError("no prompts")
        if any(isinstance(p, str) and not p for p in prompts):
            raise UsageError("a prompt is empty")
        ids = [self.tokenize(p) if isinstance(p, str) else list(p) for p in prompts]
        # each cache holds what its sequence needs (the longest prompt and n_predict), not
        # the model's whole context, unless ctx says otherwise
        capacity = ctx or min(self.config.max_seq_len, max(map(len, ids)) + n_predict)
        check_batch_fits(self.model, len(ids), capacity, window, kv)
        shared = len(ids) > 1 and all(i == ids[0] for i in ids)
        n_caches = 1 if shared else len(ids)
        caches = [self.new_cache(capacity, window, kv) for _ in range(n_caches)]
        caches += [caches[0]] * (len(ids) - len(caches))  # replaced by copies after prefill
        seed = sampling.pop("seed", None)
        samplers = [
            Sampler(SamplerSettings(**sampling, seed=None if seed is None else seed + i))
            for i in range(len(ids))
        ]
        return generate_batch(self.model, self.tokenizer, ids, caches, samplers, n_predict,
                              stop, stats, shared)  # fmt: skip


def load(
    model: str | Path | None = None,
    *,
    weights: str | None = None,
    head: str | None = None,
    threads: int | None = None,
    kernels: str = "auto",
    progress: bool = False,
    check_tensors: bool = False,
) -> LLM:
    """Load a checkpoint directory, a .gguf file or a model alias (default: smollm2-135m,
    pulled on first use; reports then name the model by its alias). `weights` converts
    every matrix to that format at load time (None keeps them as stored); `head` gives the
    LM head its own format; `kernels` is "auto" (compiled when numba is installed),
    "numba" or "numpy"; the kernels run on `threads` cores (default: all).
    `check_tensors`: refuse a file with a NaN or infinite value, scale or min in any tensor
    (LlamaNpError naming the first), at the cost of reading every tensor once."""
    model = DEFAULT_MODEL if model is None else model
    path = resolve_model(model)
    header = peek_config(path)  # a model the engine does not run: refused before anything compiles
    notice = compile_notice(kernels, progress)
    try:
        backend = choose_backend(kernels, notice)
        src = open_source(path, backend, header)
        del header  # a GGUF's parsed metadata: ~200 MB for a large vocabulary, not kept
        return _load(model, src, weights, head, threads, progress, check_tensors, backend,
                     notice)  # fmt: skip
    finally:
        if notice:
            notice.close()


def _load(model, src, weights, head, threads, progress, check_tensors, backend,
          notice) -> LLM:  # fmt: skip
    if check_tensors:
        src.check_tensors()
    if isinstance(model, str) and model in MODELS:
        src.config = replace(src.config, name=model)  # reports name it by its alias
    w = build_weights(src.config, src.tensors, weights, head, progress=progress, backend=backend,
                      consume=True)  # fmt: skip
    model = Transformer(src.config, w, backend).start(threads or usable_cores())
    with notice.phase() if notice else nullcontext():
        model.warm_up(progress=notice.stage if notice else None)
    return LLM(model, src.tokenizer, src.path)
