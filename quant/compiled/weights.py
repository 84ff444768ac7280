"""The weight formats in the compiled backend's memory layout, multiplied by its kernels.

Each class is its NumPy counterpart's format (the same codes and quantization, the same
GGUF blocks and checkpoint arrays at rest) with another layout in memory:

- f32, f16, bf16: row-major, as stored. f16 and bf16 stay 16-bit: the kernel widens each
  weight in a register.
- q8_0, q4_0, q4_1: groups of 4 rows interleaved block by block (matvec.py says why), with
  float16 scales and mins kept float16, so a weight costs the format's own 8.5, 4.5 or 5.0
  bits. A row count that is not a multiple of 4 is padded with zero rows, and `nbytes`
  counts them: the kernel reads them.

Decode calls one parallel kernel per matrix. Prefill dequantizes row tiles into a
float32 buffer and multiplies them with BLAS: it is compute-bound, and sgemm is the
fastest matrix product NumPy has.
"""

from __future__ import annotations

from functools import cached_property
from typing import ClassVar

import numpy as np

from ..base import Weight, Workspace
from ..blocks import BLOCK, BlockWeight, Q4_0Weight, Q4_1Weight, Q8_0Weight
from ..errors import QuantError
from ..floats import BF16Weight, F16Weight, F32Weight
from ..ggml import GGML_FORMATS, GGMLWeight
from . import dequant, ggml, intdot, matmat, matvec
from .matvec import GROUP

# Weights dequantized per tile in prefill: a 4 MiB float32 tile stays in the L2/L3 caches.
TILE_WEIGHTS = 1 << 20
# Up to this many vectors (a batch of sequences' decode step, a short prompt) a product runs
# the parallel batched kernels (matmat.py); more run dequantized tiles through BLAS sgemm.
BATCH = 64


