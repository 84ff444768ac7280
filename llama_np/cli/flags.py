"""Every flag of every command, in one place: their specs (argparse's arguments), the
types that check them, and the parser that turns a bad one into one line and exit 2."""

from __future__ import annotations

import argparse
from typing import Any, NoReturn

from llama_np.io.hub import DEFAULT_MODEL
from quant import FORMATS, TARGETS
from quant.backends import DEFAULT_DOT, KERNELS
from quant.kv import KV_FORMATS

Spec = tuple[tuple[str, ...], dict[str, Any]]
MAX_PREDICT = 10_000_000


class Parser(argparse.ArgumentParser):
    """argparse with a one-line error and exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def add(p: argparse.ArgumentParser, specs: list[Spec]) -> None:
    for flags, kwargs in specs:
        p.add_argument(*flags, **kwargs)


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


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


def positive_float(text: str) -> float:
    value = finite_float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text!r}")
    return value


def depths(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(d) for d in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from None
    if not values or min(values) < 0:
        raise argparse.ArgumentTypeError(f"depths must be >= 0, got {text!r}")
    return values


def batches(text: str) -> tuple[int, ...]:
    values = depths(text)
    if min(values) < 1 or max(values) > 4096:
        raise argparse.ArgumentTypeError(f"batch sizes must be 1..4096, got {text!r}")
    return values


KV = sorted(KV_FORMATS)

# fmt: off
KV_ARG = (("--kv",), dict(default="f32", choices=KV, metavar="FMT", help=f"KV cache format of the attention layers: {' '.join(KV)}; a hybrid's recurrent layers (gated delta net, short convolution) keep their state in float32 whatever this says (default: %(default)s)"))
KERNELS_ARG = (("--kernels",), dict(default="auto", choices=KERNELS, help="kernel backend: compiled (numba, pip install 'llama-np[fast]'), NumPy, or auto = numba when installed; numba-int16 / numba-int8 / numba-f32: the compiled decode products of every quantized format with x rounded per block of 32 to int16 (two int8 halves), to int8 (as llama.cpp), or in float32 (numba: " + DEFAULT_DOT + ") (default: %(default)s)"))
THREADS_ARG = (("-t", "--threads"), dict(type=positive_int, help="threads for the kernels (default: all cores)"))
WINDOW_ARG = (("--window",), dict(type=positive_int, default=None, help="sliding attention window on any model (default: the model's, if any)"))
MODEL_ARGS = [
    (("-m", "--model"), dict(default=DEFAULT_MODEL, help="checkpoint directory, .gguf file, alias, or hf:ORG/REPO[:QUANT] (a Hugging Face repository, downloaded into its cache) (default: %(default)s)")),
    (("--weights",), dict(choices=TARGETS, metavar="FMT", help=f"convert the weights to FMT at load: {' '.join(TARGETS)} (default: as stored)")),
    (("--head",), dict(choices=TARGETS, metavar="FMT", help="format of the LM head (default: as --weights)")),
    THREADS_ARG,
    KERNELS_ARG,
    (("--check-tensors",), dict(action="store_true", help="check every tensor's values and block scales for NaN or infinity at load")),
    (("-ngl", "--gpu-layers", "--n-gpu-layers"), dict(metavar="N", help="llama.cpp's GPU offload: taken and ignored with a note (llama-np runs on the CPU)")),
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
    (("-c", "--ctx-size"), dict(type=positive_int, default=None, help="context size in tokens (default: generate, the prompt and -n; chat, the model's; at most the model's)")),
    WINDOW_ARG,
    KV_ARG,
]
STOP_ARG = (("--stop",), dict(action="append", default=[], metavar="TEXT", help="stop when TEXT is generated; repeatable"))
ESCAPE_ARG = (("-e", "--escape"), dict(action=argparse.BooleanOptionalAction, default=True, help="turn the escapes \\n, \\r, \\t, \\', \\\", \\\\ and \\xHH of -p and --stop into characters, as llama.cpp does (default: on; --no-escape keeps them as typed)"))
CHAT_ARGS = [(("--system",), dict(default=None, help="system prompt (default: the template's own, if any)"))]
DEVICE_ARGS = [
    (("--device",), dict(help="device from the table (`llama-np sol --list-devices`); sol takes `local` too: this machine as `llama-np probe` measured it")),
    (("--peak-gbs",), dict(type=float, help="peak memory bandwidth, GB/s (overrides --device)")),
    (("--peak-gflops",), dict(type=float, help="peak GFLOPS (overrides --device)")),
    (("--devices",), dict(action="append", default=[], metavar="FILE", help="extra device table (JSON, as bench/devices.json: name, bandwidth in bytes/s, flops {\"fp16\", \"fp32\", \"int8\"} per second)")),
]
GENERATE_ARGS = [
    *MODEL_ARGS,
    (("-p", "--prompt"), dict(help="the prompt text")),
    (("-f", "--file"), dict(help="read the prompt from this file")),
    *SAMPLING_ARGS,
    STOP_ARG,
    ESCAPE_ARG,
    (("--chat",), dict(action="store_true", help="wrap the prompt in the model's chat template")),
    (("-np", "--parallel"), dict(type=positive_int, default=1, help="N sequences from each prompt, decoded together (a shared prompt is prefilled once); sequence i samples with --seed + i (default: %(default)s)")),
    (("--prompts",), dict(metavar="FILE", help="one prompt per line, the sequences decoded together")),
    *CHAT_ARGS,
    *DEVICE_ARGS,
]
CHAT_COMMAND_ARGS = [
    *MODEL_ARGS, *SAMPLING_ARGS, *CHAT_ARGS, STOP_ARG, ESCAPE_ARG,
    (("-v", "--verbose"), dict(action="store_true", help="print a summary line after each reply")),
]
QUANTIZE_ARGS = [
    (("-m", "--model"), dict(required=True, help="input checkpoint directory, .gguf file, alias or hf:ORG/REPO[:QUANT]")),
    (("--to",), dict(required=True, choices=TARGETS, metavar="FMT", help=f"weight format: {' '.join(TARGETS)}")),
    (("-o", "--output"), dict(required=True, help="output directory (must not exist)")),
    (("--head",), dict(choices=TARGETS, metavar="FMT", help="format of the LM head (default: as --to)")),
    (("--force",), dict(action="store_true", help="replace OUT if it exists")),
]
PERPLEXITY_ARGS = [
    *MODEL_ARGS,
    (("-f", "--file"), dict(required=True, help="the text file")),
    (("-c", "--ctx-size"), dict(type=positive_int, default=256, help="window size in tokens (default: %(default)s)")),
    KV_ARG,
    (("--stepwise",), dict(action="store_true", help="run each window token by token through decode steps, as generation does (what --kernels numba-int16 / numba-int8 change), not as one batched prefill")),
    (("--chunks",), dict(type=positive_int, help="score only the first N windows (default: all)")),
]
PULL_ARGS = [
    (("alias",), dict(nargs="?", default=DEFAULT_MODEL, help="model alias, or a Hugging Face repository hf:ORG/REPO[:QUANT] (its GGUF of that quantization, default Q4_K_M, or its safetensors checkpoint) (default: %(default)s)")),
    (("--force",), dict(action="store_true", help="download again even if cached")),
]
GGUF_MIXES = ["q4_k_m", "q4_k_s", "q5_k_m", "q5_k_s"]
SOL_ARGS = [
    (("--config",), dict(help="the model, as -m takes it: a `pull` alias, hf:ORG/REPO, a GGUF file or a checkpoint directory (counted in its own formats), a preset (e.g. llama-2-7b; synthetic:NAME too) or a config.json")),
    (("--weights",), dict(choices=sorted(FORMATS) + GGUF_MIXES, metavar="FMT", help=f"weight format: {' '.join(sorted(FORMATS))}, or llama.cpp's mixed file types {' '.join(GGUF_MIXES)} (each tensor's type as llama.cpp's quantizer picks it) (default: a file's own formats; f32 for a preset or a config.json)")),
    (("--head",), dict(choices=sorted(FORMATS), metavar="FMT", help="LM head format (default: --weights)")),
    KV_ARG,
    (("--pos",), dict(type=int, default=0, help="position of the decoded token; with --prompt, the tokens already in the cache (default: %(default)s)")),
    (("--prompt",), dict(type=positive_int, metavar="N", help="the prefill of an N-token prompt instead of a decode step: its bytes (weights once, the KV written and read), its FLOPs and the bound max(bytes / bandwidth, FLOPs / the device's matrix peak for the weights)")),
    (("--batch",), dict(type=positive_int, default=1, help="sequences decoded together, each at --pos (default: %(default)s)")),
    (("--window",), dict(type=positive_int, help="sliding window (default: the config's)")),
    (("--json",), dict(action="store_true", help="print one JSON object")),
    (("--engine-layout",), dict(action="store_true", help="count bytes as llama-np holds matrices in memory (default: the formats' own sizes)")),
    KERNELS_ARG,
    (("--list-devices",), dict(action="store_true", help="print the device table and exit")),
    (("--engine",), dict(default="llama.cpp", help="the engine whose published measurements calibrate the expected ms/token beside the bound (default: %(default)s)")),
    (("--published",), dict(action="store_true", help="hold every published measurement (bench/published) against its bound: the fraction reached by hardware class, engine and source, and the calibrated fit's error on held-out sources")),
    (("--prefill",), dict(action="store_true", help="with --published: the published prompt speeds (prefill) instead of decode's")),
    (("--batched",), dict(action="store_true", help="with --published: the published batched decode throughput (B sequences stepped together) instead of one sequence's")),
    (("--rows",), dict(action="store_true", help="with --published: every row too")),
    (("--plot",), dict(metavar="FILE.png", help="with --published: predicted against measured ms/token")),
    *DEVICE_ARGS,
    THREADS_ARG,
]
PROBE_ARGS = [
    (("-t", "--threads"), dict(type=positive_int, help="BLAS threads (default: all cores)")),
    (("--refresh",), dict(action="store_true", help="measure again instead of using the cached result")),
    (("--json",), dict(action="store_true", help="print JSON")),
]
def kernels_list(text: str) -> list[str]:
    """bench's --kernels: one choice or several, comma-separated."""
    values = text.split(",")
    for v in values:
        if v not in KERNELS:
            raise argparse.ArgumentTypeError(f"unknown kernels {v!r} (known: {', '.join(KERNELS)})")
    return values


