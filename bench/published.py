"""Published decode and prompt (prefill) measurements of machines we do not have, held
against the speed of light.

bench/published/measurements.csv holds one row per number read in a public source (its
README says how they were gathered): the hardware and its memory bandwidth, the model,
the weight format as the engine names it, the context and the measured tokens/s. Each
row is predicted from the model's shape and the format's exact bytes: every matrix a
token reads at the size its engine stores it (for llama.cpp's files, the GGML type
llama.cpp's quantizer gives each tensor), one embedding row, the norms, and the KV cache
at the row's mean depth (`predict`). measured / predicted is how far from the bound the
engine ran; `calibrate.py` fits and cross-checks the expected figure.

Prompt rows (phase "prefill": prompt_tokens processed from an empty cache, gen_tokens 0,
tok_s the prompt's tokens per second) are predicted by sol.prefill from the same byte model
and the FLOPs, against the row's bandwidth and its device's matrix peak (the `device` column
names an entry of bench/devices.json; Device.matrix_peak picks the peak for the format).
"""

from __future__ import annotations

import csv
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from functools import cache
from importlib import resources

from llama_arch import Config, ConfigError, layer_matrices, layer_roles
from llama_arch.presets import PRESETS

from .calibrate import MIN_ROWS, Fit, Point, best_fit, leave_one_source_out, spread
from .devices import Device, load_devices
from .meter import KV
from .prefill_fit import MIN_ROWS as PREFILL_MIN_ROWS
from .prefill_fit import RATE_REF, GroupFit, HeldPoint, PrefillFit, PrefillPoint
from .prefill_fit import fit as fit_prefill
from .prefill_fit import leave_one_source_out as prefill_loso
from .prefill_fit import spread as prefill_spread
from .sol import Estimate, Prefill, estimate, prefill

HW_CLASSES = ("apple-gpu", "nvidia-gpu", "amd-gpu", "cpu", "board", "apple-cpu")
BANDWIDTH_WHAT = ("source", "spec", "measured")
PHASES = ("decode", "prefill", "batch")  # batch: B sequences' aggregate decode tok/s
PROMPT_UNSTATED = 512  # a prompt row's length when its source does not state it (llama-bench's)


class PublishedError(ConfigError):
    """A row of the published dataset that does not follow its schema (a ConfigError: the
    command line says it in one line)."""


@dataclass(frozen=True)
class Measurement:
    """One row of measurements.csv (its README defines the columns)."""

    source: str
    url: str
    where: str
    second_hand: str
    engine: str
    engine_version: str
    hardware: str
    hw_class: str
    bandwidth_gbs: float
    bandwidth_what: str
    bandwidth_ref: str
    model: str
    weights: str
    prompt_tokens: int | None
    gen_tokens: int | None
    batch: int
    tok_s: float
    notes: str
    phase: str  # "decode" (tok_s: generated tokens/s), "prefill" (prompt tokens/s) or
    # "batch" (the generated tokens/s of `batch` sequences together)
    device: str  # an entry of bench/devices.json: a prefill or batch row's device's peaks

    @property
    def ms(self) -> float:
        return 1e3 / self.tok_s

    @property
    def depth(self) -> int:
        """The mean position of the timed tokens: the KV cache they read on average."""
        return (self.prompt_tokens or 0) + (self.gen_tokens or 0) // 2


COLUMNS = [f.name for f in fields(Measurement)]


def _text(name: str) -> str:
    return resources.files("bench").joinpath("published", name).read_text(encoding="utf-8")


