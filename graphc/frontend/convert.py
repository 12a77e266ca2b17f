"""`load_onnx`: an ONNX model to an IR graph."""

from __future__ import annotations

import logging

import onnx

from graphc.errors import GraphcError, ModelLoadError, ShapeError, UnsupportedOpError
from graphc.frontend.context import ConvertContext
from graphc.frontend.loader import ModelSource, read_model, tensor_to_array
from graphc.frontend.registry import find_converter
from graphc.ir.builder import GraphBuilder
from graphc.ir.graph import Graph, Value
from graphc.ir.types import DType, SequenceType, TensorType, ValueType

log = logging.getLogger(__name__)

STANDARD_DOMAINS = ("", "ai.onnx")


def model_opset(model: onnx.ModelProto, domain: str = "") -> int:
    for imp in model.opset_import:
        if imp.domain == domain or (domain == "" and imp.domain == "ai.onnx"):
            return int(imp.version)
    if domain == "":
        raise ModelLoadError("the model imports no version of the standard ONNX opset")
    return 0


def type_from_proto(tp: onnx.TypeProto, what: str) -> ValueType:
    kind = tp.WhichOneof("value")
    if kind == "tensor_type":
        tt = tp.tensor_type
        try:
            dtype = DType.from_onnx(tt.elem_type)
        except ValueError as e:
            raise ModelLoadError(f"{what}: {e}") from None
        if not tt.HasField("shape"):
            return TensorType(dtype, None)
        dims = []
        for d in tt.shape.dim:
            if d.HasField("dim_value"):
                dims.append(int(d.dim_value))
            elif d.HasField("dim_param") and d.dim_param:
                dims.append(d.dim_param)
            else:
                dims.append(None)
        return TensorType(dtype, tuple(dims))
    if kind == "sequence_type":
        elem = type_from_proto(tp.sequence_type.elem_type, what)
        if not isinstance(elem, TensorType):
            raise ModelLoadError(f"{what}: sequences of non-tensors are not supported")
        return SequenceType(elem)
    raise ModelLoadError(f"{what}: value kind {kind!r} is not supported (tensors and sequences are)")


def find_unsupported(model: onnx.ModelProto) -> list[tuple[str, str, int, list[str]]]:
    """Every (op, domain, opset, node names) that has no converter, all at once."""
    missing: dict[tuple[str, str], list[str]] = {}
    opsets = {}
    for i, node in enumerate(model.graph.node):
        domain = "" if node.domain in STANDARD_DOMAINS else node.domain
        if domain not in opsets:
            opsets[domain] = model_opset(model, domain)
        if find_converter(node.op_type, domain, opsets[domain]) is None:
            missing.setdefault((node.op_type, domain), []).append(node.name or f"#{i}")
    return [(op, dom, opsets[dom], names) for (op, dom), names in sorted(missing.items())]


def unsupported_message(unsupported: list[tuple[str, str, int, list[str]]]) -> str:
    parts = []
    for op, dom, opset, names in unsupported:
        shown = ", ".join(f"'{n}'" for n in names[:5]) + (
            f" and {len(names) - 5} more" if len(names) > 5 else ""
        )
        parts.append(f"{dom + '.' if dom else ''}{op} (opset {opset}; nodes {shown})")
    return f"{len(unsupported)} unsupported op type(s): " + "; ".join(parts)


def load_onnx(source: ModelSource, *, name: str | None = None) -> Graph:
    """Read an ONNX model (path, bytes or ModelProto) into an IR graph.

    Raises ModelLoadError for a missing, malformed or invalid file, UnsupportedOpError listing
    every unsupported op at once, and ShapeError where types do not check.
    """
    model, base = read_model(source)
    opset = model_opset(model)
    unsupported = find_unsupported(model)
    if unsupported:
        raise UnsupportedOpError(unsupported_message(unsupported), unsupported)
    g = model.graph
    b = GraphBuilder(name or g.name or "main", opset)

    env: dict[str, Value] = {}
    for init in g.initializer:
        env[init.name] = b.add_constant(tensor_to_array(init, base), init.name)
    if len(g.sparse_initializer):
        raise ModelLoadError("sparse initializers are not supported")
    for vi in g.input:
        if vi.name in env:
            continue  # an initializer also listed as an input (IR version < 4)
        env[vi.name] = b.add_input(vi.name, type_from_proto(vi.type, f"input '{vi.name}'"))

    # Every ONNX value name is reserved, so fresh names made by converters never take one.
    b._reserved_values = {n for node in g.node for n in list(node.input) + list(node.output) if n}
    for i, node in enumerate(g.node):
        node_name = b.fresh_node_name(node.name or f"{node.op_type}_{i}")
        inputs: list[Value | None] = []
        for inp in node.input:
            if not inp:
                inputs.append(None)
                continue
            if inp not in env:
                raise ModelLoadError(
                    f"{node.op_type} node '{node_name}': input '{inp}' is not produced by any node, "
                    "initializer or graph input"
                )
            inputs.append(env[inp])
        while inputs and inputs[-1] is None:
            inputs.pop()
        domain = "" if node.domain in STANDARD_DOMAINS else node.domain
        fn = find_converter(node.op_type, domain, opset if domain == "" else model_opset(model, domain))
        assert fn is not None  # checked by find_unsupported
        ctx = ConvertContext(b, node, node_name, inputs, opset)
        try:
            outs = list(fn(ctx))
        except GraphcError:
            raise
        except Exception as e:  # a converter bug must still name the node
            raise ShapeError(f"{node.op_type} node '{node_name}': conversion failed: {e!r}") from e
        for out_name, v in zip(node.output, outs, strict=False):
            if out_name:
                env[out_name] = v
        missing = [n for n in node.output[len(outs) :] if n]
        if missing:
            raise ShapeError(f"{node.op_type} node '{node_name}': outputs {missing} were not produced")

    outputs = []
    for vi in g.output:
        if vi.name not in env:
            raise ModelLoadError(f"graph output '{vi.name}' is not produced by any node")
        outputs.append(env[vi.name])
    b.set_outputs(outputs, [vi.name for vi in g.output])
    return b.build()
