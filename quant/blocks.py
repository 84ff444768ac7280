"""The NumPy backend's layout of the GGML block formats (quant.ggml): the readable
reference kernels, one class per format.

In memory each format is integer codes with a float32 scale (and min) per sub-block:
q4_0 and q4_1 keep their nibbles, every other format is decoded once at load to int8
codes (quant.ggml.decode: x = D c + M per sub-block). A float16 -> float32 cast costs NumPy
~2 ns per element, which per weight would cost more than the weight itself, so the scales
are widened at load: q8_0 occupies 9.0 bits per weight in memory, q4_0 5.0, q4_1 6.0,
the decoded formats 8 bits plus their scales, and `nbytes` (what the meter counts) says so.

Layout for the kernels: the rows are cut into panels of about PANEL_WEIGHTS weights, and
each panel is stored transposed, `(cols, rows_in_panel)`, i.e. the panel is `W[panel].T`.
Then, for one sub-block b of inputs, the slab `Q_b` gives the per-sub-block dot products
of every row at once (`x_b @ Q_b`), and the scale is applied to that small result:

    y[r] = sum_b d[r, b] * (x_b . q[r, b]) + offset * d[r, b] * sum(x_b) + m[r, b] * sum(x_b)

For 4-bit formats a panel holds bytes `(cols / 2, rows)`: byte b*16 + j has element b*32 + j
in its low nibble and element b*32 + 16 + j in its high nibble, GGML's order within a block.
The panels of a product are split over quant.threads.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from . import threads
from .base import BlockFormat
from .ggml import assemble, decode, split

# Weights converted per NumPy call. A call costs 3-6 us whatever its size, so small panels
# drown in overhead: 1M weights (a 4 MiB float32 buffer, in L3) measured best here, ahead
# of 256K (L2-sized) by 15% and of 64K by 60% (scripts/bench_kernels.py).
PANEL_WEIGHTS = 1 << 20


def plan_panels(rows: int, cols: int) -> list[tuple[int, int]]:
    """Row ranges of the panels: at most about PANEL_WEIGHTS weights each (but at least 16
    rows), an even number of them so two threads split a matrix evenly."""
    n = max(2, -(-rows * cols // PANEL_WEIGHTS))
    n += n % 2
    per_panel = -(-rows // n)
    step = max(16, (per_panel + 15) // 16 * 16)
    return [(r, min(rows, r + step)) for r in range(0, rows, step)]


class PanelWeight(BlockFormat):
    """What the NumPy layout of every block format shares: panels, scales, the kernels.
    A subclass says how the blocks become the kernels' codes (`kernel_codes`)."""

    offset: ClassVar[float] = 0.0  # q4_0 stores q + 8
    code_bytes: ClassVar[int]  # bytes of codes per sub-block

    def lay_out(self, blocks: np.ndarray) -> None:
        rows, cols = self.shape
        self.sub = self.layout.sub  # weights per scale: the kernels' unit
        self.nb = cols // self.sub
        codes, scales, mins = self.kernel_codes(blocks)
        self.panels: list[tuple[int, int, np.ndarray, np.ndarray, np.ndarray | None]] = []
        for r0, r1 in plan_panels(rows, cols):
            self.panels.append(
                (
                    r0,
                    r1,
                    np.ascontiguousarray(codes[r0:r1].T),  # (nb * code_bytes, rows in panel)
                    np.ascontiguousarray(scales[r0:r1].T, dtype=np.float32),  # (nb, rows)
                    None if mins is None else np.ascontiguousarray(mins[r0:r1].T, np.float32),
                )
            )

    def kernel_codes(self, blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """Blocks (rows, bytes per row) -> codes (rows, nb * code_bytes) uint8, scales and
        mins (rows, nb) float32 (mins None when the format has none): int8 codes, decoded."""
        rows = self.shape[0]
        c, d, m = decode(blocks.reshape(-1, self.layout.nbytes), self.fmt)
        mins = m.reshape(rows, -1) if self.layout.has_min else None
        return c.reshape(rows, -1).view(np.uint8), d.reshape(rows, -1), mins

    # --- storage -------------------------------------------------------------------------
    def arrays(self) -> dict[str, np.ndarray]:
        out = {}
        for i, (_, _, q, d, m) in enumerate(self.panels):
            out[f"codes{i}"], out[f"scales{i}"] = q, d
            if m is not None:
                out[f"mins{i}"] = m
        return out

    @classmethod
    def nbytes_for(cls, shape: tuple[int, int]) -> int:
        """Codes, plus a float32 scale (and min) per sub-block."""
        rows, cols = shape
        per_sub = cls.code_bytes + 4 * (2 if cls.layout.has_min else 1)
        return rows * (cols // cls.layout.sub) * per_sub

    def rows_of(self, part: int) -> np.ndarray:
        """Array `part` (2: codes, 3: scales, 4: mins) of every panel, back to rows."""
        return np.concatenate([t[part].T for t in self.panels])

    # --- codes <-> values ----------------------------------------------------------------
    @classmethod
    def unpack(cls, codes: np.ndarray, out: np.ndarray) -> np.ndarray:
        """Codes of a panel (or a run of its sub-blocks), (nb' * code_bytes, n), to the
        integer values as float32, (nb' * sub, n); no scale applied."""
        np.copyto(out, codes.view(np.int8))
        return out

    def dequantize(self, r0: int = 0, r1: int | None = None) -> np.ndarray:
        r1 = self.shape[0] if r1 is None else r1
        parts = []
        for t0, t1, q, d, m in self.panels:
            a, b = max(r0, t0), min(r1, t1)
            if a >= b:
                continue
            n = b - a
            v = self.unpack(q[:, a - t0 : b - t0], np.empty((self.shape[1], n), np.float32))
            v = v.reshape(self.nb, self.sub, n)
            if self.offset:
                v -= np.float32(-self.offset)
            v = v * d[:, None, a - t0 : b - t0]  # d * q, as gguf.quants multiplies
            if m is not None:
                v = v + m[:, None, a - t0 : b - t0]
            parts.append(v.reshape(self.shape[1], n).T)
        return np.concatenate(parts) if parts else np.empty((0, self.shape[1]), np.float32)

    # --- kernels -------------------------------------------------------------------------
    @classmethod
    def dot_operands(cls, codes: np.ndarray, out: np.ndarray) -> np.ndarray:
        """The float32 operand of the decode kernel's dot products: the values themselves
        (int8 codes), or another linear form of them that is cheaper to produce (q4)."""
        return cls.unpack(codes, out)

    def dot_vector(self, x: np.ndarray) -> np.ndarray:
        """x as the kernel multiplies it with `dot_operands`, per sub-block: (nb, 1, sub)."""
        return x.reshape(-1, 1, self.sub)

    def matvec(self, x: np.ndarray) -> np.ndarray:
        """Per panel: codes to float32 (one cast), the per-sub-block dot products of every
        row at once (one batched matmul), then the scales on that small (nb, n) result."""
        nb, out = self.nb, np.empty(self.shape[0], np.float32)
        xb = self.dot_vector(x)
        sx = x.reshape(nb, self.sub).sum(axis=1)  # per-sub-block sums: the offset, the min

        def panel(t: tuple) -> None:
            t0, t1, q, d, m = t
            v = self.dot_operands(q, threads.scratch((self.shape[1], t1 - t0)))
            v = v.reshape(nb, self.sub, t1 - t0)
            p = np.matmul(xb, v, out=threads.scratch((nb, 1, t1 - t0)))[:, 0]  # (nb, n)
            np.multiply(p, d, out=p)
            y = out[t0:t1]
            np.add.reduce(p, axis=0, out=y)
            if self.offset:  # sum_b d (q - 8) . x = sum_b d q . x - 8 sum_b d sum(x_b)
                y += np.float32(self.offset) * (sx @ d)
            if m is not None:
                y += sx @ m

        threads.for_each(panel, self.panels)
        return out

    def matmul(self, x: np.ndarray) -> np.ndarray:
        """Per panel: dequantize W[panel].T into a float32 buffer, then one GEMM; the
        conversion is shared by all T rows of x."""
        out = np.empty((x.shape[0], self.shape[0]), np.float32)

        def panel(t: tuple) -> None:
            t0, t1, q, d, m = t
            w = self.unpack(q, threads.scratch((self.shape[1], t1 - t0)))
            w = w.reshape(self.nb, self.sub, t1 - t0)
            if self.offset:
                w += np.float32(self.offset)
            w *= d[:, None, :]
            if m is not None:
                w += m[:, None, :]
            np.matmul(x, w.reshape(self.shape[1], t1 - t0), out=out[:, t0:t1])

        threads.for_each(panel, self.panels)
        return out


class Q8_0Weight(PanelWeight):
    fmt = "q8_0"
    code_bytes = 32

    def to_blocks(self) -> np.ndarray:
        return assemble([self.rows_of(3)], self.rows_of(2))


class NibbleWeight(PanelWeight):
    """q4_0 and q4_1 keep their 4-bit codes, two per byte: element j of a block in the low
    nibble of byte j, element j + 16 in the high nibble.

    Unpacking both nibbles costs two integer passes and two casts. The decode kernel needs
    only dot products, and byte = lo + 16 hi, so with a = x[j], b = x[j + 16]:
        lo a + hi b = lo (a - b/16) + byte (b/16)
    It casts the low nibble and the whole byte (one integer pass fewer, a third less time)
    and multiplies them by x transformed once per call. The terms stay as large as the
    direct ones (byte b/16 <= 16 b), so the rounding is that of the direct product."""

    code_bytes = 16

    def kernel_codes(self, blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        halves, codes = split(self.fmt, blocks)
        d, *m = (h.view(np.float16).astype(np.float32) for h in halves)
        return codes.reshape(self.shape[0], -1), d, (m[0] if m else None)

    def to_blocks(self) -> np.ndarray:
        halves = [self.rows_of(3)] + ([self.rows_of(4)] if self.layout.has_min else [])
        return assemble(halves, self.rows_of(2))

    @classmethod
    def unpack(cls, codes: np.ndarray, out: np.ndarray) -> np.ndarray:
        """(nb' * 16, n) bytes -> (nb' * 32, n) float32: per block, 16 low nibbles then 16 high."""
        n = codes.shape[1]
        src, dst = codes.reshape(-1, 16, n), out.reshape(-1, 2, 16, n)
        np.bitwise_and(src, np.uint8(15), out=dst[:, 0], casting="unsafe")
        np.right_shift(src, np.uint8(4), out=dst[:, 1], casting="unsafe")
        return out

    @classmethod
    def dot_operands(cls, codes: np.ndarray, out: np.ndarray) -> np.ndarray:
        n = codes.shape[1]
        src, dst = codes.reshape(-1, 16, n), out.reshape(-1, 2, 16, n)
        low = np.bitwise_and(src, np.uint8(15), out=threads.scratch(src.shape, np.uint8))
        np.copyto(dst[:, 0], low)
        np.copyto(dst[:, 1], src)
        return out

    def dot_vector(self, x: np.ndarray) -> np.ndarray:
        halves = x.reshape(-1, 2, 16)
        b16 = halves[:, 1] * np.float32(1 / 16)
        return np.stack([halves[:, 0] - b16, b16], axis=1).reshape(-1, 1, 32)


class Q4_0Weight(NibbleWeight):
    fmt = "q4_0"
    offset = -8.0


class Q4_1Weight(NibbleWeight):
    fmt = "q4_1"


class DecodedWeight(PanelWeight):
    """q5_0, q5_1 and the K-quants: decoded at load into int8 codes (code_bytes = the
    sub-block) with a float32 scale (and min) per sub-block, so the kernels multiply them
    as they multiply q8_0. The
    stored blocks are kept for export (a view of the file when it is memory-mapped)."""

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        cls.code_bytes = cls.layout.sub  # one int8 code per weight of a sub-block

    def lay_out(self, blocks: np.ndarray) -> None:
        self.raw = blocks
        super().lay_out(blocks)

    def to_blocks(self) -> np.ndarray:
        return self.raw


class Q5_0Weight(DecodedWeight):
    fmt = "q5_0"


class Q5_1Weight(DecodedWeight):
    fmt = "q5_1"


class Q2_KWeight(DecodedWeight):
    fmt = "q2_k"


class Q3_KWeight(DecodedWeight):
    fmt = "q3_k"


class Q4_KWeight(DecodedWeight):
    fmt = "q4_k"


class Q5_KWeight(DecodedWeight):
    fmt = "q5_k"


class Q6_KWeight(DecodedWeight):
    fmt = "q6_k"


BLOCK_FORMATS: dict[str, type[PanelWeight]] = {
    cls.fmt: cls
    for cls in (Q8_0Weight, Q4_0Weight, Q4_1Weight, Q5_0Weight, Q5_1Weight, Q2_KWeight,
                Q3_KWeight, Q4_KWeight, Q5_KWeight, Q6_KWeight)
}  # fmt: skip
