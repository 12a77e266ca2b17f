"""Binding symbolic dims to concrete sizes by re-running type inference."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from graphc.errors import ShapeError
from graphc.ir.builder import GraphBuilder
from graphc.ir.graph import Graph, Value
from graphc.ir.types import TensorType, kind_of


def bind_shapes(
    graph: Graph, shapes: Mapping[str, Sequence[int] | int] | None = None, *, require_static: bool = True
) -> Graph:
    """Make every shape concrete.

    `shapes` maps an input name to its full shape, or a symbolic dim name (e.g. "batch") to its
    size. Input dims that stay symbolic are an error naming the input and the dim. With
    `require_static`, any value whose shape is still not concrete after inference is an error
    naming the node.
    """
    shapes = dict(shapes or {})
    input_names = {v.name for v in graph.inputs}
    dim_sizes = {k: int(v) for k, v in shapes.items() if k not in input_names and isinstance(v, int)}
    unknown = [k for k in shapes if k not in input_names and not isinstance(shapes[k], int)]
    if unknown:
        raise ShapeError(
            f"shapes names {unknown}, which are not graph inputs; inputs are {sorted(input_names)}"
        )
    b = GraphBuilder.like(graph)
    # like() copied inputs; replace their types.
    b.inputs = []
    b.values = {c.name: c.value for c in graph.constants.values()}
    subst: dict[str, Value] = {}
    for v in graph.inputs:
        t = v.type
        if not isinstance(t, TensorType):
            raise ShapeError(f"input '{v.name}' is {kind_of(t)} ({t}); graphc compiles tensor inputs only")
        if v.name in shapes:
            given = tuple(int(d) for d in shapes[v.name])  # type: ignore[union-attr]
            if t.shape is not None:
                if len(given) != len(t.shape):
                    raise ShapeError(
                        f"input '{v.name}' has rank {len(t.shape)} ({t}), shape given is {given}"
                    )
                for i, (d, g) in enumerate(zip(t.shape, given, strict=True)):
                    if isinstance(d, int) and d != g:
                        raise ShapeError(f"input '{v.name}' dim {i} is fixed at {d}, shape given is {given}")
            new = t.with_shape(given)
        else:
            if t.shape is None:
                raise ShapeError(f"input '{v.name}' has unknown rank; give its shape")
            dims = []
            for i, d in enumerate(t.shape):
                if isinstance(d, int):
                    dims.append(d)
                elif isinstance(d, str) and d in dim_sizes:
                    dims.append(dim_sizes[d])
                else:
                    label = f"'{d}'" if isinstance(d, str) else "unnamed"
                    example = ", ".join(str(x) if isinstance(x, int) else "..." for x in t.shape)
                    cli = "x".join(str(x) if isinstance(x, int) else "N" for x in t.shape)
                    raise ShapeError(
                        f"input '{v.name}' ({t}) has symbolic dim {i} ({label}); give its size, e.g. "
                        f"shapes={{'{v.name}': ({example})}}"
                        + (f" or {{'{d}': N}}" if isinstance(d, str) else "")
                        + f" (graphc compile: --shapes {v.name}:{cli}"
                        + (f" or --shapes {d}=N)" if isinstance(d, str) else ")")
                    )
            new = t.with_shape(tuple(dims))
        nv = b.add_input(v.name, new)
        subst[v.name] = nv
    for node in graph.nodes:
        ins = [None if v is None else subst.get(v.name, b.values.get(v.name)) for v in node.inputs]
        new_node = b.copy_node(node, ins)
        for old, nv in zip(node.outputs, new_node.outputs, strict=True):
            subst[old.name] = nv
            if require_static and isinstance(nv.type, TensorType) and not nv.type.is_static:
                raise ShapeError(
                    f"{node.op} node '{node.name}': output '{nv.name}' has shape {nv.type} after binding "
                    "the inputs; its size depends on run-time values, which graphc cannot compile"
                )
    b.set_outputs([subst.get(v.name, b.values.get(v.name)) for v in graph.outputs], graph.output_names)
    return b.build()
