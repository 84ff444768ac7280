"""The real SmolLM2 file as a newcomer meets it: a chat that stops where asked, a file cut
short, `sol` on the file agreeing with the meter of a real step."""

from __future__ import annotations

import json

import numpy as np

import llama_np
from llama_np.cli import main
from tests.llama_np.cli.test_habits import cli, one_line


def test_chat_stops_where_asked(smollm2_path):
    args = ["generate", "-m", str(smollm2_path), "--chat", "-p", "Name three rivers.", "-n",
            "24", "--temp", "0"]  # fmt: skip
    whole = cli(*args)
    assert whole.returncode == 0, whole.stderr
    word = whole.stdout.split()[2]  # a word the reply holds, after its start
    cut = cli(*args, "--stop", word)
    assert cut.returncode == 0, cut.stderr
    assert cut.stdout.removesuffix("\n") == whole.stdout[: whole.stdout.index(word)]
    assert "stop: stop" in cut.stderr and "stop: length" in whole.stderr


def test_a_truncated_gguf_says_how_much_is_missing(smollm2_path, tmp_path):
    cut = tmp_path / "cut.gguf"
    with open(smollm2_path, "rb") as f:
        cut.write_bytes(f.read(20_000_000))
    r = cli("generate", "-m", str(cut), "-p", "Hi", "--kernels", "numpy")
    assert r.returncode == 1
    size = smollm2_path.stat().st_size
    assert f"truncated: 20,000,000 bytes of the {size:,} its tensors need" in one_line(r.stderr)


def test_sol_takes_a_model_as_every_command_does(smollm2_path, capsys):
    """An alias or its GGUF counts the file's own formats (Q4_1, a Q8_0 head); a preset
    counts what --weights says."""
    assert main(["sol", "--config", "smollm2-135m", "--json"]) == 0
    alias = capsys.readouterr().out
    assert main(["sol", "--config", str(smollm2_path), "--json"]) == 0
    assert capsys.readouterr().out.replace(smollm2_path.name, "smollm2-135m") == alias
    assert '"weights": "q4_1"' in alias and '"head": "q8_0"' in alias
    assert main(["sol", "--config", "synthetic:smollm2-135m", "--weights", "q4_1"]) == 0
    assert "weights q4_1, kv" in capsys.readouterr().out


def test_sol_on_the_file_counts_what_a_step_reads(smollm2_path, capsys):
    """`sol --config FILE --engine-layout` holds the file's own formats as the compiled
    backend lays them out: the meter of a real decode step at the same position reads
    exactly its bytes."""
    pos = 37
    with llama_np.load(smollm2_path, kernels="numba") as llm:
        cache = llm.new_cache(64)
        llm.model.forward(np.arange(pos), cache)
        llm.model.forward(np.array([5]), cache)
        metered = llm.model.meter.last.bytes_read
    args = ["sol", "--config", str(smollm2_path), "--engine-layout", "--kernels", "numba",
            "--pos", str(pos), "--json"]  # fmt: skip
    assert main(args) == 0
    assert json.loads(capsys.readouterr().out)["bytes_per_token"] == metered
