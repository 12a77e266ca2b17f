"""A stable, diffable text form of a graph, for IR dumps and pass tests, and its parser.

    graph main (opset 17)
      input  %x: f32[N,3,8,8]
      const  %w: f32[4,3,3,3] = sha1:0123abcd45
      const  %b: f32[4] = [0.0, 0.5, 1.0, 1.5]
      %y: f32[N,4,6,6] = Conv[conv0](%x, %w, %b) {kernel_shape=[3,3]}
      output %y: f32[N,4,6,6] as 'y_public'

Attributes at their ONNX default are left out. Constants of up to 8 elements are shown inline
(exactly: `tolist()` of the stored type, which parses back bit for bit); bigger ones by a digest of
their data, `sha1:` and 10 hex digits. A name that is not a plain token (it holds a space, a comma,
a bracket, a quote...) is written as a JSON string: `%"a b"`.

`parse_graph(text, constants)` reads the form back into a Graph: nodes are rebuilt through the
GraphBuilder, so their types are inferred again and must agree with the types the text states (a
stale or hand-written wrong type is an error naming the line). Constants shown by digest take their
data from `constants` (name -> array), which must match the digest; inline ones need nothing; a
hand-written `const %w: f32[64,64] = given` takes its data from `constants` unchecked. A
control-flow node's subgraphs follow its line (`ATTR: graph NAME (opset N)`, indented deeper, with
`capture` lines for its captures) and parse back the same way. What the text does not hold:
`graph.meta` (provenance, near misses), which a parsed graph has empty.
"""

from __future__ import annotations

import ast
import hashlib
import json
import re
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from graphc.ir.attrs import Attrs, TensorAttr
from graphc.ir.graph import Graph, Node
from graphc.ir.types import DType, OptionalType, SequenceType, TensorType, ValueType

INLINE_MAX_ELEMENTS = 8
DIGEST_PREFIX = "sha1:"
GIVEN = "given"  # hand-written text: the data is in parse_graph's `constants`, unchecked
_PLAIN_NAME = re.compile(r"[A-Za-z0-9_./:#@$\-]+")


# ---- writing -----------------------------------------------------------------------------------


def format_name(name: str) -> str:
    """A value or node name as the text writes it: bare when it is a plain token, else JSON."""
    if _PLAIN_NAME.fullmatch(name) and not name.endswith(":"):
        return name
    return json.dumps(name)


def format_value_data(data: np.ndarray) -> str:
    if data.size <= INLINE_MAX_ELEMENTS and data.dtype != object:
        return repr(data.ravel().tolist())
    return DIGEST_PREFIX + data_digest(data)


def data_digest(data: np.ndarray) -> str:
    h = hashlib.sha1(data.tobytes() if data.dtype != object else repr(data.tolist()).encode())
    return h.hexdigest()[:10]


def format_attr(v: object) -> str:
    if isinstance(v, Graph):  # its body follows the node line, indented (see format_graph)
        return f"<graph {format_name(v.name)}>"
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
    outs = ", ".join(f"%{format_name(v.name)}: {v.type}" for v in node.outputs)
    ins = ", ".join("_" if v is None else f"%{format_name(v.name)}" for v in node.inputs)
    op = node.op if not node.domain else f"{node.domain}.{node.op}"
    text = getattr(node.attrs, "text", None)
    if callable(text):
        attrs = text()
    else:
        items = node.attrs.non_default_items()
        attrs = ", ".join(f"{k}={format_attr(v)}" for k, v in items)
    attr_part = f" {{{attrs}}}" if attrs else ""
    return f"{outs} = {op}[{format_name(node.name)}]({ins}){attr_part}"


def format_graph(graph: Graph) -> str:
    """The text form. A control-flow node's subgraphs follow its line, each headed by its
    attribute name and indented two more spaces per level; a subgraph lists its captures (values
    bound to the node's trailing inputs) as `capture` lines."""
    return "\n".join(_graph_lines(graph, "")) + "\n"


