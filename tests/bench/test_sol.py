"""The speed-of-light model: parameter counts, bytes, FLOPs, devices."""

from __future__ import annotations

import json

import pytest

from bench.devices import DeviceError, get_device, load_devices
from bench.sol import estimate
from llama_arch import PRESETS, Config

# Published parameter counts (model cards / papers), to the precision they give.
PUBLISHED = {
    "llama-7b": 6.74e9, "llama-13b": 13.02e9, "llama-33b": 32.53e9, "llama-65b": 65.29e9,
    "llama-2-70b": 68.98e9, "llama-3-8b": 8.03e9, "llama-3-70b": 70.55e9, "mistral-7b": 7.24e9,
    "mixtral-8x7b": 46.70e9, "tinyllama-1.1b": 1.10e9, "smollm2-135m": 134.5e6,
    "smollm2-360m": 361.8e6, "smollm2-1.7b": 1.711e9, "olmoe-1b-7b": 6.92e9,
    "qwen3-30b-a3b": 30.5e9, "granite-3.1-3b-a800m": 3.30e9,
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_preset_parameter_counts_match_published(name):
    assert estimate(PRESETS[name]).params_total == pytest.approx(PUBLISHED[name], rel=2e-3)


def test_mixture_of_experts_reads_only_active_experts():
    e = estimate(PRESETS["mixtral-8x7b"])
    # 12.9B active as published, which counts the whole embedding table; we read one row
    assert e.params_active + 32000 * 4096 - 4096 == pytest.approx(12.88e9, rel=2e-3)
    dense = Config("llama", 4096, 32, 32, 8, 128, 14336 * 2, 32000)  # 2 experts' worth
    assert e.reads["mlp_weights"] > estimate(dense).reads["mlp_weights"]  # plus the router


def test_qwen2_biases_and_tied_head_count():
    qwen = Config("qwen2", 896, 24, 14, 2, 64, 4864, 151936, tie_embeddings=True, qkv_bias=True)
    assert estimate(qwen).params_total == pytest.approx(494e6, rel=5e-3)  # Qwen2-0.5B


def test_bytes_per_token_follow_the_formats_own_sizes():
    s = PRESETS["llama-2-7b"]
    f32, q8, q4 = (estimate(s, fmt, engine=False).weight_bytes for fmt in ("f32", "q8_0", "q4_0"))
    assert q8 / f32 == pytest.approx(8.5 / 32, rel=1e-3)
    assert q4 / f32 == pytest.approx(4.5 / 32, rel=1e-3)
    # in llama-np's own memory the scales are float32: q4_0 takes 5 bits per weight
    assert estimate(s, "q4_0").weight_bytes / f32 == pytest.approx(5.0 / 32, rel=1e-3)


def test_kv_bytes_grow_with_position_until_the_window():
    s = PRESETS["mistral-7b"]  # window 4096
    kv = [estimate(s, pos=p).kv_bytes for p in (0, 1023, 4095, 10000)]
    per_key = 32 * 2 * 8 * 128 * 4  # layers x (K, V) x kv heads x head_dim x float32
    assert kv == [per_key, 1024 * per_key, 4096 * per_key, 4096 * per_key]


def test_flops_are_two_per_weight_plus_attention():
    s = PRESETS["llama-2-7b"]
    e0, e1 = estimate(s, pos=0), estimate(s, pos=999)
    assert e1.flops - e0.flops == 32 * 4 * 32 * 128 * 999
    assert e0.flops == pytest.approx(2 * e0.params_active, rel=1e-3)


def test_memory_bound_at_batch_one_on_every_device():
    for device in load_devices().values():
        p = estimate(PRESETS["llama-2-7b"], "q4_0").predict(
            device.bandwidth, device.peak_flops("q4_0")
        )
        assert p.bound == "memory", device.name


def test_device_table_has_what_users_ask_for():
    table = load_devices()
    for name in ["a100-40gb-pcie", "a100-40gb-sxm", "a100-80gb-pcie", "a100-80gb-sxm", "h100-pcie",
                 "h100-sxm", "h200", "rtx-3090", "rtx-4080", "rtx-4090", "apple-m1", "apple-m2",
                 "apple-m2-pro", "apple-m2-max", "apple-m2-ultra", "apple-m3-max", "raspberry-pi-4",
                 "raspberry-pi-5", "ryzen-9-7950x"]:  # fmt: skip
        d = table[name]
        assert d.bandwidth > 1e9 and d.flops["fp32"] > 1e9 and d.source


def test_user_devices_and_peaks(tmp_path):
    f = tmp_path / "mine.json"
    f.write_text(
        json.dumps({"devices": [{"name": "MyBox", "bandwidth": 5e10, "flops": {"fp32": 1e12}}]})
    )
    assert get_device("mybox", [f]).bandwidth == 5e10
    assert get_device(peak_gbs=100, peak_gflops=2000).flops["fp32"] == 2e12
    assert get_device("rtx-4090", peak_gbs=500).bandwidth == 500e9
    with pytest.raises(DeviceError, match="unknown device 'gpu-9000'"):
        get_device("gpu-9000")


def test_a_batch_reads_weights_once_and_kv_per_sequence():
    from llama_arch import load_config

    c = load_config("llama-2-7b")
    one = estimate(c, "f16", pos=99)
    eight = estimate(c, "f16", pos=99, batch=8)
    assert (
        eight.weight_bytes - eight.reads["embedding"] == one.weight_bytes - one.reads["embedding"]
    )
    assert eight.kv_bytes == 8 * one.kv_bytes and eight.flops == 8 * one.flops
    assert eight.reads["embedding"] == 8 * one.reads["embedding"]


def test_ridge_batch_is_where_the_two_terms_meet():
    from llama_arch import load_config

    c = load_config("llama-2-7b")
    bw, peak = 2039e9, 312e12  # A100 80GB SXM, fp16 tensor cores
    ridge = estimate(c, "f16", pos=0).ridge_batch(bw, peak)
    assert 140 < ridge < 170  # finbarr's ~161 for an A100 in fp16
    at = estimate(c, "f16", pos=0, batch=round(ridge)).predict(bw, peak)
    assert at.memory_ms == pytest.approx(at.compute_ms, rel=0.01)
    deep = estimate(c, "f16", pos=4000)  # the KV read per sequence moves the ridge out
    assert deep.ridge_batch(bw, peak) > ridge


def test_batching_a_mixture_of_experts_first_adds_bytes():
    from bench.sol import experts_read
    from llama_arch import load_config

    c = load_config("mixtral-8x7b")
    assert experts_read(c, 1) == pytest.approx(2.0)
    assert experts_read(c, 8) == pytest.approx(8 * (1 - 0.75**8))
    assert experts_read(c, 1000) == pytest.approx(8.0)
    b1, b8 = estimate(c, "f16"), estimate(c, "f16", batch=8)
    assert b8.reads["mlp_weights"] > 3 * b1.reads["mlp_weights"]


def test_a_mixture_of_experts_ridge_counts_the_experts_a_batch_adds():
    """B* where the step's memory time, its experts growing with B, meets its arithmetic:
    later than a dense model's closed form at batch 1's bytes would put it."""
    from llama_arch import load_config

    c, bw, peak = load_config("olmoe-1b-7b"), 20e9, 200e9
    e = estimate(c, "q8_0", batch=4)
    ridge = e.ridge_batch(bw, peak)
    at = estimate(c, "q8_0", batch=round(ridge))
    assert at.predict(bw, peak).memory_ms == pytest.approx(at.predict(bw, peak).compute_ms,
                                                           rel=0.05)  # fmt: skip
    one = estimate(c, "q8_0")
    assert one.ridge_batch(bw, peak) == pytest.approx(ridge)  # from any B's estimate
    v1 = one.per_sequence_bytes
    fixed_weights = (one.bytes_per_token - v1) / bw / (one.flops / peak - v1 / bw)
    assert ridge > 2 * fixed_weights  # batch 1's bytes as if they did not grow