def _row(d: dict[str, str], n: int) -> Measurement:
    def number(key: str, kind: Callable = float, empty: bool = False):
        if empty and d[key] == "":
            return None
        try:
            value = kind(d[key])
        except ValueError:
            raise PublishedError(f"row {n}: {key} is not a number: {d[key]!r}") from None
        if value < 0 or (not empty and value == 0):
            raise PublishedError(f"row {n}: {key} must be positive: {d[key]!r}")
        return value

    if list(d) != COLUMNS:
        raise PublishedError(f"row {n}: columns {list(d)} are not {COLUMNS}")
    if d["phase"] not in PHASES or (d["phase"] != "decode" and not d["device"]):
        raise PublishedError(f"row {n}: phase {d['phase']!r} unknown, or a prefill or batch "
                             "row without its device")  # fmt: skip
    if d["hw_class"] not in HW_CLASSES or d["bandwidth_what"] not in BANDWIDTH_WHAT:
        raise PublishedError(f"row {n}: hw_class {d['hw_class']!r} or bandwidth_what "
                             f"{d['bandwidth_what']!r} unknown")  # fmt: skip
    for key in ("source", "url", "where", "engine", "hardware", "model", "weights"):
        if not d[key].strip():
            raise PublishedError(f"row {n}: {key} is empty")
    return Measurement(**d | {
        "bandwidth_gbs": number("bandwidth_gbs"), "tok_s": number("tok_s"),
        "prompt_tokens": number("prompt_tokens", int, True),
        "gen_tokens": number("gen_tokens", int, True), "batch": number("batch", int),
    })  # fmt: skip


@cache
def all_rows() -> tuple[Measurement, ...]:
    """Every row, checked against the schema (PublishedError names the first bad one)."""
    reader = csv.DictReader(_text("measurements.csv").splitlines())
    return tuple(_row(d, n) for n, d in enumerate(reader, start=2))


def measurements() -> tuple[Measurement, ...]:
    """The decode rows."""
    return tuple(m for m in all_rows() if m.phase == "decode")


def batch_measurements() -> tuple[Measurement, ...]:
    """The batched decode rows (bench/published_batch.py)."""
    return tuple(m for m in all_rows() if m.phase == "batch")


def prefill_measurements() -> tuple[Measurement, ...]:
    """The prompt (prefill) rows."""
    return tuple(m for m in all_rows() if m.phase == "prefill")


@cache
def sources() -> dict[str, dict[str, str]]:
    """source id -> its row of sources.csv (url, title, author, date, kind, independent_of)."""
    return {d["source"]: d for d in csv.DictReader(_text("sources.csv").splitlines())}


@cache
def models() -> dict[str, Config]:
    """The presets and the shapes in models.csv (models that are not presets)."""
    out = dict(PRESETS)
    for d in csv.DictReader(_text("models.csv").splitlines()):
        dim, heads = int(d["hidden_size"]), int(d["num_attention_heads"])
        out[d["model"]] = Config(
            "llama", dim, int(d["num_hidden_layers"]), heads, int(d["num_key_value_heads"]),
            dim // heads, int(d["intermediate_size"]), int(d["vocab_size"]),
            tie_embeddings=d["tie_word_embeddings"].lower() == "true", name=d["model"],
        )  # fmt: skip
    return out


# --- what each format stores, tensor by tensor ----------------------------------------


