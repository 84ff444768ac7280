"""The byte meter: what each forward step really read and wrote, per category.

The model calls `read(category, nbytes)` where it calls a kernel, with the `nbytes` of the
arrays that kernel touches (DESIGN.md sections 1-2). Nothing here knows a formula for
them: the speed-of-light model (`bench.sol`) computes the same totals from a config, and
the tests hold the two against each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field

CATEGORIES = ("attn_weights", "mlp_weights", "lm_head", "embedding", "norms", "kv_cache")


@dataclass
class Step:
    """One forward call: `n_tokens` tokens starting at position `pos`."""

    kind: str  # "prefill" or "decode"
    pos: int
    n_tokens: int
    reads: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CATEGORIES, 0))
    writes: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CATEGORIES, 0))

    @property
    def bytes_read(self) -> int:
        return sum(self.reads.values())

    @property
    def bytes_written(self) -> int:
        return sum(self.writes.values())


class Meter:
    """Counts bytes per step; cheap enough (a dict update per kernel call) to stay on."""

    def __init__(self) -> None:
        self.last: Step | None = None  # the step most recently finished
        self._step: Step | None = None
        self.decode_steps = 0
        self.decode_bytes_read = 0

    def begin(self, kind: str, pos: int, n_tokens: int) -> None:
        self._step = Step(kind, pos, n_tokens)

    def read(self, category: str, nbytes: int) -> None:
        self._step.reads[category] += nbytes

    def write(self, category: str, nbytes: int) -> None:
        self._step.writes[category] += nbytes

    def end(self) -> Step:
        step, self._step = self._step, None
        self.last = step
        if step.kind == "decode":
            self.decode_steps += 1
            self.decode_bytes_read += step.bytes_read
        return step
