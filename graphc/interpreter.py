"""The reference interpreter: runs a graph node by node with each op's numpy reference.

Every later stage (passes, the CPU and CUDA executors) is checked against it. It checks each
output against the node's inferred type, so an inference bug shows up where it happens.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import numpy as np

from graphc.errors import GraphcError, InputError
from graphc.ir.graph import Graph, Node, node_subgraphs
from graphc.ir.types import OptionalType, SequenceType, TensorType
from graphc.ops.registry import Category, get_op

log = logging.getLogger(__name__)


class InterpretError(GraphcError):
    """A node failed while running (bad run-time values, e.g. an index out of range)."""


def check_feeds(graph: Graph, feeds: Mapping[str, object]) -> dict[str, np.ndarray]:
    """Validate feeds against the graph inputs: names, dtypes, ranks and concrete dims."""
    unknown = sorted(set(feeds) - {v.name for v in graph.inputs})
    if unknown:
        raise InputError(f"unknown input(s) {unknown}; the graph takes {[v.name for v in graph.inputs]}")
    out: dict[str, np.ndarray] = {}
    symbols: dict[str, tuple[int, str]] = {}
    for v in graph.inputs:
        if v.name not in feeds:
            raise InputError(f"input '{v.name}' ({v.type}) is missing")
        x = feeds[v.name]
        vt = v.type
        if isinstance(vt, OptionalType):
            if x is None:  # the empty optional
                out[v.name] = x  # type: ignore[assignment]
                continue
            vt = vt.elem
        if isinstance(vt, SequenceType):
            out[v.name] = x  # type: ignore[assignment]
            continue
        if x is None:
            raise InputError(f"input '{v.name}' is None, the graph takes a tensor ({v.type})")
        arr = np.asarray(x)
        t: TensorType = vt
        if arr.dtype != t.dtype.numpy:
            raise InputError(f"input '{v.name}' has dtype {arr.dtype}, the graph takes {t.dtype.name}")
        if t.shape is not None:
            if arr.ndim != len(t.shape):
                raise InputError(f"input '{v.name}' has shape {arr.shape}, the graph takes {t}")
            for i, (d, n) in enumerate(zip(t.shape, arr.shape, strict=True)):
                if isinstance(d, int) and d != n:
                    raise InputError(f"input '{v.name}' has shape {arr.shape}, the graph takes {t} (dim {i})")
                if isinstance(d, str):
                    if d in symbols and symbols[d][0] != n:
                        raise InputError(
                            f"input '{v.name}' dim {i} ('{d}') is {n}, but {symbols[d][1]} "
                            f"gives '{d}' = {symbols[d][0]}"
                        )
                    symbols.setdefault(d, (n, f"input '{v.name}'"))
        out[v.name] = arr
    return out


def _check_output(node: Node, i: int, value: object) -> None:
    t = node.outputs[i].type
    if isinstance(t, OptionalType):
        if value is None:
            return
        t = t.elem
    if isinstance(t, SequenceType):
        return
    arr = value
    if not isinstance(arr, np.ndarray):
        raise InterpretError(f"{node.op} node '{node.name}': output {i} is {type(arr).__name__}, not an array")
    if arr.dtype != t.dtype.numpy:
        raise InterpretError(
            f"{node.op} node '{node.name}': output {i} has dtype {arr.dtype}, inference says {t.dtype.name} "
            "(a graphc bug)"
        )
    shape_ok = t.shape is None or (
        arr.ndim == len(t.shape)
        and all(not isinstance(d, int) or d == n for d, n in zip(t.shape, arr.shape, strict=False))
    )
    if not shape_ok:
        raise InterpretError(
            f"{node.op} node '{node.name}': output {i} has shape {arr.shape}, inference says {t} (a graphc bug)"
        )


def interpret(
    graph: Graph,
    feeds: Mapping[str, object],
    *,
    check_types: bool = True,
    keep: tuple[str, ...] = (),
) -> dict[str, np.ndarray]:
    """Run `graph` on `feeds`; returns the graph outputs by public name (and any value named in
    `keep`)."""
    env: dict[str, object] = dict(check_feeds(graph, feeds))
    outs = _run(graph, env, check_types, keep)
    result = {name: val for name, val in zip(graph.output_names, outs, strict=True)}
    for k in keep:
        result[k] = env[k]
    return result  # type: ignore[return-value]


class _SubgraphRunner:
    """A subgraph as the control-flow kernels take it (runtime/reference/control_flow.py): called
    with its formal inputs followed by its captures, it interprets the subgraph."""

    def __init__(self, graph: Graph, check_types: bool):
        self.graph = graph
        self.check_types = check_types
        self.num_captures = len(graph.captures)
        self.output_dtypes = [v.ttype.dtype.numpy if isinstance(v.type, TensorType) else None for v in graph.outputs]
        self.output_shapes = [
            v.ttype.static_shape if isinstance(v.type, TensorType) and v.ttype.is_static else None
            for v in graph.outputs
        ]

    def __call__(self, inputs: list[object]) -> list[object]:
        g = self.graph
        params = (*g.inputs, *g.captures)
        if len(inputs) != len(params):
            raise InterpretError(f"subgraph '{g.name}' takes {len(params)} values, got {len(inputs)}")
        env: dict[str, object] = {v.name: x for v, x in zip(params, inputs, strict=True)}
        return _run(g, env, self.check_types, ())


def _bound_attrs(node: Node, check_types: bool) -> object:
    """The node's attrs, with each subgraph replaced by a runner over it (control flow)."""
    subs = {attr: _SubgraphRunner(sub, check_types) for _, attr, sub in node_subgraphs(node)}
    return node.attrs.replace(**subs) if subs else node.attrs


def _run(graph: Graph, env: dict[str, object], check_types: bool, keep: tuple[str, ...]) -> list[object]:
    """Run the nodes of `graph` over `env` (its inputs and captures bound); the output values."""
    for name, c in graph.constants.items():
        env[name] = c.data
    # Free each value after its last use, so peak memory stays near the model's working set.
    last_use: dict[str, int] = {}
    for idx, node in enumerate(graph.nodes):
        for v in node.inputs:
            if v is not None:
                last_use[v.name] = idx
    pinned = {v.name for v in graph.outputs} | set(keep)
    for idx, node in enumerate(graph.nodes):
        opdef = get_op(node.op, node.domain)
        ins = [None if v is None else env[v.name] for v in node.inputs]
        try:
            with np.errstate(all="ignore"):
                attrs = _bound_attrs(node, check_types) if opdef.category is Category.CONTROL_FLOW else node.attrs
                outs = opdef.compute(ins, attrs, len(node.outputs))
        except GraphcError:
            raise
        except Exception as e:
            raise InterpretError(f"{node.op} node '{node.name}' failed: {type(e).__name__}: {e}") from e
        if len(outs) < len(node.outputs):
            raise InterpretError(f"{node.op} node '{node.name}': gave {len(outs)} outputs, needs {len(node.outputs)}")
        for i, v in enumerate(node.outputs):
            val = outs[i]
            if isinstance(val, np.generic):
                val = np.asarray(val)
            if check_types:
                _check_output(node, i, val)
            env[v.name] = val
        for v in node.inputs:
            if v is not None and last_use.get(v.name) == idx and v.name not in pinned and v.name not in graph.constants:
                env.pop(v.name, None)
    return [env[v.name] for v in graph.outputs]
