"""Continuous batching: one thread owns the model and steps every running sequence together.

Each turn of the loop takes the requests that arrived, gives each a free slot (a KV cache
kept from one request to the next), prefills one chunk of the oldest unfinished prompt,
then runs one decode step of every sequence that has a token to feed (Transformer.step_batch;
one sequence alone: the decode step `generate` runs). A sequence that ends (EOS, a stop
string, its max_tokens, its context) or is cancelled leaves at once and frees its slot.
Each sequence samples with its own sampler, so it gets the tokens it gets alone.

The HTTP side never touches the model: it submits `Job`s and reads their events, which
the engine hands over through each job's `emit` callback (thread-safe, called from here).
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from llama_np.api import LLM
from llama_np.errors import LlamaNpError
from llama_np.generation.batch import SequenceState
from llama_np.generation.chat import common_prefix
from llama_np.generation.generate import check_logits
from llama_np.generation.sampling import Sampler, SamplerSettings
from llama_np.model.kvcache import KVCache

WARM = 4  # batch sizes warm_up runs: quant.compiled.fewlayers compiles each up to FEW


class QueueFull(LlamaNpError):
    """Every slot is busy and the queue holds as many requests as it may."""


@dataclass(frozen=True)
class Event:
    """What a job's `emit` receives: a piece of text, then one "done" (or "error")."""

    kind: str  # "text", "done" or "error"
    text: str = ""
    reason: str = ""  # done: "eos", "stop", "length", "context" or "cancelled"
    completion_tokens: int = 0


@dataclass(eq=False)
class Job:
    """One sequence to generate: a prompt (token ids) and how to sample and stop."""

    prompt: list[int]
    sampling: SamplerSettings
    max_tokens: int
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    emit: Callable[[Event], None] = lambda e: None
    cancelled: bool = False  # set from any thread: the engine drops the job at its next turn
    submitted: float = field(default_factory=time.perf_counter)

    def cancel(self) -> None:
        self.cancelled = True


class Seq:
    """A job holding a slot: its cache, what of its prompt is prefilled, what it sent."""

    def __init__(self, job: Job, slot: int, cache: KVCache, llm: LLM) -> None:
        self.job, self.slot, self.cache = job, slot, cache
        sampler = Sampler(job.sampling)
        self.run = SequenceState(llm.tokenizer, job.prompt, cache, sampler, job.stop)
        self.done_prompt = 0  # prompt tokens in the cache
        self.next: int | None = None  # the token the next decode step feeds
        self.sent = 0  # characters of run.text emitted so far

    @property
    def prefilling(self) -> bool:
        return self.done_prompt < len(self.job.prompt)

    def take(self, logits: np.ndarray, eos: set[int]) -> bool:
        """Sample from `logits`, emit the new text; False when the sequence has ended."""
        self.next = self.run.take(logits, set() if self.job.ignore_eos else eos,
                                  self.job.max_tokens)  # fmt: skip
        if len(self.run.text) > self.sent:
            self.job.emit(Event("text", self.run.text[self.sent :]))
            self.sent = len(self.run.text)
        if self.next is None:
            self.job.emit(Event("done", reason=self.run.reason,
                                completion_tokens=len(self.run.tokens)))  # fmt: skip
        return self.next is not None


@dataclass
class Counters:
    """What the engine did since it started (GET /metrics)."""

    requests: int = 0  # jobs admitted
    finished: dict[str, int] = field(default_factory=dict)  # by reason
    prompt_tokens: int = 0  # prefilled
    prompt_cached: int = 0  # kept from a slot's cache (cache_prompt), not prefilled
    generated: int = 0
    prefill_s: float = 0.0
    steps: dict[int, list[float]] = field(default_factory=dict)  # B -> [n, s, bytes, pos]
    running: int = 0
    waiting: int = 0

    def step(self, batch: int, seconds: float, nbytes: int, pos: float) -> None:
        s = self.steps.setdefault(batch, [0, 0.0, 0, 0.0])
        s[0] += 1
        s[1] += seconds
        s[2] += nbytes
        s[3] += pos


