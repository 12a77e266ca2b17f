"""A stable, diffable text form of a graph, for IR dumps and pass tests.

    graph main (opset 17)
      input  %x: f32[N,3,8,8]
      const  %w: f32[4,3,3,3] = sha1:0123abcd45
      %y: f32[N,4,6,6] = Conv[conv0](%x, %w) {kernel_shape=[3,3]}
      output %y

Attributes at their ONNX default are left out; constants of up to 8 elements are shown inline.
"""

from __future__ import annotations

import hashlib

import numpy as np

from graphc.ir.attrs import TensorAttr
from graphc.ir.graph import Graph, Node


def format_value_data(data: np.ndarray) -> str:
    if data.size <= 8 and data.dtype != object:
        return repr(data.ravel().tolist())
    h = hashlib.sha1(data.tobytes() if data.dtype != object else repr(data.tolist()).encode())
    return f"sha1:{h.hexdigest()[:10]}"


def format_attr(v: object) -> str:
    if isinstance(v, tuple):
        return "[" + ",".join(format_attr(x) for x in v) + "]"
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, str):
        return repr(v)
    if isinstance(v, TensorAttr):
        return repr(v)
    return str(v)


def format_node(node: Node) -> str:
    outs = ", ".join(f"%{v.name}: {v.type}" for v in node.outputs)
    ins = ", ".join("_" if v is None else f"%{v.name}" for v in node.inputs)
    op = node.op if not node.domain else f"{node.domain}.{node.op}"
    text = getattr(node.attrs, "text", None)
    if callable(text):
        attrs = text()
    else:
        items = node.attrs.non_default_items()
        attrs = ", ".join(f"{k}={format_attr(v)}" for k, v in items)
    attr_part = f" {{{attrs}}}" if attrs else ""
    return f"{outs} = {op}[{node.name}]({ins}){attr_part}"


def format_graph(graph: Graph) -> str:
    lines = [f"graph {graph.name} (opset {graph.opset})"]
    for v in graph.inputs:
        lines.append(f"  input  %{v.name}: {v.type}")
    for name in sorted(graph.constants):
        c = graph.constants[name]
        lines.append(f"  const  %{name}: {c.value.type} = {format_value_data(c.data)}")
    for n in graph.nodes:
        lines.append("  " + format_node(n))
    for name, v in zip(graph.output_names, graph.outputs, strict=True):
        alias = "" if name == v.name else f" as {name!r}"
        lines.append(f"  output %{v.name}: {v.type}{alias}")
    return "\n".join(lines) + "\n"
