"""Weight and KV-cache formats: data, quantize / dequantize, and the matvec / matmul kernels.

This package imports nothing else of the project: the model reaches a format only through
the `Matrix` interface, chosen once at load time by name (quant.backends).
"""

from __future__ import annotations

from .base import BlockFormat, Matrix, Weight
from .blocks import BLOCK_FORMATS
from .errors import QuantError
from .floats import BF16Weight, F16Weight, F32Weight
from .ggml import GGML_TYPES, LAYOUTS
from .stack import StackedWeight, stacked

# The NumPy backend's class of every format (quant.backends.Backend.formats)
FORMATS: dict[str, type[Weight]] = {
    cls.fmt: cls for cls in (F32Weight, F16Weight, BF16Weight)
} | BLOCK_FORMATS
# What a matrix can be converted to (quantized); K-quants are read as stored, never written.
TARGETS = [f for f in FORMATS if f not in LAYOUTS or LAYOUTS[f].quantizable]
# safetensors' dtype names of the float formats
SAFETENSORS_DTYPES = {"F32": "f32", "F16": "f16", "BF16": "bf16"}

__all__ = [
    "FORMATS",
    "GGML_TYPES",
    "SAFETENSORS_DTYPES",
    "TARGETS",
    "BlockFormat",
    "Matrix",
    "QuantError",
    "StackedWeight",
    "Weight",
    "stacked",
]
