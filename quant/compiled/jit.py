"""What every compiled kernel shares: numba set up once, and the few LLVM instructions
NumPy-style numba code cannot express.

Threads: numba's OpenMP threading layer, on purpose. Its threads spin for a while after a
parallel loop ends, so the next kernel of a decode step starts in ~1 us instead of paying
a wake-up (~60 us per call with the default workqueue layer on these machines, and a
token of SmolLM2 makes ~150 kernel calls). GOMP_SPINCOUNT bounds that spin to ~1 ms, so
an idle llama-np (between chat turns) gives its cores back almost at once. When OpenMP
cannot be loaded, numba falls back to its workqueue layer, and `threading_layer()` says so.

Kernels are compiled on first use and cached on disk (`cache=True`): only the first run
on a machine pays the compile time.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

# Read by libgomp when numba first loads its OpenMP pool: spin ~1 ms before sleeping
# (the default, 300,000 spins, measured ~10 ms of a busy core here after the last call).
os.environ.setdefault("GOMP_SPINCOUNT", "30000")

import numba
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.core.cpu_options import ParallelOptions
from numba.core.errors import RequireLiteralValue
from numba.core.extending import intrinsic

if "NUMBA_THREADING_LAYER" not in os.environ:
    numba.config.THREADING_LAYER = "default"
    numba.config.THREADING_LAYER_PRIORITY = ["omp", "workqueue", "tbb"]

# Only explicit prange loops run in parallel. By default numba also turns every array
# expression of a parallel function (np.zeros, a[:] = 0, x.copy()) into a parallel loop
# of its own: ten of them cost a decode attention ~25 us in thread hand-overs. Given as
# an options object, not a dict: numba pops the keys of a dict as it reads them, so a
# function's second specialization would get the defaults back (numba 0.68).
PRANGE_ONLY = ParallelOptions(
    dict.fromkeys(
        ("comprehension", "reduction", "inplace_binop", "setitem", "numpy", "stencil", "fusion"),
        False,
    )
    | {"prange": True}
)

# Floating-point freedoms the kernels may use: fused multiply-add and reassociated sums
# (the vector lanes), never the ones that change results on NaN, infinity or division.
FASTMATH = {"contract", "reassoc", "nsz"}


def kernel(fn=None, *, parallel: bool = False, inline: bool = False):
    """@kernel: compiled with numba, cached on disk, float32 fast math as above.
    `inline`: a helper inlined into its callers (numba compiles each function on its own,
    and LLVM never inlines across them: a helper called in a hot loop must be inlined to
    vectorize with it)."""

    options = dict(fastmath=FASTMATH, cache=True, nogil=True)
    options |= dict(parallel=PRANGE_ONLY if parallel else False)
    options |= dict(inline="always" if inline else "never")

    def wrap(f):
        return numba.njit(f, **options)

    return wrap(fn) if fn is not None else wrap


@contextlib.contextmanager
def kernel_cache() -> Iterator[None]:
    """Kernels defined inside are cached on disk in the project's cache, under a key made
    of every source file of this package and numba's version. numba itself keys a
    kernel's cache on its own file only, so a change to a helper in another file (this
    one) would load stale machine code; and the project's cache is the one kept between
    runs. An explicit NUMBA_CACHE_DIR wins."""
    from ..host import cache_dir

    saved = numba.config.CACHE_DIR
    if not os.environ.get("NUMBA_CACHE_DIR"):
        h = hashlib.sha256(numba.__version__.encode())
        for source in sorted(Path(__file__).parent.glob("*.py")):
            h.update(source.read_bytes())
        numba.config.CACHE_DIR = str(cache_dir() / "kernels" / h.hexdigest()[:16])
    try:
        yield
    finally:
        numba.config.CACHE_DIR = saved


def threading_layer() -> str:
    """The layer numba's parallel kernels run on ('omp', 'workqueue' or 'tbb'); known
    once a parallel kernel has run."""
    from numba.np.ufunc import parallel

    try:
        return parallel.threading_layer()
    except ValueError:
        return "not started"


def set_threads(n: int) -> int:
    """Threads the parallel kernels use (at most the number numba started with)."""
    n = max(1, min(n, numba.config.NUMBA_NUM_THREADS))
    numba.set_num_threads(n)
    return n


# --- LLVM instructions for the kernels -------------------------------------------------


def _stack(n, lltype, nbtype):
    if not isinstance(n, types.IntegerLiteral):
        raise RequireLiteralValue(n)
    size = n.literal_value

    def codegen(context, builder, signature, args):
        return cgutils.alloca_once(builder, lltype, size=size)

    return types.CPointer(nbtype)(n), codegen


@intrinsic
def stack_f32(typingctx, n):
    """A pointer to `n` (a constant) float32 on the stack. Accumulators kept there never
    alias an argument, so LLVM keeps them in vector registers; an array from np.empty
    lives on the heap and is stored back on every step."""
    return _stack(n, ir.FloatType(), types.float32)


@intrinsic
def f16(typingctx, bits):
    """float16 bits (uint16) -> float32: one vcvtph2ps."""

    def codegen(context, builder, signature, args):
        return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.FloatType())

    return types.float32(types.uint16), codegen


@intrinsic
def bf16(typingctx, bits):
    """bfloat16 bits (uint16) -> float32: the top half of a float32."""

    def codegen(context, builder, signature, args):
        wide = builder.shl(builder.zext(args[0], ir.IntType(32)), ir.Constant(ir.IntType(32), 16))
        return builder.bitcast(wide, ir.FloatType())

    return types.float32(types.uint16), codegen


@intrinsic
def to_f16(typingctx, x):
    """float32 -> float16 bits (uint16), rounded to nearest even as NumPy's astype."""

    def codegen(context, builder, signature, args):
        return builder.bitcast(builder.fptrunc(args[0], ir.HalfType()), ir.IntType(16))

    return types.uint16(types.float32), codegen


