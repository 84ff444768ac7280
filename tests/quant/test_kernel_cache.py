"""The kernels' disk cache shared by processes (quant.compiled.jit.LockedIndex): two
processes saving specializations of one function at once keep every one, each under its
own data. numba's own IndexDataCacheFile, run the same way, lost about a third of 600 and
named another's data for about 20 (so every later process that loaded one crashed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from quant.compiled import jit
from quant.compiled.jit import LockedIndex

ROOT = Path(__file__).resolve().parents[2]
SAVES = 300

WORKER = f"""
import os, sys, time
from quant.compiled.jit import LockedIndex
cache = LockedIndex(cache_path=sys.argv[1], filename_base="k", source_stamp=(1.0, 1))
open(os.path.join(sys.argv[1], "ready-" + sys.argv[2]), "w").close()
while not os.path.exists(os.path.join(sys.argv[1], "go")):
    time.sleep(0.001)
for i in range({SAVES}):
    cache.save((sys.argv[2], i), (sys.argv[2], i))
"""


def test_processes_saving_at_once_keep_every_specialization_under_its_own_data(tmp_path):
    workers = [
        subprocess.Popen([sys.executable, "-c", WORKER, str(tmp_path), name], cwd=ROOT)
        for name in ("a", "b")
    ]
    waited = time.monotonic()
    while not all((tmp_path / f"ready-{name}").exists() for name in ("a", "b")):
        assert time.monotonic() - waited < 120 and all(w.poll() is None for w in workers)
        time.sleep(0.01)
    (tmp_path / "go").touch()  # both imported and waiting: they start together
    assert [w.wait(timeout=120) for w in workers] == [0, 0]
    cache = LockedIndex(cache_path=str(tmp_path), filename_base="k", source_stamp=(1.0, 1))
    index = cache._load_index()
    assert sorted(index) == sorted((name, i) for name in ("a", "b") for i in range(SAVES))
    assert all(cache.load(key) == key for key in index)


def test_a_file_system_without_locks_saves_and_loads_as_numba_does(tmp_path, monkeypatch):
    def refused(f, mode):
        raise OSError(37, "No locks available")

    monkeypatch.setattr(jit.fcntl, "flock", refused)
    cache = LockedIndex(cache_path=str(tmp_path), filename_base="k", source_stamp=(1.0, 1))
    cache.save(("a", 1), "machine code")
    assert cache.load(("a", 1)) == "machine code"
    assert cache.load(("a", 2)) is None


CACHED_WHERE = """
import importlib, json, pkgutil, sys
import numba
import quant.compiled
from quant.compiled.jit import cache_folder
out = {}
for m in pkgutil.walk_packages(quant.compiled.__path__, "quant.compiled."):
    module = importlib.import_module(m.name)
    for name, d in vars(module).items():
        path = getattr(getattr(d, "_cache", None), "_cache_path", None)
        if isinstance(d, numba.core.dispatcher.Dispatcher) and path and d.__module__ == m.name:
            out[f"{m.name}.{name}"] = path
print(json.dumps({"folder": str(cache_folder()), "kernels": out}))
"""


def test_every_kernel_is_cached_in_the_project_folder():
    """Each module of quant.compiled that defines kernels is imported inside kernel_cache
    (quant/compiled/__init__.py), so its kernels are cached under the key of every source
    of the package. One imported later by its first user (quant.compiled.experts, by the
    model's ops, was) cached beside its source under numba's key of its own file, and kept
    the machine code of the helpers it inlines after they changed: the mixture of experts'
    step read K-quant blocks in a layout they no longer had."""
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    r = subprocess.run([sys.executable, "-c", CACHED_WHERE], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert len(got["kernels"]) > 50
    elsewhere = {k: p for k, p in got["kernels"].items() if not p.startswith(got["folder"])}
    assert not elsewhere, elsewhere
