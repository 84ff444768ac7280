"""The compiled kernels' SIMD dialect: LLVM instructions that NumPy-style numba code
cannot express, as numba intrinsics, each saying which x86 instruction it becomes.

- scalar.py: one-instruction conversions (float16 and bfloat16 bits, nibbles, bit fields,
  powers of two) that numba would widen to int64 (LLVM vectorizes loops of them).
- lanes.py: sixteen float32 lanes (fma16, mul16, lo16/hi16, add16, ...): one vector
  instruction each, for the loops LLVM would reduce lane by lane.
- int8.py: byte dot products (vpdpbusd; vpmaddubsw + vpmaddwd on AVX2) of a block of 4
  rows with x rounded to int8, the q8_0 / q4 / q5 block decoders around them, and x's
  rounding itself, a block of 32 at a time (quantize_block, sum16).
- groups.py: what the 4-bit and 5-bit integer kernels do once per group of 4 rows (the
  blocks' scales times x's, the mins' correction, the rows' sums) in vector registers.
- kquants.py: the K-quants' super-blocks decoded to integer codes, scales and mins in
  vector registers, then multiplied by int8.dot_u8.
- panels.py: panels of 16 rows decoded into one integer form (or float32), and the tiles
  that multiply them by several vectors (igemm.py).
- broadcast.py: float32 weights as broadcast operands of 16 vectors' lanes, and x
  transposed into those lanes (igemm.py).

The CPU decides here, once: a CPU without VNNI cannot even compile `vpdpbusd`. The
features are those numba compiles for (NUMBA_CPU_NAME / NUMBA_CPU_FEATURES, else the
host's); numba's disk cache already keys every kernel on that CPU name and feature list.
NUMBA_CPU_NAME=haswell NUMBA_CPU_FEATURES=+avx2 compiles the AVX2 path on an AVX-512
machine, which is how the tests run every path."""

from __future__ import annotations

import llvmlite.binding as llvm
import numba


def cpu_features() -> set[str]:
    """The CPU features the kernels are compiled for: NUMBA_CPU_FEATURES when given, none
    known for a CPU named by NUMBA_CPU_NAME alone (a portable build), else the host's."""
    if numba.config.CPU_FEATURES:
        return {f[1:] for f in numba.config.CPU_FEATURES.split(",") if f.startswith("+")}
    if numba.config.CPU_NAME and numba.config.CPU_NAME != "host":
        return set()
    return {name for name, on in llvm.get_host_cpu_features().items() if on}


FEATURES = cpu_features()
VNNI = {"avx512vnni", "avx512bw"} <= FEATURES
AVX512 = "avx512f" in FEATURES  # 32 vector registers of 16 float32 lanes
AVX2 = "avx2" in FEATURES
# the instruction that multiplies the bytes, named in labels and reports
DOT_INSTRUCTION = "vpdpbusd" if VNNI else "vpmaddubsw" if AVX2 else "generic"