@intrinsic
def pow2(typingctx, n):
    """2.0 ** n as float32 for an integer -126 <= n <= 127, built from its bits."""

    def codegen(context, builder, signature, args):
        i32 = ir.IntType(32)
        e = builder.add(args[0], ir.Constant(i32, 127))
        return builder.bitcast(builder.shl(e, ir.Constant(i32, 23)), ir.FloatType())

    return types.float32(types.int32), codegen


@intrinsic
def f16x4(typingctx, src, i, dst):
    """dst[0:4] = the float16 values src[i:i+4] as float32, in one vector conversion. A
    scalar float16 load is an insert into a vector register that LLVM merges with whatever
    the register held, which chains every block's scale to the previous accumulator."""

    def codegen(context, builder, sig, args):
        s = context.make_array(sig.args[0])(context, builder, args[0])
        d = context.make_array(sig.args[2])(context, builder, args[2])
        half4 = ir.VectorType(ir.HalfType(), 4)
        v = builder.load(builder.bitcast(builder.gep(s.data, [args[1]]), half4.as_pointer()))
        f = builder.fpext(v, ir.VectorType(ir.FloatType(), 4))
        builder.store(f, builder.bitcast(d.data, f.type.as_pointer()))

    return types.void(src, types.intp, dst), codegen


# Numba widens uint8 arithmetic to int64, and LLVM then converts int64 to float (eight
# lanes per instruction, not sixteen): these stay in 8 bits up to the conversion.


@intrinsic
def lo4(typingctx, q):
    """The low nibble of a byte, as float32."""

    def codegen(context, builder, signature, args):
        return builder.uitofp(builder.and_(args[0], ir.Constant(args[0].type, 15)), ir.FloatType())

    return types.float32(types.uint8), codegen


@intrinsic
def hi4(typingctx, q):
    """The high nibble of a byte, as float32."""

    def codegen(context, builder, signature, args):
        return builder.uitofp(builder.lshr(args[0], ir.Constant(args[0].type, 4)), ir.FloatType())

    return types.float32(types.uint8), codegen


@intrinsic
def u8(typingctx, q):
    """A byte as float32 (its unsigned value)."""

    def codegen(context, builder, signature, args):
        return builder.uitofp(args[0], ir.FloatType())

    return types.float32(types.uint8), codegen


@intrinsic
def i8(typingctx, q):
    """A byte as float32, read as a signed int8."""

    def codegen(context, builder, signature, args):
        return builder.sitofp(args[0], ir.FloatType())

    return types.float32(types.uint8), codegen


# --- sixteen float32 lanes -----------------------------------------------------------
# Where a loop must run across 16 lanes that LLVM would rather unroll and reduce one by
# one (16 scores of a tile of keys), these say it directly: one vector instruction each.

LANES = 16


def _lanes(builder, ary, offset, kind: str):
    """Sixteen elements of `ary` from flat index `offset`, as a <16 x float>."""
    elem = {"f32": ir.FloatType(), "f16": ir.HalfType(), "i8": ir.IntType(8)}[kind]
    ptr = builder.gep(ary.data, [offset])
    v = builder.load(builder.bitcast(ptr, ir.VectorType(elem, LANES).as_pointer()), align=1)
    f32x16 = ir.VectorType(ir.FloatType(), LANES)
    if kind == "f16":
        return builder.fpext(v, f32x16)
    if kind == "i8":
        return builder.sitofp(v, f32x16)
    return v


