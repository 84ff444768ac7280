#!/usr/bin/env python3
"""Every figure the README and docs/ show, measured on this machine: the probe, the
speed-of-light validation sweep, the batch sweep, llama.cpp and transformers side by side
(one sequence, and batched), perplexity, and the published measurements of machines we do
not have. Writes docs/results.json (the data, each section stamped with CPU, date, commit
and command), docs/results.md and its plots (rendered from the JSON), and the README's
results block. Run it through scripts/results.sh, which installs what it needs.

    scripts/results.sh                       # everything (about an hour on 2 vCPUs)
    scripts/results.sh --quick               # a short version of every section (minutes)
    scripts/results.sh --only peers,probe    # some sections; the others keep their data
    .venv/bin/python scripts/results.py --render   # redraw docs/ and the README from the JSON
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import statistics
import sys
from pathlib import Path

import validate_sol

import llama_np  # noqa: F401  (first: it configures OpenBLAS's threads before NumPy loads)
from bench import calibrate, published, report
from bench import stamp as stamps
from bench.prefill_fit import leave_one_source_out as prefill_loso
from bench.prefill_fit import spread as prefill_spread
from bench.probe import Caches, Probe, curve_text, run_probe, save_probe, size_label
from bench.runner import Row, beats_its_bound
from quant.host import usable_cores

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
SECTIONS = ["probe", "validation", "batching", "peers", "peers-batch", "serve", "families",
            "hybrids", "moe", "perplexity", "published", "published-prefill"]  # fmt: skip
MODELS = ["smollm2-135m", "qwen2.5-coder-0.5b"]


# --- stamps ------------------------------------------------------------------------------


def cpu() -> str:
    return stamps.cpu(usable_cores())


def commit() -> str:
    return stamps.commit()


def stamp(command: str) -> dict[str, str]:
    return {"cpu": cpu(), "date": datetime.date.today().isoformat(), "commit": commit(),
            "command": command}  # fmt: skip


def stamp_line(s: dict[str, str]) -> str:
    return f"*{s['cpu']}; {s['date']}, commit {s['commit']}; `{s['command']}`*"


# --- sections: measure (-> JSON) and render (JSON -> markdown) ---------------------------


def measure_probe(ctx: argparse.Namespace) -> dict:
    ctx.probe = run_probe(ctx.threads)
    save_probe(ctx.probe)
    return {"probe": dataclasses.asdict(ctx.probe)}


def probe_of(data: dict) -> Probe:
    d = data["probe"]
    return Probe(**{**d, "caches": Caches(**d["caches"])})


def render_probe(data: dict, plots: Path) -> str:
    p = probe_of(data)
    lines = ["| working set | tier (label) | sgemv GB/s | compiled f32 matvec GB/s | compiled "
             "q8_0 int16 matvec GB/s | attainable GB/s |", "|---:|---|---:|---:|---:|---:|"]  # fmt: skip
    none = [0.0] * len(p.sizes)
    for s, g, c, i, a in zip(p.sizes, p.sgemv_gbs, p.compiled_gbs or none, p.int_gbs or none,
                             p.best_gbs(), strict=True):  # fmt: skip
        lines.append(f"| {size_label(s)} | {p.tier_of(s)} | {g:.1f} | {c:.1f} | {i:.1f} | "
                     f"{a:.1f} |")  # fmt: skip
    lines += ["", f"Arithmetic ceilings: float32 FMA {p.fma_gflops:.0f} GFLOPS, int8 multiply-add "
              f"({p.dot_instruction}) {p.int8_gops:.0f} GOPS, BLAS sgemm {p.sgemm_gflops:.0f} "
              f"GFLOPS (1024^3). The compiled products of 64 vectors reach "
              f"{p.compiled_gflops:.0f} (f32) and {p.compiled_q_gflops:.0f} (q8_0, int16 x) "
              "GFLOPS."]  # fmt: skip
    if slow := p.slow_compiled():
        lines.append(f"The compiled f32 matvec streams under 0.9 of sgemv at "
                     f"{', '.join(size_label(s) for s in slow)}.")  # fmt: skip
    return "\n".join(lines)


def beaten(rows: list[Row]) -> str:
    """How many rows ran faster than their speed of light."""
    n = sum(map(beats_its_bound, rows))
    if not n:
        return "none beats its bound"
    return "1 row beats its bound" if n == 1 else f"{n} rows beat their bounds"


def rows_of(data: dict) -> list[Row]:
    return [Row(**r) for r in data["rows"]]


def measure_validation(ctx: argparse.Namespace) -> dict:
    rows, probe = validate_sol.measure(ctx.probe, ctx.threads, False, ctx.quick)
    calibrate.save_local(ctx.probe.machine, [dataclasses.asdict(r) for r in rows])
    return {"probe": dataclasses.asdict(probe), "rows": [dataclasses.asdict(r) for r in rows]}


def render_validation(data: dict, plots: Path) -> str:
    rows, probe = rows_of(data), probe_of(data)
    validate_sol.plot(rows, plots / "validation.png", probe.machine)
    pts = [calibrate.Point(r.sol_ms, r.decode_ms, "this machine", "llama-np", r.model)
           for r in rows if r.sol_ms]  # fmt: skip
    fit, held = calibrate.fit(pts, "this machine"), calibrate.leave_one_source_out(pts)
    s = calibrate.spread(held)
    return "\n".join([
        f"Attainable bandwidth by working set (the probe at the start of the run, each size "
        f"at its best of that and the measurements beside each model's rows): "
        f"{curve_text(probe)}; sgemm {probe.sgemm_gflops:.0f} GFLOPS.",
        "", validate_sol.markdown(rows), "",
        f"Calibrated on these rows: measured = SOL / {fit.eta:.2f} + {fit.t0_ms:.2f} ms; each "
        f"model predicted by the fit of the others: |error| median {100 * s['median']:.0f}%, "
        f"90th percentile {100 * s['p90']:.0f}% (`llama-np sol --device local` prints it).",
        "", "![measured vs predicted](validation.png)",
    ])  # fmt: skip


def measure_batching(ctx: argparse.Namespace) -> dict:
    rows, probe = validate_sol.measure(ctx.probe, ctx.threads, True, ctx.quick, n=8, reps=3)
    return {"probe": dataclasses.asdict(probe), "rows": [dataclasses.asdict(r) for r in rows]}


def render_batching(data: dict, plots: Path) -> str:
    rows = rows_of(data)
    report.plot_batch(rows, plots / "batching.png", probe_of(data).machine)
    return validate_sol.batch_markdown(rows) + "\n\n![step time and tokens/s](batching.png)"


def measure_peers(ctx: argparse.Namespace) -> dict:
    import compare_peers

    # every engine stays loaded in its own process: with NumPy's four more, Qwen's engines
    # outgrew a 24 GiB machine (one was killed); bench --kernels numpy measures NumPy's
    rounds, kernels = (2, "numba-int16") if ctx.quick else (5, "numba-int16,numba-f32")
    return {m: compare_peers.run(m, ctx.threads, rounds, kernels)
            for m in (MODELS[:1] if ctx.quick else MODELS)}  # fmt: skip


BINDING = "llama-cpp-python, its Python binding"  # the peer of runs that name none


def render_peers(data: dict, plots: Path) -> str:
    import compare_peers

    out = []
    for model, d in data.items():
        out += [f"{model} ({d['file']}), {d['threads']} threads, {len(next(iter(d['rounds'].values())))} "
                f"interleaved rounds; llama.cpp: {d.get('llama_cpp', BINDING)}; ratios are "
                "medians of per-round ratios:", "",
                compare_peers.table(d["rounds"], d["bytes_per_token"]), ""]  # fmt: skip
    return "\n".join(out)


def measure_peers_batch(ctx: argparse.Namespace) -> dict:
    import peers_batch

    batches, rounds = ([4, 16], 2) if ctx.quick else ([4, 8, 16, 64], 3)
    formats = ["stored"] if ctx.quick else ["f32", "q8_0", "stored"]
    return {m: peers_batch.compare(m, ctx.threads, batches, formats, rounds, 16)
            for m in (MODELS[:1] if ctx.quick else MODELS)}  # fmt: skip


def render_peers_batch(data: dict, plots: Path) -> str:
    import peers_batch

    out = []
    for model, d in data.items():
        out += [f"{model} ({d['file']}), {d['threads']} threads, {d['steps']} timed steps per B; "
                f"llama.cpp: {d.get('llama_cpp', BINDING)}:",
                "", peers_batch.table(d), ""]  # fmt: skip
    return "\n".join(out)


def measure_serve(ctx: argparse.Namespace) -> dict:
    import peers_serve

    concurrency, rounds = ([1, 4], 1) if ctx.quick else ([1, 4, 16], 3)
    return {m: peers_serve.compare(m, ctx.threads, concurrency, rounds, 64, 32)
            for m in (MODELS[:1] if ctx.quick else MODELS)}  # fmt: skip


def render_serve(data: dict, plots: Path) -> str:
    import peers_serve

    out = []
    for model, d in data.items():
        out += [f"{model} ({d['file']}), {d['threads']} threads; each request {d['prompt']} "
                f"words of prompt, max_tokens {d['n']}, temperature 0; {d['rounds']} rounds "
                "per concurrency C, medians; the ratio: median of per-round ratios:", "",
                peers_serve.table(d), "", peers_serve.steps_line(d), ""]  # fmt: skip
    return "\n".join(out)


# one preset per family (llama-3.2-1b: the llama path beside them), synthetic weights;
# and the presets llama.cpp runs beside llama-np on files its converter made
FAMILY_PRESETS = ["llama-3.2-1b", "qwen3-0.6b", "gemma-3-1b", "phi-4-mini", "smollm3-3b",
                  "olmo-2-1b", "granite-3.3-2b"]  # fmt: skip
FAMILY_PEERS = ["qwen3-0.6b", "gemma-3-1b", "phi-4-mini"]


def measure_families(ctx: argparse.Namespace) -> dict:
    """Each family's preset at q8_0 and q4_0 (random weights), one sequence, held against
    its speed of light (the probe measured again beside it); and llama-np against llama.cpp
    on Q8_0 and Q4_K_M files of random weights at real shapes (scripts/families.py)."""
    import families

    presets = FAMILY_PRESETS[:2] if ctx.quick else FAMILY_PRESETS
    rows, probe = [], ctx.probe
    for preset in presets:
        sw = validate_sol.Sweep(f"synthetic:{preset}", "numba", ["q8_0", "q4_0"], (0,))
        for weights in sw.weights:
            settings = validate_sol.Settings(8, 16, (0,), 3)
            got, probe = validate_sol.sweep(sw, weights, settings, probe, ctx.threads)
            rows += got
    peers, batches = {}, [1, 16]
    for preset in FAMILY_PEERS[:1] if ctx.quick else FAMILY_PEERS:
        peers[preset] = families.compare(preset, 2 if ctx.quick else 3, batches, ctx.threads)
    return {"probe": dataclasses.asdict(probe), "rows": [dataclasses.asdict(r) for r in rows],
            "peers": peers}  # fmt: skip


def peer_tables(peers: dict) -> list[str]:
    """Per preset and file (families.compare's output): the one-sequence table against
    llama.cpp, then the batched one."""
    import compare_peers
    import peers_batch

    out = []
    for preset, files in peers.items():
        for kind, d in files.items():
            one = d["one"]
            peer = "; ".join(dict.fromkeys(x.get("llama_cpp", BINDING) for x in (one, d["batch"])))
            out += [f"{preset} {kind.upper()} ({one['file']}), {one['threads']} threads; "
                    f"llama.cpp: {peer}:", "",
                    compare_peers.table(one["rounds"], one["bytes_per_token"]), "",
                    peers_batch.table(d["batch"]), ""]  # fmt: skip
    return out


def render_families(data: dict, plots: Path) -> str:
    out = ["One sequence of each family's preset, random weights in q8_0 and q4_0 (`llama-np "
           "bench -m synthetic:PRESET --weights W -p 8 -n 16 -r 3`, compiled kernels, int16 x), "
           "held against its speed of light; llama-3.2-1b is the llama path beside them:", "",
           validate_sol.markdown(rows_of(data)), "",
           "Against llama.cpp on the same files (random weights at the preset's shape, made by "
           "llama.cpp's converter, Q4_K_M by its quantizer; `scripts/families.py`), llama-np "
           "as stored: one sequence (prefill of 128 tokens, decode), and batched decode:", ""]  # fmt: skip
    return "\n".join(out + peer_tables(data["peers"]))


# the hybrids beside the llama path; the depth sweep against a llama of the same width and
# depth; the files llama.cpp runs beside llama-np (scripts/peers_bench.py)
HYBRID_PRESETS = ["smollm2-360m", "qwen3.5-2b", "lfm2-1.2b", "gemma-4-e2b"]
HYBRID_DEPTHS, HYBRID_DEEP = (0, 16384), ["qwen3.5-2b", "smollm2-1.7b"]
HYBRID_PEERS = ["qwen3.5-0.8b", "qwen3.5-2b", "lfm2-1.2b", "gemma-4-e2b"]


def measure_hybrids(ctx: argparse.Namespace) -> dict:
    """The hybrids' presets (random weights, q8_0 and q4_0) one sequence at a time against
    their speed of light beside the llama path; decode at 16k keys against 0 for Qwen3.5-2B
    and a llama of its width and depth; llama-np against llama.cpp's llama-bench and
    llama-batched-bench on Q8_0 and Q4_K_M files at real shapes."""
    import families
    import peers_bench

    rows, deep, probe = [], [], ctx.probe
    settings = validate_sol.Settings(8, 16, (0,), 3)
    for preset in HYBRID_PRESETS[:2] if ctx.quick else HYBRID_PRESETS:
        sw = validate_sol.Sweep(f"synthetic:{preset}", "numba", ["q8_0", "q4_0"], (0,))
        for weights in sw.weights:
            got, probe = validate_sol.sweep(sw, weights, settings, probe, ctx.threads)
            rows += got
    for preset in HYBRID_DEEP:
        sw = validate_sol.Sweep(f"synthetic:{preset}", "numba", ["q8_0"], HYBRID_DEPTHS)
        got, probe = validate_sol.sweep(sw, "q8_0", validate_sol.Settings(8, 16, HYBRID_DEPTHS, 3),
                                        probe, ctx.threads)  # fmt: skip
        deep += got
    peers = {}
    for preset in HYBRID_PEERS[:1] if ctx.quick else HYBRID_PEERS:
        for kind, path in families.make(preset).items():
            peers[f"{preset} {kind}"] = peers_bench.compare(
                str(path), ctx.threads, 2, gen=32, batches=(1, 16), pp=32, tg=16
            )
    return {"probe": dataclasses.asdict(probe), "rows": [dataclasses.asdict(r) for r in rows],
            "deep": [dataclasses.asdict(r) for r in deep], "peers": peers}  # fmt: skip


def depth_ratios(rows: list[Row]) -> str:
    """Per model: decode at the deepest depth over decode at 0, measured and predicted."""
    out = ["| model | weights | ms/token at 0 | at 16384 | measured ratio | SOL ratio |",
           "|---|---|---:|---:|---:|---:|"]  # fmt: skip
    for model in dict.fromkeys(r.model for r in rows):
        at = {r.depth: r for r in rows if r.model == model}
        lo, hi = at[min(at)], at[max(at)]
        out.append(f"| {model} | {lo.weights} | {lo.decode_ms:.2f} | {hi.decode_ms:.2f} | "
                   f"{hi.decode_ms / lo.decode_ms:.2f} | {hi.sol_ms / lo.sol_ms:.2f} |")  # fmt: skip
    return "\n".join(out)


def render_hybrids(data: dict, plots: Path) -> str:
    import peers_bench

    deep = [Row(**r) for r in data["deep"]]
    out = ["One sequence of each hybrid's preset and Gemma 4 E2B's, random weights in q8_0 and "
           "q4_0 (`llama-np bench -m synthetic:PRESET --weights W -p 8 -n 16 -r 3`, compiled "
           "kernels), held against its speed of light; smollm2-360m is the llama path beside "
           "them:", "",
           validate_sol.markdown(rows_of(data)), "",
           "Decode at 16384 keys against decode at 0 (`--depth 0,16384`, q8_0): Qwen3.5-2B "
           "attends in one layer in four and keeps a fixed state in the others; SmolLM2-1.7B "
           "has its width and depth and attends in every layer:", "",
           validate_sol.markdown(deep), "", depth_ratios(deep), "",
           "Against llama.cpp's own tools on the same files (random weights at the preset's "
           "shape, made by llama.cpp's converter, Q4_K_M by its quantizer; "
           "`scripts/peers_bench.py FILE --rounds 2 -n 32 --batch 1,16 --pp 32 --tg 16`), medians of the rounds:",
           ""]  # fmt: skip
    for name, d in data["peers"].items():
        out += [f"{name} ({Path(d['model']).name}), {d['threads']} threads:", "",
                peers_bench.table(d), ""]  # fmt: skip
    return "\n".join(out)


MOE_PRESET, MOE_BATCHES = "olmoe-1b-7b", (1, 4, 16, 64)


def measure_moe(ctx: argparse.Namespace) -> dict:
    """A mixture of experts at its real shape, random weights in q8_0 and q4_0: decode
    steps of B = 1, 4, 16, 64 sequences held against the speed of light of the experts
    they read, the distinct experts a layer read beside the uniform-routing expectation;
    and llama-np against llama.cpp on Q8_0 and Q4_0 files its converter and quantizer
    made of random weights at that shape (scripts/families.py)."""
    import families

    batches = (1, 16) if ctx.quick else MOE_BATCHES
    sw = validate_sol.Sweep(f"synthetic:{MOE_PRESET}", "numba", ["q8_0", "q4_0"], (0,))
    rows, probe = [], ctx.probe
    for weights in sw.weights[-1:] if ctx.quick else sw.weights:
        settings = validate_sol.Settings(8, 12, (0,), 3, batch=batches)
        got, probe = validate_sol.sweep(sw, weights, settings, probe, ctx.threads)
        rows += got
    peers = families.compare(MOE_PRESET, 2 if ctx.quick else 3, [1, 4, 16], ctx.threads,
                             ("q8_0", "q4_0"))  # fmt: skip
    return {"probe": dataclasses.asdict(probe), "rows": [dataclasses.asdict(r) for r in rows],
            "peers": {MOE_PRESET: peers}}  # fmt: skip


def render_moe(data: dict, plots: Path) -> str:
    rows = rows_of(data)
    out = [f"{MOE_PRESET} (64 experts, 8 a token), random weights (`llama-np bench -m "
           f"synthetic:{MOE_PRESET} --weights W --batch 1,4,16,64 -n 12 -r 3`, compiled "
           "kernels): each row held against the speed of light of the bytes its steps read, "
           "the experts counted as the expectation under uniform routing, E (1 - (1 - k/E)^B); "
           "the last column the distinct experts a layer read per step, measured (mean), and "
           "that expectation:", "", validate_sol.batch_markdown(rows), "",
           "Against llama.cpp on the same files (random weights at the preset's shape, made by "
           "llama.cpp's converter, Q4_0 by its quantizer; `scripts/families.py --files "
           "q8_0,q4_0`), llama-np as stored:", ""]  # fmt: skip
    return "\n".join(out + peer_tables(data["peers"]))


PPL_TEXT = ROOT / "data" / "gpl-3.0.txt"


def measure_perplexity(ctx: argparse.Namespace) -> dict:
    from llama_np.api import load
    from llama_np.generation.perplexity import perplexity

    text = PPL_TEXT.read_text()
    chunks, out = (2 if ctx.quick else 6), []
    for model in MODELS[:1] if ctx.quick else MODELS:
        for weights in [None] if ctx.quick else [None, "q8_0", "q4_0"]:
            for kernels in ("numba-f32", "numba-int16", "numba-int8"):
                with load(model, weights=weights, kernels=kernels, threads=ctx.threads) as llm:
                    r = perplexity(llm, text, ctx=128, stepwise=True, chunks=chunks)
                out.append({"model": model, "weights": weights or "as stored",
                            "kernels": kernels, "ppl": r.ppl, "scored": r.scored})  # fmt: skip
    return {"text": PPL_TEXT.name, "ctx": 128, "chunks": chunks, "rows": out}


def render_perplexity(data: dict, plots: Path) -> str:
    lines = [f"Perplexity of {data['text']} (windows of {data['ctx']}, the first "
             f"{data['chunks']}, decode steps one token at a time, as generation runs them): "
             "x in float32, rounded to int16 and to int8 per block of 32 before the quantized "
             "products.", "", "| model | weights | f32 x | int16 x | int8 x | int16 / f32 | "
             "int8 / f32 |", "|---|---|---:|---:|---:|---:|---:|"]  # fmt: skip
    by = {(r["model"], r["weights"], r["kernels"]): r["ppl"] for r in data["rows"]}
    for model, weights in dict.fromkeys((r["model"], r["weights"]) for r in data["rows"]):
        f, i16, i8 = (by[model, weights, k] for k in ("numba-f32", "numba-int16", "numba-int8"))
        lines.append(f"| {model} | {weights} | {f:.4f} | {i16:.4f} | {i8:.4f} | "
                     f"{i16 / f:.5f} | {i8 / f:.5f} |")  # fmt: skip
    return "\n".join(lines)


def measure_published(ctx: argparse.Namespace) -> dict:
    rows = published.held()
    return {"rows": len(rows), "sources": len({h.m.source for h in rows})}


def render_published(data: dict, plots: Path) -> str:
    rows = list(published.held())
    published.plot(rows, plots / "published.png")
    return published.report(rows) + "\n\n![predicted vs measured](published.png)"


def measure_published_prefill(ctx: argparse.Namespace) -> dict:
    rows = published.held_prefill()
    return {"rows": len(rows), "sources": len({h.m.source for h in rows})}


def render_published_prefill(data: dict, plots: Path) -> str:
    rows = list(published.held_prefill())
    published.plot_prefill(rows, plots / "published-prefill.png")
    return (published.prefill_report(rows) + "\n\n![measured prompt speeds against the bound "
            "and the calibrated expectation](published-prefill.png)")  # fmt: skip


TITLES = {
    "probe": "Attainable bandwidth and arithmetic (`llama-np probe`)",
    "validation": "The speed of light against measured decode, one sequence",
    "batching": "Batches: where decode turns compute-bound",
    "peers": "Against llama.cpp and transformers, one sequence",
    "peers-batch": "Against llama.cpp, batched decode",
    "serve": "Serving over HTTP: `llama-np serve` against llama.cpp's `llama-server`",
    "families": "The families: each at its speed of light, and against llama.cpp",
    "hybrids": "The families of 2026: a fixed state beside a growing cache, a table read a row a layer",
    "moe": "A mixture of experts: the experts a step reads, measured and predicted",
    "perplexity": "What rounding x to integers costs",
    "published": "Published measurements of machines we do not have (`llama-np sol --published`)",
    "published-prefill": "Published prompt speeds against `llama-np sol --prompt` "
    "(`sol --published --prefill`)",
}


# --- the documents -----------------------------------------------------------------------


def render(results: dict, plots: Path = DOCS) -> str:
    """docs/results.md from the data; the plots drawn into `plots`."""
    parts = ["# Results", "", "Every figure here is regenerated by `scripts/results.sh` (see "
             "the README's \"Measure\"); each section names the CPU, date, commit and command "
             "that produced it. The data: `docs/results.json`."]  # fmt: skip
    for name in SECTIONS:
        if name in results:
            section = results[name]
            body = globals()[f"render_{name.replace('-', '_')}"](section["data"], plots)
            parts += ["", f"## {TITLES[name]}", "", stamp_line(section["stamp"]), "", body]
    return "\n".join(parts) + "\n"


def readme_block(results: dict) -> str:
    """The README's results table: a few figures, each with where it comes from."""
    lines = ["| figure | value | section of docs/results.md; measured (`scripts/results.sh`) |",
             "|---|---|---|"]  # fmt: skip

    def where(name: str, title: str) -> str:
        st = results[name]["stamp"]
        return f"{title}; {st['date']}, {st['commit']}, `--only {name}`"

    # one sequence against llama.cpp: the headline above the table states it
    if "peers-batch" in results:
        import peers_batch

        for model, d in results["peers-batch"]["data"].items():
            ours, theirs = d["pairs"][-1]
            b = d["batches"][-1]
            lines.append(f"| {model} as stored, B = {b}: tok/s llama-np / llama.cpp | "
                         f"{peers_batch.ratio(d, ours, theirs, b):.2f}x | "
                         f"{where('peers-batch', 'batched decode')} |")  # fmt: skip
    if "serve" in results:
        import peers_serve

        for model, d in results["serve"]["data"].items():
            c = d["concurrency"][-1]
            lines.append(f"| {model} as stored, {c} concurrent streams: aggregate tok/s, llama-np "
                         f"serve / {peers_serve.peer_of(d)} | {peers_serve.ratio(d, c):.2f}x | "
                         f"{where('serve', 'serving over HTTP')} |")  # fmt: skip
    if "validation" in results:
        rows = rows_of(results["validation"]["data"])
        compiled = [r for r in rows if r.kernels.startswith("numba")]
        ratios = [r.measured_over_sol for r in compiled]
        lines.append(f"| measured / speed of light, compiled kernels, {len(ratios)} rows | "
                     f"median {statistics.median(ratios):.2f} ({min(ratios):.2f}-"
                     f"{max(ratios):.2f}); {beaten(compiled)} | "
                     f"{where('validation', 'one sequence')} |")  # fmt: skip
    if "batching" in results:
        rows = rows_of(results["batching"]["data"])
        ratios = [r.measured_over_sol for r in rows]
        widest = [r for r in rows if r.batch == max(x.batch for x in rows) and r.depth == 0]
        mfus = ", ".join(f"{r.model} {r.weights} {report.mfu(r)}" for r in widest)
        lines.append(f"| batch sweep, {len(rows)} rows: measured / speed of light; MFU % at B = "
                     f"{widest[0].batch} | median {statistics.median(ratios):.2f} "
                     f"({min(ratios):.2f}-{max(ratios):.2f}), {beaten(rows)}; {mfus} | "
                     f"{where('batching', 'batches')} |")  # fmt: skip
    if "moe" in results:
        rows = rows_of(results["moe"]["data"])
        one = [f"{r.weights} {r.measured_over_sol:.2f}" for r in rows if r.batch == 1]
        wide = max(r.batch for r in rows)
        spread = [f"{r.weights} {r.experts:.1f} / {r.sol_experts:.1f}" for r in rows
                  if r.batch == wide]  # fmt: skip
        lines.append(f"| {MOE_PRESET}, random weights: measured / speed of light at B = 1; "
                     f"distinct experts a layer read, measured / expected, at B = {wide} | "
                     f"{', '.join(one)}; {', '.join(spread)} | "
                     f"{where('moe', 'a mixture of experts')} |")  # fmt: skip
    if "hybrids" in results:
        lines += hybrid_lines(results["hybrids"]["data"], where("hybrids", "the families of 2026"))
    if "published" in results:
        held = list(published.held())
        s = calibrate.spread(calibrate.leave_one_source_out(published.points(held)))
        reached = statistics.median(h.share for h in held)
        lines.append(f"| published: fraction of the bound reached, {len(held)} rows | median "
                     f"{reached:.2f}; calibrated, the error on held-out sources: median "
                     f"{100 * s['median']:.0f}%, p90 {100 * s['p90']:.0f}% | "
                     f"{where('published', 'published')} |")  # fmt: skip
    if "published-prefill" in results:
        lines.append(prefill_line(where("published-prefill", "published prompt speeds")))
    return "\n".join(lines) + "\n\n" + measured_on(results)


def prefill_line(where: str) -> str:
    """The README's row of the published prompt speeds: the bound beaten by how many, the
    calibrated expectation's error on held-out sources."""
    held = list(published.held_prefill())
    s = prefill_spread(prefill_loso([h.point() for h in held]))
    return (f"| published prompt speeds, {len(held)} rows: `sol --prompt`'s bound; calibrated, "
            f"the error on held-out sources | beaten by {len(published.beaten(held))}; median "
            f"{100 * s['median']:.0f}%, p80 {100 * s['p80']:.0f}% | {where} |")  # fmt: skip


def hybrid_lines(data: dict, where: str) -> list[str]:
    """The README's rows of the hybrids: Qwen3.5-2B at 16k keys against 0, measured and
    predicted; llama-np / llama.cpp on each file at pp, tg and B = 16."""
    deep = [Row(**r) for r in data["deep"] if "qwen3.5" in r["model"]]
    lo, hi = min(deep, key=lambda r: r.depth), max(deep, key=lambda r: r.depth)
    out = [f"| qwen3.5-2b q8_0, random weights: decode at {hi.depth} keys / at 0, measured and "
           f"speed of light | {hi.decode_ms / lo.decode_ms:.2f}, {hi.sol_ms / lo.sol_ms:.2f} | "
           f"{where} |"]  # fmt: skip
    by_model: dict[str, list[str]] = {}
    for name, d in data["peers"].items():
        preset, kind = name.split(" ")
        m = d["medians"]
        ratios = "/".join(f"{m[f'llama-np {w}'] / m[f'llama.cpp {w}']:.2f}"
                          for w in ("pp", "tg", "B=16"))  # fmt: skip
        by_model.setdefault(preset, []).append(f"{kind.upper()} {ratios}")
    d = next(iter(data["peers"].values()))
    cells = "; ".join(f"{preset} {', '.join(c)}" for preset, c in by_model.items())
    out.append(f"| the 2026 families' files, random weights: tok/s llama-np / llama.cpp, "
               f"pp{d['prompt']}/tg{d['gen']}/B = 16 | {cells} | {where} |")  # fmt: skip
    return out


def measured_on(results: dict) -> str:
    """The CPU of the table's figures, and, when its sections were measured on several,
    which sections on which (the `--only` that measures them again)."""
    shown = [n for n in ("peers", "peers-batch", "serve", "validation", "batching", "moe",
                         "hybrids")
             if n in results]  # fmt: skip
    by_cpu: dict[str, list[str]] = {}
    for name in shown:
        by_cpu.setdefault(results[name]["stamp"]["cpu"], []).append(name)
    if len(by_cpu) <= 1:
        return "".join(f"Measured on {cpu}." for cpu in by_cpu)
    return (
        "Measured on "
        + "; ".join(f"{cpu} (`--only {','.join(names)}`)" for cpu, names in by_cpu.items())
        + "."
    )


def as_stored(d: dict) -> tuple[str, str] | None:
    """The peers run's llama-np (int16 x) and llama.cpp engines on the file as stored."""
    ours = next((n for n in d["rounds"] if n.startswith("llama-np numba-int16")
                 and n.endswith("(as stored)")), None)  # fmt: skip
    theirs = next((n for n in d["rounds"] if n.startswith("llama.cpp")
                   and n.endswith("(as stored)")), None)  # fmt: skip
    return (ours, theirs) if ours and theirs else None


def headline(results: dict) -> str:
    """The README's headline sentence: llama-np against llama.cpp on the files as stored."""
    if "peers" not in results:
        return "(no figures yet: `scripts/results.sh` measures them)"
    section = results["peers"]
    parts = []
    for model, d in section["data"].items():
        if pair := as_stored(d):
            ours, theirs = pair
            ms = [statistics.median(r[1] for r in d["rounds"][n]) for n in pair]
            ratio = statistics.median(a[1] / b[1] for a, b in zip(
                d["rounds"][ours], d["rounds"][theirs], strict=True))  # fmt: skip
            parts.append(f"{model} from its {d['file'].split('.')[-2]} file in {ms[0]:.1f} "
                         f"ms/token where llama.cpp takes {ms[1]:.1f} ({ratio:.2f}x the time, "
                         "the median of per-round ratios)")  # fmt: skip
    s = section["stamp"]
    return (
        f"On {s['cpu']}, llama-np decodes {' and '.join(parts)}, in the same run "
        f"({s['date']}, commit {s['commit']}, `{s['command']}`; more in the Results below)."
    )


def replace_block(text: str, name: str, body: str) -> str:
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    if begin not in text or end not in text:
        return text
    head, rest = text.split(begin, 1)
    return head + begin + "\n" + body + "\n" + end + rest.split(end, 1)[1]


def write(results: dict) -> None:
    (DOCS / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    (DOCS / "results.md").write_text(render(results))
    readme = (ROOT / "README.md").read_text()
    readme = replace_block(readme, "headline", headline(results))
    readme = replace_block(readme, "results", readme_block(results))
    (ROOT / "README.md").write_text(readme)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--quick", action="store_true", help="a short version of every section")
    ap.add_argument("--only", help=f"comma-separated sections: {','.join(SECTIONS)}")
    ap.add_argument("--render", action="store_true", help="only redraw from docs/results.json")
    ap.add_argument("-t", "--threads", type=int, default=None)
    args = ap.parse_args()
    path = DOCS / "results.json"
    results = json.loads(path.read_text()) if path.exists() else {}
    if not args.render:
        only = args.only.split(",") if args.only else SECTIONS
        if unknown := set(only) - set(SECTIONS):
            ap.error(f"unknown sections {sorted(unknown)} (known: {', '.join(SECTIONS)})")
        args.threads = args.threads or usable_cores()
        args.probe = None
        flags = (" --quick" if args.quick else "") + (f" --only {args.only}" if args.only else "")
        for name in SECTIONS:
            if name not in only:
                continue
            if args.probe is None and name not in ("probe", "published"):
                measure_probe(args)  # every measurement of the run is held against one probe
            print(f"results: {name}", file=sys.stderr)
            data = globals()[f"measure_{name.replace('-', '_')}"](args)
            results[name] = {"stamp": stamp(f"scripts/results.sh{flags}"), "data": data}
            write(results)  # after each section: a later failure keeps what was measured
    write(results)
    print(f"results: wrote {path}, docs/results.md and the README's results", file=sys.stderr)


if __name__ == "__main__":
    main()
