"""The model: its weights built from a checkpoint's tensors (build.py), the forward pass
(transformer.py), its math and the compiled backend's fused operations (ops.py,
ops_compiled.py), the seam where bytes are counted and kernels timed (seam.py), the KV
cache (kvcache.py), random models (synthetic.py) and what bench.runner drives (decoder.py)."""
