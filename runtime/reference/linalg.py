"""Linear algebra ops: Gemm, MatMul, Einsum, MatMulInteger, Det.

float16/bfloat16 multiply in float32 (numpy has no BLAS for them, and the sum needs the range)
and are cast back once. Integer MatMul/Gemm wrap around in their own type, as a kernel would.

This module holds the numpy kernels (what the interpreter and a CPU engine run); type
inference and traits are in graphc.ops.linalg.
"""

from __future__ import annotations

import re

import numpy as np

from graphc.runtime.reference.nn import acc_dtype, int32_sums
from graphc.runtime.reference.registry import register_kernel


def _gemm_compute(ins, attrs, n):
    a, b = ins[0], ins[1]
    c = ins[2] if len(ins) > 2 else None
    dt = a.dtype
    if attrs.transA:
        a = a.T
    if attrs.transB:
        b = b.T
    alpha, beta = attrs.alpha, attrs.beta
    if dt.kind in "iu" and not (float(alpha).is_integer() and float(beta).is_integer()):
        # A fractional scale of an integer product: scale in float64, truncate toward zero.
        y = np.matmul(a, b).astype(np.float64) * alpha
        if c is not None and beta != 0:
            y = y + beta * c.astype(np.float64)
        return [np.trunc(y).astype(dt)]
    acc = acc_dtype(dt)
    y = np.matmul(a.astype(acc, copy=False), b.astype(acc, copy=False))
    scalar = acc.type
    if alpha != 1:
        y *= scalar(alpha)
    # beta = 0 means C is not read (as in BLAS), so an inf/NaN in C does not leak in.
    if c is not None and beta != 0:
        cc = c.astype(acc, copy=False)
        y += cc if beta == 1 else cc * scalar(beta)
    return [y.astype(dt, copy=False)]


def _matmul_compute(ins, attrs, n):
    a, b = ins
    acc = acc_dtype(a.dtype)
    y = np.matmul(a.astype(acc, copy=False), b.astype(acc, copy=False))
    return [np.asarray(y).astype(a.dtype, copy=False)]


def _mmi_compute(ins, attrs, n):
    a, b = ins[0], ins[1]
    az = ins[2] if len(ins) > 2 and ins[2] is not None else None
    bz = ins[3] if len(ins) > 3 and ins[3] is not None else None
    # float64 holds every int8 product sum exactly (|sum| < 2**53) and runs through BLAS.
    af = a.astype(np.float64)
    bf = b.astype(np.float64)
    if az is not None:
        az = np.asarray(az, dtype=np.float64)
        # A 1-D a_zero_point is per row of A (shape [M]): it varies along A's second-last axis.
        af -= az.reshape(-1, 1) if az.ndim == 1 and a.ndim >= 2 else az
    if bz is not None:
        bf -= np.asarray(bz, dtype=np.float64)  # per column of B: broadcasts along the last axis
    return [int32_sums(np.matmul(af, bf))]


# ---- Einsum ------------------------------------------------------------------------------------

_TERM = re.compile(r"^(?:[a-zA-Z]|\.\.\.)*$")


def parse_einsum(equation: str, n_inputs: int) -> tuple[list[str], str]:
    """The input terms and output term of an equation, with implicit output made explicit.
    Raises ValueError on a malformed equation."""
    eq = equation.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != n_inputs:
        raise ValueError(f"equation {equation!r} has {len(terms)} input terms for {n_inputs} inputs")
    for t in [*terms, rhs]:
        if not _TERM.match(t) or t.count("...") > 1:
            raise ValueError(f"equation {equation!r}: bad term {t!r}")
    if not arrow:
        letters = "".join(t.replace("...", "") for t in terms)
        once = sorted(ch for ch in set(letters) if letters.count(ch) == 1)
        rhs = ("..." if any("..." in t for t in terms) else "") + "".join(once)
    return terms, rhs


def _einsum_compute(ins, attrs, n):
    dt = ins[0].dtype
    acc = acc_dtype(dt)
    terms, out = parse_einsum(attrs.equation, len(ins))
    eq = ",".join(terms) + "->" + out
    y = np.einsum(eq, *(x.astype(acc, copy=False) for x in ins), optimize=True)
    return [np.asarray(y).astype(dt, copy=False)]


def _det_compute(ins, attrs, n):
    x = ins[0]
    # numpy.linalg has no 16-bit float kernels.
    y = np.linalg.det(x.astype(np.promote_types(acc_dtype(x.dtype), np.float32), copy=False))
    return [np.asarray(y).astype(x.dtype, copy=False)]


register_kernel("Gemm", _gemm_compute)
register_kernel("MatMul", _matmul_compute)
register_kernel("MatMulInteger", _mmi_compute)
register_kernel("Einsum", _einsum_compute)
register_kernel("Det", _det_compute)
