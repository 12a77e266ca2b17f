"""Control flow: If, Loop and Scan, whose attributes hold subgraphs (graphc.ir.graph.Graph).

A subgraph is closed: what it reads from an enclosing scope is one of its `captures`, bound by
position to the node's trailing inputs (If: the then-branch's captures, then the else-branch's).
Inference checks that binding (count and types) and derives output types from the subgraphs'
output types; a dim that differs between the branches, or between a loop's initial and carried
value, is unknown. Reference semantics: graphc.runtime.reference.control_flow.
"""

from __future__ import annotations

import numpy as np

from graphc.ir.graph import Graph
from graphc.ir.registry import Category, InferContext, register_op
from graphc.ir.types import DType, OptionalType, SequenceType, TensorType, ValueType


def merge_types(a: ValueType, b: ValueType) -> ValueType | None:
    """The most precise type both values fit (None when their dtypes or kinds differ)."""
    if a == b:
        return a
    if isinstance(a, OptionalType) or isinstance(b, OptionalType):
        # an optional and a value of its element type (or two optionals): an optional of both
        ea = a.elem if isinstance(a, OptionalType) else a
        eb = b.elem if isinstance(b, OptionalType) else b
        elem = merge_types(ea, eb)
        return None if elem is None or isinstance(elem, OptionalType) else OptionalType(elem)
    if isinstance(a, SequenceType) and isinstance(b, SequenceType):
        elem = merge_types(a.elem, b.elem)
        if not isinstance(elem, TensorType):
            return None
        return SequenceType(elem, a.length if a.length == b.length else None)
    if not (isinstance(a, TensorType) and isinstance(b, TensorType)) or a.dtype != b.dtype:
        return None
    if a.shape is None or b.shape is None or len(a.shape) != len(b.shape):
        return TensorType(a.dtype, None)
    return TensorType(a.dtype, tuple(x if x == y else None for x, y in zip(a.shape, b.shape, strict=True)))


def _fits(actual: ValueType | None, declared: ValueType) -> bool:
    """An outer value may be bound to a subgraph value declared at most as precise (a symbolic
    or unknown dim of the subgraph takes any dim: shapes bound after import are concrete)."""
    if actual is None:
        return False
    if actual == declared:
        return True
    if isinstance(declared, OptionalType):  # a value, or an optional, bound to an optional slot
        return _fits(actual.elem if isinstance(actual, OptionalType) else actual, declared.elem)
    if isinstance(actual, SequenceType) and isinstance(declared, SequenceType):
        return _fits(actual.elem, declared.elem) and declared.length in (None, actual.length)
    if not (isinstance(actual, TensorType) and isinstance(declared, TensorType)) or actual.dtype != declared.dtype:
        return False
    if declared.shape is None:
        return True
    if actual.shape is None or len(actual.shape) != len(declared.shape):
        return False
    return all(not isinstance(d, int) or d == a for a, d in zip(actual.shape, declared.shape, strict=True))


def specialized_output_types(
    sub: Graph, types: list[ValueType | None], values: list[np.ndarray | None]
) -> list[ValueType] | None:
    """The subgraph's output types re-inferred over the actual types (and known values) of what
    is bound to its inputs and captures, e.g. concrete shapes bound after import where the
    exporter declared symbols. None where that inference fails (the declared types stand)."""
    return specialize(sub, types, values)[0]


def specialize(
    sub: Graph, types: list[ValueType | None], values: list[np.ndarray | None]
) -> tuple[list[ValueType] | None, str | None]:
    """specialized_output_types, with the error where the subgraph does not type-check over
    those types (None when it does, or when there is too little to re-infer over)."""
    from graphc.errors import GraphcError
    from graphc.ir.builder import GraphBuilder

    params = (*sub.inputs, *sub.captures)
    if len(types) != len(params) or any(t is None for t in types):
        return None, None
    b = GraphBuilder(sub.name, sub.opset)
    env = {}
    try:
        for p, t, val in zip(params, types, values, strict=True):
            v = b.add_input(p.name, t)  # type: ignore[arg-type]
            if val is not None:
                b.known[v.name] = val
            env[p.name] = v
        for name, c in sub.constants.items():
            env[name] = b.add_constant(c.data, name, keep_name=True)
        for n in sub.nodes:
            ins = [None if v is None else env[v.name] for v in n.inputs]
            outs = b.add_node(n.op, ins, n.attrs, name=n.name, outputs=list(n.output_names), domain=n.domain)
            env.update({v.name: nv for v, nv in zip(n.outputs, outs.outputs, strict=True)})
    except GraphcError as e:
        return None, str(e).splitlines()[0] if str(e) else type(e).__name__
    return [env[v.name].type for v in sub.outputs], None


