"""`load_onnx`: an ONNX model to an IR graph."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import onnx

from graphc.errors import GraphcError, ModelLoadError, ShapeError, UnsupportedOpError
from graphc.frontend import functions
from graphc.frontend.context import ConvertContext
from graphc.frontend.limits import check_value_sizes
from graphc.frontend.loader import ModelSource, read_model, tensor_to_array
from graphc.frontend.registry import find_converter
from graphc.ir.builder import GraphBuilder
from graphc.ir.graph import Graph, Value
from graphc.ir.types import DType, OptionalType, SequenceType, TensorType, ValueType

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
            if d.HasField("dim_value") and d.dim_value >= 0:
                dims.append(int(d.dim_value))
            elif d.HasField("dim_value"):
                # Some converters write -1 for "unknown"; the spec has no negative sizes.
                log.warning("%s: dim %d is %d; read as unknown", what, len(dims), d.dim_value)
                dims.append(None)
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
    if kind == "optional_type":
        elem = type_from_proto(tp.optional_type.elem_type, what)
        if isinstance(elem, OptionalType):
            raise ModelLoadError(f"{what}: optionals of optionals are not supported")
        return OptionalType(elem)
    raise ModelLoadError(f"{what}: value kind {kind!r} is not supported (tensors, sequences and optionals are)")


def model_opsets(model: onnx.ModelProto) -> dict[str, int]:
    """The opset version of each domain the model imports ("" for the standard one)."""
    return {("" if imp.domain in STANDARD_DOMAINS else imp.domain): int(imp.version) for imp in model.opset_import}


def find_unsupported(model: onnx.ModelProto) -> list[tuple[str, str, int, list[str]]]:
    """Every (op, domain, opset, node names) that has no converter, all at once.

    A function op with no converter counts as supported when every op of its function body
    (nested bodies expanded) has one: the conversion expands it.
    """
    missing: dict[tuple[str, str], list[str]] = {}
    opsets = {}
    types = _DeclaredTypes(model)
    for i, node in _walk_nodes(model.graph.node):
        domain = "" if node.domain in STANDARD_DOMAINS else node.domain
        if domain not in opsets:
            opsets[domain] = model_opset(model, domain)
        if find_converter(node.op_type, domain, opsets[domain]) is None and not _expandable(node, types):
            missing.setdefault((node.op_type, domain), []).append(node.name or f"#{i}")
    return [(op, dom, opsets[dom], names) for (op, dom), names in sorted(missing.items())]


def _walk_nodes(nodes, prefix: str = ""):
    """(index label, node) for the nodes and, depth first, those of their subgraphs (If branches,
    Loop/Scan bodies), so that every unsupported op is listed at once."""
    for i, node in enumerate(nodes):
        yield f"{prefix}{i}", node
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from _walk_nodes(attr.g.node, f"{prefix}{i}/{attr.name}/")


def _has_converter(op_type: str, domain: str, opset: int) -> bool:
    return find_converter(op_type, domain, opset) is not None


class _DeclaredTypes:
    """ONNX types of a model's values: the declared ones, and ONNX shape inference's once a
    context-dependent function body needs more (computed at most once per model)."""

    def __init__(self, model: onnx.ModelProto):
        self.model = model
        self.opsets = model_opsets(model)
        g = model.graph
        self.types: dict[str, onnx.TypeProto] = {}
        for t in g.initializer:
            self.types[t.name] = onnx.helper.make_tensor_type_proto(t.data_type, list(t.dims))
        for vi in [*g.input, *g.value_info, *g.output]:
            if vi.type.WhichOneof("value") is not None:
                self.types.setdefault(vi.name, vi.type)
        self.inferred = False
        self.reported: set[str] = set()  # function ops whose missing body ops were logged

    def of(self, names: list[str]) -> list[onnx.TypeProto | None]:
        return [self.types.get(n) if n else None for n in names]

    def infer(self) -> bool:
        """Add shape inference's types; False when already done (nothing new to learn)."""
        if self.inferred:
            return False
        self.inferred = True
        try:
            inferred = onnx.shape_inference.infer_shapes(self.model, strict_mode=False)
        except Exception:  # inference is best effort here; conversion checks types itself
            return False
        for vi in inferred.graph.value_info:
            if vi.type.WhichOneof("value") is not None:
                self.types.setdefault(vi.name, vi.type)
        return True


