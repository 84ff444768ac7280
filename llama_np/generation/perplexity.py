"""`llama-np perplexity`: teacher-forced perplexity over a text, in batched windows.

As llama.cpp's perplexity tool: the text is cut into windows of `ctx` tokens, each window
starts with BOS and runs as one batched prefill, and only the second half of each window
is scored, so every scored token sees at least ctx/2 tokens of context.

`stepwise` runs each window token by token through decode steps instead, as generation
computes its logits: the same numbers in float arithmetic (up to summation order), and
the only way to see what the decode kernels change (the integer-activation products of
`--kernels numba-int16` / `numba-int8` run in decode, not in prefill). `chunks` stops
after that many windows, as llama.cpp's --chunks.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
from tqdm import tqdm

from llama_np.api import LLM
from llama_np.errors import UsageError
from llama_np.generation.generate import check_logits


@dataclass
class Perplexity:
    ppl: float
    nll: float  # mean negative log-likelihood per scored token (nats)
    scored: int  # tokens scored
    evaluated: int  # tokens run through the model
    seconds: float

    @property
    def tokens_per_s(self) -> float:
        return self.evaluated / self.seconds


def log_softmax(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    x -= x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def perplexity(
    llm: LLM,
    text: str,
    ctx: int = 256,
    kv: str = "f32",
    progress: bool = False,
    stepwise: bool = False,
    chunks: int | None = None,
) -> Perplexity:
    if ctx < 8:
        raise UsageError(f"-c/--ctx-size must be at least 8 for perplexity, got {ctx}")
    ids = llm.tokenize(text, bos=False)
    bos = llm.tokenizer.bos_id
    body = ctx - 1 if bos is not None else ctx  # the window's first slot is BOS
    n_windows = len(ids) // body
    if n_windows < 1:
        raise UsageError(f"the text has {len(ids)} tokens, fewer than one window of {ctx}")
    n_windows = min(n_windows, chunks or n_windows)
    llm.model.warm_up(kv)  # the tok/s printed counts no compile
    nll, scored, t0 = 0.0, 0, time.perf_counter()
    for w in tqdm(
        range(n_windows), desc="perplexity", unit="window", disable=None if progress else True
    ):
        window = ids[w * body : (w + 1) * body]
        tokens = ([bos] if bos is not None else []) + window
        logits = window_logits(llm, tokens, llm.new_cache(ctx, kv=kv), stepwise)  # (ctx, vocab)
        check_logits(logits, f"window {w + 1} of {n_windows}")
        first = ctx // 2
        lp = log_softmax(logits[first - 1 : -1])  # predictions of tokens first..ctx-1
        targets = np.asarray(tokens[first:])
        nll -= float(lp[np.arange(len(targets)), targets].sum())
        scored += len(targets)
    seconds = time.perf_counter() - t0
    mean = nll / scored
    return Perplexity(math.exp(mean), mean, scored, n_windows * ctx, seconds)


def window_logits(llm: LLM, tokens: list[int], cache, stepwise: bool) -> np.ndarray:
    """The logits at every position of one window: one batched pass, or decode steps."""
    if not stepwise:
        return llm.logits(tokens, cache)
    return np.stack([llm.step(t, cache) for t in tokens])
