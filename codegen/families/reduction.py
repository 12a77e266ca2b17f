"""The reduction family: Reduce*, ArgMax/ArgMin, GlobalAveragePool/GlobalMaxPool (reduction.cu.j2),
and the row-wise ops Softmax/LogSoftmax/Hardmax, LayerNormalization, RMSNormalization,
InstanceNormalization, GroupNormalization, LpNormalization and inference BatchNormalization
(rowwise.cu.j2).

A step is the plain op or a Fused node anchored on one of them; the anchor's result goes through
the fused epilogue (render_epilogue) per output element. Statistics and sums accumulate in fp32
for 16-bit floats (float64 for float64; int64 for integer sums). Static inputs (Reduce axes)
come from the weights and are baked in with the shapes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from graphc.codegen.cuda_types import cuda_type, dtype_from_numpy_name
from graphc.codegen.epilogue import RenderedEpilogue, broadcast_index, render_epilogue
from graphc.codegen.families.elementwise import operands
from graphc.codegen.kernel import KernelSource, StepContext, ceil_div, grid_1d, register_family, render
from graphc.ir.types import DType, TensorType
from graphc.ops.fused import ACC, EpilogueOp, Ref
from graphc.ops.reduction import REDUCE_OPS, reduce_axes
from graphc.ops.registry import Category, InferContext, get_op

ARG_OPS = frozenset({"ArgMax", "ArgMin"})
POOL_OPS = frozenset({"GlobalAveragePool", "GlobalMaxPool"})
SOFTMAX_OPS = frozenset({"Softmax", "LogSoftmax", "Hardmax"})
NORM_OPS = frozenset(
    {"LayerNormalization", "RMSNormalization", "InstanceNormalization", "GroupNormalization", "LpNormalization"}
)
ALL_OPS = REDUCE_OPS | ARG_OPS | POOL_OPS | SOFTMAX_OPS | NORM_OPS | {"BatchNormalization"}

_LOW_FLOATS = (DType.float16, DType.bfloat16, DType.float32)
_FLOAT_RESULT = frozenset({"ReduceL2", "ReduceLogSum", "ReduceLogSumExp"})
# Per-thread register budget of the cached row path (elements of the row held per lane).
ROW_CACHE_ELEMENTS = 32
# Row reductions with fewer outputs than this split their rows over blocks, up to about this
# many blocks in all (a few per SM of a large GPU).
SPLIT_MAX_OUT = 264
SPLIT_BLOCKS = 528
_ACC_BYTES = {"float": 4, "double": 8, "long long": 8, "unsigned long long": 8}


# ---- the anchor and its epilogue ---------------------------------------------------------------


@dataclass
class Anchor:
    op: str
    attrs: Any
    inputs: list[str | None]  # the anchor's inputs (tensor names)
    epilogue: tuple[EpilogueOp, ...]
    outputs: tuple[Ref, ...]
    out_names: list[str]  # tensors the epilogue stores
    extra_outputs: list[str]  # outputs the template stores itself (LayerNorm Mean, InvStdDev)
    out_type: TensorType  # the anchor's (first) result


def anchor_of(ctx: StepContext) -> Anchor:
    step = ctx.step
    opdef = get_op(step.op, step.domain)
    if opdef.category is Category.FUSED:
        a = ctx.attrs
        op, attrs, inputs = a.anchor_op, a.anchor_attrs, list(step.inputs[: a.anchor_inputs])
        epi, outs, names, extra = a.epilogue, a.outputs, list(step.outputs), []
    else:
        op, attrs, inputs = step.op, ctx.attrs, list(step.inputs)
        epi, outs, names, extra = (), (ACC,), [step.outputs[0]], list(step.outputs[1:])
    assert op is not None
    # The anchor's own inference gives its result type (shape and dtype) from the input specs.
    types, values = [], []
    for n in inputs:
        if n is None:
            types.append(None)
            values.append(None)
            continue
        t = ctx.tensors[n]
        types.append(TensorType(dtype_from_numpy_name(t.dtype), tuple(t.shape)))
        values.append(np.asarray(ctx.weights[n]) if t.kind == "weight" and n in ctx.weights else None)
    ictx = InferContext(op, step.name, attrs, types, values, 1)
    out_t = get_op(op).infer(ictx)[0]
    return Anchor(op, attrs, inputs, epi, outs, names, extra, out_t)


def _epilogues(
    ctx: StepContext, an: Anchor, name: str, vector: bool
) -> tuple[RenderedEpilogue, RenderedEpilogue | None]:
    """The store hook, and (vector) its variant that stores into registers (`out<k>[0]`)."""
    step = ctx.step
    where = f"{step.kind} node '{step.name}': "
    out_shape = tuple(an.out_type.shape)
    out_specs = [ctx.tensors[o] for o in an.out_names]
    for s in out_specs:
        if tuple(s.shape) != out_shape:
            raise ctx.fail(f"epilogue output '{s.name}' has shape {tuple(s.shape)}, the anchor's is {out_shape}")
    ops = operands(ctx)
    acc = an.out_type.dtype
    epi = render_epilogue(an.epilogue, an.outputs, ops, out_specs, out_shape, acc, where=where, name=f"{name}_epi")
    vec = None
    if vector:
        vec = render_epilogue(
            an.epilogue, an.outputs, ops, out_specs, out_shape, acc, where=where, name=f"{name}_epi_v", out_index="0"
        )
    return epi, vec


def _epilogue_args(ctx: StepContext, an: Anchor, epi: RenderedEpilogue) -> list[str]:
    return [ctx.step.inputs[i] for i in epi.inputs] + list(an.out_names)


def _storage(name: str, ctx: StepContext) -> str:
    return cuda_type(dtype_from_numpy_name(ctx.tensors[name].dtype)).storage


def _dtype(ctx: StepContext, name: str | None) -> DType:
    return dtype_from_numpy_name(ctx.spec(name).dtype)


# ---- small helpers ------------------------------------------------------------------------------


def pow2ceil(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def lin_expr(var: str, groups: Sequence[tuple[int, int]]) -> str:
    """The offset sum(coord_k * stride_k) of row-major linear index `var` over groups of
    (size, stride), outermost first, as a C expression (long long)."""
    if not groups:
        return "0ll"
    parts = []
    below = 1
    n = len(groups)
    for k in reversed(range(n)):
        size, stride = groups[k]
        c = var if below == 1 else f"({var} / {below}ll)"
        if k > 0:
            c = f"({c} % {size}ll)"
        parts.append(c if stride == 1 else f"{c} * {stride}ll")
        below *= size
    return "(" + " + ".join(reversed(parts)) + ")"


def c_literal(v: float | int | bool, ct: str) -> str:
    """A literal of C type ct (float, double, or an integer type)."""
    if ct in ("float", "double"):
        v = float(v)
        if math.isnan(v):
            return "__int_as_float(0x7fc00000)" if ct == "float" else "__longlong_as_double(0x7ff8000000000000ll)"
        if math.isinf(v):
            if ct == "float":
                return "__int_as_float(0x7f800000)" if v > 0 else "__int_as_float(0xff800000)"
            bits = "0x7ff0000000000000ll" if v > 0 else "0xfff0000000000000ll"
            return f"__longlong_as_double({bits})"
        return f"{v!r}f" if ct == "float" else repr(v)
    v = int(v)
    if ct.startswith("unsigned"):
        return f"{v}ull"
    if v == -(1 << 63):
        return "(-9223372036854775807ll - 1)"
    return f"({v}ll)"


def _acc_float(*dtypes: DType) -> str:
    return "double" if DType.float64 in dtypes else "float"


def _vec_width(r: int, itemsize: int) -> int:
    """The widest vector (<= 16 bytes) whose element count divides the row length r."""
    for nbytes in (16, 8, 4):
        v = nbytes // itemsize
        if v > 1 and r % v == 0:
            return v
    return 1


# ---- Reduce*, ArgMax/ArgMin, global pools -------------------------------------------------------


@dataclass
class ReduceView:
    """The input as OUT outputs of R elements: element r of output o is at base(o) + roff(r)."""

    out: int
    r: int
    base: str  # C expression of "o"
    roff: str  # C expression of "r"
    column: bool  # the innermost input dim is kept: consecutive outputs are adjacent in memory
    contiguous: bool  # rows are contiguous: base = o * R, roff = r


def reduce_view(shape: Sequence[int], axes: Sequence[int]) -> ReduceView:
    axes = set(axes)
    merged: list[list] = []
    for i, s in enumerate(shape):
        if s == 1:
            continue
        red = i in axes
        if merged and merged[-1][1] == red:
            merged[-1][0] *= s
        else:
            merged.append([s, red])
    strides = [0] * len(merged)
    acc = 1
    for k in reversed(range(len(merged))):
        strides[k] = acc
        acc *= merged[k][0]
    kept = [(s, st) for (s, red), st in zip(merged, strides, strict=True) if not red]
    reduced = [(s, st) for (s, red), st in zip(merged, strides, strict=True) if red]
    out = math.prod(s for s, _ in kept)
    r = math.prod(s for s, _ in reduced)
    column = bool(merged) and not merged[-1][1]
    contiguous = len(reduced) == 1 and bool(merged) and merged[-1][1]
    return ReduceView(out, r, lin_expr("o", kept), lin_expr("r", reduced), column, contiguous)


_COMB = {
    "ReduceSum": "GcSum",
    "ReduceMean": "GcSum",
    "ReduceL1": "GcSum",
    "ReduceL2": "GcSum",
    "ReduceSumSquare": "GcSum",
    "ReduceLogSum": "GcSum",
    "ReduceProd": "GcProd",
    "ReduceMax": "GcMax",
    "ReduceMin": "GcMin",
}


def _reduce_acc_type(op: str, dt: DType) -> str:
    if dt in _LOW_FLOATS:
        return "float"
    if dt is DType.float64 or op in _FLOAT_RESULT:
        return "double"
    if dt is DType.bool or dt.is_signed:
        return "long long"
    return "unsigned long long"


def _extreme_init(op: str, dt: DType, acc_t: str) -> str:
    is_max = op in ("ReduceMax", "ArgMax")
    if dt.is_float:
        return c_literal(-math.inf if is_max else math.inf, acc_t)
    if dt is DType.bool:
        return c_literal(0 if is_max else 1, acc_t)
    info = np.iinfo(dt.numpy)
    return c_literal(info.min if is_max else info.max, acc_t)


def _reduce_op_and_axes(ctx: StepContext, an: Anchor) -> tuple[str, tuple[int, ...]]:
    """The Reduce*/Arg op the anchor is, and its normalized axes."""
    x = ctx.spec(an.inputs[0])
    rank = len(x.shape)
    if an.op in POOL_OPS:
        return ("ReduceMean" if an.op == "GlobalAveragePool" else "ReduceMax"), tuple(range(2, rank))
    if an.op in ARG_OPS:
        return an.op, (an.attrs.axis + rank if an.attrs.axis < 0 else an.attrs.axis,)
    axes_in = None
    if len(an.inputs) > 1 and an.inputs[1] is not None:
        name = an.inputs[1]
        if ctx.tensors[name].kind != "weight" or name not in ctx.weights:
            raise ctx.fail(f"axes '{name}' must be a constant for the cuda target")
        axes_in = np.asarray(ctx.weights[name])
    return an.op, reduce_axes(np.empty((0,) * rank), axes_in, an.attrs.noop_with_empty_axes)


def reduce_search_space(ctx: StepContext) -> list[dict[str, Any]]:
    an = anchor_of(ctx)
    _, axes = _reduce_op_and_axes(ctx, an)
    view = reduce_view(ctx.spec(an.inputs[0]).shape, axes)
    if view.column:
        return [{"tx": 32, "ty": ty} for ty in (1, 4, 8, 16, 32)]
    default = _reduce_default(ctx, an, view)
    h = default["tpr"]
    space = [{"tpr": int(t)} for t in sorted({max(1, min(1024, int(h * f))) for f in (0.25, 0.5, 1, 2, 4)})]
    if "splits" in default:
        space += [{"tpr": 256, "splits": max(2, int(default["splits"] * f))} for f in (0.25, 0.5, 1, 2)]
    return space


def _reduce_default(ctx: StepContext, an: Anchor, view: ReduceView) -> dict[str, Any]:
    if view.column:
        tx = 32 if view.out >= 32 else pow2ceil(view.out)
        return {"tx": tx, "ty": max(1, min(256 // tx, pow2ceil(view.r)))}
    itemsize = _dtype(ctx, an.inputs[0]).itemsize
    vec = _vec_width(view.r, itemsize) if view.contiguous else 1
    nv = view.r // vec
    if _splittable(an.op) and view.out < SPLIT_MAX_OUT and nv >= 8192:
        # Few long rows: split each over several blocks (partials in the workspace), so that
        # the GPU fills up; each part at least 2048 loads.
        splits = min(ceil_div(nv, 2048), max(1, SPLIT_BLOCKS // view.out))
        if splits > 1:
            return {"tpr": 256, "splits": splits}
    # Eight loads in flight per lane before the shuffles.
    return {"tpr": max(1, min(1024, pow2ceil(ceil_div(nv, 8))))}


def _splittable(op: str) -> bool:
    """Reductions whose partial results combine with the reducer itself."""
    return op not in ARG_OPS and op != "ReduceLogSumExp"


def _generate_reduce(ctx: StepContext, an: Anchor) -> list[KernelSource]:
    op, axes = _reduce_op_and_axes(ctx, an)
    x = ctx.spec(an.inputs[0])
    dt = _dtype(ctx, an.inputs[0])
    view = reduce_view(x.shape, axes)
    if view.out == 0:
        return []
    name = ctx.kernel_name()
    arg = op in ARG_OPS
    if not arg:
        acc_t = _reduce_acc_type(op, dt)
    elif dt.is_float:
        acc_t = "double" if dt is DType.float64 else "float"
    else:
        acc_t = "long long" if dt.is_signed else "unsigned long long"
    params = dict(ctx.params or _reduce_default(ctx, an, view))
    vec = 1
    if not view.column:
        tpr = int(params["tpr"])
        if view.contiguous:
            vec = _vec_width(view.r, dt.itemsize)
        threads = max(tpr, 128)
        rpb = threads // tpr
        grid = (ceil_div(view.out, rpb), 1, 1)
        block = (threads, 1, 1)
        layout = dict(layout="row", tpr=tpr, rpb=rpb, threads=threads, nv=view.r // vec)
    else:
        tx, ty = int(params["tx"]), int(params["ty"])
        grid = (ceil_div(view.out, tx), 1, 1)
        block = (tx, ty, 1)
        layout = dict(layout="column", tx=tx, ty=ty, threads=tx * ty)
    epi, _ = _epilogues(ctx, an, name, vector=False)
    out_ct = cuda_type(an.out_type.dtype).compute
    ct = cuda_type(dt)
    transform = "x"
    if op == "ReduceL1" and (dt.is_float or dt.is_signed):
        transform = "(x < 0 ? -x : x)"
    elif op in ("ReduceL2", "ReduceSumSquare"):
        transform = "x * x"
    if op in ("ReduceMax", "ReduceMin", "ArgMax", "ArgMin"):
        init = _extreme_init(op, dt, acc_t)
    elif op == "ReduceLogSumExp":
        init = c_literal(-math.inf, acc_t)
    else:
        init = c_literal(1 if op == "ReduceProd" else 0, acc_t)
    finalize = "acc"
    if op == "ReduceMean":
        finalize = "(gc_acc_t)0" if view.r == 0 and acc_t not in ("float", "double") else f"acc / (gc_acc_t){view.r}"
    elif op == "ReduceL2":
        finalize = "gc_sqrt(acc)"
    elif op == "ReduceLogSum":
        finalize = "gc_log(acc)"
    common = dict(
        acc_t=acc_t,
        epilogue=epi,
        epilogue_name=f"{name}_epi",
        out_total=view.out,
        arg=arg,
        arg_max="true" if op == "ArgMax" else "false",
        arg_last="true" if arg and an.attrs.select_last_index else "false",
        arg_init=(-1 if arg and an.attrs.select_last_index else view.r),
        lse=op == "ReduceLogSumExp",
        comb=_COMB.get(op, "GcSum"),
        init=init,
        finalize=finalize,
        out_ct=out_ct,
    )
    kparams = {"op": op, "vec": vec, **params}
    splits = int(params.get("splits", 1))
    if splits > 1 and not view.column and _splittable(op):
        return _split_reduce(ctx, an, view, name, ct, transform, vec, dt.itemsize, splits, layout, common, kparams)
    source = render(
        "reduction.cu.j2",
        name=name,
        in_t=ct.storage,
        load=ct.to_compute("s"),
        transform=transform,
        r_total=view.r,
        base=view.base,
        roff=view.roff,
        vec=vec,
        vec_bytes=vec * dt.itemsize,
        partial=False,
        **common,
        **layout,
    )
    args = [an.inputs[0]] + _epilogue_args(ctx, an, epi)
    return [KernelSource("reduction", name, source, grid, block, args, params=kparams)]


def _split_reduce(
    ctx: StepContext,
    an: Anchor,
    view: ReduceView,
    name: str,
    ct: Any,
    transform: str,
    vec: int,
    itemsize: int,
    splits: int,
    layout: dict[str, Any],
    common: dict[str, Any],
    kparams: dict[str, Any],
) -> list[KernelSource]:
    """Two launches: every (row, part) reduces into the workspace, then each row's partials are
    reduced (no transform: it was applied once) and finalized through the epilogue."""
    nv = layout["nv"]
    chunk = ceil_div(nv, splits)
    splits = ceil_div(nv, chunk)  # no empty parts
    acc_t = common["acc_t"]
    part = render(
        "reduction.cu.j2",
        name=f"{name}_part",
        in_t=ct.storage,
        load=ct.to_compute("s"),
        transform=transform,
        r_total=view.r,
        base=view.base,
        roff=view.roff,
        vec=vec,
        vec_bytes=vec * itemsize,
        partial=True,
        splits=splits,
        chunk=chunk,
        **common,
        **layout,
    )
    rpb = layout["rpb"]
    ws_bytes = view.out * splits * _ACC_BYTES[acc_t]
    k1 = KernelSource(
        "reduction",
        f"{name}_part",
        part,
        (ceil_div(view.out * splits, rpb), 1, 1),
        (layout["threads"], 1, 1),
        [an.inputs[0], "@workspace"],
        params={**kparams, "splits": splits},
        workspace_bytes=ws_bytes,
    )
    tpr = min(pow2ceil(splits), 256)
    threads = max(tpr, 128)
    final = render(
        "reduction.cu.j2",
        name=name,
        in_t=acc_t,
        load="s",
        transform="x",
        r_total=splits,
        base=f"(o * {splits}ll)",
        roff="r",
        vec=1,
        vec_bytes=_ACC_BYTES[acc_t],
        partial=False,
        layout="row",
        tpr=tpr,
        rpb=threads // tpr,
        threads=threads,
        nv=splits,
        **common,
    )
    epi = common["epilogue"]
    k2 = KernelSource(
        "reduction",
        name,
        final,
        (ceil_div(view.out, threads // tpr), 1, 1),
        (threads, 1, 1),
        ["@workspace"] + _epilogue_args(ctx, an, epi),
        params={"op": kparams["op"], "splits": splits, "tpr": tpr},
        workspace_bytes=ws_bytes,
    )
    return [k1, k2]


# ---- row-wise: softmax family and normalizations ------------------------------------------------


@dataclass
class RowPlan:
    rows: int
    r: int
    inner: int  # > 1: the softmax axis is not innermost (column layout)


def _row_default(r: int, vec: int) -> dict[str, Any]:
    nv = ceil_div(r, vec)
    # About four chunks per lane: enough loads in flight, and rows up to 32K elements stay in
    # registers (ROW_CACHE_ELEMENTS per lane at 1024 lanes).
    return {"tpr": max(1, min(1024, pow2ceil(ceil_div(nv, 4))))}


def _param_index(ctx: StepContext, name: str, x_shape: Sequence[int], axis: int, r: int) -> str:
    """Index into a LayerNorm/RMSNorm scale or bias (unidirectionally broadcast to X) of element
    r of row `row`: plain `r` when the parameter spans exactly the normalized dims."""
    shape = tuple(ctx.spec(name).shape)
    rank = len(x_shape)
    padded = (1,) * (rank - len(shape)) + shape
    if math.prod(shape) == 1:
        return "0"
    if all(d == 1 for d in padded[:axis]) and tuple(padded[axis:]) == tuple(x_shape[axis:]):
        return "r"
    return broadcast_index(shape, x_shape, f"(row * {r}ll + r)")


def _preloaded(
    ctx: StepContext, an: Anchor, x_shape: Sequence[int], axis: int, r: int, vec: int, scale: str, bias: str | None
) -> tuple[str, str | None, list[dict[str, Any]]]:
    """LayerNorm/RMSNorm scale and bias read as VEC-wide vectors with the row, before the
    reductions, where each spans exactly the normalized dims (index r) and a vector of it is 4-16
    bytes: (scale, bias, the template's preload list). Either stays a scalar load per element
    otherwise (a broadcast parameter). The store pass reads registers g0 / g1 at [k][e].
    Measured on an H200 (2026-12-04, tools/bench_rownorm.py, fp16, 768 wide, us per norm in a CUDA
    graph; docs/results/h200_rownorm_preload_2026-12-04.md): LayerNorm 1.52 / 2.01 / 4.56 at 128 /
    1024 / 4096 rows against 2.29 / 2.99 / 6.21 with the scalar loads; RMSNorm 2.22 against 2.56 at
    1024; GPT-2 and BERT-base at batch 8 0.890 -> 0.820 and 0.770 -> 0.693 ms."""
    preload = []
    out = [scale, bias]
    for slot, k in enumerate((1, 2)):
        n = an.inputs[k] if k < len(an.inputs) else None
        if n is None or _param_index(ctx, n, x_shape, axis, r) != "r":
            continue
        dt = _dtype(ctx, n)
        if vec * dt.itemsize not in (4, 8, 16):
            continue
        ct = cuda_type(dt)
        reg = f"g{slot}"
        preload.append(
            {
                "what": ("scale", "bias")[slot],
                "reg": reg,
                "ptr": f"a{k}",
                "storage": ct.storage,
                "vec_bytes": vec * dt.itemsize,
                "convert": ct.to_compute("raw.e[e]"),
            }
        )
        out[slot] = f"{reg}[k][e]"
    return out[0], out[1], preload


def _row_plan(ctx: StepContext, an: Anchor) -> RowPlan:
    shape = tuple(ctx.spec(an.inputs[0]).shape)
    rank = len(shape)
    op = an.op
    if op in SOFTMAX_OPS or op == "LpNormalization":
        axis = an.attrs.axis + rank if an.attrs.axis < 0 else an.attrs.axis
        return RowPlan(math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1 :]))
    if op in ("LayerNormalization", "RMSNormalization"):
        axis = an.attrs.axis + rank if an.attrs.axis < 0 else an.attrs.axis
        return RowPlan(math.prod(shape[:axis]), math.prod(shape[axis:]), 1)
    if op == "InstanceNormalization":
        return RowPlan(shape[0] * shape[1], math.prod(shape[2:]), 1)
    if op == "GroupNormalization":
        g = an.attrs.num_groups
        return RowPlan(shape[0] * g, (shape[1] // g) * math.prod(shape[2:]), 1)
    raise ctx.fail(f"{op} is not a row-wise op")


def rowwise_search_space(ctx: StepContext) -> list[dict[str, Any]]:
    an = anchor_of(ctx)
    if an.op == "BatchNormalization":
        return [{"block": 256}]
    plan = _row_plan(ctx, an)
    if plan.inner > 1:
        return [{"block": b} for b in (128, 256)]
    dt = _dtype(ctx, an.inputs[0])
    h = _row_default(plan.r, _vec_width(plan.r, dt.itemsize))["tpr"]
    return [{"tpr": t} for t in sorted({max(1, min(1024, int(h * f))) for f in (0.25, 0.5, 1, 2, 4)})]


def _generate_rowwise(ctx: StepContext, an: Anchor) -> list[KernelSource]:
    x = ctx.spec(an.inputs[0])
    xdt = _dtype(ctx, an.inputs[0])
    if math.prod(x.shape) == 0:
        return []
    name = ctx.kernel_name()
    op = an.op
    ct = cuda_type(xdt)
    # Parameter pointers a1.. (scale, bias, mean, var) and template stats outputs st0..
    param_inputs = [n for n in an.inputs[1:] if n is not None]
    kernel_params = [f"const {ct.storage}* __restrict__ a0"]
    args = [an.inputs[0]]
    for k, n in enumerate(an.inputs[1:], start=1):
        if n is None:
            continue
        kernel_params.append(f"const {_storage(n, ctx)}* __restrict__ a{k}")
        args.append(n)

    def load(n: str, index: str, acc_t: str) -> str:
        return f"({acc_t})({cuda_type(_dtype(ctx, n)).to_compute(f'a{an.inputs.index(n)}[{index}]')})"

    ctx_vars: dict[str, Any] = {}
    stash_f64 = False
    if op in ("LayerNormalization", "RMSNormalization", "GroupNormalization"):
        stash_f64 = an.attrs.stash_type == DType.float64.value
    acc_t = "double" if stash_f64 else _acc_float(xdt, *(_dtype(ctx, n) for n in param_inputs))
    out_ct = cuda_type(an.out_type.dtype).compute

    if op == "BatchNormalization":
        if an.attrs.training_mode:
            raise ctx.fail("training_mode=1 is not supported by the cuda target (inference only)")
        total = math.prod(x.shape)
        inner = math.prod(x.shape[2:])
        threads = int((ctx.params or {}).get("block", 256))
        epi, _ = _epilogues(ctx, an, name, vector=False)
        kernel_params += epi.params
        s, b, m, v = an.inputs[1:5]
        source = render(
            "rowwise.cu.j2",
            name=name,
            layout="bn",
            kind="bn",
            in_t=ct.storage,
            acc_t=acc_t,
            load=ct.to_compute("s"),
            epilogue=epi,
            epilogue_name=f"{name}_epi",
            vstore=False,
            kernel_params=kernel_params,
            threads=threads,
            total=total,
            inner=inner,
            channels=x.shape[1],
            eps=c_literal(an.attrs.epsilon, acc_t),
            scale=load(s, "c", acc_t),
            bias=load(b, "c", acc_t),
            bn_mean=load(m, "c", acc_t),
            bn_var=load(v, "c", acc_t),
            out_ct=out_ct,
        )
        args += _epilogue_args(ctx, an, epi)
        return [KernelSource("reduction", name, source, grid_1d(total, threads), (threads, 1, 1), args)]

    plan = _row_plan(ctx, an)
    kind = {
        "Softmax": "softmax",
        "LogSoftmax": "logsoftmax",
        "Hardmax": "hardmax",
        "LayerNormalization": "layernorm",
        "InstanceNormalization": "layernorm",
        "GroupNormalization": "layernorm",
        "RMSNormalization": "rmsnorm",
        "LpNormalization": "lpnorm",
    }[op]
    common = dict(
        name=name,
        kind=kind,
        in_t=ct.storage,
        acc_t=acc_t,
        load=ct.to_compute("s"),
        epilogue_name=f"{name}_epi",
        rows=plan.rows,
        r_total=plan.r,
        inner=plan.inner,
        neg_inf=c_literal(-math.inf, acc_t),
        out_ct=out_ct,
        lp=an.attrs.p if op == "LpNormalization" else 0,
    )
    if plan.inner > 1:
        threads = int((ctx.params or {}).get("block", 128))
        epi, _ = _epilogues(ctx, an, name, vector=False)
        kernel_params += epi.params
        source = render(
            "rowwise.cu.j2",
            layout="column",
            epilogue=epi,
            vstore=False,
            kernel_params=kernel_params,
            threads=threads,
            **common,
        )
        args += _epilogue_args(ctx, an, epi)
        grid = (ceil_div(plan.rows * plan.inner, threads), 1, 1)
        return [KernelSource("reduction", name, source, grid, (threads, 1, 1), args, params={"block": threads})]

    vec = _vec_width(plan.r, xdt.itemsize)
    params = dict(ctx.params or _row_default(plan.r, vec))
    tpr = int(params["tpr"])
    nv = plan.r // vec
    items = ceil_div(nv, tpr)
    if items * vec > ROW_CACHE_ELEMENTS:
        items = 0  # a long row: every pass re-reads it
    threads = max(tpr, 128)
    rpb = threads // tpr
    out_dts = [_dtype(ctx, n) for n in an.out_names]
    vstore = vec > 1 and all(vec * d.itemsize in (2, 4, 8, 16) for d in out_dts)
    epi, vepi = _epilogues(ctx, an, name, vector=vstore)
    kernel_params += epi.params
    ctx_vars = {}
    if vstore:
        assert vepi is not None
        ctx_vars = dict(
            vec_epilogue=vepi,
            vec_call=[f"w{a[3:]}.e + e" if a.startswith("out") else a for a in vepi.args],
            out_storage=[cuda_type(d).storage for d in out_dts],
            out_vec_bytes=[vec * d.itemsize for d in out_dts],
            n_out=len(out_dts),
        )
    norm: dict[str, Any] = {}
    stats: list[str] = []
    preload: list[dict[str, Any]] = []
    if kind in ("layernorm", "rmsnorm"):
        eps = an.attrs.epsilon
        if op in ("LayerNormalization", "RMSNormalization"):
            axis = an.attrs.axis + len(x.shape) if an.attrs.axis < 0 else an.attrs.axis
            scale = load(an.inputs[1], _param_index(ctx, an.inputs[1], x.shape, axis, plan.r), acc_t)
            bias = None
            if len(an.inputs) > 2 and an.inputs[2] is not None:
                bias = load(an.inputs[2], _param_index(ctx, an.inputs[2], x.shape, axis, plan.r), acc_t)
            if int(params.get("preload", 1)) and items and vec > 1:
                scale, bias, preload = _preloaded(ctx, an, x.shape, axis, plan.r, vec, scale, bias)
        elif op == "InstanceNormalization":
            c = x.shape[1]
            scale = load(an.inputs[1], f"(row % {c}ll)", acc_t)
            bias = load(an.inputs[2], f"(row % {c}ll)", acc_t)
        else:
            g = an.attrs.num_groups
            per = x.shape[1] // g
            spatial = math.prod(x.shape[2:])
            chan = f"((row % {g}ll) * {per}ll + r / {spatial}ll)"
            scale = load(an.inputs[1], chan, acc_t)
            bias = load(an.inputs[2], chan, acc_t)
        norm = dict(
            eps=c_literal(eps, acc_t),
            scale=scale,
            bias=bias,
            divide=op != "LayerNormalization",
        )
        for k, (n, var) in enumerate(zip(an.extra_outputs, ("mean", "inv"), strict=False)):
            sdt = _dtype(ctx, n)
            stats.append(cuda_type(sdt).to_storage(f"({cuda_type(sdt).compute})({var})"))
            kernel_params.append(f"{cuda_type(sdt).storage}* __restrict__ st{k}")
    source = render(
        "rowwise.cu.j2",
        layout="row",
        epilogue=epi,
        vstore=vstore,
        kernel_params=kernel_params,
        threads=threads,
        tpr=tpr,
        rpb=rpb,
        vec=vec,
        vec_bytes=vec * xdt.itemsize,
        nv=nv,
        items=items,
        stats=stats,
        preload=preload,
        **norm,
        **ctx_vars,
        **common,
    )
    args += _epilogue_args(ctx, an, epi) + an.extra_outputs[: len(stats)]
    grid = (ceil_div(plan.rows, rpb), 1, 1)
    kparams = {"tpr": tpr, "vec": vec, "items": items, "vstore": vstore, "preload": int(bool(preload))}
    return [KernelSource("reduction", name, source, grid, (threads, 1, 1), args, params=kparams)]


# ---- the family ---------------------------------------------------------------------------------


def _anchor_op(ctx: StepContext) -> str | None:
    step = ctx.step
    try:
        opdef = get_op(step.op, step.domain)
    except Exception:
        return None
    if opdef.category is Category.FUSED:
        a = ctx.attrs
        return a.anchor_op if not a.anchor_domain else None
    return step.op if step.domain == "" else None


def _matches(ctx: StepContext) -> bool:
    return _anchor_op(ctx) in ALL_OPS


def _generate(ctx: StepContext) -> list[KernelSource]:
    an = anchor_of(ctx)
    if an.op in REDUCE_OPS or an.op in ARG_OPS or an.op in POOL_OPS:
        return _generate_reduce(ctx, an)
    return _generate_rowwise(ctx, an)


def _search_space(ctx: StepContext) -> list[dict[str, Any]]:
    op = _anchor_op(ctx)
    if op in REDUCE_OPS or op in ARG_OPS or op in POOL_OPS:
        return reduce_search_space(ctx)
    return rowwise_search_space(ctx)


register_family("reduction", _matches, _generate, _search_space)
