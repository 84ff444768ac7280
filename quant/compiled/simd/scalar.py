"""Scalar conversions the kernels need in one instruction each, which numba would
otherwise widen (it computes uint8 arithmetic in int64, and LLVM then converts int64 to
float eight lanes per instruction, not sixteen). LLVM vectorizes a loop of them like any
scalar code: f16 becomes vcvtph2ps, the nibble and bit-field reads vpand/vpsrlw +
vcvtdq2ps on 8-bit lanes, pow2 a shift of the exponent bits."""

from __future__ import annotations

from llvmlite import ir
from numba import carray, types
from numba.core import cgutils
from numba.core.errors import RequireLiteralValue
from numba.core.extending import intrinsic

from ..jit import kernel


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


@kernel(inline=True)
def f32(x):
    """A float32 as it is: the twin of f16 and bf16, for a loop written for all three."""
    return x


@intrinsic
def bf16(typingctx, bits):
    """bfloat16 bits (uint16) -> float32: the top half of a float32 (a zero-extend and a
    shift: vpmovzxwd + vpslld in a vectorized loop)."""

    def codegen(context, builder, signature, args):
        wide = builder.shl(builder.zext(args[0], ir.IntType(32)), ir.Constant(ir.IntType(32), 16))
        return builder.bitcast(wide, ir.FloatType())

    return types.float32(types.uint16), codegen


@intrinsic
def to_f16(typingctx, x):
    """float32 -> float16 bits (uint16), rounded to nearest even as NumPy's astype: one
    vcvtps2ph."""

    def codegen(context, builder, signature, args):
        return builder.bitcast(builder.fptrunc(args[0], ir.HalfType()), ir.IntType(16))

    return types.uint16(types.float32), codegen


@intrinsic
def pow2(typingctx, n):
    """2.0 ** n as float32 for an integer -126 <= n <= 127, built from its bits: an add and
    a shift of the exponent (vpaddd + vpslld)."""

    def codegen(context, builder, signature, args):
        i32 = ir.IntType(32)
        e = builder.add(args[0], ir.Constant(i32, 127))
        return builder.bitcast(builder.shl(e, ir.Constant(i32, 23)), ir.FloatType())

    return types.float32(types.int32), codegen


@intrinsic
def recip(typingctx, x):
    """1 / x for a float32 x, one division (vdivps in a vectorized loop): numba's own `/`
    checks for a zero divisor and raises, a branch that keeps the loop around it scalar."""

    def codegen(context, builder, signature, args):
        return builder.fdiv(ir.Constant(ir.FloatType(), 1.0), args[0])

    return types.float32(types.float32), codegen


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


@intrinsic
def lo4(typingctx, q):
    """The low nibble of a byte, as float32: an and in 8-bit lanes (vpand), then widened
    and converted (vpmovzxbd + vcvtdq2ps)."""

    def codegen(context, builder, signature, args):
        return builder.uitofp(builder.and_(args[0], ir.Constant(args[0].type, 15)), ir.FloatType())

    return types.float32(types.uint8), codegen


@intrinsic
def u8(typingctx, q):
    """A byte as float32 (its unsigned value): vpmovzxbd + vcvtdq2ps."""

    def codegen(context, builder, signature, args):
        return builder.uitofp(args[0], ir.FloatType())

    return types.float32(types.uint8), codegen


@intrinsic
def i8(typingctx, q):
    """A byte as float32, read as a signed int8: vpmovsxbd + vcvtdq2ps."""

    def codegen(context, builder, signature, args):
        return builder.sitofp(args[0], ir.FloatType())

    return types.float32(types.uint8), codegen


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


@intrinsic
def pointer_to(typingctx, a, i):
    """A typed pointer to a.flat[i] (a C-contiguous)."""

    def codegen(context, builder, signature, args):
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        return builder.gep(ary.data, [args[1]])

    return types.CPointer(a.dtype)(a, types.intp), codegen


@kernel(inline=True)
def row(a, g):
    """Row g of the 2-D C-contiguous a, as an array that holds no reference to a's memory:
    a view (a[g]) taken in a hot loop costs a reference count taken and dropped, two calls
    into numba's runtime. For arrays the caller keeps alive."""
    return carray(pointer_to(a, g * a.shape[1]), a.shape[1])


AHEAD = 4096  # bytes: how far ahead of a block kernel's reads ahead() asks into L1
AHEAD_L2 = 16384  # ... and into L2
# bytes: float rows shorter than this are read one at a time by few vectors (fewdot.rows_float)
# and asked for ahead by many (broadcast.py): the hardware prefetcher picks up 4-8 streams
# of such rows too late
SHORT_ROW = 4096
FLOAT_AHEAD = 32768  # bytes: how far ahead of a float row's read ask_row asks