def _subgraph(ctx: InferContext, field: str) -> Graph:
    g = getattr(ctx.attrs, field, None)
    if not isinstance(g, Graph):
        ctx.fail(f"attribute '{field}' must be a subgraph, got {type(g).__name__}")
    return g


def _check_captures(ctx: InferContext, sub: Graph, first: int, what: str) -> None:
    for j, cap in enumerate(sub.captures):
        i = first + j
        if i >= len(ctx.input_types) or not _fits(ctx.input_types[i], cap.type):
            got = ctx.input_types[i] if i < len(ctx.input_types) else "nothing"
            ctx.fail(f"{what} capture '{cap.name}' ({cap.type}) is bound to input {i} of type {got}")


def _scalar_bool(ctx: InferContext, i: int, what: str) -> None:
    t = ctx.type(i)
    if t.dtype != DType.bool or (t.is_static and t.numel != 1):
        ctx.fail(f"{what} must be a bool tensor of one element, got {t}")


def _if_infer(ctx: InferContext) -> list[ValueType]:
    then_b, else_b = _subgraph(ctx, "then_branch"), _subgraph(ctx, "else_branch")
    _scalar_bool(ctx, 0, "the condition (input 0)")
    nt, ne = len(then_b.captures), len(else_b.captures)
    if len(ctx.input_types) != 1 + nt + ne:
        ctx.fail(f"takes the condition and {nt} + {ne} captures, got {len(ctx.input_types)} inputs")
    _check_captures(ctx, then_b, 1, "then-branch")
    _check_captures(ctx, else_b, 1 + nt, "else-branch")
    if len(then_b.outputs) != len(else_b.outputs):
        ctx.fail(f"the branches have {len(then_b.outputs)} and {len(else_b.outputs)} outputs")
    caps_t, caps_v = list(ctx.input_types[1:]), list(ctx.input_values[1:])
    then_s, then_err = specialize(then_b, caps_t[:nt], caps_v[:nt])
    else_s, else_err = specialize(else_b, caps_t[nt:], caps_v[nt:])
    then_t = then_s or [v.type for v in then_b.outputs]
    else_t = else_s or [v.type for v in else_b.outputs]
    # With every input's shape known, a branch that does not type-check over them cannot run on
    # them (ONNX Runtime fails inside it too): silero_vad's 8 kHz branch on a 16 kHz chunk.
    static = all(isinstance(t, TensorType) and t.is_static for t in caps_t)
    cond = ctx.value(0)
    if cond is not None and np.asarray(cond).size == 1:  # the branch taken is known: its types
        taken = bool(np.asarray(cond).reshape(()))
        err = then_err if taken else else_err
        if static and err is not None:
            ctx.fail(f"its {'then' if taken else 'else'}-branch, which the condition takes, does not type-check: {err}")
        return then_t if taken else else_t
    if static and (then_err is None) != (else_err is None):
        # the outputs are the branch that can run (the engine refuses a run that takes the other)
        return then_t if else_err is not None else else_t
    out = []
    for i, (a, b) in enumerate(zip(then_t, else_t, strict=True)):
        m = merge_types(a, b)
        if m is None:
            ctx.fail(f"output {i} is {a} in the then-branch and {b} in the else-branch")
        out.append(m)
    return out


def body_cond_passthrough(body: Graph) -> bool | None:
    """What a Loop body's condition output is, when it does not depend on the iteration's data:
    True/False for a constant, True for the body's condition input passed through (Identity or
    the input itself, which the trip count then bounds); None when it is computed."""
    out = body.outputs[0]
    if out.name in body.constants:
        return bool(np.asarray(body.constants[out.name].data).reshape(()))
    name = out.name
    producer = body.producer(name)
    while producer is not None and producer.op == "Identity" and producer.inputs[0] is not None:
        name = producer.inputs[0].name
        producer = body.producer(name)
    if name in body.constants:
        return bool(np.asarray(body.constants[name].data).reshape(()))
    if len(body.inputs) > 1 and name == body.inputs[1].name:
        return True
    return None


def static_trip_count(m: np.ndarray | None, cond: np.ndarray | None, has_cond: bool, body: Graph) -> int | None:
    """The number of iterations a Loop runs, when known at compile time: its trip count M is
    known, its initial condition is absent or known, and the body's condition output does not
    depend on data (no early exit). None otherwise."""
    if m is None:
        return None
    trip = max(int(np.asarray(m).reshape(())), 0)
    if has_cond:
        if cond is None:
            return None
        if not bool(np.asarray(cond).reshape(())):
            return 0
    after = body_cond_passthrough(body)
    if after is None:
        return None
    return trip if after else min(trip, 1)


