"""Kernel backends: who multiplies the matrices and reads the KV cache, chosen once, at load.

- numpy: the readable reference, always present. Block formats keep transposed panels
  with float32 scales (quant.blocks); quantized products split their panels over plain
  threads (quant.threads).
- numba: compiled kernels (quant.compiled), an optional extra (`pip install
  'llama-np[fast]'`). Block formats keep groups of 4 interleaved rows with float16 scales;
  keys are stored in tiles of 16 slots. Its decode products multiply every quantized
  format by x rounded to integers per block of 32, int8 as llama.cpp does ("numba-int8",
  quant.compiled.intdot) or int16 ("numba-int16", two int8 halves), or by x in float32
  ("numba-f32"); "numba" is DEFAULT_DOT.

A backend decides the in-memory layout of every matrix (its Weight classes) and of the
keys in the KV cache; the meter counts whatever that layout really occupies, and the
speed-of-light model asks the backend for the same numbers.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import ClassVar

from threadpoolctl import threadpool_limits

from . import threads as numpy_threads
from .base import Matrix, Weight
from .errors import QuantError
from .host import threads_label
from .kv import KVStore, kv_store_class

KERNELS = ("auto", "numpy", "numba", "numba-int16", "numba-int8", "numba-f32")
# What "numba" (and "auto") multiply x as in the quantized decode products: x rounded to
# int16 per block of 32 moves perplexity by less than 0.01% on SmolLM2 and Qwen2.5-Coder
# (README, "Integer dot products"), int8 by up to 0.5%.
DEFAULT_DOT = "int16"
FLOATS = ("f32", "f16", "bf16")  # formats whose products no `dot` changes
INSTALL_HINT = "pip install 'llama-np[fast]' (or pip install numba)"


# Told the name of each stage of the compiled backend's warm-up as it begins (the one-call
# step, its KV formats, its formats, the ops): a caller that shows compile progress sets it
# around get_backend.
COMPILE_PROGRESS: ContextVar[Callable[[str], object] | None] = ContextVar(
    "compile_progress", default=None
)


def warm_up_stages() -> int:
    """How many stages the compiled backend's warm-up reports to COMPILE_PROGRESS."""
    from . import compiled
    from .kv import KV_FORMATS

    return len(compiled.FORMATS) + len(KV_FORMATS) + 2  # and the one-call step's, the ops'


class BackendUnavailable(QuantError):
    """The compiled backend was asked for and cannot run here: a usage error (exit 2)."""

    exit_code = 2


@dataclass
class Running:
    """What `Backend.start` started: how the kernels run, for reports ("numba omp, 2
    threads"), and how to stop it (give BLAS back its threads)."""

    label: str
    on_close: Callable[[], object] | None = None

    def close(self) -> None:
        if self.on_close:
            self.on_close()
            self.on_close = None


@dataclass(frozen=True)
class Backend:
    """A kernel backend, chosen once at load: the class of each format in its layout,
    the keys' layout in the KV cache, and whether the forward pass runs its fused decode
    operations (`fused`: llama_np.model.ops_compiled) or the NumPy reference's."""

    name: str
    formats: Mapping[str, type[Weight]]  # format name -> this backend's class
    tiled_keys: bool  # keys stored in tiles of 16 slots (quant.kv)
    dot: str = "f32"  # x in quantized decode products: "f32", or "int8" (quant.intdot)
    fused: ClassVar[bool] = False
    # The arithmetic its products run, what a compute ceiling must measure (bench.probe):
    # "sgemm", BLAS's; "instructions", its own kernels' (float32 FMAs, int8 multiply-adds).
    ceiling: ClassVar[str] = "sgemm"

    def kv_store(self, fmt: str, shape: tuple[int, int, int], keys: bool) -> KVStore:
        """One layer's keys (`keys`) or values, (n_kv_heads, slots, head_dim) in format
        `fmt`, in this backend's memory and layout: host memory mapped when first written
        (quant.kv), keys tiled where `tiled_keys`. A backend with memory of its own (a
        GPU's) allocates there."""
        return kv_store_class(fmt)(*shape, tiled=keys and self.tiled_keys)

    def weight_class(self, fmt: str) -> type[Weight]:
        try:
            return self.formats[fmt]
        except KeyError:
            known = ", ".join(self.formats)
            raise QuantError(f"unknown weight format {fmt!r} (known: {known})") from None

    def convert(self, w: Weight, fmt: str | None = None) -> Weight:
        """`w` in format `fmt` (default: its own) and this backend's layout: `w` itself when
        it is both already; the same codes re-laid when only the layout differs (a stored
        tensor is never quantized again); quantized from its values otherwise."""
        cls = self.weight_class(fmt or w.fmt)
        if type(w) is cls:
            return w
        if w.fmt == cls.fmt:
            return cls.from_arrays(w.shape, w.export())
        return cls.from_float(w.dequantize())

    def start(self, matrices: list[Matrix], threads: int) -> Running:
        """Run the kernels of these matrices on `threads` cores until the result is closed."""
        raise NotImplementedError


