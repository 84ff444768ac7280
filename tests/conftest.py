import pytest

from tests.helpers import build_hf_model


@pytest.fixture(scope="session")
def gqa_dir(tmp_path_factory):
    """A small LLaMA checkpoint with GQA, saved by transformers; the reference model too."""
    directory = tmp_path_factory.mktemp("llama_gqa")
    ref = build_hf_model("llama_gqa", directory)
    return directory, ref
