#!/usr/bin/env python3
"""The families at their real shapes against llama.cpp, on the same GGUF files: for each
preset, a checkpoint of random weights made by transformers' own classes (bfloat16, a tiny
SentencePiece tokenizer that llama.cpp's converter pads to the vocabulary; Gemma 4's reads
only a tokenizer.json, made here of the whole vocabulary with its chat template), converted by
llama.cpp's converter to Q8_0 (`--outtype q8_0`) and, through F16, quantized by llama.cpp's
own quantizer to Q4_K_M (`llama-quantize`). The files are kept in the cache
($LLAMA_NP_CACHE/families/PRESET/), made once. Then, per file, llama-np (as stored) and
llama.cpp (llama-cpp-python, built for this CPU) side by side in interleaved rounds: one
sequence (prefill of 128 tokens, decode), and batched decode at each B.

    .venv/bin/python scripts/families.py qwen3-0.6b gemma-3-1b --rounds 3 --batch 1,16
    .venv/bin/python scripts/families.py --make-only phi-4-mini gemma-4-e2b

Needs scripts/llama_cpp.sh (the converter's source and llama-quantize in its build).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VERSION = "0.3.36"
CACHE = Path(os.environ.get("LLAMA_NP_CACHE", Path.home() / ".cache" / "llama-np"))
SRC = CACHE / f"llama.cpp-{VERSION}"
CONVERT = SRC / "vendor" / "llama.cpp" / "convert_hf_to_gguf.py"
QUANTIZE = SRC / "build-server" / "bin" / "llama-quantize"
# the converter of these reads only a byte-level BPE (scripts/gguf_fixtures.py: byte_bpe,
# its pre-tokenizer check replaced)
BYTE_BPE = ("olmo2", "qwen3_moe", "olmoe", "qwen3_5_text", "lfm2", "olmo3")
FILES = {"q8_0": "Q8_0", "q4_k_m": "Q4_K_M", "q4_0": "Q4_0"}  # Q8_0 from the converter


def hf_config(preset: str) -> tuple[str, object]:
    """The preset as a transformers config (its config.json, as llama_arch writes it)."""
    import transformers

    from llama_arch import PRESETS, config_to_hf
    from llama_arch.families import FAMILIES

    d = config_to_hf(PRESETS[preset])
    d.pop("architectures", None)
    d.pop("torch_dtype", None)
    family = FAMILIES[PRESETS[preset].arch]  # the config from the preset's config.json fields
    d.pop("model_type")
    return family.hf_class, getattr(transformers, family.hf_config)(**d)


def checkpoint(preset: str, directory: Path) -> None:
    """Random weights of the preset's shape, saved in bfloat16, and a tokenizer (a
    SentencePiece model of the GPL's text; a byte-level BPE where the converter reads
    nothing else)."""
    import sentencepiece as spm
    import torch
    import transformers

    model_cls, cfg = hf_config(preset)
    torch.manual_seed(0)
    with torch.device("cpu"):
        model = getattr(transformers, model_cls)._from_config(cfg, dtype=torch.bfloat16)
    if cfg.model_type == "gemma4_text":
        qk_norms(model)
    model.save_pretrained(directory, safe_serialization=True)
    del model
    sys.path.insert(0, str(ROOT / "scripts"))
    if cfg.model_type in BYTE_BPE:
        from gguf_fixtures import byte_bpe

        return byte_bpe(directory)
    text = directory / "corpus.txt"
    text.write_text(open(ROOT / "data" / "gpl-3.0.txt").read(), encoding="utf-8")
    spm.SentencePieceTrainer.train(
        input=str(text), model_prefix=str(directory / "tokenizer"), vocab_size=1000,
        model_type="bpe", byte_fallback=True, unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
        minloglevel=2,
    )  # fmt: skip
    if cfg.model_type == "gemma4_text":  # a tokenizer.json of the whole vocabulary, no .model
        from gguf_fixtures import GEMMA4_TEMPLATE, gemma4_json

        sp_model = directory / "tokenizer.model"
        gemma4_json(directory, sp_model, cfg.vocab_size, CONVERT.parent / GEMMA4_TEMPLATE)
        sp_model.unlink()


def qk_norms(model: object) -> None:
    """Gemma 4 norms q and k to unit RMS and scales their product by 1: at head_dim 256 and
    512, random weights give attention logits of ~sqrt(head_dim), a softmax that is a hard
    argmax, and rounding alone (an f16 KV cache, flash attention on or off in llama.cpp)
    then moves the logits as far as another model's would (correlation ~0.7 at E2B's shape).
    Norm weights of head_dim^-1/4 bring the logits to ~1, and the engines to agree."""
    import torch

    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("q_norm.weight", "k_norm.weight")):
                p.fill_(p.shape[0] ** -0.25)


def run(cmd: list[str]) -> None:
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        sys.exit(f"families.py: {' '.join(cmd[:3])} failed:\n{r.stderr[-3000:]}")


def make(preset: str, files: tuple[str, ...] = ("q8_0", "q4_k_m")) -> dict[str, Path]:
    """The preset's files, Q8_0 and those llama-quantize makes from F16 (made once, kept
    in the cache)."""
    out = CACHE / "families" / preset
    paths = {k: out / f"{preset}-{FILES[k]}.gguf" for k in files}
    if all(p.is_file() for p in paths.values()):
        return paths
    for tool in (CONVERT, QUANTIZE):
        if not tool.is_file():
            sys.exit(f"families.py: no {tool}; run scripts/llama_cpp.sh first")
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out) as tmp:
        hf = Path(tmp) / preset
        print(f"families.py: {preset}: a random checkpoint", file=sys.stderr)
        checkpoint(preset, hf)
        print(f"families.py: {preset}: converting", file=sys.stderr)
        convert = converter(hf)
        if "q8_0" in paths:
            run([*convert, "--outfile", f"{paths['q8_0']}.part", "--outtype", "q8_0"])
        f16 = Path(tmp) / "f16.gguf"
        run([*convert, "--outfile", str(f16), "--outtype", "f16"])
        shutil.rmtree(hf)
        for kind in paths.keys() - {"q8_0"}:
            run([str(QUANTIZE), str(f16), f"{paths[kind]}.part", FILES[kind], "2"])
    for p in paths.values():
        os.replace(f"{p}.part", p)
    return paths


def converter(hf: Path) -> list[str]:
    """llama.cpp's converter on checkpoint `hf` (patched where its tokenizer is a tiny
    byte-level BPE)."""
    model_type = json.loads((hf / "config.json").read_text())["model_type"]
    mtp = ["--no-mtp"] if model_type.startswith("qwen3_5") else []  # random weights have none
    if model_type not in BYTE_BPE:
        return [sys.executable, str(CONVERT), str(hf), *mtp]
    sys.path.insert(0, str(ROOT / "scripts"))
    from gguf_fixtures import PATCHED

    return [sys.executable, "-c", PATCHED, str(CONVERT.parent), str(hf), *mtp]


def compare(preset: str, rounds: int, batches: list[int], threads: int,
            files: tuple[str, ...] = ("q8_0", "q4_k_m")) -> dict:  # fmt: skip
    """llama-np as stored against llama.cpp on each file: one sequence (compare_peers)
    and batched decode (peers_batch)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import compare_peers
    import peers_batch

    out = {}
    for kind, path in make(preset, files).items():
        one = compare_peers.run(str(path), threads, rounds, "numba", formats=["stored"])
        many = peers_batch.compare(str(path), threads, batches, ["stored"], rounds, 8)
        out[kind] = {"one": one, "batch": many}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("presets", nargs="+")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch", default="1,16")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--files", default="q8_0,q4_k_m", help=f"of {', '.join(FILES)}")
    ap.add_argument("--make-only", action="store_true")
    ap.add_argument("--json")
    a = ap.parse_args()
    files = tuple(a.files.split(","))
    if set(files) - FILES.keys():
        sys.exit(f"families.py: --files: one of {', '.join(FILES)}, comma-separated")
    results = {}
    for preset in a.presets:
        if a.make_only:
            print(make(preset, files))
            continue
        batches = [int(b) for b in a.batch.split(",")]
        results[preset] = compare(preset, a.rounds, batches, a.threads, files)
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
