"""The published measurements (bench/published): the dataset's schema and sources, the byte
model of other engines' formats, the calibrated fit and `sol --published`."""

from __future__ import annotations

import collections
import csv
import json
from importlib import resources

import numpy as np
import pytest

from bench import calibrate, published
from bench.calibrate import Point
from bench.sol import estimate
from llama_arch import ROLES
from llama_arch.presets import PRESETS
from llama_np.cli import main


def test_every_row_follows_the_schema_and_names_a_known_source():
    rows = published.measurements()
    sources = published.sources()
    assert len(rows) >= 100
    assert {m.source for m in rows} <= set(sources)
    independent = [s for s, d in sources.items() if not d["independent_of"]]
    assert len(independent) >= 3  # sources that copy no other
    assert all(d["url"].startswith("https://") for d in sources.values())
    classes = {m.hw_class for m in rows}
    assert {"apple-gpu", "nvidia-gpu"} <= classes and classes & {"cpu", "board"}
    for m in rows:
        assert m.url.startswith("https://") and m.where and m.bandwidth_gbs > 0
        assert m.second_hand == "" or m.second_hand in sources or m.second_hand.startswith("http")
        assert m.batch == 1 and 0 < m.tok_s < 10_000
        assert m.model in published.models()


def test_a_malformed_row_is_named():
    good = next(csv.DictReader(resources.files("bench").joinpath(
        "published", "measurements.csv").read_text().splitlines()))  # fmt: skip
    with pytest.raises(published.PublishedError, match="row 7: tok_s is not a number"):
        published._row(good | {"tok_s": "fast"}, 7)
    with pytest.raises(published.PublishedError, match="hw_class 'tpu'"):
        published._row(good | {"hw_class": "tpu"}, 7)
    with pytest.raises(published.PublishedError, match="no byte model"):
        published.layout("llama.cpp", "IQ2_XXS", PRESETS["llama-2-7b"])


def test_no_published_row_beats_its_speed_of_light():
    """A row faster than its bound would mean the byte model or a bandwidth is wrong."""
    for h in published.held():
        assert h.share <= 1.0, (h.m.hardware, h.m.model, h.m.weights, h.share)


def test_calm_reads_what_it_says_it_reads():
    """calm prints the bandwidth its runs achieved: bytes per token = GB/s / tok/s. Its
    RTX 4090 fp16 rows: Llama3 8B 61 tok/s at 923 GB/s, Llama2 7B 69 at 919 (first 32
    tokens); the model's count of the same bytes agrees within 1%."""
    for model, tok_s, gbs in (("llama-3-8b", 61, 923), ("llama-2-7b", 69, 919)):
        m = next(m for m in published.measurements() if m.source == "calm"
                 and m.model == model and m.weights == "fp16" and m.prompt_tokens == 0)  # fmt: skip
        assert m.tok_s == tok_s
        assert published.predict(m).bytes_per_token == pytest.approx(gbs * 1e9 / tok_s, rel=0.01)


@pytest.mark.slow  # reads the real files (CI has them: the integration tests pull them)
@pytest.mark.parametrize(("alias", "ftype"), [("qwen2.5-coder-0.5b", "Q4_K_M"),
                                              ("smollm2-135m", "Q4_1")])  # fmt: skip
def test_llama_cpp_mixes_count_the_bytes_of_real_files(alias, ftype, request):
    """gguf_plan against files llama.cpp's quantizer wrote: the same number of matrices of
    each type per role, and so the same bytes (which layers get the more-bits types
    follows the order of the tensors in the source checkpoint; the count does not)."""
    import gguf

    from llama_np.io.gguf import gguf_shape

    path = request.getfixturevalue("qwen_path" if alias.startswith("qwen") else "smollm2_path")
    types = {t.name: t.tensor_type.name.lower() for t in gguf.GGUFReader(path).tensors}
    c = gguf_shape(path)[0]  # the file's config, its weights unread
    plan, head, embed = published.gguf_plan(ftype, c)
    names = dict(zip(ROLES, ["attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up",
                             "ffn_down"], strict=True))  # fmt: skip
    for role, name in names.items():
        ours = collections.Counter(layer[role] for layer in plan)
        theirs = collections.Counter(types[f"blk.{i}.{name}.weight"] for i in range(c.n_layers))
        assert ours == theirs, role
    assert head == types.get("output.weight", types["token_embd.weight"])
    assert embed == types["token_embd.weight"]


