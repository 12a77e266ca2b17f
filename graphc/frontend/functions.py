"""Expansion of ONNX function ops into the ops of their function bodies.

Many ONNX ops are *function ops*: their schema defines them by a body made of other ops (Celu,
Softmax, LayerNormalization, ...). Some bodies are fixed (`schema.function_opset_versions`);
others are built for the node at hand, from its attributes and input types
(`schema.context_dependent_function_opset_versions`). Where graphc has no converter for such an
op at the model's opset, the frontend converts the body instead of giving up: a native converter
always wins (it is usually one fused IR op rather than a dozen small ones).

This module works on ONNX protos only; `graphc.frontend.convert` turns the expanded nodes into IR.
The expansion follows the ONNX spec of function calls:

- the body is the function of the largest opset version not above the model's opset for the
  op's domain, and its nodes are read at the function's own `opset_import`;
- formal inputs bind to the node's inputs (an omitted one makes every use of it omitted), formal
  outputs to the node's outputs; every other value gets a fresh name, so two expansions never
  share a value;
- an attribute reference (`ref_attr_name`) takes the node's attribute, else the schema's default,
  else the function's own default, else the attribute is left out (as the spec says).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import onnx
from onnx import AttributeProto, FunctionProto, GraphProto, NodeProto, TypeProto

from graphc.ir.types import SequenceType, ValueType

# Bodies nest (a function op's body may use other function ops); the spec forbids recursion,
# but a bound keeps a malformed schema from looping forever.
MAX_DEPTH = 16

STANDARD_DOMAINS = ("", "ai.onnx")


def norm_domain(domain: str) -> str:
    return "" if domain in STANDARD_DOMAINS else domain


@dataclass(frozen=True)
class Expansion:
    """A node replaced by the nodes of its function body.

    `inputs[i]` is the body's name for the node's input i ("" where the node omits it);
    `outputs[j]` is the body's name for formal output j (the node's own output name where the
    node names one). `opsets` gives the opset of each domain that the body nodes are read at.
    """

    op_type: str
    domain: str
    since_version: int
    nodes: tuple[NodeProto, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    opsets: Mapping[str, int]


def function_proto(
    node: NodeProto, opset: int, input_types: Sequence[TypeProto | None]
) -> tuple[FunctionProto, int] | None:
    """The function body of `node`'s op at `opset` and its schema's since_version, or None when the
    op has none (or a context-dependent body cannot be built, e.g. for lack of input types)."""
    domain = norm_domain(node.domain)
    try:
        schema = onnx.defs.get_schema(node.op_type, opset, domain)
    except onnx.defs.SchemaError:
        return None
    plain = [v for v in schema.function_opset_versions if v <= opset]
    context = [v for v in schema.context_dependent_function_opset_versions if v <= opset]
    if not plain and not context:
        return None
    try:
        if plain and (not context or max(plain) >= max(context)):
            data = schema.get_function_with_opset_version(max(plain))
        else:
            types = [t if t is not None else TypeProto() for t in input_types]
            types += [TypeProto()] * (len(node.input) - len(types))
            data = schema.get_context_dependent_function_with_opset_version(
                max(context), node.SerializeToString(), [t.SerializeToString() for t in types]
            )
    except Exception:  # the C++ builders throw on inputs they cannot handle
        return None
    if not data:
        return None
    fn = FunctionProto()
    fn.ParseFromString(data)
    if not fn.node:
        return None  # a context-dependent builder that gave up (e.g. unknown element type)
    return fn, schema.since_version


def attribute_bindings(node: NodeProto, fn: FunctionProto, opset: int) -> dict[str, AttributeProto]:
    """The attribute values a body's `ref_attr_name`s resolve to: the node's own, then the
    schema's defaults, then the function's declared defaults."""
    bound: dict[str, AttributeProto] = {}
    for a in fn.attribute_proto:
        bound[a.name] = a
    try:
        schema = onnx.defs.get_schema(node.op_type, opset, norm_domain(node.domain))
        for name, attr in schema.attributes.items():
            if attr.default_value.type != AttributeProto.UNDEFINED:
                bound[name] = attr.default_value
    except onnx.defs.SchemaError:
        pass
    for a in node.attribute:
        bound[a.name] = a
    return bound


def expand_node(
    node: NodeProto,
    opsets: Mapping[str, int],
    input_types: Sequence[TypeProto | None],
    prefix: str,
) -> Expansion | None:
    """The body of `node` bound to its inputs, outputs and attributes, or None when its op has no
    function body at these opsets. Internal values are named `prefix` + their body name."""
    domain = norm_domain(node.domain)
    opset = opsets.get(domain, 0)
    found = function_proto(node, opset, input_types)
    if found is None:
        return None
    fn, since = found
    if len(node.input) > len(fn.input) or len(node.output) > len(fn.output):
        return None  # variadic inputs the body does not declare: nothing to bind them to
    attrs = attribute_bindings(node, fn, opset)

    body_opsets = dict(opsets)
    body_opsets.update({norm_domain(o.domain): int(o.version) for o in fn.opset_import})

    caller_outputs = {o for o in node.output if o}
    internal = _body_names(fn)
    # The node's output names live in the same scope as the renamed internals: pick a prefix
    # that no output name can be confused with.
    for k in itertools.count():
        pre = prefix if k == 0 else f"{prefix}{k}/"
        if not any(pre + n in caller_outputs for n in internal):
            break
    rename: dict[str, str] = {}
    inputs = []
    for i, formal in enumerate(fn.input):
        actual = node.input[i] if i < len(node.input) else ""
        rename[formal] = pre + formal if actual else ""
        inputs.append(rename[formal])
    outputs = []
    for j, formal in enumerate(fn.output):
        actual = node.output[j] if j < len(node.output) else ""
        rename[formal] = actual or pre + formal
        outputs.append(rename[formal])

    def name_of(n: str) -> str:
        if not n:
            return ""
        return rename.get(n, pre + n)

    nodes = []
    for i, body_node in enumerate(fn.node):
        new = _bind_node(body_node, name_of, attrs)
        new.name = f"{prefix}{body_node.name or f'{body_node.op_type}_{i}'}"
        nodes.append(new)
    return Expansion(
        op_type=node.op_type,
        domain=domain,
        since_version=since,
        nodes=tuple(nodes),
        inputs=tuple(inputs),
        outputs=tuple(outputs),
        opsets=body_opsets,
    )


def _body_names(fn: FunctionProto) -> set[str]:
    names = set(fn.input) | set(fn.output)
    for n in fn.node:
        names.update(x for x in n.input if x)
        names.update(x for x in n.output if x)
    return names


def _bind_node(body_node: NodeProto, name_of: Callable[[str], str], attrs: Mapping[str, AttributeProto]) -> NodeProto:
    new = NodeProto()
    new.CopyFrom(body_node)
    del new.input[:]
    del new.output[:]
    del new.attribute[:]
    new.input.extend(name_of(n) for n in body_node.input)
    new.output.extend(name_of(n) for n in body_node.output)
    for a in body_node.attribute:
        bound = _bind_attribute(a, name_of, attrs)
        if bound is not None:
            new.attribute.append(bound)
    return new


def _bind_attribute(
    a: AttributeProto, name_of: Callable[[str], str], attrs: Mapping[str, AttributeProto]
) -> AttributeProto | None:
    if a.ref_attr_name:
        ref = attrs.get(a.ref_attr_name)
        if ref is None:
            return None  # neither given nor defaulted: the attribute is absent
        out = AttributeProto()
        out.CopyFrom(ref)
        out.name = a.name
        return out
    out = AttributeProto()
    out.CopyFrom(a)
    if a.type == AttributeProto.GRAPH:
        _bind_graph(out.g, name_of, attrs)
    elif a.type == AttributeProto.GRAPHS:
        for g in out.graphs:
            _bind_graph(g, name_of, attrs)
    return out


def _bind_graph(g: GraphProto, outer: Callable[[str], str], attrs: Mapping[str, AttributeProto]) -> None:
    """Rename, in place, a subgraph's references to the function body's values (outer scope);
    names the subgraph defines itself shadow them and stay."""
    local = {v.name for v in g.input} | {t.name for t in g.initializer}
    for n in g.node:
        local.update(x for x in n.output if x)

    def name_of(n: str) -> str:
        return n if (not n or n in local) else outer(n)

    nodes = [_bind_node(n, name_of, attrs) for n in g.node]
    del g.node[:]
    g.node.extend(nodes)
    for v in g.output:
        v.name = name_of(v.name)


# ---- what an expansion needs ------------------------------------------------------------------

HasConverter = Callable[[str, str, int], bool]


def missing_ops(
    node: NodeProto,
    opsets: Mapping[str, int],
    input_types: Sequence[TypeProto | None],
    has_converter: HasConverter,
    depth: int = 0,
) -> list[tuple[str, str, int]] | None:
    """None when `node`'s op has no function body here; else the (op, domain, opset) of the body
    ops (nested bodies expanded) that have no converter, empty when the expansion is supported."""
    if depth > MAX_DEPTH:
        return None
    exp = expand_node(node, opsets, input_types, prefix=f"{node.op_type}/")
    if exp is None:
        return None
    missing: list[tuple[str, str, int]] = []
    types: dict[str, TypeProto] | None = None
    for sub in exp.nodes:
        dom = norm_domain(sub.domain)
        ver = exp.opsets.get(dom, 0)
        if has_converter(sub.op_type, dom, ver):
            continue
        if types is None:
            types = body_value_types(exp, input_types)
        sub_types = [types.get(n) if n else None for n in sub.input]
        inner = missing_ops(sub, exp.opsets, sub_types, has_converter, depth + 1)
        missing.extend([(sub.op_type, dom, ver)] if inner is None else inner)
    return list(dict.fromkeys(missing))


def body_value_types(exp: Expansion, input_types: Sequence[TypeProto | None]) -> dict[str, TypeProto]:
    """Types of the body's values by ONNX shape inference (best effort: missing where unknown).
    Nested context-dependent bodies need them to be built."""
    types: dict[str, TypeProto] = {}
    graph_inputs = []
    for name, t in zip(exp.inputs, input_types, strict=False):
        if name and t is not None and t.WhichOneof("value") is not None:
            types[name] = t
            graph_inputs.append(onnx.helper.make_value_info(name, t))
    graph = onnx.helper.make_graph(
        list(exp.nodes),
        "expansion",
        graph_inputs,
        [onnx.helper.make_value_info(o, TypeProto()) for o in exp.outputs if o],
    )
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid(d, v) for d, v in exp.opsets.items()])
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    except Exception:
        return types
    for vi in list(inferred.graph.value_info) + list(inferred.graph.output):
        if vi.type.WhichOneof("value") is not None:
            types[vi.name] = vi.type
    return types


def value_type_proto(t: ValueType | None) -> TypeProto | None:
    """An IR value type as an ONNX TypeProto (what context-dependent bodies are built from)."""
    if t is None:
        return None
    if isinstance(t, SequenceType):
        elem = value_type_proto(t.elem)
        assert elem is not None
        return onnx.helper.make_sequence_type_proto(elem)
    # DType values are the ONNX element type codes; a None dim stays an unknown dim.
    return onnx.helper.make_tensor_type_proto(t.dtype.value, None if t.shape is None else list(t.shape))
