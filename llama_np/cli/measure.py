"""The measuring commands: `llama-np sol`, `probe` and `bench`."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

from arch import ConfigError, load_config
from bench.devices import Device, DeviceError, get_device, load_devices
from bench.probe import (
    Probe,
    load_probe,
    probe_path,
    probe_report,
    run_probe,
    save_probe,
    size_label,
)
from bench.sol import Estimate, Prediction, estimate, experts_read, to_json
from llama_np.errors import LlamaNpError, UsageError
from quant import TARGETS
from quant.host import usable_cores

if TYPE_CHECKING:
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
        print(
            f"llama-np: probing attainable bandwidth with {threads} threads (cached afterwards)",
            file=sys.stderr,
        )
        probe = run_probe(threads)
        save_probe(probe)
    return probe


def cmd_sol(args: argparse.Namespace) -> int:
    if args.list_devices:
        for d in load_devices(args.devices).values():
            flops = ", ".join(f"{k} {v / 1e12:g} TF" for k, v in d.flops.items())
            print(f"{d.name:16s} {d.bandwidth / 1e9:8.1f} GB/s  {flops:28s} {d.title}")
        return 0
    if args.config is None:
        raise UsageError("give --config PATH_OR_PRESET")
    try:
        config = load_config(args.config)
        e = estimate(config, args.weights, args.kv, args.pos, args.window, args.head,
                     args.engine_layout, kernels=backend_name(args.kernels),
                     batch=args.batch)  # fmt: skip
    except ConfigError as err:
        raise UsageError(str(err)) from None
    device = local_device(e, args) if args.device == "local" else device_of(args)
    pred = e.predict(device.bandwidth, device.peak_flops(args.weights)) if device else None
    if args.json:
        print(json.dumps(to_json(e, pred) | ({"device": device.name} if device else {}), indent=1))
        return 0
    print(sol_text(e, pred, device))
    return 0


def local_device(e: Estimate, args: argparse.Namespace) -> Device:
    """This machine as `llama-np probe` measured it (probed now if it never was): the
    curve's bandwidth at the step's working set, and the ceiling of the arithmetic the
    kernels run for these weights and this batch."""
    probe = probe_for(args.threads or usable_cores())
    tier, bw = probe.attainable(e.bytes_per_token)
    peak = probe.peak_flops(backend_name(args.kernels), e.weights, e.batch)
    title = (f"this machine ({probe.threads} threads), the probe's attainable bandwidth at a "
             f"working set of {size_label(e.bytes_per_token)} ({tier})")  # fmt: skip
    return Device("local", title, bw, {"fp32": peak}, "probe", probe_path(probe.threads).name)


def backend_name(kernels: str) -> str:
    """The backend `--kernels` resolves to ("auto": numba when it is importable)."""
    from quant.backends import numba_importable

    if kernels == "auto":
        return "numba" if numba_importable() else "numpy"
    return kernels


def sol_text(e: Estimate, pred: Prediction | None, device: Device | None) -> str:
    head = f" (head {e.head})" if e.head != e.weights else ""
    layout = (
        f"llama-np's in-memory layout ({e.kernels} kernels)"
        if e.engine
        else "the formats' own sizes"
    )
    per = "token" if e.batch == 1 else "step"
    batch = "" if e.batch == 1 else f"a batch of {e.batch} sequences, each at "
    lines = [
        f"{e.config.name}: weights {e.weights}{head}, kv {e.kv}, {batch}position {e.pos}, "
        f"attends to {e.n_keys} keys; bytes as {layout}",
        f"  parameters       {e.params_total / 1e6:12.1f} M total, "
        f"{e.params_active / 1e6:.1f} M read per token",
        f"  bytes per {per:5s}  {e.bytes_per_token / 1e6:12.2f} MB "
        f"(weights {e.weight_bytes / 1e6:.2f}, KV {e.kv_bytes / 1e6:.2f})",
        *(f"    {cat:14s} {b / 1e6:12.3f} MB" for cat, b in e.reads.items()),
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
    return "\n".join(lines)


def cmd_probe(args: argparse.Namespace) -> int:
    probe = probe_for(args.threads or usable_cores(), refresh=args.refresh)
    print(
        json.dumps(probe.__dict__, default=lambda o: o.__dict__, indent=1)
        if args.json
        else probe_report(probe)
    )
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from bench.runner import Settings, run
    from llama_np.model.decoder import Decoder

    warmup = Settings.warmup
    if args.n_predict <= warmup:
        raise UsageError(f"bench times the decode steps after the first {warmup} (warm-up): "
                         f"give -n of at least {warmup + 1}")  # fmt: skip
    threads = args.threads or usable_cores()
    device = device_of(args)
    with bench_model(args, threads) as model:
        window = args.window if args.window is not None else model.config.sliding_window
        s = Settings(args.prompt, args.n_predict, args.depth, args.reps, window=window,
                     profile=args.profile, batch=args.batch)  # fmt: skip
        probe = probe_for(threads)
        dec = Decoder(model, args.kv, args.window, capacity=args.prompt + args.n_predict + 1)
        rows = run(dec, s, probe, device)
    print_rows(rows, args, {"threads": threads, "machine": probe.machine})
    if args.plot:
        from bench import report

        draw = report.plot_batch if args.batch else report.plot
        draw(rows, args.plot, title=f"{model.name}, {threads} threads")
        print(f"llama-np: wrote {args.plot}", file=sys.stderr)
    return 0


def bench_model(args: argparse.Namespace, threads: int) -> Transformer:
    """The model to measure, its kernels started: a checkpoint, or `synthetic:SHAPE`."""
    from llama_np.api import choose_backend, load
    from llama_np.model.synthetic import SYNTHETIC, synthetic_model

    if args.model.startswith(SYNTHETIC):
        backend = choose_backend(args.kernels)
        try:
            model = synthetic_model(args.model, args.weights, args.head, backend)
        except ConfigError as e:
            raise UsageError(str(e)) from None
        if args.check_tensors:
            check_matrices(model)
        return model.start(threads)
    for f in (args.weights, args.head):
        if f is not None and f not in TARGETS:
            raise UsageError(f"--weights/--head {f}: K-quants are read as stored, never "
                             "written; only synthetic: models take them")  # fmt: skip
    llm = load(args.model, weights=args.weights, head=args.head, threads=threads,
               kernels=args.kernels, progress=True, check_tensors=args.check_tensors)  # fmt: skip
    return llm.model


def check_matrices(model: Transformer) -> None:
    """--check-tensors on a synthetic model: its random matrices, as a file's tensors."""
    for i, w in enumerate(model.weights.matrices()):
        if (where := w.first_nonfinite()) is not None:
            raise LlamaNpError(f"synthetic matrix {i} holds NaN or infinity at {list(where)}")


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
