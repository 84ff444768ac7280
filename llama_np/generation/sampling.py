"""Choosing the next token from logits, in llama.cpp's order: repetition penalty, top-k,
top-p, min-p, temperature, then a draw (or argmax when the temperature is 0)."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import numpy as np

from llama_np.errors import UsageError


@dataclass(frozen=True)
class SamplerSettings:
    temp: float = 0.8  # 0 means greedy
    top_k: int = 40  # 0 disables
    top_p: float = 0.95  # 1.0 disables
    min_p: float = 0.05  # 0.0 disables
    repeat_penalty: float = 1.0  # 1.0 disables
    repeat_last_n: int = 64  # how many recent tokens the penalty looks at
    seed: int | None = None  # None draws a fresh seed

    def __post_init__(self) -> None:
        checks = [
            (self.temp >= 0, f"--temp must be >= 0, got {self.temp}"),
            (self.top_k >= 0, f"--top-k must be >= 0, got {self.top_k}"),
            (0 < self.top_p <= 1, f"--top-p must be in (0, 1], got {self.top_p}"),
            (0 <= self.min_p <= 1, f"--min-p must be in [0, 1], got {self.min_p}"),
            (self.repeat_penalty > 0, f"--repeat-penalty must be > 0, got {self.repeat_penalty}"),
            (self.repeat_last_n >= 0, f"--repeat-last-n must be >= 0, got {self.repeat_last_n}"),
        ]
        for name in ("temp", "top_p", "min_p", "repeat_penalty"):
            if not math.isfinite(getattr(self, name)):
                raise UsageError(f"--{name.replace('_', '-')} must be a finite number")
        for ok, message in checks:
            if not ok:
                raise UsageError(message)


class Sampler:
    def __init__(self, settings: SamplerSettings) -> None:
        self.s = settings
        seed = settings.seed
        self.seed = seed if seed is not None else int(np.random.SeedSequence().entropy % 2**32)
        self.rng = np.random.default_rng(self.seed)
        self.recent: deque[int] = deque(maxlen=max(settings.repeat_last_n, 1))

    def accept(self, token: int) -> None:
        """Remember a token of the context (prompt or generated) for the penalty."""
        if self.s.repeat_last_n:
            self.recent.append(token)

    def __call__(self, logits: np.ndarray) -> int:
        s = self.s
        logits = logits.astype(np.float32, copy=True)
        if s.repeat_penalty != 1.0 and self.recent:
            ids = np.fromiter(set(self.recent), dtype=np.int64)
            seen = logits[ids]
            logits[ids] = np.where(seen > 0, seen / s.repeat_penalty, seen * s.repeat_penalty)
        if s.temp == 0:
            return int(np.argmax(logits))
        ids, kept = candidates(logits, s.top_k, s.top_p, s.min_p)
        probs = softmax64(kept / s.temp)
        return int(ids[self.rng.choice(len(ids), p=probs)])


def softmax64(x: np.ndarray) -> np.ndarray:
    """Probabilities for the draw, in float64 so they sum to 1 as rng.choice requires."""
    e = np.exp(x.astype(np.float64) - np.max(x))
    return e / e.sum()


def candidates(
    logits: np.ndarray, top_k: int, top_p: float, min_p: float
) -> tuple[np.ndarray, np.ndarray]:
    """Token ids that survive top-k, top-p and min-p, best first, with their logits."""
    n = len(logits)
    k = min(top_k, n) if top_k > 0 else n
    ids = np.argpartition(-logits, k - 1)[:k] if k < n else np.arange(n)
    ids = ids[np.argsort(-logits[ids], kind="stable")]
    kept = logits[ids]
    probs = softmax64(kept)
    if top_p < 1.0:
        # the smallest prefix whose mass reaches top_p (always at least one token)
        cut = int(np.searchsorted(np.cumsum(probs), top_p)) + 1
        ids, kept, probs = ids[:cut], kept[:cut], probs[:cut]
    if min_p > 0.0:
        keep = probs >= min_p * probs[0]
        ids, kept = ids[keep], kept[keep]
    return ids, kept
