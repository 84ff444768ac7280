"""GGML block formats q8_0, q4_0 and q4_1: blocks of 32 weights along the input dimension,
numerically identical to GGML (and to the `gguf` package's NumPy reference).

    q8_0  x = d * q           q int8,          d float16              8.5 bits/weight
    q4_0  x = d * (q - 8)     q 4-bit (0..15), d float16              4.5
    q4_1  x = d * q + m       q 4-bit,         d, m float16           5.0

At rest (a checkpoint, a GGUF file) the scales are float16. In memory they are widened to
float32 once at load: a float16 -> float32 cast costs NumPy ~2 ns per element, which per
weight would cost more than the weight itself. So q8_0 occupies 9.0 bits per weight in
memory, q4_0 5.0 and q4_1 6.0, and `nbytes` (what the meter counts) says so.

Layout for the kernels: the rows are cut into tiles of `ROWS` rows, and each tile is stored
transposed, `(cols, rows_in_tile)`, i.e. the tile is `W[tile].T`. Then, for one block b of
32 inputs, the 32 x rows_in_tile slab `Q_b` gives the per-block dot products of every row at
once (`x_b @ Q_b`), and the scale is applied to that small result rather than to the tile:

    y[r] = sum_b d[r, b] * (x_b . q[r, b]) + offset * d[r, b] * sum(x_b) + m[r, b] * sum(x_b)

For 4-bit formats a tile holds bytes `(cols / 2, rows)`: byte b*16 + j has element b*32 + j
in its low nibble and element b*32 + 16 + j in its high nibble, GGML's order within a block.
"""

from __future__ import annotations

from typing import ClassVar, Self

import numpy as np

from .base import Weight, Workspace, check_float_matrix
from .errors import QuantError

BLOCK = 32
# Weights converted per NumPy call. A call costs 3-6 us whatever its size, so small tiles
# drown in overhead: 1M weights (a 4 MiB float32 buffer, in L3) measured best here, ahead
# of 256K (L2-sized) by 15% and of 64K by 60% (scripts/bench_kernels.py).
TILE_WEIGHTS = 1 << 20


