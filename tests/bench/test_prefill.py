"""The prefill side of the speed of light (`sol --prompt`) and the published prompt speeds."""

from __future__ import annotations

import json
import math

import pytest

from bench import published
from bench.devices import Device, DeviceError, load_devices
from bench.sol import keys_attended, prefill
from llama_arch import PRESETS, Config
from llama_np.cli import main

TINY = Config("llama", 8, 2, 2, 1, 4, 16, 10)  # dim 8, 2 layers, 2 heads of 4, 1 KV head


def test_flops_of_a_tiny_prompt_by_hand():
    """2 layers: q 8x8, k and v 4x8, o 8x8, gate and up 16x8, down 8x16 = 640 weights a
    layer; the head (10x8) for the last token only; attention 4 x heads x head_dim per key,
    3 tokens after 2 in the cache: keys 3 + 4 + 5."""
    p = prefill(TINY, 3, "f32", pos=2)
    layers = 2 * (64 + 32 + 32 + 64 + 3 * 128)
    attention = 2 * 4 * 2 * 4 * (3 + 4 + 5)
    assert p.flops == 2 * 3 * layers + 2 * 80 + attention
    assert p.attention_flops == attention and p.scores == 2 * 2 * (3 + 4 + 5)  # layers x heads
    # KV: per layer 1 head x 4 x 4 bytes, K and V, at the 5 positions read, 3 written
    assert p.reads["kv_cache"] == 2 * 2 * 16 * 5 and p.kv_write_bytes == 2 * 2 * 16 * 3


def test_keys_attended_respect_the_window():
    assert keys_attended(0, 10, None) == 55
    assert keys_attended(0, 10, 4) == 1 + 2 + 3 + 4 * 7
    assert keys_attended(100, 3, 4) == 12
    assert keys_attended(2, 3, 4) == 3 + 4 + 4


def test_the_bound_turns_from_bytes_to_flops_as_the_prompt_grows():
    c, gpu = PRESETS["llama-2-7b"], load_devices()["rtx-4090"]
    bounds = [prefill(c, n, "q4_0", engine=False).predict(gpu.bandwidth,
                                                           gpu.peak_flops("q4_0")).bound
              for n in (1, 16, 512)]  # fmt: skip
    assert bounds == ["memory", "memory", "compute"]


def test_mixture_of_experts_prompt_reads_the_union_of_experts():
    c = PRESETS["olmoe-1b-7b"]
    one, many = prefill(c, 1, "q4_0"), prefill(c, 256, "q4_0")
    assert many.reads["mlp_weights"] > 7 * one.reads["mlp_weights"]  # 8 of 64, then ~all


def test_matrix_peak_rule_per_device_kind_and_format():
    t = load_devices()
    assert t["rtx-4090"].matrix_peak("Q4_K_M")[0] == "int8"  # MMQ on int8 tensor cores
    assert t["rtx-4090"].matrix_peak("F16")[0] == "fp16"
    assert t["apple-m2-ultra"].matrix_peak("q4_0")[0] == "fp16"  # no int8 listed
    assert t["rx-580"].matrix_peak("q8_0") == ("fp16", 6.17e12)
    assert t["rtx-4090"].matrix_peak("f32")[0] == "fp32"
    assert t["ryzen-9-7950x"].matrix_peak("q8_0")[0] == "int8"
    assert t["ryzen-9-7950x"].matrix_peak("F16")[0] == "fp32"  # no half FMA listed
    assert t["apple-m2-max-cpu"].matrix_peak("F16")[0] == "fp16"
    assert t["raspberry-pi-4"].matrix_peak("q8_0")[0] == "fp32"  # no int8 dot listed


def test_engine_peak_is_the_half_rate_on_gpus_and_the_bounds_on_cpus():
    """The expectation's rate: a GPU's quantized products at its half-precision rate (their
    int8 peak stays the bound's), never above the bound's peak; a CPU's at the bound's."""
    t = load_devices()
    gpu, cpu = t["rtx-4090"], t["ryzen-9-7950x"]
    assert gpu.engine_peak("Q4_K_M") == gpu.flops["fp16"] < gpu.peak_flops("Q4_K_M")
    assert gpu.engine_peak("f32") == gpu.flops["fp32"]
    assert t["apple-m2-ultra"].engine_peak("q4_0") == t["apple-m2-ultra"].peak_flops("q4_0")
    assert cpu.engine_peak("q8_0") == cpu.flops["int8"] and cpu.float_peak() == cpu.flops["fp32"]


