"""The KV cache: per layer, the keys and values of the positions a new token may attend to.

Without a window a layer holds every position up to the cache's capacity. Under a sliding
window W it is a ring of W slots (position p lives in slot p % W), so memory stays bounded
however long generation runs. Attention is order-free once RoPE is applied, so a decode
step attends to the ring's slots as they lie, without reordering them.

Layers may differ: Gemma's sliding layers keep a ring of W, its global layers every
position. All of a cache's stores have one shape (the largest layer's slots: the compiled
kernels address every layer's stores alike); a ring uses its first W slots, and the
untouched pages of the rest are never mapped (quant.kv.lazy_zeros).

Gemma 4's full layers have a head_dim of their own: each layer's stores take its own. Its
last layers share the keys and values of an earlier layer of their kind (Config.kv_source):
they have no stores, read the source's and write none.

A hybrid's recurrent layers (a gated delta net, a short convolution) keep no keys and
values: a `State` of fixed size instead, which every token reads and writes whole. A state
cannot be rewound: `truncate` to an earlier position says False, and a conversation
prefills its history again.
"""

from __future__ import annotations

import os
from typing import NamedTuple

import numpy as np

from llama_arch import Config, state_floats
from llama_np.errors import UsageError
from quant.backends import Backend, numpy_backend
from quant.kv import kv_store_class


def physical_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 1 << 62  # unknown: do not refuse


def layer_slots(config: Config, capacity: int, window: int | None) -> list[int]:
    """Per layer, the slots its keys and values occupy: its window (a ring), else the
    capacity; 0 for a layer that does not attend or reads another's (shared KV).
    `window`: a user's, on every layer (None: the model's own)."""
    out = []
    for i in range(config.n_layers):
        w = config.layer_window(i, window)
        own = config.mixer(i) == "attention" and config.kv_source(i) == i
        out.append(0 if not own else capacity if w is None else w)
    return out


def cache_nbytes(config: Config, capacity: int, window: int | None, fmt: str) -> int:
    """Bytes a cache of this capacity (or window) takes once full, recurrent states
    included."""
    store = kv_store_class(fmt)
    slots = layer_slots(config, capacity, window)
    kv = sum(n * store.slot_nbytes(config.n_kv_heads, config.layer_head_dim(i))
             for i, n in enumerate(slots))  # fmt: skip
    states = sum(4 * state_floats(config, i) for i in range(config.n_layers))
    return 2 * kv + states


class State:
    """A recurrent layer's memory of a sequence, float32, zero at its start: a gated delta
    net's `s` (v_heads, k_dim, v_dim) and its convolution's last kernel - 1 inputs `conv`
    (kernel - 1, channels), oldest first; a short convolution's `conv` alone (`s` empty).
    Every token reads and writes all of it."""

    def __init__(self, config: Config, layer: int) -> None:
        if config.mixer(layer) == "delta":
            d = config.delta
            self.s = np.zeros((d.v_heads, d.k_dim, d.v_dim), np.float32)
            self.conv = np.zeros((d.kernel - 1, d.conv_dim), np.float32)
        else:
            self.s = np.zeros((0, 0, 0), np.float32)
            self.conv = np.zeros((config.conv_kernel - 1, config.dim), np.float32)

    @property
    def nbytes(self) -> int:
        return self.s.nbytes + self.conv.nbytes

    def copy_to(self, other: State) -> None:
        other.s[...] = self.s
        other.conv[...] = self.conv

    def clear(self) -> None:
        self.s[...] = 0
        self.conv[...] = 0


def check_batch_fits(model, batch: int, capacity: int, window: int | None, fmt: str) -> None:
    """Refuse, before anything is allocated, `batch` caches that cannot all fit in memory
    (the weights included)."""
    need = batch * cache_nbytes(model.config, capacity, window, fmt) + model.weights.nbytes
    if need > physical_memory():
        raise UsageError(
            f"{batch} sequences of {capacity:,} positions need {need / 1e9:.1f} GB with the "
            f"weights, more than this machine's {physical_memory() / 1e9:.1f} GB; lower the "
            "batch, -n or -c/--ctx-size"
        )