def to_groups(a: np.ndarray, per_block: int) -> np.ndarray:
    """(rows, nb * per_block) row-major -> (G, nb * GROUP * per_block): for each group of
    GROUP rows and each block, the rows' `per_block` entries one after the other. Rows are
    padded with zeros to a multiple of GROUP."""
    rows, n = a.shape
    groups, nb = -(-rows // GROUP), n // per_block
    padded = np.zeros((groups * GROUP, n), a.dtype)
    padded[:rows] = a
    grouped = padded.reshape(groups, GROUP, nb, per_block).transpose(0, 2, 1, 3)
    return np.ascontiguousarray(grouped).reshape(groups, -1)


def from_groups(a: np.ndarray, rows: int, per_block: int) -> np.ndarray:
    """The inverse of to_groups: (rows, nb * per_block)."""
    groups = a.shape[0]
    nb = a.shape[1] // (GROUP * per_block)
    rowwise = a.reshape(groups, nb, GROUP, per_block).transpose(0, 2, 1, 3)
    return rowwise.reshape(groups * GROUP, nb * per_block)[:rows]


def f16_bits(a: np.ndarray) -> np.ndarray:
    """Float16 values (float16, or float32 holding float16 values) as their raw bits."""
    return np.ascontiguousarray(a, dtype=np.float16).view(np.uint16)


NO_NORM = np.zeros(1, np.float32)
ONE, NIBBLE_OFFSET = np.float32(1), np.float32(-8)  # q4_1's factor on its mins; q4_0's
Q5_OFFSET = np.float32(-16)  # q5_0: x = d (q - 16)
ZERO = np.float32(0)


class CompiledMatrix:
    """The compiled side of the Matrix interface: matvec runs the kernels here, on the
    threads numba runs; the NumPy process team never sees these matrices.

    `matvec_into(x, out, norm, eps, mode, add)` is one kernel: out (=, or += when add)
    W @ prologue(x), with the prologue RMSNorm, SwiGLU or nothing (ops.prologue)."""

    fused = True  # matvec_into takes a prologue and an epilogue

    def matvec(self, x: np.ndarray, work: Workspace | None = None) -> np.ndarray:
        out = np.empty(self.shape[0], np.float32)
        self.matvec_into(x, out)
        return out

    def matvec_rows(
        self, x: np.ndarray, r0: int, r1: int, out: np.ndarray, work: Workspace
    ) -> None:
        if (r0, r1) != (0, self.shape[0]):
            raise QuantError("compiled kernels take a whole matrix")
        self.matvec_into(x, out)

    def splits(self) -> list[int]:
        return [0, self.shape[0]]


class CF32Weight(CompiledMatrix, F32Weight):
    def matvec_into(self, x, out, norm=NO_NORM, eps=ZERO, mode=0, add=False) -> None:
        matvec.matvec_f32(self.w, x, norm, eps, mode, add, out)

    def matmat_into(self, x: np.ndarray, out: np.ndarray) -> None:
        matmat.matmat_f32(self.w, x, out)

    def matmul_rows(
        self, x: np.ndarray, r0: int, r1: int, out: np.ndarray, work: Workspace
    ) -> None:
        if x.shape[0] <= BATCH and (r0, r1) == (0, self.shape[0]):
            self.matmat_into(np.ascontiguousarray(x, dtype=np.float32), out)
        else:
            super().matmul_rows(x, r0, r1, out, work)


class CF16Weight(CompiledMatrix, F16Weight):
    def matvec_into(self, x, out, norm=NO_NORM, eps=ZERO, mode=0, add=False) -> None:
        matvec.matvec_f16(self.bits, x, norm, eps, mode, add, out)

    def dequantize(self, r0: int = 0, r1: int | None = None) -> np.ndarray:
        rows = self.bits[r0:r1]
        out = np.empty(rows.shape, np.float32)
        dequant.dequant_f16(rows, out)
        return out


class CBF16Weight(CompiledMatrix, BF16Weight):
    def matvec_into(self, x, out, norm=NO_NORM, eps=ZERO, mode=0, add=False) -> None:
        matvec.matvec_bf16(self.bits, x, norm, eps, mode, add, out)


def grouped_dequantize(w, r0: int, r1: int | None) -> np.ndarray:
    """Rows r0:r1 of a matrix stored in groups of rows, through its dequantize_groups."""
    r1 = w.shape[0] if r1 is None else r1
    if r1 <= r0:
        return np.empty((0, w.shape[1]), np.float32)
    g0, g1 = r0 // GROUP, -(-r1 // GROUP)
    tile = np.empty((GROUP * (g1 - g0), w.shape[1]), np.float32)
    w.dequantize_groups(g0, g1, tile)
    return tile[r0 - GROUP * g0 : r1 - GROUP * g0]


def grouped_matmul(w, x: np.ndarray, out: np.ndarray) -> None:
    """out = x @ W.T: for a batch of up to BATCH vectors, one parallel kernel (matmat.py);
    for more, tile by tile: groups of rows dequantized into a float32 buffer, then one
    sgemm each."""
    if x.shape[0] <= BATCH:
        w.matmat_into(np.ascontiguousarray(x, dtype=np.float32), out)
        return
    rows, cols = w.shape
    groups = -(-rows // GROUP)
    per_tile = max(1, TILE_WEIGHTS // (GROUP * cols))
    buf = np.empty((GROUP * per_tile, cols), np.float32)
    for g0 in range(0, groups, per_tile):
        g1 = min(groups, g0 + per_tile)
        a, b = GROUP * g0, min(rows, GROUP * g1)
        tile = buf[: GROUP * (g1 - g0)]
        w.dequantize_groups(g0, g1, tile)
        np.matmul(x, tile[: b - a].T, out=out[:, a:b])


class CompiledBlockWeight(CompiledMatrix, BlockWeight):
    """q8_0, q4_0, q4_1 in groups of GROUP rows (see the module docstring)."""

    mins_factor: ClassVar[float]  # q4 kernels: y += factor * m * sum(x_b)

    def __init__(
        self,
        shape: tuple[int, int],
        codes: np.ndarray,
        scales: np.ndarray,
        mins: np.ndarray | None = None,
    ) -> None:
        Weight.__init__(self, shape)
        rows, cols = self.shape
        if cols % BLOCK:
            raise QuantError(f"{self.fmt}: the input dimension {cols} is not a multiple of {BLOCK}")
        nb = cols // BLOCK
        if codes.shape != (rows, nb * self.code_bytes) or scales.shape != (rows, nb):
            raise QuantError(
                f"{self.fmt}: codes {codes.shape} / scales {scales.shape} do not fit {shape}"
            )
        self.nb = nb
        self.codes = to_groups(np.ascontiguousarray(codes).view(np.uint8), self.code_bytes)
        self.scales = to_groups(f16_bits(scales), 1)
        self.mins = None if mins is None else to_groups(f16_bits(mins), 1)

    def arrays(self) -> dict[str, np.ndarray]:
        out = {"codes": self.codes, "scales": self.scales}
        return out | ({} if self.mins is None else {"mins": self.mins})

    @classmethod
    def nbytes_for(cls, shape: tuple[int, int]) -> int:
        """Codes and float16 scales (and mins) of the rows padded to a multiple of GROUP."""
        rows, cols = shape
        per_block = cls.code_bytes + 2 * (2 if cls.has_min else 1)
        return -(-rows // GROUP) * GROUP * (cols // BLOCK) * per_block

    def export(self) -> dict[str, np.ndarray]:
        rows = self.shape[0]
        out = {
            "codes": from_groups(self.codes, rows, self.code_bytes),
            "scales": from_groups(self.scales, rows, 1).view(np.float16),
        }
        if self.mins is not None:
            out["mins"] = from_groups(self.mins, rows, 1).view(np.float16)
        return out

    def dequantize(self, r0: int = 0, r1: int | None = None) -> np.ndarray:
        return grouped_dequantize(self, r0, r1)

    def matmul_rows(
        self, x: np.ndarray, r0: int, r1: int, out: np.ndarray, work: Workspace
    ) -> None:
        grouped_matmul(self, x, out)


class CQ8_0Weight(CompiledBlockWeight, Q8_0Weight):
    def matvec_into(self, x, out, norm=NO_NORM, eps=ZERO, mode=0, add=False) -> None:
        matvec.matvec_q8_0(self.codes, self.scales, x, norm, eps, mode, add, out)

    def dequantize_groups(self, g0: int, g1: int, out: np.ndarray) -> None:
        dequant.dequant_q8_0(self.codes, self.scales, g0, g1, out)

    def matmat_into(self, x: np.ndarray, out: np.ndarray) -> None:
        matmat.matmat_q8_0(self.codes, self.scales, x, out, matmat.scratch_for(x.shape[1]))


class CompiledNibbleWeight(CompiledBlockWeight):
    """q4_0 and q4_1 share one kernel: q4_0 is q4_1 with m = -8 d."""

    def _mins(self) -> tuple[np.ndarray, np.float32]:
        if self.mins is None:
            return self.scales, NIBBLE_OFFSET
        return self.mins, ONE

    def matvec_into(self, x, out, norm=NO_NORM, eps=ZERO, mode=0, add=False) -> None:
        mins, factor = self._mins()
        matvec.matvec_q4(self.codes, self.scales, mins, factor, x, norm, eps, mode, add, out)

    def dequantize_groups(self, g0: int, g1: int, out: np.ndarray) -> None:
        mins, factor = self._mins()
        dequant.dequant_q4(self.codes, self.scales, mins, factor, g0, g1, out)

    def matmat_into(self, x: np.ndarray, out: np.ndarray) -> None:
        mins, factor = self._mins()
        matmat.matmat_q4(self.codes, self.scales, mins, factor, x, out,
                         matmat.scratch_for(x.shape[1]))  # fmt: skip


class CQ4_0Weight(CompiledNibbleWeight, Q4_0Weight):
    pass


class CQ4_1Weight(CompiledNibbleWeight, Q4_1Weight):
    pass


class CompiledGGMLWeight(CompiledMatrix, GGMLWeight):
    """q5_0, q5_1 and the K-quants: their GGUF blocks as stored, in groups of 4 rows
    interleaved block by block; the kernels decode them in registers (ggml.py)."""

    def __init__(self, shape: tuple[int, int], raw: np.ndarray) -> None:
        Weight.__init__(self, shape)
        lay = self.layout
        rows, cols = self.shape
        if cols % lay.weights:
            raise QuantError(
                f"{self.fmt}: the row length {cols} is not a multiple of {lay.weights}"
            )
        raw = np.ascontiguousarray(raw, dtype=np.uint8).reshape(rows, -1)
        if raw.shape[1] != cols // lay.weights * lay.nbytes:
            raise QuantError(f"{self.fmt}: {raw.shape[1]} bytes per row do not fit {cols} weights")
        self.blocks = to_groups(raw, lay.nbytes)
        self.code = ggml.CODES[self.fmt]

    @classmethod
    def from_blocks(cls, shape: tuple[int, int], raw: np.ndarray):
        return cls(shape, raw)

    def arrays(self) -> dict[str, np.ndarray]:
        return {"blocks": self.blocks}

    @classmethod
    def nbytes_for(cls, shape: tuple[int, int]) -> int:
        """The stored blocks of the rows padded to a multiple of GROUP."""
        rows, cols = shape
        return -(-rows // GROUP) * GROUP * (cols // cls.layout.weights) * cls.layout.nbytes

    def to_blocks(self) -> np.ndarray:
        return from_groups(self.blocks, self.shape[0], self.layout.nbytes)

    def export(self) -> dict[str, np.ndarray]:
        return {"blocks": self.to_blocks()}

    def dequantize(self, r0: int = 0, r1: int | None = None) -> np.ndarray:
        return grouped_dequantize(self, r0, r1)

    def dequantize_groups(self, g0: int, g1: int, out: np.ndarray) -> None:
        lay = self.layout
        ggml.dequant_ggml(self.blocks, self.code, lay.nbytes, lay.weights, g0, g1, out)

    def matmat_into(self, x: np.ndarray, out: np.ndarray) -> None:
        lay = self.layout
        matmat.matmat_ggml(self.blocks, self.code, lay.nbytes, lay.weights, x, out,
                           matmat.scratch_for(x.shape[1]))  # fmt: skip

    def matmul_rows(
        self, x: np.ndarray, r0: int, r1: int, out: np.ndarray, work: Workspace
    ) -> None:
        grouped_matmul(self, x, out)

    def matvec_into(self, x, out, norm=NO_NORM, eps=ZERO, mode=0, add=False) -> None:
        lay = self.layout
        ggml.matvec_ggml(self.blocks, self.code, lay.nbytes, lay.weights, x, norm, eps, mode,
                         add, out)  # fmt: skip


class CompiledQ5Weight(CompiledMatrix, GGMLWeight):
    """q5_0 and q5_1, re-laid at load as q4's groups of 4 interleaved rows (nibbles, float16
    scales and mins) plus each block's 32 fifth bits as one uint32: the same 22 or 24 bytes
    per block as stored, multiplied by a fused kernel (matvec.matvec_q5)."""

    def __init__(self, shape: tuple[int, int], raw: np.ndarray) -> None:
        Weight.__init__(self, shape)
        rows, cols = self.shape
        lay = self.layout
        if cols % 32:
            raise QuantError(f"{self.fmt}: the row length {cols} is not a multiple of 32")
        nb = cols // 32
        blocks = np.ascontiguousarray(raw, dtype=np.uint8).reshape(rows, nb, lay.nbytes)
        h = 4 if lay.has_min else 2  # where the fifth bits start
        self.scales = to_groups(blocks[:, :, 0:2].copy().view(np.uint16)[:, :, 0], 1)
        mins = blocks[:, :, 2:4].copy().view(np.uint16)[:, :, 0] if lay.has_min else None
        self.mins = None if mins is None else to_groups(mins, 1)
        self.bits = to_groups(blocks[:, :, h : h + 4].copy().view(np.uint32)[:, :, 0], 1)
        self.codes = to_groups(blocks[:, :, h + 4 :].reshape(rows, -1), 16)

    @classmethod
    def from_blocks(cls, shape: tuple[int, int], raw: np.ndarray):
        return cls(shape, raw)

    def arrays(self) -> dict[str, np.ndarray]:
        out = {"codes": self.codes, "scales": self.scales, "bits": self.bits}
        return out | ({} if self.mins is None else {"mins": self.mins})

    @classmethod
    def nbytes_for(cls, shape: tuple[int, int]) -> int:
        rows, cols = shape
        return -(-rows // GROUP) * GROUP * (cols // 32) * cls.layout.nbytes

    def to_blocks(self) -> np.ndarray:
        rows, nb = self.shape[0], self.shape[1] // 32

        def raw(a: np.ndarray, per_block: int) -> np.ndarray:
            return np.ascontiguousarray(from_groups(a, rows, per_block)).view(np.uint8)

        parts = [raw(self.scales, 1)]
        if self.mins is not None:
            parts.append(raw(self.mins, 1))
        parts += [raw(self.bits, 1), raw(self.codes, 16)]
        return np.concatenate([p.reshape(rows, nb, -1) for p in parts], axis=2).reshape(rows, -1)

    def export(self) -> dict[str, np.ndarray]:
        return {"blocks": self.to_blocks()}

    def _mins(self) -> tuple[np.ndarray, np.float32]:
        return (self.scales, Q5_OFFSET) if self.mins is None else (self.mins, ONE)

    def dequantize(self, r0: int = 0, r1: int | None = None) -> np.ndarray:
        return grouped_dequantize(self, r0, r1)

    def dequantize_groups(self, g0: int, g1: int, out: np.ndarray) -> None:
        mins = self.scales if self.mins is None else self.mins
        dequant.dequant_q5(self.codes, self.scales, mins, self.mins is not None, self.bits,
                           g0, g1, out)  # fmt: skip

    def matmat_into(self, x: np.ndarray, out: np.ndarray) -> None:
        mins = self.scales if self.mins is None else self.mins
        matmat.matmat_q5(self.codes, self.scales, mins, self.mins is not None, self.bits, x,
                         out, matmat.scratch_for(x.shape[1]))  # fmt: skip

    def matmul_rows(
        self, x: np.ndarray, r0: int, r1: int, out: np.ndarray, work: Workspace
    ) -> None:
        grouped_matmul(self, x, out)

    def matvec_into(self, x, out, norm=NO_NORM, eps=ZERO, mode=0, add=False) -> None:
        mins, factor = self._mins()
        matvec.matvec_q5(self.codes, self.scales, mins, factor, self.bits, x, norm, eps, mode,
                         add, out)  # fmt: skip


def _compiled_ggml(fmt: str) -> type[Weight]:
    base = CompiledQ5Weight if fmt in ("q5_0", "q5_1") else CompiledGGMLWeight
    return type(f"C{fmt.upper()}Weight", (base, GGML_FORMATS[fmt]), {})


FORMATS: dict[str, type[Weight]] = {
    cls.fmt: cls
    for cls in (CF32Weight, CF16Weight, CBF16Weight, CQ8_0Weight, CQ4_0Weight, CQ4_1Weight)
} | {fmt: _compiled_ggml(fmt) for fmt in GGML_FORMATS}


# --- int8 activations (intdot.py): the same layouts, decode products in integer lanes ---


class CQ8_0Int8Weight(CQ8_0Weight):
    dot = "int8"

    def matvec_into(self, x, out, norm=NO_NORM, eps=ZERO, mode=0, add=False) -> None:
        intdot.matvec_q8_0(self.codes, self.scales, x, norm, eps, mode, add, out)


class CompiledNibbleInt8Weight(CompiledNibbleWeight):
    dot = "int8"

    @cached_property
    def _no_bits(self) -> np.ndarray:
        """matvec_q4's `bits` for a 4-bit format: none per group (made once, not per call)."""
        return np.empty((self.codes.shape[0], 0), np.uint32)

    def matvec_into(self, x, out, norm=NO_NORM, eps=ZERO, mode=0, add=False) -> None:
        mins, factor = self._mins()
        intdot.matvec_q4(self.codes, self.scales, mins, factor, self._no_bits, x, norm, eps,
                         mode, add, out)  # fmt: skip


class CompiledQ5Int8Weight(CompiledQ5Weight):
    dot = "int8"

    def matvec_into(self, x, out, norm=NO_NORM, eps=ZERO, mode=0, add=False) -> None:
        mins, factor = self._mins()
        intdot.matvec_q4(self.codes, self.scales, mins, factor, self.bits, x, norm, eps, mode,
                         add, out)  # fmt: skip


class CompiledKInt8Weight(CompiledGGMLWeight):
    dot = "int8"

    def matvec_into(self, x, out, norm=NO_NORM, eps=ZERO, mode=0, add=False) -> None:
        intdot.matvec_k(self.blocks, self.code, self.layout.nbytes, x, norm, eps, mode, add, out)


def _int8_ggml(fmt: str) -> type[Weight]:
    base = CompiledQ5Int8Weight if fmt in ("q5_0", "q5_1") else CompiledKInt8Weight
    return type(f"C{fmt.upper()}Int8Weight", (base, GGML_FORMATS[fmt]), {})


class CQ4_0Int8Weight(CompiledNibbleInt8Weight, Q4_0Weight):
    pass


class CQ4_1Int8Weight(CompiledNibbleInt8Weight, Q4_1Weight):
    pass


# The int8 backend's formats: every quantized one has an integer kernel.
INT8_FORMATS: dict[str, type[Weight]] = (
    FORMATS
    | {cls.fmt: cls for cls in (CQ8_0Int8Weight, CQ4_0Int8Weight, CQ4_1Int8Weight)}
    | {fmt: _int8_ggml(fmt) for fmt in GGML_FORMATS}
)