def test_sol_prompt_json_keys(capsys):
    args = "sol --config llama-3-8b --weights q4_k_m --prompt 512 --device rtx-4090 --json"
    assert main(args.split()) == 0
    d = json.loads(capsys.readouterr().out)
    assert {"predicted_prefill_tok_s", "expected_prefill_tok_s", "flops", "bytes"} <= set(d)
    assert d["bound"] == "compute" and d["peak"] == "int8"
    assert d["predicted_prefill_tok_s"] == pytest.approx(512e12 * 660.6 / d["flops"])
    assert d["expected_prefill_tok_s"] < d["predicted_prefill_tok_s"]
    assert d["attention_flops"] < d["flops"] and d["expected_fit"]["group"].startswith("nvidia")


def test_sol_prompt_with_a_device_file(tmp_path, capsys):
    f = tmp_path / "dev.json"
    f.write_text(json.dumps({"devices": [{"name": "box", "bandwidth": 1e11, "kind": "cpu",
                                          "flops": {"fp32": 1e12, "int8": 4e12}}]}))  # fmt: skip
    args = ["sol", "--config", "llama-2-7b", "--weights", "q8_0", "--prompt", "256",
            "--device", "box", "--devices", str(f), "--json"]  # fmt: skip
    assert main(args) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["peak"] == "int8" and d["peak_flops"] == 4e12
    f.write_text(json.dumps({"devices": [{"name": "box", "bandwidth": 1e11,
                                          "flops": {"tf32": 1e12}}]}))  # fmt: skip
    with pytest.raises(DeviceError, match="tf32"):
        load_devices([f])


def test_a_device_without_a_class_gets_the_one_its_name_says(tmp_path, capsys):
    """A --devices entry that names no class and no kind gets both from its name and title
    (devices.guess_class); a GPU class without published rows of its own (intel-gpu) is
    fitted as the GPUs are: each still has an expected prompt speed under its bound."""
    f = tmp_path / "dev.json"
    card = {"fp32": 1e14, "fp16": 4e14, "int8": 8e14}
    f.write_text(json.dumps({"devices": [
        {"name": "card", "title": "NVIDIA GeForce RTX 5090", "bandwidth": 1.8e12, "flops": card},
        {"name": "arc", "title": "Intel Arc A770", "bandwidth": 5.6e11, "flops": card},
        {"name": "box", "title": "AMD EPYC 9654", "bandwidth": 4.6e11, "flops": {"int8": 4e13}},
    ]}))  # fmt: skip
    table = load_devices([f])
    for name, cls, kind, group in (("card", "nvidia-gpu", "gpu", "nvidia-gpu / llama.cpp /"),
                                   ("arc", "intel-gpu", "gpu", "GPUs"),
                                   ("box", "cpu", "cpu", "cpu")):  # fmt: skip
        assert (table[name].hw_class, table[name].kind) == (cls, kind)
        args = ["sol", "--config", "llama-2-7b", "--weights", "q4_0", "--prompt", "512",
                "--device", name, "--devices", str(f), "--json"]  # fmt: skip
        assert main(args) == 0
        d = json.loads(capsys.readouterr().out)
        assert 0 < d["expected_prefill_tok_s"] < d["predicted_prefill_tok_s"], name
        assert d["expected_fit"]["group"].startswith(group), (name, d["expected_fit"])


def test_sol_prompt_text_names_both_bounds(capsys):
    assert main("sol --config llama-2-7b --prompt 64 --device apple-m2-ultra".split()) == 0
    out = capsys.readouterr().out
    assert "memory bound" in out and "compute bound" in out and "-bound" in out


