"""The families the engine runs, in one table: each config.json model_type with its
transformers classes, the GGUF architecture llama.cpp's converter writes for it, and the few
facts of its files that are not switches of the block (llama_arch.hf derives those)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Family:
    model_type: str  # config.json's (gemma3_text, gemma4_text and qwen3_5_text: their families)
    hf_class: str  # transformers' causal LM class
    hf_config: str  # and its config class (the text model's, where the family has others)
    gguf: str  # the GGUF architecture llama.cpp's converter writes
    moe: bool = False  # a mixture of experts
    permuted: bool = False  # the converter permutes Q and K rows (llama.cpp's NORM RoPE)
    norm_plus_one: bool = False  # transformers' RMSNorm as x * (1 + w); a GGUF holds 1 + w
    gguf_read: bool = True  # its GGUF files are read (False: refused, its safetensors run)


FAMILIES = {f.model_type: f for f in (
    Family("llama", "LlamaForCausalLM", "LlamaConfig", "llama", permuted=True),
    Family("mistral", "MistralForCausalLM", "MistralConfig", "llama", permuted=True),
    Family("qwen2", "Qwen2ForCausalLM", "Qwen2Config", "qwen2"),
    Family("qwen3", "Qwen3ForCausalLM", "Qwen3Config", "qwen3"),
    Family("gemma2", "Gemma2ForCausalLM", "Gemma2Config", "gemma2", norm_plus_one=True),
    Family("gemma3", "Gemma3ForCausalLM", "Gemma3TextConfig", "gemma3", norm_plus_one=True),
    Family("gemma4", "Gemma4ForCausalLM", "Gemma4TextConfig", "gemma4"),  # norms x * w
    Family("phi3", "Phi3ForCausalLM", "Phi3Config", "phi3"),
    Family("smollm3", "SmolLM3ForCausalLM", "SmolLM3Config", "smollm3", permuted=True),
    Family("olmo2", "Olmo2ForCausalLM", "Olmo2Config", "olmo2"),
    Family("olmo3", "Olmo3ForCausalLM", "Olmo3Config", "olmo2"),  # olmo2 with sliding layers
    Family("granite", "GraniteForCausalLM", "GraniteConfig", "granite", permuted=True),
    Family("mixtral", "MixtralForCausalLM", "MixtralConfig", "llama", moe=True, permuted=True),
    Family("qwen3_moe", "Qwen3MoeForCausalLM", "Qwen3MoeConfig", "qwen3moe", moe=True),
    Family("olmoe", "OlmoeForCausalLM", "OlmoeConfig", "olmoe", moe=True),
    Family("granitemoe", "GraniteMoeForCausalLM", "GraniteMoeConfig", "granitemoe", moe=True,
           permuted=True),
    Family("qwen3_5", "Qwen3_5ForCausalLM", "Qwen3_5TextConfig", "qwen35", norm_plus_one=True),
    Family("lfm2", "Lfm2ForCausalLM", "Lfm2Config", "lfm2"),
)}  # fmt: skip
SUPPORTED = tuple(FAMILIES)  # the model_types the engine runs
MOE = tuple(t for t, f in FAMILIES.items() if f.moe)  # the mixtures of experts among them
GGUF_ARCHITECTURES = tuple(dict.fromkeys(f.gguf for f in FAMILIES.values() if f.gguf_read))


def family_of_gguf(arch: str) -> str:
    """The model_type a GGUF architecture reads as (llama: llama; olmo2: olmo2)."""
    return next(t for t, f in FAMILIES.items() if f.gguf == arch)
