#!/usr/bin/env python3
"""Per-token overhead of the forward pass (Python, the seam, kernel dispatch): a decode
step of SmolLM2-135M's 30 layers at width 64 (every kernel call made, almost no work in
them) against the real shape, same backend and format, in alternated rounds; on the
compiled backend both with the decoder blocks in one call and call by call.

    .venv/bin/python scripts/call_overhead.py [--kernels numba] [--weights q4_1]
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import numpy as np

from llama_arch.presets import PRESETS
from llama_np.model.synthetic import random_model
from quant.backends import get_backend


def step_ms(model, steps: int = 40) -> float:
    cache = model.new_cache(256)
    model.forward(np.array([1, 2, 3]), cache)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        model.forward(np.array([5]), cache)
        times.append(time.perf_counter() - t0)
    return float(np.median(times)) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernels", default="numba")
    ap.add_argument("--weights", default="q4_1")
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    backend, full = get_backend(a.kernels), PRESETS["smollm2-135m"]
    tiny = dataclasses.replace(full, dim=64, n_heads=2, n_kv_heads=1, head_dim=32,
                               hidden_dim=64, vocab_size=256, name="tiny")  # fmt: skip
    models = {n: random_model(c, a.weights, None, backend).start(2) for n, c in
              (("full", full), ("tiny", tiny))}  # fmt: skip
    ways = [True, False] if hasattr(models["full"].ops, "one_call") else [None]
    rounds = {(n, w): [] for n in models for w in ways}
    for _ in range(a.rounds):
        for n, w in rounds:
            if w is not None:
                models[n].ops.one_call = w
            rounds[n, w].append(step_ms(models[n]))
    for w in ways:
        f, t = np.median(rounds["full", w]), np.median(rounds["tiny", w])
        how = {True: ", blocks in one call", False: ", call by call", None: ""}[w]
        print(f"{a.kernels} {a.weights}{how}: SmolLM2-135M {f:.2f} ms/token; its 30 layers' "
              f"calls at width 64 {t:.3f} ms/token = {100 * t / f:.1f}% of a token")  # fmt: skip


if __name__ == "__main__":
    main()
