"""The kernel team: processes that split rows give the one-process results."""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest

from quant import FORMATS, QuantError, matmuls, matvecs, parallel

pytestmark = pytest.mark.skipif(not parallel.supported(), reason="the team runs on x86-64 only")


@pytest.fixture
def weights():
    parallel.stop()  # a model loaded by an earlier test leaves its team running
    rng = np.random.default_rng(0)
    specs = [("f32", 576), ("q8_0", 192), ("q4_0", 1541), ("q4_1", 96), ("bf16", 300), ("f16", 50)]
    ws = [FORMATS[f].from_float(rng.standard_normal((n, 576)).astype(np.float32)) for f, n in specs]
    yield ws
    parallel.stop()


def local(fn, ws, x):
    assert parallel.active() == 1
    return fn(ws, x)


def test_team_matvec_and_matmul_equal_one_process(weights):
    x = np.random.default_rng(1).standard_normal((7, 576)).astype(np.float32)
    alone_v, alone_m = local(matvecs, weights, x[0]), local(matmuls, weights, x)
    assert parallel.start(weights, 2)
    team_v, team_m = matvecs(weights, x[0]), matmuls(weights, x)
    for a, b in zip(alone_v + alone_m, team_v + team_m, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-5)
    assert parallel.active() == 2


def test_cuts_are_balanced_at_allowed_boundaries():
    assert parallel.balanced_cuts([0, 100, 200, 300, 400], 2) == [(0, 200), (200, 400)]
    assert parallel.balanced_cuts([0, 10], 3) == [(0, 0), (0, 10), (10, 10)]


def test_a_dead_worker_is_reported_and_the_kernels_go_on(weights):
    x = np.ones(576, np.float32)
    parallel.start(weights, 2)
    os.kill(parallel._team.pids[0], signal.SIGKILL)
    with pytest.raises(QuantError, match="died"):
        for _ in range(10**7):  # the check runs every so many spins
            matvecs(weights, x)
    assert parallel.active() == 1
    np.testing.assert_allclose(matvecs(weights[:1], x)[0], weights[0].w @ x, rtol=1e-5)


def test_stop_reaps_the_workers(weights):
    parallel.start(weights, 3)
    pids = list(parallel._team.pids)
    assert len(pids) == 2
    parallel.stop()
    for pid in pids:
        with pytest.raises(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