def _graph_lines(graph: Graph, indent: str, head: str = "") -> list[str]:
    from graphc.ir.graph import node_subgraphs

    lines = [f"{indent}{head}graph {graph.name} (opset {graph.opset})"]
    for v in graph.inputs:
        lines.append(f"{indent}  input  %{format_name(v.name)}: {v.type}")
    for v in graph.captures:
        lines.append(f"{indent}  capture %{format_name(v.name)}: {v.type}")
    for name in sorted(graph.constants):
        c = graph.constants[name]
        lines.append(f"{indent}  const  %{format_name(name)}: {c.value.type} = {format_value_data(c.data)}")
    for n in graph.nodes:
        lines.append(f"{indent}  " + format_node(n))
        for _, attr, sub in sorted(node_subgraphs(n), key=lambda e: e[1]):
            lines.extend(_graph_lines(sub, indent + "    ", f"{attr}: "))
    for name, v in zip(graph.output_names, graph.outputs, strict=True):
        alias = "" if name == v.name else f" as {name!r}"
        lines.append(f"{indent}  output %{format_name(v.name)}: {v.type}{alias}")
    return lines


graph_to_text = format_graph


# ---- reading -----------------------------------------------------------------------------------


class TextParseError(ValueError):
    """The text is not a graph of this form; the message names the line."""


def _op_attrs_class(op: str, domain: str) -> type[Attrs]:
    # The op library is reached through the builder, which owns the registry lookup; the IR's
    # modules import no op definitions at module level.
    from graphc.ir import builder

    return builder.get_op(op, domain).attrs


def _split_op(qualified: str) -> tuple[str, str]:
    """ "graphc.MatMul" -> ("graphc", "MatMul"); "Relu" -> ("", "Relu")."""
    domain, _, op = qualified.rpartition(".")
    return domain, op


class _Scanner:
    """A cursor over one line (or an attribute string) with the few token kinds the form uses."""

    def __init__(self, text: str, line: int):
        self.s, self.i, self.line = text, 0, line

    def fail(self, msg: str) -> typing.NoReturn:
        raise TextParseError(f"line {self.line}: {msg} at column {self.i + 1}: {self.s!r}")

    def ws(self) -> None:
        while self.i < len(self.s) and self.s[self.i] == " ":
            self.i += 1

    def peek(self, tok: str) -> bool:
        self.ws()
        return self.s.startswith(tok, self.i)

    def take(self, tok: str) -> bool:
        if self.peek(tok):
            self.i += len(tok)
            return True
        return False

    def expect(self, tok: str) -> None:
        if not self.take(tok):
            self.fail(f"expected {tok!r}")

    def done(self) -> bool:
        self.ws()
        return self.i >= len(self.s)

    def regex(self, pattern: re.Pattern[str], what: str) -> str:
        self.ws()
        m = pattern.match(self.s, self.i)
        if not m:
            self.fail(f"expected {what}")
        self.i = m.end()
        return m.group(0)

    def name(self) -> str:
        """A bare or JSON-quoted name."""
        self.ws()
        if self.peek('"'):
            try:
                val, end = json.JSONDecoder().raw_decode(self.s, self.i)
            except json.JSONDecodeError:
                self.fail("bad quoted name")
            self.i = end
            return val
        tok = self.regex(_PLAIN_NAME, "a name")
        if tok.endswith(":"):  # a bare name never ends with ':' (format_name quotes it): the separator
            tok = tok[:-1]
            self.i -= 1
        return tok

    def value_ref(self) -> str:
        self.expect("%")
        return self.name()

    def type(self) -> ValueType:
        if self.take("opt<"):
            elem = self.type()
            self.expect(">")
            if isinstance(elem, OptionalType):
                self.fail("an optional of an optional")
            return OptionalType(elem)
        if self.take("seq<"):
            elem = self.type()
            self.expect(">")
            length = int(self.regex(_INT, "a length")) if self.take("x") else None
            if not isinstance(elem, TensorType):
                self.fail("a sequence of sequences")
            return SequenceType(elem, length)
        short = self.regex(_IDENT, "a dtype")
        try:
            dtype = DType.from_short(short)
        except KeyError:
            self.fail(f"unknown dtype {short!r}")
        self.expect("[")
        if self.take("*]"):
            return TensorType(dtype, None)
        dims: list[int | str | None] = []
        while not self.take("]"):
            if dims:
                self.expect(",")
            tok = self.regex(_DIM, "a dim")
            dims.append(None if tok == "?" else int(tok) if _INT.fullmatch(tok) else tok)
        return TensorType(dtype, tuple(dims))

    def literal(self) -> Any:
        """An attribute value: number, string, [list], None, tensor(...)."""
        self.ws()
        if self.take("["):
            items = []
            while not self.take("]"):
                if items:
                    self.expect(",")
                items.append(self.literal())
            return tuple(items)
        if self.peek("tensor("):
            return self.tensor_attr()
        if self.take("<graph "):
            ref = _SubgraphRef(self.name())
            self.expect(">")
            return ref
        if self.peek("'") or self.peek('"'):
            tok = self.regex(_STRING, "a string")
            return ast.literal_eval(tok)
        tok = self.regex(_ATOM, "a value")
        if tok == "None":
            return None
        if tok in ("True", "False"):
            return tok == "True"
        if _INT.fullmatch(tok):
            return int(tok)
        try:
            return float(tok)
        except ValueError:
            self.fail(f"bad value {tok!r}")

    def tensor_attr(self) -> TensorAttr:
        self.expect("tensor(")
        dt_name = self.regex(_IDENT, "a numpy dtype")
        self.expect("[")
        shape = []
        while not self.take("]"):
            if shape:
                self.expect(",")
            shape.append(int(self.regex(_INT, "a dim")))
        if self.take("sha1="):
            self.fail("a tensor attribute shown by its digest cannot be read back (its data is not in the text)")
        self.expect(":")
        data = self.literal()
        self.expect(")")
        return TensorAttr(np.array(data, dtype=_numpy_dtype(dt_name, self)).reshape(shape))

    def attr_items(self, closing: str = "}") -> dict[str, Any]:
        """`k=v, k=v` up to (and consuming) `closing`."""
        out: dict[str, Any] = {}
        while not self.take(closing):
            if out:
                self.expect(",")
            key = self.regex(_IDENT, "an attribute name")
            self.expect("=")
            out[key] = self.literal()
        return out


