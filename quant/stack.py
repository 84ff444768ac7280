"""Matrices used on the same input, stacked by rows into one: the model multiplies q, k and
v (and gate and up) in a single kernel call, over one contiguous stream of memory."""

from __future__ import annotations

import numpy as np

from .base import Matrix, Weight


def stacked(weights: list[Weight]) -> Matrix:
    """One matrix holding `weights`' rows in order: a new matrix of their common format;
    or a StackedWeight that leaves each part where it is, when the formats differ (a GGUF
    may keep v in higher precision: a stored tensor is never quantized again) or when the
    parts are memory-mapped from a checkpoint (copying them would hold them twice)."""
    first = type(weights[0])
    mapped = any(not a.flags.writeable for w in weights for a in w.arrays().values())
    if all(type(w) is first for w in weights) and not mapped:
        return first.concat_rows(weights)
    return StackedWeight(weights)


class StackedWeight(Matrix):
    """Parts of different formats behind one matrix interface; rows are cut where the
    parts allow."""

    def __init__(self, parts: list[Weight]) -> None:
        self.fmt = "+".join(p.fmt for p in parts)
        super().__init__((sum(p.shape[0] for p in parts), parts[0].shape[1]))
        self.parts = parts
        self.starts = [0]
        for p in parts:
            self.starts.append(self.starts[-1] + p.shape[0])

    def arrays(self) -> dict[str, np.ndarray]:
        return {f"{i}.{k}": a for i, p in enumerate(self.parts) for k, a in p.arrays().items()}

    def leaves(self) -> list[Weight]:
        return list(self.parts)

    def slice_rows(self, r0: int, r1: int) -> Weight:
        for p, a, b in zip(self.parts, self.starts, self.starts[1:], strict=True):
            if a <= r0 and r1 <= b:
                return p.slice_rows(r0 - a, r1 - a)
        raise ValueError(f"rows {r0}:{r1} cross the parts of a stacked matrix")

    def dequantize(self, r0: int = 0, r1: int | None = None) -> np.ndarray:
        full = np.concatenate([p.dequantize() for p in self.parts])
        return full[r0:r1]

    def matvec(self, x: np.ndarray) -> np.ndarray:
        return np.concatenate([p.matvec(x) for p in self.parts])

    def matmul(self, x: np.ndarray) -> np.ndarray:
        return np.concatenate([p.matmul(x) for p in self.parts], axis=1)
