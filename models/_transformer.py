"""Multi-head attention and the MLP block, shared by bert and vit."""

from __future__ import annotations

import math

from models._graph import GraphWriter


def attention(
    w: GraphWriter,
    x: str,
    hidden: int,
    heads: int,
    prefix: str,
    out_prefix: str,
    mask: str | None = None,
    qkv: str = "separate",
    out_std: float | None = None,
) -> str:
    """softmax(Q K^T / sqrt(d) + mask) V over `heads` heads of x [batch, seq, hidden], then the
    output projection: the op sequence the exporters write for an eager attention module.

    qkv="separate": three MatMul+Add (query, key, value); "fused": one [hidden, 3*hidden] MatMul+Add
    and a Split, as models with a packed qkv projection export."""
    if hidden % heads:
        raise ValueError(f"hidden size {hidden} is not a multiple of {heads} heads")
    d = hidden // heads
    if qkv == "separate":
        q = w.linear(x, hidden, hidden, f"{prefix}.query")
        k = w.linear(x, hidden, hidden, f"{prefix}.key")
        v = w.linear(x, hidden, hidden, f"{prefix}.value")
    elif qkv == "fused":
        packed = w.linear(x, hidden, 3 * hidden, f"{prefix}.qkv", std=1 / math.sqrt(hidden))
        q, k, v = w.split(packed, [hidden] * 3, -1, f"{prefix}/Split")
    else:
        raise ValueError(f"qkv must be 'separate' or 'fused', not {qkv!r}")
    heads_shape = w.i64([0, 0, heads, d])  # 0 copies batch and seq, so they may stay symbolic
    q = w.op("Reshape", [q, heads_shape], f"{prefix}/Reshape")
    q = w.op("Transpose", [q], f"{prefix}/Transpose", perm=[0, 2, 1, 3])  # [b, h, s, d]
    k = w.op("Reshape", [k, heads_shape], f"{prefix}/Reshape_1")
    k = w.op("Transpose", [k], f"{prefix}/Transpose_1", perm=[0, 2, 3, 1])  # [b, h, d, s]
    v = w.op("Reshape", [v, heads_shape], f"{prefix}/Reshape_2")
    v = w.op("Transpose", [v], f"{prefix}/Transpose_2", perm=[0, 2, 1, 3])  # [b, h, s, d]
    scores = w.op("MatMul", [q, k], f"{prefix}/MatMul")
    scores = w.op("Div", [scores, w.const(math.sqrt(d))], f"{prefix}/Div")
    if mask is not None:
        scores = w.op("Add", [scores, mask], f"{prefix}/Add")
    probs = w.op("Softmax", [scores], f"{prefix}/Softmax", axis=-1)
    ctx = w.op("MatMul", [probs, v], f"{prefix}/MatMul_1")  # [b, h, s, d]
    ctx = w.op("Transpose", [ctx], f"{prefix}/Transpose_3", perm=[0, 2, 1, 3])
    ctx = w.op("Reshape", [ctx, w.i64([0, 0, hidden])], f"{prefix}/Reshape_3")
    return w.linear(ctx, hidden, hidden, out_prefix, std=out_std)


def mlp(
    w: GraphWriter,
    x: str,
    hidden: int,
    inner: int,
    in_prefix: str,
    out_prefix: str,
    out_std: float | None = None,
) -> str:
    """Linear -> GELU (erf form) -> Linear."""
    y = w.linear(x, hidden, inner, in_prefix)
    y = w.gelu_erf(y, f"{in_prefix}/gelu")
    return w.linear(y, inner, hidden, out_prefix, std=out_std)
