"""Linear algebra ops: Gemm, MatMul, Einsum, MatMulInteger, Det.

float16/bfloat16 multiply in float32 (numpy has no BLAS for them, and the sum needs the range)
and are cast back once. Integer MatMul/Gemm wrap around in their own type, as a kernel would.

This module holds type inference and traits; the numpy kernels are in
graphc.runtime.reference.linalg.
"""

from __future__ import annotations

from graphc.ir.types import Dim, DType, TensorType
from graphc.ops.registry import Category, InferContext, broadcast_shapes, register_op
from graphc.runtime.reference.linalg import parse_einsum

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


register_op("Gemm", category=Category.MATMUL, infer=_gemm_infer)

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


register_op("MatMul", category=Category.MATMUL, infer=_matmul_infer)

# ---- MatMulInteger -----------------------------------------------------------------------------


def _mmi_infer(ctx: InferContext):
    a, b = ctx.type(0), ctx.type(1)
    if a.dtype not in _INT8S or b.dtype not in _INT8S:
        ctx.fail(f"takes int8/uint8 inputs, got {a.dtype.name} and {b.dtype.name}")
    for i, ref in ((2, a), (3, b)):
        if ctx.has_input(i) and ctx.type(i).dtype != ref.dtype:
            ctx.fail(f"zero point {i} is {ctx.type(i).dtype.name}, its tensor {ref.dtype.name}")
    return [TensorType(DType.int32, matmul_shape(ctx, a, b))]


register_op("MatMulInteger", category=Category.MATMUL, infer=_mmi_infer)


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


register_op("Einsum", category=Category.MATMUL, infer=_einsum_infer)

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


register_op("Det", category=Category.MATMUL, infer=_det_infer)
