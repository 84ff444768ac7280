"""A decode step's decoder blocks in one compiled call and one parallel region.

Called block by block, a token of SmolLM2-135M makes ~150 kernel calls, and each costs
~13 us outside the kernel (scripts/call_overhead.py): numba's dispatch unboxing a dozen
arguments, the Python around it (the seam, the meter, the operations), and the start and
end of its parallel loop (~6 us at 2 threads). On a 4-bit model that was 10-18% of a
token. Here the whole stack of blocks is one call, `decode_layers`, which starts one
parallel loop: each thread walks every layer's phases (team.py), taking chunks of each
product's rows and attention tasks from the phase's counter, and runs them with the very
functions the block-by-block kernels run (`rows_` in matvec.py, intdot.py, ggml.py;
attention.attend_task), so the logits are the same bit for bit (when both were compiled in
one process: jit.kernel).

The weights reach the kernel as a table of addresses, one row per matrix (`Table`): a call
then unboxes two small arrays instead of ~120 matrices' arrays (a numba typed List of them
measured ~30 us a call to unbox and ~1 s to build), and a row of any format fits the same
table. The arrays themselves stay where the formats keep them; the Table holds them alive.
The KV cache's layers reach it the same way, as addresses of arrays of one shape, their
format a value (Stores.layout): one compiled step reads every KV format.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from llvmlite import ir
from numba import carray, prange, types
from numba.core.extending import intrinsic

from ..ggml import BLOCK
from . import attention, ggml, intdot, matvec, recurrent
from .jit import kernel
from .kinds import BF16, F16, F32, KQUANT, Q4, Q5, Q8_0  # what a table row multiplies
from .matvec import CHUNK
from .ops import GEGLU, NORM, PLAIN, SWIGLU, experts_add, gated, residual, rmsnorm, route, sigmoid
from .team import LINE, finish, grain_of, start, take

ARRAYS = 4  # arrays a row may name: (address, rows, cols) each
KIND, ROWS, CODE, NBYTES, WEIGHTS, FIRST = range(6)  # the columns; arrays from FIRST on
COLUMNS = FIRST + 3 * ARRAYS


class Operands(NamedTuple):
    """What the kernel of one matrix takes, as quant.compiled.weights lays it out: its kind,
    its arrays (2-D, C-contiguous), the factor on its mins (q4 / q5), and a K-quant's
    format code, bytes and weights per block."""

    kind: int
    rows: int  # the matrix's rows: what its product writes
    arrays: tuple[np.ndarray, ...]
    factor: float = 0.0
    code: int = 0
    nbytes: int = 0
    weights: int = 0


class Table(NamedTuple):
    """Rows of operands for decode_layers: `rows` (n, COLUMNS) int64, `factors` (n,)
    float32, and `keep`, the arrays the addresses point into (held alive here)."""

    rows: np.ndarray
    factors: np.ndarray
    keep: list[np.ndarray]


# IN_THE_LOOP: numba hands a parallel loop a tuple's fields one by one, and a field that is
# itself a tuple (Angles' spec) fails there ("scalar type ... given for non
# scalar argument"): a parallel kernel unpacks such a group before its loop and makes it
# again inside.
class Weights(NamedTuple):
    """decode_layers' weights: the table's `rows` and `factors` (Table), `plan` (L, 6, 2):
    per layer, the table rows of its products qkv (a recurrent mixer's input projection),
    o, gate_up, down, and gemma4's per-layer input's gate and projection (empty where a
    family has none); `norms` (L, 5, dim): the norms before attention and the MLP, after
    them, and after the per-layer input (rows a family lacks: unread); `biases` (L, qkv
    rows) or (L, 0)."""

    rows: np.ndarray
    factors: np.ndarray
    plan: np.ndarray
    norms: np.ndarray
    biases: np.ndarray


class Angles(NamedTuple):
    """A step's rotary angles, `cos` and `sin` (one sequence: (L, widest rotary / 2), each
    layer's first shapes[i, HALF]; B sequences: (L, B, rotary / 2)), and the attention's
    `spec` (attention.spec_of, its norms stacked by layer: (L, n), its scale (L,))."""

    cos: np.ndarray
    sin: np.ndarray
    spec: tuple


class Stores(NamedTuple):
    """The KV stores a step reads and appends to: `layout` (layout_of: their format, KV
    heads and slots, which every layer that attends shares), `kv_at` (L, arrays of both;
    B sequences: (L, B, ...)): each layer's stores at their addresses (a recurrent layer's
    row: its state's conv and s; a shared KV layer's: its source's), `slots`, `n_keys`:
    where each layer appends (-1: nothing) and how many keys it attends ((L,); B
    sequences: (2, B) by span)."""

    layout: np.ndarray
    kv_at: np.ndarray
    slots: np.ndarray
    n_keys: np.ndarray


class Experts(NamedTuple):
    """A mixture of experts: `spec` (E, k, whether the k weights are renormalized)
    (moe_spec; E = 0: none), `routers` (L, 2): each layer's router's table row and the
    table rows from one expert to the next (plan[i, 2:4]: expert 0's gate_up and down),
    `chosen` (L, k): where the step writes the experts each layer chose."""

    spec: np.ndarray
    routers: np.ndarray
    chosen: np.ndarray


def address(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


def addressable(a: np.ndarray) -> bool:
    """Whether a table row can name the array: 2-D and C-contiguous."""
    return a.ndim == 2 and a.flags.c_contiguous


def table(operands: list[Operands]) -> Table:
    """One row per matrix."""
    rows = np.zeros((len(operands), COLUMNS), np.int64)
    keep = []
    for i, op in enumerate(operands):
        rows[i, :FIRST] = op.kind, op.rows, op.code, op.nbytes, op.weights
        for j, a in enumerate(op.arrays):
            if not addressable(a):
                raise ValueError(f"operand arrays must be 2-D and C-contiguous, got {a.shape}")
            rows[i, FIRST + 3 * j : FIRST + 3 * j + 3] = address(a), *a.shape
            keep.append(a)
    factors = np.array([op.factor for op in operands], np.float32)
    return Table(rows, factors, keep)


@intrinsic
def voidptr(typingctx, at):
    """An int64 address as a void pointer (for numba.carray)."""

    def codegen(context, builder, sig, args):
        return builder.inttoptr(args[0], ir.IntType(8).as_pointer())

    return types.voidptr(types.int64), codegen


@kernel(inline=True)
def operand(rows, p, j, dtype):
    """Array j of row p of the table, as a 2-D C-contiguous array of `dtype`."""
    at = FIRST + 3 * j
    return carray(voidptr(rows[p, at]), (rows[p, at + 1], rows[p, at + 2]), dtype)


@kernel
def scratch(n):
    """A thread's buffers for the vector a product multiplies (at most n values), as each
    kind of table row reads it: h (the prologue's output), then xa, xb, xs, x16 (float
    q4 / q5: matvec.nibble_operands, five_operands), xq (x's integers: 2 n, room for the
    low bytes of int16), xd, xsum (intdot.quantize_x) and xd16, xb16 (K-quants: per16)."""
    f32 = np.float32
    return (np.empty(n, f32), np.empty(n // 2, f32), np.empty(n // 2, f32),
            np.empty(n // 32, f32), np.empty(n, f32), np.empty(2 * n, np.int8),
            np.empty(n // 32, f32), np.empty(n // 32, np.int32), np.empty(n // 16, f32),
            np.empty(n // 16, f32))  # fmt: skip


@kernel(inline=True)
def head(x, norm, eps, mode, h):
    """ops.prologue into the buffer h: what a product multiplies (x itself when PLAIN)."""
    if mode == NORM:
        rmsnorm(x, norm, eps, h[: x.shape[0]])
        return h[: x.shape[0]]
    if mode == SWIGLU or mode == GEGLU:
        gated(x, mode, h[: x.shape[0] // 2])
        return h[: x.shape[0] // 2]
    return x


@kernel(inline=True)
def low_at(xq, ints):
    """Where x's low bytes lie in the buffer xq: half-way when x is int16, else 0."""
    return xq.shape[0] // 2 if ints == 16 else 0


@kernel(inline=True)
def prepare(rows, p0, p1, v, buf, ints):
    """Fill the buffers that the kinds of table rows p0:p1 read v (n,) through. ints: the
    bits of x's integers in quantized products (8, 16; 0: float32)."""
    n = v.shape[0]
    _, xa, xb, xs, x16, xq, xd, xsum, xd16, xb16 = buf
    nibbles = five = quantize = k = False
    for p in range(p0, p1):
        kind = rows[p, KIND]
        if ints and kind >= Q8_0:
            quantize = True
            k |= kind == KQUANT
        else:
            nibbles |= kind == Q4 or kind == Q5
            five |= kind == Q5
    if nibbles:
        matvec.nibble_operands(v, xa[: n // 2], xb[: n // 2], xs[: n // 32])
    if five:
        matvec.five_operands(v, x16[:n])
    if quantize:
        intdot.quantize_x(v, xq, xd[: n // 32], xsum[: n // 32], low_at(xq, ints))
    if k:
        intdot.per16(xq, xd[: n // 32], low_at(xq, ints), xd16[: n // 16], xb16[: n // 16])


@kernel(inline=True)
def run_rows(rows, factors, p, v, buf, c0, c1, add, out, ints):
    """Chunks c0:c1 of out (=, or += when add) W_p @ v by W_p's own rows_ function, on v
    as `prepare` left it in buf; x multiplied as integers when `ints` and W_p is quantized."""
    _, xa, xb, xs, x16, xq, xd, xsum, xd16, xb16 = buf
    lo = low_at(xq, ints)
    kind = rows[p, KIND]
    if kind == F32:
        matvec.rows_f32(operand(rows, p, 0, np.float32), v, c0, c1, add, out)
    elif kind == F16 or kind == BF16:
        bits = operand(rows, p, 0, np.uint16)
        if kind == F16:
            matvec.rows_f16(bits, v, c0, c1, add, out)
        else:
            matvec.rows_bf16(bits, v, c0, c1, add, out)
    elif kind == KQUANT:
        blocks, code, nb = operand(rows, p, 0, np.uint8), rows[p, CODE], rows[p, NBYTES]
        if ints:
            intdot.rows_k(blocks, code, nb, xq, xd16, xb16, lo, c0, c1, add, out)
        else:
            ggml.rows_ggml(blocks, code, nb, rows[p, WEIGHTS], v, c0, c1, add, out)
    else:
        codes, scales = operand(rows, p, 0, np.uint8), operand(rows, p, 1, np.uint16)
        if kind == Q8_0:
            if ints:
                intdot.rows_q8_0(codes, scales, xq, xd, xsum, lo, c0, c1, add, out)
            else:
                matvec.rows_q8_0(codes, scales, v, c0, c1, add, out)
            return
        mins, factor = operand(rows, p, 2, np.uint16), factors[p]
        bits = operand(rows, p, 3, np.uint32)
        if ints:
            intdot.rows_q4(codes, scales, mins, factor, bits, xq, xd, xsum, lo, c0, c1, add, out)
        elif kind == Q4:
            matvec.rows_q4(codes, scales, mins, factor, xa, xb, xs, c0, c1, add, out)
        else:
            matvec.rows_q5(codes, scales, mins, factor, bits, xa, xb, xs, x16, c0, c1, add,
                           out)  # fmt: skip


@kernel(inline=True)
def chunks(rows, p0, p1):
    """Chunks of rows (matvec.CHUNK each) of the matrix that table rows p0:p1 stack, each
    part's own counted apart."""
    n = 0
    for p in range(p0, p1):
        n += -(-rows[p, ROWS] // CHUNK)
    return n


@kernel(inline=True)
def stack_rows(rows, factors, p0, p1, v, buf, c0, c1, add, out, bias, ints):
    """Chunks c0:c1 of the product of the stack p0:p1 (`chunks` numbers them part after
    part), then `bias` (empty: none) added to the rows they wrote."""
    first, r0 = 0, 0
    for p in range(p0, p1):
        n = rows[p, ROWS]
        a, b = max(c0 - first, 0), min(c1 - first, -(-n // CHUNK))
        if a < b:
            run_rows(rows, factors, p, v, buf, a, b, add, out[r0 : r0 + n], ints)
            for r in range(r0 + a * CHUNK, r0 + min(n, b * CHUNK)) if bias.shape[0] else range(0):
                out[r] += bias[r]
        first, r0 = first + -(-n // CHUNK), r0 + n


@kernel
def product(sync, k, threads, rows, factors, p0, p1, x, norm, eps, mode, add, out, bias, buf,
            ints):  # fmt: skip
    """Phase k: out (=, or += when add) W @ prologue(x) (+ bias) for W the stack p0:p1,
    by chunks taken from the phase's counter; every thread that takes one runs the
    prologue into its own buffers first (the same arithmetic on each, so the same bits)."""
    n = chunks(rows, p0, p1)
    grain = grain_of(n, threads)
    c = take(sync, k, grain, n)
    finished = 0
    if c < n:
        v = head(x, norm, eps, mode, buf[0])
        prepare(rows, p0, p1, v, buf, ints)
        while c < n:
            c1 = min(n, c + grain)
            stack_rows(rows, factors, p0, p1, v, buf, c, c1, add, out, bias, ints)
            finished += c1 - c
            c = take(sync, k, grain, n)
    finish(sync, k, finished, n)


@kernel
def attend(sync, k, qkv, cos, sin, spec, layout, at, hd, slot, n, run, top, total, part):
    """Phase k: the attention tasks (attention.attend_task), one at a time, on the layer's
    stores at the addresses `at` (layout: Stores')."""
    tasks = layout[KV_HEADS] * part.shape[1]
    finished = 0
    t = take(sync, k, 1, tasks)
    while t < tasks:
        task_at(qkv, cos, sin, spec, layout, at, hd, slot, n, t, run, top, total, part)
        finished += 1
        t = take(sync, k, 1, tasks)
    finish(sync, k, finished, tasks)


# Stores' layout: the format (what a store's first array holds: float32, float16 bits,
# q8_0's codes with a float16 scale per block), the KV heads and the slots. The one-call
# steps take the format as a value, not as their stores' types: one compiled walker reads
# all three (each of decode_layers and decode_few cost 25-45 s to compile, per format).
KV_FORMAT, KV_HEADS, KV_SLOTS = range(3)
KV_F32, KV_F16, KV_Q8_0 = range(3)
KV_CODES = {"float32": KV_F32, "uint16": KV_F16, "int8": KV_Q8_0}


def layout_of(keys: tuple[np.ndarray, ...], values: tuple[np.ndarray, ...]) -> np.ndarray:
    """Stores' layout of a layer's key and value stores (their arrays)."""
    return np.array([KV_CODES[keys[0].dtype.name], *values[0].shape[:2]], np.int64)


@kernel(inline=True)
def float_stores(layout, at, hd, dtype):
    """A layer's keys (tiled) and values of head_dim hd in a float format (float32, or
    float16 bits as uint16) at the addresses at[0], at[1]."""
    n_kv, slots = layout[KV_HEADS], layout[KV_SLOTS]
    keys = (carray(voidptr(at[0]), (n_kv, -(-slots // attention.TILE), hd, attention.TILE),
                   dtype),)  # fmt: skip
    return keys, (carray(voidptr(at[1]), (n_kv, slots, hd), dtype),)


@kernel(inline=True)
def q8_0_stores(layout, at, hd):
    """A layer's q8_0 keys (tiled) and values of head_dim hd at the addresses at[0:4]:
    each its codes, then its scales."""
    n_kv, slots, tile = layout[KV_HEADS], layout[KV_SLOTS], attention.TILE
    tiles = -(-slots // tile)
    keys = (carray(voidptr(at[0]), (n_kv, tiles, hd, tile), np.int8),
            carray(voidptr(at[1]), (n_kv, tiles, hd // BLOCK, tile), np.uint16))  # fmt: skip
    values = (carray(voidptr(at[2]), (n_kv, slots, hd), np.int8),
              carray(voidptr(at[3]), (n_kv, slots, hd // BLOCK), np.uint16))  # fmt: skip
    return keys, values


@kernel(inline=True)
def task_at(qkv, cos, sin, spec, layout, at, hd, slot, n, t, run, top, total, part):
    """attention.attend_task on a layer's stores at the addresses `at`, in the format
    that `layout` names."""
    if layout[KV_FORMAT] == KV_Q8_0:
        keys, values = q8_0_stores(layout, at, hd)
        attention.attend_task(qkv, cos, sin, spec, keys, values, slot, n, t, run, top, total,
                              part)  # fmt: skip
    elif layout[KV_FORMAT] == KV_F16:
        keys, values = float_stores(layout, at, hd, np.uint16)
        attention.attend_task(qkv, cos, sin, spec, keys, values, slot, n, t, run, top, total,
                              part)  # fmt: skip
    else:
        keys, values = float_stores(layout, at, hd, np.float32)
        attention.attend_task(qkv, cos, sin, spec, keys, values, slot, n, t, run, top, total,
                              part)  # fmt: skip


@kernel
def out_rows(rows, p0, p1):
    """Rows of the matrix that table rows p0:p1 stack."""
    n = 0
    for p in range(p0, p1):
        n += rows[p, ROWS]
    return n


@kernel(inline=True)
def lay(buf, rows, cols, dtype):
    """The first rows * cols values of the 1-D buffer buf as a (rows, cols) C-contiguous
    array of dtype (buf's own)."""
    return carray(voidptr(buf.ctypes.data), (rows, cols), dtype)


@kernel(inline=True)
def rows_at(buf, at, rows, cols):
    """buf[at:at + rows * cols] (float32, 1-D) as a (rows, cols) C-contiguous array."""
    return carray(voidptr(buf.ctypes.data + 4 * at), (rows, cols), np.float32)


@kernel(inline=True)
def batch_tasks(ns, n_kv, n_heads, hd):
    """How the attention tasks of B sequences over ns (B,) keys are laid out, one
    sequence after the other: first (B + 1,) sequence b's tasks first[b]:first[b + 1]
    (KV heads x pieces of its keys, each sequence its own number of pieces), at (B + 1,)
    where its pieces' scratch starts, runs (B,) its tiles per piece; and the scratch of
    all: top, total and part (see attention.attend_task)."""
    nb = ns.shape[0]
    first, at = np.zeros(nb + 1, np.int64), np.zeros(nb + 1, np.int64)
    runs = np.empty(nb, np.int64)
    for b in range(nb):
        pieces, runs[b] = attention.split(-(-ns[b] // attention.TILE))
        first[b + 1] = first[b] + n_kv * pieces
        at[b + 1] = at[b] + n_heads * pieces
    top, total = np.empty(at[nb], np.float32), np.empty(at[nb], np.float32)
    return first, at, runs, top, total, np.empty(at[nb] * hd, np.float32)


@kernel(inline=True)
def pieces_of_sequence(first, at, b, n_kv, hd, top, total, part):
    """Sequence b's top, total (n_heads, pieces) and part (n_heads, pieces, hd) in the
    scratch that batch_tasks laid out."""
    pieces = (first[b + 1] - first[b]) // n_kv
    n_heads = (at[b + 1] - at[b]) // pieces
    p = rows_at(part, at[b] * hd, n_heads * pieces, hd).reshape((n_heads, pieces, hd))
    return rows_at(top, at[b], n_heads, pieces), rows_at(total, at[b], n_heads, pieces), p


@kernel(inline=True)
def batch_piece(tasks, t, n_kv, hd):
    """Where task t of a batch's attention (tasks: what batch_tasks returned) lies: its
    sequence b, its number among b's tasks, b's run of tiles per piece, and b's top, total
    and part (attention.attend_task's)."""
    first, at, runs, top, total, part = tasks
    b = np.searchsorted(first, t, side="right") - 1
    top_b, total_b, part_b = pieces_of_sequence(first, at, b, n_kv, hd, top, total, part)
    return b, t - first[b], runs[b], top_b, total_b, part_b


@kernel(parallel=True)
def attend_batch(qkv, cos, sin, spec, layout, hd, kv_at, slots, ns, out):
    """One decode step of one layer for B sequences in one call: every sequence's
    attention tasks (task_at, on its own stores) in one parallel loop, then each
    sequence's pieces combined. qkv (B, ...) the tokens' projections; cos, sin (B, rotary
    / 2); spec: the layer's (attention.spec_of); layout, hd: the stores' (Stores.layout,
    which every sequence's share) and the layer's head_dim; kv_at (B, arrays of both):
    each sequence's stores at their addresses; slots, ns (B,): where each appends (-1:
    nothing) and how many keys it attends; out (B, n_heads * hd). Each sequence gets the
    bits attention.attend gives it alone (the same tasks, combined in order)."""
    n_kv = layout[KV_HEADS]
    tasks = batch_tasks(ns, n_kv, out.shape[1] // hd, hd)
    first, at, _, top, total, part = tasks
    n = first[-1]
    for i in prange(n):  # from both ends in turn: each thread's share of a ramp of depths
        task = np.int64(i) // 2 if i % 2 == 0 else n - 1 - np.int64(i) // 2
        b, t, run, top_b, total_b, part_b = batch_piece(tasks, task, n_kv, hd)
        task_at(qkv[b], cos[b], sin[b], spec, layout, kv_at[b], hd, slots[b], ns[b], t, run,
                top_b, total_b, part_b)  # fmt: skip
    for b in prange(qkv.shape[0]):
        attention.combine(*pieces_of_sequence(first, at, b, n_kv, hd, top, total, part), out[b])


@kernel(parallel=True)
def append_tokens(qkv, cos, sin, spec, keys, values, slot0):
    """A prompt's T tokens of one layer into its KV stores: token t's keys, normed and
    rotated (cos, sin (T, rotary / 2), spec), and values stored at slot slot0 + t
    (attention.append), every (token, KV head) a task. Then attend_batch, its tokens as
    sequences that share these stores and append nothing (slot -1), runs the prompt's
    attention."""
    n_kv, hd = values[0].shape[0], values[0].shape[2]
    n_heads = qkv.shape[1] // hd - 2 * n_kv
    for i in prange(qkv.shape[0] * n_kv):
        t, h = np.int64(i) // n_kv, np.int64(i) % n_kv
        attention.append(qkv[t], cos[t], sin[t], spec, keys, values, slot0 + t, h, n_heads)


# A decode step's phases per layer: qkv, attention, o, o's residual add, gate_up, down,
# down's residual add. The residual adds run as phases of their own (one thread; the
# others wait) only where the family norms or scales a sub-block's output (gemma, olmo2,
# granite): the add needs the whole product. Elsewhere a product adds into x as it goes.
# A mixture of experts' layer: qkv, attention, o, o's add, the router, the chosen experts'
# gate_up products, their down products, and their weighted sum added.
# gemma4's layer (per-layer inputs, a scalar): then the per-layer input's gate product, its
# projection's, and their add with the layer's scalar.
PHASES = 7
MOE_PHASES = 8
LAYERED_PHASES = 10
PHASE_NAMES = ("qkv", "attention", "o", "o residual", "gate_up", "down", "down residual")
MOE_PHASE_NAMES = (*PHASE_NAMES[:4], "router", "experts gate_up", "experts down", "experts add")
LAYERED_PHASE_NAMES = (*PHASE_NAMES, "ple gate", "ple proj", "ple add")


@kernel(inline=True)
def layered(per_layer):
    """Whether the layers take per-layer inputs or scalars (decode_layers' per_layer)."""
    return per_layer[0].shape[1] > 0 or per_layer[1].shape[0] > 0


@kernel(inline=True)
def phases_of(experts, per_layer):
    """A layer's phases: PHASES, a mixture of experts' (experts: moe_spec), or a layer's
    with per-layer inputs or a scalar (gemma4)."""
    if experts[0] != 0:
        return MOE_PHASES
    return LAYERED_PHASES if layered(per_layer) else PHASES


@kernel
def experts_phase(sync, k, x, outs, sel, w, norm, eps, scale, y, chosen):
    """Phase k, one item: the chosen experts' outputs weighted and added to x
    (ops.experts_add), and their numbers written into `chosen`."""
    if take(sync, k, 1, 1) < 1:
        experts_add(x, outs, w, norm, eps, scale, y)
        chosen[:] = sel
        finish(sync, k, 1, 1)
    else:
        finish(sync, k, 0, 1)


@kernel(inline=True)
def expert_at(rows, p0, p1, sel, stride, c):
    """Which chosen expert j chunk c of an experts' phase falls in, and its first chunk:
    expert j's chunks follow expert j - 1's (expert e's rows: p0:p1 plus e stride)."""
    first = 0
    for j in range(sel.shape[0]):
        n = chunks(rows, p0 + sel[j] * stride, p1 + sel[j] * stride)
        if c < first + n:
            return j, first
        first += n
    return sel.shape[0], first


@kernel
def experts_product(sync, k, threads, rows, factors, p0, p1, sel, stride, xs, shared, norm, eps,
                    mode, outs, none, buf, ints):  # fmt: skip
    """Phase k: outs[j] = W_j @ prologue(x_j) for each chosen expert j (W_j: table rows
    p0:p1 plus sel[j] stride; x_j: xs[0] when `shared`, else xs[j]), the experts' chunks
    one list that the threads take from: a thread's stream runs on from one expert's rows
    into the next's without waiting. A thread prepares x_j when its chunk is expert j's and
    x_j is not what it prepared last (once in all when shared)."""
    n = 0
    for j in range(sel.shape[0]):
        n += chunks(rows, p0 + sel[j] * stride, p1 + sel[j] * stride)
    grain = grain_of(n, threads)
    c = take(sync, k, grain, n)
    finished, ready = 0, -1
    v = head(xs[0], norm, eps, PLAIN, buf[0])  # (typed here; prepared below)
    while c < n:
        end = min(n, c + grain)
        while c < end:
            j, first = expert_at(rows, p0, p1, sel, stride, c)
            a, b = p0 + sel[j] * stride, p1 + sel[j] * stride
            stop = min(end, first + chunks(rows, a, b))
            if ready != (0 if shared else j):
                ready = 0 if shared else j
                v = head(xs[ready], norm, eps, mode, buf[0])
                prepare(rows, a, b, v, buf, ints)
            stack_rows(rows, factors, a, b, v, buf, c - first, stop - first, False, outs[j],
                       none, ints)  # fmt: skip
            finished += stop - c
            c = stop
        c = take(sync, k, grain, n)
    finish(sync, k, finished, n)


@kernel(inline=True)
def mlp_of_experts(sync, k, threads, rows, factors, p, router, x, y, norms, eps, form, routing,
                   chosen, none, buf, ints):  # fmt: skip
    """Phases k on of a mixture of experts' MLP: the router's product (every thread then
    chooses the same k experts from its logits: ops.route), the chosen experts' gate_up
    products, their down products (expert e's table rows: expert 0's, p, plus e stride),
    their weighted sum added to x. router: the router's table row and that stride; norms:
    the norm before the MLP and after it; routing: (Experts.spec, the router's logits, the
    chosen experts and their weights, their gate_up and down outputs)."""
    stride, router, (norm, post_norm) = router[1], router[0], norms
    pre, gate, _, scale = form
    experts, logits, sel, w, gate_ups, outs = routing
    product(sync, k, threads, rows, factors, router, router + 1, x, norm, eps, pre, False,
            logits, none, buf, ints)  # fmt: skip
    route(logits, experts[1], experts[2], sel, w)
    experts_product(sync, k + 1, threads, rows, factors, p[2, 0], p[2, 1], sel, stride,
                    x.reshape((1, x.shape[0])), True, norm, eps, pre, gate_ups, none, buf,
                    ints)  # fmt: skip
    experts_product(sync, k + 2, threads, rows, factors, p[3, 0], p[3, 1], sel, stride,
                    gate_ups, False, norm, eps, gate, outs, none, buf, ints)  # fmt: skip
    experts_phase(sync, k + 3, x, outs, sel, w, post_norm, eps, scale, y, chosen)


@kernel
def residual_phase(sync, k, x, y, norm, eps, scale):
    """Phase k, one item: every row of x += scale * rmsnorm(y's row) * norm (ops.residual,
    row by row as the calls one by one run it)."""
    if take(sync, k, 1, 1) < 1:
        for v in range(x.shape[0]):
            residual(x[v], y[v], norm, eps, scale)
        finish(sync, k, 1, 1)
    else:
        finish(sync, k, 0, 1)


@kernel
def per_layer_add(sync, k, threads, rows, factors, p, x, y, norm, eps, gate, inputs, scalar,
                  buf, ints, none):  # fmt: skip
    """Phases k to k + 2, gemma4's layer after its MLP (seam.per_layer_add, then scaled):
    inputs (2 ple_dim,) = [x @ ple_gate (the first product writes it) | the layer's input
    (empty: none)], y = ple_proj @ gate(inputs); then, one item, x += rmsnorm(y) * norm
    and x *= scalar ((1,); empty: none)."""
    half = inputs.shape[0] // 2
    if half:
        product(sync, k, threads, rows, factors, p[4, 0], p[4, 1], x, norm, eps, PLAIN, False,
                inputs[:half], none, buf, ints)  # fmt: skip
        product(sync, k + 1, threads, rows, factors, p[5, 0], p[5, 1], inputs, norm, eps, gate,
                False, y, none, buf, ints)  # fmt: skip
    if take(sync, k + 2, 1, 1) < 1:
        if half:
            residual(x, y, norm, eps, np.float32(1))
        for j in range(x.shape[0] if scalar.shape[0] else 0):
            x[j] *= scalar[0]
        finish(sync, k + 2, 1, 1)
    else:
        finish(sync, k + 2, 0, 1)


@kernel(inline=True)
def pieces_in(flat, n_heads, n, hd):
    """top, total (n_heads, pieces), part (n_heads, pieces, hd) and the run of tiles per
    piece of an attention over n keys (attention.attend_task), laid in the flat scratch
    `flat` (sized by pieces_scratch for the most keys of any layer)."""
    pieces, run = attention.split(-(-n // attention.TILE))
    ftop, ftotal, fpart = flat
    part = rows_at(fpart, 0, n_heads * pieces, hd).reshape((n_heads, pieces, hd))
    return rows_at(ftop, 0, n_heads, pieces), rows_at(ftotal, 0, n_heads, pieces), part, run


@kernel(inline=True)
def pieces_scratch(n_heads, n, hd):
    """Flat scratch for pieces_in of any attention over at most n keys."""
    pieces, _ = attention.split(-(-n // attention.TILE))
    f32 = np.float32
    return (np.empty(n_heads * pieces, f32), np.empty(n_heads * pieces, f32),
            np.empty(n_heads * pieces * hd, f32))  # fmt: skip


# A layer's token mixer (decode_layers' `mixing`): attention, a gated delta net, a short
# convolution; and mixing's dims: the delta net's key heads, value heads, key and value
# head sizes and kernel, the short convolution's kernel, whether attention is gated
ATTENTION, DELTA, CONV = 0, 1, 2
K_HEADS, V_HEADS, K_DIM, V_DIM, DELTA_KERNEL, CONV_KERNEL, GATED = range(7)
# mixing's shapes, a row per layer: what its attention's arrays are (gemma4's layers differ
# in head_dim and rotary): its head_dim, its RoPE angles (rotary / 2), q_dim, whether v is
# RMS-normed before it is stored (gemma4's layers with KV of their own), the widths of
# its q and k norms' weights (0: none)
HEAD_DIM, HALF, Q_DIM, V_NORM, Q_NORMS, K_NORMS = range(6)


@kernel(inline=True)
def floats_at(at, shape):
    """The float32 array of `shape` (a tuple) at address `at`."""
    return carray(voidptr(at), shape, np.float32)


@kernel(inline=True)
def conv_dim_of(dims):
    """The channels a delta net convolves: q, k and v."""
    return 2 * dims[K_HEADS] * dims[K_DIM] + dims[V_HEADS] * dims[V_DIM]


@kernel(inline=True)
def mixer_width(kind, dims, dim):
    """What a recurrent mixer hands its output product: value_dim (delta), dim (conv)."""
    return dims[V_HEADS] * dims[V_DIM] if kind == DELTA else dim


@kernel(inline=True)
def mixer_items(kind, dims, dim):
    """The parallel items of a recurrent layer's mixer for one sequence: its key heads
    (delta), its blocks of channels (conv)."""
    return dims[K_HEADS] if kind == DELTA else -(-dim // recurrent.BLOCK)


@kernel(inline=True)
def mixer_item(kind, h, mixing, at, state_at, eps, item, out, conv_qkv, bx, sk, sq):
    """Item `item` of a recurrent layer's mixer on one sequence's input projection h (1,
    in) into out (1, width): a key head of a delta net (recurrent.delta_key_head) or a
    block of a short convolution's channels (recurrent.short_block). at (4,): the
    addresses of its convolution, dt_bias, a and norm; state_at: of the sequence's state's
    conv and s; conv_qkv (1, conv_dim), bx (1, dim): the sequence's shared scratch; sk, sq
    (v_dim,): the thread's."""
    dims, heads, scale = mixing[2], mixing[3], mixing[4]
    if kind == DELTA:
        kh_n, hv_n, kd, vd = dims[K_HEADS], dims[V_HEADS], dims[K_DIM], dims[V_DIM]
        kk, c_n = dims[DELTA_KERNEL], conv_dim_of(dims)
        w, conv = floats_at(at[0], (kk, c_n)), floats_at(state_at[0], (kk - 1, c_n))
        s = floats_at(state_at[1], (hv_n, kd, vd))
        dt_bias, a = floats_at(at[1], (hv_n,)), floats_at(at[2], (hv_n,))
        norm = floats_at(at[3], (vd,))
        recurrent.delta_key_head(h, w, conv, s, dt_bias, a, norm, eps, heads, kh_n, kd, scale,
                                 item, conv_qkv, out, sk, sq)  # fmt: skip
    else:
        dim, kk = out.shape[1], dims[CONV_KERNEL]
        w, conv = floats_at(at[0], (kk, dim)), floats_at(state_at[0], (kk - 1, dim))
        c0 = item * recurrent.BLOCK
        recurrent.short_block(h, conv, w, bx, c0, min(dim, c0 + recurrent.BLOCK), out)


@kernel
def mixer_phase(sync, k, kind, h, mixing, at, state_at, eps, dim, bufs):
    """Phase k: a recurrent layer's mixer for each of B sequences (mixer_item), on their
    input projections h (B, in): B times its items, sequence b's state at state_at[b];
    their outputs into bufs' `mixed` as (B, width), returned. bufs: the shared scratch
    (mixer_scratch's, B times: mixed, the convolved q k v, B * x)."""
    dims, nb = mixing[2], h.shape[0]
    width, per = mixer_width(kind, dims, dim), mixer_items(kind, dims, dim)
    mixed = lay(bufs[0], nb, width, np.float32)
    conv_qkv = lay(bufs[1], nb, bufs[1].shape[0] // nb, np.float32)
    bx = lay(bufs[2], nb, bufs[2].shape[0] // nb, np.float32)
    sk, sq = np.empty(dims[V_DIM], np.float32), np.empty(dims[V_DIM], np.float32)
    finished, n = 0, nb * per
    t = take(sync, k, 1, n)
    while t < n:
        b, item = t // per, t % per
        mixer_item(kind, h[b].reshape((1, h.shape[1])), mixing, at, state_at[b], eps, item,
                   mixed[b].reshape((1, width)), conv_qkv[b].reshape((1, conv_qkv.shape[1])),
                   bx[b].reshape((1, bx.shape[1])), sk, sq)  # fmt: skip
        finished += 1
        t = take(sync, k, 1, n)
    finish(sync, k, finished, n)
    return mixed


@kernel(inline=True)
def ungate(h, q_dim, hd, qkv, gate):
    """qwen3_5's gated attention: h (2 q_dim + 2 kv_dim), each head's q then its gate,
    parted into qkv (q_dim + 2 kv_dim: q, k, v as attention takes them) and gate (q_dim)."""
    for head in range(q_dim // hd):
        for j in range(hd):
            qkv[head * hd + j] = h[2 * head * hd + j]
            gate[head * hd + j] = h[(2 * head + 1) * hd + j]
    for j in range(h.shape[0] - 2 * q_dim):
        qkv[q_dim + j] = h[2 * q_dim + j]
    return qkv[: h.shape[0] - q_dim]


@kernel(inline=True)
def gate_rows(y, gate):
    """y *= sigmoid(gate), elementwise (qwen3_5's gated attention)."""
    for j in range(y.shape[0]):
        y[j] *= sigmoid(gate[j])


@kernel
def sigmoid_gate(y, gate):
    """y (T, n) *= sigmoid(gate) (T, n): gate_rows per row, the call-by-call path's."""
    for t in range(y.shape[0]):
        gate_rows(y[t], gate[t])


@kernel(inline=True)
def layer_spec(spec, i, shape):
    """Layer i's attention spec (attention.spec_of) from the stacked one: its q and k
    norms (rows of spec's (L, n) arrays, as wide as its `shape` row says), its scale (of
    spec's (L,)), the shared eps and cap."""
    q, k = spec[0][i, : shape[Q_NORMS]], spec[1][i, : shape[K_NORMS]]
    return q, k, spec[2], spec[3][i], spec[4]


@kernel(inline=True)
def value_norms(qkv, n_kv, hd, eps):
    """gemma4: each KV head's value (qkv's last n_kv * hd) RMS-normed in place, without a
    weight (llama_np.model.ops.norm_heads)."""
    v0 = qkv.shape[0] - n_kv * hd
    for h in range(n_kv):
        v = qkv[v0 + h * hd : v0 + (h + 1) * hd]
        s = np.float32(0)
        for j in range(hd):
            s += v[j] * v[j]
        inv = np.float32(1) / np.sqrt(s / np.float32(hd) + eps)
        for j in range(hd):
            v[j] = v[j] * inv


@kernel
def norm_values(qkv, n_kv, hd, eps):
    """value_norms of every row of qkv (T, q_dim + 2 kv_dim), in place: the calls one by
    one's (llama_np's CompiledOps.norm_values)."""
    for t in range(qkv.shape[0]):
        value_norms(qkv[t], n_kv, hd, eps)


@kernel(inline=True)
def attention_input(h, shape, n_kv, eps, gated, own, gate):
    """What a layer's attention takes of its qkv product h: qwen3_5's q parted from its
    gates (ungate), gemma4's v normed (value_norms), each into the thread's own buffer
    `own` (the same arithmetic on each thread, so the same bits); else h itself."""
    hd, q_dim = shape[HEAD_DIM], shape[Q_DIM]
    if gated:
        return ungate(h, q_dim, hd, own, gate)
    if shape[V_NORM]:
        a = own[: h.shape[0]]
        a[:] = h
        value_norms(a, n_kv, hd, eps)
        return a
    return h


@kernel(inline=True)
def attention_phase(sync, k, h, i, eps, angles, stores, flat, mixing, own, gate, att):
    """Phase k, layer i's attention on its qkv product h, combined into att's first q_dim
    (returned), each array shaped by the layer's row of mixing's shapes: its head_dim, its
    stores at their addresses (kv_at[i]), its angles, its norms and scale."""
    cos, sin, spec = angles
    layout, kv_at, slots, n_keys = stores
    shape, n_kv = mixing[5][i], layout[KV_HEADS]
    hd, q_dim, half = shape[HEAD_DIM], shape[Q_DIM], shape[HALF]
    gated = mixing[2][GATED] != 0  # qwen3_5: each head's q then its gate
    a = attention_input(h, shape, n_kv, eps, gated, own, gate)
    top, total, part, run = pieces_in(flat, q_dim // hd, n_keys[i], hd)
    attend(sync, k, a, cos[i, :half], sin[i, :half], layer_spec(spec, i, shape), layout,
           kv_at[i], hd, slots[i], n_keys[i], run, top, total, part)  # fmt: skip
    mixed = att[:q_dim]
    attention.combine(top, total, part, mixed)
    if gated:
        gate_rows(mixed, gate)
    return mixed


@kernel
def member(sync, threads, x, weights, eps, form, angles, stores, ints, moe, mixing, per_layer,
           bufs, q_dim):  # fmt: skip
    """One thread's walk through every phase of every layer (decode_layers); bufs: the
    step's shared buffers (qkv, gate_up, y, attention's pieces, the router's logits, the
    experts' gate_up and down outputs, mixer_scratch's)."""
    start(sync)  # the step's start (team.phase_seconds)
    rows, factors, plan, norms, biases = weights
    qkv, gate_up, y, flat, logits, gate_ups, outs, mixer_bufs = bufs
    experts = moe.spec
    kinds, mix_at, dims, shapes = mixing[0], mixing[1], mixing[2], mixing[5]
    n = max(x.shape[0], gate_up.shape[0] // 2, q_dim, mixer_bufs[0].shape[0],
            per_layer[0].shape[1])  # fmt: skip
    buf, att = scratch(n), np.empty(q_dim, np.float32)
    own = dims[GATED] != 0 or shapes[:, V_NORM].any()  # (attention_input's buffers)
    qv, gate = np.empty(qkv.shape[0] if own else 0, np.float32), np.empty(q_dim, np.float32)
    # no bias, and the norm of a product without one (unread): arrays of the caller's, not
    # module constants, which numba types read-only (a second specialization of rmsnorm)
    none = biases[0, :0]
    pre, gate_mode, post, scale = form
    fused = not post and scale == np.float32(1)  # the residual add inside the products
    post_n = x.shape[0] if post else 0  # the post-norms' length (0: none)
    phases, scalars = phases_of(experts, per_layer), per_layer[1]
    sel, w = np.empty(max(experts[1], 1), np.int64), np.empty(max(experts[1], 1), np.float32)
    # x and y as one row: the residual and mixer phases take B rows (decode_few's too)
    rows_of_x, rows_of_y = x.reshape((1, x.shape[0])), y.reshape((1, y.shape[0]))
    for i in range(plan.shape[0]):
        p, k, kind = plan[i], phases * i, kinds[i]
        h = qkv[: out_rows(rows, p[0, 0], p[0, 1])]
        product(sync, k, threads, rows, factors, p[0, 0], p[0, 1], x, norms[i, 0], eps, pre,
                False, h, biases[i], buf, ints)  # fmt: skip
        if kind == ATTENTION:
            mixed = attention_phase(sync, k + 1, h, i, eps, angles, stores, flat, mixing, qv,
                                    gate, att)  # fmt: skip
        else:  # a recurrent mixer: its state's addresses in the layer's row of kv_at
            one = mixer_phase(sync, k + 1, kind, h.reshape((1, h.shape[0])), mixing, mix_at[i],
                              stores.kv_at[i].reshape((1, -1)), eps, x.shape[0],
                              mixer_bufs)  # fmt: skip
            mixed = one[0]
        product(sync, k + 2, threads, rows, factors, p[1, 0], p[1, 1], mixed, norms[i, 0], eps,
                PLAIN, fused, x if fused else y, none, buf, ints)  # fmt: skip
        if not fused:
            residual_phase(sync, k + 3, rows_of_x, rows_of_y, norms[i, 2, :post_n], eps, scale)
        if experts[0]:
            mlp_of_experts(sync, k + 4, threads, rows, factors, p, moe.routers[i], x, y,
                           (norms[i, 1], norms[i, 3, :post_n]), eps, form,
                           (experts, logits, sel, w, gate_ups, outs), moe.chosen[i], none, buf,
                           ints)  # fmt: skip
            continue
        g = gate_up[: out_rows(rows, p[2, 0], p[2, 1])]  # (gemma4's layers: widths differ)
        product(sync, k + 4, threads, rows, factors, p[2, 0], p[2, 1], x, norms[i, 1], eps, pre,
                False, g, none, buf, ints)  # fmt: skip
        product(sync, k + 5, threads, rows, factors, p[3, 0], p[3, 1], g, norms[i, 1], eps,
                gate_mode, fused, x if fused else y, none, buf, ints)  # fmt: skip
        if not fused:
            residual_phase(sync, k + 6, rows_of_x, rows_of_y, norms[i, 3, :post_n], eps, scale)
        if phases == LAYERED_PHASES:
            per_layer_add(sync, k + 7, threads, rows, factors, p, x, y, norms[i, 4], eps,
                          gate_mode, per_layer[0][i], scalars[i : i + min(scalars.shape[0], 1)],
                          buf, ints, none)  # fmt: skip


@kernel(inline=True)
def widest(rows, plan, j):
    """The most rows product j of any layer writes."""
    n = 0
    for i in range(plan.shape[0]):
        n = max(n, out_rows(rows, plan[i, j, 0], plan[i, j, 1]))
    return n


@kernel(inline=True)
def attention_shape(kinds, shapes):
    """The most query rows (q_dim) and the widest head_dim of the layers that attend
    (mixing's shapes)."""
    q_dim, hd = 0, 0
    for i in range(kinds.shape[0]):
        if kinds[i] == ATTENTION:
            q_dim, hd = max(q_dim, shapes[i, Q_DIM]), max(hd, shapes[i, HEAD_DIM])
    return q_dim, hd


@kernel(inline=True)
def mixer_scratch(kinds, dims, dim):
    """The recurrent mixers' shared buffers (mixer_phase): their output, the convolved q k
    v of a delta net, B * x of a short convolution (empty where no layer has them)."""
    width, conv = 0, 0
    for i in range(kinds.shape[0]):
        if kinds[i] != ATTENTION:
            width = max(width, mixer_width(kinds[i], dims, dim))
            conv = max(conv, dim if kinds[i] == CONV else 0)
    delta = conv_dim_of(dims) if dims[K_HEADS] else 0
    return np.empty(width, np.float32), np.empty(delta, np.float32), np.empty(conv, np.float32)


@kernel(parallel=True)
def decode_layers(x, weights, eps, form, angles, stores, ints, threads, moe, mixing, per_layer):
    """The decoder blocks of one decode step on the residual stream x (dim,), in place.
    weights, angles, stores, moe: Weights, Angles, Stores, Experts (one sequence's). form:
    (the prologue before attention and the MLP, NORM or PLAIN; the MLP's gate, SWIGLU or
    GEGLU; whether the sub-blocks' outputs are normed; the residual multiplier). mixing:
    (kinds (L,): each layer's mixer, ATTENTION, DELTA or CONV; at (L, 4): a recurrent
    layer's convolution, dt_bias, a and norm at their addresses; dims (7,):
    K_HEADS...GATED; heads (Hv,): the key head of each value head; scale: q's, float32;
    shapes (L, 6): each layer's attention shape, HEAD_DIM...K_NORMS). per_layer: gemma4's
    (inputs (L, 2 ple_dim): each layer's room for its gate's product, then its per-layer
    input; scalars (L,): each layer's output times it; (L, 0) and (0,): none). Each layer
    as llama_np.model.transformer.Transformer._layers runs it; the buffers are sized by
    the widest layer. One parallel loop, one iteration per thread (team.py): the phases
    share work through `sync`'s counters. `threads`: numba.get_num_threads() (asked
    inside, it would keep the kernel out of the disk cache). Returns `sync`: each phase's
    row (layer i's phases from phases_of(moe.spec, per_layer) i), then the step's start,
    with their clocks (team.phase_seconds)."""
    rows, plan, experts, kinds, dims = weights.rows, weights.plan, moe.spec, mixing[0], mixing[2]
    qkv = np.empty(widest(rows, plan, 0), np.float32)
    gate_up = np.empty(widest(rows, plan, 2), np.float32)
    y = np.empty(x.shape[0], np.float32)
    q_dim, hd = attention_shape(kinds, mixing[5])
    flat = pieces_scratch(q_dim // hd, stores.n_keys.max(), hd)
    mixer_bufs = mixer_scratch(kinds, dims, x.shape[0])
    sync = np.zeros((phases_of(experts, per_layer) * plan.shape[0] + 1, LINE), np.int64)
    logits = np.empty(experts[0], np.float32)
    gate_ups = np.empty((experts[1], gate_up.shape[0]), np.float32)
    outs = np.empty((experts[1], x.shape[0]), np.float32)
    cos, sin, spec = angles
    layout, kv_at, slots, n_keys = stores
    for _ in prange(threads):  # (the groups made again in the loop: see IN_THE_LOOP)
        member(sync, threads, x, weights, eps, form, Angles(cos, sin, spec),
               Stores(layout, kv_at, slots, n_keys), ints, moe, mixing, per_layer,
               (qkv, gate_up, y, flat, logits, gate_ups, outs, mixer_bufs), q_dim)  # fmt: skip
    return sync


def attending(layers: int, hd: int, half: int) -> tuple:
    """decode_layers' `mixing` for a model whose every layer attends alike (one KV head,
    one query head of hd, rotary 2 half, no norms)."""
    shapes = np.zeros((layers, 6), np.int64)
    shapes[:, [HEAD_DIM, HALF, Q_DIM]] = hd, half, hd
    return (np.zeros(layers, np.int64), np.zeros((layers, 4), np.int64), np.zeros(7, np.int64),
            np.zeros(1, np.int64), np.float32(1), shapes)  # fmt: skip


def plain(layers: int) -> tuple[np.ndarray, np.ndarray]:
    """decode_layers' `per_layer` for a model without per-layer inputs or scalars."""
    return np.zeros((layers, 0), np.float32), np.zeros(0, np.float32)


DENSE = np.zeros(3, np.int64)  # Experts.spec for a model without


def moe_spec(n_experts: int, k: int, renormalize: bool) -> np.ndarray:
    """Experts.spec: (E, k, renormalize), or DENSE."""
    return np.array([n_experts, k, renormalize], np.int64) if n_experts > 1 else DENSE


def warm_up(keys: tuple[np.ndarray, ...], values: tuple[np.ndarray, ...]) -> None:
    """Compile decode_layers (or load it from the disk cache: one kernel for every KV
    format), running it on these stores (one KV head of 32, tiled keys), on one layer of
    width 32 in float32."""
    dim, hd = 32, values[0].shape[2]
    ws = [np.zeros((rows, cols), np.float32) for rows, cols in
          ((3 * hd, dim), (dim, hd), (dim, dim), (dim, dim // 2))]  # fmt: skip
    t = table([Operands(F32, w.shape[0], (w,)) for w in ws])
    plan = np.array([[[0, 1], [1, 2], [2, 3], [3, 4], [4, 4], [4, 4]]], np.int64)
    kv_at = np.array([[address(a) for a in keys + values]], np.int64)
    cos = np.ones((1, hd // 2), np.float32)
    none = np.zeros((1, 0), np.float32)
    spec = attention.spec_of(none, none, 1e-5, np.ones(1, np.float32), 0.0)
    weights = Weights(t.rows, t.factors, plan, np.ones((1, 5, dim), np.float32), none)
    stores = Stores(layout_of(keys, values), kv_at, np.zeros(1, np.int64), np.ones(1, np.int64))
    moe = Experts(DENSE, np.zeros((1, 2), np.int64), np.zeros((1, 1), np.int64))
    decode_layers(np.ones(dim, np.float32), weights, np.float32(1e-5),
                  (NORM, SWIGLU, False, np.float32(1)), Angles(cos, cos * 0, spec), stores, 0, 1,
                  moe, attending(1, hd, hd // 2), plain(1))  # fmt: skip
