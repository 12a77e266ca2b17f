"""Typed op attributes as the runtime sees them: decoded from an engine through a closed table.

An engine's steps carry attrs as JSON. They are decoded through the committed schema table
(graphc.runtime.attrs_schema: per (domain, op) the field names, types and defaults, generated
from onnx.defs and the op registry and checked against them by a test). Nothing in a data file
names a class or a function: an op that is not in the table, a field the op does not have, or a
value of the wrong type is an `AttrsError` naming the op and field. The table is versioned
(`SCHEMA_VERSION`); an engine records the version it was written with, and the loader refuses
any other.

`TensorAttr` (a tensor-valued attribute) lives here too: the IR's typed attrs hold it as well
(graphc.ir.attrs re-exports it), so a reference kernel sees the same value either way.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from graphc.runtime.attrs_schema import FUSED, OPS, SCHEMA_VERSION
from graphc.runtime.dtypes import DType

__all__ = ["SCHEMA_VERSION", "AttrRecord", "AttrsError", "TensorAttr", "decode_attrs", "make_record"]

# The largest tensor attribute an engine may carry inline (elements); weights travel as tensors.
MAX_TENSOR_ATTR_ELEMENTS = 1 << 20


class AttrsError(ValueError):
    """Attrs of a step that do not fit the op's schema."""


class TensorAttr:
    """A hashable, immutable wrapper of a tensor-valued attribute (e.g. ConstantOfShape.value)."""

    __slots__ = ("_array", "_digest")

    def __init__(self, array: np.ndarray):
        arr = np.array(array, copy=True)
        arr.setflags(write=False)
        self._array = arr
        self._digest = hashlib.sha1(repr((arr.dtype.str, arr.shape)).encode() + arr.tobytes()).hexdigest()

    @property
    def array(self) -> np.ndarray:
        return self._array

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TensorAttr) and self._digest == other._digest

    def __hash__(self) -> int:
        return hash(self._digest)

    def __repr__(self) -> str:
        a = self._array
        if a.size <= 8:
            return f"tensor({a.dtype}{list(a.shape)}: {a.ravel().tolist()})"
        return f"tensor({a.dtype}{list(a.shape)} sha1={self._digest[:10]})"


class AttrRecord:
    """The attrs of one op: read-only fields by attribute access, as a reference kernel reads them."""

    __slots__ = ("_op", "_values")

    def __init__(self, op: str, values: Mapping[str, Any]):
        object.__setattr__(self, "_op", op)
        object.__setattr__(self, "_values", dict(values))

    def __getattr__(self, name: str) -> Any:
        try:
            return self._values[name]
        except KeyError:
            raise AttributeError(f"{self._op} attrs have no field {name!r}") from None

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("attrs are read-only")

    def items(self) -> list[tuple[str, Any]]:
        return list(self._values.items())

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, AttrRecord) and (self._op, self._values) == (other._op, other._values)

    def __hash__(self) -> int:
        return hash((self._op, tuple(sorted(self._values))))

    def __repr__(self) -> str:
        return f"{self._op}Attrs({', '.join(f'{k}={v!r}' for k, v in self._values.items())})"


def _schema(op: str, domain: str) -> Mapping[str, tuple[str, bool, Any]]:
    try:
        return OPS[(domain, op)]
    except KeyError:
        where = f" (domain {domain!r})" if domain else ""
        raise AttrsError(f"op {op!r}{where} is not in the attrs table (version {SCHEMA_VERSION})") from None


def make_record(op: str, values: Mapping[str, Any], domain: str = "") -> AttrRecord:
    """A record of `op`'s attrs from already-typed values, with the schema's defaults filled in."""
    schema = _schema(op, domain)
    unknown = sorted(set(values) - set(schema))
    if unknown:
        raise AttrsError(f"{op}: unknown attribute(s) {unknown}")
    out: dict[str, Any] = {}
    for name, (_kind, has_default, default) in schema.items():
        if name in values:
            out[name] = values[name]
        elif has_default:
            out[name] = default
        else:
            raise AttrsError(f"{op}: required attribute {name!r} is missing")
    return AttrRecord(op, out)


