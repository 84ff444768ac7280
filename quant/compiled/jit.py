"""What every compiled kernel shares: numba set up once (threads, fast math, the disk
cache). The LLVM instructions NumPy-style numba code cannot express are in simd/.

Threads: numba's OpenMP threading layer, on purpose. Its threads spin for a while after a
parallel loop ends, so the next kernel of a decode step starts in ~1 us instead of paying
a wake-up (~60 us per call with the default workqueue layer on these machines, and a
token of SmolLM2 makes ~150 kernel calls). GOMP_SPINCOUNT bounds that spin to ~1 ms, so
an idle llama-np (between chat turns) gives its cores back almost at once. When OpenMP
cannot be loaded, numba falls back to its workqueue layer, and `threading_layer()` says so.

Kernels are compiled on first use and cached on disk (`cache=True`): only the first run
on a machine pays the compile time. Processes that share the cache (two llama-np at once,
the test workers) take turns at it (LockedIndex).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path

# Read by libgomp when numba first loads its OpenMP pool: spin ~1 ms before sleeping
# (the default, 300,000 spins, measured ~10 ms of a busy core here after the last call).
os.environ.setdefault("GOMP_SPINCOUNT", "30000")

import numba
from numba import types
from numba.core.base import BaseContext
from numba.core.caching import IndexDataCacheFile
from numba.core.cpu_options import ParallelOptions
from numba.core.registry import CPUDispatcher

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


# Kernels that are never inlined into their callers, by (module, name): see `kernel`.
OUT_OF_LINE: dict[tuple[str, str], CPUDispatcher] = {}


class OutOfLine(CPUDispatcher):
    """A kernel its callers call (not inlined), compiled for the types of its arguments
    without their literal values: a caller's constant (`add=False`) would otherwise make a
    specialization of its own, optimized apart from the one Python calls (see `kernel`)."""

    def get_call_template(self, args, kws):
        args = [types.unliteral(a) for a in args]
        kws = {k: types.unliteral(v) for k, v in kws.items()}
        return super().get_call_template(args, kws)

    @property
    def _numba_type_(self):
        """The kernel's numba type, made once: a kernel passed to another as an argument
        (a driver taking its row or panel function) is typed at every call, and numba
        builds the type anew each time (~5 us a call)."""
        if self._type is None:
            self._type = types.Dispatcher(self)
        return self._type

    _type = None


def _declare_function(declare):
    """numba's BaseContext.declare_function, marking the kernels of OUT_OF_LINE noinline."""

    def declare_function(self, module, fndesc):
        fn = declare(self, module, fndesc)
        if (fndesc.modname, fndesc.qualname) in OUT_OF_LINE:
            fn.attributes.add("noinline")
        return fn

    return declare_function


BaseContext.declare_function = _declare_function(BaseContext.declare_function)


class LockedIndex(IndexDataCacheFile):
    """numba's cache of one function (an index of its specializations, a data file each),
    read and written under a lock on its folder, so that processes sharing the cache take
    turns. numba's own `save` reads the index, picks the first free data file's name and
    writes both: two processes saving two specializations at once both picked `.1.nbc`,
    and the index could end up naming one's data for the other's types. Every process
    that loaded it then crashed (the CI run of 8185da8: eight pytest workers in a row)."""

    @contextlib.contextmanager
    def _locked(self, mode: int) -> Iterator[None]:
        """Inside, the folder's lock (released as its file closes); where the file system
        gives none (no lock file can be made, flock refused), numba's unlocked way."""
        with contextlib.ExitStack() as stack:
            try:
                os.makedirs(self._cache_path, exist_ok=True)
                f = stack.enter_context(open(os.path.join(self._cache_path, ".lock"), "a"))
                fcntl.flock(f, mode)
            except OSError:
                pass
            yield

    def save(self, key, data):
        with self._locked(fcntl.LOCK_EX):
            super().save(key, data)

    def load(self, key):
        with self._locked(fcntl.LOCK_SH):
            return super().load(key)


def lock_cache(dispatcher: CPUDispatcher) -> None:
    """The dispatcher's disk cache read and written under its folder's lock (LockedIndex);
    again after `enable_caching` gives it a new cache (another folder)."""
    dispatcher._cache._cache_file.__class__ = LockedIndex


