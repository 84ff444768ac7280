"""The weight formats in the compiled backend's memory layout, one class per format,
multiplied by its kernels. The formats themselves (their blocks at rest, quantizing,
random codes, the shape checks) are quant.ggml's and quant.base.BlockFormat's, shared
with the NumPy backend; these classes say how the bytes lie in memory:

- f32, f16, bf16: row-major, as stored. f16 and bf16 stay 16-bit: the kernel widens each
  weight in a register.
- the block formats: groups of 4 rows interleaved block by block (matvec.py says why),
  float16 scales and mins kept float16, so a weight costs the format's own bits (8.5 for
  q8_0, 4.5 for q4_0, ...). A row count that is not a multiple of 4 is padded with zero
  rows, and `nbytes` counts them: the kernel reads them.

Decode calls one parallel kernel per matrix, with x in float32 or rounded to int8 or int16
(`dot`, the backend's choice). A product of several vectors (a batch's decode step, a
prompt) runs `matmat_into`: up to FEW vectors decode's loop, each block of 4 rows loaded
and decoded once and multiplied by every vector (fewdot.py for the quantized formats, x
rounded as decode rounds it; float32 x for the float ones); more, panels of 16
rows decoded once and multiplied by the vectors in integers (igemm.matmat_int) or, for
f16 and bf16, in float32 (igemm.matmat_float); f32 needs no panel: its weights are
broadcast operands of 16 or 32 vectors at a time (igemm.matmat_f32).
"""

from __future__ import annotations

from functools import cached_property
from typing import ClassVar

import numpy as np

from ..base import BlockFormat, Weight
from ..blocks import PANEL_WEIGHTS  # also a long prompt's panels here, with float x
from ..floats import BF16Weight, F16Weight, F32Weight
from ..ggml import assemble, split
from . import dequant, fewdot, ggml, igemm, intdot, matmat, matvec
from .kinds import CODE_OF, KIND_OF
from .layers import Operands
from .matvec import GROUP
from .ops import NO_NORM, ZERO
from .simd.panels import SIGNED_Q8

# Up to this many vectors a product with x in float32 on a quantized format runs the
# float batch kernels (matmat.py); more, dequantized panels through BLAS sgemm.
BATCH = 64
# The `dot`s that multiply a quantized format's codes by x's integers (intdot.py): x
# rounded to int8 (llama.cpp's activations) or to int16 (two int8 halves).
INTEGER = ("int8", "int16")
# Up to FEW vectors a product runs decode's loop, each block of weights loaded once for
# every vector (fewdot.py, the float formats too); more, the panels (igemm).
# Where the two cross, measured (DEVELOPERS.md).
FEW = fewdot.FEW
# Up to SPLIT vectors an integer product runs decode's loop in passes of at most FEW
# vectors (the weights read once per pass): q8_0 5632 x 2048 and q5_0 4864 x 896 from
# DRAM, Zen 4, int16 x, against the panels: B = 5 0.76x / 0.81x, B = 6 0.88x / 0.91x,
# B = 8 1.09x / 1.07x (DEVELOPERS.md).
SPLIT = FEW + 2


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


# where the bits repack_codes lays out start in a super-block (quant.ggml's layout): q4_k's
# and q5_k's 128 code bytes, q6_k's 64 bytes of top 2 bits
K_CODES = {"q4_k": 16, "q5_k": 48, "q6_k": 128}
REPACK_CHUNK = 1024  # super-blocks a thread repacks at a time


