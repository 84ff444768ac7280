"""Compiling before anything is timed: the notice a first run shows, and the warm-up that
keeps compile time out of every figure."""

from __future__ import annotations

import io

import numpy as np

import llama_np
from llama_np.model.warmup import CompileNotice


class FiresAtOnce:
    """A stand-in for threading.Timer that fires when started: the compile took long."""

    def __init__(self, seconds: float, fn) -> None:
        self.fn, self.daemon = fn, False

    def start(self) -> None:
        self.fn()

    def cancel(self) -> None:
        pass


def test_a_slow_compile_says_so_and_counts_its_stages():
    out = io.StringIO()
    notice = CompileNotice(3, "/cache/kernels", timer=FiresAtOnce, out=out)
    with notice.phase():
        for stage in ("f32", "q8_0", "a prompt"):
            notice.stage(stage)
    notice.close()
    text = out.getvalue()
    assert "compiling the kernels for this CPU (once" in text
    assert "later runs load them from /cache/kernels" in text
    assert "3/3" in text and "kernels compiled in" in text


def test_a_warm_cache_says_nothing():
    out = io.StringIO()
    notice = CompileNotice(2, timer=lambda s, fn: FiresAtOnce(s, lambda: None), out=out)
    with notice.phase():
        notice.stage("f32")
    notice.close()
    assert out.getvalue() == ""
    quick = CompileNotice(2, out=out)  # the real timer, a phase far shorter than a second
    with quick.phase():
        quick.stage("f32")
    quick.close()
    assert out.getvalue() == ""


def test_load_warms_up_and_leaves_the_meter_alone(gqa_dir):
    """The compiled paths a generation takes ran before load returned (a prompt, a decode
    step on an f32 cache): nothing timed later compiles, and the meter counted none of it."""
    with llama_np.load(gqa_dir[0], kernels="numba") as llm:
        m = llm.model.meter
        assert "f32" in llm.model._warm
        assert (m.last, m.decode_steps, m.decode_bytes_read) == (None, 0, 0)
        llm.model.warm_up("f16", [3])
        assert {"f16", ("f16", 3)} <= llm.model._warm and m.decode_steps == 0
        cache = llm.new_cache(8)
        llm.model.forward(np.array([1, 2]), cache)
        llm.model.forward(np.array([3]), cache)
        assert m.decode_steps == 1 and m.last.n_tokens == 1
