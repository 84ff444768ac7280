"""Several sequences generated together: each prompt prefilled on its own (or one prompt
prefilled once and its cache copied, for N completions of it), then one decode step of
every unfinished sequence at a time (Transformer.step_batch), so each weight matrix is
read once per step for all of them. A sequence that stops (EOS, a stop string, -n, its
context) leaves the batch; the others go on. Each sequence samples with its own sampler,
so it gives the text it would give alone with the same settings."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from llama_np.errors import UsageError
from llama_np.generation.generate import StopStrings, check_fits, check_logits
from llama_np.generation.sampling import Sampler
from llama_np.io.tokenizer import StreamDecoder, Tokenizer
from llama_np.model.kvcache import KVCache
from llama_np.model.transformer import Transformer


@dataclass
class BatchStats:
    """What a batched generation did, for the summary line."""

    sequences: int = 0
    prompt_tokens: int = 0  # prefilled (a shared prompt once)
    prefill_s: float = 0.0
    steps: int = 0  # batched decode steps
    decode_s: float = 0.0
    generated: int = 0  # tokens, all sequences
    decoded: int = 0  # tokens the decode steps fed, all sequences
    stop_reasons: list[str] = field(default_factory=list)

    @property
    def ms_per_step(self) -> float:
        return 1e3 * self.decode_s / self.steps if self.steps else float("nan")

    @property
    def tok_s(self) -> float:
        """Decode throughput, all sequences together."""
        return self.decoded / self.decode_s if self.decode_s else float("nan")


class SequenceState:
    """One sequence of the batch: its cache, sampler and text so far."""

    def __init__(self, tokenizer: Tokenizer, prompt: list[int], cache: KVCache,
                 sampler: Sampler, stop: Sequence[str]) -> None:  # fmt: skip
        self.cache, self.sampler = cache, sampler
        self.decoder, self.stops = StreamDecoder(tokenizer, prompt), StopStrings(stop)
        self.tokens: list[int] = []
        self.text, self.reason = "", ""
        for t in prompt:
            sampler.accept(t)

    def take(self, logits: np.ndarray, eos: set[int], n_predict: int) -> int | None:
        """Sample the next token; None when the sequence is done (its reason set)."""
        token = self.sampler(logits)
        if token in eos:
            return self.finish("eos")
        self.tokens.append(token)
        self.sampler.accept(token)
        self.text += self.stops.feed(self.decoder.push(token))
        if self.stops.hit:
            return self.finish("stop")
        if len(self.tokens) >= n_predict:
            return self.finish("length")
        if self.cache.room() == 0:
            return self.finish("context")
        return token

    def finish(self, reason: str) -> None:
        """As `generate` ends: after a stop string nothing more; otherwise the decoder's
        held-back bytes, which may themselves complete a stop string."""
        self.reason = reason
        if reason != "stop":
            tail = self.stops.feed(self.decoder.flush())
            if self.stops.hit:
                self.reason = "stop"
            self.text += tail if self.stops.hit else tail + self.stops.flush()
        return None


def generate_batch(
    model: Transformer,
    tokenizer: Tokenizer,
    prompts: list[list[int]],
    caches: list[KVCache],
    samplers: list[Sampler],
    n_predict: int,
    stop: Sequence[str] = (),
    stats: BatchStats | None = None,
    shared_prompt: bool = False,
) -> list[str]:
    """The text generated after each prompt. `shared_prompt`: every prompt is the same;
    it is prefilled once into caches[0], which is then copied to the others."""
    stats = stats if stats is not None else BatchStats()
    if not prompts or any(not p for p in prompts):
        raise UsageError("every prompt needs at least one token")
    if n_predict < 1:
        raise UsageError(f"-n/--n-predict must be at least 1, got {n_predict}")
    stats.sequences = len(prompts)
    model.warm_up(caches[0].fmt, range(1, len(prompts) + 1))  # nothing timed compiles
    t0 = time.perf_counter()
    logits = prefill(model, prompts, caches, shared_prompt, stats)
    stats.prefill_s = time.perf_counter() - t0
    seqs = [SequenceState(tokenizer, p, c, s, stop) for p, c, s in zip(prompts, caches, samplers,
                                                                   strict=True)]  # fmt: skip
    eos = set(tokenizer.eos_ids) | set(model.config.eos_ids)
    active = list(range(len(seqs)))
    while active:
        nxt = [(i, seqs[i].take(logits[k], eos, n_predict)) for k, i in enumerate(active)]
        active = [i for i, t in nxt if t is not None]
        if not active:
            break
        tokens = np.array([t for _, t in nxt if t is not None])
        t0 = time.perf_counter()
        logits = model.step_batch(tokens, [seqs[i].cache for i in active])
        stats.decode_s += time.perf_counter() - t0
        stats.steps += 1
        stats.decoded += len(active)
        check_logits(logits, f"batched decode step {stats.steps}")
    stats.generated = sum(len(s.tokens) for s in seqs)
    stats.stop_reasons = [s.reason for s in seqs]
    return [s.text for s in seqs]


def prefill(model: Transformer, prompts: list[list[int]], caches: list[KVCache],
            shared: bool, stats: BatchStats) -> np.ndarray:  # fmt: skip
    """Each prompt into its cache (a shared one once, then copied): logits (B, vocab)."""
    for p, c in zip(prompts, caches, strict=True):
        check_fits(c, len(p))
    if shared:
        first = model.forward(np.asarray(prompts[0]), caches[0])
        check_logits(first, f"the prompt ({len(prompts[0])} tokens)")
        for i in range(1, len(caches)):
            caches[i] = caches[0].copy()
        stats.prompt_tokens = len(prompts[0])
        return np.repeat(first[None], len(caches), axis=0)
    out = []
    for i, (p, c) in enumerate(zip(prompts, caches, strict=True)):
        logits = model.forward(np.asarray(p), c)
        check_logits(logits, f"prompt {i + 1} ({len(p)} tokens)")
        out.append(logits)
        stats.prompt_tokens += len(p)
    return np.stack(out)