def repack_codes(blocks: np.ndarray, fmt: str, nbytes: int, inverse: bool = False) -> None:
    """q4_k / q5_k super-blocks (every `nbytes` bytes of `blocks`, in place): their 128 code
    bytes, stored as 4 runs of 32 whose low nibbles are elements 64 v + j and high nibbles
    64 v + 32 + j, laid out as q6_k's low nibbles are, byte j of half t holding element
    128 t + j (low nibble) and 128 t + 64 + j (high): one 64-byte load and two masks give
    128 codes in order (simd/kquants.q45_k). q6_k: its 64 bytes of top 2 bits, stored as
    2 halves of 32 whose field f of byte j is element 128 h + 32 f + j's, laid out so that
    field v of byte k is element 64 v + k's (simd/kquants.q6_k). The bytes start at
    K_CODES[fmt] in each super-block.
    `inverse`: back to the stored order. Compiled (ggml.repack_codes): 0.06 s a 100 MB on
    2 threads, where NumPy's 0.19 (Zen 4)."""
    repack = ggml.repack_high2 if fmt == "q6_k" else ggml.repack_codes
    repack(blocks.reshape(-1, nbytes), K_CODES[fmt], inverse, REPACK_CHUNK)


ONE = np.float32(1)  # the factor on a format's own mins
NO_BITS = np.empty((1, 0), np.uint32)  # the fifth bits of a format without them
NO_SCALES = np.empty((1, 4), np.uint16)  # the float16 scales of a format without them


class CompiledMatrix:
    """The compiled side of the Matrix interface: products run the kernels here, on the
    threads numba runs.

    `matvec_into(x, out, norm, eps, mode, add, dot)` is one kernel: out (=, or += when
    add) W @ prologue(x), with the prologue RMSNorm, SwiGLU or nothing (ops.prologue), and
    x multiplied as float32 or, for the quantized formats, rounded to int8 or int16 per
    block of 32 (dot "int8", "int16": intdot.py). `matmat_into(x, out, add, dot)`: the
    same for several vectors x (B, cols) -> out (B, rows) (quant.base.FusedMatrix). And
    `operands()`: the matrix as a row of the table that runs a whole decode step in one
    call (layers.decode_layers)."""

    fused = True  # matvec_into takes a prologue and an epilogue
    # Its kernels of one vector (matvec.matvec's `prepare` and `rows`): with x in float32,
    # and, for the quantized formats, with x rounded to integers (None: x stays float32).
    vec: ClassVar[tuple]
    ivec: ClassVar[tuple | None] = None

    def row_operands(self) -> tuple:
        """Its arrays (and constants) as its row functions take them, the `w` of its vec_
        and few_ functions."""
        raise NotImplementedError

    def vec_operands(self, ints: bool) -> tuple:
        """What its `vec` (ints: `ivec`) rows take as w."""
        return self.row_operands()

    def matvec_into(self, x, out, norm=NO_NORM, eps=ZERO, mode=0, add=False, dot="f32") -> None:
        ints = dot in INTEGER and self.ivec is not None
        prepare, rows = self.ivec if ints else self.vec
        matvec.matvec(prepare, rows, self.vec_operands(ints), x, norm, eps, mode, add, out,
                      dot == "int16")  # fmt: skip

    def operands(self) -> Operands:
        """Its kind and arrays, as a row of layers.Table names them: its row operands,
        where those are arrays only (the nibble formats and K-quants say more)."""
        return Operands(KIND_OF[self.fmt], self.shape[0], self.row_operands())

    def matvec(self, x: np.ndarray, dot: str = "f32") -> np.ndarray:
        out = np.empty(self.shape[0], np.float32)
        self.matvec_into(x, out, dot=dot)
        return out

    def matmul(self, x: np.ndarray, dot: str = "f32") -> np.ndarray:
        """x @ W.T for x (B, cols), its vectors multiplied as `dot` (matmat_into)."""
        out = np.empty((x.shape[0], self.shape[0]), np.float32)
        self.matmat_into(np.ascontiguousarray(x, dtype=np.float32), out, False, dot)
        return out


