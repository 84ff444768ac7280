"""Two runs of `llama-np bench --json` side by side (`bench --compare OLD NEW`, or a run
with `--baseline OLD`), as llama.cpp's compare-llama-bench.py puts two llama-bench runs:
rows matched by model, weights, KV format, window, depth, batch and threads; per row both
times with their spreads, the ratio, whether the difference is beyond the runs' own spread
(their min-max ranges do not overlap), and which side is nearer its speed of light."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

KEY = ("model", "weights", "head", "kv", "window", "depth", "batch")


class CompareError(ValueError):
    """A file that is not a run of `bench --json`."""


@dataclass
class Run:
    path: str
    meta: dict
    rows: list[dict]

    def key(self, row: dict) -> tuple:
        return (*(row.get(k) for k in KEY), self.meta.get("threads"))

    def stamp(self) -> str:
        m = self.meta
        model = m.get("model") or {}
        ident = f"sha256 {model['sha256'][:12]}" if model.get("sha256") else model.get("synthetic")
        parts = [m.get("date"), f"commit {m['commit']}" if m.get("commit") else None,
                 m.get("cpu"), f"{m.get('threads')} threads", ident]  # fmt: skip
        return f"{self.path}: " + ", ".join(str(p) for p in parts if p)


def load_run(path: str | Path) -> Run:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        raise CompareError(f"cannot read {path}: {e}") from None
    except json.JSONDecodeError as e:
        raise CompareError(f"{path}: not JSON ({e})") from None
    rows = data.get("rows") if isinstance(data, dict) else None
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise CompareError(f"{path}: not the output of `llama-np bench --json` (no rows)")
    needed = {*KEY, "decode_ms", "decode_ms_min", "decode_ms_max"}
    for r in rows:
        if missing := needed - set(r):
            raise CompareError(f"{path}: a row lacks {', '.join(sorted(missing))}")
    return Run(str(path), {k: v for k, v in data.items() if k != "rows"}, rows)


def verdict(old: dict, new: dict) -> str:
    """ "faster" or "slower" when NEW's range of repetitions lies wholly below or above
    OLD's; else "within spread" (the difference is not beyond the runs' own noise)."""
    if new["decode_ms_max"] < old["decode_ms_min"]:
        return "faster"
    if new["decode_ms_min"] > old["decode_ms_max"]:
        return "slower"
    return "within spread"


def nearer(old: dict, new: dict) -> str:
    a, b = old.get("measured_over_sol"), new.get("measured_over_sol")
    if a is None or b is None:
        return "-"
    return "same" if abs(a - b) < 0.005 else ("new" if b < a else "old")


def table(old: Run, new: Run) -> str:
    """The matched rows as a markdown table, then the rows only one run has, and what
    differs between the runs' machines or model files."""
    by_key = {old.key(r): r for r in old.rows}
    head = ["model", "weights", "kv", "depth", "B", "old ms", "new ms", "new/old",
            "difference", "old / SOL", "new / SOL", "nearer SOL"]  # fmt: skip
    lines = [f"old: {old.stamp()}", f"new: {new.stamp()}", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]  # fmt: skip
    matched = set()
    for r in new.rows:
        o = by_key.get(new.key(r))
        if o is None:
            continue
        matched.add(new.key(r))
        cells = [r["model"], r["weights"], r["kv"], str(r["depth"]), str(r["batch"]),
                 spread(o), spread(r), f"{r['decode_ms'] / o['decode_ms']:.3f}", verdict(o, r),
                 sol(o), sol(r), nearer(o, r)]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    if not matched:
        lines.append("| " + " | ".join(["(no row of one run matches a row of the other)"]
                                       + [""] * (len(head) - 1)) + " |")  # fmt: skip
    for run, other in ((old, new), (new, old)):
        keys = {other.key(r) for r in other.rows}
        alone = [r for r in run.rows if run.key(r) not in keys]
        if alone:
            lines.append(f"\nonly in {run.path}: " + "; ".join(
                f"{r['model']} {r['weights']} kv {r['kv']} depth {r['depth']} B {r['batch']}"
                for r in alone))  # fmt: skip
    lines += differences(old, new)
    return "\n".join(lines)


def spread(r: dict) -> str:
    return f"{r['decode_ms']:.2f} ({r['decode_ms_min']:.2f}-{r['decode_ms_max']:.2f})"


def sol(r: dict) -> str:
    v = r.get("measured_over_sol")
    return "-" if v is None else f"{v:.2f}"


def differences(old: Run, new: Run) -> list[str]:
    """What makes the two runs less comparable than they look: another CPU, another file."""
    out = []
    for what, get in (("CPU", lambda m: m.get("cpu")),
                      ("model file", lambda m: (m.get("model") or {}).get("sha256"))):  # fmt: skip
        a, b = get(old.meta), get(new.meta)
        if a and b and a != b:
            out.append(f"note: the runs differ in {what}: {a} / {b}")
    return ["", *out] if out else []