_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_INT = re.compile(r"-?\d+")
_DIM = re.compile(r"\?|-?\d+|[A-Za-z_][A-Za-z0-9_.\-]*")
_ATOM = re.compile(r"[A-Za-z0-9_.+\-]+")
_STRING = re.compile(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"")
_QUALIFIED_OP = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*")


def _numpy_dtype(name: str, sc: _Scanner) -> np.dtype:
    for d in DType:
        if d is not DType.string and d.numpy.name == name:
            return d.numpy
    try:
        return np.dtype(name)
    except TypeError:
        sc.fail(f"unknown numpy dtype {name!r}")


def _build_attrs(cls: type[Attrs], items: dict[str, Any], sc: _Scanner) -> Attrs:
    try:
        return cls(**items)
    except TypeError as e:
        sc.fail(f"bad attributes for {cls.__name__}: {e}")


def _parse_fused(cls: type[Attrs], sc: _Scanner) -> Attrs:
    """The fused node's own form (FusedAttrs.text()): `anchor=Op(in0..inK){..}; opJ=Op(refs){..};
    out=refs`. The epilogue and ref classes are the field types FusedAttrs declares."""
    hints = typing.get_type_hints(cls)
    epilogue_cls = typing.get_args(hints["epilogue"])[0]
    ref_cls = typing.get_args(hints["outputs"])[0]

    def ref() -> Any:
        tok = sc.regex(re.compile(r"acc|in\d+|op\d+"), "acc, inN or opN")
        if tok == "acc":
            return ref_cls("acc")
        return ref_cls(tok[:2] if tok.startswith("op") else "in", int(tok[2:]))

    fields: dict[str, Any] = {}
    epilogue = []
    while True:
        if sc.take("anchor="):
            domain, op = _split_op(sc.regex(_QUALIFIED_OP, "the anchor op"))
            sc.expect("(in0..in")
            fields["anchor_inputs"] = int(sc.regex(_INT, "the last anchor input")) + 1
            sc.expect(")")
            sc.expect("{")
            fields.update(anchor_op=op, anchor_domain=domain)
            fields["anchor_attrs"] = _build_attrs(_op_attrs_class(op, domain), sc.attr_items(), sc)
        elif sc.take("out="):
            outs = [ref()]
            while sc.take(","):
                outs.append(ref())
            fields["outputs"] = tuple(outs)
        else:
            j = sc.regex(re.compile(r"op\d+"), "anchor=, opN= or out=")
            if int(j[2:]) != len(epilogue):
                sc.fail(f"epilogue op {j} out of order")
            sc.expect("=")
            op = sc.regex(_IDENT, "an epilogue op")
            sc.expect("(")
            args = []
            while not sc.take(")"):
                if args:
                    sc.expect(",")
                args.append(ref())
            items = sc.attr_items() if sc.take("{") else {}
            epilogue.append(epilogue_cls(op, _build_attrs(_op_attrs_class(op, ""), items, sc), tuple(args)))
        if sc.done() or not sc.take(";"):
            break
    fields["epilogue"] = tuple(epilogue)
    try:
        return cls(**fields)
    except (TypeError, ValueError) as e:
        sc.fail(f"bad fused node: {e}")


