"""The compiled tier's one numbering of the formats, from which every kernel that
dispatches on a format reads its number:

- `KIND_OF`: the kind of a matrix's row in the decode table (layers.py), which kernel runs it.
  The nibble formats share theirs: q4_0 and q4_1 are one kernel with the mins as an
  argument (weights.NibbleGroups), q5_0 and q5_1 another; the K-quants are one kind whose
  row carries the format's `CODE_OF`.
- `CODE_OF`: a K-quant's number among the K-quants, what the integer decoders of
  simd/kquants.py, the panels (simd/panels.py) and ggml.py's kernels branch on.

GGUF's own type ids (quant.ggml.LAYOUTS) number the formats on disk, not kernels.
"""

from __future__ import annotations

F32, F16, BF16, Q8_0, Q4, Q5, KQUANT = range(7)
K_FORMATS = ("q2_k", "q3_k", "q4_k", "q5_k", "q6_k")
CODE_OF = {fmt: code for code, fmt in enumerate(K_FORMATS)}
KIND_OF = {"f32": F32, "f16": F16, "bf16": BF16, "q8_0": Q8_0, "q4_0": Q4, "q4_1": Q4,
        "q5_0": Q5, "q5_1": Q5} | dict.fromkeys(K_FORMATS, KQUANT)  # fmt: skip
