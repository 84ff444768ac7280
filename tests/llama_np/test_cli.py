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
    for flag in (flags + " --stop --kv --weights").split():
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
        (["generate", "-m", "{model}", "-p", "hi", "-n", "99999999999"], 2, "at most 10,000,000"),
        (["generate", "-m", "{model}", "-p", "hi", "--device", "gpu9"], 2, "unknown device 'gpu9'"),
        (["generate", "-m", "{model}", "-f", "/nonexistent.txt"], 2, "cannot read the prompt file"),
        (["generate", "-m", "{model}", "-p", ""], 2, "empty"),
        (["generate", "-m", "{model}", "-p", "hello world", "-c", "3"], 2, "context size 3"),
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
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert "generated 3 tokens" in r.stderr
