"""Linear algebra ops: Gemm, MatMul, Einsum, MatMulInteger, Det.

float16/bfloat16 multiply in float32 (numpy has no BLAS for them, and the sum needs the range)
and are cast back once. Integer MatMul/Gemm wrap around in their own type, as a kernel would.
"""

from __future__ import annotations

import re

import numpy as np

from graphc.ir.types import Dim, DType, TensorType
from graphc.ops.nn import acc_dtype
from graphc.ops.registry import Category, InferContext, broadcast_shapes, register_op

_FLOATS = frozenset({DType.float16, DType.bfloat16, DType.float32, DType.float64})
_MATMUL_TYPES = _FLOATS | {DType.int32, DType.int64, DType.uint32, DType.uint64}
_EINSUM_TYPES = _FLOATS | {
    DType.int8,
    DType.int16,
    DType.int32,
    DType.int64,
    DType.uint8,
    DType.uint16,
    DType.uint32,
    DType.uint64,
}
_INT8S = frozenset({DType.int8, DType.uint8})


def _same_dims(ctx: InferContext, a: Dim, b: Dim, what: str) -> Dim:
    """Two dims that must be equal: the concrete one if either is, else the symbol."""
    if isinstance(a, int) and isinstance(b, int) and a != b:
        ctx.fail(f"{what}: {a} != {b}")
    return a if isinstance(a, int) else b if isinstance(b, int) else a if a is not None else b


def _check_types(ctx: InferContext, allowed: frozenset[DType], *idx: int) -> DType:
    dt = ctx.type(idx[0]).dtype
    if dt not in allowed:
        ctx.fail(f"{dt.name} is not supported (takes {sorted(t.name for t in allowed)})")
    for i in idx[1:]:
        if ctx.type(i).dtype != dt:
            ctx.fail(f"input {i} is {ctx.type(i).dtype.name}, input {idx[0]} is {dt.name}")
    return dt


# ---- Gemm --------------------------------------------------------------------------------------


def _gemm_infer(ctx: InferContext):
    dt = _check_types(ctx, _MATMUL_TYPES, 0, 1)
    a, b = ctx.type(0), ctx.type(1)
    for i, t in ((0, a), (1, b)):
        if t.shape is not None and len(t.shape) != 2:
            ctx.fail(f"input {i} must be a matrix, got {t}")
    m, ka = (None, None) if a.shape is None else (a.shape[::-1] if ctx.attrs.transA else a.shape)
    kb, n = (None, None) if b.shape is None else (b.shape[::-1] if ctx.attrs.transB else b.shape)
    _same_dims(ctx, ka, kb, f"inner dims of {a} and {b} (transA={ctx.attrs.transA}, transB={ctx.attrs.transB})")
    if ctx.has_input(2):
        c = ctx.type(2)
        if c.dtype != dt:
            ctx.fail(f"C is {c.dtype.name}, A is {dt.name}")
        # C broadcasts one way to (M, N): each of its trailing dims is 1 or the output's.
        if c.shape is not None:
            if len(c.shape) > 2:
                ctx.fail(f"C {c} has rank > 2")
            for cd, od in zip(reversed(c.shape), (n, m), strict=False):
                if isinstance(cd, int) and cd != 1 and isinstance(od, int) and cd != od:
                    ctx.fail(f"C {c} does not broadcast to ({m}, {n})")
    return [TensorType(dt, (m, n))]


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


register_op("Gemm", category=Category.MATMUL, infer=_gemm_infer, compute=_gemm_compute)

# ---- MatMul ------------------------------------------------------------------------------------


def matmul_shape(ctx: InferContext, a: TensorType, b: TensorType) -> tuple | None:
    """numpy.matmul's result shape: 1-D operands gain and lose a unit dim; batch dims broadcast."""
    if a.shape is None or b.shape is None:
        return None
    if len(a.shape) == 0 or len(b.shape) == 0:
        ctx.fail(f"matmul of a scalar ({a} @ {b})")
    sa = (1, *a.shape) if len(a.shape) == 1 else a.shape
    sb = (*b.shape, 1) if len(b.shape) == 1 else b.shape
    _same_dims(ctx, sa[-1], sb[-2], f"inner dims of {a} and {b}")
    batch = broadcast_shapes(ctx, sa[:-2], sb[:-2])
    if batch is None:
        return None
    out = [*batch]
    if len(a.shape) > 1:
        out.append(sa[-2])
    if len(b.shape) > 1:
        out.append(sb[-1])
    return tuple(out)


def _matmul_infer(ctx: InferContext):
    dt = _check_types(ctx, _MATMUL_TYPES, 0, 1)
    return [TensorType(dt, matmul_shape(ctx, ctx.type(0), ctx.type(1)))]


