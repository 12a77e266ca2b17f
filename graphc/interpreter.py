"""The reference interpreter: runs a graph node by node with each op's numpy reference.

Every later stage (passes, the CPU and CUDA executors) is checked against it. It checks each
output against the node's inferred type, so an inference bug shows up where it happens.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import numpy as np

from graphc.errors import GraphcError, InputError
from graphc.ir.graph import Graph, Node
from graphc.ir.types import SequenceType, TensorType
from graphc.ops.registry import get_op

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
        if isinstance(v.type, SequenceType):
            out[v.name] = x  # type: ignore[assignment]
            continue
        arr = np.asarray(x)
        t: TensorType = v.type
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
    if isinstance(t, SequenceType):
        return
    arr = value
    if not isinstance(arr, np.ndarray):
        raise InterpretError(
            f"{node.op} node '{node.name}': output {i} is {type(arr).__name__}, not an array"
        )
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
            f"{node.op} node '{node.name}': output {i} has shape {arr.shape}, inference says {t} "
            "(a graphc bug)"
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
                outs = opdef.compute(ins, node.attrs, len(node.outputs))
        except GraphcError:
            raise
        except Exception as e:
            raise InterpretError(f"{node.op} node '{node.name}' failed: {type(e).__name__}: {e}") from e
        if len(outs) < len(node.outputs):
            raise InterpretError(
                f"{node.op} node '{node.name}': gave {len(outs)} outputs, needs {len(node.outputs)}"
            )
        for i, v in enumerate(node.outputs):
            val = outs[i]
            if isinstance(val, np.generic):
                val = np.asarray(val)
            if check_types:
                _check_output(node, i, val)
            env[v.name] = val
        for v in node.inputs:
            if (
                v is not None
                and last_use.get(v.name) == idx
                and v.name not in pinned
                and v.name not in graph.constants
            ):
                env.pop(v.name, None)
    result = {name: env[v.name] for name, v in zip(graph.output_names, graph.outputs, strict=True)}
    for k in keep:
        result[k] = env[k]
    return result  # type: ignore[return-value]