class FloatMatrix(CompiledMatrix):
    """f32, f16, bf16: their several-vector products (x stays float32 whatever `dot`)."""

    few: object  # fewdot's few_ function of the format
    panels: object  # igemm's panels_ function of the format

    def matmat_into(self, x: np.ndarray, out: np.ndarray, add: bool = False,
                    dot: str = "f32") -> None:  # fmt: skip
        w = self.row_operands()
        if x.shape[0] <= FEW:
            fewdot.matmat_few(self.few, w, x, tuple(range(x.shape[0])), add, out)
        else:
            self.many(w[0], x, add, out)

    def many(self, w: np.ndarray, x: np.ndarray, add: bool, out: np.ndarray) -> None:
        """More than FEW vectors: panels of 16 rows widened to float32 (igemm.matmat_float)."""
        igemm.matmat_float(self.panels, w, x, add, out, igemm.float_scratch(self.shape[1]))


class CF32Weight(FloatMatrix, F32Weight):
    few = fewdot.few_f32
    vec = matvec.as_float, matvec.vec_f32

    def row_operands(self) -> tuple:
        return (self.w,)

    def many(self, w: np.ndarray, x: np.ndarray, add: bool, out: np.ndarray) -> None:
        """More than FEW vectors: each weight a broadcast operand of 16 or 32 vectors, no
        panel (igemm.matmat_f32)."""
        igemm.matmat_f32([w], x, add, out)


def f32_stack_into(parts: list, x: np.ndarray, out: np.ndarray, add: bool) -> bool:
    """out (=, or += when add) x @ W.T for W the parts of a stack stacked (a GGUF's f32 q, k
    and v, or gate and up, each memory-mapped apart), when every part is f32 and x has more
    than FEW vectors: x transposed once for all the parts, each writing its own columns of
    out (igemm.matmat_f32). False, nothing done, otherwise."""
    if x.shape[0] <= FEW or not all(isinstance(p, CF32Weight) for p in parts):
        return False
    igemm.matmat_f32([p.w for p in parts], x, add, out)  # transposed() makes x contiguous
    return True


class CF16Weight(FloatMatrix, F16Weight):
    few, panels = fewdot.few_f16, igemm.panels_f16
    vec = matvec.as_float, matvec.vec_f16

    def row_operands(self) -> tuple:
        return (self.bits,)

    def dequantize(self, r0: int = 0, r1: int | None = None) -> np.ndarray:
        rows = self.bits[r0:r1]
        out = np.empty(rows.shape, np.float32)
        dequant.dequant_f16(rows, out)
        return out


class CBF16Weight(FloatMatrix, BF16Weight):
    few, panels = fewdot.few_bf16, igemm.panels_bf16
    vec = matvec.as_float, matvec.vec_bf16

    def row_operands(self) -> tuple:
        return (self.bits,)