class Engine:
    """The model behind a server: `submit` jobs from any thread; `start`, `stop`."""

    def __init__(self, llm: LLM, slots: int, ctx: int, kv: str = "f32", window: int | None = None,
                 chunk: int = 512, max_queue: int = 64,
                 cache_prompt: bool = True) -> None:  # fmt: skip
        """`slots` sequences of `ctx` positions each (`window`: a sliding window) run
        together; `chunk` prompt tokens are prefilled between two decode steps; beyond
        `max_queue` waiting requests, `submit` refuses. `cache_prompt`: a new request
        keeps what its slot's cache holds of its prompt's beginning (the tokens the slot's
        last sequence read) and prefills only the rest, in the free slot holding the most
        of it (llama-server's cache_prompt; not where a recurrent state or a ring that
        wrapped cannot rewind)."""
        self.llm, self.slots, self.ctx, self.kv, self.window = llm, slots, ctx, kv, window
        self.chunk, self.max_queue, self.cache_prompt = chunk, max_queue, cache_prompt
        self.caches: list[KVCache | None] = [None] * slots  # made on first use, then kept
        self.held: list[list[int]] = [[] for _ in range(slots)]  # the tokens each cache holds
        self.released = [-1] * slots  # when each slot was last freed (count of releases)
        self.free = list(range(slots))[::-1]
        self.inbox: queue.SimpleQueue[Job] = queue.SimpleQueue()
        self.waiting: deque[Job] = deque()
        self.seqs: list[Seq] = []  # holding a slot, in the order they arrived
        self.counters = Counters()
        self.eos = set(llm.tokenizer.eos_ids) | set(llm.config.eos_ids)
        self._wake = threading.Event()
        self._stopping = False
        self._pending = 0  # submitted, not yet holding a slot (inbox + waiting)
        self._lock = threading.Lock()
        self.thread: threading.Thread | None = None

    def warm_up(self) -> None:
        """Run a batched decode step of each size up to `slots` (at most WARM) once on
        scratch caches, before the first request: the compiled backend compiles its one-call
        step for each count of a few sequences (or loads it from the disk cache)."""
        self.llm.model.warm_up(self.kv, range(2, min(self.slots, WARM) + 1))

    def start(self) -> Engine:
        """Run the loop on a thread of its own. (`llama-np serve` runs it on the main thread
        instead: libgomp's threads spin between parallel loops only while the process has
        no more OpenMP threads than cores, and a second thread calling the kernels brings a
        second team: measured, a batched step of SmolLM2 took twice as long.)"""
        self.thread = threading.Thread(target=self.run, name="llama-np-engine", daemon=True)
        self.thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Cancel whatever is queued or running and end the loop (from any thread)."""
        self._stopping = True
        self._wake.set()
        if self.thread is not None and self.thread is not threading.current_thread():
            self.thread.join(timeout)

    def submit(self, job: Job) -> None:
        """Queue a job (QueueFull when `max_queue` jobs already wait for a slot)."""
        with self._lock:
            if self._stopping:
                raise QueueFull("the server is shutting down")
            if self._pending >= self.max_queue + max(0, len(self.free)):
                raise QueueFull(f"{self.slots} sequences run and {self.max_queue} wait")
            self._pending += 1
        self.inbox.put(job)
        self._wake.set()

    def run(self) -> None:
        """The loop, on the calling thread, until `stop`."""
        while True:
            self._admit()
            if self._stopping:
                self._cancel_all()
                return
            if not self.seqs:
                self._wake.wait()
                self._wake.clear()
                continue
            self._prefill_chunk()
            self._decode_step()

    def _admit(self) -> None:
        """New jobs into the queue, cancelled ones out, the oldest into free slots."""
        while True:
            try:
                self.waiting.append(self.inbox.get_nowait())
            except queue.Empty:
                break
        for s in [s for s in self.seqs if s.job.cancelled]:
            self._leave(s, "cancelled")
        kept = deque(j for j in self.waiting if not j.cancelled)
        for j in self.waiting:
            if j.cancelled:
                j.emit(Event("done", reason="cancelled"))
                self._dequeued()
        self.waiting = kept
        while self.waiting and self.free and not self._stopping:
            job = self.waiting.popleft()
            slot = self._slot_for(job.prompt)
            self._dequeued()
            cache, kept = self._cache(slot, job.prompt)
            seq = Seq(job, slot, cache, self.llm)
            seq.done_prompt = kept
            self.seqs.append(seq)
            self.counters.requests += 1
            self.counters.prompt_cached += kept
        self.counters.running, self.counters.waiting = len(self.seqs), len(self.waiting)

    def _dequeued(self) -> None:
        with self._lock:
            self._pending -= 1

    def _slot_for(self, prompt: list[int]) -> int:
        """A free slot, taken: the one whose cache holds the most of the prompt's beginning
        (with cache_prompt), among those the least recently used (a cache of no use to
        this prompt may be of use to a later one)."""
        slot = self.free[-1]
        if self.cache_prompt:
            slot = max(self.free, key=lambda s: (common_prefix(self.held[s], prompt),
                                                 -self.released[s]))  # fmt: skip
        self.free.remove(slot)
        return slot

    def _cache(self, slot: int, prompt: list[int]) -> tuple[KVCache, int]:
        """The slot's cache for a new sequence, and how many of the prompt's tokens it
        already holds: their positions kept (with cache_prompt; the last prompt token is
        always run again, for its logits), the rest forgotten (its arrays are reused: a
        new sequence overwrites every position before it reads it)."""
        cache = self.caches[slot]
        if cache is None:
            cache = self.caches[slot] = self.llm.new_cache(self.ctx, self.window, self.kv)
        keep = min(common_prefix(self.held[slot], prompt), len(prompt) - 1)
        self.held[slot] = []
        if self.cache_prompt and keep > 0 and cache.truncate(keep):
            return cache, keep
        cache.reset()
        return cache, 0

    def _prefill_chunk(self) -> None:
        """Up to `chunk` tokens of the oldest prompt not yet in its cache; the prompt's
        last chunk gives the logits its first token is sampled from."""
        s = next((s for s in self.seqs if s.prefilling), None)
        if s is None:
            return
        piece = s.job.prompt[s.done_prompt : s.done_prompt + self.chunk]
        t0 = time.perf_counter()
        try:
            logits = self.llm.model.forward(np.asarray(piece), s.cache)
            if s.done_prompt + len(piece) == len(s.job.prompt):
                check_logits(logits, f"a prompt ({len(s.job.prompt)} tokens)")
        except Exception as e:  # a failure ends the sequences it touched, not the server
            return self._fail([s], e)
        self.counters.prefill_s += time.perf_counter() - t0
        self.counters.prompt_tokens += len(piece)
        s.done_prompt += len(piece)
        if not s.prefilling:
            self._take(s, logits)

    def _decode_step(self) -> None:
        """One step of every sequence that has a token to feed."""
        ready = [s for s in self.seqs if not s.prefilling and s.next is not None]
        if not ready:
            return
        model, caches = self.llm.model, [s.cache for s in ready]
        pos = sum(c.pos for c in caches) / len(caches)
        t0 = time.perf_counter()
        try:
            if len(ready) == 1:  # the decode step `generate` runs (one call for all blocks)
                logits = model.forward(np.asarray([ready[0].next]), caches[0])[None]
            else:
                logits = model.step_batch(np.array([s.next for s in ready]), caches)
            check_logits(logits, "a decode step")
        except Exception as e:
            return self._fail(ready, e)
        seconds = time.perf_counter() - t0
        self.counters.step(len(ready), seconds, model.meter.last.bytes_read, pos)
        for s, row in zip(ready, logits, strict=True):
            self._take(s, row)

    def _take(self, s: Seq, logits: np.ndarray) -> None:
        if not s.take(logits, self.eos):
            self._leave(s, s.run.reason, emitted=True)

    def _leave(self, s: Seq, reason: str, emitted: bool = False) -> None:
        """The sequence is over: its slot is free for the next job at once."""
        self.seqs.remove(s)
        self.free.append(s.slot)
        self.released[s.slot] = max(self.released) + 1
        if reason != "error":  # (a failed step may have left its cache half written)
            self.held[s.slot] = (list(s.job.prompt) + list(s.run.tokens))[: s.cache.pos]
        self.counters.generated += len(s.run.tokens)
        self.counters.finished[reason] = self.counters.finished.get(reason, 0) + 1
        if not emitted:
            s.job.emit(Event("done", reason=reason, completion_tokens=len(s.run.tokens)))
        self.counters.running = len(self.seqs)

    def _fail(self, seqs: list[Seq], e: Exception) -> None:
        """Each of `seqs` gets the error and leaves; the others go on."""
        message = str(e) if isinstance(e, LlamaNpError) else f"{type(e).__name__}: {e}"
        for s in seqs:
            s.job.emit(Event("error", text=message))
            self._leave(s, "error", emitted=True)

    def _cancel_all(self) -> None:
        for s in list(self.seqs):
            self._leave(s, "cancelled")
        for j in self.waiting:
            j.emit(Event("done", reason="cancelled"))
        self.waiting.clear()
