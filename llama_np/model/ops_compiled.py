"""The forward pass's operations on the compiled backend: for one token (decode) each is one
compiled call, the matrix product with its RMSNorm, SwiGLU or residual addition fused in
(quant.compiled.ops.prologue), and all the decoder blocks of a decode step can run as one
call (`decode_layers`: quant.compiled.layers; a few sequences' step: `decode_batch`,
quant.compiled.fewlayers). Several tokens (a batch's step, a prompt) run one product of
all their rows per matrix (`batch_product`: quant.compiled.weights' matmat_into) and
attention in compiled calls too (`attention_batch`, `prompt_attention`): a prompt calls
no BLAS, whose spinning threads would take a core from numba's."""

from __future__ import annotations

import weakref
from collections.abc import Sequence

import numba
import numpy as np

from bench.meter import ATTN, KV, MLP, NORMS, STATE, WAITS
from llama_arch import Config
from llama_np.model.kvcache import KVCache, Span
from llama_np.model.ops import NumpyOps, QKNorms, Residual, Rotary, top_k
from quant import Matrix
from quant.compiled import attention, fewlayers, kinds, layers, ops, recurrent, team
from quant.compiled.experts import experts_batch
from quant.compiled.fewdot import FEW
from quant.compiled.weights import CompiledMatrix, f32_stack_into

INT_BITS = {"f32": 0, "int8": 8, "int16": 16}  # decode_layers' `ints`, by dot
# the meter's category of what each phase of decode_layers reads (step_seconds)
PHASE_CATEGORY = {"qkv": ATTN, "attention": KV, "o": ATTN,
                  "o residual": NORMS, "gate_up": MLP, "down": MLP,
                  "down residual": NORMS, "router": MLP,
                  "experts gate_up": MLP, "experts down": MLP,
                  "experts add": NORMS, "ple gate": MLP, "ple proj": MLP,
                  "ple add": NORMS}  # fmt: skip
# tokens at most whose experts run as (token, expert) pairs (quant.compiled.experts); more
# (a prompt): one batch product per chosen expert, its tokens' rows (igemm's panels)
PAIRED = 64


def vector_product(w: Matrix, x: np.ndarray, out: np.ndarray, mode: int, norm: np.ndarray,
            eps: float, add: bool, dot: str) -> None:  # fmt: skip
    """out (=, or += when add) W @ prologue(x), x multiplied as `dot`: one kernel for a
    compiled matrix; for a stack of matrices in several formats, the prologue once, then
    one kernel per part."""
    if w.fused:
        w.matvec_into(x, out, norm, eps, mode, add, dot)
        return
    h, r0 = ops.prepare(x, norm, eps, mode), 0
    for p in w.leaves():
        r1 = r0 + p.shape[0]
        p.matvec_into(h, out[r0:r1], ops.NO_NORM, ops.ZERO, ops.PLAIN, add, dot)
        r0 = r1


def batch_product(w: Matrix, x: np.ndarray, into: np.ndarray | None, dot: str) -> np.ndarray:
    """x (B, cols) @ W.T, added into `into` (the residual stream, in place) or new, x's
    vectors multiplied as `dot`: a compiled matrix's matmat_into; a stack of f32 parts in
    one call (f32_stack_into), another stack's parts in turn."""
    add = into is not None
    out = into if add else np.empty((x.shape[0], w.shape[0]), np.float32)
    if w.fused:
        w.matmat_into(x, out, add, dot)
    elif not f32_stack_into(w.leaves(), x, out, add):
        parts = np.concatenate([p.matmul(x, dot) for p in w.leaves()], axis=1)
        if not add:
            return parts
        out += parts
    return out


