"""KV-cache storage formats: one layer's keys or values.

A store holds, per KV head and slot (position), one head_dim vector in a format (f32,
f16, q8_0) and one of two layouts:

- head-major, (n_kv_heads, slots, head_dim): the keys of one head are one contiguous
  (n, head_dim) matrix, what NumPy's attention multiplies. Position-major storage, whose
  per-head matrices are strided views, measured slower: at 4096 keys on SmolLM2's shape
  one layer's decode attention took 1.35 ms against 0.94 ms head-major (DEVELOPERS.md).
- tiled, (n_kv_heads, slots / 16, head_dim, 16): 16 consecutive slots stored transposed,
  so a compiled kernel computes 16 scores with one vector per element of the query and
  never sums across vector lanes. The compiled backend keeps its keys this way. Reading
  any slot of a tile reads the tile's cache lines, so a read counts whole tiles.
"""

from __future__ import annotations

import mmap
from typing import ClassVar

import numpy as np

from .errors import QuantError
from .floats import f16_to_f32
from .ggml import BLOCK, quantize_q8_0

TILE = 16  # slots per tile in the tiled layout


def lazy_zeros(shape: tuple[int, ...], dtype: type) -> np.ndarray:
    """Zeros whose pages are mapped when first written, in ordinary 4 KiB pages. np.zeros
    would do the first part, but NumPy asks for transparent huge pages for arrays of 4 MiB
    and more, and with the keys stored head-major a short prompt touches one page per head
    and layer: 180 huge-page faults on SmolLM2, ~0.8 s before the first token here (the
    kernel compacts memory to find each 2 MiB page), against ~10 ms in 4 KiB pages, with no
    measurable difference in attention at 4096 keys."""
    if not hasattr(mmap, "MAP_ANONYMOUS"):  # not a POSIX system
        return np.zeros(shape, dtype)
    n = int(np.prod(shape)) * np.dtype(dtype).itemsize
    buf = mmap.mmap(-1, max(n, 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    return np.frombuffer(buf, dtype, n // np.dtype(dtype).itemsize).reshape(shape)


class KVStore:
    """Keys or values of one layer in float32. Subclasses store another format by saying
    how a vector is encoded into their arrays and decoded back; attention reads them
    through `load` (NumPy) or directly (compiled kernels), and the meter counts
    `stored_nbytes` of what was read."""

    fmt: ClassVar[str] = "f32"

    def __init__(self, n_kv: int, slots: int, head_dim: int, tiled: bool = False) -> None:
        self.check(head_dim)
        self.tiled = tiled
        self.n_kv, self.slots, self.head_dim = n_kv, slots, head_dim
        # Untouched pages cost nothing: a large context costs memory only when used.
        self._arrays = [
            lazy_zeros(self._shape(n_kv, slots, width), dtype)
            for width, dtype in self.parts(head_dim)
        ]

    @classmethod
    def check(cls, head_dim: int) -> None:
        """Raise QuantError when this format cannot store vectors of head_dim."""

    @classmethod
    def parts(cls, head_dim: int) -> list[tuple[int, type]]:
        """(width per slot, dtype) of each stored array."""
        return [(head_dim, np.float32)]

    def _shape(self, n_kv: int, slots: int, width: int) -> tuple[int, ...]:
        if self.tiled:
            return (n_kv, -(-slots // TILE), width, TILE)
        return (n_kv, slots, width)

    def arrays(self) -> list[np.ndarray]:
        return self._arrays

    def encode(self, x: np.ndarray) -> list[np.ndarray]:
        """x (T, n_kv, hd) float32 -> one (T, n_kv, width) array per part."""
        return [x]

    def decode(self, parts: list[np.ndarray]) -> np.ndarray:
        """One (n_kv, L, width) array per part -> (n_kv, L, hd) float32."""
        return parts[0]

    @classmethod
    def slot_nbytes(cls, n_kv: int, head_dim: int) -> int:
        """Bytes one position of one layer's keys (or values) occupies."""
        return n_kv * sum(w * np.dtype(t).itemsize for w, t in cls.parts(head_dim))

    @classmethod
    def read_nbytes(cls, n: int, n_kv: int, head_dim: int, tiled: bool = False) -> int:
        """Bytes an attention over slots 0..n-1 reads: the shape rule the speed-of-light
        model uses; `stored_nbytes` counts the same from the arrays."""
        slots = -(-n // TILE) * TILE if tiled else n
        return slots * cls.slot_nbytes(n_kv, head_dim)

    def write(self, s0: int, x: np.ndarray) -> None:
        """Store x (T, n_kv, hd) in slots s0:s0+T."""
        t = x.shape[0]
        if t == 0:
            return
        for a, v in zip(self._arrays, self.encode(x), strict=True):
            if self.tiled:
                s = np.arange(s0, s0 + t)
                a[:, s // TILE, :, s % TILE] = v  # advanced indices first: (T, n_kv, width)
            else:
                a[:, s0 : s0 + t] = v.transpose(1, 0, 2)

    def load(self, s0: int, s1: int) -> np.ndarray:
        """Slots s0:s1 as float32, (n_kv, s1 - s0, hd)."""
        if self.tiled:
            s = np.arange(s0, s1)
            return self.decode(
                [a[:, s // TILE, :, s % TILE].transpose(1, 0, 2) for a in self._arrays]
            )
        return self.decode([a[:, s0:s1] for a in self._arrays])

    def copy_to(self, dst: KVStore, n: int) -> None:
        """Slots 0..n-1 into `dst`, a store of the same format and layout (whole tiles when
        tiled)."""
        end = -(-n // TILE) if self.tiled else n
        for a, b in zip(self._arrays, dst.arrays(), strict=True):
            b[:, :end] = a[:, :end]

    def stored_nbytes(self, n: int) -> int:
        """Bytes an attention over slots 0..n-1 reads from this store (whole tiles when
        tiled): `read_nbytes` for its shape and layout."""
        return self.read_nbytes(n, self.n_kv, self.head_dim, self.tiled)


class F16KVStore(KVStore):
    """Half the bytes of f32. Values beyond float16's range saturate at +-65504."""

    fmt = "f16"

    @classmethod
    def parts(cls, head_dim: int) -> list[tuple[int, type]]:
        return [(head_dim, np.uint16)]  # float16 bit patterns

    def encode(self, x: np.ndarray) -> list[np.ndarray]:
        return [np.clip(x, -65504.0, 65504.0).astype(np.float16).view(np.uint16)]

    def decode(self, parts: list[np.ndarray]) -> np.ndarray:
        return f16_to_f32(parts[0])


class Q8_0KVStore(KVStore):
    """GGML q8_0 blocks of 32 along head_dim: int8 codes and a float16 scale per block."""

    fmt = "q8_0"

    @classmethod
    def check(cls, head_dim: int) -> None:
        if head_dim % BLOCK:
            raise QuantError(f"a q8_0 KV cache needs head_dim divisible by {BLOCK}, got {head_dim}")

    @classmethod
    def parts(cls, head_dim: int) -> list[tuple[int, type]]:
        return [(head_dim, np.int8), (head_dim // BLOCK, np.uint16)]  # codes, float16 scales

    def encode(self, x: np.ndarray) -> list[np.ndarray]:
        t, n_kv, hd = x.shape
        blocks = np.ascontiguousarray(x).reshape(-1, BLOCK)
        with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
            codes, d, _ = quantize_q8_0(blocks)
            d16 = np.clip(d, 0.0, 65504.0).astype(np.float16)
        return [codes.view(np.int8).reshape(t, n_kv, hd), d16.view(np.uint16).reshape(t, n_kv, -1)]

    def decode(self, parts: list[np.ndarray]) -> np.ndarray:
        codes, scales = parts
        n_kv, n, hd = codes.shape
        q = codes.astype(np.float32).reshape(n_kv, n, hd // BLOCK, BLOCK)
        q *= f16_to_f32(scales)[..., None]
        return q.reshape(n_kv, n, hd)


KV_FORMATS: dict[str, type[KVStore]] = {c.fmt: c for c in (KVStore, F16KVStore, Q8_0KVStore)}


def kv_store_class(fmt: str) -> type[KVStore]:
    try:
        return KV_FORMATS[fmt]
    except KeyError:
        raise QuantError(
            f"unknown KV cache format {fmt!r} (known: {', '.join(KV_FORMATS)})"
        ) from None