@kernel(inline=True)
def ask_row(w, r, end):
    """Ask for the lines of the row FLOAT_AHEAD bytes (at least one row) past row r of the
    2-D C-contiguous w into L2, if it is before row `end` (the thread's own rows: lines
    fetched into this core's L2 for rows the other thread takes cost it a trip across).
    A few vectors' thread reads its short rows one at a time, one stream, which the
    hardware prefetcher alone follows too slowly (fewdot.rows_float). One vector's decode
    (matvec.rows_float) does not ask: alone, from DRAM, it ran 20-35% faster asking (2
    threads, Xeon family 6 model 167: 3072 x 576 f32 161-193 us where 256-265, 2048 x 2048
    431-478 where 558-570), but the one-call step of SmolLM2-135M f32 did not (19.6-20.1
    ms where 19.8-20.3) and Qwen2.5-Coder's ran 0-6% slower (73.9-74.6 where 70.2-73.9)."""
    cols = w.shape[1]
    later = r + max(1, FLOAT_AHEAD // (cols * w.itemsize))
    if later < end:
        ask_l2(w, later * cols, cols)


@kernel(inline=True)
def ask_l2(a, at, n):
    """Ask for the lines of a.flat[at:at + n] into L2 (prefetch_l2), one ask a line."""
    for k in range(0, n, 64 // a.itemsize):
        prefetch_l2(a, at + k)


@intrinsic
def prefetch(typingctx, a, i):
    """Ask for the cache line of a.flat[i] (`prefetcht0`; never faults, so i may run past
    a's end). A thread of the block kernels reads its groups as one stream, and the
    hardware prefetcher alone fell behind: on the 2-vCPU Xeon VM, q4_0 int16 products of
    4864 x 1024 from DRAM streamed 10.7 GB/s, 14.1-14.4 with a line asked for 2-4 KiB
    ahead each block (a kernel copy timed side by side), and a SmolLM2-135M token as stored
    fell from 9.7-11.2 to 7.6-8.3 ms (DEVELOPERS.md, "Prefetch")."""

    return types.none(a, types.intp), _prefetch_at(3)


@intrinsic
def prefetch_l2(typingctx, a, i):
    """prefetch() into L2 and beyond, not L1 (`prefetcht1`): an ask that holds an L2 miss
    slot, of which a core has several times more than of L1's fill buffers."""
    return types.none(a, types.intp), _prefetch_at(2)


def _prefetch_at(locality: int):
    """The codegen of an ask for the line of a.flat[i] (prefetch_ir's locality)."""

    def codegen(context, builder, signature, args):
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        prefetch_ir(builder, builder.gep(ary.data, [args[1]]), locality)
        return context.get_dummy_value()

    return codegen


def prefetch_ir(builder, ptr, locality: int) -> None:
    """Ask for the line of ptr for reading: locality 3 `prefetcht0` (every level), 2
    `prefetcht1` (L2 and beyond)."""
    ptr = builder.bitcast(ptr, ir.IntType(8).as_pointer())
    i32 = ir.IntType(32)
    fn = cgutils.get_or_insert_function(
        builder.module,
        ir.FunctionType(ir.VoidType(), [ptr.type, i32, i32, i32]),
        "llvm.prefetch.p0",
    )
    builder.call(fn, [ptr, ir.Constant(i32, 0), ir.Constant(i32, locality), ir.Constant(i32, 1)])


@kernel(inline=True)
def ahead(a, at, n):
    """Ask for the lines of the n bytes AHEAD_L2 bytes past a.flat[at] into L2, and of the
    n bytes AHEAD past it into L1 (a of bytes): a block kernel's next reads, asked for one
    block at a time. From DRAM, asking into L1 alone kept too few lines in flight (L1's
    fill buffers): on the 2-vCPU Xeon (family 6 model 167), the synthetic SmolLM2-360M
    q8_0 step took 16.0-18.8 ms a token asking into L1 alone, 13.9-14.4 asking 16 KiB
    ahead into L2 as well; into L2 alone, SmolLM2-135M (98 MB, in what that guest calls
    its L3) lost 3-7% (DEVELOPERS.md, "Prefetch")."""
    for k in range(0, n, 64):
        prefetch_l2(a, at + AHEAD_L2 + k)
        prefetch(a, at + AHEAD + k)
