"""The interfaces every weight format offers the model.

A `Matrix` is a 2-D matrix of shape (rows, cols) = (out_features, in_features), as in
PyTorch's `nn.Linear`: what the model multiplies, counts and looks rows up in. It never asks
which format it holds. A `Weight` is a Matrix in one format: it also knows how to be built
(from a float matrix, from the bytes a GGUF or safetensors file stores, from random codes)
and saved. quant.stack.StackedWeight is a Matrix of parts in several formats.
"""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from typing import ClassVar, Self

import numpy as np

from .errors import QuantError


class Workspace:
    """Scratch buffers that one process's kernels reuse from call to call, owned by whoever
    runs the kernels (quant.parallel). A fresh 4 MiB tile buffer per call would page-fault:
    SmolLM2 q8_0 decodes in 19.9 ms/token with reuse, 25.9 without (NumPy kernels, paired
    runs of `llama-np bench --kernels numpy --weights q8_0 -p 32 -n 64 -r 3`)."""

    def __init__(self) -> None:
        self._buffers: dict[tuple, np.ndarray] = {}

    def get(self, shape: tuple[int, ...], dtype: type = np.float32) -> np.ndarray:
        buf = self._buffers.get((shape, dtype))
        if buf is None:
            buf = self._buffers[(shape, dtype)] = np.empty(shape, dtype)
        return buf


class Matrix(ABC):
    fmt: str  # the name users type: "f32", "q8_0", ... ("q8_0+f16" for a stack)
    fused: ClassVar[bool] = False  # a compiled kernel with prologue and epilogue (quant.compiled)
    dot: ClassVar[str] = "f32"  # decode multiplies x as float32, or "int8" (quant.intdot)

    def __init__(self, shape: tuple[int, int]) -> None:
        rows, cols = shape
        if rows < 1 or cols < 1:
            raise QuantError(f"{self.fmt}: a weight matrix needs a positive shape, got {shape}")
        self.shape = (int(rows), int(cols))

    @abstractmethod
    def arrays(self) -> dict[str, np.ndarray]:
        """The arrays that hold the matrix in memory: what `nbytes` counts."""

    def leaves(self) -> list[Weight]:
        """The matrices in their own formats that make up this one: itself, or a stack's parts."""
        return [self]  # type: ignore[list-item]

    @functools.cached_property
    def nbytes(self) -> int:
        """Bytes the matrix occupies in memory; a decode step reads all of them. Summed once
        (the meter asks on every kernel call)."""
        return sum(a.nbytes for a in self.arrays().values())

    @abstractmethod
    def dequantize(self, r0: int = 0, r1: int | None = None) -> np.ndarray:
        """Rows r0:r1 as float32, shape (r1 - r0, cols). For tests, conversion and lookups:
        the kernels never call it on a whole large matrix."""

    def first_nonfinite(self) -> tuple[int, int] | None:
        """(row, column) of the first weight that is NaN or infinite, or None. Dequantizing
        finds a bad value, scale or min alike (a NaN or infinite scale makes every weight
        of its block non-finite, 0 * inf included), with no format's layout repeated here."""
        step = max(1, (1 << 20) // self.shape[1])  # ~4 MB of float32 at a time
        for r0 in range(0, self.shape[0], step):
            with np.errstate(all="ignore"):
                bad = ~np.isfinite(self.dequantize(r0, min(self.shape[0], r0 + step)))
            if bad.any():
                r, c = np.argwhere(bad)[0]
                return r0 + int(r), int(c)
        return None

    def rows(self, ids: np.ndarray) -> np.ndarray:
        """The rows `ids` as float32, shape (len(ids), cols): an embedding lookup."""
        return np.concatenate([self.dequantize(int(i), int(i) + 1) for i in ids])

    @abstractmethod
    def splits(self) -> list[int]:
        """Row boundaries where the kernels may cut the matrix between processes (tile
        edges), from 0 to rows."""

    @abstractmethod
    def matvec_rows(
        self, x: np.ndarray, r0: int, r1: int, out: np.ndarray, work: Workspace
    ) -> None:
        """out = (W @ x)[r0:r1], for r0, r1 in `splits()`: the decode kernel."""

    @abstractmethod
    def matmul_rows(
        self, x: np.ndarray, r0: int, r1: int, out: np.ndarray, work: Workspace
    ) -> None:
        """out = (x @ W.T)[:, r0:r1] for x (T, cols): the prefill kernel."""

    def matvec(self, x: np.ndarray, work: Workspace | None = None) -> np.ndarray:
        """W @ x for a float32 vector x (cols,), in this process (quant.parallel splits
        the rows between processes)."""
        out = np.empty(self.shape[0], np.float32)
        self.matvec_rows(x, 0, self.shape[0], out, work or Workspace())
        return out

    def matmul(self, x: np.ndarray, work: Workspace | None = None) -> np.ndarray:
        """x @ W.T for float32 x (T, cols) -> (T, rows), in this process."""
        out = np.empty((x.shape[0], self.shape[0]), np.float32)
        self.matmul_rows(x, 0, self.shape[0], out, work or Workspace())
        return out

    @abstractmethod
    def slice_rows(self, r0: int, r1: int) -> Weight:
        """Rows r0:r1 as a matrix of their own, in their format (a copy)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(shape={self.shape}, nbytes={self.nbytes})"


class Weight(Matrix):
    """A matrix in one format."""

    fmt: ClassVar[str]  # type: ignore[misc]
    bits_per_weight: ClassVar[float]  # at rest, scales included: what the format promises

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

    # --- building ------------------------------------------------------------------------
    @classmethod
    @abstractmethod
    def from_float(cls, w: np.ndarray) -> Self:
        """Store a float matrix in this format (quantize it)."""

    @classmethod
    @abstractmethod
    def from_raw(cls, shape: tuple[int, int], raw: np.ndarray) -> Self:
        """From the format's bytes as a GGUF or safetensors file stores them, rows first:
        raw (rows, bytes per row) uint8, or any array of those bytes. Without copying
        where the layout allows (a memory-mapped file stays mapped)."""

    @classmethod
    @abstractmethod
    def random(cls, shape: tuple[int, int], rng: np.random.Generator) -> Self:
        """Random values of a sane magnitude (~1e-2), stored directly in this format (no
        float copy, no quantizing): a synthetic model far larger than the caches builds
        in seconds."""

    @classmethod
    @abstractmethod
    def from_arrays(cls, shape: tuple[int, int], arrays: dict[str, np.ndarray]) -> Self:
        """Rebuild from `export()` (as saved by `llama-np quantize`), without copying."""

    def export(self) -> dict[str, np.ndarray]:
        """The arrays to save at rest, which `from_arrays` reads back. The in-memory layout
        may differ (see BlockWeight)."""
        return self.arrays()

    def plain(self) -> np.ndarray | None:
        """The matrix as a plain safetensors tensor (float32 or float16), when the format is
        one; None for formats saved as their parts (`export`)."""
        return None

    @classmethod
    def concat_rows(cls, weights: list[Weight]) -> Self:
        """One matrix of these matrices' rows, in order (all of this format, same cols).
        Works on the exported arrays, which every format stores row by row."""
        parts = [w.export() for w in weights]
        rows = sum(w.shape[0] for w in weights)
        merged = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
        return cls.from_arrays((rows, weights[0].shape[1]), merged)

    def slice_rows(self, r0: int, r1: int) -> Weight:
        parts = {k: np.array(v[r0:r1]) for k, v in self.export().items()}
        return type(self).from_arrays((r1 - r0, self.shape[1]), parts)


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
