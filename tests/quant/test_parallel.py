"""The kernel team: processes that split rows give the one-process results."""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest

from quant import FORMATS, QuantError, parallel

pytestmark = pytest.mark.skipif(not parallel.supported(), reason="the team runs on x86-64 only")


@pytest.fixture
def weights():
    rng = np.random.default_rng(0)
    specs = [("f32", 576), ("q8_0", 192), ("q4_0", 1541), ("q4_1", 96), ("bf16", 300), ("f16", 50)]
    return [
        FORMATS[f].from_float(rng.standard_normal((n, 576)).astype(np.float32)) for f, n in specs
    ]


@pytest.fixture
def team(weights):
    with_team = parallel.start(weights, 2)
    yield with_team
    with_team.close()


def test_team_matvec_and_matmul_equal_one_process(weights, team):
    x = np.random.default_rng(1).standard_normal((7, 576)).astype(np.float32)
    solo = parallel.Solo()
    alone_v, alone_m = solo.matvecs(weights, x[0]), solo.matmuls(weights, x)
    team_v, team_m = team.matvecs(weights, x[0]), team.matmuls(weights, x)
    for a, b in zip(alone_v + alone_m, team_v + team_m, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-5)
    assert team.ranks == 2 and team.label == "numpy, 2 processes"


def test_one_rank_is_no_team(weights):
    assert isinstance(parallel.start(weights, 1), parallel.Solo)


def test_cuts_are_balanced_at_allowed_boundaries():
    assert parallel.balanced_cuts([0, 100, 200, 300, 400], 2) == [(0, 200), (200, 400)]
    assert parallel.balanced_cuts([0, 10], 3) == [(0, 0), (0, 10), (10, 10)]


def test_a_dead_worker_is_reported_and_the_kernels_go_on(weights, team):
    x = np.ones(576, np.float32)
    os.kill(team.pids[0], signal.SIGKILL)
    with pytest.raises(QuantError, match="died"):
        for _ in range(10**7):  # the check runs every so many spins
            team.matvecs(weights, x)
    assert not team.covers(weights)  # stopped: the kernels run in this process
    np.testing.assert_allclose(team.matvecs(weights[:1], x)[0], weights[0].w @ x, rtol=1e-5)


def test_close_reaps_the_workers(weights):
    team = parallel.start(weights, 3)
    pids = list(team.pids)
    assert len(pids) == 2
    team.close()
    for pid in pids:
        with pytest.raises(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)


def test_close_returns_its_pipes_and_calls_back(weights):
    fds = set(os.listdir("/proc/self/fd"))
    called = []
    team = parallel.start(weights, 3, on_close=lambda: called.append(1))
    assert len(set(os.listdir("/proc/self/fd")) - fds) == 4  # a pipe per worker
    team.close()
    team.close()  # once
    assert set(os.listdir("/proc/self/fd")) <= fds and called == [1]


def test_more_ranks_than_a_team_holds_gives_the_largest_team(weights):
    team = parallel.start(weights, parallel.MAX_RANKS + 5)
    try:
        assert team.ranks == parallel.MAX_RANKS
    finally:
        team.close()


def test_the_backend_gives_blas_its_threads_back(weights):
    from threadpoolctl import threadpool_info

    from quant.backends import numpy_backend

    def blas_threads():
        return [p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"]

    before = blas_threads()
    for fmt_weights in (weights, weights[:1]):  # a team (BLAS 1), f32 alone (BLAS 2)
        workers = numpy_backend().start(fmt_weights, 2)
        assert blas_threads() == [1 if workers.ranks > 1 else 2] * len(before)
        workers.close()
        assert blas_threads() == before