def use_more_bits(i: int, n: int) -> bool:
    """llama.cpp's choice of the layers whose attn_v and ffn_down get more bits in its
    _M mixes (src/llama-quant.cpp): the first and last eighth, and every third between."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


# llama.cpp's file types: the GGML type of the layers' matrices, before the mix's rules
GGUF = {"F32": "f32", "F16": "f16", "BF16": "bf16", "Q8_0": "q8_0", "Q4_0": "q4_0",
        "Q4_1": "q4_1", "Q5_0": "q5_0", "Q5_1": "q5_1", "Q6_K": "q6_k", "Q4_K_M": "q4_k",
        "Q4_K_S": "q4_k", "Q5_K_M": "q5_k", "Q5_K_S": "q5_k"}  # fmt: skip
BIG = {"llama-2-70b", "llama-3-70b", "llama-3.1-70b", "llama-65b"}  # llama.cpp's LLM_TYPE_70B


def gguf_plan(ftype: str, c: Config) -> tuple[list[dict[str, str]], str, str]:
    """(per layer the type of each matrix, the LM head's, the embedding's) of a model that
    llama.cpp's quantizer wrote as `ftype`, without an importance matrix: its rules for
    the mixes of these file types (llama_tensor_get_type)."""
    base = GGUF[ftype]
    quantized = base not in ("f32", "f16", "bf16")
    head = base
    if quantized and base != "q8_0":  # the output tensor: Q6_K, or Q8_0 if rows do not fit
        head = "q6_k" if c.dim % 256 == 0 else "q8_0"
    experts8 = c.n_experts == 8
    # llama.cpp counts a delta net's fused qkv among the value tensors (n_attention_wv), but
    # walks only attention's attn_v through them (i_attention_wv)
    n_wv = sum(c.mixer(i) in ("attention", "delta") for i in range(c.n_layers))
    i_wv = 0
    plan = []
    for i in range(c.n_layers):
        roles = layer_roles(c, i)
        layer = dict.fromkeys(roles, base)
        if ftype in ("Q4_K_M", "Q5_K_M"):
            layer["w_down"] = "q6_k" if use_more_bits(i, c.n_layers) else base
            if "wv" in layer:
                layer["wv"] = "q6_k" if use_more_bits(i_wv, n_wv) else base
            if "d_qkv" in layer:  # attn_qkv: one step up
                layer["d_qkv"] = "q5_k" if ftype == "Q4_K_M" else "q6_k"
        elif ftype == "Q4_K_S" and i < c.n_layers // 8:
            layer["w_down"] = "q5_k"
            if "wv" in layer:
                layer["wv"] = "q5_k" if i_wv < 4 else base
        i_wv += "wv" in layer
        if ftype.startswith(("Q4_K", "Q5_K")) and "wv" in layer:
            if c.name in BIG and layer["wv"] == "q4_k":
                layer["wv"] = "q5_k"
            if experts8:
                layer["wv"] = layer["wk"] = "q8_0"
                layer["wo"] = "q5_k" if ftype.startswith("Q4_K") else layer["wo"]
        dims = layer_matrices(c, i)
        plan.append({r: fallback(f, dims[r][1]) for r, f in layer.items()})
    embed = head if c.tie_embeddings else fallback(base, c.dim)
    return plan, head, embed


def fallback(fmt: str, cols: int) -> str:
    """A K-quant for rows that are not whole super-blocks of 256: llama.cpp's fallback."""
    if cols % 256 == 0 or not fmt.endswith("_k"):
        return fmt
    return {"q4_k": "q5_0", "q5_k": "q5_1", "q6_k": "q8_0"}.get(fmt, "q4_0")


@dataclass(frozen=True)
class Layout:
    """How an engine stores a model in a named format: every layer's matrices, the LM
    head, the embedding and the KV cache (llama-np's format names, or OTHER_BITS')."""

    plan: list[dict[str, str]]
    head: str
    embed: str
    kv_bytes: int = 2  # per key or value element: 16-bit caches, but calm's fp8 ones


def layout(engine: str, weights: str, c: Config, depth: int = 0) -> Layout:
    """The engine's storage of the format a row names (PublishedError if unknown)."""

    def uniform(fmt: str, head: str | None = None, embed: str = "fp16") -> Layout:
        return Layout([dict.fromkeys(layer_roles(c, i), fmt) for i in range(c.n_layers)],
                      head or fmt, embed)  # fmt: skip

    w = weights.strip()
    if engine in ("llama.cpp", "llamafile", "ik_llama.cpp") and w.upper() in GGUF:
        return Layout(*gguf_plan(w.upper(), c))
    if engine == "calm" and w in ("fp16", "fp8", "gf4"):  # every matrix, the head too
        kv = 1 if depth >= 16000 else 2  # calm's CUDA KV cache turns fp8 past 4096 of context
        return Layout(uniform(w).plan, w, w, kv)
    if engine == "gpt-fast" and w in ("bf16", "int8", "int4-g32"):  # every Linear, output too
        fmt = "int8-rowwise" if w == "int8" else w
        return uniform(fmt, embed="bf16")
    if engine == "mlc-llm" and w == "q4f16_1":
        return uniform(w)
    if engine == "exllamav2" and w.startswith("EXL2 ") and w.endswith("bpw"):
        return uniform("exl2-" + w[5:-3], head="exl2-6")  # its converter's head: 6 bits
    if engine == "exllamav2" and w.startswith("GPTQ 4-bit"):
        return uniform("gptq-4bit-g128", head="fp16")  # GPTQ leaves the head in fp16
    raise PublishedError(f"no byte model for {engine}'s {weights!r}")