def _expandable(node: onnx.NodeProto, types: _DeclaredTypes) -> bool:
    """Whether a node with no converter has a function body whose ops all have converters."""
    names = list(node.input)
    miss = functions.missing_ops(node, types.opsets, types.of(names), _has_converter)
    # A context-dependent body may depend on input types the model does not declare.
    untyped = any(t is None for n, t in zip(names, types.of(names), strict=True) if n)
    if (miss is None or miss) and untyped and types.infer():
        miss = functions.missing_ops(node, types.opsets, types.of(names), _has_converter)
    if miss and node.op_type not in types.reported:
        # The error names the model's op; say what its body lacks, once per op type.
        types.reported.add(node.op_type)
        log.info(
            "%s has an ONNX function body, but graphc cannot convert its op(s) %s",
            node.op_type,
            ", ".join(f"{d + '.' if d else ''}{op} (opset {v})" for op, d, v in miss),
        )
    return miss is not None and not miss


def unsupported_message(unsupported: list[tuple[str, str, int, list[str]]]) -> str:
    parts = []
    for op, dom, opset, names in unsupported:
        shown = ", ".join(f"'{n}'" for n in names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
        parts.append(f"{dom + '.' if dom else ''}{op} (opset {opset}; nodes {shown})")
    return f"{len(unsupported)} unsupported op type(s): " + "; ".join(parts)


def load_onnx(source: ModelSource, *, name: str | None = None) -> Graph:
    """Read an ONNX model (path, bytes or ModelProto) into an IR graph.

    Raises ModelLoadError for a missing, malformed or invalid file, UnsupportedOpError listing
    every unsupported op at once, and ShapeError where types do not check.
    """
    model, base = read_model(source)
    # Unsupported ops first: a model of only other domains (ai.onnx.ml) is reported by its ops.
    unsupported = find_unsupported(model)
    if unsupported:
        raise UnsupportedOpError(unsupported_message(unsupported), unsupported)
    if not any(imp.domain in STANDARD_DOMAINS for imp in model.opset_import) and any(
        imp.domain for imp in model.opset_import
    ):
        # a model of only other domains (an ai.onnx.ml pipeline): its nodes name no standard op, and
        # what their converters emit is graphc's IR, whose ops have one meaning
        opset = onnx.defs.onnx_opset_version()
        log.info("the model imports no standard ONNX opset; graphc's ops are read at opset %d", opset)
    else:
        opset = model_opset(model)
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

    opsets = model_opsets(model)
    opsets[""] = opset
    expanded: set[tuple[str, str]] = set()  # function ops expanded so far (logged once each)
    b.scope = SubgraphScope(env.get, opsets, expanded)  # what control-flow subgraphs see of this graph
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
        outs = _convert_node(b, node, node_name, inputs, opsets, expanded)
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
    graph = b.build()
    check_value_sizes(graph)
    return graph


def _convert_node(
    b: GraphBuilder,
    node: onnx.NodeProto,
    node_name: str,
    inputs: list[Value | None],
    opsets: dict[str, int],
    expanded: set[tuple[str, str]],
    depth: int = 0,
) -> list[Value | None]:
    """IR values of one ONNX node's outputs: by its converter, else by expanding its function body
    (None only for outputs the node omits)."""
    domain = "" if node.domain in STANDARD_DOMAINS else node.domain
    fn = find_converter(node.op_type, domain, opsets.get(domain, 0))
    if fn is None:
        return _convert_function_op(b, node, node_name, inputs, opsets, expanded, depth)
    ctx = ConvertContext(b, node, node_name, inputs, opsets[""])
    try:
        return list(fn(ctx))
    except GraphcError:
        raise
    except Exception as e:  # a converter bug must still name the node
        raise ShapeError(f"{node.op_type} node '{node_name}': conversion failed: {e!r}") from e


def _convert_body(
    b: GraphBuilder,
    node: onnx.NodeProto,
    node_name: str,
    exp: functions.Expansion,
    scope: dict[str, Value],
    expanded: set[tuple[str, str]],
    depth: int,
) -> None:
    """Convert a function body's nodes into `b`, binding their outputs in `scope`."""
    for sub in exp.nodes:
        sub_name = b.fresh_node_name(sub.name)
        sub_inputs: list[Value | None] = []
        for inp in sub.input:
            if not inp:
                sub_inputs.append(None)
            elif inp in scope:
                sub_inputs.append(scope[inp])
            else:
                raise ShapeError(
                    f"{node.op_type} node '{node_name}': its function body uses '{inp}' before "
                    f"defining it (in {sub.op_type} node '{sub_name}')"
                )
        while sub_inputs and sub_inputs[-1] is None:
            sub_inputs.pop()
        outs = _convert_node(b, sub, sub_name, sub_inputs, dict(exp.opsets), expanded, depth + 1)
        for out_name, v in zip(sub.output, outs, strict=False):
            if out_name:
                scope[out_name] = v


def _convert_function_op(
    b: GraphBuilder,
    node: onnx.NodeProto,
    node_name: str,
    inputs: list[Value | None],
    opsets: dict[str, int],
    expanded: set[tuple[str, str]],
    depth: int,
) -> list[Value | None]:
    """Convert the nodes of a function op's body in a scope of their own (a body cannot see the
    graph's other values), then return the values bound to the node's outputs."""
    domain = "" if node.domain in STANDARD_DOMAINS else node.domain
    types = [None if v is None else functions.value_type_proto(v.type) for v in inputs]
    exp = None
    if depth <= functions.MAX_DEPTH:
        exp = functions.expand_node(node, opsets, types, prefix=f"{node_name}/")
    if exp is None:
        # find_unsupported let it through on declared types that the converted inputs contradict.
        unsupported = [(node.op_type, domain, opsets.get(domain, 0), [node_name])]
        raise UnsupportedOpError(unsupported_message(unsupported), unsupported)
    if (domain, node.op_type) not in expanded:
        expanded.add((domain, node.op_type))
        log.info(
            "expanding %s%s (opset %d) into its ONNX function body (no native converter)",
            f"{domain}." if domain else "",
            node.op_type,
            opsets.get(domain, 0),
        )
    scope: dict[str, Value] = {}
    for name, v in zip(exp.inputs, inputs, strict=False):
        if name and v is not None:
            scope[name] = v
    # A body's control-flow subgraphs see the body's names (not the graph's) while it converts.
    outer_scope, b.scope = b.scope, SubgraphScope(scope.get, dict(exp.opsets), expanded)
    try:
        _convert_body(b, node, node_name, exp, scope, expanded, depth)
    finally:
        b.scope = outer_scope
    results: list[Value | None] = []
    for name, wanted in zip(exp.outputs, node.output, strict=False):
        if name in scope:
            results.append(scope[name])
        elif not wanted:
            results.append(None)  # an output the node omits, which the body need not compute
        else:
            break  # the caller reports the named outputs that were not produced
    return results


# ---- subgraphs (If branches, Loop and Scan bodies) ----------------------------------------------


@dataclass
class SubgraphScope:
    """What a subgraph being converted sees of its enclosing graph: its ONNX names (lookup), the
    opsets, and the function ops expanded so far."""

    lookup: Callable[[str], Value | None]
    opsets: dict[str, int]
    expanded: set[tuple[str, str]]


def convert_subgraph(
    outer: GraphBuilder,
    gp: onnx.GraphProto,
    where: str,
    input_types: Sequence[ValueType | None] = (),
) -> tuple[Graph, list[Value]]:
    """Convert a subgraph attribute into a closed IR graph, and the outer values it captures.

    A name the subgraph reads but does not define is looked up in the enclosing scopes; each one
    becomes a capture of the subgraph (bound by position to the returned outer values, which
    the control-flow node takes as its trailing inputs). `input_types[i]`, where given, is the type
    of formal input i (the converter knows it from the node's inputs); else the declared one.
    """
    scope = outer.scope
    if not isinstance(scope, SubgraphScope):
        raise ModelLoadError(f"{where}: a subgraph outside a graph being loaded")
    sb = GraphBuilder(gp.name or where, outer.opset)
    # The names the subgraph defines are reserved; a captured name keeps its outer spelling.
    sb._reserved_values = {n for node in gp.node for n in node.output if n} | {v.name for v in gp.input}
    env: dict[str, Value] = {}
    captured: list[Value] = []

    def lookup(name: str) -> Value | None:
        if name in env:
            return env[name]
        v = scope.lookup(name)
        if v is None:
            return None
        cap = sb.add_capture(sb.fresh_value_name(name), v.type)
        known = outer.known_value(v)
        if known is not None:  # a constant of the enclosing graph stays known inside
            sb.known[cap.name] = known
        env[name] = cap
        captured.append(v)
        return cap

    for init in gp.initializer:
        env[init.name] = sb.add_constant(tensor_to_array(init, None), init.name, keep_name=True)
    for i, vi in enumerate(gp.input):
        given = input_types[i] if i < len(input_types) else None
        t = given if given is not None else type_from_proto(vi.type, f"{where}: subgraph input '{vi.name}'")
        env[vi.name] = sb.add_input(vi.name, t)
    sb.scope = SubgraphScope(lookup, scope.opsets, scope.expanded)
    _convert_subgraph_nodes(sb, gp, env, lookup, scope, where, prefix="")
    sb.set_outputs(_subgraph_outputs(gp, lookup, where), [vi.name for vi in gp.output])
    return sb.build(), captured


def _convert_subgraph_nodes(
    builder: GraphBuilder,
    gp: onnx.GraphProto,
    env: dict[str, Value],
    lookup: Callable[[str], Value | None],
    scope: SubgraphScope,
    where: str,
    prefix: str,
) -> None:
    """Convert `gp`'s nodes into `builder`, binding their outputs in `env`; an input that no
    enclosing scope defines is a one-line error naming the node."""
    for i, node in enumerate(gp.node):
        node_name = builder.fresh_node_name(prefix + (node.name or f"{node.op_type}_{i}"))
        inputs: list[Value | None] = []
        for inp in node.input:
            v = lookup(inp) if inp else None
            if inp and v is None:
                raise ModelLoadError(
                    f"{where}: {node.op_type} node '{node_name}': input '{inp}' is defined in no enclosing scope"
                )
            inputs.append(v)
        while inputs and inputs[-1] is None:
            inputs.pop()
        outs = _convert_node(builder, node, node_name, inputs, scope.opsets, scope.expanded)
        for out_name, v in zip(node.output, outs, strict=False):
            if out_name and v is not None:
                env[out_name] = v


def _subgraph_outputs(gp: onnx.GraphProto, lookup: Callable[[str], Value | None], where: str) -> list[Value]:
    outputs = []
    for vi in gp.output:
        v = lookup(vi.name)
        if v is None:
            raise ModelLoadError(f"{where}: subgraph output '{vi.name}' is not produced")
        outputs.append(v)
    return outputs


def inline_subgraph(outer: GraphBuilder, gp: onnx.GraphProto, where: str) -> list[Value]:
    """Convert an input-less subgraph (the branch an If takes when its condition is known while
    loading) straight into `outer`; its outputs. The other branch is never typed: exporters write
    rank-dispatching Ifs whose untaken branch does not type-check on the actual shapes."""
    scope = outer.scope
    if not isinstance(scope, SubgraphScope):
        raise ModelLoadError(f"{where}: a subgraph outside a graph being loaded")
    env: dict[str, Value] = {}

    def lookup(name: str) -> Value | None:
        return env[name] if name in env else scope.lookup(name)

    for init in gp.initializer:
        env[init.name] = outer.add_constant(tensor_to_array(init, None), f"{where}/{init.name}")
    outer.scope = SubgraphScope(lookup, scope.opsets, scope.expanded)
    try:
        _convert_subgraph_nodes(outer, gp, env, lookup, scope, where, prefix=f"{where}/")
    finally:
        outer.scope = scope
    return _subgraph_outputs(gp, lookup, where)