def decode_attrs(op: str, domain: str, data: Any) -> AttrRecord:
    """Decode the JSON attrs of one step; AttrsError naming the op and field if they do not fit."""
    if domain == FUSED[0] and op == FUSED[1]:
        return _decode_fused(data)
    return _decode_plain(op, domain, data)


def _decode_plain(op: str, domain: str, data: Any) -> AttrRecord:
    schema = _schema(op, domain)
    if not isinstance(data, dict):
        raise AttrsError(f"{op}: attrs must be an object, got {type(data).__name__}")
    values = {}
    for name, v in data.items():
        if name not in schema:
            raise AttrsError(f"{op}: unknown attribute {name!r}")
        kind, has_default, default = schema[name]
        if v is None:
            if not has_default or default is not None:
                raise AttrsError(f"{op}.{name}: null where {kind} is required")
            values[name] = None
            continue
        values[name] = _decode_value(f"{op}.{name}", kind, v)
    return make_record(op, values, domain)


def _decode_value(where: str, kind: str, v: Any) -> Any:
    if kind == "int":
        if isinstance(v, bool) or not isinstance(v, int):
            raise AttrsError(f"{where}: expected an int, got {type(v).__name__}")
        return v
    if kind == "float":
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise AttrsError(f"{where}: expected a float, got {type(v).__name__}")
        return float(v)
    if kind == "str":
        if not isinstance(v, str):
            raise AttrsError(f"{where}: expected a string, got {type(v).__name__}")
        return v
    if kind in ("ints", "floats", "strs"):
        if not isinstance(v, list):
            raise AttrsError(f"{where}: expected a list, got {type(v).__name__}")
        return tuple(_decode_value(f"{where}[{i}]", kind[:-1], x) for i, x in enumerate(v))
    if kind == "tensor":
        return _decode_tensor(where, v)
    raise AttrsError(f"{where}: the attrs table has no decoder for kind {kind!r}")


_DTYPES_BY_NAME = {d.numpy.name: d for d in DType if d is not DType.string}


def _decode_tensor(where: str, v: Any) -> TensorAttr:
    if not isinstance(v, dict) or set(v) != {"__tensor__", "shape", "data"}:
        raise AttrsError(f"{where}: expected a tensor {{__tensor__, shape, data}}")
    dt = _DTYPES_BY_NAME.get(v["__tensor__"]) if isinstance(v["__tensor__"], str) else None
    if dt is None:
        raise AttrsError(f"{where}: unknown tensor dtype {v['__tensor__']!r}")
    shape = v["shape"]
    if not isinstance(shape, list) or any(isinstance(d, bool) or not isinstance(d, int) or d < 0 for d in shape):
        raise AttrsError(f"{where}: tensor shape must be a list of non-negative ints")
    n = math.prod(shape)
    data = v["data"]
    if n > MAX_TENSOR_ATTR_ELEMENTS or not isinstance(data, list) or len(data) != n:
        raise AttrsError(f"{where}: tensor data must hold {n} values (at most {MAX_TENSOR_ATTR_ELEMENTS})")
    if any(isinstance(x, (bool, int, float)) is False for x in data):
        raise AttrsError(f"{where}: tensor data must be numbers")
    return TensorAttr(np.array(data, dtype=dt.numpy).reshape(shape))


class _Ref:
    """An epilogue argument of a fused node: the anchor's result, a node input, or an earlier op."""

    __slots__ = ("index", "kind")

    def __init__(self, kind: str, index: int):
        self.kind = kind
        self.index = index


class _EpilogueOp:
    __slots__ = ("args", "attrs", "op")

    def __init__(self, op: str, attrs: AttrRecord, args: tuple[_Ref, ...]):
        self.op = op
        self.attrs = attrs
        self.args = args


