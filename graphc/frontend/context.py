"""What a converter sees of one ONNX node, and how it emits IR nodes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from graphc.errors import UnsupportedOpError
from graphc.ir.attrs import Attrs
from graphc.ir.builder import GraphBuilder
from graphc.ir.graph import Node, Value
from graphc.ops.registry import get_op


def onnx_attr_value(attr: onnx.AttributeProto) -> Any:
    """An ONNX attribute as a plain Python value (str for strings, ndarray for tensors)."""
    if attr.type == onnx.AttributeProto.GRAPH:
        return attr.g  # converted by the op's converter (converters/control_flow.py), in its scope
    if attr.type == onnx.AttributeProto.GRAPHS:
        raise UnsupportedOpError(f"attribute '{attr.name}' holds a list of subgraphs (not supported)", [])
    if attr.type == onnx.AttributeProto.TENSOR:
        return numpy_helper.to_array(attr.t)
    if attr.type == onnx.AttributeProto.SPARSE_TENSOR:
        raise UnsupportedOpError(f"attribute '{attr.name}' is a sparse tensor", [])
    v = onnx.helper.get_attribute_value(attr)
    if isinstance(v, bytes):
        return v.decode()
    if isinstance(v, list):
        return [x.decode() if isinstance(x, bytes) else x for x in v]
    return v


class ConvertContext:
    def __init__(
        self,
        builder: GraphBuilder,
        node: onnx.NodeProto,
        name: str,
        inputs: list[Value | None],
        opset: int,
    ):
        self.builder = builder
        self.node = node
        self.name = name
        self.inputs = inputs
        self.opset = opset
        self.op_type = node.op_type
        self.domain = "" if node.domain == "ai.onnx" else node.domain
        self.attrs: dict[str, Any] = {a.name: onnx_attr_value(a) for a in node.attribute}

    # ---- reading the node ----
    @property
    def output_names(self) -> list[str]:
        """The node's output names; an omitted middle output gets a fresh name."""
        names = list(self.node.output)
        while names and not names[-1]:
            names.pop()
        return [n or self.builder.fresh_value_name(f"{self.name}_unused{i}") for i, n in enumerate(names)]

    def input(self, i: int) -> Value | None:
        return self.inputs[i] if i < len(self.inputs) else None

    def required_input(self, i: int, what: str) -> Value:
        """Input i, or an error naming it (`what`: its role, e.g. "scale") where it is absent."""
        v = self.input(i)
        if v is None:
            raise self.fail(f"input {i} ({what}) is required")
        return v

    def attr(self, name: str, default: Any = None) -> Any:
        return self.attrs.get(name, default)

    def known(self, i: int) -> np.ndarray | None:
        """The value of input i when known at build time (a constant or computed shape)."""
        return self.builder.known_value(self.input(i))

    def typed_attrs(self, rename: Mapping[str, str] | None = None, drop: Sequence[str] = ()) -> Attrs:
        """The node's attributes as the IR op's attrs class; unknown names are an error."""
        opdef = get_op(self.op_type, self.domain)
        raw = {(rename or {}).get(k, k): v for k, v in self.attrs.items() if k not in drop}
        fields = opdef.attrs.__dataclass_fields__
        unknown = sorted(set(raw) - set(fields))
        if unknown:
            raise UnsupportedOpError(
                f"{self.op_type} node '{self.name}' (opset {self.opset}): attribute(s) "
                f"{', '.join(unknown)} not supported",
                [(self.op_type, self.domain, self.opset, [self.name])],
            )
        return opdef.attrs(**raw)

    # ---- emitting ----
    def emit(
        self,
        op: str,
        inputs: Sequence[Value | None],
        attrs: Attrs | Mapping[str, Any] | None = None,
        *,
        outputs: int | Sequence[str] = 1,
        name: str | None = None,
        domain: str = "",
    ) -> Node:
        return self.builder.add_node(
            op, inputs, attrs, name=name or f"{self.name}/{op}", outputs=outputs, domain=domain
        )

    def op(self, op: str, inputs: Sequence[Value | None], attrs: Mapping[str, Any] | None = None, **kw: Any) -> Value:
        return self.emit(op, inputs, attrs, **kw).outputs[0]

    def constant(self, data: Any, hint: str = "const", dtype: Any = None) -> Value:
        return self.builder.add_constant(np.asarray(data, dtype=dtype), f"{self.name}/{hint}")

    def fail(self, message: str) -> UnsupportedOpError:
        return UnsupportedOpError(
            f"{self.op_type} node '{self.name}' (opset {self.opset}): {message}",
            [(self.op_type, self.domain, self.opset, [self.name])],
        )