def predict(m: Measurement) -> Estimate:
    """The speed-of-light bytes (and FLOPs) of one decode token of the row's model, as
    its engine stores it, at the row's mean depth."""
    config = models().get(m.model)
    if config is None:
        raise PublishedError(f"unknown model {m.model!r} (a preset, or a row of models.csv)")
    lay = layout(m.engine, m.weights, config, m.depth)
    try:
        e = estimate(config, lay.plan, kv="f16", pos=m.depth, head=lay.head, embed=lay.embed,
                     engine=False, batch=m.batch)  # fmt: skip
    except ConfigError as err:
        raise PublishedError(f"{m.model}: {err}") from None
    e.reads[KV] = e.reads[KV] * lay.kv_bytes // 2
    return e


@dataclass(frozen=True)
class Held:
    """A row and its bound: predicted ms = bytes / the row's bandwidth."""

    m: Measurement
    bytes_per_token: int
    predicted_ms: float

    @property
    def ratio(self) -> float:
        """measured / predicted: 1 is the speed of light; 2 took twice as long."""
        return self.m.ms / self.predicted_ms

    @property
    def share(self) -> float:
        """The fraction of the bound reached: predicted / measured."""
        return self.predicted_ms / self.m.ms


@cache
def held() -> tuple[Held, ...]:
    """Every row with its prediction."""
    out = []
    for m in measurements():
        b = predict(m).bytes_per_token
        out.append(Held(m, b, 1e3 * b / (m.bandwidth_gbs * 1e9)))
    return tuple(out)


def summary(rows: list[Held], key: Callable[[Held], str]) -> list[dict]:
    """Per group: rows, sources, and the fraction of the bound reached (median, range)."""
    groups: dict[str, list[Held]] = {}
    for h in rows:
        groups.setdefault(key(h), []).append(h)
    out = []
    for name, hs in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        shares = [h.share for h in hs]
        out.append({"group": name, "rows": len(hs), "sources": len({h.m.source for h in hs}),
                    "median": statistics.median(shares), "min": min(shares),
                    "max": max(shares)})  # fmt: skip
    return out


def summary_lines(title: str, rows: Sequence, key: Callable) -> list[str]:
    """Markdown: `summary` of rows (anything with `m` and `share`) by key, under `title`."""
    return ["", f"| {title} | rows | sources | reached, median | min | max |",
            "|---|---:|---:|---:|---:|---:|"] + [
        f"| {d['group']} | {d['rows']} | {d['sources']} | {d['median']:.2f} | "
        f"{d['min']:.2f} | {d['max']:.2f} |" for d in summary(list(rows), key)]  # fmt: skip


def points(rows: Sequence[Held]) -> list[Point]:
    return [Point(h.predicted_ms, h.m.ms, h.m.hw_class, h.m.engine, h.m.source) for h in rows]


@dataclass(frozen=True)
class Expected:
    """The expected ms/token beside a bound, the fit behind it, and how far that fit's
    kind of prediction landed from rows it was not fitted on."""

    ms: float
    fit: Fit
    spread: dict[str, float]  # held out by source, the class's rows: rows, median, p90