def _node_attrs(cls: type[Attrs], sc: _Scanner) -> Attrs:
    if not sc.take("{"):
        return _build_attrs(cls, {}, sc)
    if callable(getattr(cls, "text", None)):
        body_end = sc.s.rindex("}")
        inner = _Scanner(sc.s[sc.i : body_end], sc.line)
        attrs = _parse_fused(cls, inner)
        if not inner.done():
            inner.fail("unexpected text")
        sc.i = body_end + 1
        return attrs
    return _build_attrs(cls, sc.attr_items(), sc)


def _constant_data(name: str, t: ValueType, sc: _Scanner, constants: Mapping[str, np.ndarray]) -> np.ndarray:
    if not isinstance(t, TensorType) or t.shape is None or not t.is_static:
        sc.fail(f"constant %{name} needs a static tensor type, got {t}")
    digest = None
    if sc.take(DIGEST_PREFIX):
        digest = sc.regex(re.compile(r"[0-9a-f]+"), "a digest")
    if digest is not None or sc.take(GIVEN):
        if name not in constants:
            sc.fail(f"constant %{name} is not inline; pass its data in `constants`")
        data = np.asarray(constants[name])
        if data.dtype != t.dtype.numpy or data.shape != t.shape:
            sc.fail(f"constant %{name} is {t}, the data given is {data.dtype}{list(data.shape)}")
        if digest is not None and data_digest(data) != digest:
            sc.fail(f"constant %{name}: the data given does not match digest {digest}")
        return data
    values = sc.literal()
    try:
        return np.array(values, dtype=t.dtype.numpy).reshape(t.shape)
    except (ValueError, TypeError) as e:
        sc.fail(f"constant %{name}: {e}")


_SUBGRAPH_HEAD = re.compile(r"(\S+): graph (.*) \(opset (-?\d+)\)")
_GRAPH_HEAD = re.compile(r"graph (.*) \(opset (-?\d+)\)")


@dataclass(frozen=True)
class _SubgraphRef:
    """`<graph NAME>` in a node's attributes: the subgraph block that follows the node line."""

    name: str


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def parse_type(text: str) -> ValueType:
    """A value type written as format_graph writes it: f32[2,seq], seq<i64[*]>, opt<f16[4]>."""
    sc = _Scanner(text, 1)
    t = sc.type()
    if not sc.done():
        sc.fail("text after the type")
    return t


def parse_graph(text: str, constants: Mapping[str, np.ndarray] | None = None) -> Graph:
    """The Graph a text of `format_graph` describes (see the module doc). Raises TextParseError.

    A control-flow node's subgraphs are the blocks after its line headed `ATTR: graph NAME (opset
    N)`; a block holds the lines indented deeper than its head, and `capture` lines declare the
    subgraph's captures."""
    constants = constants or {}
    lines = [(i + 1, ln) for i, ln in enumerate(text.splitlines()) if ln.strip() and not ln.lstrip().startswith("#")]
    if not lines:
        raise TextParseError("empty text: expected 'graph NAME (opset N)'")
    lineno, head = lines[0]
    m = _GRAPH_HEAD.fullmatch(head.strip())
    if not m:
        raise TextParseError(f"line {lineno}: expected 'graph NAME (opset N)', got {head!r}")
    graph, pos = _parse_block(lines, 1, -1, m.group(1), int(m.group(2)), constants)
    if pos != len(lines):
        raise TextParseError(f"line {lines[pos][0]}: unexpected text after the graph")
    return graph


