"""`llama-np`: parse flags, call the library, print. Generated text goes to stdout;
measurements and errors go to stderr. Exit status: 0 done, 1 bad data, 2 bad usage,
130 interrupted."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from quant import TARGETS, QuantError
from quant.backends import KERNELS
from quant.kv import KV_FORMATS

from .cli_bench import DEVICE_ARGS
from .errors import LlamaNpError, UsageError
from .hub import DEFAULT_MODEL

if TYPE_CHECKING:  # the CLI imports the heavy modules only when a command runs
    from .api import LLM
    from .generate import Stats


class Parser(argparse.ArgumentParser):
    """argparse with a one-line error and exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


MAX_PREDICT = 10_000_000


def n_predict(text: str) -> int:
    value = positive_int(text)
    if value > MAX_PREDICT:
        raise argparse.ArgumentTypeError(f"at most {MAX_PREDICT:,} tokens, got {value:,}")
    return value


def finite_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if value != value or abs(value) == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


WEIGHT_FORMATS = TARGETS
KV_FORMAT_NAMES = sorted(KV_FORMATS)

# fmt: off
KV_ARG = (("--kv",), dict(default="f32", choices=KV_FORMAT_NAMES, metavar="FMT", help=f"KV cache format: {' '.join(KV_FORMAT_NAMES)} (default: %(default)s)"))
KERNELS_ARG = (("--kernels",), dict(default="auto", choices=KERNELS, help="kernel backend: compiled (numba, pip install 'llama-np[fast]'), NumPy, or auto = numba when installed (default: %(default)s)"))
MODEL_ARGS = [
    (("-m", "--model"), dict(default=DEFAULT_MODEL, help="checkpoint directory, .gguf file or alias (default: %(default)s)")),
    (("--weights",), dict(choices=WEIGHT_FORMATS, metavar="FMT", help=f"convert the weights to FMT at load: {' '.join(WEIGHT_FORMATS)} (default: as stored)")),
    (("--head",), dict(choices=WEIGHT_FORMATS, metavar="FMT", help="format of the LM head (default: as --weights)")),
    (("-t", "--threads"), dict(type=positive_int, help="threads for the kernels (default: all cores)")),
    KERNELS_ARG,
]
SAMPLING_ARGS = [
    (("-n", "--n-predict"), dict(type=n_predict, default=128, help="tokens to generate (default: %(default)s)")),
    (("--temp",), dict(type=finite_float, default=0.8, help="temperature, 0 for greedy (default: %(default)s)")),
    (("--top-k",), dict(type=int, default=40, help="keep the k most likely tokens, 0 = off (default: %(default)s)")),
    (("--top-p",), dict(type=finite_float, default=0.95, help="keep the smallest set with this probability mass, 1 = off (default: %(default)s)")),
    (("--min-p",), dict(type=finite_float, default=0.05, help="drop tokens below min-p x the top probability, 0 = off (default: %(default)s)")),
    (("--repeat-penalty",), dict(type=finite_float, default=1.0, help="penalize recent tokens, 1 = off (default: %(default)s)")),
    (("--repeat-last-n",), dict(type=int, default=64, help="how many recent tokens the penalty sees (default: %(default)s)")),
    (("--seed",), dict(type=int, default=None, help="random seed (default: a fresh one, printed in the summary)")),
    (("-c", "--ctx-size"), dict(type=positive_int, default=None, help="context size in tokens (default: the model's)")),
    (("--window",), dict(type=positive_int, default=None, help="sliding attention window on any model (default: the model's, if any)")),
    KV_ARG,
]
CHAT_ARGS = [
    (("--system",), dict(default=None, help="system prompt (default: the template's own, if any)")),
]
# fmt: on


def add(p: argparse.ArgumentParser, specs: list[tuple[tuple[str, ...], dict[str, Any]]]) -> None:
    for flags, kwargs in specs:
        p.add_argument(*flags, **kwargs)


def sampling(args: argparse.Namespace) -> dict[str, Any]:
    keys = ("temp", "top_k", "top_p", "min_p", "repeat_penalty", "repeat_last_n", "seed")
    return {k: getattr(args, k) for k in keys}


def read_text(path: str, what: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"cannot read the {what} {path}: {e}") from None