def expected(hw_class: str, engine: str, predicted_ms: float,
             pts: Sequence[Point] | None = None) -> Expected | None:  # fmt: skip
    """What the rows say a token bounded at `predicted_ms` takes on a device of this class
    running `engine`: the published rows, or `pts` (this machine's own); None when the
    class has too few rows."""
    pts = points(held()) if pts is None else pts
    if sum(p.hw_class == hw_class for p in pts) < MIN_ROWS:
        return None
    f = best_fit(pts, Point(predicted_ms, predicted_ms, hw_class, engine, ""))
    if f is None:
        return None
    out = [h for h in leave_one_source_out(pts) if h.point.hw_class == hw_class]
    return Expected(f.expect(predicted_ms), f, spread(out))


def report(rows: list[Held], all_rows: bool = False) -> str:
    """Markdown: the fraction of the bound reached by class, engine and source; the
    calibrated prediction's error on held-out sources by class; every row if asked."""
    lines = [f"{len(rows)} published measurements, {len({h.m.source for h in rows})} sources "
             "(bench/published): predicted = bytes per token / the row's bandwidth; "
             "reached = predicted / measured (1 = the speed of light)."]  # fmt: skip
    keys = (("hardware class", lambda h: h.m.hw_class), ("engine", lambda h: h.m.engine),
            ("source", lambda h: h.m.source))  # fmt: skip
    for title, key in keys:
        lines += summary_lines(title, rows, key)
    lines += held_out_lines(points(rows))
    if all_rows:
        lines += ["", "| source | hardware | GB/s | engine | model | weights | depth | MB/token | "
                  "predicted ms | measured ms | reached |",
                  "|---|---|---:|---|---|---|---:|---:|---:|---:|---:|"]  # fmt: skip
        lines += [f"| {h.m.source} | {h.m.hardware} | {h.m.bandwidth_gbs:g} | {h.m.engine} | "
                  f"{h.m.model} | {h.m.weights} | {h.m.depth} | {h.bytes_per_token / 1e6:.0f} "
                  f"| {h.predicted_ms:.2f} | {h.m.ms:.2f} | {h.share:.2f} |"
                  for h in rows]  # fmt: skip
    return "\n".join(lines)


def held_out_lines(pts: Sequence[Point]) -> list[str]:
    """Markdown: the calibrated fit's error on held-out sources, by hardware class."""
    loso = leave_one_source_out(pts)
    lines = ["", "Calibrated: measured = predicted / eta + t0, fitted per hardware class and "
             "engine (else per class, else on all rows); each source's rows predicted by the "
             "fit of the other sources' rows (leave one source out):", "",
             "| hardware class | rows | held-out abs error, median | 80th percentile | "
             "90th percentile | fits |", "|---|---:|---:|---:|---:|---|"]  # fmt: skip
    for cls in (*HW_CLASSES, "all"):
        hs = [h for h in loso if cls in ("all", h.point.hw_class)]
        if hs:
            s = spread(hs)
            fits = ", ".join(sorted({h.fit.group for h in hs}))
            lines.append(f"| {cls} | {s['rows']} | {100 * s['median']:.0f}% | "
                         f"{100 * s['p80']:.0f}% | {100 * s['p90']:.0f}% | {fits} |")  # fmt: skip
    return lines


# --- prompt (prefill) rows -------------------------------------------------------------


@dataclass(frozen=True)
class HeldPrefill:
    """A prompt row and its bound: max(bytes / the row's bandwidth, FLOPs / its device's
    matrix peak for the format), per token, with the bound's three times and the
    expectation's two (bench/prefill_fit.py)."""

    m: Measurement
    bytes: int  # the whole prompt's
    flops: int
    peak: str  # which of the device's peaks: "fp16", "fp32", "int8"
    predicted_ms: float  # per prompt token
    bound: str  # "memory" or "compute"
    memory_ms: float = 0.0  # per prompt token: bytes / bandwidth
    products_ms: float = 0.0  # the matrix products' FLOPs / the peak
    attention_ms: float = 0.0  # attention's FLOPs / the peak
    compute_ms: float = 0.0  # the same FLOPs at the rates engines run them (engine_peak)
    scores_ms: float = 0.0  # the score matrix's f32 entries / the bandwidth
    rate: float = 0.0  # the products' rate behind compute_ms (Device.engine_peak), FLOPS

    @property
    def prompt_tokens(self) -> int:
        return self.m.prompt_tokens or PROMPT_UNSTATED

    @property
    def share(self) -> float:
        """The fraction of the bound reached: measured tok/s / predicted tok/s."""
        return self.predicted_ms / self.m.ms

    def point(self) -> PrefillPoint:
        m = self.m
        return PrefillPoint(self.memory_ms, self.products_ms, self.attention_ms, m.ms,
                            m.hw_class, m.engine, quantized(m.weights), m.source,
                            self.compute_ms, self.scores_ms, self.rate)  # fmt: skip


