"""Published configurations (from the models' config.json files), by name."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .config import Config, ConfigError
from .hf import read_config_json


def _p(name: str, dim: int, layers: int, heads: int, kv: int, hidden: int, vocab: int,
       **kw: Any) -> Config:  # fmt: skip
    arch = kw.pop("arch", "mistral" if kw.get("sliding_window") else "llama")
    return Config(arch, dim, layers, heads, kv, dim // heads, hidden, vocab, name=name, **kw)


PRESETS: dict[str, Config] = {
    c.name: c
    for c in [
        _p("llama-7b", 4096, 32, 32, 32, 11008, 32000, max_seq_len=2048),
        _p("llama-13b", 5120, 40, 40, 40, 13824, 32000, max_seq_len=2048),
        _p("llama-33b", 6656, 60, 52, 52, 17920, 32000, max_seq_len=2048),
        _p("llama-65b", 8192, 80, 64, 64, 22016, 32000, max_seq_len=2048),
        _p("llama-2-7b", 4096, 32, 32, 32, 11008, 32000),
        _p("llama-2-13b", 5120, 40, 40, 40, 13824, 32000),
        _p("llama-2-70b", 8192, 80, 64, 8, 28672, 32000),
        _p("llama-3-8b", 4096, 32, 32, 8, 14336, 128256, max_seq_len=8192),
        _p("llama-3-70b", 8192, 80, 64, 8, 28672, 128256, max_seq_len=8192),
        _p("mistral-7b", 4096, 32, 32, 8, 14336, 32000, sliding_window=4096, max_seq_len=32768),
        _p(
            "mixtral-8x7b",
            4096,
            32,
            32,
            8,
            14336,
            32000,
            n_experts=8,
            experts_per_token=2,
            max_seq_len=32768,
            arch="mixtral",
        ),
        _p("tinyllama-1.1b", 2048, 22, 32, 4, 5632, 32000, max_seq_len=2048),
        _p("smollm2-135m", 576, 30, 9, 3, 1536, 49152, tie_embeddings=True, max_seq_len=8192),
        _p("smollm2-360m", 960, 32, 15, 5, 2560, 49152, tie_embeddings=True, max_seq_len=8192),
        _p("smollm2-1.7b", 2048, 24, 32, 32, 8192, 49152, tie_embeddings=True, max_seq_len=8192),
    ]
}


def load_config(arg: str, runnable: bool = False) -> Config:
    """A preset name, a config.json, or a checkpoint directory holding one."""
    key = arg.lower()
    if key in PRESETS:
        return PRESETS[key]
    path = Path(arg)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise ConfigError(f"{arg!r} is neither a preset ({', '.join(PRESETS)}) nor a config.json")
    return read_config_json(path, runnable)
