"""The byte meter: what each forward step really read and wrote, per category.

The model calls `read(category, nbytes)` where it calls a kernel, with the `nbytes` of the
arrays that kernel touches (docs/architecture.md, "Byte accounting"). Nothing here knows a
formula for them: the speed-of-light model (`bench.sol`) computes the same totals from a
config, and the tests hold the two against each other.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

# What a step reads, by category (the names reports and JSON use):
ATTN = "attn_weights"  # the token mixer's weights: attention's, or a recurrent mixer's
# matrices and its own float32 vectors
MLP = "mlp_weights"  # the MLP's (a mixture of experts': the router and the experts read)
HEAD = "lm_head"
EMBEDDING = "embedding"  # the rows of the tokens' embeddings
NORMS = "norms"
KV = "kv_cache"  # the attention layers' keys and values attended (appends: writes)
STATE = "state"  # a recurrent layer's state, read and written whole every step
CATEGORIES = (ATTN, MLP, HEAD, EMBEDDING, NORMS, KV, STATE)
# time that reads nothing: threads idle at a one-call step's barriers (profile only)
WAITS = "waits"


@dataclass
class Step:
    """One forward call: `n_tokens` tokens starting at position `pos`."""

    kind: str  # "prefill" or "decode"
    pos: int  # of the first token (in a batch: the lowest position)
    n_tokens: int
    sequences: int = 1  # a batched decode step: one token of each of n_tokens sequences
    reads: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CATEGORIES, 0))
    writes: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CATEGORIES, 0))
    seconds: dict[str, float] = field(
        default_factory=lambda: dict.fromkeys((*CATEGORIES, WAITS), 0.0)
    )
    wall: float = 0.0  # seconds from begin to end
    experts: list[int] = field(default_factory=list)  # a mixture of experts: the distinct
    # experts each layer read, in layer order (every token's k, the batch's union)

    @property
    def bytes_read(self) -> int:
        return sum(self.reads.values())


class Meter:
    """Counts bytes per step; cheap enough (a dict update per kernel call) to stay on.
    With `profile` set, the model also reports the seconds each category's kernels take
    (`lap`); whatever a step spends outside them is Python, dispatch and glue."""

    def __init__(self) -> None:
        self.profile = False
        self.last: Step | None = None  # the step most recently finished
        self._step: Step | None = None
        self._t0 = 0.0
        self.decode_steps = 0
        self.decode_bytes_read = 0

    def begin(self, kind: str, pos: int, n_tokens: int, sequences: int = 1) -> None:
        self._step = Step(kind, pos, n_tokens, sequences)
        self._t0 = time.perf_counter()

    def read(self, category: str, nbytes: int) -> None:
        self._step.reads[category] += nbytes

    def write(self, category: str, nbytes: int) -> None:
        self._step.writes[category] += nbytes

    def experts(self, n: int) -> None:
        """A mixture-of-experts layer read n distinct experts in this step."""
        self._step.experts.append(n)

    def lap(self, category: str, t0: float) -> None:
        """Add the time since t0 (a time.perf_counter() value) to `category`."""
        self._step.seconds[category] += time.perf_counter() - t0

    def spent(self, category: str, seconds: float) -> None:
        """Add `seconds` to `category` (a one-call step's phases, timed inside it)."""
        self._step.seconds[category] += seconds

    def end(self) -> Step:
        step, self._step = self._step, None
        step.wall = time.perf_counter() - self._t0
        self.last = step
        if step.kind == "decode":
            self.decode_steps += 1
            self.decode_bytes_read += step.bytes_read
        return step
