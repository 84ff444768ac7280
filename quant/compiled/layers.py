"""A decode step's decoder blocks in one compiled call.

Called block by block, a token of SmolLM2-135M makes ~150 kernel calls, and each costs
~13 us outside the kernel (scripts/call_overhead.py): numba's dispatch unboxing a dozen
arguments, and the Python around it (the seam, the meter, the operations). On a 4-bit
model that is 10-18% of a token. Here the whole stack of blocks is one call: `decode_blocks`
runs, in llama_np.model.transformer's order, every layer's products, attention, norms and
residual additions by calling the very kernels the block-by-block path calls, so the
logits are the same bit for bit; what remains per product is the parallel region's launch.

The weights reach the kernel as a table of addresses, one row per matrix (`Table`): a call
then unboxes two small arrays instead of ~120 matrices' arrays (a numba typed List of them
measured ~30 us a call to unbox and ~1 s to build), and a row of any format fits the same
table. The arrays themselves stay where the formats keep them; the Table holds them alive.
The KV cache's layers reach it the same way, as addresses of arrays of one shape.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from llvmlite import ir
from numba import carray, types
from numba.core.extending import intrinsic, overload

from . import attention, ggml, intdot, matvec
from .jit import kernel
from .ops import NO_NORM, NORM, PLAIN, SWIGLU, ZERO, prologue

# what a row of the table multiplies, and so which kernel runs it
F32, F16, BF16, Q8_0, Q4, Q5, KQUANT = range(7)
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
    """Rows of operands for decode_blocks: `rows` (n, COLUMNS) int64, `factors` (n,)
    float32, and `keep`, the arrays the addresses point into (held alive here)."""

    rows: np.ndarray
    factors: np.ndarray
    keep: list[np.ndarray]


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
def run(rows, factors, p, x, norm, eps, mode, add, out, int8):
    """out (=, or += when add) W_p @ prologue(x) by W_p's own kernel, the same call
    quant.compiled.weights makes for it; x multiplied as int8 when `int8` and W_p is
    quantized."""
    kind = rows[p, KIND]
    if kind == F32:
        matvec.matvec_f32(operand(rows, p, 0, np.float32), x, norm, eps, mode, add, out)
    elif kind == F16 or kind == BF16:
        bits = operand(rows, p, 0, np.uint16)
        if kind == F16:
            matvec.matvec_f16(bits, x, norm, eps, mode, add, out)
        else:
            matvec.matvec_bf16(bits, x, norm, eps, mode, add, out)
    elif kind == KQUANT:
        blocks, code, n = operand(rows, p, 0, np.uint8), rows[p, CODE], rows[p, NBYTES]
        if int8:
            intdot.matvec_k(blocks, code, n, x, norm, eps, mode, add, out)
        else:
            ggml.matvec_ggml(blocks, code, n, rows[p, WEIGHTS], x, norm, eps, mode, add, out)
    else:
        codes, scales = operand(rows, p, 0, np.uint8), operand(rows, p, 1, np.uint16)
        if kind == Q8_0:
            if int8:
                intdot.matvec_q8_0(codes, scales, x, norm, eps, mode, add, out)
            else:
                matvec.matvec_q8_0(codes, scales, x, norm, eps, mode, add, out)
            return
        mins, factor = operand(rows, p, 2, np.uint16), factors[p]
        bits = operand(rows, p, 3, np.uint32)
        if int8:
            intdot.matvec_q4(codes, scales, mins, factor, bits, x, norm, eps, mode, add, out)
        elif kind == Q4:
            matvec.matvec_q4(codes, scales, mins, factor, x, norm, eps, mode, add, out)
        else:
            matvec.matvec_q5(codes, scales, mins, factor, bits, x, norm, eps, mode, add, out)


@kernel
def product(rows, factors, p0, p1, x, norm, eps, mode, add, out, int8):
    """out (=, or += when add) W @ prologue(x) for W the rows p0:p1 of the table stacked:
    one kernel for one matrix; for a stack of several formats, the prologue once, then one
    kernel per part (llama_np.model.ops_compiled.product, compiled)."""
    if p1 - p0 == 1:
        run(rows, factors, p0, x, norm, eps, mode, add, out, int8)
        return
    h = prologue(x, norm, eps, mode)
    r0 = 0
    for p in range(p0, p1):
        r1 = r0 + rows[p, ROWS]
        run(rows, factors, p, h, NO_NORM, ZERO, PLAIN, add, out[r0:r1], int8)
        r0 = r1


def at_addresses(store, at):
    """A layer's KV store: `store`'s tuple of arrays (layer 0's) with its shapes and dtypes,
    at the addresses `at` (one per array)."""


@overload(at_addresses, inline="always")
def _at_addresses(store, at):
    if len(store) == 1:
        return lambda store, at: (carray(voidptr(at[0]), store[0].shape, store[0].dtype),)
    return lambda store, at: (
        carray(voidptr(at[0]), store[0].shape, store[0].dtype),
        carray(voidptr(at[1]), store[1].shape, store[1].dtype),
    )


@kernel
def out_rows(rows, p0, p1):
    """Rows of the matrix that table rows p0:p1 stack."""
    n = 0
    for p in range(p0, p1):
        n += rows[p, ROWS]
    return n


@kernel
def decode_blocks(x, rows, factors, plan, norms, biases, eps, cos, sin, keys, values, kv_at,
                  slot, n_keys, int8):  # fmt: skip
    """The decoder blocks of one decode step on the residual stream x (dim,), in place.
    plan (L, 4, 2): per layer, the table rows of its products qkv, o, gate_up and down;
    norms (L, 2, dim): the attention and MLP norms; biases (L, qkv rows) or (L, 0);
    cos, sin (hd / 2,): the token's RoPE angle; keys, values: layer 0's KV stores, and
    kv_at (L, arrays of both): every layer's at its addresses; slot, n_keys: the span.
    Each layer as llama_np.model.transformer.Transformer._blocks runs it; every layer has
    layer 0's shapes (the buffers are sized by it)."""
    n_kv, hd = values[0].shape[0], cos.shape[0] * 2
    qkv = np.empty(out_rows(rows, plan[0, 0, 0], plan[0, 0, 1]), np.float32)
    att = np.empty(qkv.shape[0] - 2 * n_kv * hd, np.float32)
    gate_up = np.empty(out_rows(rows, plan[0, 2, 0], plan[0, 2, 1]), np.float32)
    nk = len(keys)
    for i in range(plan.shape[0]):
        p = plan[i]
        product(rows, factors, p[0, 0], p[0, 1], x, norms[i, 0], eps, NORM, False, qkv, int8)
        for j in range(biases.shape[1]):
            qkv[j] += biases[i, j]
        k = at_addresses(keys, kv_at[i, :nk])
        v = at_addresses(values, kv_at[i, nk:])
        attention.attend(qkv, cos, sin, k, v, slot, n_keys, att)
        product(rows, factors, p[1, 0], p[1, 1], att, NO_NORM, eps, PLAIN, True, x, int8)
        product(rows, factors, p[2, 0], p[2, 1], x, norms[i, 1], eps, NORM, False, gate_up,
                int8)  # fmt: skip
        product(rows, factors, p[3, 0], p[3, 1], gate_up, NO_NORM, eps, SWIGLU, True, x, int8)


def warm_up(keys: tuple[np.ndarray, ...], values: tuple[np.ndarray, ...]) -> None:
    """Compile decode_blocks (or load it from the disk cache) for the KV format of these
    stores (one KV head of 32, tiled keys), on one layer of width 32 in float32."""
    dim, hd = 32, values[0].shape[2]
    ws = [np.zeros((rows, cols), np.float32) for rows, cols in
          ((3 * hd, dim), (dim, hd), (dim, dim), (dim, dim // 2))]  # fmt: skip
    t = table([Operands(F32, w.shape[0], (w,)) for w in ws])
    plan = np.array([[[0, 1], [1, 2], [2, 3], [3, 4]]], np.int64)
    kv_at = np.array([[address(a) for a in keys + values]], np.int64)
    cos = np.ones(hd // 2, np.float32)
    decode_blocks(np.ones(dim, np.float32), t.rows, t.factors, plan,
                  np.ones((1, 2, dim), np.float32), np.zeros((1, 0), np.float32),
                  np.float32(1e-5), cos, cos * 0, keys, values, kv_at, 0, 1, False)  # fmt: skip
