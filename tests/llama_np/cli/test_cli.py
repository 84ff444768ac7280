"""`llama-np generate`: text on stdout, one summary line on stderr, one-line errors."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from llama_np.cli import build_parser, main


def test_generate_streams_text_and_a_summary(gqa_dir, capsys):
    code = main(
        ["generate", "-m", str(gqa_dir[0]), "-p", "Once upon a time", "-n", "12", "--temp", "0"]
    )
    out, err = capsys.readouterr()
    assert code == 0
    assert out.endswith("\n") and len(out) > 1
    last = err.strip().splitlines()[-1]
    assert re.search(r"prompt \d+ tokens, prefill [\d.]+ tok/s", last)
    assert re.search(r"generated 12 tokens, decode [\d.]+ ms/token", last)
    assert "GB/s" in last
    assert re.search(r"\| numba (omp|workqueue|tbb), \d+ threads? \|", last)  # what ran


def test_the_numpy_kernels_say_so(gqa_dir, capsys):
    args = ["generate", "-m", str(gqa_dir[0]), "-p", "Hi", "-n", "3", "--kernels", "numpy"]
    assert main(args) == 0
    assert re.search(r"\| numpy(, BLAS \d+ threads?)? \|", capsys.readouterr().err)


def run_without_numba(*args: str) -> subprocess.CompletedProcess:
    """The CLI in a Python where `import numba` fails, as without the fast extra."""
    code = "import sys; sys.modules['numba'] = None; from llama_np.cli import main; "
    code += f"sys.exit(main({list(args)!r}))"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)  # fmt: skip


def test_without_numba_asking_for_it_is_one_line_and_status_2(gqa_dir):
    r = run_without_numba("generate", "-m", str(gqa_dir[0]), "-p", "Hi", "--kernels", "numba")
    assert r.returncode == 2
    assert "pip install 'llama-np[fast]'" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


def test_without_numba_auto_runs_numpy(gqa_dir):
    r = run_without_numba("generate", "-m", str(gqa_dir[0]), "-p", "Hi", "-n", "3")
    assert r.returncode == 0, r.stderr
    assert "| numpy" in r.stderr and "note" not in r.stderr


def test_kernels_that_fail_to_compile_are_a_clear_error(gqa_dir, capsys, monkeypatch):
    """A CPU numba cannot compile for: one line and status 2 when asked for by name; a
    note and the NumPy kernels under auto."""
    from quant import backends, compiled

    def fail(*args):
        raise RuntimeError("LLVM ERROR: Cannot select: intrinsic %llvm.x86.avx512\nmore lines")

    monkeypatch.setattr(compiled, "warm_up", fail)
    backends.numba_backend.cache_clear()
    try:
        args = ["generate", "-m", str(gqa_dir[0]), "-p", "Hi", "-n", "2"]
        assert main([*args, "--kernels", "numba"]) == 2
        err = capsys.readouterr().err
        assert "failed to compile here: LLVM ERROR: Cannot select" in err
        assert len(err.strip().splitlines()) == 1
        assert main([*args, "--kernels", "auto"]) == 0
        err = capsys.readouterr().err
        assert "note: the numba kernels failed to compile" in err and "| numpy" in err
    finally:
        backends.numba_backend.cache_clear()


def test_same_flags_same_text(gqa_dir, capsys):
    args = ["generate", "-m", str(gqa_dir[0]), "-p", "x", "-n", "20", "--seed", "5"]
    main(args)
    first = capsys.readouterr().out
    main(args)
    assert capsys.readouterr().out == first


def test_help_documents_every_flag_with_its_default():
    sub = build_parser()._subparsers._group_actions[0].choices["generate"]
    text = sub.format_help()
    flags = "-m -p -f -n --temp --top-k --top-p --min-p --repeat-penalty --seed -c --window -t"
    for flag in (flags + " --stop --kv --weights --kernels").split():
        assert re.search(rf"(^|\s|,){re.escape(flag)}[\s,]", text), flag
    for action in sub._actions:
        if action.default not in (None, False, [], "==SUPPRESS==") and action.dest != "help":
            assert "default" in (action.help or ""), action.dest


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["generate", "-m", "/nonexistent", "-p", "hi"], 2, "no such file"),
        (
            ["generate", "-m", "{model}", "-p", "hi", "--top-p", "1.5"],
            2,
            "--top-p must be in (0, 1]",
        ),
        (["generate", "-m", "{model}", "-p", "hi", "-n", "-3"], 2, "must be at least 1"),
        (["generate", "-m", "{model}", "-p", "hi", "--temp", "-1"], 2, "--temp must be >= 0"),
        (["generate", "-m", "{model}"], 2, "give a prompt"),
        (["generate", "-m", "{model}", "-p", "hi", "--weights", "q9"], 2, "invalid choice: 'q9'"),
        (["generate", "-m", "{model}", "-p", "hi", "--kv", "q4_0"], 2, "invalid choice: 'q4_0'"),
        (["generate", "-m", "{model}", "-p", "hi", "--kernels", "gpu"], 2, "choice: 'gpu'"),
        (["generate", "-m", "{model}", "-p", "hi", "-n", "99999999999"], 2, "at most 10,000,000"),
        (["generate", "-m", "{model}", "-p", "hi", "--device", "gpu9"], 2, "unknown device 'gpu9'"),
        (["generate", "-m", "{model}", "-f", "/nonexistent.txt"], 2, "cannot read the prompt file"),
        (["generate", "-m", "{model}", "-p", ""], 2, "empty"),
        (["generate", "-m", "{model}", "-p", "hello world", "-c", "3"], 2, "context size 3"),
        (["generate", "-m", "{model}", "-p", "hi", "-np", "0"], 2, "-np/--parallel"),
        (["generate", "-m", "{model}", "--prompts", "/nonexistent"], 2, "cannot read the prompts"),
        (["generate", "-m", "{model}", "-p", "hi", "-np", "2", "--chat"], 2, "--chat takes one"),
        (
            ["generate", "-m", "{model}", "-p", "hi", "-np", "9999", "-c", "99999999"],
            2,
            "9999 sequences of",
        ),
        (["bench", "-m", "{model}", "--batch", "0,4"], 2, "batch sizes must be 1..4096"),
        (["bench", "-m", "{model}", "--batch", "x"], 2, "comma-separated integers"),
        (["bench", "-m", "{model}", "-n", "2"], 2, "give -n of at least 3"),
        (["sol", "--config", "llama-2-7b", "--batch", "0"], 2, "--batch"),
    ],
)
def test_bad_input_gets_one_line_and_a_status(gqa_dir, capsys, args, code, message):
    args = [a.replace("{model}", str(gqa_dir[0])) for a in args]
    with pytest.raises(SystemExit) as e:
        sys.exit(main(args))
    err = capsys.readouterr().err
    assert e.value.code == code
    assert message in err
    assert len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err


def test_python_dash_m_works(gqa_dir):
    # a cold kernel cache compiles ~160 s on 2 vCPUs (more beside the other test worker)
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "llama_np",
            "generate",
            "-m",
            str(gqa_dir[0]),
            "-p",
            "ab",
            "-n",
            "3",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr
    assert "generated 3 tokens" in r.stderr


def test_sol_batch_names_the_ridge(capsys):
    assert main(["sol", "--config", "llama-2-7b", "--device", "a100-80gb-sxm", "--weights",
                 "f16", "--batch", "64"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "a batch of 64 sequences" in out and "ms/step" in out
    assert re.search(r"ridge batch B\*\s+1[456]\d\.\d", out)
    assert main(["sol", "--config", "mixtral-8x7b", "--batch", "4", "--json"]) == 0
    assert '"batch": 4' in capsys.readouterr().out