def as_stored(store, x: np.ndarray) -> np.ndarray:
    """x (T, n_kv, hd) as the store's format keeps it, read back: (n_kv, T, hd) float32."""
    return store.decode([part.transpose(1, 0, 2) for part in store.encode(x)])


class ContextFull(UsageError):
    """A full-attention cache has no room for the next position."""


class Span(NamedTuple):
    """What a step of t new positions (pos..pos+t-1) does in a layer, computed once per
    step by `KVCache.spans`: the same for every layer of one ring size."""

    t: int
    slot: int  # where position `pos` goes (its slot in the ring)
    n_keys: int  # keys the last new position attends to, itself included
    read_nbytes: int  # bytes of stored keys and values the layer's attention reads
    write_nbytes: int  # bytes the layer's append writes


class KVView(NamedTuple):
    """What the new positions of one layer attend to, as float32 (the NumPy kernels)."""

    k: np.ndarray  # (n_kv, L, hd)
    v: np.ndarray  # (n_kv, L, hd)
    positions: np.ndarray | None  # (L,) position of each key; None when all are visible


class KVCache:
    def __init__(
        self,
        config: Config,
        capacity: int,
        window: int | None = None,
        fmt: str = "f32",
        backend: Backend | None = None,
    ) -> None:
        """`window`: a sliding window on every layer (None: the model's own, per layer);
        `backend`: the kernel backend whose memory and layout the stores take (its
        `kv_store`); the NumPy reference's when None."""
        if capacity < 1:
            raise UsageError(f"the context size must be positive, got {capacity}")
        self.window = window  # a user's, on every layer; None: the model's own
        self.windows = [config.layer_window(i, window) for i in range(config.n_layers)]
        self.capacity = capacity  # positions a full-attention layer can hold
        self.source = [config.kv_source(i) for i in range(config.n_layers)]  # whose KV
        own = layer_slots(config, capacity, window)  # each layer's own slots
        self.rings = [own[j] for j in self.source]  # the slots each layer reads
        self.slots = max(self.rings)  # every store's
        self.backend = backend or numpy_backend()
        self.head_shapes = [(config.n_kv_heads, config.layer_head_dim(i))
                            for i in range(config.n_layers)]  # fmt: skip
        need = cache_nbytes(config, capacity, window, fmt)
        if need > physical_memory():
            raise UsageError(
                f"a KV cache of {self.slots:,} positions needs {need / 1e9:.1f} GB, more than "
                "this machine's memory; lower -c/--ctx-size or set --window"
            )
        self.config = config
        attends = [config.mixer(i) == "attention" for i in range(config.n_layers)]
        # the stores of the layers that attend with KV of their own (None for a recurrent
        # or shared one), and the states of those that do not attend (None otherwise)
        shapes = [(n, self.slots, hd) for n, hd in self.head_shapes]
        self.k = [self.backend.kv_store(fmt, shape, True) if n else None
                  for shape, n in zip(shapes, own, strict=True)]  # fmt: skip
        self.v = [self.backend.kv_store(fmt, shape, False) if n else None
                  for shape, n in zip(shapes, own, strict=True)]  # fmt: skip
        self.states = [None if a else State(config, i) for i, a in enumerate(attends)]
        self._views: dict[int, KVView] = {}  # a shared source's last step (shared_view)
        # per layer, the stores' arrays as a compiled kernel reads and writes them in place
        self._arrays = [
            (tuple(k.arrays()), tuple(v.arrays())) if k is not None else None
            for k, v in zip(self.k, self.v, strict=True)
        ]
        self.fmt = fmt
        self.pos = 0  # positions stored so far; the next token has position `pos`

    @property
    def endless(self) -> bool:
        """Every layer that attends is a ring: positions never run out."""
        return all(w is not None for w, k in zip(self.windows, self.k, strict=True) if k)

    def shares(self, layer: int) -> bool:
        """`layer` attends to another layer's keys and values (gemma4's shared KV)."""
        return self.source[layer] != layer

    def room(self) -> int | None:
        """How many more positions fit; None when windows make the cache endless."""
        return None if self.endless else self.capacity - self.pos

    def spans(self, t: int) -> list[Span]:
        """Per layer, the step of positions pos..pos+t-1: where they go, what the last
        attends to and the bytes the layer reads and writes (one Span per ring size);
        ContextFull when a full-attention layer has no room. `advance(t)` moves `pos` once
        every layer is done."""
        p0 = self.pos
        if not self.endless and p0 + t > self.capacity:
            raise ContextFull(
                f"context full: {p0 + t} positions exceed the context size {self.capacity}"
            )
        none = Span(t, 0, 0, 0, 0)  # a layer that does not attend: no keys, no values
        by_kind: dict[tuple, Span] = {}  # one Span per window and head shape
        out: list[Span] = []
        for i, (w, ring, K, V) in enumerate(zip(self.windows, self.rings, self.k, self.v,
                                                strict=True)):  # fmt: skip
            if self.shares(i):  # the source's keys, read; nothing written
                out.append(out[self.source[i]]._replace(write_nbytes=0))
                continue
            if K is None:
                out.append(none)
                continue
            kind = (w, self.head_shapes[i])
            if kind not in by_kind:
                n = p0 + t if w is None else min(p0 + t, w)
                # a batch under a window reads the keys held, then attends to the new ones
                read = min(p0, w) if w is not None and t > 1 else n
                written = t * (K.slot_nbytes(*kind[1]) + V.slot_nbytes(*kind[1]))
                by_kind[kind] = Span(t, p0 % ring, n, K.stored_nbytes(read) + V.stored_nbytes(read),
                                     written)  # fmt: skip
            out.append(by_kind[kind])
        return out

    def arrays(self, layer: int) -> tuple[tuple[np.ndarray, ...], tuple[np.ndarray, ...]]:
        """The arrays of `layer`'s key and value stores, as a compiled kernel takes them: it
        appends the new position at `Span.slot` in place and attends to `Span.n_keys`
        (a shared layer: its source's, which it reads and never appends to)."""
        return self._arrays[self.source[layer]]

    def shared_view(self, layer: int) -> KVView:
        """What a shared layer attends to: its source's view in this step (`update` keeps
        it: a ring may already hold the step's newest keys over the ones a prompt's first
        tokens see)."""
        return self._views[self.source[layer]]

    def update(self, layer: int, span: Span, k: np.ndarray, v: np.ndarray) -> KVView:
        """Append k, v (T, n_kv, hd) of the span's positions to `layer`; return, as float32,
        what those T queries attend to (the NumPy kernels); kept for the layers that share
        it (shared_view)."""
        view = self._update(layer, span, k, v)
        if layer in self.source[layer + 1 :]:
            self._views[layer] = view
        return view

    def _update(self, layer: int, span: Span, k: np.ndarray, v: np.ndarray) -> KVView:
        p0, t, w = self.pos, span.t, self.windows[layer]
        if w is None:
            self.k[layer].write(p0, k)
            self.v[layer].write(p0, v)
            n = p0 + t
            return KVView(self.k[layer].load(0, n), self.v[layer].load(0, n),
                          None if t == 1 else np.arange(n))  # fmt: skip
        if t == 1:  # the ring now holds exactly the keys this token may see
            self._write_ring(layer, p0, k, v)
            n = min(p0 + 1, w)
            return KVView(self.k[layer].load(0, n), self.v[layer].load(0, n), None)
        # A batch under a window: the keys still held (at most W) followed by the new ones
        # (rounded as the store keeps them, as every other read gives them), with positions
        # for the mask; then the newest W positions go into the ring.
        held = min(p0, w)
        slots = np.arange(held)
        held_pos = slots + w * ((p0 - 1 - slots) // w)  # newest position in each slot
        # copies, in (n_kv, L, hd) order: the ring is overwritten next
        K, V = self.k[layer], self.v[layer]
        k_all = np.concatenate([K.load(0, held), as_stored(K, k)], axis=1)
        v_all = np.concatenate([V.load(0, held), as_stored(V, v)], axis=1)
        m = min(t, w)
        self._write_ring(layer, p0 + t - m, k[t - m :], v[t - m :])
        return KVView(k_all, v_all, np.concatenate([held_pos, np.arange(p0, p0 + t)]))

    def _write_ring(self, layer: int, start: int, k: np.ndarray, v: np.ndarray) -> None:
        """Store positions start:start+m (m <= the layer's slots) in their slots, wrapping
        at most once."""
        ring = self.rings[layer]
        s, m = start % ring, k.shape[0]
        first = min(m, ring - s)
        K, V = self.k[layer], self.v[layer]
        K.write(s, k[:first])
        V.write(s, v[:first])
        if first < m:
            K.write(0, k[first:])
            V.write(0, v[first:])

    def fill_random(self, n: int, rng: np.random.Generator) -> None:
        """Start at depth n: random keys and values for positions 0..n-1 (the newest W of
        them under a window), written through the cache's format, and small random
        recurrent states. For benchmarks, which need the KV reads of a deep context, not
        its meaning."""
        if not self.endless and n > self.capacity:
            raise ContextFull(f"depth {n} exceeds the context size {self.capacity}")
        for state in filter(None, self.states):
            state.s[...] = rng.standard_normal(state.s.shape, np.float32) * np.float32(0.1)
            state.conv[...] = rng.standard_normal(state.conv.shape, np.float32)
        for layer, ring in enumerate(self.rings):
            if self.k[layer] is None:  # a recurrent layer: no keys
                continue
            keep = min(n, ring)
            chunk = min(1024, ring)  # bounded temporary memory; a ring wraps once at most
            for p in range(n - keep, n, chunk):
                k, v = rng.standard_normal(
                    (2, min(chunk, n - p), *self.head_shapes[layer]), dtype=np.float32
                )
                self._write_ring(layer, p, k, v)
        self.pos = n

    def truncate(self, n: int) -> bool:
        """Forget every position from n on; False (nothing changed) when a ring has already
        overwritten keys that position n - 1 would need, or a recurrent state has taken in
        the positions after n (a state cannot be rewound)."""
        if n > self.pos:
            raise ValueError(f"cannot truncate to {n}: the cache holds {self.pos} positions")
        if n < self.pos and any(self.states):
            return False
        # a ring has overwritten positions below pos - W; those n - 1 attends to must remain
        for w in self.windows:
            if w is not None and max(0, n - w + 1) < self.pos - w:
                return False
        self.pos = n
        return True

    def advance(self, t: int) -> None:
        self.pos += t

    def reset(self) -> None:
        """Empty, for a new sequence: position 0, recurrent states zero (what keys and
        values the stores hold is never read again)."""
        self.pos = 0
        for state in filter(None, self.states):
            state.clear()

    def copy(self) -> KVCache:
        """A second cache holding the same positions (a prompt prefilled once, continued by
        several sequences): only the slots written so far are copied, and the states."""
        new = KVCache(self.config, self.capacity, self.window, self.fmt, self.backend)
        rings = self.rings + self.rings
        for src, dst, ring in zip(self.k + self.v, new.k + new.v, rings, strict=True):
            if src is not None:
                src.copy_to(dst, min(self.pos, ring))
        for src, dst in zip(self.states, new.states, strict=True):
            if src is not None:
                src.copy_to(dst)
        new.pos = self.pos
        return new

    @property
    def nbytes(self) -> int:
        stores = [a.nbytes for s in self.k + self.v if s is not None for a in s.arrays()]
        return sum(stores) + sum(s.nbytes for s in self.states if s is not None)