@pytest.mark.parametrize(("args", "message"), [
    ("--prompt 0", "--prompt"),
    ("--prompt -5", "--prompt"),
    ("--prompt 64 --batch 4", "give one of them"),
    ("--prompt 64 --pos -1", "--pos must be >= 0"),
])  # fmt: skip
def test_bad_prompt_input_is_one_line(args, message, capsys):
    with pytest.raises(SystemExit) as e:
        raise SystemExit(main(["sol", "--config", "llama-2-7b", *args.split()]))
    err = capsys.readouterr().err
    assert e.value.code == 2 and message in err and len(err.strip().splitlines()) == 1


def test_published_prompt_rows_parse_and_name_known_models_and_devices():
    rows = published.prefill_measurements()
    devices = load_devices()
    assert len(rows) >= 150 and len({m.source for m in rows}) >= 10
    gpu = [m for m in rows if m.hw_class.endswith("-gpu")]
    for cls in ("nvidia-gpu", "apple-gpu", "amd-gpu"):  # a held-out source leaves another
        assert len({m.source for m in gpu if m.hw_class == cls}) >= 2, cls
    assert {m.source for m in rows} <= set(published.sources())
    for m in rows:
        assert m.model in published.models() and m.device in devices
        assert m.gen_tokens == 0 and m.tok_s > 0 and m.url.startswith("https://")
    assert all(m.phase == "decode" for m in published.measurements())
    assert len(published.measurements()) == 346  # the decode set reads as before


def test_no_published_prompt_row_beats_its_bound():
    for h in published.held_prefill():
        assert h.share <= 1.0, (h.m.hardware, h.m.model, h.m.weights, h.share)


def test_published_prefill_report(capsys):
    assert main(["sol", "--published", "--prefill"]) == 0
    out = capsys.readouterr().out
    assert "prompt (prefill) measurements" in out and "held-out" in out
    assert "| group | eta |" in out and "r = " in out and "faster than their bound: 0" in out
    assert isinstance(Device("x", "x", 1.0).matrix_peak("q4_0"), tuple)


def test_prefill_fit_recovers_eta_and_r_from_exact_rows():
    """Rows made exactly by the form (eta 0.4 on GPUs, 0.1 on CPUs, the score matrix
    crossing memory 3 times) are fitted back exactly, and held out by source they are
    predicted exactly too: every group keeps rows of another source."""
    from bench.prefill_fit import PrefillPoint, fit, leave_one_source_out, spread

    def row(cls, eta, compute, scores, source):
        ms = (compute + 3.0 * scores) / eta
        return PrefillPoint(0.01, compute / 2, 0.0, ms, cls, "llama.cpp", True, source,
                            compute, scores)  # fmt: skip

    pts = [row(cls, eta, c, sc, src) for cls, eta in (("nvidia-gpu", 0.4), ("cpu", 0.1))
           for src in ("a", "b") for c, sc in ((1.0, 0.02), (1.0, 0.5), (2.0, 0.1),
                                               (0.5, 0.4))]  # fmt: skip
    f = fit(pts)
    assert f.r == pytest.approx(3.0, rel=0.15)
    assert f.etas["nvidia-gpu / llama.cpp / quantized"].eta == pytest.approx(0.4, rel=0.05)
    assert f.etas["cpu / llama.cpp / quantized"].eta == pytest.approx(0.1, rel=0.05)
    held = leave_one_source_out(pts)
    assert len(held) == len(pts) and spread(held)["p90"] < 0.05


def test_prefill_fit_recovers_a_gpu_class_exponent_of_the_rate():
    """Rows whose share of the rate falls as the rate grows (ms = compute x (rate /
    RATE_REF)^0.4 / eta, rates 10-800 TFLOPS) from two sources give their class that
    exponent, and the class predicts a rate it never saw; a class of one source keeps the
    GPUs' exponent, and CPUs none."""
    from bench.prefill_fit import RATE_REF, PrefillPoint, fit

    def row(cls, rate, source, a=0.4, eta=0.5):
        compute = 2.0
        ms = compute * (rate / RATE_REF) ** a / eta
        return PrefillPoint(0.001, compute / 2, 0.0, ms, cls, "llama.cpp", True, source,
                            compute, 0.0, rate)  # fmt: skip

    rates = (1e13, 3e13, 1e14, 3e14, 8e14)
    pts = [row("nvidia-gpu", x, s) for x in rates for s in "ab"]
    pts += [row("amd-gpu", x, "c", a=0.0) for x in rates]
    pts += [row("cpu", x / 100, s, a=0.0, eta=0.1) for x in rates for s in "de"]
    f = fit(pts)
    assert f.a["nvidia-gpu"] == pytest.approx(0.4) and "amd-gpu" not in f.a
    assert "cpu" not in f.a
    amd, cpu = row("amd-gpu", 2e14, ""), row("cpu", 1e12, "")
    assert f.expect(amd) == pytest.approx(amd.slow(f.r, f.a["gpu"]) / f.group_for(amd).eta)
    assert f.expect(cpu) == pytest.approx(cpu.slow(f.r, 0.0) / f.group_for(cpu).eta)
    like = row("nvidia-gpu", 5e14, "")
    assert f.expect(like) == pytest.approx(like.measured_ms, rel=0.02)