def quantized(weights: str) -> bool:
    """A format whose products run on quantized codes (else float: f32, f16, bf16...)."""
    return weights.strip().lower() not in ("f32", "fp32", "f16", "fp16", "bf16")


@cache
def prompt_of(model: str, engine: str, weights: str, n: int) -> Prefill:
    """The prompt of n tokens of a model as an engine stores it, from an empty cache (rows
    of one model, engine, format and length share it: counting a model's bytes layer by
    layer was most of the report's time)."""
    config = models()[model]
    lay = layout(engine, weights, config)
    return prefill(config, n, lay.plan, kv="f16", head=lay.head, embed=lay.embed, engine=False)


def predict_prefill(m: Measurement) -> HeldPrefill:
    """A prompt row's bound: the prompt of its model, as its engine stores it, from an empty
    cache, against the row's bandwidth and its device's peak for the format."""
    config = models().get(m.model)
    if config is None:
        raise PublishedError(f"unknown model {m.model!r} (a preset, or a row of models.csv)")
    device = load_devices().get(m.device)
    if device is None:
        raise PublishedError(f"unknown device {m.device!r} (bench/devices.json)")
    n = m.prompt_tokens or PROMPT_UNSTATED
    p = prompt_of(m.model, m.engine, m.weights, n)
    kind, peak = device.matrix_peak(m.weights)
    pred = p.predict(m.bandwidth_gbs * 1e9, peak)
    attention = 1e3 * p.attention_flops / peak / n
    compute, scores = expectation_times(p, device, m.weights, m.bandwidth_gbs * 1e9)
    return HeldPrefill(m, p.bytes, p.flops, kind, pred.ms / n, pred.bound, pred.memory_ms / n,
                       pred.compute_ms / n - attention, attention, compute, scores,
                       device.engine_peak(m.weights) or 0.0)  # fmt: skip


def expectation_times(p: Prefill, device: Device, weights: str,
                      bandwidth: float) -> tuple[float, float]:  # fmt: skip
    """A prompt's two times per token (ms) the expectation adds to the bound's memory time:
    its products at the rate engines run them for `weights` (Device.engine_peak) with
    attention's at the float peak (a device listing none: the products' rate), and its
    score matrix's f32 entries crossing `bandwidth` once."""
    products, rate = p.flops - p.attention_flops, device.engine_peak(weights)
    compute = products / rate + p.attention_flops / (device.float_peak() or rate)
    return 1e3 * compute / p.n, 1e3 * 4 * p.scores / bandwidth / p.n


@cache
def held_prefill() -> tuple[HeldPrefill, ...]:
    """Every prompt row with its prediction."""
    return tuple(predict_prefill(m) for m in prefill_measurements())


def prefill_points(rows: Sequence[HeldPrefill] | None = None) -> list[PrefillPoint]:
    rows = held_prefill() if rows is None else rows
    return [h.point() for h in rows]


@cache
def prefill_fit() -> PrefillFit:
    """The fit of every published prompt row (bench/prefill_fit.py)."""
    return fit_prefill(prefill_points())


@cache
def prefill_held_out() -> tuple[HeldPoint, ...]:
    """Every prompt row predicted by the fit of the other sources' rows."""
    return tuple(prefill_loso(prefill_points()))


@dataclass(frozen=True)
class ExpectedPrefill:
    """The expected ms per prompt token beside the bound, the group whose eta gave it,
    and the held-out error of that class's rows."""

    ms: float
    fit: GroupFit
    r: float
    spread: dict[str, float]


