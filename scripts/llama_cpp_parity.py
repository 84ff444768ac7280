#!/usr/bin/env python3
"""llama-np against llama.cpp on one GGUF file, logit by logit: llama.cpp (llama-cpp-python,
built for this CPU by scripts/llama_cpp.sh) tokenizes a text, runs it and decodes -n tokens
greedily, keeping each step's logits; llama-np checks its own tokens of the text equal, runs
the prompt and llama.cpp's tokens in one pass (teacher-forced) and decodes greedily on its
own. Per step: both top-1 tokens and their margins (top-1 logit minus the second), and the
largest difference of the log-probabilities over the vocabulary; then both greedy sequences.
Random weights give flat distributions: a top-1 may differ only where the margin is within
that difference. Exit status 1 when one does where both margins exceed it.

    .venv/bin/python scripts/llama_cpp_parity.py FILE.gguf -n 12
    .venv/bin/python scripts/llama_cpp_parity.py FILE.gguf -n 8 --text-file data/gpl-3.0.txt \\
        --chars 2200     # a prompt past a 512-token window
"""

from __future__ import annotations

import argparse
import gc
import sys

import numpy as np

TEXT = "Once upon a time there was a little llama who lived in the mountains."


def llama_cpp(path: str, text: str, n: int, threads: int,
              flash: bool) -> tuple[list[int], list[int], np.ndarray]:  # fmt: skip
    """llama.cpp's tokens of `text` (BOS added), its n greedy tokens, the logits before each
    (n, vocab)."""
    from llama_cpp import Llama

    llm = Llama(model_path=path, n_ctx=len(text) + n + 16, n_threads=threads,
                n_threads_batch=threads, logits_all=True, flash_attn=flash,
                verbose=False)  # fmt: skip
    ids = llm.tokenize(text.encode(), add_bos=True, special=False)
    llm.eval(ids)
    logits, gen = [np.array(llm.scores[len(ids) - 1], np.float32)], []
    for _ in range(n):
        gen.append(int(np.argmax(logits[-1])))
        llm.eval(gen[-1:])
        logits.append(np.array(llm.scores[llm.n_tokens - 1], np.float32))
    llm.close()
    return ids, gen, np.stack(logits[:n])


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("-n", type=int, default=12, help="greedy tokens")
    ap.add_argument("--text-file", help=f"the prompt's text (default {TEXT!r})")
    ap.add_argument("--chars", type=int, help="the file's first CHARS characters")
    ap.add_argument("--kernels", default="numba")
    ap.add_argument("--flash-attn", action="store_true", help="llama.cpp's flash attention")
    ap.add_argument("-t", "--threads", type=int, default=2)
    a = ap.parse_args()
    text = TEXT if a.text_file is None else open(a.text_file, encoding="utf-8").read()[: a.chars]
    ids, gen, theirs = llama_cpp(a.model, text, a.n, a.threads, a.flash_attn)
    gc.collect()  # llama.cpp's weights and logits gone before llama-np maps the file

    import llama_np
    from llama_np.generation.generate import Stats

    with llama_np.load(a.model, kernels=a.kernels, threads=a.threads) as llm:
        same_tokens = llm.tokenize(text) == ids
        ours = np.asarray(llm.logits(ids + gen[:-1])[len(ids) - 1 :], np.float64)
        stats = Stats()
        llm.generate(ids, n_predict=a.n, temp=0, stats=stats)
    print(f"{a.model}: a prompt of {len(ids)} tokens; llama-np's tokens of the text "
          f"{'equal' if same_tokens else 'DIFFER FROM'} llama.cpp's")  # fmt: skip
    theirs = theirs.astype(np.float64)
    diff = np.abs(log_softmax(ours) - log_softmax(theirs)).max(-1)
    bad = 0
    for i in range(a.n):
        o, t = np.argsort(-ours[i])[:2], np.argsort(-theirs[i])[:2]
        mo, mt = ours[i, o[0]] - ours[i, o[1]], theirs[i, t[0]] - theirs[i, t[1]]
        same = o[0] == t[0]
        bad += not same and min(mo, mt) > diff[i]
        print(f"step {i:2d}: llama.cpp {t[0]:6d} (margin {mt:.3f}), llama-np {o[0]:6d} "
              f"(margin {mo:.3f}) {'same' if same else 'DIFFERENT'}; "
              f"max |log-prob difference| {diff[i]:.4f}")  # fmt: skip
    print(f"top-1 equal at {sum(int(np.argmax(ours[i]) == gen[i]) for i in range(a.n))} of "
          f"{a.n} steps; max |log-prob difference| {diff.max():.4f}")  # fmt: skip
    print(f"llama.cpp greedy: {gen}\nllama-np greedy:  {stats.generated}")
    print(f"greedy sequences {'equal' if stats.generated == gen else 'DIFFERENT'}")
    return 1 if bad or not same_tokens else 0


if __name__ == "__main__":
    sys.exit(main())
