"""`llama-np probe`: the read bandwidth attainable on this machine, by working-set size.

The kernels: BLAS sgemv (y = A @ x, how NumPy's decode step reads an f32 matrix), a
reduction (np.add.reduce), and, when numba is installed, llama-np's compiled f32 matvec
and its integer decode kernel (a q8_0 matrix times x rounded to int16, the compiled
decode's default, which asks for its lines ahead: simd.scalar.prefetch). The attainable
bandwidth at a working set is the best of these streaming kernels there (not the
reduction): the speed of light is set by the fastest reader of memory we have, not by
the one a run happens to use. Working sets run from 256 KiB to several times the
last-level cache and to at least DRAM_FLOOR, so that a model's working set (hundreds of
MB to a few GB) lies on the measured curve rather than past its end. A decode step is
held against this curve at its own working set (`attainable`), the cache levels the
system reports serving as labels only. The result is cached per machine (CPU, threads,
NumPy/BLAS).
"""

from __future__ import annotations

import bisect
import hashlib
import json
import math
import os
import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_info, threadpool_limits
from tqdm import tqdm

from quant.backends import BACKEND_CLASSES, FLOATS
from quant.host import cache_dir, threads_label, usable_cores

KIB, MIB = 1 << 10, 1 << 20
DRAM_FLOOR = 1024 * MIB  # the largest working set the probe reads is at least this


@dataclass
class Caches:
    l2_per_core: int  # bytes
    l3: int  # bytes, shared (0 if none)
    cores: int

    @classmethod
    def read(cls) -> Caches:
        """Cache sizes from sysfs (Linux), else sysconf, else typical values."""
        sizes: dict[int, int] = {}
        for index in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
            try:
                kind = (index / "type").read_text().strip()
                level = int((index / "level").read_text())
                text = (index / "size").read_text().strip()
            except (OSError, ValueError):
                continue
            if kind != "Instruction":
                mult = {"K": KIB, "M": MIB}.get(text[-1], 1)
                sizes[level] = int(text.rstrip("KM")) * mult
        for level, key in ((2, "SC_LEVEL2_CACHE_SIZE"), (3, "SC_LEVEL3_CACHE_SIZE")):
            if level not in sizes and key in os.sysconf_names:
                sizes[level] = max(os.sysconf(key), 0)
        return cls(sizes.get(2) or 512 * KIB, sizes.get(3) or 0, usable_cores())

    @property
    def llc(self) -> int:
        return self.l3 or self.l2_per_core * self.cores


