"""A decoder layer's tensors by role, and their shapes: the one place they are derived
(the loader checks a checkpoint against them, synthetic models are built from them, the
speed-of-light model counts their bytes)."""

from __future__ import annotations

from .config import Config

ATTN_ROLES = ("wq", "wk", "wv", "wo")
MLP_ROLES = ("w_gate", "w_up", "w_down")  # one expert's
ROLES = ATTN_ROLES + MLP_ROLES  # a layer's matrices, (rows, cols) = (out, in)


def layer_matrices(c: Config) -> dict[str, tuple[int, int]]:
    """Shape of each matrix of a layer (an expert's, for the MLP roles)."""
    return {
        "wq": (c.q_dim, c.dim),
        "wk": (c.kv_dim, c.dim),
        "wv": (c.kv_dim, c.dim),
        "wo": (c.dim, c.q_dim),
        "w_gate": (c.hidden_dim, c.dim),
        "w_up": (c.hidden_dim, c.dim),
        "w_down": (c.dim, c.hidden_dim),
    }


def layer_vectors(c: Config) -> dict[str, int]:
    """Length of each float32 vector of a layer: its norms (before and after attention and
    the MLP, of q and k, as its family has them), and qwen2's biases."""
    out = {"attn_norm": c.dim, "mlp_norm": c.dim} if c.pre_norm else {}
    if c.post_norm:
        out |= {"attn_post_norm": c.dim, "mlp_post_norm": c.dim}
    if c.qk_norm == "head":
        out |= {"q_norm": c.head_dim, "k_norm": c.head_dim}
    elif c.qk_norm == "all":
        out |= {"q_norm": c.q_dim, "k_norm": c.kv_dim}
    if c.qkv_bias:
        out |= {"bq": c.q_dim, "bk": c.kv_dim, "bv": c.kv_dim}
    return out