def _decode_ref(where: str, v: Any, *, n_ops: int, has_acc: bool) -> _Ref:
    if not (isinstance(v, dict) and v.get("__dataclass__") == "Ref" and isinstance(v.get("fields"), dict)):
        raise AttrsError(f"{where}: expected a Ref")
    f = v["fields"]
    kind, index = f.get("kind"), f.get("index", 0)
    if set(f) - {"kind", "index"} or kind not in ("acc", "in", "op"):
        raise AttrsError(f"{where}: a Ref has kind acc, in or op, and an index")
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise AttrsError(f"{where}: Ref index must be a non-negative int")
    if kind == "op" and index >= n_ops:
        raise AttrsError(f"{where}: op{index} is not before it")
    if kind == "acc" and not has_acc:
        raise AttrsError(f"{where}: an elementwise-only fused node has no acc")
    return _Ref(kind, index)


def _decode_fused(data: Any) -> AttrRecord:
    """The Fused node's nested form: an anchor op with its own attrs, and an epilogue DAG."""
    op = "Fused"
    if not isinstance(data, dict):
        raise AttrsError(f"{op}: attrs must be an object")
    unknown = sorted(set(data) - set(FUSED[2]))
    if unknown:
        raise AttrsError(f"{op}: unknown attribute(s) {unknown}")
    anchor_op = data.get("anchor_op")
    anchor_domain = data.get("anchor_domain", "")
    if anchor_op is not None and not isinstance(anchor_op, str):
        raise AttrsError(f"{op}.anchor_op: expected a string or null")
    if not isinstance(anchor_domain, str):
        raise AttrsError(f"{op}.anchor_domain: expected a string")
    anchor_inputs = _decode_value(f"{op}.anchor_inputs", "int", data.get("anchor_inputs", 0))
    anchor_attrs = None
    if anchor_op is not None:
        a = data.get("anchor_attrs")
        if not (isinstance(a, dict) and a.get("op_type") == anchor_op and isinstance(a.get("fields"), dict)):
            raise AttrsError(f"{op}.anchor_attrs: expected the attrs of {anchor_op}")
        if a.get("domain", "") != anchor_domain:
            raise AttrsError(f"{op}.anchor_attrs: domain differs from anchor_domain")
        anchor_attrs = _decode_plain(anchor_op, anchor_domain, a["fields"])
    epi = data.get("epilogue", [])
    if not isinstance(epi, list):
        raise AttrsError(f"{op}.epilogue: expected a list")
    epilogue = []
    for j, e in enumerate(epi):
        w = f"{op}.epilogue[{j}]"
        if not (isinstance(e, dict) and e.get("__dataclass__") == "EpilogueOp" and isinstance(e.get("fields"), dict)):
            raise AttrsError(f"{w}: expected an EpilogueOp")
        f = e["fields"]
        if set(f) != {"op", "attrs", "args"} or not isinstance(f["op"], str) or not isinstance(f["args"], list):
            raise AttrsError(f"{w}: an EpilogueOp has op, attrs and args")
        ea = f["attrs"]
        if not (isinstance(ea, dict) and ea.get("op_type") == f["op"] and isinstance(ea.get("fields"), dict)):
            raise AttrsError(f"{w}.attrs: expected the attrs of {f['op']}")
        args = tuple(
            _decode_ref(f"{w}.args[{i}]", r, n_ops=j, has_acc=anchor_op is not None) for i, r in enumerate(f["args"])
        )
        epilogue.append(_EpilogueOp(f["op"], _decode_plain(f["op"], "", ea["fields"]), args))
    outs = data.get("outputs")
    if not isinstance(outs, list) or not outs:
        raise AttrsError(f"{op}.outputs: a fused node needs at least one output")
    outputs = tuple(
        _decode_ref(f"{op}.outputs[{i}]", r, n_ops=len(epilogue), has_acc=anchor_op is not None)
        for i, r in enumerate(outs)
    )
    return AttrRecord(
        op,
        {
            "anchor_op": anchor_op,
            "anchor_domain": anchor_domain,
            "anchor_attrs": anchor_attrs,
            "anchor_inputs": anchor_inputs,
            "epilogue": tuple(epilogue),
            "outputs": outputs,
        },
    )