class GroupedWeight(CompiledMatrix, BlockFormat):
    """The compiled layout of a block format: its blocks' parts (or the blocks whole) in
    groups of GROUP rows interleaved block by block, rows padded with zeros to a multiple
    of GROUP (the kernels read them: `nbytes` counts them). A subclass lays the blocks out
    (`lay_out`, `to_blocks`) and names its kernels: `matvec_into`, `dequantize_groups` and
    `matmat_into`."""

    @classmethod
    def nbytes_for(cls, shape: tuple[int, int]) -> int:
        """The blocks of the rows padded to a multiple of GROUP: the stored bytes."""
        rows, cols = shape
        return -(-rows // GROUP) * GROUP * (cols // cls.layout.weights) * cls.layout.nbytes

    def dequantize(self, r0: int = 0, r1: int | None = None) -> np.ndarray:
        r1 = self.shape[0] if r1 is None else r1
        if r1 <= r0:
            return np.empty((0, self.shape[1]), np.float32)
        g0, g1 = r0 // GROUP, -(-r1 // GROUP)
        panel = np.empty((GROUP * (g1 - g0), self.shape[1]), np.float32)
        self.dequantize_groups(g0, g1, panel)
        return panel[r0 - GROUP * g0 : r1 - GROUP * g0]

    few: object  # fewdot's few_ function of the format
    panels: object  # igemm's panels_ function of the format
    signed = 0  # 1: its panels hold int8 codes, not bytes (q8_0 where SIGNED_Q8)
    paired = 1  # 1: one scale (and min) per 32 weights, two sub-blocks of its panels (tile)
    fold = 0  # c: its offset is c times its scale (M = c D), folded into the tile's integers

    def panel_operands(self) -> tuple:
        """What igemm.matmat_int passes to the format's panels_ function: (a0, a1, a2,
        factor, a3, code, nbytes)."""
        raise NotImplementedError

    def matmat_into(self, x: np.ndarray, out: np.ndarray, add: bool = False,
                    dot: str = "f32") -> None:  # fmt: skip
        """out (=, or += when add) x @ W.T. With integer x: up to FEW vectors decode's
        loop for several vectors (fewdot.py), up to SPLIT that loop in passes of at most
        FEW, more the integer panels; with float x, the float batch kernels (up to BATCH
        vectors) or dequantized panels and sgemm."""
        if dot not in INTEGER:
            self.float_matmat(x, out, add)
            return
        xs = igemm.quantized_rows(x, dot == "int16")
        if x.shape[0] <= SPLIT:
            for v0 in range(0, x.shape[0], FEW):
                vs = tuple(range(v0, min(v0 + FEW, x.shape[0])))
                fewdot.matmat_few(self.few, self.row_operands(), xs, vs, add, out)
            return
        xq, xd, xsum, _, xb16, lo = xs
        xoff, fold = igemm.folded_offsets(self.fold, xsum, self.paired)
        xb = igemm.paired_xb(xb16) if self.paired and not fold else xb16  # (unread if folded)
        codes, dms = igemm.scratch_for(self.shape[1])
        igemm.matmat_int(self.panels, *self.panel_operands(), self.signed, self.paired, xq, xd,
                         xb, xoff, fold, lo, add, out, codes, dms)  # fmt: skip

    def float_matmat(self, x: np.ndarray, out: np.ndarray, add: bool) -> None:
        """x in float32: up to BATCH vectors one parallel kernel (matmat.py); more, panel
        by panel, groups of rows dequantized into a float32 buffer, then one sgemm each."""
        rows, cols = self.shape
        if x.shape[0] <= BATCH:
            y = out if not add else np.empty_like(out)
            self.float_batch(x, y)
            if add:
                out += y
            return
        groups = -(-rows // GROUP)
        per_panel = max(1, PANEL_WEIGHTS // (GROUP * cols))
        buf = np.empty((GROUP * per_panel, cols), np.float32)
        for g0 in range(0, groups, per_panel):
            g1 = min(groups, g0 + per_panel)
            a, b = GROUP * g0, min(rows, GROUP * g1)
            panel = buf[: GROUP * (g1 - g0)]
            self.dequantize_groups(g0, g1, panel)
            if add:
                out[:, a:b] += x @ panel[: b - a].T
            else:
                np.matmul(x, panel[: b - a].T, out=out[:, a:b])


class CQ8_0Weight(GroupedWeight):
    fmt = "q8_0"

    def lay_out(self, blocks: np.ndarray) -> None:
        (d,), codes = split(self.fmt, blocks)
        self.codes = to_groups(codes.reshape(self.shape[0], -1), 32)
        self.scales = to_groups(d, 1)

    def arrays(self) -> dict[str, np.ndarray]:
        return {"codes": self.codes, "scales": self.scales}

    def to_blocks(self) -> np.ndarray:
        rows = self.shape[0]
        return assemble([from_groups(self.scales, rows, 1).view(np.float16)],
                        from_groups(self.codes, rows, 32))  # fmt: skip

    def dequantize_groups(self, g0: int, g1: int, out: np.ndarray) -> None:
        dequant.dequant_q8_0(self.codes, self.scales, g0, g1, out)

    few, panels, signed = fewdot.few_q8_0, igemm.panels_q8_0, int(SIGNED_Q8)
    fold = 0 if SIGNED_Q8 else -128  # its codes + 128 in the panels
    vec, ivec = (matvec.as_float, matvec.vec_q8_0), (intdot.as_ints, intdot.vec_q8_0)

    def row_operands(self) -> tuple:
        return self.codes, self.scales

    def panel_operands(self) -> tuple:
        return self.codes, self.scales, self.scales, ONE, NO_BITS, 0, 0

    def float_batch(self, x: np.ndarray, out: np.ndarray) -> None:
        matmat.matmat_q8_0(self.codes, self.scales, x, out, matmat.scratch_for(x.shape[1]))


class NibbleGroups(GroupedWeight):
    """q4_0, q4_1, q5_0 and q5_1: nibbles, float16 scales and mins in groups, and for q5
    each block's 32 fifth bits as one uint32: the same bytes per block as stored. Their
    kernels take the mins as (mins, factor), x = d q + factor m: the format's own mins
    with factor 1, or the scales with factor -8 (q4_0) or -16 (q5_0)."""

    offset: ClassVar[np.float32]  # the factor of a format without mins

    def lay_out(self, blocks: np.ndarray) -> None:
        halves, rest = split(self.fmt, blocks)
        self.scales = to_groups(halves[0], 1)
        self.mins = to_groups(halves[1], 1) if self.layout.has_min else None
        self.bits = None
        if rest.shape[2] == 20:  # q5: 4 bytes of fifth bits, then the 16 bytes of nibbles
            self.bits = to_groups(rest[:, :, :4].copy().view(np.uint32)[:, :, 0], 1)
            rest = rest[:, :, 4:]
        self.codes = to_groups(rest.reshape(self.shape[0], -1), 16)

    def arrays(self) -> dict[str, np.ndarray]:
        out = {"codes": self.codes, "scales": self.scales}
        out |= {} if self.mins is None else {"mins": self.mins}
        return out | ({} if self.bits is None else {"bits": self.bits})

    def to_blocks(self) -> np.ndarray:
        rows = self.shape[0]
        halves = [from_groups(h, rows, 1).view(np.float16) for h in (self.scales, self.mins)
                  if h is not None]  # fmt: skip
        codes = np.ascontiguousarray(from_groups(self.codes, rows, 16))
        if self.bits is not None:
            words = np.ascontiguousarray(from_groups(self.bits, rows, 1)).view(np.uint8)
            codes = np.concatenate([words.reshape(rows, -1, 4), codes.reshape(rows, -1, 16)], 2)
        return assemble(halves, codes.reshape(rows, -1))

    @cached_property
    def mins_factor(self) -> tuple[np.ndarray, np.float32]:
        return (self.scales, self.offset) if self.mins is None else (self.mins, ONE)

    @cached_property
    def fifth_bits(self) -> np.ndarray:
        """The kernels' `bits`: the q5 words, or none per group for q4 (made once)."""
        return np.empty((self.codes.shape[0], 0), np.uint32) if self.bits is None else self.bits

    def operands(self) -> Operands:
        mins, factor = self.mins_factor
        arrays = (self.codes, self.scales, mins, self.fifth_bits)
        return Operands(KIND_OF[self.fmt], self.shape[0], arrays, float(factor))

    def dequantize_groups(self, g0: int, g1: int, out: np.ndarray) -> None:
        mins, factor = self.mins_factor
        if self.bits is None:
            dequant.dequant_q4(self.codes, self.scales, mins, factor, g0, g1, out)
        else:
            dequant.dequant_q5(self.codes, self.scales, mins, factor, self.bits, g0, g1, out)

    few, panels = fewdot.few_q4, igemm.panels_nibbles
    vec, ivec = (matvec.as_nibbles, matvec.vec_q4), (intdot.as_ints, intdot.vec_q4)

    def row_operands(self) -> tuple:
        mins, factor = self.mins_factor
        return self.codes, self.scales, mins, factor, self.fifth_bits

    def panel_operands(self) -> tuple:
        mins, factor = self.mins_factor
        return self.codes, self.scales, mins, factor, self.fifth_bits, 0, 0

    def float_batch(self, x: np.ndarray, out: np.ndarray) -> None:
        mins, factor = self.mins_factor
        scratch = matmat.scratch_for(x.shape[1])
        if self.bits is None:
            matmat.matmat_q4(self.codes, self.scales, mins, factor, x, out, scratch)
        else:
            matmat.matmat_q5(self.codes, self.scales, mins, factor, self.bits, x, out, scratch)


class CQ4_0Weight(NibbleGroups):
    fmt = "q4_0"
    offset = np.float32(-8)
    fold = -8


class CQ4_1Weight(NibbleGroups):
    fmt = "q4_1"


class CQ5_0Weight(NibbleGroups):
    fmt = "q5_0"
    offset = np.float32(-16)
    fold = -16
    vec = matvec.as_five, matvec.vec_q5


class CQ5_1Weight(NibbleGroups):
    fmt = "q5_1"
    vec = matvec.as_five, matvec.vec_q5


class KGroups(GroupedWeight):
    """The K-quants: their GGUF super-blocks as stored (q4_k's and q5_k's code bytes in
    q6_k's order: repack_codes), in groups of 4 rows interleaved block by block; the
    kernels decode them in registers (ggml.py, intdot.rows_k)."""

    def lay_out(self, blocks: np.ndarray) -> None:
        self.blocks = to_groups(blocks, self.layout.nbytes)
        self.code = CODE_OF[self.fmt]
        if self.fmt in K_CODES:
            repack_codes(self.blocks, self.fmt, self.layout.nbytes)

    def arrays(self) -> dict[str, np.ndarray]:
        return {"blocks": self.blocks}

    def to_blocks(self) -> np.ndarray:
        blocks = from_groups(self.blocks, self.shape[0], self.layout.nbytes)
        if self.fmt in K_CODES:  # a copy: from_groups may be a view of self.blocks
            blocks = blocks.copy()
            repack_codes(blocks, self.fmt, self.layout.nbytes, inverse=True)
        return blocks

    def operands(self) -> Operands:
        lay = self.layout
        return Operands(KIND_OF[self.fmt], self.shape[0], (self.blocks,), code=self.code,
                        nbytes=lay.nbytes, weights=lay.weights)  # fmt: skip

    def dequantize_groups(self, g0: int, g1: int, out: np.ndarray) -> None:
        lay = self.layout
        ggml.dequant_ggml(self.blocks, self.code, lay.nbytes, lay.weights, g0, g1, out)

    few, panels = fewdot.few_k, igemm.panels_k
    vec, ivec = (matvec.as_float, ggml.vec_ggml), (intdot.as_ints16, intdot.vec_k)

    def row_operands(self) -> tuple:
        return self.blocks, self.code, self.layout.nbytes

    def vec_operands(self, ints: bool) -> tuple:
        return self.row_operands() + (() if ints else (self.layout.weights,))

    def panel_operands(self) -> tuple:
        return self.blocks, NO_SCALES, NO_SCALES, ONE, NO_BITS, self.code, self.layout.nbytes

    def float_batch(self, x: np.ndarray, out: np.ndarray) -> None:
        lay = self.layout
        matmat.matmat_ggml(self.blocks, self.code, lay.nbytes, lay.weights, x, out,
                           matmat.scratch_for(x.shape[1]))  # fmt: skip


class CQ2_KWeight(KGroups):
    fmt = "q2_k"
    paired = 0  # a scale per 16 weights


class CQ3_KWeight(KGroups):
    fmt = "q3_k"
    paired = 0  # a scale per 16 weights


class CQ4_KWeight(KGroups):
    fmt = "q4_k"


class CQ5_KWeight(KGroups):
    fmt = "q5_k"


class CQ6_KWeight(KGroups):
    fmt = "q6_k"
    paired = 0  # a scale per 16 weights


FORMATS: dict[str, type[Weight]] = {
    cls.fmt: cls
    for cls in (CF32Weight, CF16Weight, CBF16Weight, CQ8_0Weight, CQ4_0Weight, CQ4_1Weight,
                CQ5_0Weight, CQ5_1Weight, CQ2_KWeight, CQ3_KWeight, CQ4_KWeight, CQ5_KWeight,
                CQ6_KWeight)
}  # fmt: skip
