"""graphc's typed intermediate representation."""

from graphc.ir.attrs import Attrs, NoAttrs, TensorAttr, onnx_attrs_class
from graphc.ir.builder import GraphBuilder
from graphc.ir.graph import Constant, Graph, Node, Value
from graphc.ir.text import format_graph
from graphc.ir.types import Dim, DType, OptionalType, SequenceType, Shape, TensorType, ValueType
from graphc.ir.verify import verify_graph

__all__ = [
    "Attrs",
    "Constant",
    "DType",
    "Dim",
    "Graph",
    "GraphBuilder",
    "Node",
    "NoAttrs",
    "OptionalType",
    "SequenceType",
    "Shape",
    "TensorAttr",
    "TensorType",
    "Value",
    "ValueType",
    "format_graph",
    "onnx_attrs_class",
    "verify_graph",
]
