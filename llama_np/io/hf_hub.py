"""Models from a Hugging Face repository, `hf:ORG/REPO[:QUANT]` (llama.cpp's `-hf` habit),
through huggingface_hub: its cache (HF_HOME, HF_HUB_CACHE), its offline mode
(HF_HUB_OFFLINE=1: what the cache holds, no request), its token (HF_TOKEN) and its endpoint
(HF_ENDPOINT, for a mirror).

A repository of GGUF files gives the one of the quantization asked for (`:Q8_0`, matched
without regard to case; by default Q4_K_M, as llama.cpp), else its only GGUF; a
checkpoint repository (config.json and safetensors) gives its directory, with the
tokenizer's files and nothing else (no pickles, no other formats' weights).
"""

from __future__ import annotations

import fnmatch
import os
from pathlib import Path

from llama_np.errors import LlamaNpError, UsageError

PREFIX = "hf:"
DEFAULT_QUANT = "Q4_K_M"
CHECKPOINT = ["config.json", "generation_config.json", "*.safetensors", "*.safetensors.index.json",
              "tokenizer.json", "tokenizer.model", "tokenizer_config.json",
              "special_tokens_map.json", "chat_template.jinja", "chat_template.json"]  # fmt: skip


def is_hf(model: object) -> bool:
    return isinstance(model, str) and model.startswith(PREFIX)


def parse(spec: str) -> tuple[str, str | None]:
    """ "hf:ORG/REPO[:QUANT]" -> (ORG/REPO, QUANT or None), or a UsageError."""
    body = spec[len(PREFIX) :]
    repo, _, quant = body.partition(":")
    parts = repo.split("/")
    if len(parts) != 2 or not all(parts) or any(p in (".", "..") for p in parts):
        raise UsageError(f"{spec!r}: give a Hugging Face repository as hf:ORG/REPO[:QUANT]")
    return repo, quant or None


def pull_hf(spec: str, force: bool = False) -> Path:
    """Download (or find in huggingface_hub's cache) what `spec` names; its path."""
    try:
        import huggingface_hub as hub
        from huggingface_hub.utils import HfHubHTTPError
    except ModuleNotFoundError:
        raise UsageError("hf: models need huggingface_hub: pip install huggingface_hub") from None
    repo, quant = parse(spec)
    offline = os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes", "on")
    endpoint = os.environ.get("HF_ENDPOINT") or None  # read now: the hub module reads it once
    try:
        files = None if offline else hub.HfApi(endpoint=endpoint).list_repo_files(repo)
        if files is not None and not any(f.endswith(".gguf") for f in files):
            if quant is not None:
                raise UsageError(f"{spec}: the repository holds no GGUF file to pick {quant} from")
            return _checkpoint(hub, repo, force)
        return _gguf(hub, repo, quant, files, force, spec)
    except (HfHubHTTPError, OSError, ValueError) as e:
        hint = "; offline (HF_HUB_OFFLINE): only what the cache holds" if offline else ""
        raise LlamaNpError(f"{spec}: {type(e).__name__}: {str(e).splitlines()[0]}{hint}") from None


def _checkpoint(hub, repo: str, force: bool) -> Path:
    path = Path(hub.snapshot_download(repo, allow_patterns=CHECKPOINT, force_download=force,
                                      endpoint=os.environ.get("HF_ENDPOINT") or None))  # fmt: skip
    if not (path / "config.json").is_file():
        raise LlamaNpError(f"hf:{repo}: neither GGUF files nor a config.json in the repository")
    return path


def _gguf(hub, repo: str, quant: str | None, files: list[str] | None, force: bool,
          spec: str) -> Path:  # fmt: skip
    """The GGUF of the quantization asked for (or the default, or the only one). Offline
    (files None): the cache's."""
    want = (quant or DEFAULT_QUANT).lower()
    if files is None:  # offline: what the cache holds of that quantization
        path = hub.snapshot_download(repo, allow_patterns=[f"*{want}*.gguf",
                                                           f"*{want.upper()}*.gguf"],
                                     local_files_only=True)  # fmt: skip
        found = sorted(p for p in Path(path).rglob("*.gguf") if want in p.name.lower())
        if not found:
            raise LlamaNpError(f"{spec}: no {want.upper()} GGUF of {repo} in the cache (offline)")
        return found[0]
    ggufs = [f for f in files if f.endswith(".gguf") and "mmproj" not in f.lower()]
    chosen = sorted(f for f in ggufs if fnmatch.fnmatch(f.lower(), f"*{want}*"))
    if not chosen and quant is None and len(ggufs) == 1:
        chosen = ggufs
    if not chosen:
        raise UsageError(f"{spec}: no {want.upper()} GGUF in {repo} (it holds: "
                         f"{', '.join(ggufs)}); give one as hf:{repo}:QUANT")  # fmt: skip
    if "-of-0" in chosen[0]:
        raise UsageError(f"{spec}: {chosen[0]}: a model split over several files is not "
                         "supported; give a single-file quantization")  # fmt: skip
    return Path(hub.hf_hub_download(repo, chosen[0], force_download=force,
                                    endpoint=os.environ.get("HF_ENDPOINT") or None))  # fmt: skip