def kernel(fn=None, *, parallel: bool = False, inline: bool = False):
    """@kernel: compiled with numba, cached on disk, float32 fast math as above.

    `inline`: a helper inlined into its callers, in numba's IR: a helper called in a hot
    loop must be inlined to vectorize with it. Every other kernel is one compiled function
    per argument types that its callers call (LLVM `noinline`), and a caller's constant
    does not make a specialization of its own (OutOfLine). Why: under `reassoc` and
    `contract` LLVM may order a sum or fuse a multiply-add differently in each copy of the
    same source it optimizes (an inlined copy, or a specialization for a literal
    `add=False`), and which copies exist depended on what was compiled first, or already
    in the disk cache, and on the CPU LLVM tuned for: the one-call decode step and the calls
    one by one once gave logits different in the 7th digit. With one body per row kernel,
    a row gives the same bits on every path compiled in one process (tests/llama_np/model/
    test_decode_layers.py compiles both orders into an empty cache). Not across processes:
    numba links a kernel's optimized IR into each caller's module and optimizes it there
    again, and a kernel loaded from the disk cache (compiled in another process, linked at
    another depth) may still round a sum 1 ulp apart from a copy compiled here."""

    options = dict(fastmath=FASTMATH, cache=True, nogil=True)
    options |= dict(parallel=PRANGE_ONLY if parallel else False)
    options |= dict(inline="always" if inline else "never")

    def wrap(f):
        dispatcher = numba.njit(f, **options)
        lock_cache(dispatcher)
        if inline:
            return dispatcher
        dispatcher.__class__ = OutOfLine
        # its name, not a random one: a kernel passed to another as an argument is part of
        # that one's signature, and its disk cache finds it again in the next process by
        # this (numba's own uuid would make every process compile the caller anew)
        dispatcher._set_uuid(f"llama-np:{f.__module__}.{f.__qualname__}")
        OUT_OF_LINE[f.__module__, f.__qualname__] = dispatcher
        return dispatcher

    return wrap(fn) if fn is not None else wrap


def duplicate_specializations(signatures: dict | None = None) -> list[str]:
    """Out-of-line kernels given two specializations in this process (compiled, or loaded
    from the disk cache) for argument types that differ only in a literal value, an
    integer's sign or width, or an array's write flag: what `kernel` keeps out (each would
    be optimized apart). `signatures`: dispatcher -> the signatures to look at (default:
    every out-of-line kernel's, all it has in this process)."""

    def plain(t):
        t = types.unliteral(t)
        if isinstance(t, types.Integer):
            return types.int64
        if isinstance(t, types.Array):
            return t.copy(readonly=False)
        if isinstance(t, types.BaseTuple):
            return tuple(plain(e) for e in t)
        return t

    if signatures is None:
        signatures = {d: list(d.overloads) for d in OUT_OF_LINE.values()}
    out = []
    for dispatcher, sigs in signatures.items():
        seen: dict[tuple, tuple] = {}
        for sig in sigs:
            key = tuple(plain(t) for t in sig)
            if key in seen:
                f = dispatcher.py_func
                out.append(f"{f.__module__}.{f.__qualname__}: {seen[key]} and {sig}")
            seen[key] = sig
    return out


def sources() -> list[Path]:
    """The source files kernels are compiled from: this package's, subpackages included."""
    return sorted(Path(__file__).parent.rglob("*.py"))


def cache_folder() -> Path:
    """Where the kernels of this source tree and numba version are cached on disk."""
    from ..host import cache_dir

    if os.environ.get("NUMBA_CACHE_DIR"):
        return Path(os.environ["NUMBA_CACHE_DIR"])
    h = hashlib.sha256(numba.__version__.encode())
    for source in sources():
        h.update(source.read_bytes())
    return cache_dir() / "kernels" / h.hexdigest()[:16]


@contextlib.contextmanager
def kernel_cache() -> Iterator[None]:
    """Kernels defined inside are cached on disk in the project's cache, under a key made
    of every source file of this package (`sources`) and numba's version. numba itself keys a
    kernel's cache on its own file only, so a change to a helper in another file (this
    one) would load stale machine code; and the project's cache is the one kept between
    runs. An explicit NUMBA_CACHE_DIR wins."""
    saved = numba.config.CACHE_DIR
    if not os.environ.get("NUMBA_CACHE_DIR"):
        numba.config.CACHE_DIR = str(cache_folder())
    try:
        yield
    finally:
        numba.config.CACHE_DIR = saved


def take_turns(
    stages: list[tuple[str, Callable[[], None]]], tag: str, progress: Callable[[str], object]
) -> None:
    """Run every stage (each compiles or loads a group of kernels) in this process, sharing
    the compiling with processes warming up the same kernel cache at the same moment: a
    stage that another one is running (its lock file in the cache folder held) is left for
    last, then run once that one has finished, when its kernels load from the disk cache.
    Two processes starting on an empty cache (the test workers, two llama-np at once)
    compile half the stages each instead of all of them both. Where no lock can be taken
    (a read-only cache folder), each stage just runs. The locks are this checkout's: numba
    caches a kernel under its source folder's path, so another copy of these sources
    (a worktree) compiles its own."""
    here = hashlib.sha256(str(Path(__file__).resolve().parent).encode()).hexdigest()[:12]
    folder = cache_folder() / "stages" / here
    later = []
    for name, run in stages:
        with _turn(folder / f"{tag} {name}.lock", wait=False) as mine:
            if mine:
                progress(name)
                run()
        if not mine:
            later.append((name, run))
    for name, run in later:
        with _turn(folder / f"{tag} {name}.lock", wait=True):
            progress(name)
            run()


@contextlib.contextmanager
def _turn(path: Path, wait: bool) -> Iterator[bool]:
    """The lock of one stage, held inside: True, or False where another process holds it
    and `wait` is False."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        f = open(path, "a")
    except OSError:
        f = None
    with f if f is not None else contextlib.nullcontext():
        mine = True
        if f is not None:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
            except BlockingIOError:
                mine = False
            except OSError:
                pass
        yield mine


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