def expected_prefill(like: PrefillPoint) -> ExpectedPrefill | None:
    """What the published prompt rows say a prompt token like `like` (its bound's three
    times, class, engine, format) takes: a class without rows (intel-gpu) gets its kind's
    fit (GPUs', CPUs') and its kind's held-out error; None when no group has rows."""
    f = prefill_fit()
    g = f.group_for(like)
    if g is None:
        return None
    held = prefill_held_out()
    same = [h for h in held if h.point.hw_class == like.hw_class]
    return ExpectedPrefill(
        f.expect(like),
        g,
        f.r,
        prefill_spread(same or [h for h in held if h.point.kind == like.kind]),
    )


def beaten(rows: Sequence[HeldPrefill]) -> list[HeldPrefill]:
    """Rows measured faster than their bound (none, unless a peak or a row is wrong)."""
    return [h for h in rows if h.m.ms < h.predicted_ms]


def prefill_report(rows: list[HeldPrefill], all_rows: bool = False) -> str:
    """Markdown: the prompt rows' fraction of the bound reached by class, engine, peak and
    source; the calibrated fit, its parameters and its error on held-out sources; every
    row if asked."""
    lines = [f"{len(rows)} published prompt (prefill) measurements, "
             f"{len({h.m.source for h in rows})} sources (bench/published): predicted = "
             "max(bytes / the row's bandwidth, FLOPs / its device's matrix peak); reached = "
             "measured / predicted tok/s (1 = the speed of light). Rows faster than their "
             f"bound: {len(beaten(rows))}."]  # fmt: skip
    keys = (("hardware class", lambda h: h.m.hw_class), ("engine", lambda h: h.m.engine),
            ("peak", lambda h: f"{h.peak} ({h.bound}-bound)"),
            ("source", lambda h: h.m.source))  # fmt: skip
    for title, key in keys:
        lines += summary_lines(title, rows, key)
    lines += prefill_fit_lines(rows)
    if all_rows:
        lines += ["", "| source | hardware | engine | model | weights | prompt | peak | "
                  "predicted tok/s | measured tok/s | reached |",
                  "|---|---|---|---|---|---:|---|---:|---:|---:|"]  # fmt: skip
        lines += [f"| {h.m.source} | {h.m.hardware} | {h.m.engine} | {h.m.model} | "
                  f"{h.m.weights} | {h.prompt_tokens} | {h.peak} | {1e3 / h.predicted_ms:.1f} "
                  f"| {h.m.tok_s:g} | {h.share:.2f} |" for h in rows]  # fmt: skip
    return "\n".join(lines)


