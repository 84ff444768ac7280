"""The families the engine runs, in one table: each config.json model_type with its
transformers class, the GGUF architecture llama.cpp's converter writes for it, and the few
facts of its files that are not switches of the block (llama_arch.hf derives those)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Family:
    model_type: str  # config.json's (gemma3_text, gemma4_text and qwen3_5_text: their families)
    hf_class: str  # transformers' causal LM class
    gguf: str  # the GGUF architecture llama.cpp's converter writes
    moe: bool = False  # a mixture of experts
    permuted: bool = False  # the converter permutes Q and K rows (llama.cpp's NORM RoPE)
    norm_plus_one: bool = False  # transformers' RMSNorm as x * (1 + w); a GGUF holds 1 + w
    gguf_read: bool = True  # its GGUF files are read (False: refused, its safetensors run)


FAMILIES = {f.model_type: f for f in (
    Family("llama", "LlamaForCausalLM", "llama", permuted=True),
    Family("mistral", "MistralForCausalLM", "llama", permuted=True),
    Family("qwen2", "Qwen2ForCausalLM", "qwen2"),
    Family("qwen3", "Qwen3ForCausalLM", "qwen3"),
    Family("gemma2", "Gemma2ForCausalLM", "gemma2", norm_plus_one=True),
    Family("gemma3", "Gemma3ForCausalLM", "gemma3", norm_plus_one=True),
    Family("gemma4", "Gemma4ForCausalLM", "gemma4"),  # norms x * w
    Family("phi3", "Phi3ForCausalLM", "phi3"),
    Family("smollm3", "SmolLM3ForCausalLM", "smollm3", permuted=True),
    Family("olmo2", "Olmo2ForCausalLM", "olmo2"),
    Family("olmo3", "Olmo3ForCausalLM", "olmo2"),  # olmo2 with sliding layers
    Family("granite", "GraniteForCausalLM", "granite", permuted=True),
    Family("mixtral", "MixtralForCausalLM", "llama", moe=True, permuted=True),
    Family("qwen3_moe", "Qwen3MoeForCausalLM", "qwen3moe", moe=True),
    Family("olmoe", "OlmoeForCausalLM", "olmoe", moe=True),
    Family("granitemoe", "GraniteMoeForCausalLM", "granitemoe", moe=True, permuted=True),
    Family("qwen3_5", "Qwen3_5ForCausalLM", "qwen35", norm_plus_one=True),
    Family("lfm2", "Lfm2ForCausalLM", "lfm2"),
)}  # fmt: skip
SUPPORTED = tuple(FAMILIES)  # the model_types the engine runs
MOE = tuple(t for t, f in FAMILIES.items() if f.moe)  # the mixtures of experts among them
GGUF_ARCHITECTURES = tuple(dict.fromkeys(f.gguf for f in FAMILIES.values() if f.gguf_read))


def family_of_gguf(arch: str) -> str:
    """The model_type a GGUF architecture reads as (llama: llama; olmo2: olmo2)."""
    return next(t for t, f in FAMILIES.items() if f.gguf == arch)