def _splat(builder, x):
    vt = ir.VectorType(x.type, LANES)
    one = builder.insert_element(ir.Constant(vt, ir.Undefined), x, ir.Constant(ir.IntType(32), 0))
    return builder.shuffle_vector(
        one, ir.Constant(vt, ir.Undefined), ir.Constant(vt.__class__(ir.IntType(32), LANES), None)
    )


def _fma_lanes(kind: str):
    def fma16(typingctx, acc, at, a, src, offset):
        """acc.flat[at:at + 16] += a * src.flat[offset:offset + 16]: `a` a float32, or an
        array whose first 16 elements are used; src float32, float16 bits or int8 codes,
        by `kind`. Arrays must be C-contiguous."""
        scalar = isinstance(a, types.Float)

        def codegen(context, builder, sig, args):
            acc_ary = context.make_array(sig.args[0])(context, builder, args[0])
            f32x16 = ir.VectorType(ir.FloatType(), LANES).as_pointer()
            acc_ptr = builder.bitcast(builder.gep(acc_ary.data, [args[1]]), f32x16)
            if scalar:
                av = _splat(builder, args[2])
            else:
                a_ary = context.make_array(sig.args[2])(context, builder, args[2])
                av = _lanes(builder, a_ary, ir.Constant(ir.IntType(64), 0), "f32")
            src_ary = context.make_array(sig.args[3])(context, builder, args[3])
            src = _lanes(builder, src_ary, args[4], kind)
            product = builder.fmul(av, src, flags=["contract"])
            total = builder.fadd(builder.load(acc_ptr, align=4), product, flags=["contract"])
            builder.store(total, acc_ptr, align=4)

        return types.void(acc, types.intp, a, src, types.intp), codegen

    fma16.__name__ = f"fma16_{kind}"
    return intrinsic(fma16)


def _mul_lanes(kind: str):
    def mul16(typingctx, dst, at, a, src, offset):
        """dst.flat[at:at + 16] = a * src.flat[offset:offset + 16]: `a` a float32, src
        int8 codes (or float16 bits, float32), by `kind`. Arrays must be C-contiguous."""

        def codegen(context, builder, sig, args):
            dst_ary = context.make_array(sig.args[0])(context, builder, args[0])
            f32x16 = ir.VectorType(ir.FloatType(), LANES).as_pointer()
            dst_ptr = builder.bitcast(builder.gep(dst_ary.data, [args[1]]), f32x16)
            src_ary = context.make_array(sig.args[3])(context, builder, args[3])
            src = _lanes(builder, src_ary, args[4], kind)
            builder.store(builder.fmul(_splat(builder, args[2]), src), dst_ptr, align=4)

        return types.void(dst, types.intp, a, src, types.intp), codegen

    mul16.__name__ = f"mul16_{kind}"
    return intrinsic(mul16)


mul16_i8 = _mul_lanes("i8")  # dst[at:at + 16] = a * int8 codes[offset:offset + 16]


def _nibble_lanes(high: bool):
    def nib16(typingctx, dst, at, d, m, src, offset):
        """dst.flat[at:at + 16] = d * q + m for q the low (or high) nibbles of the 16 bytes
        src.flat[offset:offset + 16] (uint8). Arrays must be C-contiguous."""

        def codegen(context, builder, sig, args):
            dst_ary = context.make_array(sig.args[0])(context, builder, args[0])
            src_ary = context.make_array(sig.args[4])(context, builder, args[4])
            i8x16 = ir.VectorType(ir.IntType(8), LANES)
            ptr = builder.bitcast(builder.gep(src_ary.data, [args[5]]), i8x16.as_pointer())
            raw = builder.load(ptr, align=1)
            if high:
                q = builder.lshr(raw, ir.Constant(i8x16, [4] * LANES))
            else:
                q = builder.and_(raw, ir.Constant(i8x16, [15] * LANES))
            f = builder.uitofp(q, ir.VectorType(ir.FloatType(), LANES))
            value = builder.fadd(
                builder.fmul(_splat(builder, args[2]), f), _splat(builder, args[3])
            )
            f32x16 = ir.VectorType(ir.FloatType(), LANES).as_pointer()
            builder.store(value, builder.bitcast(builder.gep(dst_ary.data, [args[1]]), f32x16),
                          align=4)  # fmt: skip

        return types.void(dst, types.intp, d, m, src, types.intp), codegen

    nib16.__name__ = "hi16" if high else "lo16"
    return intrinsic(nib16)


