"""Long runs, interruptions, hostile templates, absurd sizes: clean ends only."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

import llama_np
from bench.runner import rss_mb
from llama_arch import config_from_hf
from llama_np.errors import LlamaNpError, UsageError
from llama_np.generation.chat import render_chat
from llama_np.generation.generate import Stats
from llama_np.model.kvcache import KVCache


def test_ten_thousand_tokens_under_a_window_keep_memory_flat(gqa_dir):
    """10,000 generated tokens with --window 256: resident memory stops growing once the
    ring is full (measured at 1,000 and 10,000 tokens)."""
    llm = llama_np.load(gqa_dir[0])
    rss, stats = {}, Stats()
    for _ in llm.stream("a", n_predict=10_000, temp=0.9, seed=1, window=256, stats=stats):
        if len(stats.generated) in (1_000, 10_000) and len(stats.generated) not in rss:
            rss[len(stats.generated)] = rss_mb()
    rss.setdefault(len(stats.generated), rss_mb())  # the last piece may come after the loop
    assert set(rss) == {1_000, 10_000}
    print(f"RSS at 1k tokens {rss[1_000]:.1f} MB, at 10k {rss[10_000]:.1f} MB")
    assert rss[10_000] - rss[1_000] < 4.0


def _start(args: list[str]) -> subprocess.Popen:
    """The CLI as a terminal's foreground job runs it: SIGINT at its default, whatever this
    process inherited (a suite started in the background, `cmd &` without job control,
    ignores SIGINT, and so would every child: Python then never raises KeyboardInterrupt)."""
    return subprocess.Popen(
        [sys.executable, "-m", "llama_np", *args],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip


def _interrupt_after_output(p: subprocess.Popen, min_bytes: int = 20) -> tuple[bytes, bytes]:
    got = b""
    while len(got) < min_bytes:
        chunk = os.read(p.stdout.fileno(), 4096)
        assert chunk, p.stderr.read().decode()
        got += chunk
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    return got + out, err


def test_ctrl_c_during_generate_flushes_and_exits_130(gqa_dir):
    p = _start(["generate", "-m", str(gqa_dir[0]), "-p", "hello", "-n", "100000", "--window", "64"])
    out, err = _interrupt_after_output(p)
    assert p.returncode == 130
    assert len(out) >= 20  # the text produced so far reached stdout
    assert b"Traceback" not in err and err.strip().splitlines()[-1] == b"llama-np: interrupted"


def test_ctrl_c_during_chat_exits_130(smollm2_path):
    p = _start(["chat", "-m", str(smollm2_path), "-n", "400", "--temp", "0.8", "--seed", "1"])
    p.stdin.write(b"Tell me a very long story about the sea.\n")
    p.stdin.flush()
    out, err = _interrupt_after_output(p, min_bytes=5)
    assert p.returncode == 130
    assert out and b"Traceback" not in err


def test_ctrl_c_leaves_no_kernel_worker_behind(gqa_dir):
    p = _start(["generate", "-m", str(gqa_dir[0]), "-p", "x", "-n", "100000", "--window", "32"])
    _interrupt_after_output(p)
    time.sleep(0.5)
    children = subprocess.run(["pgrep", "-P", str(p.pid)], capture_output=True, text=True).stdout
    assert children.strip() == ""


def test_templates_run_sandboxed():
    hostile = "{{ ''.__class__.__mro__[1].__subclasses__() }}"
    with pytest.raises(LlamaNpError, match="chat template failed"):
        render_chat(hostile, [{"role": "user", "content": "hi"}], "", "")
    with pytest.raises(LlamaNpError, match="chat template failed"):
        render_chat("{{ raise_exception('no system role') }}", [], "", "")


def test_a_kv_cache_larger_than_memory_is_refused_before_allocation():
    c = config_from_hf({"model_type": "llama", "hidden_size": 8192, "num_hidden_layers": 80,
                        "num_attention_heads": 64, "intermediate_size": 8, "vocab_size": 8,
                        "max_position_embeddings": 10_000_000})  # fmt: skip
    with pytest.raises(UsageError, match="lower -c/--ctx-size or set --window"):
        KVCache(c, 10_000_000)


def cpu_seconds(pid: int) -> float:
    """CPU time of every thread of a process so far, from the scheduler (ns resolution)."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                total += int(f.read().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            pass  # a thread that just ended
    return total / 1e9


@pytest.mark.skipif(not os.path.exists("/proc/self/schedstat"), reason="needs Linux schedstat")
@pytest.mark.parametrize("kernels", ["numpy", "numba"])
def test_an_idle_chat_gives_its_cores_back(smollm2_path, kernels):
    """Between chat turns no kernel thread, OpenMP's, OpenBLAS's or the NumPy backend's
    pool, keeps spinning: over a second of waiting for input the process uses < 20 ms of CPU."""
    args = ["chat", "-m", str(smollm2_path), "-n", "16", "--temp", "0", "--kernels", kernels, "-v"]
    p = _start(args)
    try:
        p.stdin.write(b"Tell me a story about a llama.\n")
        p.stdin.flush()
        while b"stop:" not in (line := p.stderr.readline()):  # the reply's summary line
            assert line, "the chat ended"
        time.sleep(0.1)  # what spins may spin a few ms after its last job
        before = cpu_seconds(p.pid) + sum(cpu_seconds(c) for c in children(p.pid))
        time.sleep(1.0)
        after = cpu_seconds(p.pid) + sum(cpu_seconds(c) for c in children(p.pid))
        assert after - before < 0.02, f"{1e3 * (after - before):.1f} ms of CPU while idle"
    finally:
        p.stdin.close()
        p.wait(timeout=60)
        p.stdout.close()
        p.stderr.close()


def children(pid: int) -> list[int]:
    """Processes forked by `pid`: none today (the NumPy backend's process team is gone),
    counted so that a helper process that spins could not hide."""
    out = []
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                out += [int(c) for c in f.read().split()]
        except FileNotFoundError:
            pass
    return out
