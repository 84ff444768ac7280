"""The commands that run a model: generate, chat, perplexity, quantize, serve, pull, list.
Generated text goes to stdout; measurements and errors go to stderr."""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from llama_np.cli.measure import device_of
from llama_np.errors import UsageError

if TYPE_CHECKING:  # the CLI imports the heavy modules only when a command runs
    from llama_np.api import LLM
    from llama_np.generation.batch import BatchStats
    from llama_np.generation.generate import Stats


def sampling(args: argparse.Namespace) -> dict[str, Any]:
    keys = ("temp", "top_k", "top_p", "min_p", "repeat_penalty", "repeat_last_n", "seed")
    return {k: getattr(args, k) for k in keys}


def read_text(path: str, what: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"cannot read the {what} {path}: {e}") from None


ESCAPES = {"n": "\n", "r": "\r", "t": "\t", "'": "'", '"': '"', "\\": "\\"}


def unescape(text: str) -> str:
    """llama.cpp's --escape: \\n, \\r, \\t, \\', \\", \\\\ and \\xHH (ASCII) become the
    characters they name; any other backslash stays as typed."""

    def one(m: re.Match) -> str:
        s = m.group(1)
        if s in ESCAPES:
            return ESCAPES[s]
        if len(s) == 3 and int(s[1:], 16) < 0x80:
            return chr(int(s[1:], 16))
        return m.group(0)

    return re.sub(r"\\(x[0-9A-Fa-f]{2}|.)", one, text, flags=re.DOTALL)


def escaped(args: argparse.Namespace) -> None:
    """-p and --stop as llama.cpp takes them: escapes processed unless --no-escape (a
    prompt file is read as it is)."""
    if args.escape:
        if getattr(args, "prompt", None) is not None:
            args.prompt = unescape(args.prompt)
        args.stop = [unescape(s) for s in args.stop]


def load_model(args: argparse.Namespace) -> LLM:
    from llama_np.api import load

    return load(args.model, weights=args.weights, head=args.head, threads=args.threads,
                kernels=args.kernels, progress=True, check_tensors=args.check_tensors)  # fmt: skip


SERVE_EXTRA = ("uvicorn", "starlette", "prometheus_client")


def cmd_serve(args: argparse.Namespace) -> int:
    if args.max_queue < 0:
        raise UsageError(f"--max-queue must be >= 0, got {args.max_queue}")
    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port must be 0..65535, got {args.port}")
    if args.max_n is not None and args.max_n > args.parallel:
        raise UsageError(f"--max-n {args.max_n} is more than the slots (-np {args.parallel})")
    try:
        from llama_np.serve.run import serve
    except ModuleNotFoundError as e:
        if e.name not in SERVE_EXTRA:
            raise
        raise UsageError(f"serve needs its extra ({e.name} is missing): "
                         "pip install 'llama-np[serve]'") from None  # fmt: skip
    return serve(args, lambda: load_model(args))


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
    greedy = args is not None and args.temp <= 0  # no seed: nothing was drawn at random
    parts.append(f"stop: {stats.stop_reason}" + ("" if greedy else f", seed {stats.seed}"))
    return "llama-np: " + " | ".join(parts)


def peak_shares(stats: Stats, args: argparse.Namespace | None) -> list[str]:
    """Achieved bandwidth as a share of this machine's attainable bandwidth (from a cached
    `llama-np probe`) and of a device's theoretical peak (--device / --peak-gbs)."""
    from bench.probe import load_probe, size_label
    from quant.host import usable_cores

    out = []
    probe = load_probe((args.threads if args else None) or usable_cores())
    if probe is None:
        out.append("% of attainable: run `llama-np probe` once")
    else:
        tier, bw = probe.attainable(int(stats.bytes_per_token))
        out.append(f"{100 * stats.gbs * 1e9 / bw:.0f}% of attainable ({bw / 1e9:.1f} GB/s at "
                   f"{size_label(stats.bytes_per_token)}, {tier})")  # fmt: skip
    device = device_of(args) if args is not None and hasattr(args, "device") else None
    if device is not None:
        out.append(f"{100 * stats.gbs * 1e9 / device.bandwidth:.1f}% of {device.name} peak")
    return out


def stream_out(pieces: Iterable[str]) -> None:
    """The text as it comes, ended by a newline once any was written (an error before the
    first piece leaves stdout empty)."""
    wrote = False
    try:
        for piece in pieces:
            sys.stdout.write(piece)
            sys.stdout.flush()
            wrote = True
    finally:
        if wrote:
            sys.stdout.write("\n")
            sys.stdout.flush()


def cmd_generate(args: argparse.Namespace) -> int:
    from llama_np.generation.chat import ChatSession
    from llama_np.generation.generate import Stats

    escaped(args)
    if args.prompts is not None or args.parallel > 1:
        return generate_many(args)
    if args.file is not None:
        prompt = read_text(args.file, "prompt file")
    elif args.prompt is not None:
        prompt = args.prompt
    else:
        raise UsageError("give a prompt with -p TEXT or -f FILE")
    with load_model(args) as llm:
        stats = Stats()
        if args.chat:
            chat = ChatSession(llm, args.system, args.ctx_size, args.window, args.kv,
                               stop=args.stop, **sampling(args))  # fmt: skip
            stream_out(chat.send(prompt, args.n_predict, stats))
        else:
            opts = dict(stop=args.stop, ctx=args.ctx_size, window=args.window, kv=args.kv)
            stream_out(llm.stream(prompt, args.n_predict, stats=stats, **opts, **sampling(args)))
        print(summary_line(stats, args, llm.kernels), file=sys.stderr)
    return 0


