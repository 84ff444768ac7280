#!/usr/bin/env python3
"""What rounding x to integers changes in generated text: greedy tokens of the
integer-activation decode kernels (--kernels numba-int8, or numba-int16) against the float
ones (numba-f32) on the real-model parity prompts (tests/integration), and the largest
logit difference.

    .venv/bin/python scripts/int8_agreement.py [--weights q8_0] [--kernels numba-int16]
"""

from __future__ import annotations

import argparse

import numpy as np

import llama_np
from llama_np.generation.generate import Stats

PROMPTS = {
    "smollm2-135m": ["Once upon a time, in a quiet village,", "The three primary colors are",
                     "def fibonacci(n):"],
    "qwen2.5-coder-0.5b": ["def quicksort(arr):",
                           "# Read a CSV file with pandas and print its columns\n"],
}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--weights", default=None, help="convert to this format (default: as stored)")
    ap.add_argument("-n", type=int, default=48, help="greedy tokens per prompt")
    ap.add_argument("--kernels", default="numba-int8", choices=["numba-int8", "numba-int16"])
    args = ap.parse_args()
    for model, prompts in PROMPTS.items():
        f = llama_np.load(model, weights=args.weights, kernels="numba-f32")
        i = llama_np.load(model, weights=args.weights, kernels=args.kernels)
        for p in prompts:
            ids = f.tokenize(p)
            a, b = Stats(), Stats()
            f.generate(ids, n_predict=args.n, temp=0, stats=a)
            i.generate(ids, n_predict=args.n, temp=0, stats=b)
            ta, tb = a.generated, b.generated
            pairs = zip(ta, tb, strict=False)
            same = next((k for k, (x, y) in enumerate(pairs) if x != y), min(len(ta), len(tb)))
            cf, ci = f.new_cache(), i.new_cache()
            diff = max(float(np.abs(f.step(t, cf) - i.step(t, ci)).max()) for t in ids + ta[:16])
            where = f"{model} {args.weights or 'as stored'} {args.kernels} {p!r}"
            print(f"{where}: first {same} of {len(ta)} greedy tokens equal; "
                  f"max |logit diff| over 16 steps {diff:.3f}")  # fmt: skip
        f.close()
        i.close()


if __name__ == "__main__":
    main()