def plan_tiles(rows: int, cols: int) -> list[tuple[int, int]]:
    """Row ranges of the tiles: at most about TILE_WEIGHTS weights each (but at least 16
    rows), an even number of them so two processes split a matrix evenly."""
    n = max(2, -(-rows * cols // TILE_WEIGHTS))
    n += n % 2
    per_tile = -(-rows // n)
    step = max(16, (per_tile + 15) // 16 * 16)
    return [(r, min(rows, r + step)) for r in range(0, rows, step)]


def np_roundf(n: np.ndarray) -> np.ndarray:
    """C's roundf (half away from zero), as GGML and gguf.quants use it."""
    a = np.abs(n)
    floored = np.floor(a)
    return np.sign(n) * (floored + np.floor(2 * (a - floored)))


class BlockWeight(Weight):
    """What q8_0, q4_0 and q4_1 share (and the GGUF formats decoded to int8 codes,
    quant.ggml.GGMLWeight): tiles, scales, the kernels."""

    block: ClassVar[int] = BLOCK  # weights per block (a scale, and a min, each)
    offset: ClassVar[float] = 0.0  # q4_0 stores q + 8
    has_min: ClassVar[bool] = False  # q4_1 adds a per-block minimum
    code_bytes: ClassVar[int]  # bytes of codes per block (32 or 16)

    def __init__(
        self,
        shape: tuple[int, int],
        codes: np.ndarray,
        scales: np.ndarray,
        mins: np.ndarray | None = None,
    ) -> None:
        """codes (rows, nb * code_bytes) in GGML's byte order, scales and mins (rows, nb)
        as float16 or float32 holding float16 values."""
        super().__init__(shape)
        rows, cols = self.shape
        if cols % self.block:
            raise QuantError(
                f"{self.fmt}: the input dimension {cols} is not a multiple of {self.block}"
            )
        nb = cols // self.block
        if codes.shape != (rows, nb * self.code_bytes) or scales.shape != (rows, nb):
            raise QuantError(
                f"{self.fmt}: codes {codes.shape} / scales {scales.shape} do not fit {shape}"
            )
        self.nb = nb
        self.tiles: list[tuple[int, int, np.ndarray, np.ndarray, np.ndarray | None]] = []
        for r0, r1 in plan_tiles(rows, cols):
            self.tiles.append(
                (
                    r0,
                    r1,
                    np.ascontiguousarray(codes[r0:r1].T),  # (nb * code_bytes, rows in tile)
                    np.ascontiguousarray(scales[r0:r1].T, dtype=np.float32),  # (nb, rows in tile)
                    None if mins is None else np.ascontiguousarray(mins[r0:r1].T, dtype=np.float32),
                )
            )

    # --- storage -------------------------------------------------------------------------
    def arrays(self) -> dict[str, np.ndarray]:
        out = {}
        for i, (_, _, q, d, m) in enumerate(self.tiles):
            out[f"codes{i}"], out[f"scales{i}"] = q, d
            if m is not None:
                out[f"mins{i}"] = m
        return out

    @classmethod
    def nbytes_for(cls, shape: tuple[int, int]) -> int:
        """Codes, plus a float32 scale (and min) per block of 32."""
        rows, cols = shape
        per_block = cls.code_bytes + 4 * (2 if cls.has_min else 1)
        return rows * (cols // cls.block) * per_block

    def export(self) -> dict[str, np.ndarray]:
        """The canonical arrays at rest: codes in GGML byte order, float16 scales (and mins)."""
        out = {
            "codes": np.concatenate([t[2].T for t in self.tiles]),
            "scales": np.concatenate([t[3].T for t in self.tiles]).astype(np.float16),
        }
        if self.has_min:
            out["mins"] = np.concatenate([t[4].T for t in self.tiles]).astype(np.float16)
        return out

    @classmethod
    def from_arrays(cls, shape: tuple[int, int], arrays: dict[str, np.ndarray]) -> Self:
        try:
            return cls(
                shape,
                arrays["codes"],
                arrays["scales"],
                arrays.get("mins") if cls.has_min else None,
            )
        except KeyError as e:
            raise QuantError(f"{cls.fmt}: missing array {e}") from None

    # --- GGUF blocks ---------------------------------------------------------------------
    @classmethod
    def block_dtype(cls) -> np.dtype:
        fields = [("d", "<f2")] + ([("m", "<f2")] if cls.has_min else [])
        return np.dtype([*fields, ("q", "u1", (cls.code_bytes,))])

    @classmethod
    def from_blocks(cls, shape: tuple[int, int], raw: np.ndarray) -> Self:
        """From GGML blocks as stored in GGUF: raw bytes (rows, nb * bytes_per_block)."""
        rows, cols = shape
        blocks = np.ascontiguousarray(raw).view(cls.block_dtype()).reshape(rows, cols // cls.block)
        mins = blocks["m"] if cls.has_min else None
        return cls(shape, blocks["q"].reshape(rows, -1), blocks["d"], mins)

    @classmethod
    def from_raw(cls, shape: tuple[int, int], raw: np.ndarray) -> Self:
        return cls.from_blocks(shape, raw)

    @classmethod
    def random(cls, shape: tuple[int, int], rng: np.random.Generator) -> Self:
        """Random codes; float16 scales ~1e-3 (and mins -8 scales: values centred on 0)."""
        rows, nb = shape[0], shape[1] // cls.block
        codes = rng.integers(0, 256, (rows, nb * cls.code_bytes), dtype=np.uint8)
        scales = (rng.random((rows, nb), dtype=np.float32) * np.float32(1e-3)).astype(np.float16)
        mins = (-8 * scales).astype(np.float16) if cls.has_min else None
        return cls(shape, codes, scales, mins)

    def to_blocks(self) -> np.ndarray:
        """GGML blocks, bytes (rows, nb * bytes_per_block): what gguf.quants.quantize gives."""
        a = self.export()
        rows = self.shape[0]
        blocks = np.empty((rows, self.nb), self.block_dtype())
        blocks["d"] = a["scales"]
        if self.has_min:
            blocks["m"] = a["mins"]
        blocks["q"] = a["codes"].view(np.uint8).reshape(rows, self.nb, self.code_bytes)
        return blocks.view(np.uint8).reshape(rows, -1)

    # --- codes <-> values ----------------------------------------------------------------
    @classmethod
    def unpack(cls, codes: np.ndarray, out: np.ndarray) -> np.ndarray:
        """Codes of a tile (or a run of its blocks), (nb' * code_bytes, n), to the unsigned
        integer values as float32, (nb' * 32, n); no scale applied."""
        raise NotImplementedError

    def dequantize(self, r0: int = 0, r1: int | None = None) -> np.ndarray:
        r1 = self.shape[0] if r1 is None else r1
        parts = []
        for t0, t1, q, d, m in self.tiles:
            a, b = max(r0, t0), min(r1, t1)
            if a >= b:
                continue
            n = b - a
            v = self.unpack(q[:, a - t0 : b - t0], np.empty((self.shape[1], n), np.float32))
            v = v.reshape(self.nb, self.block, n)
            if self.offset:
                v -= np.float32(-self.offset)
            v = v * d[:, None, a - t0 : b - t0]  # d * q, as gguf.quants multiplies
            if m is not None:
                v = v + m[:, None, a - t0 : b - t0]
            parts.append(v.reshape(self.shape[1], n).T)
        return np.concatenate(parts) if parts else np.empty((0, self.shape[1]), np.float32)

    # --- kernels -------------------------------------------------------------------------
    def splits(self) -> list[int]:
        return [t[0] for t in self.tiles] + [self.shape[0]]

    def _tiles_in(self, r0: int, r1: int) -> list[tuple]:
        return [t for t in self.tiles if r0 <= t[0] and t[1] <= r1]

    @classmethod
    def dot_operands(cls, codes: np.ndarray, out: np.ndarray, work: Workspace) -> np.ndarray:
        """The float32 operand of the decode kernel's dot products: the values themselves
        (q8_0), or another linear form of them that is cheaper to produce (q4)."""
        return cls.unpack(codes, out)

    @classmethod
    def dot_vector(cls, x: np.ndarray) -> np.ndarray:
        """x as the kernel multiplies it with `dot_operands`, per block: (nb, 1, 32)."""
        return x.reshape(-1, 1, cls.block)

    def matvec_rows(
        self, x: np.ndarray, r0: int, r1: int, out: np.ndarray, work: Workspace
    ) -> None:
        """Per tile: codes to float32 (one cast), the per-block dot products of every row
        at once (one batched matmul), then the scales on that small (nb, n) result."""
        nb = self.nb
        xb = self.dot_vector(x)
        sx = x.reshape(nb, self.block).sum(axis=1)  # per-block sums, for the offset and the min
        for t0, t1, q, d, m in self._tiles_in(r0, r1):
            n = t1 - t0
            v = self.dot_operands(q, work.get((self.shape[1], n)), work)
            v = v.reshape(nb, self.block, n)
            p = np.matmul(xb, v, out=work.get((nb, 1, n)))[:, 0]  # (nb, n) block dot products
            np.multiply(p, d, out=p)
            y = out[t0 - r0 : t1 - r0]
            np.add.reduce(p, axis=0, out=y)
            if self.offset:  # sum_b d (q - 8) . x = sum_b d q . x - 8 sum_b d sum(x_b)
                y += np.float32(self.offset) * (sx @ d)
            if m is not None:
                y += sx @ m

    def matmul_rows(
        self, x: np.ndarray, r0: int, r1: int, out: np.ndarray, work: Workspace
    ) -> None:
        """Per tile: dequantize W[tile].T into a float32 buffer, then one GEMM; the
        conversion is shared by all T rows of x."""
        for t0, t1, q, d, m in self._tiles_in(r0, r1):
            n = t1 - t0
            w = self.unpack(q, work.get((self.shape[1], n))).reshape(self.nb, self.block, n)
            if self.offset:
                w += np.float32(self.offset)
            w *= d[:, None, :]
            if m is not None:
                w += m[:, None, :]
            np.matmul(x, w.reshape(self.shape[1], n), out=out[:, t0 - r0 : t1 - r0])

    # --- quantization --------------------------------------------------------------------
    @classmethod
    def from_float(cls, w: np.ndarray) -> Self:
        w = check_float_matrix(w, cls.fmt)
        rows, cols = w.shape
        if cols % cls.block:
            raise QuantError(
                f"{cls.fmt}: the input dimension {cols} is not a multiple of {cls.block}"
            )
        blocks = w.reshape(rows, cols // cls.block, cls.block)
        # A subnormal scale has an infinite inverse; GGML computes codes anyway (and the
        # float16 scale is then 0), so the reference's warnings are silenced, not its math.
        with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
            q, d, m = cls.quantize_blocks(blocks)
            d16 = d.astype(np.float16)
            m16 = None if m is None else m.astype(np.float16)
        if not np.isfinite(d16).all() or (m16 is not None and not np.isfinite(m16).all()):
            raise QuantError(
                f"{cls.fmt}: values too large for a float16 block scale "
                f"(|x| up to {np.abs(w).max():.3g})"
            )
        return cls((rows, cols), q, d16, m16)

    @classmethod
    def quantize_blocks(
        cls, blocks: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """blocks (rows, nb, 32) float32 -> codes (rows, nb * code_bytes), d and m (rows, nb)
        float32, by GGML's reference arithmetic."""
        raise NotImplementedError


def pack_nibbles(q: np.ndarray) -> np.ndarray:
    """(rows, nb, 32) values 0..15 -> (rows, nb * 16) bytes: j low, j + 16 high."""
    return (q[..., :16] | (q[..., 16:] << np.uint8(4))).reshape(q.shape[0], -1)


class Q8_0Weight(BlockWeight):
    fmt = "q8_0"
    bits_per_weight = 8.5
    code_bytes = 32

    @classmethod
    def unpack(cls, codes: np.ndarray, out: np.ndarray) -> np.ndarray:
        np.copyto(out, codes.view(np.int8))
        return out

    @classmethod
    def quantize_blocks(cls, blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, None]:
        d = np.abs(blocks).max(axis=-1, keepdims=True) / np.float32(127)
        inv = np.where(d == 0, np.float32(0), np.float32(1) / d)
        q = np_roundf(blocks * inv).astype(np.int8)
        return q.view(np.uint8).reshape(blocks.shape[0], -1), d[..., 0], None


class NibbleWeight(BlockWeight):
    """4-bit codes, two per byte: element j of a block in the low nibble of byte j, element
    j + 16 in the high nibble.

    Unpacking both nibbles costs two integer passes and two casts. The decode kernel needs
    only dot products, and byte = lo + 16 hi, so with a = x[j], b = x[j + 16]:
        lo a + hi b = lo (a - b/16) + byte (b/16)
    It casts the low nibble and the whole byte (one integer pass fewer, a third less time)
    and multiplies them by x transformed once per call. The terms stay as large as the
    direct ones (byte b/16 <= 16 b), so the rounding is that of the direct product."""

    code_bytes = 16

    @classmethod
    def unpack(cls, codes: np.ndarray, out: np.ndarray) -> np.ndarray:
        return unpack_nibbles(codes, out)

    @classmethod
    def dot_operands(cls, codes: np.ndarray, out: np.ndarray, work: Workspace) -> np.ndarray:
        n = codes.shape[1]
        src = codes.reshape(-1, 16, n)
        dst = out.reshape(-1, 2, 16, n)
        low = np.bitwise_and(src, np.uint8(15), out=work.get(src.shape, np.uint8))
        np.copyto(dst[:, 0], low)
        np.copyto(dst[:, 1], src)
        return out

    @classmethod
    def dot_vector(cls, x: np.ndarray) -> np.ndarray:
        halves = x.reshape(-1, 2, 16)
        b16 = halves[:, 1] * np.float32(1 / 16)
        return np.stack([halves[:, 0] - b16, b16], axis=1).reshape(-1, 1, BLOCK)


class Q4_0Weight(NibbleWeight):
    fmt = "q4_0"
    bits_per_weight = 4.5
    offset = -8.0

    @classmethod
    def quantize_blocks(cls, blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, None]:
        imax = np.abs(blocks).argmax(axis=-1)[..., None]
        d = np.take_along_axis(blocks, imax, axis=-1) / np.float32(-8)  # the largest |x| -> -8
        inv = np.where(d == 0, np.float32(0), np.float32(1) / d)
        q = np.trunc(blocks * inv + np.float32(8.5)).astype(np.uint8).clip(0, 15)
        return pack_nibbles(q), d[..., 0], None


class Q4_1Weight(NibbleWeight):
    fmt = "q4_1"
    bits_per_weight = 5.0
    has_min = True

    @classmethod
    def quantize_blocks(cls, blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        lo = blocks.min(axis=-1, keepdims=True)
        d = (blocks.max(axis=-1, keepdims=True) - lo) / np.float32(15)
        inv = np.where(d == 0, np.float32(0), np.float32(1) / d)
        q = np.trunc((blocks - lo) * inv + np.float32(0.5)).astype(np.uint8).clip(0, 15)
        return pack_nibbles(q), d[..., 0], lo[..., 0]


def unpack_nibbles(codes: np.ndarray, out: np.ndarray) -> np.ndarray:
    """(nb' * 16, n) bytes -> (nb' * 32, n) float32: per block, 16 low nibbles then 16 high."""
    n = codes.shape[1]
    src = codes.reshape(-1, 16, n)
    dst = out.reshape(-1, 2, 16, n)
    np.bitwise_and(src, np.uint8(15), out=dst[:, 0], casting="unsafe")
    np.right_shift(src, np.uint8(4), out=dst[:, 1], casting="unsafe")
    return out
