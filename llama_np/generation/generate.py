"""The generation loop: prefill the prompt in one batch, then sample and decode token by
token, streaming text that is safe to print and stopping at EOS, a stop string or -n."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from llama_np.errors import LlamaNpError, UsageError
from llama_np.generation.sampling import Sampler
from llama_np.io.tokenizer import StreamDecoder, Tokenizer
from llama_np.model.kvcache import KVCache
from llama_np.model.transformer import Transformer


@dataclass
class Stats:
    """What one generation did, for the summary line and for scripts."""

    prompt_tokens: int = 0
    generated: list[int] = field(default_factory=list)
    prefill_s: float = 0.0
    decode_s: float = 0.0  # forward time of the decode steps
    decode_steps: int = 0
    decode_bytes: int = 0  # bytes the decode steps read, from the meter
    stop_reason: str = ""  # "eos", "stop", "length" or "context"
    seed: int | None = None

    @property
    def prefill_tok_s(self) -> float:
        return self.prompt_tokens / self.prefill_s if self.prefill_s else float("nan")

    @property
    def decode_ms(self) -> float:
        return 1e3 * self.decode_s / self.decode_steps if self.decode_steps else float("nan")

    @property
    def bytes_per_token(self) -> float:
        return self.decode_bytes / self.decode_steps if self.decode_steps else float("nan")

    @property
    def gbs(self) -> float:
        return self.decode_bytes / self.decode_s / 1e9 if self.decode_s else float("nan")


class StopStrings:
    """Holds back text that might be the start of a stop string until it is decided."""

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = [s for s in stops if s]
        self.pending = ""
        self.hit = False

    def feed(self, text: str) -> str:
        self.pending += text
        for s in self.stops:
            i = self.pending.find(s)
            if i >= 0:
                self.hit, out, self.pending = True, self.pending[:i], ""
                return out
        hold = max((self._overlap(s) for s in self.stops), default=0)
        out = self.pending[: len(self.pending) - hold]
        self.pending = self.pending[len(out) :]
        return out

    def _overlap(self, stop: str) -> int:
        """Length of the longest suffix of the pending text that begins `stop`."""
        for n in range(min(len(stop) - 1, len(self.pending)), 0, -1):
            if self.pending.endswith(stop[:n]):
                return n
        return 0

    def flush(self) -> str:
        out, self.pending = self.pending, ""
        return out


def check_logits(logits: np.ndarray, step: str) -> None:
    """Stop with one line, never sample from NaN: a non-finite weight, scale or KV entry
    turns every logit after it into NaN. ~15 us on 49,152 logits, 36 us on 151,936 (0.2%
    of a token of SmolLM2 or Qwen2.5-Coder)."""
    if not np.isfinite(logits).all():
        raise LlamaNpError(
            f"the logits of {step} hold NaN or infinity: a weight, a block scale or the KV "
            "cache is not finite (--check-tensors checks every tensor at load)"
        )


def check_fits(cache: KVCache, n_new: int) -> None:
    room = cache.room()
    if room is not None and n_new > room:
        raise UsageError(
            f"the prompt has {n_new} tokens but only {room} of the context size "
            f"{cache.capacity} are left; raise -c/--ctx-size or set --window"
        )


def generate(
    model: Transformer,
    tokenizer: Tokenizer,
    prompt: Sequence[int],
    cache: KVCache,
    sampler: Sampler,
    n_predict: int,
    stop: Sequence[str] = (),
    stats: Stats | None = None,
) -> Iterator[str]:
    """Stream the text that follows `prompt` (ids appended to whatever `cache` holds).
    `stats` is filled in as it goes; the last sampled token is not fed to the model."""
    stats = stats if stats is not None else Stats()
    stats.seed = sampler.seed
    if not prompt:
        raise UsageError("the prompt is empty")
    if n_predict < 1:
        raise UsageError(f"-n/--n-predict must be at least 1, got {n_predict}")
    check_fits(cache, len(prompt))
    for t in prompt:
        sampler.accept(t)
    model.warm_up(cache.fmt)  # nothing timed compiles (done at load for an f32 cache)
    t0 = time.perf_counter()
    logits = model.forward(np.asarray(prompt), cache)
    stats.prefill_s, stats.prompt_tokens = time.perf_counter() - t0, len(prompt)
    check_logits(logits, f"the prompt ({len(prompt)} tokens)")
    decoder, stops = StreamDecoder(tokenizer, list(prompt)), StopStrings(stop)
    eos = set(tokenizer.eos_ids) | set(model.config.eos_ids)
    while True:
        token = sampler(logits)
        if token in eos:
            stats.stop_reason = "eos"
            break
        stats.generated.append(token)
        sampler.accept(token)
        text = stops.feed(decoder.push(token))
        if text:
            yield text
        if stops.hit:
            stats.stop_reason = "stop"
            return
        if len(stats.generated) >= n_predict:
            stats.stop_reason = "length"
            break
        if cache.room() == 0:
            stats.stop_reason = "context"
            break
        t0 = time.perf_counter()
        logits = model.forward(np.asarray([token]), cache)
        stats.decode_s += time.perf_counter() - t0
        stats.decode_steps += 1
        stats.decode_bytes += model.meter.last.bytes_read
        check_logits(logits, f"decode step {stats.decode_steps} (position {cache.pos - 1})")
    tail = stops.feed(decoder.flush())
    if stops.hit:
        stats.stop_reason = "stop"
    else:
        tail += stops.flush()
    if tail:
        yield tail