def prepared(x: np.ndarray, norm: np.ndarray, eps: float, mode: int) -> np.ndarray:
    """The prologue of every row, as decode runs it on one (ops.prepare_rows_shared)."""
    half = mode in (ops.SWIGLU, ops.GEGLU)
    out = np.empty((x.shape[0], x.shape[1] // 2 if half else x.shape[1]), np.float32)
    ops.prepare_rows_shared(np.ascontiguousarray(x), norm, np.float32(eps), mode, out)
    return out


NO_VECTOR = np.zeros(0, np.float32)  # a norm a family has not: what the kernels take


def scores_scale(c: Config) -> np.float32:
    """The attention scores' scale: the family's, else 1 / sqrt(head_dim) in float32."""
    if c.attn_scale is not None:
        return np.float32(c.attn_scale)
    return np.float32(1) / np.sqrt(np.float32(c.head_dim))


def attention_spec(c: Config, qk: QKNorms) -> tuple:
    """A layer's attention.spec_of: its q and k norms, the scale, the soft-cap."""
    q = NO_VECTOR if qk.q is None else qk.q
    k = NO_VECTOR if qk.k is None else qk.k
    return attention.spec_of(q, k, c.norm_eps, scores_scale(c), c.attn_softcap or 0.0)


def layer_form(c: Config) -> tuple:
    """layers.decode_layers' `form`: the prologue before attention and the MLP, the MLP's
    gate, whether sub-blocks' outputs are normed, the residual multiplier."""
    pre = ops.NORM if c.pre_norm else ops.PLAIN
    return pre, ops.GATED[c.mlp_act], c.post_norm, np.float32(c.residual_scale)


class PackedLayers:
    """A model's decoder blocks as quant.compiled.layers.decode_layers takes them, packed
    once: a table of every product's operands, which rows each layer's products are, the
    norms and biases stacked by layer; and, per KV cache, the addresses of its layers."""

    def __init__(self, blocks: Sequence, c: Config) -> None:
        """`blocks`: llama_np.model.transformer.Layer, each product in a compiled format. A
        mixture of experts' layer: its router's row, then each expert's gate_up and down
        rows (`routers`: the router's row and the rows from one expert to the next; plan:
        expert 0's)."""
        operands, self.plan = [], np.zeros((len(blocks), 6, 2), np.int64)
        self.routers = np.zeros((len(blocks), 2), np.int64)
        for i, b in enumerate(blocks):
            mlp = (b.w_gate_up, b.w_down) if b.experts is None else (None, None)
            first = b.wqkv if b.mixer is None else b.mixer.w_in
            for j, w in enumerate((first, b.wo, *mlp, b.ple_gate, b.ple_proj)):
                if w is not None:  # (plan rows of none: 0:0, empty)
                    self.plan[i, j] = len(operands), len(operands) + len(w.leaves())
                    operands += [p.operands() for p in w.leaves()]
            if b.experts is not None:
                self.routers[i] = len(operands), stride_of(b.experts)
                operands.append(b.experts.router.operands())
                pairs = zip(b.experts.gate_up, b.experts.down, strict=True)
                for e, (gate_up, down) in enumerate(pairs):
                    if e == 0:
                        n = len(operands)
                        self.plan[i, 2] = n, n + len(gate_up.leaves())
                        self.plan[i, 3] = self.plan[i, 2, 1], n + self.routers[i, 1]
                    operands += [p.operands() for p in (*gate_up.leaves(), *down.leaves())]
        self.experts = layers.moe_spec(c.n_experts, c.experts_per_token, c.norm_topk)
        self.table = layers.table(operands)
        unused = np.zeros(c.dim, np.float32)  # a norm the family has not: never read
        norms = [(b.attn_norm, b.mlp_norm, b.attn_post_norm, b.mlp_post_norm, b.ple_norm)
                 for b in blocks]  # fmt: skip
        self.norms = np.array([[unused if v is None else v for v in n] for n in norms],
                              np.float32)  # (L, 5, dim)  # fmt: skip
        self.quantized = bool((self.table.rows[:, layers.KIND] >= kinds.Q8_0).any())
        bias = [b.qkv_bias for b in blocks]
        self.biases = (np.zeros((len(blocks), 0), np.float32) if bias[0] is None
                       else np.stack(bias).astype(np.float32))  # fmt: skip
        scales = np.array([scores_scale(c.at(i)) for i in range(len(blocks))], np.float32)
        self.spec = attention.spec_of(rows_of([b.q_norm for b in blocks]),
                                      rows_of([b.k_norm for b in blocks]), c.norm_eps, scales,
                                      c.attn_softcap or 0.0)  # fmt: skip
        self.form = layer_form(c)
        self.mixing, self._vectors = mixing_of(blocks, c)
        scalars = [b.layer_scalar for b in blocks if b.layer_scalar is not None]
        self.scalars = np.concatenate(scalars).astype(np.float32) if scalars else NO_VECTOR
        # each layer's room for its per-layer input's gate product, then its input: made
        # once, refilled each step (per_layer); (L, 0) for a family without
        self._inputs = np.zeros((len(blocks), 2 * c.ple_dim), np.float32)
        self.phase_names = (layers.MOE_PHASE_NAMES if self.experts[0] else
                            layers.LAYERED_PHASE_NAMES if c.ple_dim or scalars else
                            layers.PHASE_NAMES)  # fmt: skip
        self.attends = int(np.argmin(self.mixing[0] != layers.ATTENTION))  # a layer that does
        self.weights = layers.Weights(self.table.rows, self.table.factors, self.plan, self.norms,
                                      self.biases)  # fmt: skip
        self._kv: weakref.WeakKeyDictionary[KVCache, np.ndarray] = weakref.WeakKeyDictionary()

    @staticmethod
    def packable(blocks: Sequence) -> bool:
        """Whether every product has compiled kernels over 2-D C-contiguous arrays (what
        the table can name), and a mixture of experts' experts are each laid out alike;
        if not, decode runs the blocks call by call."""
        if any(b.experts is not None and stride_of(b.experts) is None for b in blocks):
            return False
        parts = [p for b in blocks for w in b.matrices() for p in w.leaves()]
        return all(isinstance(p, CompiledMatrix) for p in parts) and all(
            layers.addressable(a) for p in parts for a in p.operands().arrays
        )

    def kv_addresses(self, cache: KVCache) -> np.ndarray:
        """(layers, arrays of a key store + of a value store): where each layer's are; a
        recurrent layer's row: its state's conv and s."""
        at = self._kv.get(cache)
        if at is None:
            keys, values = cache.arrays(self.attends)
            at = np.zeros((len(self.plan), len(keys + values)), np.int64)
            for i, state in enumerate(cache.states):
                if state is None:
                    k, v = cache.arrays(i)
                    at[i] = [layers.address(a) for a in k + v]
                else:
                    at[i, :2] = layers.address(state.conv), layers.address(state.s)
            self._kv[cache] = at
        return at

    def per_layer(self, ple: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        """decode_layers' `per_layer` for a token's per-layer inputs ple (1, layers, ple_dim)
        (None: a model without): each layer's room for its gate's product, then its input;
        and the layers' scalars."""
        if ple is not None:
            self._inputs[:, ple.shape[2] :] = ple[0]
        return self._inputs, self.scalars


def layout_and_width(stores: tuple) -> tuple[np.ndarray, int]:
    """A layer's (keys, values) arrays as layers.attend_batch takes them: their layout
    (layers.layout_of) and head_dim."""
    return layers.layout_of(*stores), stores[1][0].shape[2]


def rows_of(vectors: list) -> np.ndarray:
    """Vectors of any widths as the rows of one (L, widest) float32 array, zeros past each
    (None: a row of zeros): a layer's norms, read as wide as its own (layers.layer_spec)."""
    out = np.zeros((len(vectors), max((len(v) for v in vectors if v is not None), default=0)),
                   np.float32)  # fmt: skip
    for i, v in enumerate(vectors):
        if v is not None:
            out[i, : len(v)] = v
    return out


def shapes_of(blocks: Sequence, c: Config) -> np.ndarray:
    """mixing's shapes (layers.HEAD_DIM...K_NORMS): each layer's attention shape, as its
    Config.at(i) and norms give it (a recurrent layer's: unread)."""
    out = np.zeros((len(blocks), 6), np.int64)
    for i, b in enumerate(blocks):
        at = c.at(i)
        out[i, [layers.HEAD_DIM, layers.HALF, layers.Q_DIM]] = at.head_dim, at.rotary // 2, at.q_dim
        out[i, layers.V_NORM] = c.v_norm and c.kv_source(i) == i
        out[i, layers.Q_NORMS] = 0 if b.q_norm is None else len(b.q_norm)
        out[i, layers.K_NORMS] = 0 if b.k_norm is None else len(b.k_norm)
    return out


MIXER_KINDS = {"attention": layers.ATTENTION, "delta": layers.DELTA, "conv": layers.CONV}


def mixing_of(blocks: Sequence, c: Config) -> tuple[tuple, list[np.ndarray]]:
    """decode_layers' `mixing` (layers.decode_layers) for these blocks, and the arrays its
    addresses name (to be kept alive)."""
    kinds = np.array([MIXER_KINDS[c.mixer(i)] for i in range(len(blocks))], np.int64)
    at, keep = np.zeros((len(blocks), 4), np.int64), []
    for i, b in enumerate(blocks):
        m = b.mixer
        vectors = [] if m is None else [m.conv]
        vectors += [m.dt_bias, m.a, m.norm] if m is not None and m.kind == "delta" else []
        for j, v in enumerate(vectors):
            keep.append(np.ascontiguousarray(v, np.float32))
            at[i, j] = layers.address(keep[-1])
    d = c.delta
    dims = np.zeros(7, np.int64)
    if d is not None:
        dims[: layers.CONV_KERNEL] = d.k_heads, d.v_heads, d.k_dim, d.v_dim, d.kernel
    dims[layers.CONV_KERNEL :] = c.conv_kernel, c.attn_gate
    heads = np.array([d.key_head(j) for j in range(d.v_heads)] if d else [0], np.int64)
    scale = np.float32(1 / np.sqrt(d.k_dim)) if d else np.float32(1)
    return (kinds, at, dims, heads, scale, shapes_of(blocks, c)), keep


def stride_of(experts) -> int | None:
    """Table rows from one expert to the next (its gate_up's parts and its down's), or None
    when the experts' matrices are not all cut in the same parts."""
    pairs = zip(experts.gate_up, experts.down, strict=True)
    strides = {len(g.leaves()) + len(d.leaves()) for g, d in pairs}
    firsts = {len(g.leaves()) for g in experts.gate_up}
    return strides.pop() if len(strides) == 1 and len(firsts) == 1 else None


def layer_angles(rots: list) -> tuple[np.ndarray, np.ndarray]:
    """Each layer's RoPE cos and sin at one position, (L, widest rotary / 2) each, from its
    per-layer Rotary (zeros past a narrower layer's: gemma4's two head sizes): the
    distinct ones (one per kind of layer) stacked once, then taken layer by layer
    (np.stack over every layer cost ~25 us a token)."""
    distinct = list(dict.fromkeys(rots))  # a Rotary hashes by identity
    if len(distinct) == 1:
        return (np.repeat(distinct[0].cos[:1], len(rots), axis=0),
                np.repeat(distinct[0].sin[:1], len(rots), axis=0))  # fmt: skip
    at = {r: k for k, r in enumerate(distinct)}
    which = [at[r] for r in rots]
    cos = rows_of([r.cos[0] for r in distinct])
    sin = rows_of([r.sin[0] for r in distinct])
    return cos[which], sin[which]


def span_kinds(windows: list) -> np.ndarray | None:
    """Per layer, which of at most two spans its attention takes (0: layer 0's window,
    1: the other); None for more than two windows."""
    others = {w for w in windows if w != windows[0]}
    if len(others) > 1:
        return None
    return np.array([0 if w == windows[0] else 1 for w in windows], np.int64)


class CompiledOps(NumpyOps):
    def __init__(self, dot: str) -> None:
        self.dot = dot  # x in quantized decode products: "f32", "int8", "int16" (the backend's)
        self.one_call = True  # decode's blocks in one call; False: call by call (to compare)
        self.team: int | None = None  # iterations of its parallel loop (None: the threads)
        self._packed: tuple[Sequence, PackedLayers | None] | None = None
        self._kv: weakref.WeakKeyDictionary[KVCache, tuple] = weakref.WeakKeyDictionary()
        self._tables: dict[int, tuple] = {}  # a mixture of experts' layers (_experts_table)
        # the last one-call step's timers (decode_layers, decode_batch): sync, threads, the
        # names of a layer's phases, the layers' mixer kinds
        self.last_step: tuple[np.ndarray, int, tuple, np.ndarray] | None = None
        self._heads: np.ndarray | None = None  # a delta net's key head of each value head

    def forget(self) -> None:
        self._packed, self._tables = None, {}

    def packed(self, c: Config, blocks: Sequence) -> PackedLayers | None:
        """`blocks` packed for decode_layers (once per model), or None when a product is
        in a format without a compiled kernel."""
        if self._packed is None or self._packed[0] is not blocks:
            # a model none of whose layers attends runs call by call (the step takes one's
            # KV stores' format), as would gemma4's layers with experts
            attends = any(c.mixer(i) == "attention" for i in range(len(blocks)))
            moe = c.layered and c.n_experts > 1
            one = PackedLayers.packable(blocks) and attends and not moe
            self._packed = (blocks, PackedLayers(blocks, c) if one else None)
        return self._packed[1]

    def decode_layers(
        self, c: Config, blocks: Sequence, x: np.ndarray, cache: KVCache, rots: list,
        spans: list, chosen: np.ndarray, ple: np.ndarray | None = None,
    ) -> bool:  # fmt: skip
        """One token through every decoder block in one compiled call, x (1, dim) in place,
        a mixture of experts' choices into chosen (layers, k); False (nothing done) when
        the blocks cannot be packed. rots, spans: per layer; ple (1, layers, ple_dim):
        gemma4's per-layer inputs."""
        packed = self.packed(c, blocks) if self.one_call else None
        if packed is None or x.shape[0] != 1:
            return False
        keys, values = cache.arrays(packed.attends)
        cos, sin = layer_angles(rots)
        slots = np.array([-1 if cache.shares(i) else s.slot for i, s in enumerate(spans)],
                         np.int64)  # (a shared KV layer appends nothing)  # fmt: skip
        n_keys = np.array([s.n_keys for s in spans], np.int64)
        threads = self.team or numba.get_num_threads()
        stores = layers.Stores(layers.layout_of(keys, values), packed.kv_addresses(cache), slots,
                               n_keys)  # fmt: skip
        moe = layers.Experts(packed.experts, packed.routers, chosen)
        sync = layers.decode_layers(x[0], packed.weights, np.float32(c.norm_eps), packed.form,
                                    layers.Angles(cos, sin, packed.spec), stores, self.ints,
                                    threads, moe, packed.mixing,
                                    packed.per_layer(ple))  # fmt: skip
        self.last_step = (sync, threads, packed.phase_names, packed.mixing[0])
        return True

    def step_seconds(self) -> dict[str, float]:
        """The last one-call decode step's time by its phases' own timers (team.py): the
        threads' work per phase, summed by the meter's category of what the phase reads
        (the residual adds under NORMS), and their waits at the phases' barriers."""
        sync, threads, names, kinds = self.last_step
        work, waits = team.phase_seconds(sync, threads)
        out = dict.fromkeys([*PHASE_CATEGORY.values(), STATE], 0.0)
        for k, w in enumerate(work):
            name, layer = names[k % len(names)], k // len(names)
            recurrent = name == "attention" and kinds[layer] != layers.ATTENTION
            out[STATE if recurrent else PHASE_CATEGORY[name]] += float(w)
        out[WAITS] = float(waits.sum())
        return out

    def decode_batch(
        self, c: Config, blocks: Sequence, x: np.ndarray, caches: list, rots: list, spans: list
    ) -> bool:
        """One token of each of B <= FEW sequences through every decoder block in one
        compiled call (fewlayers.decode_few), x (B, dim) in place; False (nothing done)
        when the blocks cannot be packed, B is 1 or more than FEW, the caches' layouts or
        windows differ (or take more than two windows), a quantized product would
        multiply x in float32, or the layers differ in shape (gemma4: Config.layered)
        (the calls one by one run those). rots, spans: per sequence, per layer."""
        packed = self.packed(c, blocks) if self.one_call else None
        if packed is None or not 1 < x.shape[0] <= FEW or (packed.quantized and not self.ints):
            return False
        if c.layered:  # (decode_few takes one head_dim per span, a slot per span)
            return False
        if packed.experts[0]:  # a batch groups its tokens by expert: the calls one by one
            return False
        if not (x.flags.c_contiguous and x.flags.writeable):
            return False
        layouts = [self.kv_layout(cache) for cache in caches]
        windows = caches[0].windows
        kind = span_kinds(windows)
        if (
            len({shapes for shapes, _ in layouts}) != 1
            or kind is None
            or any(cache.windows != windows for cache in caches)
        ):
            return False
        attends = np.array([s is None for s in caches[0].states])
        # a layer of each span kind that attends (none of kind 1: any, its span unread)
        first = [int(np.argmax(((kind == j) if (kind[attends] == j).any() else 1) & attends))
                 for j in (0, 1)]  # fmt: skip
        slots = np.array([[s[i].slot for s in spans] for i in first], np.int64)  # (2, B)
        ns = np.array([[s[i].n_keys for s in spans] for i in first], np.int64)
        angles = [layer_angles(r) for r in rots]  # per sequence
        cos = np.stack([a[0] for a in angles], axis=1)  # (L, B, rotary / 2)
        sin = np.stack([a[1] for a in angles], axis=1)
        threads = self.team or numba.get_num_threads()
        stores = layers.Stores(layers.layout_of(*caches[0].arrays(packed.attends)),
                               np.stack([at for _, at in layouts], axis=1), slots,
                               ns)  # fmt: skip
        sync = fewlayers.decode_few(x, packed.weights,
                                    np.float32(c.norm_eps), packed.form,
                                    layers.Angles(cos, sin, packed.spec), stores, kind, self.ints,
                                    threads, packed.mixing)  # fmt: skip
        self.last_step = (sync, threads, layers.PHASE_NAMES, packed.mixing[0])
        return True

    @property
    def ints(self) -> int:
        """The bits of x's integers in quantized products (0: float32)."""
        return INT_BITS[self.dot]

    def kv_layout(self, cache: KVCache) -> tuple[tuple, np.ndarray]:
        """A cache's stores' shapes and, per layer, their addresses (once per cache)."""
        got = self._kv.get(cache)
        if got is None:  # (a recurrent layer has no stores: its row, its state's conv and s)
            stores = [cache.arrays(i) for i in range(len(cache.k))]
            first = next(s for s in stores if s is not None)
            shapes = tuple((a.shape, a.dtype.str) for a in first[0] + first[1])
            at = np.zeros((len(stores), len(first[0] + first[1])), np.int64)
            for i, (kv, state) in enumerate(zip(stores, cache.states, strict=True)):
                if state is not None:
                    at[i, :2] = layers.address(state.conv), layers.address(state.s)
                elif kv is not None:
                    at[i] = [layers.address(a) for a in kv[0] + kv[1]]
            got = self._kv[cache] = (shapes, at)
        return got

    def attention_batch(
        self, c: Config, qkv: np.ndarray, caches: list, layer: int, rots: list, spans: list,
        qk: QKNorms,
    ) -> np.ndarray:  # fmt: skip
        """Every sequence's attention in one call (layers.attend_batch) when their caches
        share one layout (their stores' shapes and formats); else one call each."""
        layouts = [self.kv_layout(cache) for cache in caches]
        if (
            len({shapes for shapes, _ in layouts}) != 1
            or qkv.shape[0] == 1
            or caches[0].shares(layer)
        ):  # (a shared KV layer: each sequence's call appends nothing)
            return super().attention_batch(c, qkv, caches, layer, rots, spans, qk)
        kv_at = np.stack([at[layer] for _, at in layouts])
        out = np.empty((qkv.shape[0], c.q_dim), np.float32)
        layers.attend_batch(np.ascontiguousarray(qkv), np.stack([r.cos[0] for r in rots]),
                            np.stack([r.sin[0] for r in rots]), attention_spec(c, qk),
                            *layout_and_width(caches[0].arrays(layer)), kv_at,
                            np.array([s.slot for s in spans], np.int64),
                            np.array([s.n_keys for s in spans], np.int64), out)  # fmt: skip
        return out

    def prompt_attention(
        self, c: Config, qkv: np.ndarray, cache: KVCache, layer: int, rot: Rotary, qk: QKNorms
    ) -> np.ndarray:
        """T tokens at positions pos..pos+T-1 (slots of their own: no ring wraps) in two
        calls: every token's key and value appended (layers.append_tokens), then each token
        attending to the keys up to its own as one sequence of a batch does (attend_batch,
        every token a sequence of the same cache, appending nothing): the arithmetic of a
        decode step, token by token, read from the stored format. (T, ...) -> (T, q_dim)"""
        t, p0 = qkv.shape[0], cache.pos
        qkv = np.ascontiguousarray(qkv)
        keys, values = cache.arrays(layer)
        spec = attention_spec(c, qk)
        layers.append_tokens(qkv, rot.cos, rot.sin, spec, keys, values, p0)
        at = self.kv_layout(cache)[1][layer]
        out = np.empty((t, c.q_dim), np.float32)
        kv_at, none = np.repeat(at[None], t, 0), np.full(t, -1, np.int64)  # slot -1: no append
        layers.attend_batch(qkv, rot.cos, rot.sin, spec, *layout_and_width((keys, values)),
                            kv_at, none,
                            np.arange(p0 + 1, p0 + t + 1), out)  # fmt: skip
        return out

    def rotary(self, positions: np.ndarray, inv_freq: np.ndarray, head_dim: int,
               scale: float = 1.0) -> Rotary:  # fmt: skip
        return Rotary(positions, inv_freq, head_dim, scale, matrix=False)

    def recurrent(self, c: Config, h: np.ndarray, states: list, mixer) -> np.ndarray:
        """A recurrent mixer in compiled calls (quant.compiled.recurrent): T tokens of one
        sequence in one call, a batch's sequences a call each."""
        width = c.delta.value_dim if mixer.kind == "delta" else c.dim
        out = np.empty((h.shape[0], width), np.float32)
        rows = [h] if len(states) == 1 else [h[b : b + 1] for b in range(len(states))]
        for b, (x, state) in enumerate(zip(rows, states, strict=True)):
            x = np.ascontiguousarray(x)
            y = out if len(states) == 1 else out[b : b + 1]
            if mixer.kind == "conv":
                recurrent.short_conv(x, state.conv, mixer.conv, np.empty_like(y), y)
                continue
            d = c.delta
            recurrent.delta_net(x, state.conv, state.s, mixer.conv, mixer.dt_bias, mixer.a,
                                mixer.norm, c.norm_eps, self.key_heads(c), d.k_heads, d.k_dim,
                                y)  # fmt: skip
        return out

    def norm_values(self, c: Config, qkv: np.ndarray, eps: float) -> np.ndarray:
        """gemma4's v normed per head, compiled (layers.value_norms, the one-call step's)."""
        qkv = np.array(qkv, np.float32)  # ours to change (C-contiguous)
        layers.norm_values(qkv, c.n_kv_heads, c.head_dim, np.float32(eps))
        return qkv

    def sigmoid_gate(self, y: np.ndarray, gate: np.ndarray) -> np.ndarray:
        """qwen3_5's gated attention, compiled (layers.gate_rows, the one-call step's)."""
        y, gate = np.ascontiguousarray(y), np.ascontiguousarray(gate)
        layers.sigmoid_gate(y, gate)
        return y

    def key_heads(self, c: Config) -> np.ndarray:
        """The key head each of a delta net's value heads reads (DeltaNet.key_head)."""
        if self._heads is None:
            self._heads = np.array([c.delta.key_head(j) for j in range(c.delta.v_heads)],
                                   np.int64)  # fmt: skip
        return self._heads

    # Several tokens (a batch's decode step, a prompt): each row's prologue as decode runs
    # it, then one product of all the rows (batch_product), the residual added in place.

    def norm_linear(self, x: np.ndarray, norm: np.ndarray | None, eps: float,
                    w: Matrix) -> np.ndarray:  # fmt: skip
        mode = ops.PLAIN if norm is None else ops.NORM
        if x.shape[0] != 1:
            h = np.ascontiguousarray(x) if norm is None else prepared(x, norm, eps, ops.NORM)
            return batch_product(w, h, None, self.dot)
        out = np.empty((1, w.shape[0]), np.float32)
        vector_product(w, x[0], out[0], mode, ops.NO_NORM if norm is None else norm, eps, False,
                self.dot)  # fmt: skip
        return out

    def _residual(self, x: np.ndarray, w: Matrix, h: np.ndarray, mode: int,
                  post: Residual) -> np.ndarray:  # fmt: skip
        """x + scale * post_norm(prologue(h) @ W.T), in place: the product added as it
        goes where the family has no norm or scale there, else into its own buffer and
        then added row by row (ops.residual: the one-call steps' residual phase)."""
        plain = post.norm is None and post.scale == 1.0
        if x.shape[0] != 1:
            if mode != ops.PLAIN:
                h = prepared(h, ops.NO_NORM, 0.0, mode)
            if plain:
                return batch_product(w, np.ascontiguousarray(h), x, self.dot)
            y = batch_product(w, np.ascontiguousarray(h), None, self.dot)
        else:
            y = x if plain else np.empty((1, w.shape[0]), np.float32)
            vector_product(w, h[0], y[0], mode, ops.NO_NORM, ops.ZERO, plain, self.dot)
            if plain:
                return x
        norm = NO_VECTOR if post.norm is None else post.norm
        for v in range(x.shape[0]):
            ops.residual(x[v], y[v], norm, np.float32(post.eps), np.float32(post.scale))
        return x

    def linear_add(self, x: np.ndarray, w: Matrix, inp: np.ndarray, post: Residual) -> np.ndarray:
        return self._residual(x, w, inp, ops.PLAIN, post)  # in place: x is ours

    def gated_linear_add(self, x: np.ndarray, w: Matrix, gate_up: np.ndarray, act: str,
                         post: Residual) -> np.ndarray:  # fmt: skip
        return self._residual(x, w, gate_up, ops.GATED[act], post)

    def moe(self, c: Config, x: np.ndarray, norm: np.ndarray | None, eps: float, experts,
            post: Residual) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
        """One token: the router's product, its choice and the chosen experts' products
        one call each, their weighted sum added to x in place, with the one-call step's
        functions (layers.mlp_of_experts), so the bits agree. Several tokens: grouped by
        expert (NumpyOps.moe), each expert one product of its tokens' rows."""
        if x.shape[0] != 1:
            return self._moe_batch(c, x, norm, eps, experts, post)
        mode, norm = (ops.PLAIN, ops.NO_NORM) if norm is None else (ops.NORM, norm)
        logits = np.empty(c.n_experts, np.float32)
        vector_product(experts.router, x[0], logits, mode, norm, eps, False, self.dot)
        k = c.experts_per_token
        sel, w = np.empty(k, np.int64), np.empty(k, np.float32)
        ops.route(logits, k, c.norm_topk, sel, w)
        gate_up, outs = np.empty(2 * c.hidden_dim, np.float32), np.empty((k, c.dim), np.float32)
        for j, e in enumerate(sel):
            vector_product(experts.gate_up[e], x[0], gate_up, mode, norm, eps, False, self.dot)
            vector_product(experts.down[e], gate_up, outs[j], ops.GATED[c.mlp_act], ops.NO_NORM,
                    ops.ZERO, False, self.dot)  # fmt: skip
        post_norm = NO_VECTOR if post.norm is None else post.norm
        ops.experts_add(x[0], outs, w, post_norm, np.float32(post.eps), np.float32(post.scale),
                        np.empty(c.dim, np.float32))  # fmt: skip
        return x, sel[None]

    def _moe_batch(self, c: Config, x: np.ndarray, norm: np.ndarray | None, eps: float,
                   experts, post: Residual) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
        """Several tokens: the router's product of every row, its choice, then the chosen
        experts in one compiled call (quant.compiled.experts: each expert's rows read once
        for all the pairs routed to it), x in place."""
        table = self._experts_table(experts)
        quantized = table is not None and (table[0][:, layers.KIND] >= kinds.Q8_0).any()
        if table is None or norm is None or (quantized and not self.ints) or len(x) > PAIRED:
            return super().moe(c, x, norm, eps, experts, post)  # (fewdot's kernels take
            # quantized products' x as integers)
        k, logits = c.experts_per_token, self.norm_linear(x, norm, eps, experts.router)
        sel, w = top_k(logits, k, c.norm_topk)
        return self.chosen_experts(c, x, norm, eps, sel, w, experts, post), sel

    def chosen_experts(
        self, c: Config, x: np.ndarray, norm: np.ndarray, eps: float, sel: np.ndarray,
        w: np.ndarray, experts, post: Residual,
    ) -> np.ndarray:  # fmt: skip
        """x (T, dim) + post(each token's experts sel (T, k), weighted by w, on rmsnorm(x)
        * norm) in one compiled call, in place where x is C-contiguous."""
        table = self._experts_table(experts)
        order = np.argsort(sel, axis=1)  # each token's experts in ascending order
        sel, w = np.take_along_axis(sel, order, 1), np.take_along_axis(w, order, 1)
        members = np.argsort(sel.ravel(), kind="stable")  # the pairs, expert by expert
        union, counts = np.unique(sel.ravel()[members], return_counts=True)
        first = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        rows, factors, gate_up, down, stride = table
        post_norm = NO_VECTOR if post.norm is None else post.norm
        x = np.ascontiguousarray(x)
        experts_batch(x, rows, factors, gate_up, down, stride, norm, np.float32(eps), ops.NORM,
                      ops.GATED[c.mlp_act], np.ascontiguousarray(w, np.float32),
                      union.astype(np.int64), first, members.astype(np.int64), post_norm,
                      np.float32(post.scale), self.ints,
                      self.team or numba.get_num_threads())  # fmt: skip
        return x

    def _experts_table(self, experts) -> tuple | None:
        """A mixture of experts' layer as quant.compiled.experts takes it (made once): its
        experts' gate_up and down rows in a table (rows, factors), expert 0's rows of
        each, and the rows from one expert to the next; None when its experts are not all
        compiled and cut alike. (A model without experts never asks.)"""
        got = self._tables.get(id(experts))
        if got is not None and got[0] is experts:
            return got[1]
        stride = stride_of(experts)
        pairs = list(zip(experts.gate_up, experts.down, strict=True))
        parts = [p for g, d in pairs for p in (*g.leaves(), *d.leaves())]
        if stride is None or not all(
            isinstance(p, CompiledMatrix) and all(map(layers.addressable, p.operands().arrays))
            for p in parts
        ):
            return None
        t, n = layers.table([p.operands() for p in parts]), len(experts.gate_up[0].leaves())
        spec = (t.rows, t.factors, np.array([0, n], np.int64), np.array([n, stride], np.int64),
                stride)  # fmt: skip
        self._tables[id(experts)] = (experts, spec, t)  # t keeps the arrays' owners alive
        return spec

    def attention(
        self, c: Config, qkv: np.ndarray, cache: KVCache, layer: int, rot: Rotary, span: Span,
        qk: QKNorms,
    ) -> np.ndarray:  # fmt: skip
        """One token: its q and k normed, RoPE, append and attend in one kernel, the cache
        read in its format. A prompt of T tokens: `prompt_attention`, where its positions
        fill slots of their own; the NumPy reference where a window's ring wraps within it.
        A shared KV layer: shared_attention."""
        if cache.shares(layer):
            return self.shared_attention(c, qkv, cache, layer, rot, span, qk)
        if qkv.shape[0] != 1:
            if cache.pos + qkv.shape[0] > cache.rings[layer]:
                return super().attention(c, qkv, cache, layer, rot, span, qk)
            return self.prompt_attention(c, qkv, cache, layer, rot, qk)
        keys, values = cache.arrays(layer)
        out = np.empty((1, c.q_dim), np.float32)
        attention.attend(qkv[0], rot.cos[0], rot.sin[0], attention_spec(c, qk), keys, values,
                         span.slot, span.n_keys, out[0])  # fmt: skip
        return out

    def shared_attention(
        self, c: Config, q: np.ndarray, cache: KVCache, layer: int, rot: Rotary, span: Span,
        qk: QKNorms,
    ) -> np.ndarray:  # fmt: skip
        """A shared KV layer (gemma4): its queries attend to the source layer's stores as a
        batch's sequences do, appending nothing (slot -1): one token to the span's keys, a
        prompt's tokens each to the keys up to its own; the NumPy reference where the
        source's ring wrapped within the prompt (the source ran it too). q (T, q_dim)"""
        t, p0 = q.shape[0], cache.pos
        if t != 1 and p0 + t > cache.rings[layer]:
            return super().shared_attention(c, q, cache, layer, rot, span, qk)
        keys, values = cache.arrays(layer)
        at = self.kv_layout(cache)[1][layer]
        ns = np.array([span.n_keys], np.int64) if t == 1 else np.arange(p0 + 1, p0 + t + 1)
        out = np.empty((t, c.q_dim), np.float32)
        layers.attend_batch(np.ascontiguousarray(q), rot.cos, rot.sin, attention_spec(c, qk),
                            *layout_and_width((keys, values)), np.repeat(at[None], t, 0),
                            np.full(t, -1, np.int64), ns, out)  # fmt: skip
        return out