@dataclass
class Probe:
    machine: str
    threads: int
    caches: Caches
    sizes: list[int] = field(default_factory=list)  # working set, bytes
    sgemv_gbs: list[float] = field(default_factory=list)
    reduce_gbs: list[float] = field(default_factory=list)
    sgemm_gflops: float = 0.0
    seconds: float = 0.0
    compiled_gbs: list[float] = field(default_factory=list)  # empty without numba
    int_gbs: list[float] = field(default_factory=list)  # q8_0 int16 matvec; same
    # compute ceilings, each the best of runs repeated until the two best agree within 10%
    sgemm_runs: list[float] = field(default_factory=list)  # GFLOPS of each run
    compiled_gflops: float = 0.0  # the compiled batch kernel on f32 weights in cache
    compiled_runs: list[float] = field(default_factory=list)
    compiled_q_gflops: float = 0.0  # ... on q8_0 weights, x rounded to int16 (the default)
    compiled_q_runs: list[float] = field(default_factory=list)
    # the machine's ceilings with the kernels' instructions (quant/compiled/peak.py)
    fma_gflops: float = 0.0  # float32 fused multiply-adds on 16 lanes, 2 FLOPs each
    fma_runs: list[float] = field(default_factory=list)
    int8_gops: float = 0.0  # int8 multiply-adds by the byte dot, 2 operations each
    int8_runs: list[float] = field(default_factory=list)
    dot_instruction: str = ""  # that byte dot: vpdpbusd, vpmaddubsw or generic

    def peak_flops(self, backend: str, weights: str, dot: str = "f32") -> float:
        """FLOP/s of the arithmetic the kernels of `backend` run on these weights with x
        multiplied as `dot`, by the backend's `ceiling` (quant.backends): "sgemm", BLAS
        sgemm's (NumPy's products are BLAS's); "instructions" (the compiled kernels), the
        machine's own ceiling of the instruction they multiply with:
        float32 FMAs for float weights or float x, int8 multiply-adds for x rounded to
        int8, half that for int16 (two int8 products per weight). Probes made before the
        machine ceilings: sgemm's."""
        if BACKEND_CLASSES[backend].ceiling == "sgemm":
            return 1e9 * self.sgemm_gflops
        if dot in ("int8", "int16") and weights not in FLOATS and self.int8_gops:
            return 1e9 * self.int8_gops / (2 if dot == "int16" else 1)
        return 1e9 * (self.fma_gflops or self.sgemm_gflops)

    def tier_of(self, working_set: int) -> str:
        """The cache level a working set of this size fits in, by the sizes the system
        reports: a label only (a VM may report its host's whole L3 to a 2-vCPU guest)."""
        if working_set <= self.caches.l2_per_core * min(self.threads, self.caches.cores) // 2:
            return "L2"
        if self.caches.l3 and working_set <= self.caches.l3 // 2:
            return "L3"
        return "DRAM"

    def best_gbs(self) -> list[float]:
        """Per working set, the fastest of sgemv and the compiled matvecs (f32, q8_0)."""
        none = [0.0] * len(self.sizes)
        return [max(a, b, c) for a, b, c in zip(self.sgemv_gbs, self.compiled_gbs or none,
                                                self.int_gbs or none, strict=True)]  # fmt: skip

    def attainable(self, working_set: int) -> tuple[str, float]:
        """(tier label, bytes/s) for streaming `working_set` bytes: the measured curve
        (best_gbs) at that size, interpolated in log(size) between the two measured sizes
        around it; below the smallest, the smallest's; beyond the largest, the largest's.
        Never the best figure of a tier: a 200 MB model on a machine that reports a 480 MiB
        L3 streams at what the probe measured near 200 MB, not at 4 MiB's."""
        curve = self.best_gbs()
        if working_set <= self.sizes[0]:
            gbs = curve[0]
        elif working_set >= self.sizes[-1]:
            gbs = curve[-1]
        else:
            i = bisect.bisect_right(self.sizes, working_set)
            (s0, s1), (g0, g1) = self.sizes[i - 1 : i + 1], curve[i - 1 : i + 1]
            gbs = g0 + (g1 - g0) * math.log(working_set / s0) / math.log(s1 / s0)
        return self.tier_of(working_set), gbs * 1e9

    def dram_gbs(self) -> float:
        """The curve's figure at its largest working set (the probe sweeps to at least 8
        times the last-level cache): what streaming from memory attains."""
        return self.best_gbs()[-1]

    def slow_compiled(self) -> list[int]:
        """Working sets beyond the last-level cache where the compiled f32 matvec streams
        less than 0.9 of sgemv (the probe says so)."""
        return [s for s, a, b in zip(self.sizes, self.sgemv_gbs, self.compiled_gbs, strict=False)
                if s >= 4 * self.caches.llc and b < 0.9 * a]  # fmt: skip


def machine_id(threads: int) -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    blas = ",".join(
        f"{i.get('internal_api')} {i.get('version')}"
        for i in threadpool_info()
        if i.get("user_api") == "blas"  # not OpenMP: it is loaded or not depending on the run
    )
    return f"{platform.node()} | {cpu} | {threads} threads | numpy {np.__version__} | {blas}"


def _time(fn: Callable[[], object], min_seconds: float) -> float:
    """Best time of one call, repeating for at least min_seconds (and at least 3 times)."""
    fn()
    best, spent, n = float("inf"), 0.0, 0
    while n < 3 or spent < min_seconds:
        t0 = time.perf_counter()
        fn()
        dt = time.perf_counter() - t0
        best, spent, n = min(best, dt), spent + dt, n + 1
    return best


def best_agreeing(rate: Callable[[], float], tolerance: float = 0.1, most: int = 8):
    """The best of runs of `rate` (higher is better), repeated until the two best agree
    within `tolerance` (at most `most` runs): one timing of sgemm here gave 115 GFLOPS where
    others gave 210-226. Returns (best, every run)."""
    runs: list[float] = []
    while len(runs) < most:
        runs.append(rate())
        top = sorted(runs, reverse=True)[:2]
        if len(top) == 2 and top[1] >= (1 - tolerance) * top[0]:
            break
    return max(runs), runs


