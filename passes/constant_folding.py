"""Constant folding: evaluate with the interpreter's op references every node whose inputs are all
constants (or whose value follows from static types, like Shape), and replace it by a constant.

Size policy: a result is materialized only if it has no more elements than its inputs together,
or fits in FOLD_SMALL_BYTES: transposing, rescaling or dequantizing a weight folds (an int8 weight
becomes a float one of the same element count, which the float kernels need anyway), but expanding
a scalar into a large tensor does not, since computing it at run time is cheaper than storing and
reading it.
"""

from __future__ import annotations

import logging

import numpy as np

from graphc.ir.builder import GraphBuilder
from graphc.ir.graph import Graph, Value
from graphc.ir.types import TensorType
from graphc.ops.registry import Category, InferContext, get_op
from graphc.passes.dce import eliminate_dead_code

log = logging.getLogger(__name__)

FOLD_SMALL_BYTES = 1 << 16


def fold_constants(graph: Graph, *, small_bytes: int = FOLD_SMALL_BYTES) -> Graph:
    b = GraphBuilder.like(graph)
    consts: dict[str, np.ndarray] = {k: c.data for k, c in graph.constants.items()}
    subst: dict[str, Value] = {}
    changed = False
    for node in graph.nodes:
        ins = [None if v is None else subst.get(v.name, b.values.get(v.name)) for v in node.inputs]
        values = _fold(node, ins, consts, small_bytes)
        if values is not None:
            for old, data in zip(node.outputs, values, strict=True):
                nv = b.add_constant(data, old.name, keep_name=True)
                consts[nv.name] = b.constants[nv.name].data
                subst[old.name] = nv
            changed = True
            continue
        b.keep_or_copy(node, ins)
    if not changed:
        return graph
    b.set_outputs([subst.get(v.name, b.values.get(v.name)) for v in graph.outputs], graph.output_names)
    return eliminate_dead_code(b.build(verify=False))


def _fold(node, ins: list[Value | None], consts: dict[str, np.ndarray], small_bytes: int):
    opdef = get_op(node.op, node.domain)
    if opdef.category is Category.SEQUENCE or any(not isinstance(o.type, TensorType) for o in node.outputs):
        return None
    if opdef.value_infer is not None:
        ctx = InferContext(
            op=node.op,
            node_name=node.name,
            attrs=node.attrs,
            input_types=[None if v is None else v.type for v in ins],
            input_values=[None if v is None else consts.get(v.name) for v in ins],
            num_outputs=len(node.outputs),
        )
        vals = opdef.value_infer(ctx)
        if all(v is not None for v in vals) and len(vals) >= len(node.outputs):
            return [np.asarray(v) for v in vals[: len(node.outputs)]]
    present = [v for v in ins if v is not None]
    if not present or any(v.name not in consts for v in present):
        return None
    in_elems = sum(consts[v.name].size for v in present)
    for o in node.outputs:
        t = o.type
        if t.is_static and not _small_enough(t.numel, t.nbytes, in_elems, small_bytes):
            log.debug("not folding %s '%s': %d elements from %d", node.op, node.name, t.numel, in_elems)
            return None
    args = [None if v is None else consts[v.name] for v in ins]
    try:
        with np.errstate(all="ignore"):
            outs = opdef.compute(args, node.attrs, len(node.outputs))
    except Exception as e:  # left to run time, where it fails with the node named
        log.info("not folding %s '%s': %s", node.op, node.name, e)
        return None
    outs = [np.asarray(o) for o in outs[: len(node.outputs)]]
    for o, v in zip(outs, node.outputs, strict=True):
        if not _small_enough(o.size, o.nbytes, in_elems, small_bytes) or o.dtype != v.type.dtype.numpy:
            return None
    return outs


def _small_enough(elems: int, nbytes: int, in_elems: int, small_bytes: int) -> bool:
    return nbytes <= small_bytes or elems <= in_elems