def load_model(args: argparse.Namespace) -> LLM:
    from .api import load

    return load(
        args.model,
        weights=args.weights,
        head=args.head,
        threads=args.threads,
        kernels=args.kernels,
        progress=True,
    )


def summary_line(stats: Stats, args: argparse.Namespace | None = None, kernels: str = "") -> str:
    parts = [f"prompt {stats.prompt_tokens} tokens, prefill {stats.prefill_tok_s:.1f} tok/s"]
    if stats.decode_steps:
        parts.append(
            f"generated {len(stats.generated)} tokens, decode {stats.decode_ms:.2f} ms/token "
            f"({1e3 / stats.decode_ms:.1f} tok/s)"
        )
        parts.append(f"{stats.bytes_per_token / 1e6:.1f} MB/token, {stats.gbs:.1f} GB/s")
        parts += peak_shares(stats, args)
    else:
        parts.append(f"generated {len(stats.generated)} tokens")
    if kernels:
        parts.append(kernels)
    parts.append(f"stop: {stats.stop_reason}, seed {stats.seed}")
    return "llama-np: " + " | ".join(parts)


def peak_shares(stats: Stats, args: argparse.Namespace | None) -> list[str]:
    """Achieved bandwidth as a share of this machine's attainable bandwidth (from a cached
    `llama-np probe`) and of a device's theoretical peak (--device / --peak-gbs)."""
    from bench.probe import load_probe

    from .api import default_threads
    from .cli_bench import device_of

    out = []
    probe = load_probe((args.threads if args else None) or default_threads())
    if probe is None:
        out.append("% of attainable: run `llama-np probe` once")
    else:
        tier, bw = probe.attainable(int(stats.bytes_per_token))
        out.append(f"{100 * stats.gbs * 1e9 / bw:.0f}% of attainable {tier} ({bw / 1e9:.1f} GB/s)")
    device = device_of(args) if args is not None and hasattr(args, "device") else None
    if device is not None:
        out.append(f"{100 * stats.gbs * 1e9 / device.bandwidth:.1f}% of {device.name} peak")
    return out


def stream_out(pieces: Iterable[str]) -> None:
    try:
        for piece in pieces:
            sys.stdout.write(piece)
            sys.stdout.flush()
    finally:
        sys.stdout.write("\n")
        sys.stdout.flush()


def cmd_generate(args: argparse.Namespace) -> int:
    from .generate import Stats

    if args.file is not None:
        prompt = read_text(args.file, "prompt file")
    elif args.prompt is not None:
        prompt = args.prompt
    else:
        raise UsageError("give a prompt with -p TEXT or -f FILE")
    llm = load_model(args)
    stats = Stats()
    if args.chat:
        from .chat import ChatSession

        session = ChatSession(
            llm, args.system, args.ctx_size, args.window, args.kv, **sampling(args)
        )
        stream_out(session.send(prompt, args.n_predict, stats))
    else:
        opts = dict(stop=args.stop, ctx=args.ctx_size, window=args.window, kv=args.kv, stats=stats)
        stream_out(llm.stream(prompt, args.n_predict, **opts, **sampling(args)))
    print(summary_line(stats, args, llm.kernels), file=sys.stderr)
    return 0


def cmd_chat(args: argparse.Namespace) -> int:
    from .chat import ChatSession
    from .generate import Stats

    llm = load_model(args)
    session = ChatSession(llm, args.system, args.ctx_size, args.window, args.kv, **sampling(args))
    print(f"llama-np chat with {llm.path.name}: type a message, Ctrl-D to leave", file=sys.stderr)
    while True:
        try:
            sys.stderr.write("> ")  # the prompt is not output: stdout carries only replies
            sys.stderr.flush()
            line = input()
        except EOFError:
            print(file=sys.stderr)
            return 0
        if not line.strip():
            continue
        stats = Stats()
        stream_out(session.send(line, args.n_predict, stats))
        if args.verbose:
            print(summary_line(stats, args, llm.kernels), file=sys.stderr)


def cmd_quantize(args: argparse.Namespace) -> int:
    from .api import set_threads
    from .hub import resolve_model
    from .quantize import quantize_checkpoint

    set_threads(args.threads)
    out = quantize_checkpoint(
        resolve_model(args.model), args.output, args.to, args.head, args.force
    )
    print(f"llama-np: wrote {out} ({args.to})", file=sys.stderr)
    return 0