def time_budget(size: int) -> float:
    """Seconds of repeated calls the probe times a working set of `size` bytes for."""
    return 0.15 if size < 64 * MIB else 0.6


def probe_matrix(size: int, rng: np.random.Generator) -> np.ndarray:
    """The matrix the probe reads at a working set of `size` bytes: 1024 float32 columns."""
    return rng.random((size // 4 // 1024, 1024), dtype=np.float32)


def reprobe(probe: Probe, working_sets: list[int], threads: int) -> Probe:
    """The probe with its curve measured again now at the sizes around these working sets
    (the two the curve interpolates between, or its last beyond it): sgemv and the
    compiled f32 matvec as run_probe times them, each size keeping the better of then and
    now. A VM's bandwidth moves with its neighbours' load (by half within minutes on the
    Zen 5 of 2026-11-25), and a curve taken at a slow moment leaves rows measured later
    faster than their own speed of light; measured beside them, it bounds them."""
    near = set()
    for ws in working_sets:
        i = bisect.bisect_right(probe.sizes, ws)
        near |= {min(max(j, 0), len(probe.sizes) - 1) for j in (i - 1, i)}
    fresh = Probe(**{**asdict(probe), "caches": probe.caches})
    rng = np.random.default_rng(2)
    for i in sorted(near):
        a = probe_matrix(probe.sizes[i], rng)
        x = rng.random(1024, dtype=np.float32)
        budget = time_budget(a.nbytes)
        with threadpool_limits(threads, user_api="blas"):
            gbs = a.nbytes / _time(partial(np.matmul, a, x), budget) / 1e9
        fresh.sgemv_gbs[i] = max(fresh.sgemv_gbs[i], gbs)
        if fresh.compiled_gbs:
            f32, ints = compiled_sweep([(a.nbytes, a)], x, threads, None)
            fresh.compiled_gbs[i] = max(fresh.compiled_gbs[i], f32[0])
            if fresh.int_gbs:
                fresh.int_gbs[i] = max(fresh.int_gbs[i], ints[0])
    return fresh


def run_probe(threads: int, progress: bool = True) -> Probe:
    caches = Caches.read()
    top = max(8 * caches.llc, DRAM_FLOOR)
    sizes = [256 * KIB << i for i in range(30) if 256 * KIB << i <= top]
    probe = Probe(machine_id(threads), threads, caches, sizes)
    rng = np.random.default_rng(0)
    t_start = time.perf_counter()
    matrices = [(s, probe_matrix(s, rng)) for s in sizes]
    x = rng.random(1024, dtype=np.float32)
    bar = tqdm(total=3 * len(sizes), desc="probe", unit="size", disable=None if progress else True)
    with threadpool_limits(threads, user_api="blas"):
        for size, a in matrices:
            budget = time_budget(size)
            probe.sgemv_gbs.append(a.nbytes / _time(partial(np.matmul, a, x), budget) / 1e9)
            reduce = partial(np.add.reduce, a.reshape(-1))
            probe.reduce_gbs.append(a.nbytes / _time(reduce, budget) / 1e9)
            bar.update()
        m = rng.random((1024, 1024), dtype=np.float32)
        sgemm = partial(np.matmul, m, m)
        probe.sgemm_gflops, probe.sgemm_runs = best_agreeing(
            lambda: 2 * 1024**3 / _time(sgemm, 0.3) / 1e9
        )
    probe.compiled_gbs, probe.int_gbs = compiled_sweep(matrices, x, threads, bar)
    compiled_ceilings(probe, threads)
    machine_ceilings(probe, threads)
    bar.close()
    probe.seconds = time.perf_counter() - t_start
    return probe


def compiled_sweep(matrices: list, x: np.ndarray, threads: int, bar: tqdm | None):
    """GB/s of the compiled f32 matvec at each size, and of the integer decode kernel on
    a q8_0 matrix of (about) the same bytes, x rounded to int16 (([], []) without numba).
    After the BLAS sweep, so that neither thread pool spins while the other is timed."""
    from quant.backends import numba_importable

    if not numba_importable():
        return [], []
    from quant.backends import numba_backend
    from quant.compiled import set_threads

    set_threads(threads)
    f32, q8_0 = numba_backend().weight_class("f32"), numba_backend().weight_class("q8_0")
    rng = np.random.default_rng(3)
    per_row = 1024 // q8_0.layout.weights * q8_0.layout.nbytes
    floats, ints = [], []
    for size, a in matrices:
        y = np.empty(a.shape[0], np.float32)
        budget = time_budget(size)
        floats.append(a.nbytes / _time(partial(f32(a).matvec_into, x, y), budget) / 1e9)
        q = q8_0.random((max(size // per_row, 1), 1024), rng)
        y = np.empty(q.shape[0], np.float32)
        ints.append(q.nbytes / _time(partial(q.matvec_into, x, y, dot="int16"), budget) / 1e9)
        del q
        if bar is not None:
            bar.update(2)
    return floats, ints


def compiled_ceilings(probe: Probe, threads: int) -> None:
    """GFLOPS the compiled batch products reach (quant/compiled/igemm.py) on a 1024 x
    1024 matrix in cache times 64 vectors: f32, and q8_0 with x rounded to int16."""
    from quant.backends import numba_importable

    if not numba_importable():
        return
    from quant.backends import numba_backend
    from quant.compiled import set_threads

    set_threads(threads)
    rng = np.random.default_rng(1)
    w = rng.standard_normal((1024, 1024), dtype=np.float32)
    x = rng.standard_normal((64, 1024), dtype=np.float32)
    flops = 2 * 1024 * 1024 * 64
    for fmt, best, runs in (("f32", "compiled_gflops", "compiled_runs"),
                            ("q8_0", "compiled_q_gflops", "compiled_q_runs")):  # fmt: skip
        m = numba_backend().weight_class(fmt).from_float(w)
        product = partial(m.matmul, x, "int16")
        result = best_agreeing(lambda p=product: flops / _time(p, 0.3) / 1e9)
        setattr(probe, best, result[0])
        setattr(probe, runs, result[1])


def machine_ceilings(probe: Probe, threads: int) -> None:
    """The machine's arithmetic ceilings (quant/compiled/peak.py): int8 multiply-adds by
    the integer kernels' byte dot, float32 FMAs on 16 lanes; each the best of runs of
    ~0.2 s until two agree within 10%, and not below what the products reached
    (not_below: sgemm and the compiled f32 product for FMAs, twice the q8_0 one for int8)."""
    from quant.backends import numba_importable

    if not numba_importable():
        return
    from quant.compiled import peak, set_threads, simd

    set_threads(threads)
    rounds = 1 << 20
    for kernel, per_round, best, runs, reached in (
        (peak.int8_peak, peak.INT8_PER_ROUND, "int8_gops", "int8_runs",
         2 * probe.compiled_q_gflops),  # two int8 products per int16 one
        (peak.fma_peak, peak.FMA_PER_ROUND, "fma_gflops", "fma_runs",
         max(probe.sgemm_gflops, probe.compiled_gflops)),
    ):  # fmt: skip
        ops = 2 * rounds * per_round * threads
        run = partial(kernel, rounds, threads)
        rate = partial(lambda r, n: n / _time(r, 0.2) / 1e9, run, ops)
        result = not_below(*best_agreeing(rate), rate, reached)
        setattr(probe, best, result[0])
        setattr(probe, runs, result[1])
    probe.dot_instruction = simd.DOT_INSTRUCTION


def not_below(best: float, runs: list[float], rate: Callable[[], float], reached: float,
              tries: int = 3) -> tuple[float, list[float]]:  # fmt: skip
    """A ceiling under what a product with its instruction already reached was timed on a
    disturbed machine (two runs of the FMA peak agreed at 141 GFLOPS here while another
    process held a core; the compiled product had reached 218): run it again, at most
    `tries` times; still under, the ceiling is what the product reached, since the
    machine did that much of the arithmetic. Returns (ceiling, every run)."""
    for _ in range(tries):
        if best >= reached:
            break
        runs.append(rate())
        best = max(runs)
    return max(best, reached), runs


def probe_path(threads: int) -> Path:
    key = hashlib.sha256(machine_id(threads).encode()).hexdigest()[:16]
    return cache_dir() / f"probe-{key}.json"


def load_probe(threads: int) -> Probe | None:
    try:
        d = json.loads(probe_path(threads).read_text())
        d["caches"] = Caches(**d["caches"])
        probe = Probe(**d)
    except (OSError, ValueError, TypeError, KeyError):
        return None
    if probe.compiled_gbs and not (probe.fma_gflops and probe.int_gbs):
        return None  # made before the machine ceilings or the integer curve: probe again
    if probe.sizes[-1] < DRAM_FLOOR:
        return None  # its sweep stopped short of DRAM_FLOOR: probe again
    return probe if probe.machine == machine_id(threads) else None


def save_probe(probe: Probe) -> Path:
    path = probe_path(probe.threads)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(asdict(probe), indent=1))
    os.replace(tmp, path)
    return path


def size_label(n: float) -> str:
    """A byte count as people write a working set: "256 KiB", "98 MB"."""
    if n < MIB:
        return f"{n / KIB:.0f} KiB"
    return f"{n / MIB:.0f} MiB" if n < 1e9 else f"{n / 1e9:.2f} GB"


def curve_text(p: Probe) -> str:
    """The attainable curve in one line: "256 KiB 78.8, ..., 256 MiB 32.0 GB/s"."""
    return ", ".join(f"{size_label(s)} {g:.1f}" for s, g in zip(p.sizes, p.best_gbs(),
                                                               strict=True)) + " GB/s"  # fmt: skip


def probe_report(p: Probe) -> str:
    c = p.caches
    lines = [
        f"machine: {p.machine}",
        f"caches: L2 {c.l2_per_core // KIB} KiB per core x {c.cores} cores, "
        f"L3 {c.l3 // MIB} MiB; probe took {p.seconds:.1f} s",
        "",
        "| working set | tier (label) | sgemv GB/s | compiled f32 matvec GB/s | compiled q8_0 "
        "int16 matvec GB/s | reduce GB/s | attainable GB/s |",
        "|---:|---|---:|---:|---:|---:|---:|",
    ]
    compiled = [f"{c:.1f}" for c in p.compiled_gbs] or ["-"] * len(p.sizes)
    ints = [f"{c:.1f}" for c in p.int_gbs] or ["-"] * len(p.sizes)
    for s, g, c, i, r, a in zip(p.sizes, p.sgemv_gbs, compiled, ints, p.reduce_gbs,
                                p.best_gbs(), strict=True):  # fmt: skip
        lines.append(f"| {size_label(s)} | {p.tier_of(s)} | {g:.1f} | {c} | {i} | {r:.1f} | "
                     f"{a:.1f} |")  # fmt: skip
    lines += ["", "A decode step is held against the attainable column at its own working set "
              "(bytes per token), interpolated between the sizes above; beyond the largest, "
              f"the largest ({p.dram_gbs():.1f} GB/s)."]  # fmt: skip
    if slow := p.slow_compiled():
        sizes = ", ".join(size_label(s) for s in slow)
        lines.append(f"Note: the compiled f32 matvec streams under 0.9 of sgemv at {sizes}; "
                     "the attainable figure there is the faster kernel's.")  # fmt: skip
    lines += ["", "| arithmetic (best of runs until two agree within 10%) | GFLOPS | runs |",
              "|---|---:|---|"]  # fmt: skip
    for name, best, runs in (
        ("float32 FMA peak, 16 lanes (ceiling: float weights or x)", p.fma_gflops, p.fma_runs),
        (f"int8 multiply-add peak, {p.dot_instruction} (ceiling: int8 x; int16 x half)",
         p.int8_gops, p.int8_runs),
        ("BLAS sgemm 1024^3 (ceiling: the NumPy backend)", p.sgemm_gflops, p.sgemm_runs),
        ("compiled batch product, f32 1024^2 x 64", p.compiled_gflops, p.compiled_runs),
        ("compiled batch product, q8_0 int16 x, 1024^2 x 64", p.compiled_q_gflops,
         p.compiled_q_runs),
    ):  # fmt: skip
        if best:
            lifted = best > max(runs, default=best)  # not_below: no run reached a product
            mark = " (no run reached a product's rate: that rate)" if lifted else ""
            lines.append(f"| {name} | {best:.1f}{mark} | {', '.join(f'{r:.0f}' for r in runs)} |")
    lines.append(f"\n{threads_label(p.threads)}")
    return "\n".join(lines)