def _parse_block(
    lines: list[tuple[int, str]], pos: int, indent: int, name: str, opset: int, constants: Mapping[str, np.ndarray]
) -> tuple[Graph, int]:
    """Parse the lines from `pos` indented deeper than `indent` as one graph; where it stops."""
    from graphc.errors import GraphcError
    from graphc.ir.builder import GraphBuilder

    b = GraphBuilder(name, opset)
    outputs, output_names = [], []
    while pos < len(lines) and _indent(lines[pos][1]) > indent:
        lineno, line = lines[pos]
        pos += 1
        sc = _Scanner(line.strip(), lineno)
        try:
            if sc.take("input "):
                name = sc.value_ref()
                sc.expect(":")
                b.add_input(name, sc.type())
            elif sc.take("capture "):
                name = sc.value_ref()
                sc.expect(":")
                b.add_capture(name, sc.type())
            elif sc.take("const "):
                name = sc.value_ref()
                sc.expect(":")
                t = sc.type()
                sc.expect("=")
                v = b.add_constant(_constant_data(name, t, sc, constants), name, keep_name=True)
                if v.name != name:
                    sc.fail(f"value %{name} is defined twice")
            elif sc.take("output "):
                name = sc.value_ref()
                sc.expect(":")
                t = sc.type()
                if name not in b.values:
                    sc.fail(f"output %{name} is not defined")
                if b.values[name].type != t:
                    sc.fail(f"output %{name} is stated as {t} but is {b.values[name].type}")
                outputs.append(b.values[name])
                output_names.append(ast.literal_eval(sc.regex(_STRING, "a quoted name")) if sc.take("as") else name)
            elif _SUBGRAPH_HEAD.fullmatch(line.strip()):
                sc.fail("a subgraph block must follow the line of the node that holds it")
            else:
                # The node's subgraph blocks follow its line; the node is built once they are read.
                subs: dict[str, Graph] = {}
                while pos < len(lines) and _indent(lines[pos][1]) > _indent(line):
                    sub_line = lines[pos][1]
                    m = _SUBGRAPH_HEAD.fullmatch(sub_line.strip())
                    if not m:
                        break
                    sub, pos = _parse_block(lines, pos + 1, _indent(sub_line), m.group(2), int(m.group(3)), constants)
                    subs[m.group(1)] = sub
                _parse_node(sc, b, subs)
            if not sc.done():
                sc.fail("unexpected text")
        except GraphcError as e:
            raise TextParseError(f"line {lineno}: {e}") from None
    b.set_outputs(outputs, output_names)
    try:
        return b.build(), pos
    except GraphcError as e:
        raise TextParseError(f"the graph{'' if indent < 0 else ' ' + repr(name)} is invalid: {e}") from None


def _parse_node(sc: _Scanner, b: Any, subs: Mapping[str, Graph] | None = None) -> None:
    outs: list[tuple[str, ValueType]] = []
    while True:
        name = sc.value_ref()
        sc.expect(":")
        outs.append((name, sc.type()))
        if not sc.take(","):
            break
    sc.expect("=")
    domain, op = _split_op(sc.regex(_QUALIFIED_OP, "an op"))
    sc.expect("[")
    node_name = sc.name()
    sc.expect("]")
    sc.expect("(")
    inputs = []
    while not sc.take(")"):
        if inputs:
            sc.expect(",")
        if sc.take("_"):
            inputs.append(None)
            continue
        ref = sc.value_ref()
        if ref not in b.values:
            sc.fail(f"input %{ref} is not defined before it")
        inputs.append(b.values[ref])
    try:
        cls = _op_attrs_class(op, domain)
    except KeyError:
        sc.fail(f"unknown op {op!r} in domain {domain!r}")
    attrs = _node_attrs(cls, sc)
    refs = {k: v for k, v in attrs.items() if isinstance(v, _SubgraphRef)}
    subs = dict(subs or {})
    if set(subs) != set(refs):
        sc.fail(f"the node's subgraph attributes {sorted(refs)} and the blocks after it {sorted(subs)} differ")
    for attr, ref in refs.items():
        if subs[attr].name != ref.name:
            sc.fail(f"attribute {attr} names <graph {ref.name}>, the block after it is graph {subs[attr].name}")
    if refs:
        attrs = attrs.replace(**subs)
    for name, _ in outs:
        if name in b.values:
            sc.fail(f"value %{name} is defined twice")
    node = b.add_node(op, inputs, attrs, name=node_name, outputs=[n for n, _ in outs], domain=domain, keep_name=True)
    if node.name != node_name:
        sc.fail(f"node {node_name!r} is defined twice")
    for (name, stated), v in zip(outs, node.outputs, strict=True):
        if v.type != stated:
            sc.fail(f"%{name} is stated as {stated} but {op} infers {v.type}")
