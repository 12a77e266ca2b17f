"""Loss ops: NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss.

Both pick, for every sample position, the (log-)probability of its target class along axis 1 of
an (N, C, d1, ..., dk) input, weight it by weight[target], and zero the positions whose target is
ignore_index. Reductions: 'none' keeps the (N, d1, ..., dk) loss, 'sum' adds it up, 'mean'
divides the sum by the sum of the applied weights (the count of non-ignored positions when no
weight is given). Float16/bfloat16 are computed in float32 and rounded once.

This module holds type inference and traits; the numpy kernels are in
graphc.runtime.reference.losses.
"""

from __future__ import annotations

from graphc.ir.types import DType, TensorType
from graphc.ops.registry import Category, InferContext, register_op

_REDUCTIONS = ("none", "sum", "mean")
_FLOATS = (DType.float16, DType.bfloat16, DType.float32, DType.float64)


def _loss_infer(ctx: InferContext, max_outputs: int) -> list[TensorType]:
    a = ctx.attrs
    xt, tt = ctx.type(0), ctx.type(1)
    if xt.dtype not in _FLOATS:
        ctx.fail(f"input 0 has dtype {xt.dtype.name}; it must be a float tensor")
    if tt.dtype not in (DType.int32, DType.int64):
        ctx.fail(f"the target/labels input has dtype {tt.dtype.name}; it must be int32 or int64")
    if a.reduction not in _REDUCTIONS:
        ctx.fail(f"reduction must be one of {_REDUCTIONS}, got {a.reduction!r}")
    rank = ctx.rank(0)
    if rank < 2:
        ctx.fail(f"input 0 must be (N, C) or (N, C, d1, ..., dk), got {xt}")
    if ctx.rank(1) != rank - 1:
        ctx.fail(f"target {tt} must have rank {rank - 1} for input {xt}")
    loss_shape = []
    for i, (dx, dt) in enumerate(zip(xt.shape[:1] + xt.shape[2:], tt.shape, strict=True)):
        if isinstance(dx, int) and isinstance(dt, int) and dx != dt:
            ctx.fail(f"target {tt} does not match input {xt} (dim {i})")
        loss_shape.append(dx if isinstance(dx, int) or dx == dt or dt is None else dt)
    if ctx.has_input(2):
        wt = ctx.type(2)
        if wt.dtype != xt.dtype:
            ctx.fail(f"weight has dtype {wt.dtype.name}, input has {xt.dtype.name}")
        if ctx.rank(2) != 1 or (
            isinstance(wt.shape[0], int) and isinstance(xt.shape[1], int) and wt.shape[0] != xt.shape[1]
        ):
            ctx.fail(f"weight {wt} must be 1-D with one entry per class (C = {xt.shape[1]})")
    if ctx.num_outputs > max_outputs:
        ctx.fail(f"{ctx.num_outputs} outputs asked, the op has {max_outputs}")
    out = TensorType(xt.dtype, tuple(loss_shape) if a.reduction == "none" else ())
    return [out, xt][: max(ctx.num_outputs, 1)]


register_op(
    "NegativeLogLikelihoodLoss",
    category=Category.REDUCTION,
    infer=lambda ctx: _loss_infer(ctx, 1),
    doc="Weighted negative log-likelihood loss with ignore_index; reduction none/sum/mean.",
)


register_op(
    "SoftmaxCrossEntropyLoss",
    category=Category.REDUCTION,
    infer=lambda ctx: _loss_infer(ctx, 2),
    doc="Softmax cross-entropy (log-softmax over axis 1, then NLL); optional log_prob output.",
)
