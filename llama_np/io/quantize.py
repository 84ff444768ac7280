"""`llama-np quantize`: write a checkpoint whose matrices are stored in another format.

The output is a Hugging Face-style directory (config.json, tokenizer files, one
model.safetensors) that every command loads. Block formats are stored as their GGUF
blocks under `<tensor name>:blocks` (checkpoints written before, with q8_0 / q4_0 / q4_1
as codes, float16 scales and mins, still load), and the
safetensors metadata `llama_np.formats` names each tensor's format and shape. The
directory is written next to OUT under a temporary name and renamed into place, so an
interrupted run leaves no partial OUT behind.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from llama_arch import Config, config_to_hf
from llama_np.errors import UsageError
from llama_np.io.source import FORMATS_KEY, NORMS_KEY, Source, open_source
from llama_np.io.tokenizer import HFTokenizer
from llama_np.model.build import PLE_NAMES, build_weights, layer_tensor_names
from llama_np.model.transformer import Layer, Weights
from quant import Weight

TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer.model", "tokenizer_config.json", "special_tokens_map.json",
    "generation_config.json",
)  # fmt: skip


def named_tensors(w: Weights, c: Config) -> dict[str, Weight | np.ndarray]:
    """The model's tensors under their Hugging Face names (a tied head is not repeated;
    stacked matrices are cut back into q, k, v and gate, up where the family stores them
    apart)."""
    out: dict[str, Weight | np.ndarray] = {
        "model.embed_tokens.weight": w.embed,
        "model.norm.weight": w.norm,
    }
    if w.lm_head is not w.embed:
        out["lm_head.weight"] = w.lm_head
    if w.ple_embed is not None:  # gemma4's per-layer table, its projection and norm
        out |= {PLE_NAMES[k]: getattr(w, k) for k in ("ple_embed", "ple_proj", "ple_norm")}
    for i, layer in enumerate(w.layers):  # (each layer's own head_dim and MLP width)
        names = layer_tensor_names(i, c).items()
        out |= {name: layer_part(layer, role, c.at(i)) for role, name in names}
    return out


def layer_part(layer: Layer, role: str, c: Config) -> Weight | np.ndarray:
    """A layer's tensor by role (llama_arch.tensors, and the fused wqkv, w_gate_up)."""
    q, kv, h = c.q_dim, c.kv_dim, c.hidden_dim
    rows = {"q": (0, q), "k": (q, q + kv), "v": (q + kv, q + 2 * kv)}
    if role in ("wq", "wk", "wv"):
        return layer.wqkv.slice_rows(*rows[role[1]])
    if role in ("bq", "bk", "bv"):
        a, b = rows[role[1]]
        return layer.qkv_bias[a:b]
    kind, _, expert = role.partition(".")  # a mixture of experts: w_gate.E ...
    gate_up = layer.w_gate_up if not expert else layer.experts.gate_up[int(expert)]
    if kind in ("w_gate", "w_up"):
        return gate_up.slice_rows(*((0, h) if kind == "w_gate" else (h, 2 * h)))
    if kind == "w_down" and expert:
        return layer.experts.down[int(expert)]
    if role == "router":
        return layer.experts.router
    return getattr(layer, role)  # wqkv, wo, w_gate_up, w_down, the norms


def tensors_at_rest(w: Weights, c: Config) -> tuple[dict[str, np.ndarray], dict[str, dict]]:
    """Arrays to save, and the format record of every matrix saved as its parts (a plain
    safetensors tensor needs none)."""
    arrays: dict[str, np.ndarray] = {}
    formats: dict[str, dict] = {}
    for name, t in named_tensors(w, c).items():
        plain = np.asarray(t, dtype=np.float32) if isinstance(t, np.ndarray) else t.plain()
        if plain is not None:
            arrays[name] = np.ascontiguousarray(plain)
        else:
            arrays |= {f"{name}:{k}": np.ascontiguousarray(v) for k, v in t.export().items()}
            formats[name] = {"format": t.fmt, "shape": list(t.shape)}
    return arrays, formats


def write_tokenizer(src: Source, out: Path) -> None:
    if src.kind == "hf":
        for name in TOKENIZER_FILES:
            if (src.path / name).exists():
                shutil.copy(src.path / name, out / name)
    elif isinstance(src.tokenizer, HFTokenizer):
        tok = src.tokenizer
        tok.tok.save(str(out / "tokenizer.json"))
        cfg = {
            "bos_token": None if tok.bos_id is None else tok.token_text(tok.bos_id),
            "eos_token": tok.token_text(tok.eos_ids[0]) if tok.eos_ids else None,
            "add_bos_token": tok.add_bos,
            "chat_template": tok.chat_template,
        }
        (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2, ensure_ascii=False))


def quantize_checkpoint(
    model: str | Path, out: str | Path, fmt: str, head: str | None = None, force: bool = False
) -> Path:
    out = Path(out)
    if out.exists() and not force:
        raise UsageError(f"{out} exists; pass --force to replace it")
    src = open_source(model)
    weights = build_weights(src.config, src.tensors, fmt, head, progress=True)
    arrays, formats = tensors_at_rest(weights, src.config)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        # the norm weights as the forward pass multiplies by them (Gemma's 1 + w)
        metadata = {FORMATS_KEY: json.dumps(formats), NORMS_KEY: "as used"}
        save_file(arrays, tmp / "model.safetensors", metadata=metadata)
        if src.kind == "hf":
            shutil.copy(src.path / "config.json", tmp / "config.json")
        else:
            (tmp / "config.json").write_text(json.dumps(config_to_hf(src.config), indent=2))
        write_tokenizer(src, tmp)
        if out.exists():  # --force: move the old one aside only once the new one is complete
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old.", dir=out.parent))
            os.replace(out, old / "x")
            os.replace(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out