def cmd_perplexity(args: argparse.Namespace) -> int:
    from .perplexity import perplexity

    text = read_text(args.file, "text file")
    llm = load_model(args)
    r = perplexity(llm, text, args.ctx_size, args.kv, progress=True)
    windows = r.evaluated // args.ctx_size
    print(
        f"perplexity {r.ppl:.4f} over {r.scored} scored tokens "
        f"({windows} windows of {args.ctx_size}), {r.tokens_per_s:.1f} tok/s"
    )
    return 0


def cmd_pull(args: argparse.Namespace) -> int:
    from .hub import pull

    path = pull(args.alias, force=args.force)
    print(path)
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    from .hub import cache_dir, list_models

    print(f"cache: {cache_dir()}")
    for alias, description, where in list_models():
        print(f"{alias:16s} {description}\n{'':16s} {where}")
    return 0


def build_parser() -> Parser:
    parser = Parser(prog="llama-np", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)

    g = sub.add_parser("generate", help="generate text from a prompt")
    add(g, MODEL_ARGS)
    g.add_argument("-p", "--prompt", help="the prompt text")
    g.add_argument("-f", "--file", help="read the prompt from this file")
    add(g, SAMPLING_ARGS)
    g.add_argument(
        "--stop",
        action="append",
        default=[],
        metavar="TEXT",
        help="stop when TEXT is generated; repeatable",
    )
    g.add_argument(
        "--chat", action="store_true", help="wrap the prompt in the model's chat template"
    )
    add(g, CHAT_ARGS)
    add(g, DEVICE_ARGS)
    g.set_defaults(func=cmd_generate)

    c = sub.add_parser("chat", help="talk with the model (multi-turn, the KV cache is kept)")
    add(c, MODEL_ARGS)
    add(c, SAMPLING_ARGS)
    add(c, CHAT_ARGS)
    c.add_argument(
        "-v", "--verbose", action="store_true", help="print a summary line after each reply"
    )
    c.set_defaults(func=cmd_chat, n_predict=512)

    q = sub.add_parser("quantize", help="write a checkpoint in another weight format")
    q.add_argument(
        "-m", "--model", required=True, help="input checkpoint directory, .gguf file or alias"
    )
    q.add_argument(
        "--to",
        required=True,
        choices=WEIGHT_FORMATS,
        metavar="FMT",
        help=f"weight format: {' '.join(WEIGHT_FORMATS)}",
    )
    q.add_argument("-o", "--output", required=True, help="output directory (must not exist)")
    q.add_argument(
        "--head",
        choices=WEIGHT_FORMATS,
        metavar="FMT",
        help="format of the LM head (default: as --to)",
    )
    q.add_argument("--force", action="store_true", help="replace OUT if it exists")
    q.add_argument("-t", "--threads", type=positive_int, help="threads (default: all cores)")
    q.set_defaults(func=cmd_quantize)

    p = sub.add_parser("perplexity", help="teacher-forced perplexity of a text")
    add(p, MODEL_ARGS)
    p.add_argument("-f", "--file", required=True, help="the text file")
    p.add_argument(
        "-c",
        "--ctx-size",
        type=positive_int,
        default=256,
        help="window size in tokens (default: %(default)s)",
    )
    add(p, [KV_ARG])
    p.set_defaults(func=cmd_perplexity)

    pl = sub.add_parser("pull", help="download a model alias into the cache")
    pl.add_argument(
        "alias", nargs="?", default=DEFAULT_MODEL, help="model alias (default: %(default)s)"
    )
    pl.add_argument("--force", action="store_true", help="download again even if cached")
    pl.set_defaults(func=cmd_pull)

    ls = sub.add_parser("list", help="model aliases and what is cached")
    ls.set_defaults(func=cmd_list)

    from .cli_bench import add_commands

    add_commands(sub, MODEL_ARGS, add)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except KeyboardInterrupt:
        sys.stdout.flush()
        print("\nllama-np: interrupted", file=sys.stderr)
        return 130
    except (LlamaNpError, QuantError, ImportError) as e:
        print(f"llama-np: error: {e}", file=sys.stderr)
        return getattr(e, "exit_code", 1)
