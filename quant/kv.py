"""KV-cache storage formats: one layer's keys or values, (n_kv_heads, slots, head_dim)."""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from .base import QuantError


class KVStore:
    """Keys or values of one layer in float32. Subclasses store another format; attention
    reads them through `read`, and the meter counts `stored_nbytes` of what was read."""

    fmt: ClassVar[str] = "f32"

    def __init__(self, n_kv: int, slots: int, head_dim: int) -> None:
        # np.zeros maps untouched pages lazily: a large context costs memory only when used.
        self.data = np.zeros((n_kv, slots, head_dim), np.float32)

    def arrays(self) -> list[np.ndarray]:
        return [self.data]

    def write(self, s0: int, x: np.ndarray) -> int:
        """Store x (n_kv, T, hd) in slots s0:s0+T; returns the bytes written."""
        self.data[:, s0 : s0 + x.shape[1]] = x
        return self.stored_nbytes(s0, s0 + x.shape[1])

    def read(self, s0: int, s1: int) -> np.ndarray:
        """Slots s0:s1 as float32, (n_kv, s1 - s0, hd)."""
        return self.data[:, s0:s1]

    def stored_nbytes(self, s0: int, s1: int) -> int:
        """Bytes the stored arrays hold for slots s0:s1: what a read of them touches."""
        return sum(a[:, s0:s1].nbytes for a in self.arrays())


KV_FORMATS: dict[str, type[KVStore]] = {"f32": KVStore}


def kv_store_class(fmt: str) -> type[KVStore]:
    try:
        return KV_FORMATS[fmt]
    except KeyError:
        raise QuantError(
            f"unknown KV cache format {fmt!r} (known: {', '.join(KV_FORMATS)})"
        ) from None
