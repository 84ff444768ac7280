"""A decoder layer's tensors by role, and their shapes: the one place they are derived
(the loader checks a checkpoint against them, synthetic models are built from them, the
speed-of-light model counts their bytes).

A layer is a token mixer (Config.mixer: attention, a gated delta net, a short convolution)
and an MLP; each mixer has its own matrices, the MLP's are the same in every layer. Every
mixer ends in `wo`, the product whose output is added to the residual stream."""

from __future__ import annotations

from .config import Config

ATTN_ROLES = ("wq", "wk", "wv", "wo")
# the gated delta net: the input projections of q, k, v (one matrix), of z (the output's
# gate), of b (beta) and a (the decay), one row of each per value head; out_proj
DELTA_ROLES = ("d_qkv", "d_z", "d_b", "d_a", "wo")
CONV_ROLES = ("c_in", "wo")  # the short convolution: in_proj to B, C and x; out_proj
MIXER_ROLES = {"attention": ATTN_ROLES, "delta": DELTA_ROLES, "conv": CONV_ROLES}
MLP_ROLES = ("w_gate", "w_up", "w_down")  # one expert's
ROLES = ATTN_ROLES + MLP_ROLES  # an attention layer's matrices, (rows, cols) = (out, in)
SHARED_ROLES = ("wq", "wo")  # gemma4's shared KV layers: keys and values of an earlier layer
# gemma4's per-layer input: the gate from the residual stream, the projection back to it
PLE_ROLES = ("ple_gate", "ple_proj")


def mixer_roles(c: Config, i: int = 0) -> tuple[str, ...]:
    """Layer i's token mixer's matrices by role (a shared KV layer's: q and o alone)."""
    return SHARED_ROLES if c.kv_source(i) != i else MIXER_ROLES[c.mixer(i)]


def layer_roles(c: Config, i: int = 0) -> tuple[str, ...]:
    """The matrices of layer i by role: its mixer's, its MLP's, its per-layer input's."""
    return mixer_roles(c, i) + MLP_ROLES + (PLE_ROLES if c.ple_dim else ())


def layer_matrices(c: Config, i: int = 0) -> dict[str, tuple[int, int]]:
    """Shape of each matrix of layer i (an expert's, for the MLP roles)."""
    c = c.at(i)  # its head_dim and MLP width
    mlp = {"w_gate": (c.hidden_dim, c.dim), "w_up": (c.hidden_dim, c.dim),
           "w_down": (c.dim, c.hidden_dim)}  # fmt: skip
    kind = c.mixer(i)
    if kind == "delta":
        d = c.delta
        return {"d_qkv": (d.conv_dim, c.dim), "d_z": (d.value_dim, c.dim),
                "d_b": (d.v_heads, c.dim), "d_a": (d.v_heads, c.dim),
                "wo": (c.dim, d.value_dim)} | mlp  # fmt: skip
    if kind == "conv":
        return {"c_in": (3 * c.dim, c.dim), "wo": (c.dim, c.dim)} | mlp
    if c.ple_dim:
        mlp |= {"ple_gate": (c.ple_dim, c.dim), "ple_proj": (c.dim, c.ple_dim)}
    q_rows = 2 * c.q_dim if c.attn_gate else c.q_dim  # qwen3_5: each head's q, then its gate
    out = {"wq": (q_rows, c.dim), "wk": (c.kv_dim, c.dim), "wv": (c.kv_dim, c.dim),
           "wo": (c.dim, c.q_dim)} | mlp  # fmt: skip
    return {k: v for k, v in out.items() if k in layer_roles(c, i)}


def layer_vectors(c: Config, i: int = 0) -> dict[str, int]:
    """Length of each float32 vector of layer i: its norms (before and after the mixer and
    the MLP, of q and k, as its family has them), qwen2's biases, and a recurrent mixer's
    own: the convolution's weights (channels x kernel), a delta net's dt_bias, its decay
    rates `a` (-exp(A_log)) and its output norm."""
    c = c.at(i)  # its head_dim
    out = {"attn_norm": c.dim, "mlp_norm": c.dim} if c.pre_norm else {}
    if c.post_norm:
        out |= {"attn_post_norm": c.dim, "mlp_post_norm": c.dim}
    kind = c.mixer(i)
    if kind == "delta":
        d = c.delta
        return out | {"conv": d.conv_dim * d.kernel, "dt_bias": d.v_heads, "a": d.v_heads,
                      "d_norm": d.v_dim}  # fmt: skip
    if kind == "conv":
        return out | {"conv": c.dim * c.conv_kernel}
    if c.ple_dim:  # gemma4: the per-layer input's output norm
        out["ple_norm"] = c.dim
    if c.layer_scalar:
        out["layer_scalar"] = 1
    if c.qk_norm == "head":
        out |= {"q_norm": c.head_dim, "k_norm": c.head_dim}
    elif c.qk_norm == "all":
        out |= {"q_norm": c.q_dim, "k_norm": c.kv_dim}
    if c.qkv_bias:
        out |= {"bq": c.q_dim, "bk": c.kv_dim, "bv": c.kv_dim}
    if c.kv_source(i) != i:  # a shared KV layer norms no keys of its own
        out.pop("k_norm", None)
    return out


# a recurrent mixer's vectors that are weights of its own (read as the mixer's), not norms
MIXER_VECTORS = ("conv", "dt_bias", "a")


def state_floats(c: Config, i: int) -> int:
    """Float32 values of the state layer i keeps per sequence instead of a KV cache: a
    delta net's (v_heads x k_dim x v_dim) and its convolution's last kernel - 1 inputs; a
    short convolution's last conv_kernel - 1 inputs; 0 for attention."""
    kind = c.mixer(i)
    if kind == "delta":
        d = c.delta
        return d.state_floats + (d.kernel - 1) * d.conv_dim
    if kind == "conv":
        return (c.conv_kernel - 1) * c.dim
    return 0
