"""The measuring commands: `llama-np sol`, `probe` and `bench`."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING

from bench.devices import Device, DeviceError, get_device, load_devices
from bench.meter import KV, STATE
from bench.probe import (
    Probe,
    load_probe,
    probe_path,
    probe_report,
    run_probe,
    save_probe,
    size_label,
)
from bench.sol import (
    Estimate,
    Prediction,
    Prefill,
    PrefillPrediction,
    estimate,
    experts_read,
    prefill,
    prefill_json,
    to_json,
)
from llama_arch import PRESETS, ConfigError, load_config
from llama_np.errors import LlamaNpError, UsageError
from quant import FORMATS, TARGETS
from quant.host import threads_label, usable_cores

if TYPE_CHECKING:
    from bench.runner import Settings
    from llama_np.model.decoder import Decoder
    from llama_np.model.transformer import Transformer


def device_of(args: argparse.Namespace) -> Device | None:
    try:
        return get_device(args.device, args.devices, args.peak_gbs, args.peak_gflops)
    except DeviceError as e:
        raise UsageError(str(e)) from None


def probe_for(threads: int, refresh: bool = False) -> Probe:
    """The cached probe of this machine, measured first if there is none."""
    probe = None if refresh else load_probe(threads)
    if probe is None:
        print(f"llama-np: probing attainable bandwidth with {threads_label(threads)} "
              "(cached afterwards)", file=sys.stderr)  # fmt: skip
        probe = run_probe(threads)
        save_probe(probe)
    return probe


def check_plot(path: str | None) -> None:
    """A --plot that could not be written is refused before the work, in one line."""
    from bench.report import check_plot_path

    if path is not None:
        try:
            check_plot_path(path)
        except ValueError as e:
            raise UsageError(str(e)) from None


def cmd_sol(args: argparse.Namespace) -> int:
    if args.list_devices:
        for d in load_devices(args.devices).values():
            flops = ", ".join(f"{k} {v / 1e12:g} TF" for k, v in d.flops.items())
            print(f"{d.name:16s} {d.bandwidth / 1e9:8.1f} GB/s  {flops:28s} {d.title}")
        return 0
    if args.plot and not args.published:
        raise UsageError("--plot draws --published's rows: give it with --published")
    if (args.prefill or args.batched) and not args.published:
        raise UsageError("--prefill and --batched select --published's rows: give them with "
                         "--published")  # fmt: skip
    if args.prefill and args.batched:
        raise UsageError("give one of --prefill and --batched")
    if args.published:
        return published_report(args)
    if args.config is None:
        raise UsageError("give --config PATH_OR_PRESET (or --published)")
    if args.prompt is not None:
        return sol_prefill(args)
    e = sol_estimate(args)
    device = local_device(e, args) if args.device == "local" else device_of(args)
    pred = e.predict(device.bandwidth, device.peak_flops(e.weights)) if device else None
    exp = expected_for(device, args, pred.ms_per_token) if pred and e.batch == 1 else None
    if args.json:
        extra = {"device": device.name} if device else {}
        if exp:
            extra |= {"expected_ms_per_token": exp.ms, "expected_fit": asdict(exp.fit),
                      "expected_held_out": exp.spread}  # fmt: skip
        print(json.dumps(to_json(e, pred) | extra, indent=1))
        return 0
    print(sol_text(e, pred, device, exp))
    return 0


def sol_estimate(args: argparse.Namespace) -> Estimate:
    """The estimate `sol` holds against a device: --config named as every command takes a
    model (its file's own formats unless --weights says otherwise), or a preset."""
    config, weights, head, embed = model_shape(args.config, args.weights, args.head)
    try:
        return estimate(config, weights, args.kv, args.pos, args.window, head,
                        args.engine_layout, embed, backend_name(args.kernels),
                        batch=args.batch)  # fmt: skip
    except ConfigError as err:
        raise UsageError(str(err)) from None


def sol_prefill(args: argparse.Namespace) -> int:
    """`sol --prompt N`: the prefill of N tokens after --pos, against the device's bandwidth
    and its matrix peak for the weights (Device.matrix_peak), with the published prompt
    speeds' calibrated expectation."""
    if args.batch != 1:
        raise UsageError("--prompt is one sequence's prompt; --batch counts decode's sequences: "
                         "give one of them")  # fmt: skip
    if args.pos < 0:
        raise UsageError(f"--pos must be >= 0 (got {args.pos})")
    p = sol_prefill_estimate(args)
    weight_bytes = p.bytes - p.reads[KV] - p.reads[STATE]
    device = probe_device(args, weight_bytes) if args.device == "local" else device_of(args)
    peak, pred, exp = None, None, None
    if device is not None:
        peak = device.matrix_peak(p.weights)
        pred = p.predict(device.bandwidth, peak[1])
        exp = expected_prefill_for(device, args, pred, p)
    if args.json:
        out = prefill_json(p, pred) | {"device": device.name if device else None,
                                       "peak": peak[0] if peak else None,
                                       "predicted_prefill_tok_s": pred and pred.tokens_per_s,
                                       "expected_prefill_tok_s": exp and 1e3 / exp.ms}  # fmt: skip
        if exp:
            out |= {"expected_fit": asdict(exp.fit) | {"r": exp.r},
                    "expected_held_out": exp.spread}  # fmt: skip
        print(json.dumps(out, indent=1))
        return 0
    print(prefill_text(p, pred, device, peak, exp))
    return 0


def sol_prefill_estimate(args: argparse.Namespace) -> Prefill:
    """The prefill `sol --prompt` holds against a device (the model as sol_estimate's)."""
    config, weights, head, embed = model_shape(args.config, args.weights, args.head)
    try:
        return prefill(config, args.prompt, weights, args.kv, args.pos, args.window, head,
                       args.engine_layout, embed, backend_name(args.kernels))  # fmt: skip
    except ConfigError as err:
        raise UsageError(str(err)) from None


def expected_prefill_for(device: Device, args: argparse.Namespace, pred: PrefillPrediction,
                         p: Prefill):  # fmt: skip
    """The published prompt speeds' fit (bench/prefill_fit.py) for the device's class,
    --engine and the weights (float or quantized), beside the bound; None for this machine
    or a class without rows."""
    from bench.prefill_fit import PrefillPoint
    from bench.published import expectation_times, expected_prefill, quantized

    if device.name == "local" or not device.hw_class or not pred.peak_flops:
        return None
    attention = 1e3 * p.attention_flops / pred.peak_flops / p.n
    products = pred.compute_ms / p.n - attention
    compute, scores = expectation_times(p, device, p.weights, device.bandwidth)
    like = PrefillPoint(pred.memory_ms / p.n, products, attention, float("nan"),
                        device.hw_class, args.engine, quantized(p.weights), "", compute,
                        scores, device.engine_peak(p.weights) or 0.0)  # fmt: skip
    return expected_prefill(like)


def prefill_text(p: Prefill, pred: PrefillPrediction | None, device: Device | None, peak,
                 exp=None) -> str:  # fmt: skip
    """`sol --prompt`'s report: bytes, FLOPs, both bounds and the one that binds."""
    head = f" (head {p.head})" if p.head != p.weights else ""
    kv, state = p.reads[KV], p.reads[STATE]
    state = f", recurrent state {state / 1e6:.2f} (written back once)" if state else ""
    lines = [
        f"{p.config.name}: weights {p.weights}{head}, kv {p.kv}, a prompt of {p.n} tokens "
        f"after {p.pos} in the cache",
        f"  bytes read once  {p.bytes / 1e6:12.2f} MB (weights {(p.bytes - kv) / 1e6:.2f}, "
        f"KV read {kv / 1e6:.2f}{state}); KV written {p.kv_write_bytes / 1e6:.2f} MB",
        f"  FLOPs            {p.flops / 1e9:12.1f} GFLOP ({p.flops / p.n / 1e9:.3f} a token, "
        f"{p.flops / p.bytes:.1f} FLOP/byte)",
    ]
    if pred and device:
        lines += [
            f"  device           {device.title}: {device.bandwidth / 1e9:.4g} GB/s, {peak[0]} peak "
            f"{(pred.peak_flops or 0) / 1e12:.4g} T/s  [{device.source}]",
            f"  memory bound     {pred.memory_ms:12.3f} ms (bytes / bandwidth)",
            f"  compute bound    {pred.compute_ms:12.3f} ms (FLOPs / the {peak[0]} peak)",
            f"  speed of light   {pred.ms:.3f} ms for the prompt ({pred.tokens_per_s:.1f} tok/s), "
            f"{pred.bound}-bound",
        ]
    if exp is not None:
        f, s = exp.fit, exp.spread
        lines.append(
            f"  expected         {1e3 / exp.ms:.1f} tok/s: the fit of {f.group} ({f.rows} "
            f"published prompt rows, {f.sources} sources: eta {f.eta:.2f}, attention r "
            f"{exp.r:.2f}); on sources it was not fitted on, |error| median "
            f"{100 * s['median']:.0f}%, 80th percentile {100 * s['p80']:.0f}%"
        )
    return "\n".join(lines)


def expected_for(device: Device | None, args: argparse.Namespace, bound_ms: float):
    """The calibrated figure beside the bound: the published rows' fit for the device's
    class and --engine, or this machine's own rows (the results command keeps them)."""
    from bench.calibrate import local_points
    from bench.published import expected

    if device is None:
        return None
    if device.name == "local":
        probe = probe_for(args.threads or usable_cores())
        return expected("this machine", "llama-np", bound_ms, local_points(probe.machine))
    return expected(device.hw_class, args.engine, bound_ms) if device.hw_class else None


def published_report(args: argparse.Namespace) -> int:
    """`sol --published`: every published row against its bound, by class, engine and
    source, the calibrated fit's held-out error, and a plot of predicted against measured."""
    from bench import published

    check_plot(args.plot)
    if args.prefill:
        return published_prefill_report(args)
    if args.batched:
        return published_batch_report(args)
    rows = published.held()
    if args.json:
        print(json.dumps([asdict(h.m) | {"bytes_per_token": h.bytes_per_token,
                                          "predicted_ms": h.predicted_ms, "reached": h.share}
                          for h in rows], indent=1))  # fmt: skip
    else:
        print(published.report(list(rows), all_rows=args.rows))
    if args.plot:
        published.plot(list(rows), args.plot)
        print(f"llama-np: wrote {args.plot}", file=sys.stderr)
    return 0


def published_prefill_report(args: argparse.Namespace) -> int:
    """`sol --published --prefill`: the published prompt speeds against their bounds."""
    from bench import published

    rows = list(published.held_prefill())
    if args.json:
        out = [asdict(h.m) | {"bytes": h.bytes, "flops": h.flops, "peak": h.peak,
                              "bound": h.bound, "predicted_prefill_tok_s": 1e3 / h.predicted_ms,
                              "reached": h.share} for h in rows]  # fmt: skip
        print(json.dumps(out, indent=1))
    else:
        print(published.prefill_report(rows, all_rows=args.rows))
    if args.plot:
        published.plot(rows, args.plot)
        print(f"llama-np: wrote {args.plot}", file=sys.stderr)
    return 0


def published_batch_report(args: argparse.Namespace) -> int:
    """`sol --published --batched`: the published batched decode against a step's bound."""
    from bench.published_batch import batch_report, held_batch

    if args.plot:
        raise UsageError("--plot draws one sequence's or the prompt rows, not --batched's")
    rows = list(held_batch())
    if args.json:
        out = [asdict(h.m) | {"bytes": h.bytes, "flops": h.flops, "peak": h.peak,
                              "bound": h.bound,
                              "ridge_batch": h.ridge if math.isfinite(h.ridge) else None,
                              "predicted_step_ms": h.predicted_ms,
                              "measured_step_ms": h.measured_ms, "reached": h.share}
               for h in rows]  # fmt: skip
        print(json.dumps(out, indent=1))
    else:
        print(batch_report(rows, all_rows=args.rows))
    return 0


def local_device(e: Estimate, args: argparse.Namespace) -> Device:
    """This machine as `llama-np probe` measured it, for a decode step (probe_device)."""
    return probe_device(args, e.bytes_per_token)


def probe_device(args: argparse.Namespace, working_set: int) -> Device:
    """This machine as `llama-np probe` measured it (probed now if it never was): the
    curve's bandwidth at the working set, and the ceilings of the arithmetic the kernels
    run: "fp32" for float weights, "int8" for quantized ones (Probe.peak_flops)."""
    probe = probe_for(args.threads or usable_cores())
    tier, bw = probe.attainable(working_set)
    backend, dot = kernels_dot(backend_name(args.kernels))
    peaks = {"fp32": probe.peak_flops(backend, "f32", dot),
             "int8": probe.peak_flops(backend, "q8_0", dot)}  # fmt: skip
    title = (f"this machine ({threads_label(probe.threads)}), the probe's attainable bandwidth "
             f"at a working set of {size_label(working_set)} ({tier})")  # fmt: skip
    return Device("local", title, bw, peaks, "probe", probe_path(probe.threads).name)


def backend_name(kernels: str) -> str:
    """The backend `--kernels` resolves to ("auto": numba when it is importable)."""
    from quant.backends import numba_importable

    if kernels == "auto":
        return "numba" if numba_importable() else "numpy"
    return kernels


def kernels_dot(kernels: str) -> tuple[str, str]:
    """A `--kernels` choice as (backend, what quantized products multiply x as):
    "numba-int8" -> ("numba", "int8"), "numba" -> ("numba", the default int16)."""
    from quant.backends import DEFAULT_DOT

    backend, _, dot = kernels.partition("-")
    return backend, dot or (DEFAULT_DOT if backend == "numba" else "f32")


def sol_text(e: Estimate, pred: Prediction | None, device: Device | None, exp=None) -> str:
    head = f" (head {e.head})" if e.head != e.weights else ""
    layout = (
        f"llama-np's in-memory layout ({e.kernels} kernels)"
        if e.engine
        else "the formats' own sizes"
    )
    per = "token" if e.batch == 1 else "step"
    batch = "" if e.batch == 1 else f"a batch of {e.batch} sequences, each at "
    state = e.reads[STATE]
    state = f", recurrent state {state / 1e6:.2f}, written back whole" if state else ""
    lines = [
        f"{e.config.name}: weights {e.weights}{head}, kv {e.kv}, {batch}position {e.pos}, "
        f"attends to {e.n_keys} keys; bytes as {layout}",
        f"  parameters       {e.params_total / 1e6:12.1f} M total, "
        f"{e.params_active / 1e6:.1f} M read per token",
        f"  bytes per {per:5s}  {e.bytes_per_token / 1e6:12.2f} MB "
        f"(weights {e.weight_bytes / 1e6:.2f}, KV {e.kv_bytes / 1e6:.2f}{state})",
        *(f"    {cat:14s} {b / 1e6:12.3f} MB" for cat, b in e.reads.items() if b or cat != STATE),
        f"  FLOPs per {per:5s}  {e.flops / 1e9:12.3f} GFLOP "
        f"({e.flops / e.bytes_per_token:.2f} FLOP/byte)",
    ]
    if e.config.n_experts > 1:
        c = e.config
        lines.append(f"  experts read     {experts_read(c, e.batch):12.2f} per layer "
                     f"(of {c.n_experts}; {c.experts_per_token} per token)")  # fmt: skip
    if pred and device:
        lines += [
            f"  device           {device.title}: {device.bandwidth / 1e9:.4g} GB/s, "
            f"{(pred.peak_flops or 0) / 1e12:.4g} TFLOPS  [{device.source}]",
            f"  speed of light   {pred.ms_per_token:.3f} ms/{per} "
            f"({e.batch * pred.tokens_per_s:.1f} tok/s), {pred.bound}-bound "
            f"(memory {pred.memory_ms:.3f} ms, compute {pred.compute_ms:.3f} ms)",
        ]
        if pred.peak_flops:
            ridge = e.ridge_batch(pred.bandwidth_bytes_per_s, pred.peak_flops)
            lines.append(f"  ridge batch B*   {ridge:12.1f} sequences at this depth: "
                         "compute-bound beyond")  # fmt: skip
    if exp is not None:
        f, s = exp.fit, exp.spread
        lines.append(
            f"  expected         {exp.ms:.3f} ms/{per} ({1e3 / exp.ms:.1f} tok/s): the fit of "
            f"{f.group} ({f.rows} rows, {f.sources} sources: eta {f.eta:.2f}, t0 "
            f"{f.t0_ms:.2f} ms); on rows it was not fitted on, |error| median "
            f"{100 * s['median']:.0f}%, 90th percentile {100 * s['p90']:.0f}%"
        )
    return "\n".join(lines)


def cmd_probe(args: argparse.Namespace) -> int:
    probe = probe_for(args.threads or usable_cores(), refresh=args.refresh)
    print(
        json.dumps(probe.__dict__, default=lambda o: o.__dict__, indent=1)
        if args.json
        else probe_report(probe)
    )
    return 0


def compare_runs(old: str, new: str) -> int:
    """`bench --compare OLD NEW`: two runs side by side (bench.compare), measuring nothing."""
    from bench.compare import CompareError, load_run, table

    try:
        print(table(load_run(old), load_run(new)))
    except CompareError as e:
        raise UsageError(str(e)) from None
    return 0


def load_baseline(path: str | None):
    """--baseline's run, read before the measurement: a bad file must not cost one."""
    from bench.compare import CompareError, load_run

    try:
        return None if path is None else load_run(path)
    except CompareError as e:
        raise UsageError(str(e)) from None


def run_stamp(args: argparse.Namespace, threads: int, probe: Probe, model: dict) -> dict:
    """What a later run needs to be matched with this one: the code, the machine, the
    date, the command, the kernel cache and the model's identity (bench.stamp)."""
    from bench.stamp import commit, cpu, now, version

    return {"llama_np": version(), "commit": commit(), "date": now(), "cpu": cpu(threads),
            "threads": threads, "machine": probe.machine, "kernel_cache": kernel_cache_dir(),
            "command": " ".join(["llama-np", *sys.argv[1:]]), "model": model}  # fmt: skip


def kernel_cache_dir() -> str | None:
    """Where the compiled kernels this process runs are cached (None: not loaded)."""
    if "quant.compiled" not in sys.modules:
        return None
    from quant.compiled.jit import cache_folder

    return str(cache_folder())


def cmd_bench(args: argparse.Namespace) -> int:
    from bench import report
    from bench.runner import Settings, run
    from llama_np.model.decoder import Decoder

    if args.compare:
        return compare_runs(*args.compare)
    baseline = load_baseline(args.baseline)
    if args.endpoint:
        return bench_endpoint(args)
    if args.weights is not None and args.weights not in FORMATS:
        raise UsageError(
            f"--weights {args.weights}: llama.cpp's mixed file type, for "
            "--endpoint's --config only (llama-np converts to one format)"
        )
    check_plot(args.plot)
    warmup = Settings.warmup
    if args.n_predict <= warmup:
        raise UsageError(f"bench times the decode steps after the first {warmup} (warm-up): "
                         f"give -n of at least {warmup + 1}")  # fmt: skip
    threads = args.threads or usable_cores()
    device = device_of(args)
    probe = probe_for(threads)
    rows = []
    for kernels in args.kernels:  # one table, a backend after the other
        model, identity = bench_model(args, threads, kernels)
        model.warm_up(args.kv, args.batch)  # no row counts compile time
        with model:
            window = args.window  # None: the model's own, per layer
            s = Settings(args.prompt, args.n_predict, args.depth, args.reps, window=window,
                         profile=args.profile, batch=args.batch)  # fmt: skip
            dec = Decoder(model, args.kv, args.window, capacity=args.prompt + args.n_predict + 1)
            measured = run(dec, s, probe, device)
            probe = reprobe_beaten(measured, dec, s, probe, threads)
            rows += measured
    meta = run_stamp(args, threads, probe, identity)
    print_rows(rows, args, meta)
    if baseline is not None:
        from bench.compare import Run, table

        new = Run("this run", meta, json.loads(report.json_text(rows))["rows"])
        print("\n" + table(baseline, new), file=sys.stderr if args.json else sys.stdout)
    if args.plot:
        draw = report.plot_batch if args.batch else report.plot
        draw(rows, args.plot, title=f"{model.name}, {threads_label(threads)}")
        print(f"llama-np: wrote {args.plot}", file=sys.stderr)
    return 0


def bench_endpoint(args: argparse.Namespace) -> int:
    """`bench --endpoint URL`: a server's streams at each concurrency, held against the speed
    of light of that many sequences (bench/endpoint.py). --config and --weights are read
    before the first request: a mistake there must not cost the measurement."""
    from bench import endpoint, report

    shape = endpoint_shape(args)
    base = args.endpoint.rstrip("/")
    base = base if base.endswith("/v1") else base + "/v1"
    try:
        key = args.api_key or os.environ.get("LLAMA_NP_API_KEY")
        served, info = endpoint.served_model(base, key)
        model = args.api_model or served
        rows = endpoint.measure(base, model, args.concurrency, args.prompt, args.n_predict,
                                args.reps, api_key=key)  # fmt: skip
    except endpoint.EndpointError as e:
        raise LlamaNpError(str(e)) from None
    hold_endpoint(rows, args, base, info, shape)
    if args.json:
        print(report.json_text(rows, {"endpoint": base}))
    elif args.csv:
        print(report.csv_text(rows), end="")
    else:
        table = report.markdown if args.md else report.text_table
        print(table(rows, endpoint.COLUMNS))
    return 0


Shape = tuple  # (Config, weights: a format or a per-layer plan, head format, embed format)


def model_shape(spec: str, weights: str | None, head: str | None) -> Shape:
    """A model's shape and formats, named as every command takes a model: a `pull` alias or
    hf:ORG/REPO (its file, pulled when absent), a GGUF file, a checkpoint directory (each
    counted in its own tensors' formats, unless `weights` converts them, as `-m X --weights
    W` does), a preset (`synthetic:NAME` too) or a config.json (in `weights`, default f32:
    a format, or one of llama.cpp's mixed file types, as its quantizer writes them)."""
    from llama_np.io.gguf import gguf_shape
    from llama_np.io.hub import MODELS, pull
    from llama_np.io.source import checkpoint_shape
    from llama_np.model.synthetic import SYNTHETIC

    preset = spec.startswith(SYNTHETIC)
    spec = spec.removeprefix(SYNTHETIC)
    named = not preset and (spec in MODELS or spec.startswith("hf:"))
    path = pull(spec) if named else Path(spec).expanduser()
    stored = None
    if preset:
        pass
    elif path.is_file() and path.suffix == ".gguf":
        stored = gguf_shape(path)
    elif path.is_dir() and (path / "config.json").is_file() and any(path.glob("*.safetensors")):
        stored = checkpoint_shape(path)
    if stored is not None:
        config, plan, stored_head, embed = stored
        if named:  # reports name it as the user did, as `load` does
            config = replace(config, name=spec)
        if weights is None:
            return config, plan, head or stored_head, embed
    else:
        try:
            config = load_config(str(path))
        except ConfigError as e:
            if not path.exists() and spec not in PRESETS:
                raise UsageError(f"{spec!r} is neither a `pull` alias ({', '.join(MODELS)}), a "
                                 "GGUF file, a checkpoint, a preset nor a config.json "
                                 "(`llama-np sol --help` lists the presets)") from None  # fmt: skip
            raise UsageError(str(e)) from None
    return config, *weights_of(weights or "f32", head, config)


def endpoint_shape(args: argparse.Namespace) -> Shape | None:
    """The served model's shape and formats from --config (model_shape). None without
    --config."""
    if args.config is None:
        if args.weights:
            raise UsageError("--weights with --endpoint describes --config's model: give both")
        return None
    return model_shape(args.config, args.weights, args.head)


def weights_of(weights: str, head: str | None, config) -> tuple:
    """(weights, head, embed) for a format of llama-np's or one of llama.cpp's mixed file
    types (q4_k_m ...: each tensor's type as its quantizer picks it, bench.published)."""
    from bench.published import GGUF, gguf_plan

    if weights.upper() in GGUF and weights not in FORMATS:
        plan, mixed_head, embed = gguf_plan(weights.upper(), config)
        return plan, head or mixed_head, embed
    if weights not in FORMATS:
        raise UsageError(f"--weights {weights}: not a format ({', '.join(sorted(FORMATS))}) "
                         "nor one of llama.cpp's mixed file types")  # fmt: skip
    return weights, head, None


def hold_endpoint(rows: list, args: argparse.Namespace, base: str, info: dict | None,
                  shape: Shape | None) -> None:  # fmt: skip
    """The speed of light of each concurrency: `shape` (endpoint_shape: bytes at rest),
    else the one llama-np's server describes (its layout, its kernels' ceiling); the
    device from --device/--peak-gbs, else this machine's probe for a local server."""
    from urllib.parse import urlparse

    from bench.endpoint import hold
    from bench.sol import weights_label
    from llama_arch import Config
    from quant.backends import FLOATS

    device = device_of(args)
    local = urlparse(base).hostname in ("127.0.0.1", "localhost", "::1")
    probe = probe_for(args.threads or usable_cores()) if local and device is None else None
    if shape is not None:
        config, weights, head, embed = shape
        kw = {"engine": False, "head": head, "embed": embed}
        backend, dot = "numba", "int8" if weights_label(weights) not in FLOATS else "f32"
    elif info is not None:
        config, weights = Config.from_dict(info["config"]), info["weights"]
        kw = {"head": info["head"], "embed": info["embed"], "kernels": info["kernels"]}
        backend, dot = info["kernels"], info["dot"]
    else:
        print("llama-np: note: give --config (and --weights) to hold the rows against the "
              "speed of light", file=sys.stderr)  # fmt: skip
        return
    kv = info["kv"] if info and shape is None else args.kv
    window = args.window if args.window is not None else (info or {}).get("window")
    peak = device.peak_flops(weights_label(weights)) if device else (
        probe.peak_flops(backend, weights_label(weights), dot) if probe else None)  # fmt: skip
    hold(rows, lambda c, pos: estimate(config, weights, kv, pos, window, batch=c, **kw), probe,
         device.bandwidth if device else None, peak)  # fmt: skip


def bench_model(args: argparse.Namespace, threads: int, kernels: str) -> tuple[Transformer, dict]:
    """The model to measure on these kernels, started: a checkpoint, or `synthetic:SHAPE`;
    and its identity (bench.stamp.file_identity, or the synthetic shape and its seed)."""
    from bench.stamp import file_identity
    from llama_np.api import choose_backend, load
    from llama_np.model.synthetic import SEED, SYNTHETIC, synthetic_model

    if args.model.startswith(SYNTHETIC):
        backend = choose_backend(kernels)
        try:
            model = synthetic_model(args.model, args.weights, args.head, backend)
        except ConfigError as e:
            raise UsageError(str(e)) from None
        if args.check_tensors:
            check_matrices(model)
        return model.start(threads), {"synthetic": args.model, "seed": SEED}
    for f in (args.weights, args.head):
        if f is not None and f not in TARGETS:
            raise UsageError(f"--weights/--head {f}: K-quants are read as stored, never "
                             "written; only synthetic: models take them")  # fmt: skip
    llm = load(args.model, weights=args.weights, head=args.head, threads=threads,
               kernels=kernels, progress=True, check_tensors=args.check_tensors)  # fmt: skip
    return llm.model, file_identity(llm.path)


def check_matrices(model: Transformer) -> None:
    """--check-tensors on a synthetic model: its random matrices, as a file's tensors."""
    for i, w in enumerate(model.weights.matrices()):
        if (where := w.first_nonfinite()) is not None:
            raise LlamaNpError(f"synthetic matrix {i} holds NaN or infinity at {list(where)}")


def reprobe_beaten(rows: list, dec: Decoder, s: Settings, probe: Probe, threads: int) -> Probe:
    """Where a row ran faster than its speed of light, the cached probe's bandwidth is low
    for this moment (a VM's neighbours move it): measure the curve again at those rows'
    working sets, hold every row against the better figures (and keep them in the cache);
    a row still faster than its bound is said on stderr, not hidden. The probe to use next."""
    from bench.probe import reprobe
    from bench.runner import beats_its_bound, rehold

    beaten = [r for r in rows if beats_its_bound(r)]
    if not beaten:
        return probe
    print(f"llama-np: {len(beaten)} row(s) faster than the probe's bandwidth allows; "
          "probing again at their working sets", file=sys.stderr)  # fmt: skip
    probe = reprobe(probe, [r.working_set for r in beaten], threads)
    save_probe(probe)
    rehold(rows, dec, s, probe)
    for r in filter(beats_its_bound, rows):
        print(f"llama-np: depth {r.depth}, B = {r.batch}: still {r.measured_over_sol:.2f} of "
              f"its speed of light ({r.gbs:.1f} GB/s against the probe's best "
              f"{r.attainable_gbs:.1f}): it reads memory faster than the probe's readers do, "
              "and its bound is no bound", file=sys.stderr)  # fmt: skip
    return probe


def print_rows(rows: list, args: argparse.Namespace, meta: dict) -> None:
    from bench import report

    if args.json:
        print(report.json_text(rows, meta))
    elif args.csv:
        print(report.csv_text(rows), end="")
    elif args.md:
        print(report.markdown(rows))
    else:
        print(report.text_table(rows))
    if args.profile and not args.json:
        for r in rows:
            print("\n" + report.profile_table(r))
