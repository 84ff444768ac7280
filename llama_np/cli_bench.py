"""The measuring commands: `llama-np sol`, `probe` and `bench`."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable

from bench.devices import Device, DeviceError, get_device, load_devices
from bench.probe import Probe, load_probe, probe_report, run_probe, save_probe
from bench.sol import Estimate, Prediction, ShapeError, estimate, load_shape, to_json
from quant import FORMATS

from .errors import UsageError

DEVICE_ARGS = [
    (("--device",), dict(help="device from the table (`llama-np sol --list-devices`)")),
    (("--peak-gbs",), dict(type=float, help="peak memory bandwidth, GB/s (overrides --device)")),
    (("--peak-gflops",), dict(type=float, help="peak GFLOPS (overrides --device)")),
    (
        ("--devices",),
        dict(action="append", default=[], metavar="FILE", help="extra device table (JSON)"),
    ),
]


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
        shape = load_shape(args.config)
        e = estimate(shape, args.weights, args.kv, args.pos, args.window, args.head,
                     args.engine_layout, kernels=backend_name(args.kernels))  # fmt: skip
    except ShapeError as err:
        raise UsageError(str(err)) from None
    device = device_of(args)
    pred = e.predict(device.bandwidth, device.peak_flops(args.weights)) if device else None
    if args.json:
        print(json.dumps(to_json(e, pred) | ({"device": device.name} if device else {}), indent=1))
        return 0
    print(sol_text(e, pred, device))
    return 0


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
    lines = [
        f"{e.shape.name}: weights {e.weights}{head}, kv {e.kv}, position {e.pos}, "
        f"attends to {e.n_keys} keys; bytes as {layout}",
        f"  parameters       {e.params_total / 1e6:12.1f} M total, "
        f"{e.params_active / 1e6:.1f} M read per token",
        f"  bytes per token  {e.bytes_per_token / 1e6:12.2f} MB "
        f"(weights {e.weight_bytes / 1e6:.2f}, KV {e.kv_bytes / 1e6:.2f})",
        *(f"    {cat:14s} {b / 1e6:12.3f} MB" for cat, b in e.reads.items()),
        f"  FLOPs per token  {e.flops / 1e9:12.3f} GFLOP "
        f"({e.flops / e.bytes_per_token:.2f} FLOP/byte)",
    ]
    if pred and device:
        lines += [
            f"  device           {device.title}: {device.bandwidth / 1e9:g} GB/s, "
            f"{(pred.peak_flops or 0) / 1e12:g} TFLOPS  [{device.source}]",
            f"  speed of light   {pred.ms_per_token:.3f} ms/token ({pred.tokens_per_s:.1f} tok/s), "
            f"{pred.bound}-bound "
            f"(memory {pred.memory_ms:.3f} ms, compute {pred.compute_ms:.3f} ms)",
        ]
    return "\n".join(lines)


def cmd_probe(args: argparse.Namespace) -> int:
    from .api import default_threads

    probe = probe_for(args.threads or default_threads(), refresh=args.refresh)
    print(
        json.dumps(probe.__dict__, default=lambda o: o.__dict__, indent=1)
        if args.json
        else probe_report(probe)
    )
    return 0


def parse_depths(text: str) -> tuple[int, ...]:
    try:
        depths = tuple(int(d) for d in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from None
    if not depths or min(depths) < 0:
        raise argparse.ArgumentTypeError(f"depths must be >= 0, got {text!r}")
    return depths


def cmd_bench(args: argparse.Namespace) -> int:
    from bench import report
    from bench.runner import Formats, Settings, run

    from .api import choose_backend, default_threads, load, set_threads, start_kernels
    from .benchmark import SYNTHETIC, BenchDecoder, formats, shape_of, synthetic_model

    threads = set_threads(args.threads)
    device = device_of(args)
    if args.model.startswith(SYNTHETIC):
        model = synthetic_model(args.model, args.weights, args.head, choose_backend(args.kernels))
        kernels = start_kernels(model, threads)
        name = model.name
    else:
        llm = load(args.model, weights=args.weights, head=args.head, threads=threads,
                   kernels=args.kernels, progress=True)  # fmt: skip
        model, name, kernels = llm.model, llm.path.name, llm.kernels
    weights, head, embed = formats(model.weights)
    shape = shape_of(model.config, name)
    window = args.window if args.window is not None else model.config.sliding_window
    s = Settings(
        args.prompt, args.n_predict, args.depth, args.reps, window=window, profile=args.profile
    )
    probe = probe_for(threads or default_threads())
    dec = BenchDecoder(model, args.kv, args.window, capacity=args.prompt + args.n_predict + 1)
    f = Formats(weights, head, embed, args.kv, model.backend.name, kernels)
    rows = run(dec, shape, f, s, probe, device)
    if args.json:
        print(report.json_text(rows, {"threads": threads, "machine": probe.machine}))
    elif args.csv:
        print(report.csv_text(rows), end="")
    elif args.md:
        print(report.markdown(rows))
    else:
        print(report.text_table(rows))
    if args.profile and not args.json:
        for r in rows:
            print("\n" + report.profile_table(r))
    if args.plot:
        report.plot(rows, args.plot, title=f"{name}, {threads} threads")
        print(f"llama-np: wrote {args.plot}", file=sys.stderr)
    return 0


def add_commands(sub: argparse._SubParsersAction, model_args: list, add: Callable) -> None:
    from .cli import KERNELS_ARG, KV_ARG, positive_int

    so = sub.add_parser("sol", help="speed-of-light prediction for a config and a device")
    so.add_argument(
        "--config",
        help="a preset (e.g. llama-2-7b, smollm2-135m), a config.json or a checkpoint directory",
    )
    so.add_argument(
        "--weights",
        default="f32",
        choices=sorted(FORMATS),
        metavar="FMT",
        help="weight format (default: %(default)s)",
    )
    so.add_argument(
        "--head", choices=sorted(FORMATS), metavar="FMT", help="LM head format (default: --weights)"
    )
    add(so, [KV_ARG])
    so.add_argument(
        "--pos", type=int, default=0, help="position of the decoded token (default: %(default)s)"
    )
    so.add_argument("--window", type=positive_int, help="sliding window (default: the config's)")
    so.add_argument("--json", action="store_true", help="print one JSON object")
    so.add_argument(
        "--engine-layout",
        action="store_true",
        help="count bytes as llama-np holds matrices in memory (default: the formats' own sizes)",
    )
    add(so, [KERNELS_ARG])
    so.add_argument("--list-devices", action="store_true", help="print the device table and exit")
    add(so, DEVICE_ARGS)
    so.set_defaults(func=cmd_sol)

    pr = sub.add_parser("probe", help="attainable memory bandwidth of this machine, per cache tier")
    pr.add_argument("-t", "--threads", type=positive_int, help="BLAS threads (default: all cores)")
    pr.add_argument(
        "--refresh", action="store_true", help="measure again instead of using the cached result"
    )
    pr.add_argument("--json", action="store_true", help="print JSON")
    pr.set_defaults(func=cmd_probe)

    b = sub.add_parser(
        "bench", help="decode ms/token, bytes/token and GB/s against the speed of light"
    )
    add(b, model_args)
    add(b, [KV_ARG])
    b.add_argument(
        "-p",
        "--prompt",
        type=positive_int,
        default=32,
        help="prefill tokens (default: %(default)s)",
    )
    b.add_argument(
        "-n",
        "--n-predict",
        type=positive_int,
        default=128,
        help="decode steps per repetition (default: %(default)s)",
    )
    b.add_argument(
        "--depth", type=parse_depths, default=(0,), help="comma-separated KV depths (default: 0)"
    )
    b.add_argument("--window", type=positive_int, help="sliding window (default: the model's)")
    b.add_argument(
        "-r",
        "--reps",
        type=positive_int,
        default=5,
        help="repetitions, interleaved across depths (default: %(default)s)",
    )
    fmt = b.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="JSON output")
    fmt.add_argument("--csv", action="store_true", help="CSV output")
    fmt.add_argument("--md", action="store_true", help="markdown table")
    b.add_argument(
        "--plot", metavar="FILE.png", help="plot ms/token vs depth and achieved vs attainable GB/s"
    )
    b.add_argument("--profile", action="store_true", help="time, bytes and GB/s per category")
    add(b, DEVICE_ARGS)
    b.set_defaults(func=cmd_bench)