BENCH_ARGS = [
    *[(names, kw | dict(choices=sorted(FORMATS) + (GGUF_MIXES if names[0] == "--weights" else []), help=kw["help"] + "; a synthetic model takes the K-quants too (random codes); with --endpoint, llama.cpp's mixed file types too")) if names[0] in ("--weights", "--head")
      else (names, kw | dict(type=kernels_list, default=["auto"], choices=None, help=kw["help"] + "; bench takes several, comma-separated (numpy,numba): their rows in one table")) if names[0] == "--kernels"
      else (names, kw) for names, kw in MODEL_ARGS],
    KV_ARG,
    (("-p", "--prompt", "--prompt-tokens"), dict(type=positive_int, default=32, help="prefill tokens; with --endpoint, words per prompt (about a token each) (default: %(default)s)")),
    (("-n", "--n-predict"), dict(type=positive_int, default=128, help="decode steps per repetition; with --endpoint, max_tokens of each request (default: %(default)s)")),
    (("--depth",), dict(type=depths, default=(0,), help="comma-separated KV depths (default: 0)")),
    (("--batch",), dict(type=batches, default=(), help="comma-separated batch sizes, e.g. 1,2,4,8: decode steps of B sequences at once, each with its own KV cache at --depth (default: one sequence, with prefill)")),
    (("--window",), dict(type=positive_int, help="sliding window (default: the model's)")),
    (("-r", "--reps"), dict(type=positive_int, default=5, help="repetitions, interleaved across depths (default: %(default)s)")),
    (("--plot",), dict(metavar="FILE.png", help="plot ms/token vs depth and achieved vs attainable GB/s")),
    (("--profile",), dict(action="store_true", help="time, bytes and GB/s per category")),
    (("--compare",), dict(nargs=2, metavar=("OLD.json", "NEW.json"), help="measure nothing: two runs of bench --json side by side, rows matched by model, weights, KV, depth, batch and threads, with the ratio, whether it is beyond the runs' spread, and which is nearer its speed of light")),
    (("--baseline",), dict(metavar="OLD.json", help="after this run, its rows side by side with an earlier run of bench --json (as --compare)")),
    (("--endpoint",), dict(metavar="URL", help="measure an OpenAI-compatible server instead (llama-np serve, llama.cpp's, vLLM), e.g. http://127.0.0.1:8080/v1: streaming completions at each --concurrency")),
    (("--concurrency",), dict(type=batches, default=(1, 4, 16), help="with --endpoint: comma-separated requests in flight at once (default: 1,4,16)")),
    (("--api-model",), dict(metavar="NAME", help="with --endpoint: the model name sent (default: the first of GET /v1/models)")),
    (("--api-key",), dict(metavar="KEY", help="with --endpoint: sent as 'Authorization: Bearer KEY' to a server that asks one (default: $LLAMA_NP_API_KEY)")),
    (("--config",), dict(help="with --endpoint: the served model for the speed of light: its GGUF file (shape and each tensor's type), a `pull` alias, a preset, a config.json or a checkpoint directory, with --weights (default: llama-np's server describes its own)")),
    *DEVICE_ARGS,
]
SERVE_ARGS = [
    *MODEL_ARGS,
    (("--host",), dict(default="127.0.0.1", help="address to listen on; 0.0.0.0 opens it to the network (default: %(default)s)")),
    (("--port",), dict(type=int, default=8080, help="TCP port (default: %(default)s)")),
    (("-np", "--parallel"), dict(type=positive_int, default=4, help="slots: sequences decoded together at most, each with its own KV cache (default: %(default)s)")),
    (("-c", "--ctx-size"), dict(type=positive_int, default=None, help="context of each slot in tokens (default: 2048, or the model's if smaller)")),
    WINDOW_ARG,
    KV_ARG,
    (("--chunk",), dict(type=positive_int, default=512, help="prompt tokens prefilled between two decode steps (default: %(default)s)")),
    (("--no-cache-prompt",), dict(dest="cache_prompt", action="store_false", help="prefill every prompt whole; by default a request keeps what its slot's cache holds of its prompt's beginning (llama-server's cache_prompt)")),
    (("--max-queue",), dict(type=int, default=64, help="requests that may wait for a slot; more get 503 and Retry-After (default: %(default)s)")),
    (("--shutdown-timeout",), dict(type=float, default=10.0, help="seconds running requests get to finish after SIGTERM or ^C before they are cancelled (default: %(default)s)")),
    (("--api-key",), dict(metavar="KEY", help="every /v1 route asks 'Authorization: Bearer KEY' (a missing or wrong key: 401); /health and /metrics stay open. Visible to `ps`: prefer $LLAMA_NP_API_KEY or --api-key-file (default: $LLAMA_NP_API_KEY, else no key)")),
    (("--api-key-file",), dict(metavar="PATH", help="more keys, one a line (blank lines and # comments skipped), each taken as --api-key")),
    (("--max-tokens-limit",), dict(type=positive_int, metavar="N", help="the largest max_tokens a request may ask; more is a 400 (default: the context, -c)")),
    (("--max-n",), dict(type=positive_int, metavar="N", help="the most choices (n) a request may ask; more is a 400 (default and at most: the slots, -np)")),
    (("--max-body-bytes",), dict(type=positive_int, default=4 << 20, metavar="N", help="the largest request body; more is a 413 (default: %(default)s, 4 MiB)")),
    (("--request-timeout",), dict(type=positive_float, default=30.0, metavar="S", help="seconds a client has to send a request whole, headers and body, from its connection or its first byte; then the connection is closed (default: %(default)s)")),
    (("--idle-timeout",), dict(type=positive_float, default=5.0, metavar="S", help="seconds a kept-alive connection may idle between requests (uvicorn's keep-alive timeout) (default: %(default)s)")),
    (("--alias",), dict(help="the model's name in the API (default: the model's own)")),
    (("-v", "--verbose"), dict(action="store_true", help="log each request (uvicorn's access log) and a failed request's traceback (default: one line per failure)")),
]
BENCH_OUTPUT = [  # mutually exclusive
    (("--json",), dict(action="store_true", help="JSON output")),
    (("--csv",), dict(action="store_true", help="CSV output")),
    (("--md",), dict(action="store_true", help="markdown table")),
]
# fmt: on
