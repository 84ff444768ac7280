"""What makes a measurement comparable later: the CPU, the code (version and commit), the
date, the model file. `bench --json` and the results command stamp what they write with
these; `bench --compare` reads them back."""

from __future__ import annotations

import datetime
import hashlib
import platform
import re
import subprocess
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  # the checkout, when run from one


def version() -> str:
    """The installed llama-np's version ("unknown" when it is run from a bare tree)."""
    try:
        return metadata.version("llama-np")
    except metadata.PackageNotFoundError:
        return "unknown"


def commit() -> str:
    """The checkout's commit (short), "+changes" when tracked files differ from it outside
    docs/ and the README (the results command's own outputs); "unknown" outside git."""

    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True,
                                  timeout=10).stdout  # fmt: skip
        except (OSError, subprocess.SubprocessError):
            return ""

    head = git("rev-parse", "--short", "HEAD").strip()
    if not head:
        return "unknown"
    changed = git("status", "--porcelain", "--untracked-files=no", "--", ".",
                  ":(exclude)docs", ":(exclude)README.md")  # fmt: skip
    return head + ("+changes" if changed else "")


def cpu(cores: int) -> str:
    """The CPU as a reader can compare it: model name, family/model, the SIMD that matters,
    and the cores used."""
    path = Path("/proc/cpuinfo")
    info = path.read_text() if path.exists() else ""
    field = dict(re.findall(r"^(model name|cpu family|model|flags)\s*:\s*(.*)$", info, re.M))
    flags = set(field.get("flags", "").split())
    simd = [name for flag, name in (("avx512f", "AVX-512"), ("avx512_vnni", "VNNI"),
                                    ("avx512_bf16", "BF16"), ("amx_int8", "AMX"))
            if flag in flags] or (["AVX2"] if "avx2" in flags else [])  # fmt: skip
    name = field.get("model name", platform.processor() or platform.machine())
    fam = f"family {field['cpu family']} model {field['model']}, " if "cpu family" in field else ""
    return f"{name} ({fam}{', '.join(simd) or 'no AVX2'}), {cores} cores"


def now() -> str:
    """The time, to the second, with its zone (ISO 8601)."""
    return datetime.datetime.now().astimezone().isoformat(timespec="seconds")


def file_identity(path: Path) -> dict:
    """A model as a later run can recognize it: its path, size and sha256 (read once, ~0.3
    s a GB); of a checkpoint directory, its files' (config, tokenizer, weights) in name
    order."""
    files = sorted(p for p in path.iterdir() if p.is_file()) if path.is_dir() else [path]
    h = hashlib.sha256()
    for file in files:
        with open(file, "rb") as f:
            for chunk in iter(lambda f=f: f.read(1 << 24), b""):
                h.update(chunk)
    size = sum(f.stat().st_size for f in files)
    return {"file": str(path), "bytes": size, "sha256": h.hexdigest()}