def test_the_fit_recovers_eta_and_t0():
    rng = np.random.default_rng(0)
    pts = [Point(x, x / 0.7 + 2.0, "nvidia-gpu", "e", f"s{i % 3}")
           for i, x in enumerate(rng.uniform(1, 100, 30))]  # fmt: skip
    f = calibrate.fit(pts, "g")
    assert f.eta == pytest.approx(0.7) and f.t0_ms == pytest.approx(2.0)
    assert (f.rows, f.sources) == (30, 3)
    flat = [Point(x, x / 0.5 - 1e-3, "c", "e", "s") for x in (1.0, 2.0, 4.0)]
    assert calibrate.fit(flat, "g").t0_ms == 0.0  # never a negative per-token cost


def test_each_source_is_predicted_by_the_others():
    """Held out by source: a source whose rows alone sit far off the others' fit shows a
    large error (a fit on itself would hide it); the narrowest group with enough rows of
    the other sources is used."""
    pts = [Point(x, 2 * x, "cpu", "a", "one") for x in (1.0, 2.0, 3.0, 4.0)]
    pts += [Point(x, 2 * x, "cpu", "b", "two") for x in (1.0, 2.0, 3.0, 4.0)]
    pts += [Point(x, 4 * x, "cpu", "b", "odd") for x in (1.0, 2.0, 3.0, 4.0)]
    held = {h.point.source: h for h in calibrate.leave_one_source_out(pts)}
    assert held["odd"].error == pytest.approx(-0.5)  # the others say 2x, it took 4x
    assert held["odd"].fit.group == "cpu / b" and held["one"].fit.group == "cpu"
    assert calibrate.spread(list(calibrate.leave_one_source_out(pts)))["rows"] == 12


def test_sol_prints_the_expected_figure_beside_the_bound(capsys):
    """How fast will Llama-3-8B Q4_K_M run on an M2 Pro: the bound, and the fit of the
    published Apple-GPU llama.cpp rows beside it, with its held-out spread."""
    args = ["sol", "--config", "llama-3-8b", "--weights", "q4_k_m", "--device", "apple-m2-pro"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "speed of light" in out and "expected" in out and "apple-gpu / llama.cpp" in out
    assert main([*args, "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    plan, head, embed = published.gguf_plan("Q4_K_M", PRESETS["llama-3-8b"])
    e = estimate(PRESETS["llama-3-8b"], plan, head=head, embed=embed, engine=False)
    assert d["bytes_per_token"] == e.bytes_per_token  # llama.cpp's mix, tensor by tensor
    f = d["expected_fit"]
    bound = d["predicted_ms_per_token"]
    assert d["expected_ms_per_token"] == pytest.approx(bound / f["eta"] + f["t0_ms"])
    assert d["expected_ms_per_token"] > bound and 0 < d["expected_held_out"]["median"] < 1


def test_sol_published_reports_classes_and_held_out_error(capsys, tmp_path):
    assert main(["sol", "--published", "--rows", "--plot", str(tmp_path / "p.png")]) == 0
    out = capsys.readouterr().out
    for text in ("| nvidia-gpu |", "| apple-gpu |", "| llama.cpp |", "held-out abs error",
                 "| xiongjiedai |"):  # fmt: skip
        assert text in out
    assert out.count("\n| calm | ") >= 40  # every row, with --rows
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"