def _loop_infer(ctx: InferContext) -> list[ValueType]:
    body = _subgraph(ctx, "body")
    c = len(body.captures)
    n = len(ctx.input_types) - 2 - c
    if n < 0 or len(body.inputs) != 2 + n:
        ctx.fail(f"the body takes {len(body.inputs)} inputs; the node gives 2 + {max(n, 0)} carried values")
    k = len(body.outputs) - 1 - n
    if k < 0:
        ctx.fail(f"the body gives {len(body.outputs)} outputs, fewer than 1 + {n} carried values")
    if ctx.has_input(0):
        t = ctx.type(0)
        if t.dtype != DType.int64:
            ctx.fail(f"the trip count M must be int64, got {t}")
    if ctx.has_input(1):
        _scalar_bool(ctx, 1, "the condition (input 1)")
    _check_captures(ctx, body, 2 + n, "body")
    declared = [v.type for v in body.outputs]
    # The body over the actual types: its carried outputs, where they keep the initial types (a
    # fixed point), and its scan outputs are then what every iteration gives.
    spec = specialized_output_types(
        body,
        [TensorType(DType.int64, ()), TensorType(DType.bool, ()), *ctx.input_types[2:]],
        [None, None, *([None] * n), *ctx.input_values[2 + n :]],
    )
    if spec is not None and all(spec[1 + j] == ctx.input_types[2 + j] for j in range(n)):
        declared = spec
    out: list[ValueType] = []
    for j in range(n):
        init, carried = ctx.input_types[2 + j], declared[1 + j]
        m = None if init is None else merge_types(init, carried)
        if m is None:
            ctx.fail(f"loop-carried value {j} starts as {init} and the body gives {carried}")
        out.append(m)
    trip = static_trip_count(ctx.value(0), ctx.value(1), ctx.has_input(1), body)
    for j in range(k):
        t = declared[1 + n + j]
        if not isinstance(t, TensorType):
            ctx.fail(f"scan output {j} must be a tensor, got {t}")
        out.append(TensorType(t.dtype, None if t.shape is None else (trip, *t.shape)))
    return out


def _scan_infer(ctx: InferContext) -> list[ValueType]:
    body = _subgraph(ctx, "body")
    a = ctx.attrs
    m = int(a.num_scan_inputs)
    c = len(body.captures)
    n = len(ctx.input_types) - m - c
    if n < 0 or len(body.inputs) != n + m:
        ctx.fail(f"the body takes {len(body.inputs)} inputs; the node gives {max(n, 0)} states + {m} scan inputs")
    k = len(body.outputs) - n
    if k < 0:
        ctx.fail(f"the body gives {len(body.outputs)} outputs, fewer than its {n} states")
    in_axes = list(a.scan_input_axes or [0] * m)
    out_axes = list(a.scan_output_axes or [0] * k)
    if len(in_axes) != m or len(out_axes) != k:
        ctx.fail(f"scan_input_axes/scan_output_axes have {len(in_axes)}/{len(out_axes)} entries for {m}/{k}")
    _check_captures(ctx, body, n + m, "body")
    length = None
    for j in range(m):
        t = ctx.type(n + j)
        if t.shape is not None:
            d = t.shape[ctx.axis(in_axes[j], len(t.shape))]
            if isinstance(d, int):
                if isinstance(length, int) and length != d:
                    ctx.fail(f"scan inputs have lengths {length} and {d}")
                length = d
    slice_types: list[ValueType | None] = []
    for j in range(m):
        t = ctx.type(n + j)
        if t.shape is None:
            slice_types.append(None)
        else:
            ax = ctx.axis(in_axes[j], len(t.shape))
            slice_types.append(TensorType(t.dtype, t.shape[:ax] + t.shape[ax + 1 :]))
    spec = specialized_output_types(
        body,
        [*ctx.input_types[:n], *slice_types, *ctx.input_types[n + m :]],
        [*([None] * (n + m)), *ctx.input_values[n + m :]],
    )
    declared = [v.type for v in body.outputs]
    if spec is not None and all(spec[j] == ctx.input_types[j] for j in range(n)):
        declared = spec
    out: list[ValueType] = []
    for j in range(n):
        init, state = ctx.type(j), declared[j]
        mt = merge_types(init, state)
        if mt is None:
            ctx.fail(f"state {j} starts as {init} and the body gives {state}")
        out.append(mt)
    for j in range(k):
        t = declared[n + j]
        if not isinstance(t, TensorType):
            ctx.fail(f"scan output {j} must be a tensor, got {t}")
        if t.shape is None:
            out.append(TensorType(t.dtype, None))
            continue
        axis = ctx.axis(out_axes[j], len(t.shape) + 1)
        shape = list(t.shape)
        shape.insert(axis, length)
        out.append(TensorType(t.dtype, tuple(shape)))
    return out


register_op("If", category=Category.CONTROL_FLOW, infer=_if_infer)
register_op("Loop", category=Category.CONTROL_FLOW, infer=_loop_infer)
register_op("Scan", category=Category.CONTROL_FLOW, infer=_scan_infer)