def prefill_fit_lines(rows: Sequence[HeldPrefill]) -> list[str]:
    """Markdown: the fit's parameters (r and each group's eta) and its error on held-out
    sources by class (leave one source out), with the rows faster than their bound."""
    pts = [h.point() for h in rows]
    f = fit_prefill(pts)
    loso = prefill_loso(pts)
    exponents = ", ".join(f"{c} {x:.1f}" for c, x in sorted(f.a.items()) if c != "gpu")
    exponents = f"({exponents}) " if exponents else ""
    lines = ["", "Calibrated (bench/prefill_fit.py): expected ms per token = (max(memory, "
             f"compute x (rate / {RATE_REF:.0e})^a) + r x scores) / eta: memory the bound's, "
             "compute the FLOPs at the rates engines run them (a GPU's half-precision rate, "
             "quantized weights too), rate the products' rate behind it, scores the f32 score "
             f"matrix / bandwidth; r = {f.r:.2f} for all rows; a = {f.a['gpu']:.1f} for GPUs "
             f"{exponents}and 0 for CPUs; eta per group (narrowest with "
             f"{PREFILL_MIN_ROWS} rows: class / engine / float or quantized, class / engine, "
             "class, GPUs or CPUs, all), medians in log space, each drawn toward its parent "
             "group's by its count of sources:", "",
             "| group | eta | rows | sources |", "|---|---:|---:|---:|"]  # fmt: skip
    for g in sorted(f.etas.values(), key=lambda g: (-g.rows, g.group)):
        lines.append(f"| {g.group} | {g.eta:.3f} | {g.rows} | {g.sources} |")
    lines += ["", "Each source's rows predicted by the fit of the other sources' rows (leave "
              "one source out); error = expected / measured tok/s - 1:", "",
              "| hardware class | rows | sources | held-out abs error, median | 80th percentile "
              "| 90th percentile | faster than the bound | fits used |",
              "|---|---:|---:|---:|---:|---:|---:|---|"]  # fmt: skip
    fast = {id(h.m) for h in beaten(rows)}
    for cls in (*HW_CLASSES, "all"):
        hs = [h for h in loso if cls in ("all", h.point.hw_class)]
        if hs:
            s = prefill_spread(hs)
            n_src = len({h.point.source for h in hs})
            n_fast = sum(1 for h in rows if id(h.m) in fast and cls in ("all", h.m.hw_class))
            used = ", ".join(sorted({h.group for h in hs}))
            lines.append(f"| {cls} | {s['rows']} | {n_src} | {100 * s['median']:.0f}% | "
                         f"{100 * s['p80']:.0f}% | {100 * s['p90']:.0f}% | {n_fast} | "
                         f"{used} |")  # fmt: skip
    return lines


def plot(rows: list[Held], path) -> None:
    """Measured against predicted ms/token, by hardware class, log-log, with the bound."""
    from .report import pyplot, save_figure

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 6))
    for cls in HW_CLASSES:
        hs = [h for h in rows if h.m.hw_class == cls]
        if hs:
            ax.scatter([h.predicted_ms for h in hs], [h.m.ms for h in hs], s=14, label=cls,
                       alpha=0.7)  # fmt: skip
    lo = min(h.predicted_ms for h in rows) * 0.8
    hi = max(h.m.ms for h in rows) * 1.2
    ax.plot([lo, hi], [lo, hi], "k--", lw=1, label="measured = predicted (the bound)")
    ax.set(xscale="log", yscale="log", xlabel="predicted ms/token (bytes / bandwidth)",
           ylabel="measured ms/token", title=f"{len(rows)} published measurements")  # fmt: skip
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)


def plot_prefill(rows: list[HeldPrefill], path) -> None:
    """Measured prompt tok/s against the bound (left) and against the calibrated fit's
    expectation from the other sources' rows (right), by hardware class, log-log."""
    from .report import pyplot, save_figure

    plt = pyplot()
    pts = [h.point() for h in rows]
    held = {id(hp.point): hp for hp in prefill_loso(pts)}  # (a point no fit takes: left out)
    bound = [(1e3 / h.predicted_ms, h) for h in rows]
    fitted = [(1e3 / held[id(p)].expected_ms, h) for p, h in zip(pts, rows, strict=True)
              if id(p) in held]  # fmt: skip
    fig, axes = plt.subplots(1, 2, figsize=(12, 5.5))
    for ax, xy, label in ((axes[0], bound, "the bound"),
                          (axes[1], fitted, "expected, the other sources' fit")):  # fmt: skip
        for cls in HW_CLASSES:
            mine = [(x, h.m.tok_s) for x, h in xy if h.m.hw_class == cls]
            if mine:
                ax.scatter(*zip(*mine, strict=True), s=14, label=cls, alpha=0.7)
        lo = min(min(x for x, _ in xy), min(h.m.tok_s for _, h in xy)) * 0.8
        hi = max(x for x, _ in xy) * 1.2
        ax.plot([lo, hi], [lo, hi], "k--", lw=1, label="measured = x")
        ax.set(xscale="log", yscale="log", xlabel=f"{label}, prompt tok/s",
               ylabel="measured prompt tok/s")  # fmt: skip
        ax.legend(fontsize=8)
    fig.suptitle(f"{len(rows)} published prompt measurements")
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)
