"""The kernels' disk cache shared by processes (quant.compiled.jit.LockedIndex): two
processes saving specializations of one function at once keep every one, each under its
own data. numba's own IndexDataCacheFile, run the same way, lost about a third of 600 and
named another's data for about 20 (so every later process that loaded one crashed)."""

from __future__ import annotations

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