def test_a_group_of_few_sources_is_drawn_toward_its_parent():
    """A narrow group's log eta is its rows' median drawn toward its parent's (shrunk in
    turn) by its count of sources (SHRINK = 1): one source's rows halfway, four sources'
    four parts to one; the class is drawn toward the GPUs', a root, and a class named
    "cpu" is not the CPUs' group."""
    from bench.prefill_fit import SHRINK, PrefillPoint, fit

    def point(eta, source, quantized=True, engine="llama.cpp", cls="apple-gpu"):
        return PrefillPoint(0.0, 1.0, 0.0, 1 / eta, cls, engine, quantized, source,
                            1.0, 0.0)  # fmt: skip

    pts = [point(0.5, s) for s in "abcd"] + [point(0.125, "e", False)] * 4
    pts += [point(0.9, s, engine="mlx") for s in "fg"] * 2  # the class's median moves
    pts += [point(0.9, s, cls="nvidia-gpu") for s in "jk"] * 2  # and the GPUs'
    pts += [point(0.05, s, cls="cpu") for s in "hi"] * 2
    f = fit(pts)
    log = {n: math.log(g.eta) for n, g in f.etas.items()}
    raw_engine, raw_class = math.log(0.25), math.log(0.5)  # medians of 8 and of 12 rows
    assert SHRINK == 1.0 and log["GPUs"] == pytest.approx((math.log(0.5) + math.log(0.9)) / 2)
    assert log["apple-gpu"] == pytest.approx((7 * raw_class + log["GPUs"]) / 8)  # 7 sources
    assert log["apple-gpu / llama.cpp"] == pytest.approx((5 * raw_engine + log["apple-gpu"]) / 6)
    parent = log["apple-gpu / llama.cpp"]
    assert log["apple-gpu / llama.cpp / float"] == pytest.approx((math.log(0.125) + parent) / 2)
    assert log["apple-gpu / llama.cpp / quantized"] == pytest.approx(
        (4 * math.log(0.5) + parent) / 5
    )
    assert f.etas["cpu"].rows == 4 and f.etas["CPUs"].rows == 4


def test_prefill_fit_falls_back_to_a_broader_group():
    """A class with no rows of its own is predicted by its kind (GPU or CPU), not by all."""
    from bench.prefill_fit import PrefillPoint, fit

    def point(cls, ms, source):
        return PrefillPoint(0.0, 1.0, 0.0, ms, cls, "llama.cpp", False, source, 1.0, 0.0)

    f = fit([point("apple-gpu", 1 / 0.5, s) for s in "abcd"]
            + [point("cpu", 1 / 0.05, s) for s in "abcd"])  # fmt: skip
    like = point("amd-gpu", float("nan"), "")
    assert f.group_for(like).group == "GPUs"
    assert f.expect(like) == pytest.approx(2.0)


def test_published_prefill_held_out_error():
    """The leave-one-source-out error of the published prompt rows, as the report prints
    it: a floor that a change to the rows, the peaks or the fit must not fall below."""
    held = published.prefill_held_out()
    gpu = [h for h in held if h.point.hw_class in ("nvidia-gpu", "apple-gpu")]
    assert len(held) == len(published.held_prefill())
    assert published.prefill_spread(gpu)["median"] < 0.16  # 13% (2026-11-29)
    assert published.prefill_spread(held)["median"] < 0.21  # 19%
    assert published.prefill_spread(held)["p80"] < 0.6  # 57%