class NumpyBackend(Backend):
    def start(self, matrices: list[Matrix], threads: int) -> Running:
        """Float32 matrices go to BLAS, which threads them itself; every other format
        converts its codes in NumPy panel by panel, the panels split over `threads` plain
        threads (quant.threads), each calling BLAS on one thread."""
        quantized = any(w.fmt != "f32" for m in matrices for w in m.leaves())
        if not quantized or threads < 2:
            blas = threadpool_limits(threads, user_api="blas")
            return Running(f"numpy, BLAS {threads_label(threads)}", blas.restore_original_limits)
        blas = threadpool_limits(1, user_api="blas")
        n = numpy_threads.set_threads(threads)

        def stop() -> None:
            numpy_threads.set_threads(1)
            blas.restore_original_limits()

        return Running(f"numpy, {threads_label(n)}", stop)


class NumbaBackend(Backend):
    fused = True
    ceiling = "instructions"

    def start(self, matrices: list[Matrix], threads: int) -> Running:
        """Each decode kernel splits its rows over `threads` numba threads; BLAS gets
        `threads` for long prompts' products."""
        from . import compiled

        blas = threadpool_limits(threads, user_api="blas")
        n = compiled.set_threads(threads)
        label = f"numba {compiled.threading_layer()}, {threads_label(n)}"
        if self.dot != "f32" and any(w.fmt not in FLOATS for m in matrices for w in m.leaves()):
            label += f", {self.dot} dot ({compiled.DOT_INSTRUCTION})"
        return Running(label, blas.restore_original_limits)


@functools.cache
def numpy_backend() -> Backend:
    from . import FORMATS

    return NumpyBackend("numpy", FORMATS, tiled_keys=False)


def numba_importable() -> bool:
    import importlib.util

    return importlib.util.find_spec("numba") is not None


@functools.cache
def numba_backend(dot: str = DEFAULT_DOT) -> Backend:
    """The compiled backend, its kernels compiled (or loaded from the disk cache) for every
    format now: a kernel that cannot be compiled on this CPU fails here, in one line.
    `dot`: "int16", "int8" or "f32", what x is multiplied as in quantized decode products."""
    backend = layout_of(f"numba-{dot}")
    from . import compiled
    from .kv import KV_FORMATS

    try:
        compiled.warm_up(compiled.FORMATS, list(KV_FORMATS), dot, COMPILE_PROGRESS.get())
    except Exception as e:  # numba's compile errors have no common base class
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise BackendUnavailable(f"the numba kernels failed to compile here: {first}") from None
    return backend


BACKEND_CLASSES: dict[str, type[Backend]] = {"numpy": NumpyBackend, "numba": NumbaBackend}


@functools.cache
def layout_of(kernels: str = "auto") -> Backend:
    """The backend a --kernels choice names ("auto": numba when it can be imported, else
    numpy), for its layouts and sizes alone (the weight classes, tiled keys): nothing is
    compiled, so a speed-of-light estimate answers in a second on a machine whose kernels
    were never compiled. `get_backend` gives it with its kernels ready to run."""
    if kernels not in KERNELS:
        raise QuantError(f"unknown kernels {kernels!r} (known: {', '.join(KERNELS)})")
    if kernels == "numpy" or (kernels == "auto" and not numba_importable()):
        return numpy_backend()
    try:
        from . import compiled
    except ImportError as e:
        raise BackendUnavailable(f"--kernels numba needs numba ({e}): {INSTALL_HINT}") from None
    dot = kernels.removeprefix("numba-") if "-" in kernels else DEFAULT_DOT
    return NumbaBackend("numba", compiled.FORMATS, tiled_keys=True, dot=dot)


def get_backend(kernels: str = "auto") -> Backend:
    """The backend a --kernels choice names (layout_of), its kernels compiled or loaded."""
    backend = layout_of(kernels)
    return numba_backend(backend.dot) if isinstance(backend, NumbaBackend) else backend
