"""The one interface every weight format offers the model.

A `Weight` is a 2-D matrix of shape (rows, cols) = (out_features, in_features), as in
PyTorch's `nn.Linear`, stored in some format. The model only ever calls `matvec`,
`matmul`, `rows` and reads `nbytes`; it never asks which format it holds.
"""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from typing import ClassVar, Self

import numpy as np

from . import parallel
from .errors import QuantError


class Weight(ABC):
    fmt: ClassVar[str]  # the name users type: "f32", "q8_0", ...
    bits_per_weight: ClassVar[float]  # at rest, scales included: what the format promises
    fused: ClassVar[bool] = False  # a compiled kernel with prologue and epilogue (quant.compiled)

    def __init__(self, shape: tuple[int, int]) -> None:
        rows, cols = shape
        if rows < 1 or cols < 1:
            raise QuantError(f"{self.fmt}: a weight matrix needs a positive shape, got {shape}")
        self.shape = (int(rows), int(cols))

    # --- storage -------------------------------------------------------------------------
    @abstractmethod
    def arrays(self) -> dict[str, np.ndarray]:
        """The arrays that hold the matrix: what `nbytes` counts and what a checkpoint saves."""

    def leaves(self) -> list[Weight]:
        """The matrices in their own formats that make up this one: itself, or the parts
        of a stack."""
        return [self]

    @abstractmethod
    def rebind(self, arrays: dict[str, np.ndarray]) -> None:
        """Use these arrays (same keys, shapes, dtypes and values as some of `arrays()`)
        instead of the current ones: how the arena moves a matrix in memory."""

    @functools.cached_property
    def nbytes(self) -> int:
        """Bytes the matrix really occupies in memory; a decode step reads all of them.
        Summed once from the arrays (the meter asks on every kernel call; a matrix's
        arrays may move, never change size)."""
        return sum(a.nbytes for a in self.arrays().values())

    @classmethod
    @abstractmethod
    def nbytes_for(cls, shape: tuple[int, int]) -> int:
        """Bytes a (rows, cols) matrix occupies in memory in this format, from the shape
        alone: what the speed-of-light model uses, and what `nbytes` must equal."""

    @property
    def row_nbytes(self) -> int:
        """Bytes an embedding lookup of one row reads: the row, or, in a layout that
        interleaves rows, the cache lines it shares with its neighbours."""
        return type(self).nbytes_for((1, self.shape[1]))

    def export(self) -> dict[str, np.ndarray]:
        """The arrays to save at rest, which `from_arrays` reads back. The in-memory layout
        may differ (see BlockWeight)."""
        return self.arrays()

    @classmethod
    @abstractmethod
    def from_arrays(cls, shape: tuple[int, int], arrays: dict[str, np.ndarray]) -> Self:
        """Rebuild from `arrays()` (as saved by `llama-np quantize`), without copying."""

    @classmethod
    def concat_rows(cls, weights: list[Weight]) -> Self:
        """One matrix of these matrices' rows, in order (all of this format, same cols).
        Works on the canonical arrays, which every format stores row by row."""
        parts = [w.export() for w in weights]
        rows = sum(w.shape[0] for w in weights)
        merged = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
        return cls.from_arrays((rows, weights[0].shape[1]), merged)

    def slice_rows(self, r0: int, r1: int) -> Weight:
        """Rows r0:r1 as a matrix of their own (a copy)."""
        parts = {k: np.array(v[r0:r1]) for k, v in self.export().items()}
        return type(self).from_arrays((r1 - r0, self.shape[1]), parts)

    @classmethod
    @abstractmethod
    def from_float(cls, w: np.ndarray) -> Self:
        """Store a float matrix in this format (quantize it)."""

    # --- compute -------------------------------------------------------------------------
    @abstractmethod
    def dequantize(self, r0: int = 0, r1: int | None = None) -> np.ndarray:
        """Rows r0:r1 as float32, shape (r1 - r0, cols). For tests, conversion and lookups:
        the kernels never call it on a whole large matrix."""

    def rows(self, ids: np.ndarray) -> np.ndarray:
        """The rows `ids` as float32, shape (len(ids), cols): an embedding lookup."""
        return np.concatenate([self.dequantize(int(i), int(i) + 1) for i in ids])

    @abstractmethod
    def splits(self) -> list[int]:
        """Row boundaries where the kernels may cut the matrix between processes (tile
        edges), from 0 to rows."""

    @abstractmethod
    def matvec_rows(self, x: np.ndarray, r0: int, r1: int, out: np.ndarray) -> None:
        """out = (W @ x)[r0:r1], for r0, r1 in `splits()`: the decode kernel."""

    @abstractmethod
    def matmul_rows(self, x: np.ndarray, r0: int, r1: int, out: np.ndarray) -> None:
        """out = (x @ W.T)[:, r0:r1] for x (T, cols): the prefill kernel."""

    def matvec(self, x: np.ndarray) -> np.ndarray:
        """W @ x for a float32 vector x (cols,), on every process of the team."""
        return parallel.matvecs([self], x)[0]

    def matmul(self, x: np.ndarray) -> np.ndarray:
        """x @ W.T for float32 x (T, cols) -> (T, rows), on every process of the team."""
        return parallel.matmuls([self], x)[0]

    def __repr__(self) -> str:
        return f"{type(self).__name__}(shape={self.shape}, nbytes={self.nbytes})"


def check_float_matrix(w: np.ndarray, fmt: str) -> np.ndarray:
    """The float32 matrix to quantize, or a clear error for what cannot be quantized."""
    w = np.asarray(w)
    if w.ndim != 2:
        raise QuantError(f"{fmt}: expected a 2-D matrix, got shape {w.shape}")
    if not np.issubdtype(w.dtype, np.floating):
        raise QuantError(f"{fmt}: expected a float matrix, got {w.dtype}")
    w = w.astype(np.float32, copy=False)
    if not np.isfinite(w).all():
        bad = np.argwhere(~np.isfinite(w))[0]
        raise QuantError(f"{fmt}: the matrix holds NaN or infinity (first at {tuple(bad)})")
    return w
