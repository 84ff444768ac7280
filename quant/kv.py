"""KV-cache storage formats: one layer's keys or values.

Stored head-major, (n_kv_heads, slots, head_dim): the keys of one head are one contiguous
(n, head_dim) matrix, which is what attention multiplies. Position-major storage, whose
per-head matrices are strided views, measured slower: at 4096 keys on SmolLM2's shape, one
layer's decode attention took 1.35 ms against 0.94 ms head-major (see DEVELOPERS.md). A
decode step writes n_kv rows of head_dim instead of one row, which costs nothing
measurable.
"""

from __future__ import annotations

import functools
import mmap
from typing import ClassVar

import numpy as np

from .blocks import BLOCK, Q8_0Weight
from .errors import QuantError
from .floats import f16_to_f32


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
    """Keys or values of one layer in float32. Subclasses store another format; attention
    reads them through `read`, and the meter counts `stored_nbytes` of what was read."""

    fmt: ClassVar[str] = "f32"

    def __init__(self, n_kv: int, slots: int, head_dim: int) -> None:
        # Untouched pages cost nothing: a large context costs memory only when used.
        self.data = lazy_zeros((n_kv, slots, head_dim), np.float32)

    def arrays(self) -> list[np.ndarray]:
        return [self.data]

    @classmethod
    def slot_nbytes(cls, n_kv: int, head_dim: int) -> int:
        """Bytes one position of one layer's keys (or values) occupies: the shape rule the
        speed-of-light model uses; `stored_nbytes` must agree."""
        return n_kv * head_dim * 4

    def write(self, s0: int, x: np.ndarray) -> int:
        """Store x (T, n_kv, hd) in slots s0:s0+T; returns the bytes written."""
        self.data[:, s0 : s0 + x.shape[0]] = x.transpose(1, 0, 2)
        return self.stored_nbytes(s0, s0 + x.shape[0])

    def read(self, s0: int, s1: int) -> np.ndarray:
        """Slots s0:s1 as float32, (n_kv, s1 - s0, hd)."""
        return self.data[:, s0:s1]

    def stored_nbytes(self, s0: int, s1: int) -> int:
        """Bytes the stored arrays hold for slots s0:s1: what a read of them touches."""
        return (s1 - s0) * self._slot_bytes

    @functools.cached_property
    def _slot_bytes(self) -> int:
        """Bytes one slot occupies, from the arrays themselves (all slots are alike)."""
        return sum(a[:, 0:1].nbytes for a in self.arrays())


class F16KVStore(KVStore):
    """Half the bytes of f32. Values beyond float16's range saturate at +-65504."""

    fmt = "f16"

    def __init__(self, n_kv: int, slots: int, head_dim: int) -> None:
        self.data = lazy_zeros((n_kv, slots, head_dim), np.uint16)  # float16 bit patterns

    @classmethod
    def slot_nbytes(cls, n_kv: int, head_dim: int) -> int:
        return n_kv * head_dim * 2

    def write(self, s0: int, x: np.ndarray) -> int:
        half = np.clip(x, -65504.0, 65504.0).astype(np.float16)
        self.data[:, s0 : s0 + x.shape[0]] = half.view(np.uint16).transpose(1, 0, 2)
        return self.stored_nbytes(s0, s0 + x.shape[0])

    def read(self, s0: int, s1: int) -> np.ndarray:
        return f16_to_f32(self.data[:, s0:s1])


class Q8_0KVStore(KVStore):
    """GGML q8_0 blocks of 32 along head_dim: int8 codes and a float16 scale per block."""

    fmt = "q8_0"

    def __init__(self, n_kv: int, slots: int, head_dim: int) -> None:
        if head_dim % BLOCK:
            raise QuantError(f"a q8_0 KV cache needs head_dim divisible by {BLOCK}, got {head_dim}")
        self.codes = lazy_zeros((n_kv, slots, head_dim), np.int8)
        self.scales = lazy_zeros((n_kv, slots, head_dim // BLOCK), np.uint16)  # float16 bits

    def arrays(self) -> list[np.ndarray]:
        return [self.codes, self.scales]

    @classmethod
    def slot_nbytes(cls, n_kv: int, head_dim: int) -> int:
        return n_kv * (head_dim + 2 * (head_dim // BLOCK))

    def write(self, s0: int, x: np.ndarray) -> int:
        t, n_kv, hd = x.shape
        blocks = np.ascontiguousarray(x).reshape(t * n_kv, hd // BLOCK, BLOCK)
        with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
            codes, d, _ = Q8_0Weight.quantize_blocks(blocks)
            d16 = np.clip(d, 0.0, 65504.0).astype(np.float16)
        self.codes[:, s0 : s0 + t] = codes.view(np.int8).reshape(t, n_kv, hd).transpose(1, 0, 2)
        self.scales[:, s0 : s0 + t] = d16.view(np.uint16).reshape(t, n_kv, -1).transpose(1, 0, 2)
        return self.stored_nbytes(s0, s0 + t)

    def read(self, s0: int, s1: int) -> np.ndarray:
        n_kv, _, hd = self.codes.shape
        q = self.codes[:, s0:s1].astype(np.float32).reshape(n_kv, s1 - s0, hd // BLOCK, BLOCK)
        q *= f16_to_f32(self.scales[:, s0:s1])[..., None]
        return q.reshape(n_kv, s1 - s0, hd)


KV_FORMATS: dict[str, type[KVStore]] = {c.fmt: c for c in (KVStore, F16KVStore, Q8_0KVStore)}


def kv_store_class(fmt: str) -> type[KVStore]:
    try:
        return KV_FORMATS[fmt]
    except KeyError:
        raise QuantError(
            f"unknown KV cache format {fmt!r} (known: {', '.join(KV_FORMATS)})"
        ) from None
