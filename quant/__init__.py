"""Weight and KV-cache formats: data, quantize / dequantize, and the matvec / matmul kernels.

This package imports nothing else of the project: the model reaches a format only through
the `Matrix` interface, chosen once at load time by name (quant.backends).
"""

from __future__ import annotations

from .base import Matrix, Weight
from .blocks import BlockWeight, Q4_0Weight, Q4_1Weight, Q8_0Weight
from .errors import QuantError
from .floats import BF16Weight, F16Weight, F32Weight
from .ggml import GGML_FORMATS, GGML_TYPES
from .stack import StackedWeight, stack_rows

FORMATS: dict[str, type[Weight]] = {
    cls.fmt: cls for cls in (F32Weight, F16Weight, BF16Weight, Q8_0Weight, Q4_0Weight, Q4_1Weight)
} | GGML_FORMATS
# What a matrix can be converted to (quantized); K-quants are read as stored, never written.
TARGETS = [f for f in FORMATS if not f.endswith("_k")]
# safetensors' dtype names of the float formats
SAFETENSORS_DTYPES = {"F32": "f32", "F16": "f16", "BF16": "bf16"}


def weight_class(fmt: str) -> type[Weight]:
    try:
        return FORMATS[fmt]
    except KeyError:
        raise QuantError(f"unknown weight format {fmt!r} (known: {', '.join(FORMATS)})") from None


def convert(w: Weight, fmt: str) -> Weight:
    """The same matrix in format `fmt`; `w` itself when it is already in that format, so a
    tensor that arrives quantized is never quantized again."""
    cls = weight_class(fmt)
    if isinstance(w, cls):
        return w
    return cls.from_float(w.dequantize())


__all__ = [
    "FORMATS",
    "GGML_TYPES",
    "SAFETENSORS_DTYPES",
    "TARGETS",
    "BlockWeight",
    "Matrix",
    "QuantError",
    "StackedWeight",
    "Weight",
    "convert",
    "stack_rows",
    "weight_class",
]
