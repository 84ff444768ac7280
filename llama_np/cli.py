"""`llama-np`: parse flags, call the library, print. Generated text goes to stdout;
measurements and errors go to stderr. Exit status: 0 done, 1 bad data, 2 bad usage,
130 interrupted."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NoReturn

from quant import QuantError

from .errors import LlamaNpError, UsageError

Command = Callable[[argparse.Namespace], int]


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


def finite_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("-m", "--model", required=True, help="checkpoint directory or .gguf file")
    p.add_argument(
        "--weights", metavar="FMT", help="convert the weights to FMT at load (default: as stored)"
    )
    p.add_argument("--head", metavar="FMT", help="format of the LM head (default: as --weights)")
    p.add_argument(
        "-t", "--threads", type=positive_int, help="threads for the kernels (default: all cores)"
    )


def add_sampling_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "-n",
        "--n-predict",
        type=positive_int,
        default=128,
        help="tokens to generate (default: %(default)s)",
    )
    p.add_argument(
        "--temp",
        type=finite_float,
        default=0.8,
        help="temperature, 0 for greedy (default: %(default)s)",
    )
    p.add_argument(
        "--top-k",
        type=int,
        default=40,
        help="keep the k most likely tokens, 0 = off (default: %(default)s)",
    )
    p.add_argument(
        "--top-p",
        type=finite_float,
        default=0.95,
        help="nucleus: keep the smallest set with this mass, 1 = off (default: %(default)s)",
    )
    p.add_argument(
        "--min-p",
        type=finite_float,
        default=0.05,
        help="drop tokens below min-p x the top probability, 0 = off (default: %(default)s)",
    )
    p.add_argument(
        "--repeat-penalty",
        type=finite_float,
        default=1.0,
        help="penalize recent tokens, 1 = off (default: %(default)s)",
    )
    p.add_argument(
        "--repeat-last-n",
        type=int,
        default=64,
        help="how many recent tokens the penalty sees (default: %(default)s)",
    )
    p.add_argument(
        "--seed",
        type=int,
        default=None,
        help="random seed (default: a fresh one, printed in the summary)",
    )
    p.add_argument(
        "--stop",
        action="append",
        default=[],
        metavar="TEXT",
        help="stop when TEXT is generated; repeatable",
    )
    p.add_argument(
        "-c",
        "--ctx-size",
        type=positive_int,
        default=None,
        help="context size in tokens (default: the model's)",
    )
    p.add_argument(
        "--window",
        type=positive_int,
        default=None,
        help="sliding attention window W, on any model (default: the model's, if any)",
    )
    p.add_argument(
        "--kv", default="f32", metavar="FMT", help="KV cache format (default: %(default)s)"
    )


def sampling_settings(args: argparse.Namespace):
    from .sampling import SamplerSettings

    return SamplerSettings(
        temp=args.temp, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
        repeat_penalty=args.repeat_penalty, repeat_last_n=args.repeat_last_n, seed=args.seed,
    )  # fmt: skip


def read_prompt(args: argparse.Namespace) -> str:
    if args.file is not None:
        try:
            return Path(args.file).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise UsageError(f"cannot read the prompt file {args.file}: {e}") from None
    if args.prompt is None:
        raise UsageError("give a prompt with -p TEXT or -f FILE")
    return args.prompt


def summary_line(stats) -> str:
    parts = [f"prompt {stats.prompt_tokens} tokens, prefill {stats.prefill_tok_s:.1f} tok/s"]
    if stats.decode_steps:
        parts.append(
            f"generated {len(stats.generated)} tokens, decode {stats.decode_ms:.2f} ms/token "
            f"({1e3 / stats.decode_ms:.1f} tok/s)"
        )
        parts.append(f"{stats.bytes_per_token / 1e6:.1f} MB/token, {stats.gbs:.1f} GB/s")
    else:
        parts.append(f"generated {len(stats.generated)} tokens")
    parts.append(f"stop: {stats.stop_reason}, seed {stats.seed}")
    return "llama-np: " + " | ".join(parts)


def cmd_generate(args: argparse.Namespace) -> int:
    from .api import load
    from .generate import Stats

    prompt = read_prompt(args)
    settings = sampling_settings(args)
    llm = load(
        args.model, weights=args.weights, head=args.head, threads=args.threads, progress=True
    )
    stats = Stats()
    out = sys.stdout
    try:
        for piece in llm.stream(
            prompt, args.n_predict, stop=args.stop, ctx=args.ctx_size, window=args.window,
            kv=args.kv, stats=stats, **vars(settings),
        ):  # fmt: skip
            out.write(piece)
            out.flush()
    finally:
        out.write("\n")
        out.flush()
    print(summary_line(stats), file=sys.stderr)
    return 0


def cmd_quantize(args: argparse.Namespace) -> int:
    from .api import set_threads
    from .quantize import quantize_checkpoint

    set_threads(args.threads)
    out = quantize_checkpoint(args.model, args.output, args.to, args.head, args.force)
    print(f"llama-np: wrote {out} ({args.to})", file=sys.stderr)
    return 0


def cmd_perplexity(args: argparse.Namespace) -> int:
    from .api import load
    from .perplexity import perplexity

    try:
        text = Path(args.file).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"cannot read the text file {args.file}: {e}") from None
    llm = load(
        args.model, weights=args.weights, head=args.head, threads=args.threads, progress=True
    )
    r = perplexity(llm, text, args.ctx_size, args.kv, progress=True)
    print(
        f"perplexity {r.ppl:.4f} over {r.scored} scored tokens "
        f"({r.evaluated // args.ctx_size} windows of {args.ctx_size}), {r.tokens_per_s:.1f} tok/s"
    )
    return 0


def build_parser() -> Parser:
    parser = Parser(prog="llama-np", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    g = sub.add_parser("generate", help="generate text from a prompt")
    add_model_args(g)
    g.add_argument("-p", "--prompt", help="the prompt text")
    g.add_argument("-f", "--file", help="read the prompt from this file")
    add_sampling_args(g)
    g.set_defaults(func=cmd_generate)

    q = sub.add_parser("quantize", help="write a checkpoint in another weight format")
    q.add_argument("-m", "--model", required=True, help="input checkpoint directory or .gguf file")
    q.add_argument(
        "--to", required=True, metavar="FMT", help="weight format: q8_0, q4_0, q4_1, f32, f16, bf16"
    )
    q.add_argument("-o", "--output", required=True, help="output directory (must not exist)")
    q.add_argument("--head", metavar="FMT", help="format of the LM head (default: as --to)")
    q.add_argument("--force", action="store_true", help="replace OUT if it exists")
    q.add_argument("-t", "--threads", type=positive_int, help="threads (default: all cores)")
    q.set_defaults(func=cmd_quantize)

    p = sub.add_parser("perplexity", help="teacher-forced perplexity of a text")
    add_model_args(p)
    p.add_argument("-f", "--file", required=True, help="the text file")
    p.add_argument(
        "-c",
        "--ctx-size",
        type=positive_int,
        default=256,
        help="window size in tokens (default: %(default)s)",
    )
    p.add_argument(
        "--kv", default="f32", metavar="FMT", help="KV cache format (default: %(default)s)"
    )
    p.set_defaults(func=cmd_perplexity)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except KeyboardInterrupt:
        sys.stdout.flush()
        print("\nllama-np: interrupted", file=sys.stderr)
        return 130
    except (LlamaNpError, QuantError) as e:
        print(f"llama-np: error: {e}", file=sys.stderr)
        return getattr(e, "exit_code", 1)
