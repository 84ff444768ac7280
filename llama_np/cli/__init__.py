"""`llama-np`: parse flags, call the library, print. Exit status: 0 done, 1 bad data,
2 bad usage, 130 interrupted.

    flags.py      every flag of every command
    commands.py   generate, chat, perplexity, quantize, serve, pull, list
    measure.py    sol, probe, bench
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from llama_np.cli import commands, measure
from llama_np.cli.flags import (
    BENCH_ARGS,
    BENCH_OUTPUT,
    CHAT_COMMAND_ARGS,
    GENERATE_ARGS,
    PERPLEXITY_ARGS,
    PROBE_ARGS,
    PULL_ARGS,
    QUANTIZE_ARGS,
    SERVE_ARGS,
    SOL_ARGS,
    Parser,
    Spec,
    add,
)  # fmt: skip
from llama_np.errors import ERRORS

COMMANDS: list[tuple[str, str, list[Spec], Callable, dict]] = [
    ("generate", "generate text from a prompt", GENERATE_ARGS, commands.cmd_generate, {}),
    ("chat", "talk with the model (multi-turn, the KV cache is kept)", CHAT_COMMAND_ARGS,
     commands.cmd_chat, {"n_predict": 512}),
    ("quantize", "write a checkpoint in another weight format", QUANTIZE_ARGS,
     commands.cmd_quantize, {}),
    ("perplexity", "teacher-forced perplexity of a text", PERPLEXITY_ARGS,
     commands.cmd_perplexity, {}),
    ("serve", "an OpenAI-compatible HTTP server, continuous batching", SERVE_ARGS,
     commands.cmd_serve, {}),
    ("pull", "download a model alias into the cache", PULL_ARGS, commands.cmd_pull, {}),
    ("list", "model aliases and what is cached", [], commands.cmd_list, {}),
    ("sol", "speed-of-light prediction for a config and a device", SOL_ARGS, measure.cmd_sol, {}),
    ("probe", "attainable memory bandwidth of this machine, per cache tier", PROBE_ARGS,
     measure.cmd_probe, {}),
    ("bench", "decode ms/token, bytes/token and GB/s against the speed of light", BENCH_ARGS,
     measure.cmd_bench, {}),
]  # fmt: skip


class Version(argparse.Action):
    """--version: the version and the commit it was built from (asked only when printed)."""

    def __init__(self, option_strings, dest, **kwargs) -> None:
        super().__init__(option_strings, dest, nargs=0, help="print the version and exit")

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        from bench.stamp import commit, version

        print(f"llama-np {version()} (commit {commit()})")
        parser.exit(0)


def build_parser() -> Parser:
    parser = Parser(prog="llama-np", description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", action=Version)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for name, help_text, specs, func, defaults in COMMANDS:
        p = sub.add_parser(name, help=help_text)
        add(p, specs)
        if name == "bench":
            add(p.add_mutually_exclusive_group(), BENCH_OUTPUT)  # type: ignore[arg-type]
        p.set_defaults(func=func, **defaults)
    return parser


def llama_cpp_habits(args: argparse.Namespace) -> None:
    """Flags a llama.cpp user brings: -ngl is taken and ignored with a note (llama-np runs
    on the CPU); more threads than this process may use are cut, and said."""
    from quant.host import usable_cores

    if getattr(args, "gpu_layers", None) is not None:
        print(f"llama-np: note: -ngl {args.gpu_layers} ignored: llama.cpp's GPU offload; "
              "llama-np runs on the CPU", file=sys.stderr)  # fmt: skip
    cores = usable_cores()
    if getattr(args, "threads", None) is not None and args.threads > cores:
        print(f"llama-np: note: -t {args.threads}: this process may use {cores} "
              f"core{'s' if cores > 1 else ''}; "
              f"running {cores}", file=sys.stderr)  # fmt: skip
        args.threads = cores


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        llama_cpp_habits(args)
        return args.func(args)
    except KeyboardInterrupt:
        sys.stdout.flush()
        print("\nllama-np: interrupted", file=sys.stderr)
        return 130
    except ERRORS as e:
        print(f"llama-np: error: {e}", file=sys.stderr)
        return getattr(e, "exit_code", 1)
