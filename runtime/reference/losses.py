"""Loss ops: NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss.

Both pick, for every sample position, the (log-)probability of its target class along axis 1 of
an (N, C, d1, ..., dk) input, weight it by weight[target], and zero the positions whose target is
ignore_index. Reductions: 'none' keeps the (N, d1, ..., dk) loss, 'sum' adds it up, 'mean'
divides the sum by the sum of the applied weights (the count of non-ignored positions when no
weight is given). Float16/bfloat16 are computed in float32 and rounded once.

This module holds the numpy kernels (what the interpreter and a CPU engine run); type
inference and traits are in graphc.ops.losses.
"""

from __future__ import annotations

import numpy as np

from graphc.runtime.reference.registry import register_kernel


def _nll(logp: np.ndarray, target: np.ndarray, weight: np.ndarray | None, attrs, dtype: np.dtype):
    """The weighted, ignore-aware NLL of float32/float64 log-probabilities, reduced."""
    n_classes = logp.shape[1]
    ignore = attrs.ignore_index
    active = np.ones(target.shape, dtype=bool) if ignore is None else target != ignore
    bad = active & ((target < 0) | (target >= n_classes))
    if bad.any():
        raise ValueError(
            f"target value {int(target[bad].reshape(-1)[0])} is outside [0, {n_classes})"
            + ("" if ignore is None else f" and is not ignore_index {ignore}")
        )
    safe = np.where(active, target, 0).astype(np.int64)
    picked = np.take_along_axis(logp, np.expand_dims(safe, 1), axis=1).squeeze(1)
    w = active.astype(logp.dtype)
    if weight is not None:
        w = w * weight.astype(logp.dtype)[safe]
    loss = -picked * w
    # An ignored position is an exact 0 even where its log-probability is -inf or NaN.
    loss = np.where(active, loss, logp.dtype.type(0))
    if attrs.reduction == "sum":
        loss = np.sum(loss)
    elif attrs.reduction == "mean":
        # Divide by the applied weights (the non-ignored count without weight); all ignored is 0/0.
        loss = np.sum(loss) / np.sum(w)
    return np.asarray(loss).astype(dtype)


def _compute_dtype(dt: np.dtype) -> np.dtype:
    return np.dtype(np.float64) if dt == np.float64 else np.dtype(np.float32)


def _nll_compute(ins, attrs, n):
    x, target = ins[0], ins[1]
    weight = ins[2] if len(ins) > 2 else None
    return [_nll(x.astype(_compute_dtype(x.dtype)), target, weight, attrs, x.dtype)]


def _sce_compute(ins, attrs, n):
    x, labels = ins[0], ins[1]
    weight = ins[2] if len(ins) > 2 else None
    xc = x.astype(_compute_dtype(x.dtype))
    shifted = xc - np.max(xc, axis=1, keepdims=True)
    logp = shifted - np.log(np.sum(np.exp(shifted), axis=1, keepdims=True))
    outs = [_nll(logp, labels, weight, attrs, x.dtype)]
    if n >= 2:
        outs.append(logp.astype(x.dtype))
    return outs


register_kernel("NegativeLogLikelihoodLoss", _nll_compute)
register_kernel("SoftmaxCrossEntropyLoss", _sce_compute)
