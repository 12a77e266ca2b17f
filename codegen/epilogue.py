"""Rendering a fused epilogue DAG into a CUDA device function: the store hook of every template.

The template computes `acc` for one output element (its linear index `idx` in the output shape)
and calls

    gc_epilogue(acc, idx, <epilogue args>)

which loads the extra inputs (broadcast by index arithmetic with the shapes baked in), evaluates
the DAG in fp32 (or the ops' own integer/bool/double types), and stores every output. Templates
never know which epilogue they carry. Size-1 constants are baked in as literals.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from graphc.codegen.cuda_types import cuda_type
from graphc.codegen.expr import lit, render_op
from graphc.ir.types import DType
from graphc.ops.fused import ACC, EpilogueOp, Ref
from graphc.ops.registry import InferContext, get_op
from graphc.runtime.plan import TensorSpec


@dataclass
class Operand:
    """A node input as the kernel sees it."""

    index: int
    dtype: DType
    shape: tuple[int, ...]
    const: np.ndarray | None = None  # its value, where it is a weight (size-1 ones are baked)


@dataclass
class RenderedEpilogue:
    function: str  # the device function's source
    params: list[str]  # parameter declarations, e.g. "const float* __restrict__ in2"
    args: list[str]  # the names to pass, e.g. "in2"
    inputs: list[int]  # node input indices passed as pointers
    outputs: list[int] = field(default_factory=list)  # node output indices stored


def step_operands(ctx) -> dict[int, Operand]:
    """Every present input of a plan step as an Operand (weights carry their values, so that
    size-1 constants are baked in)."""
    from graphc.codegen.cuda_types import dtype_from_numpy_name

    ops = {}
    for i, name in enumerate(ctx.step.inputs):
        if name is None:
            continue
        t = ctx.tensors[name]
        const = ctx.weights.get(name) if t.kind == "weight" else None
        ops[i] = Operand(i, dtype_from_numpy_name(t.dtype), tuple(t.shape), const)
    return ops


def broadcast_index(in_shape: Sequence[int], out_shape: Sequence[int], idx: str = "idx") -> str:
    """The linear index into an input broadcast (numpy rules) to out_shape, for output index idx."""
    in_shape = tuple(in_shape)
    out_shape = tuple(out_shape)
    n_in = math.prod(in_shape)
    if n_in == 1:
        return "0"
    if in_shape == out_shape:
        return idx
    rank = len(out_shape)
    padded = (1,) * (rank - len(in_shape)) + in_shape
    # A trailing block that matches exactly: idx modulo its size.
    k = rank
    while k > 0 and padded[k - 1] == out_shape[k - 1]:
        k -= 1
    if all(d == 1 for d in padded[:k]):
        return f"({idx} % {n_in}ll)"
    terms = []
    in_stride = 1
    out_stride = 1
    in_strides = [0] * rank
    out_strides = [0] * rank
    for d in range(rank - 1, -1, -1):
        in_strides[d] = in_stride if padded[d] != 1 else 0
        out_strides[d] = out_stride
        in_stride *= padded[d]
        out_stride *= out_shape[d]
    for d in range(rank):
        if in_strides[d] == 0:
            continue
        coord = f"(({idx} / {out_strides[d]}ll) % {out_shape[d]}ll)" if d > 0 else f"({idx} / {out_strides[d]}ll)"
        terms.append(coord if in_strides[d] == 1 else f"{coord} * {in_strides[d]}ll")
    return "(" + " + ".join(terms) + ")" if terms else "0"


# 16-bit floats are computed in fp32 (cuda_types.py): a value of such a type inside an epilogue
# may hold more precision than the stored tensor would.
ROUNDED = frozenset({DType.float16, DType.bfloat16})


def exact_cast(
    args: Sequence[str], in_types: Sequence[DType | None], out_t: DType, attrs, where: str = ""
) -> tuple[list[str], str]:
    """A Cast inside a kernel, bit for bit the separate Cast kernel: a 16-bit float input is first
    rounded to its type (the unfused producer would have stored it so: fp16 -> fp32 after a GEMM
    gives float(half(acc)), not acc), and a 16-bit float result is rounded to its type (what a
    consumer of the stored Cast output would have loaded). Rounding is idempotent, so a value
    loaded from memory or stored right after loses nothing."""
    args = list(args)
    src = in_types[0]
    if src in ROUNDED:
        ct = cuda_type(src, where)
        args[0] = ct.to_compute(ct.to_storage(args[0]))
    expr = render_op("Cast", attrs, args, in_types, out_t, where=where)
    if out_t in ROUNDED and src is not out_t:
        ct = cuda_type(out_t, where)
        expr = ct.to_compute(ct.to_storage(expr))
    return args, expr


def render_epilogue(
    epilogue: Sequence[EpilogueOp],
    outputs: Sequence[Ref],
    operands: Mapping[int, Operand],
    out_specs: Sequence[TensorSpec],
    out_shape: Sequence[int],
    acc_dtype: DType | None,
    *,
    where: str = "",
    name: str = "gc_epilogue",
    value_inputs: frozenset[int] = frozenset(),
    out_index: str = "idx",
) -> RenderedEpilogue:
    """Render the DAG. `operands` are the node inputs the epilogue may read (by index);
    `acc_dtype` is the anchor result's dtype (None: no anchor). Inputs in `value_inputs` arrive
    as stored values `s<i>` instead of pointers (a vectorized caller loaded them already);
    outputs are stored at `out<k>[<out_index>]`."""
    from graphc.codegen.cuda_types import dtype_from_numpy_name

    lines: list[str] = []
    used_inputs: list[int] = []
    loaded: dict[int, str] = {}
    types: dict[Ref, DType] = {}
    exprs: dict[Ref, str] = {}
    if acc_dtype is not None:
        types[ACC] = acc_dtype
        exprs[ACC] = "acc"

    def value(ref: Ref) -> tuple[str, DType | None]:
        if ref.kind == "in" and ref.index not in operands:
            return "", None  # an omitted optional input (Clip without a min)
        if ref.kind == "in" and ref not in exprs:
            op = operands[ref.index]
            ct = cuda_type(op.dtype, where)
            if op.const is not None and op.const.size == 1:
                v = op.const.reshape(-1)[0]
                exprs[ref] = lit(v.item() if hasattr(v, "item") else v, ct.compute)
            else:
                var = f"x{ref.index}"
                if ref.index not in loaded:
                    if ref.index not in used_inputs:
                        used_inputs.append(ref.index)
                    if ref.index in value_inputs:
                        src = f"s{ref.index}"
                    else:
                        src = f"in{ref.index}[{broadcast_index(op.shape, out_shape)}]"
                    lines.append(f"  const {ct.compute} {var} = {ct.to_compute(src)};")
                    loaded[ref.index] = var
                exprs[ref] = var
            types[ref] = op.dtype
        return exprs[ref], types[ref]

    for j, e in enumerate(epilogue):
        args, in_types = [], []
        for r in e.args:
            x, t = value(r)
            args.append(x)
            in_types.append(t)
        opdef = get_op(e.op)
        # The op's own inference gives its output dtype (shapes do not matter here).
        from graphc.ir.types import TensorType

        ctx = InferContext(
            e.op,
            where,
            e.attrs,
            [None if t is None else TensorType(t, ()) for t in in_types],
            [None] * len(in_types),
            1,
        )
        out_t = opdef.infer(ctx)[0].dtype
        ct = cuda_type(out_t, where).compute
        if e.op == "Cast":
            args, expr = exact_cast(args, in_types, out_t, e.attrs, where)
        else:
            expr = render_op(e.op, e.attrs, args, in_types, out_t, where=where)
        lines.append(f"  const {ct} v{j} = {expr};")
        exprs[Ref("op", j)] = f"v{j}"
        types[Ref("op", j)] = out_t

    params: list[str] = []
    call: list[str] = []
    for i in used_inputs:
        ct = cuda_type(operands[i].dtype, where)
        if i in value_inputs:
            params.append(f"const {ct.storage} s{i}")
            call.append(f"s{i}")
        else:
            params.append(f"const {ct.storage}* __restrict__ in{i}")
            call.append(f"in{i}")
    for k, (ref, spec) in enumerate(zip(outputs, out_specs, strict=True)):
        x, t = value(ref)
        dt = dtype_from_numpy_name(spec.dtype)
        ct = cuda_type(dt, where)
        if t != dt:
            raise ValueError(f"{where.rstrip(': ')}: epilogue output {k} is {t.name}, tensor is {dt.name}")
        lines.append(f"  out{k}[{out_index}] = {ct.to_storage(x)};")
        params.append(f"{ct.storage}* __restrict__ out{k}")
        call.append(f"out{k}")
    acc_param = f"{cuda_type(acc_dtype, where).compute} acc, " if acc_dtype is not None else ""
    fn = (
        f"__device__ __forceinline__ void {name}({acc_param}long long idx"
        + "".join(f", {p}" for p in params)
        + ") {\n"
        + "\n".join(lines)
        + "\n}\n"
    )
    return RenderedEpilogue(fn, params, call, used_inputs, list(range(len(outputs))))
