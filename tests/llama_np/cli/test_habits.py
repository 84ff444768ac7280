"""What a llama.cpp user types: escapes in -p and --stop, -t beyond the cores, -ngl,
--version; output paths checked before the work; the summary's wording."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from llama_np.cli import main
from llama_np.cli.commands import unescape
from tests.helpers import all_cores


def cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "llama_np", *args], capture_output=True,
                          text=True, timeout=timeout)  # fmt: skip


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize(("typed", "meant"), [
    (r"a\n\nb", "a\n\nb"), (r"\t\r\'\"\\", "\t\r'\"\\"), (r"\x41\x4a", "AJ"),
    (r"\q \x4 \xzz \x", r"\q \x4 \xzz \x"), ("\\", "\\"), (r"\xe9", r"\xe9"),
])  # fmt: skip
def test_escapes_as_llama_cpp_processes_them(typed, meant):
    assert unescape(typed) == meant


def greedy(model: str, *extra: str) -> tuple[str, str]:
    args = ["generate", "-m", model, "-p", "Once upon a time", "-n", "24", "--temp", "0"]
    r = cli(*args, *extra)
    assert r.returncode == 0, r.stderr
    return r.stdout.removesuffix("\n"), r.stderr.strip().splitlines()[-1]


def test_stop_takes_escapes_unless_told_not_to(gqa_dir):
    """The first character of the greedy text (a tiny random model's), written as \\xHH
    on the command line: it stops generation at once; with --no-escape it is four
    characters that never appear."""
    text, summary = greedy(str(gqa_dir[0]))
    first = next(c for c in text if c.isascii() and c.isprintable() and c != "\\")
    escape = f"\\x{ord(first):02x}"
    out, summary = greedy(str(gqa_dir[0]), "--stop", escape)
    assert out == text[: text.index(first)] and "stop: stop" in summary
    out, summary = greedy(str(gqa_dir[0]), "--stop", escape, "--no-escape")
    assert out == text and "stop: length" in summary
    assert "seed" not in summary  # greedy: nothing was drawn at random


def test_threads_beyond_the_cores_are_cut_and_said_and_one_thread_is_singular(gqa_dir):
    base = ["-m", str(gqa_dir[0]), "-p", "Hi", "-n", "3", "--seed", "7"]
    r = cli("generate", *base, "-t", "64")
    assert r.returncode == 0, r.stderr
    cores = all_cores()  # the subprocess's, not this test worker's share
    assert f"note: -t 64: this process may use {cores} core" in r.stderr
    assert f"{cores} thread" in r.stderr.splitlines()[-1] and "seed 7" in r.stderr
    r = cli("generate", *base, "-t", "1")
    assert re.search(r"\| numba \w+, 1 thread[,| ]", r.stderr), r.stderr


def test_gpu_offload_is_taken_and_ignored_with_a_note(gqa_dir):
    r = cli("generate", "-m", str(gqa_dir[0]), "-p", "Hi", "-n", "2", "-ngl", "99")
    assert r.returncode == 0, r.stderr
    assert "note: -ngl 99 ignored: llama.cpp's GPU offload" in r.stderr


def test_version():
    r = cli("--version")
    assert r.returncode == 0
    assert re.fullmatch(r"llama-np \S+ \(commit \S+\)\n", r.stdout)


@pytest.mark.parametrize("args", [
    ["bench", "-m", "/no/model", "--plot", "/no/folder/x.png"],  # refused before the load
    ["sol", "--published", "--plot", "/no/folder/x.png"],
    ["sol", "--published", "--plot", "/tmp/x.txt"],
    ["sol", "--config", "llama-2-7b", "--plot", "x.png"],
])  # fmt: skip
def test_an_output_that_cannot_be_written_is_refused_first(args, capsys):
    assert main(args) == 2
    line = one_line(capsys.readouterr().err)
    assert "--plot" in line


@pytest.mark.parametrize(("model_type", "types", "says"), [
    ("qwen3_5_text", ["linear_attention", "mamba"], "full_attention or linear_attention"),
    ("lfm2", ["conv", "sliding_attention"], "full_attention or conv"),
])  # fmt: skip
def test_a_mixer_not_run_is_one_line_before_any_weight(tmp_path, capsys, model_type, types, says):
    """A checkpoint whose layer_types name a token mixer llama-np does not run: one line,
    status 2, from its config.json alone (the directory holds no weights at all)."""
    import json

    cfg = {"model_type": model_type, "hidden_size": 64, "num_hidden_layers": 2,
           "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 96,
           "vocab_size": 100, "layer_types": types}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert main(["generate", "-m", str(tmp_path), "-p", "hi"]) == 2
    assert says in one_line(capsys.readouterr().err)