def generate_many(args: argparse.Namespace) -> int:
    """`generate -np N` (N completions of one prompt) or `--prompts FILE` (one per line):
    the sequences decoded together, each text under a header on stdout."""
    from llama_np.generation.batch import BatchStats

    if args.chat:
        raise UsageError("--chat takes one prompt: leave out -np and --prompts")
    if args.prompts is not None:
        if args.prompt is not None or args.file is not None:
            raise UsageError("give --prompts FILE or -p/-f, not both")
        prompts = [line for line in read_text(args.prompts, "prompts file").splitlines() if line]
        if not prompts:
            raise UsageError(f"{args.prompts} holds no prompt (one per line)")
        prompts = [p for p in prompts for _ in range(args.parallel)]
    elif args.file is not None or args.prompt is not None:
        one = read_text(args.file, "prompt file") if args.file is not None else args.prompt
        prompts = [one] * args.parallel
    else:
        raise UsageError("give a prompt with -p TEXT, -f FILE or --prompts FILE")
    with load_model(args) as llm:
        stats = BatchStats()
        seed = args.seed if args.seed is not None else int(np.random.SeedSequence().entropy % 2**31)
        opts = dict(stop=args.stop, ctx=args.ctx_size, window=args.window, kv=args.kv)
        texts = llm.generate_batch(prompts, args.n_predict, stats=stats, **opts,
                                   **(sampling(args) | {"seed": seed}))  # fmt: skip
        for i, (prompt, text) in enumerate(zip(prompts, texts, strict=True)):
            seeded = "" if args.temp <= 0 else f" (seed {seed + i})"
            print(f"=== sequence {i + 1}/{len(texts)}{seeded}: {prompt[:60]!r}")
            print(text)
        print(batch_summary(stats, None if args.temp <= 0 else seed, llm.kernels),
              file=sys.stderr)  # fmt: skip
    return 0


def batch_summary(stats: BatchStats, seed: int | None, kernels: str) -> str:
    """The batch's summary line; `seed` None when sampling was greedy."""
    reasons: dict[str, int] = {}
    for r in stats.stop_reasons:
        reasons[r] = reasons.get(r, 0) + 1
    stops = ", ".join(f"{k} {v}" for k, v in reasons.items())
    return (
        f"llama-np: {stats.sequences} sequences, prompts {stats.prompt_tokens} tokens, prefill "
        f"{stats.prompt_tokens / stats.prefill_s:.1f} tok/s | generated {stats.generated} "
        f"tokens in {stats.steps} steps, {stats.ms_per_step:.2f} ms/step, decode "
        f"{stats.tok_s:.1f} tok/s (all sequences) | {kernels} | stop: {stops}"
        + ("" if seed is None else f", seeds {seed}..{seed + stats.sequences - 1}")
    )


def cmd_chat(args: argparse.Namespace) -> int:
    from llama_np.generation.chat import ChatSession
    from llama_np.generation.generate import Stats

    escaped(args)
    with load_model(args) as llm:
        chat = ChatSession(llm, args.system, args.ctx_size, args.window, args.kv,
                           stop=args.stop, **sampling(args))  # fmt: skip
        print(
            f"llama-np chat with {llm.path.name}: type a message, Ctrl-D to leave", file=sys.stderr
        )
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
            stream_out(chat.send(line, args.n_predict, stats))
            if args.verbose:
                print(summary_line(stats, args, llm.kernels), file=sys.stderr)


def cmd_quantize(args: argparse.Namespace) -> int:
    from llama_np.io.hub import resolve_model
    from llama_np.io.quantize import quantize_checkpoint

    out = quantize_checkpoint(
        resolve_model(args.model), args.output, args.to, args.head, args.force
    )
    print(f"llama-np: wrote {out} ({args.to})", file=sys.stderr)
    return 0


def cmd_perplexity(args: argparse.Namespace) -> int:
    from llama_np.generation.perplexity import perplexity

    text = read_text(args.file, "text file")
    with load_model(args) as llm:
        r = perplexity(llm, text, args.ctx_size, args.kv, progress=True,
                       stepwise=args.stepwise, chunks=args.chunks)  # fmt: skip
        kernels = llm.kernels
    windows = r.evaluated // args.ctx_size
    how = "decode steps" if args.stepwise else "batched"
    print(
        f"perplexity {r.ppl:.4f} over {r.scored} scored tokens "
        f"({windows} windows of {args.ctx_size}, {how}), {r.tokens_per_s:.1f} tok/s | {kernels}"
    )
    return 0


def cmd_pull(args: argparse.Namespace) -> int:
    from llama_np.io.hub import pull

    print(pull(args.alias, force=args.force))
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    from llama_np.io.hub import list_models
    from quant.host import cache_dir

    print(f"cache: {cache_dir()}")
    for alias, description, where in list_models():
        print(f"{alias:16s} {description}\n{'':16s} {where}")
    return 0
