#!/usr/bin/env python3
"""One layer's batched decode attention (`layers.attend_batch`) against its bounds.

B sequences, each with its own KV stores of `--keys` positions (several layers' worth,
cycled, so the keys and values come from DRAM as in a model's step), or with --shared
every sequence on the same stores (held in cache: the arithmetic alone). Prints the
median and best ms per layer, the GB/s of KV read and the GFLOPS, beside the two floors:
the bytes at the probe's DRAM bandwidth and the FLOPs at its FMA ceiling.

    .venv/bin/python scripts/bench_attention.py                      # TinyLlama's shape
    .venv/bin/python scripts/bench_attention.py --heads 14 --kv-heads 2 --shared
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from bench.probe import load_probe, run_probe
from quant.compiled import layers
from quant.kv import KV_FORMATS


def stores(args: argparse.Namespace, rng: np.random.Generator) -> list:
    """One layer's (keys, values) per sequence (one for all with --shared), filled at
    random."""
    made = []
    for _ in range(1 if args.shared else args.batch):
        fmt = KV_FORMATS[args.kv]
        k = fmt(args.kv_heads, args.keys, args.head_dim, tiled=True)
        v = fmt(args.kv_heads, args.keys, args.head_dim)
        x = rng.standard_normal((args.keys, args.kv_heads, args.head_dim)).astype(np.float32)
        k.write(0, x)
        v.write(0, x)
        made.append((k, v))
    return made * args.batch if args.shared else made


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--keys", type=int, default=4096)
    ap.add_argument("--kv", choices=sorted(KV_FORMATS), default="f32")
    ap.add_argument("--layers", type=int, default=4, help="layers cycled (default 4)")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--shared", action="store_true", help="every sequence on one store")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    b, hd = args.batch, args.head_dim
    held = [stores(args, rng) for _ in range(args.layers)]  # kept alive: kv_at points in
    arrays = [[tuple(k.arrays()) + tuple(v.arrays()) for k, v in s] for s in held]
    kv_at = [np.array([[layers.address(a) for a in seq] for seq in s]) for s in arrays]
    nk = len(held[0][0][0].arrays())
    qkv = rng.standard_normal((b, (args.heads + 2 * args.kv_heads) * hd)).astype(np.float32)
    cos, sin = np.ones((b, hd // 2), np.float32), np.zeros((b, hd // 2), np.float32)
    out = np.empty((b, args.heads * hd), np.float32)
    slots, ns = np.full(b, -1, np.int64), np.full(b, args.keys, np.int64)

    def layer_ms() -> float:
        t0 = time.perf_counter()
        for s, at in zip(arrays, kv_at, strict=True):
            layers.attend_batch(qkv, cos, sin, s[0][:nk], s[0][nk:], at, slots, ns, out)
        return (time.perf_counter() - t0) / args.layers * 1e3

    layer_ms()
    times = [layer_ms() for _ in range(args.rounds)]
    probe = load_probe(2) or run_probe(2)
    nbytes = b * sum(kv.stored_nbytes(args.keys) for kv in held[0][0])
    flops = 4 * b * args.heads * args.keys * hd
    med, best = statistics.median(times), min(times)
    dram = probe.dram_gbs()
    print(
        f"{probe.machine}: {b} x {args.keys} keys, {args.heads}/{args.kv_heads} heads, "
        f"head_dim {hd}, {args.kv}{' (shared, in cache)' if args.shared else ''}"
    )
    print(
        f"  {med:.2f} ms a layer (best {best:.2f}): {nbytes / med / 1e6:.1f} GB/s, "
        f"{flops / med / 1e6:.0f} GFLOPS"
    )
    print(
        f"  floors: reads {nbytes / dram / 1e6:.2f} ms at {dram:.1f} GB/s, "
        f"FMAs {flops / probe.fma_gflops / 1e6:.2f} ms at {probe.fma_gflops:.0f} GFLOPS"
    )


if __name__ == "__main__":
    main()
