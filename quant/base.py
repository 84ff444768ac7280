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
from typing import ClassVar, Protocol, Self

import numpy as np

from .errors import QuantError
from .ggml import LAYOUTS, Layout, assemble, check_blocks, quantize, random_blocks


class Matrix(ABC):
    fmt: str  # the name users type: "f32", "q8_0", ... ("q8_0+f16" for a stack)
    fused: ClassVar[bool] = False  # a FusedMatrix: a backend kernel with prologue and epilogue

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
    def matvec(self, x: np.ndarray) -> np.ndarray:
        """W @ x for a float32 vector x (cols,) -> (rows,): the decode product."""

    @abstractmethod
    def matmul(self, x: np.ndarray) -> np.ndarray:
        """x @ W.T for float32 x (T, cols) -> (T, rows): the prefill and batch product."""

    @abstractmethod
    def slice_rows(self, r0: int, r1: int) -> Weight:
        """Rows r0:r1 as a matrix of their own, in their format (a copy)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(shape={self.shape}, nbytes={self.nbytes})"


class FusedMatrix(Protocol):
    """What a matrix whose class sets `fused` offers a fused backend's forward pass
    (llama_np.model.ops_compiled): products into a caller's buffer, the prologue (RMSNorm,
    SwiGLU or nothing: `mode`) and the residual addition (`add`) inside the kernel, x
    multiplied as `dot`. quant.compiled.weights.CompiledMatrix is the one implementation."""

    shape: tuple[int, int]

    def matvec_into(self, x: np.ndarray, out: np.ndarray, norm: np.ndarray, eps: float,
                    mode: int, add: bool, dot: str) -> None:  # fmt: skip
        """out (=, or += when add) W @ prologue(x) for one vector x (cols,)."""

    def matmat_into(self, x: np.ndarray, out: np.ndarray, add: bool, dot: str) -> None:
        """out (=, or += when add) x @ W.T for x (B, cols) -> out (B, rows)."""


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


class BlockFormat(Weight):
    """What a GGML block format (quant.ggml) is in every backend: its row of the table,
    and building from and saving to the blocks GGUF stores. A backend's class for a
    format says how it lays the blocks out (`lay_out`), gets them back (`to_blocks`) and
    multiplies them; the checks, quantizing, random codes and export are these."""

    layout: ClassVar[Layout]  # set from quant.ggml.LAYOUTS by `fmt`

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if "fmt" in cls.__dict__:
            cls.layout = LAYOUTS[cls.fmt]
            cls.bits_per_weight = cls.layout.bits_per_weight

    def __init__(self, shape: tuple[int, int], blocks: np.ndarray) -> None:
        """blocks: (rows, bytes per row) as GGUF stores them, or any array of those bytes."""
        super().__init__(shape)
        self.lay_out(check_blocks(self.fmt, self.shape, blocks))

    @abstractmethod
    def lay_out(self, blocks: np.ndarray) -> None:
        """Keep the checked blocks (rows, bytes per row) in this backend's layout."""

    @abstractmethod
    def to_blocks(self) -> np.ndarray:
        """The blocks as GGUF stores them, (rows, bytes per row) uint8."""

    @classmethod
    def from_blocks(cls, shape: tuple[int, int], raw: np.ndarray) -> Self:
        return cls(shape, raw)

    @classmethod
    def from_raw(cls, shape: tuple[int, int], raw: np.ndarray) -> Self:
        return cls(shape, raw)

    @classmethod
    def from_float(cls, w: np.ndarray) -> Self:
        w = check_float_matrix(w, cls.fmt)
        return cls(w.shape, quantize(w, cls.fmt))

    @classmethod
    def random(cls, shape: tuple[int, int], rng: np.random.Generator) -> Self:
        """Random codes, sane float16 scales (quant.ggml.random_blocks)."""
        return cls(shape, random_blocks(cls.fmt, shape[0], shape[1], rng))

    def export(self) -> dict[str, np.ndarray]:
        return {"blocks": self.to_blocks()}

    @classmethod
    def from_arrays(cls, shape: tuple[int, int], arrays: dict[str, np.ndarray]) -> Self:
        """From `export()`; also from the codes, scales (and mins) that llama-np saved
        q8_0, q4_0 and q4_1 as before their blocks were saved whole."""
        if "blocks" in arrays:
            return cls(shape, arrays["blocks"])
        try:
            halves = [arrays["scales"]] + ([arrays["mins"]] if cls.layout.has_min else [])
            return cls(shape, assemble(halves, arrays["codes"]))
        except KeyError as e:
            raise QuantError(f"{cls.fmt}: missing array {e}") from None