def _matmul_compute(ins, attrs, n):
    a, b = ins
    acc = acc_dtype(a.dtype)
    y = np.matmul(a.astype(acc, copy=False), b.astype(acc, copy=False))
    return [np.asarray(y).astype(a.dtype, copy=False)]


register_op("MatMul", category=Category.MATMUL, infer=_matmul_infer, compute=_matmul_compute)

# ---- MatMulInteger -----------------------------------------------------------------------------


def _mmi_infer(ctx: InferContext):
    a, b = ctx.type(0), ctx.type(1)
    if a.dtype not in _INT8S or b.dtype not in _INT8S:
        ctx.fail(f"takes int8/uint8 inputs, got {a.dtype.name} and {b.dtype.name}")
    for i, ref in ((2, a), (3, b)):
        if ctx.has_input(i) and ctx.type(i).dtype != ref.dtype:
            ctx.fail(f"zero point {i} is {ctx.type(i).dtype.name}, its tensor {ref.dtype.name}")
    return [TensorType(DType.int32, matmul_shape(ctx, a, b))]


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
    return [np.rint(np.matmul(af, bf)).astype(np.int32)]


register_op("MatMulInteger", category=Category.MATMUL, infer=_mmi_infer, compute=_mmi_compute)

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


def _einsum_infer(ctx: InferContext):
    n_in = len(ctx.input_types)
    dt = _check_types(ctx, _EINSUM_TYPES, *range(n_in))
    try:
        terms, out = parse_einsum(ctx.attrs.equation, n_in)
    except ValueError as e:
        ctx.fail(str(e))
    dims: dict[str, Dim] = {}
    ell_shapes = []
    for i, term in enumerate(terms):
        shape = ctx.type(i).shape
        if shape is None:
            return [TensorType(dt, None)]
        letters = term.replace("...", "")
        n_ell = len(shape) - len(letters)
        if n_ell < 0 or (n_ell > 0 and "..." not in term):
            ctx.fail(f"term {term!r} does not fit input {i} of rank {len(shape)}")
        head, _, tail = term.partition("...")
        ell = shape[len(head) : len(head) + n_ell] if "..." in term else ()
        ell_shapes.append(tuple(ell))
        for ch, d in zip(head + tail, (*shape[: len(head)], *shape[len(head) + n_ell :]), strict=True):
            prev = dims.get(ch)
            if prev is None or prev == 1:
                dims[ch] = d if prev is None or d != 1 else prev
            elif d != 1:
                dims[ch] = _same_dims(ctx, prev, d, f"dims of label {ch!r}")
    ell_out = broadcast_shapes(ctx, *ell_shapes) if ell_shapes else ()
    shape: list[Dim] = []
    head, sep, tail = out.partition("...")
    for ch in head:
        if ch not in dims:
            ctx.fail(f"output label {ch!r} is not in any input")
        shape.append(dims[ch])
    if sep:
        if ell_out is None:
            return [TensorType(dt, None)]
        shape.extend(ell_out)
    for ch in tail:
        if ch not in dims:
            ctx.fail(f"output label {ch!r} is not in any input")
        shape.append(dims[ch])
    return [TensorType(dt, tuple(shape))]


def _einsum_compute(ins, attrs, n):
    dt = ins[0].dtype
    acc = acc_dtype(dt)
    terms, out = parse_einsum(attrs.equation, len(ins))
    eq = ",".join(terms) + "->" + out
    y = np.einsum(eq, *(x.astype(acc, copy=False) for x in ins), optimize=True)
    return [np.asarray(y).astype(dt, copy=False)]


register_op("Einsum", category=Category.MATMUL, infer=_einsum_infer, compute=_einsum_compute)

# ---- Det ---------------------------------------------------------------------------------------


def _det_infer(ctx: InferContext):
    dt = _check_types(ctx, _FLOATS, 0)
    x = ctx.type(0)
    if x.shape is None:
        return [TensorType(dt, None)]
    if len(x.shape) < 2:
        ctx.fail(f"the input {x} must have rank >= 2")
    _same_dims(ctx, x.shape[-2], x.shape[-1], f"the matrices of {x} must be square")
    return [TensorType(dt, x.shape[:-2])]


def _det_compute(ins, attrs, n):
    x = ins[0]
    # numpy.linalg has no 16-bit float kernels.
    y = np.linalg.det(x.astype(np.promote_types(acc_dtype(x.dtype), np.float32), copy=False))
    return [np.asarray(y).astype(x.dtype, copy=False)]


register_op("Det", category=Category.MATMUL, infer=_det_infer, compute=_det_compute)
