"""The elementwise family: Fused[Elementwise] nodes and single elementwise ops."""

from __future__ import annotations

from graphc.codegen.cuda_types import cuda_type, dtype_from_numpy_name
from graphc.codegen.epilogue import render_epilogue, step_operands
from graphc.codegen.kernel import KernelSource, StepContext, grid_1d, register_family, render
from graphc.ops.fused import IN, OP, EpilogueOp, Ref
from graphc.ops.registry import Category, get_op

BLOCK = 256


def step_epilogue(ctx: StepContext) -> tuple[tuple[EpilogueOp, ...], tuple[Ref, ...], int]:
    """The step as (epilogue ops, output refs, anchor input count): a fused node's own, or a
    single elementwise op as a one-op epilogue."""
    step = ctx.step
    opdef = get_op(step.op, step.domain)
    if opdef.category is Category.FUSED:
        a = ctx.attrs
        return a.epilogue, a.outputs, a.anchor_inputs
    attrs = ctx.attrs
    args = tuple(IN(i) for i in range(len(step.inputs)) if step.inputs[i] is not None)
    if len(args) != len(step.inputs):
        # an omitted optional input in the middle (Clip(x, , max)): keep positions
        args = tuple(IN(i) for i in range(len(step.inputs)))
    return (EpilogueOp(step.op, attrs, args),), (OP(0),), 0


operands = step_operands  # the families import it from here


def _matches(ctx: StepContext) -> bool:
    step = ctx.step
    opdef = get_op(step.op, step.domain)
    if opdef.category is Category.FUSED:
        return ctx.attrs.anchor_op is None
    return opdef.category is Category.ELEMENTWISE and len(step.outputs) == 1


def _generate(ctx: StepContext) -> list[KernelSource]:
    step = ctx.step
    where = f"{step.kind} node '{step.name}': "
    epi, outs, _ = step_epilogue(ctx)
    out_specs = [ctx.tensors[o] for o in step.outputs]
    out_shape = tuple(out_specs[0].shape)
    total = 1
    for d in out_shape:
        total *= d
    ops = operands(ctx)
    name = ctx.kernel_name()
    rendered = render_epilogue(epi, outs, ops, out_specs, out_shape, None, where=where, name=f"{name}_epi")
    storage = {i: cuda_type(op.dtype).storage for i, op in ops.items()}
    out_storage = [cuda_type(dtype_from_numpy_name(s.dtype)).storage for s in out_specs]
    # Vector path: every pointer input has the output's shape and the same element size as the
    # outputs, and the element count divides evenly.
    sizes = {dtype_from_numpy_name(s.dtype).itemsize for s in out_specs}
    sizes |= {ops[i].dtype.itemsize for i in rendered.inputs}
    vec = 1
    itemsize = max(sizes)
    if len(sizes) == 1 and all(ops[i].shape == out_shape for i in rendered.inputs):
        for cand in (16 // itemsize, 8 // itemsize, 4 // itemsize):
            if cand > 1 and total % cand == 0:
                vec = cand
                break
    params = rendered.params  # pointer inputs, then outputs
    ctx_vars = {}
    if vec > 1:
        vec_epi = render_epilogue(
            epi,
            outs,
            ops,
            out_specs,
            out_shape,
            None,
            where=where,
            name=f"{name}_epi_v",
            value_inputs=frozenset(rendered.inputs),
            out_index="0",
        )
        vec_call = [
            f"r{a[1:]}.e[k]" if a.startswith("s") else (f"w{a[3:]}.e + k" if a.startswith("out") else a)
            for a in vec_epi.args
        ]
        ctx_vars = {"vec_epilogue": vec_epi, "vec_call": vec_call}
    source = render(
        "elementwise.cu.j2",
        name=name,
        epilogue=rendered,
        epilogue_name=f"{name}_epi",
        params=params,
        block=BLOCK,
        total=total,
        vec=vec,
        vec_type={16: "uint4", 8: "uint2", 4: "unsigned int", 2: "unsigned short"}.get(vec * itemsize, ""),
        vec_inputs=rendered.inputs if vec > 1 else [],
        storage=storage,
        out_storage=out_storage,
        n_out=len(out_specs),
        **ctx_vars,
    )
    # kernel args: the pointer inputs in the order the epilogue declared them, then the outputs
    args = [step.inputs[i] for i in rendered.inputs] + list(step.outputs)
    grid = grid_1d(total // vec if vec > 1 else total, BLOCK)
    return [KernelSource("elementwise", name, source, grid, (BLOCK, 1, 1), args, params={"vec": vec})]


register_family("elementwise", _matches, _generate)