lo16 = _nibble_lanes(False)  # dst[at:at + 16] = d * (low nibbles of 16 bytes) + m
hi16 = _nibble_lanes(True)  # ... the high nibbles

fma16 = _fma_lanes("f32")  # acc[at:at + 16] += a * src[offset:offset + 16]
fma16_f16 = _fma_lanes("f16")  # ... with src float16 bits
fma16_i8 = _fma_lanes("i8")  # ... with src int8 codes


@intrinsic
def add16(typingctx, dst, at, src, src_at):
    """dst.flat[at:at + 16] += src.flat[src_at:src_at + 16] (float32, C-contiguous)."""

    def codegen(context, builder, sig, args):
        f32x16 = ir.VectorType(ir.FloatType(), LANES).as_pointer()
        d = context.make_array(sig.args[0])(context, builder, args[0])
        s = context.make_array(sig.args[2])(context, builder, args[2])
        dp = builder.bitcast(builder.gep(d.data, [args[1]]), f32x16)
        sp = builder.bitcast(builder.gep(s.data, [args[3]]), f32x16)
        total = builder.fadd(builder.load(dp, align=4), builder.load(sp, align=4))
        builder.store(total, dp, align=4)

    return types.void(dst, types.intp, src, types.intp), codegen


@intrinsic
def set16(typingctx, dst, at, src, src_at):
    """dst.flat[at:at + 16] = src.flat[src_at:src_at + 16] (float32, C-contiguous)."""

    def codegen(context, builder, sig, args):
        f32x16 = ir.VectorType(ir.FloatType(), LANES).as_pointer()
        d = context.make_array(sig.args[0])(context, builder, args[0])
        s = context.make_array(sig.args[2])(context, builder, args[2])
        dp = builder.bitcast(builder.gep(d.data, [args[1]]), f32x16)
        sp = builder.bitcast(builder.gep(s.data, [args[3]]), f32x16)
        builder.store(builder.load(sp, align=4), dp, align=4)

    return types.void(dst, types.intp, src, types.intp), codegen


@intrinsic
def zero16(typingctx, dst, at):
    """dst.flat[at:at + 16] = 0 (float32, C-contiguous)."""

    def codegen(context, builder, sig, args):
        f32x16 = ir.VectorType(ir.FloatType(), LANES)
        d = context.make_array(sig.args[0])(context, builder, args[0])
        dp = builder.bitcast(builder.gep(d.data, [args[1]]), f32x16.as_pointer())
        builder.store(ir.Constant(f32x16, None), dp, align=4)

    return types.void(dst, types.intp), codegen


@intrinsic
def fma16vv(typingctx, acc, at, a, a_at, b, b_at):
    """acc.flat[at:at + 16] += a.flat[a_at:a_at + 16] * b.flat[b_at:b_at + 16] (float32)."""

    def codegen(context, builder, sig, args):
        f32x16 = ir.VectorType(ir.FloatType(), LANES).as_pointer()

        def lanes(k: int, at_arg: int):
            ary = context.make_array(sig.args[k])(context, builder, args[k])
            return builder.bitcast(builder.gep(ary.data, [args[at_arg]]), f32x16)

        dp, a_lanes, b_lanes = lanes(0, 1), lanes(2, 3), lanes(4, 5)
        a_val, b_val = builder.load(a_lanes, align=4), builder.load(b_lanes, align=4)
        product = builder.fmul(a_val, b_val, flags=["contract"])
        total = builder.fadd(builder.load(dp, align=4), product, flags=["contract"])
        builder.store(total, dp, align=4)

    return types.void(acc, types.intp, a, types.intp, b, types.intp), codegen


@intrinsic
def bit(typingctx, word, j):
    """Bit j (an integer below 32) of a uint32 word, as float32 0.0 or 1.0, in 32-bit
    lanes (numba's own shifts widen to 64 bits and halve the lanes of a vector)."""

    def codegen(context, builder, signature, args):
        i32 = ir.IntType(32)
        shifted = builder.lshr(args[0], builder.trunc(args[1], i32))
        return builder.uitofp(builder.and_(shifted, ir.Constant(i32, 1)), ir.FloatType())

    return types.float32(types.uint32, types.intp), codegen


@intrinsic
def field(typingctx, byte, shift, mask):
    """(byte >> shift) & mask as float32, in 8-bit lanes: a bit field of a stored byte."""

    def codegen(context, builder, signature, args):
        i8t = ir.IntType(8)
        v = builder.lshr(args[0], builder.trunc(args[1], i8t))
        return builder.uitofp(builder.and_(v, builder.trunc(args[2], i8t)), ir.FloatType())

    return types.float32(types.uint8, types.intp, types.intp), codegen
