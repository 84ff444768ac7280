#!/usr/bin/env python3
"""Per-token overhead of the forward pass (Python, the seam, kernel dispatch): a decode
step of a preset's layers at width 64 (every kernel call made, almost no work in them)
against the real shape, same backend and format, in alternated rounds; on the compiled
backend both with the decoder blocks in one call and call by call.

    .venv/bin/python scripts/call_overhead.py [--preset smollm2-135m] [--kernels numba]
        [--weights q4_1]
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


def narrow(c):
    """The preset's layers at width 64 (a delta net's heads two of 32; partial rotary on 16
    dims where the preset turns part of each head)."""
    kw = dict(dim=64, n_heads=2, n_kv_heads=1, head_dim=32, hidden_dim=64, vocab_size=256,
              name="tiny", rotary_dim=16 if c.rotary_dim else None)  # fmt: skip
    if c.delta is not None:
        kw["delta"] = dataclasses.replace(c.delta, k_heads=2, v_heads=2, k_dim=32, v_dim=32)
    return dataclasses.replace(c, **kw)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernels", default="numba")
    ap.add_argument("--weights", default="q4_1")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--preset", default="smollm2-135m")
    a = ap.parse_args()
    backend, full = get_backend(a.kernels), PRESETS[a.preset]
    tiny = narrow(full)
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
        print(f"{a.kernels} {a.weights}{how}: {a.preset} {f:.2f} ms/token; its {full.n_layers} "
              f"layers' calls at width 64 {t:.3f} ms/token = {100 * t / f:.1f}% of a token")  # fmt: skip


if __name__ == "__main__":
    main()
