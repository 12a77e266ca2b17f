"""Typed node attributes.

Every op's attributes are a frozen dataclass: a typo in an attribute name is an AttributeError or
TypeError, never a silently missing key. For ONNX ops the class is generated from the newest
`onnx.defs` schema of the op, so field names, types and defaults are the spec's, not typed in by
hand. Ops of our own (fused nodes) declare their attrs classes by hand.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

# The runtime's own: a reference kernel sees the same tensor attribute in the interpreter and in
# a CPU engine.
from graphc.runtime.attrs import TensorAttr


@dataclass(frozen=True, kw_only=True)
class Attrs:
    """Base of every attrs class. Fields hold ints, floats, strs, tuples of those, or TensorAttr."""

    op_type: ClassVar[str] = ""
    domain: ClassVar[str] = ""

    def replace(self, **changes: Any) -> Attrs:
        return dataclasses.replace(self, **changes)

    def items(self) -> list[tuple[str, Any]]:
        return [(f.name, getattr(self, f.name)) for f in dataclasses.fields(self)]

    def non_default_items(self) -> list[tuple[str, Any]]:
        out = []
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.default is dataclasses.MISSING or v != f.default:
                out.append((f.name, v))
        return out

    def __post_init__(self) -> None:
        # Lists become tuples so that attrs stay hashable (CSE keys nodes on them).
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if isinstance(v, list):
                object.__setattr__(self, f.name, tuple(v))
            elif isinstance(v, np.ndarray):
                object.__setattr__(self, f.name, TensorAttr(v))
            elif isinstance(v, bytes):
                object.__setattr__(self, f.name, v.decode())
            elif isinstance(v, np.generic):
                object.__setattr__(self, f.name, v.item())


@dataclass(frozen=True, kw_only=True)
class NoAttrs(Attrs):
    """Attrs of an op that takes none."""


class AttrSchemaError(Exception):
    pass


def _onnx_attr_field(attr: Any) -> tuple[type, Any]:
    """Python type and default for one onnx.defs OpSchema.Attribute."""
    import onnx
    from onnx.defs import OpSchema

    t = attr.type
    T = OpSchema.AttrType
    py_types = {
        T.INT: int,
        T.FLOAT: float,
        T.STRING: str,
        T.INTS: tuple,
        T.FLOATS: tuple,
        T.STRINGS: tuple,
        T.TENSOR: TensorAttr,
    }
    py_t = py_types.get(t, object)
    if attr.default_value is not None and attr.default_value.name:
        default = onnx.helper.get_attribute_value(attr.default_value)
        if isinstance(default, bytes):
            default = default.decode()
        elif isinstance(default, list):
            default = tuple(x.decode() if isinstance(x, bytes) else x for x in default)
        elif isinstance(default, onnx.TensorProto):
            default = TensorAttr(onnx.numpy_helper.to_array(default))
        return py_t, default
    if attr.required:
        return py_t, dataclasses.MISSING
    return py_t, None


def onnx_attrs_class(op_type: str, domain: str = "", max_version: int | None = None) -> type[Attrs]:
    """The attrs dataclass of an ONNX op, generated from its newest schema (or the newest at or
    below `max_version`). One class per (op, domain, version), however it is asked for."""
    return _onnx_attrs_class(op_type, domain, max_version)


@functools.cache
def _onnx_attrs_class(op_type: str, domain: str, max_version: int | None) -> type[Attrs]:
    import onnx.defs

    if max_version is None:
        schema = onnx.defs.get_schema(op_type, domain=domain)
    else:
        schema = onnx.defs.get_schema(op_type, max_version, domain=domain)
    fields = []
    for name in sorted(schema.attributes):
        py_t, default = _onnx_attr_field(schema.attributes[name])
        if default is dataclasses.MISSING:
            fields.append((name, py_t))
        else:
            fields.append((name, py_t, dataclasses.field(default=default)))
    cls = dataclasses.make_dataclass(f"{op_type}Attrs", fields, bases=(Attrs,), frozen=True, kw_only=True)
    cls.op_type = op_type  # type: ignore[attr-defined]
    cls.__module__ = __name__
    return cls


def attr_fields(cls: type[Attrs]) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(cls)}


# ---- JSON form (engine manifests) -------------------------------------------------------------


def attrs_to_json(attrs: Attrs) -> dict[str, Any]:
    """A JSON-able dict of attrs; tensors become {"__tensor__": dtype, shape, data}."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(attrs):
        out[f.name] = _value_to_json(getattr(attrs, f.name))
    return out


def _value_to_json(v: Any) -> Any:
    if isinstance(v, TensorAttr):
        a = v.array
        return {"__tensor__": a.dtype.name, "shape": list(a.shape), "data": a.ravel().tolist()}
    if isinstance(v, Attrs):
        return {
            "__attrs__": type(v).__name__,
            "op_type": type(v).op_type,
            "domain": type(v).domain,
            "fields": attrs_to_json(v),
        }
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return {
            "__dataclass__": type(v).__name__,
            "fields": {f.name: _value_to_json(getattr(v, f.name)) for f in dataclasses.fields(v)},
        }
    if isinstance(v, tuple):
        return [_value_to_json(x) for x in v]
    return v


def _value_from_json(v: Any, field_type: Any = None) -> Any:
    if isinstance(v, list):
        return tuple(_value_from_json(x) for x in v)
    if isinstance(v, dict) and "__tensor__" in v:
        import ml_dtypes  # noqa: F401  (registers bfloat16 and friends with numpy)

        from graphc.ir.types import DType

        dt = next((d.numpy for d in DType if d.numpy.name == v["__tensor__"]), np.dtype(v["__tensor__"]))
        return TensorAttr(np.array(v["data"], dtype=dt).reshape(v["shape"]))
    if isinstance(v, dict) and "__attrs__" in v:
        from graphc.ir.registry import get_op

        op = v.get("op_type") or ""
        if not op:
            raise ValueError(f"cannot rebuild attrs {v['__attrs__']!r}: no op_type")
        return attrs_from_json(get_op(op, v.get("domain", "")).attrs, v["fields"])
    if isinstance(v, dict) and "__dataclass__" in v:
        # A closed table of the nested value classes attrs may hold: a data file never picks
        # which callable runs (this once called whatever name graphc.ops.fused held).
        from graphc.ir.fused import EpilogueOp, Ref

        classes: dict[str, type] = {"Ref": Ref, "EpilogueOp": EpilogueOp}
        cls = classes.get(v["__dataclass__"]) if isinstance(v["__dataclass__"], str) else None
        if cls is None:
            raise ValueError(f"attrs hold an unknown value class {v['__dataclass__']!r}")
        return cls(**{k: _value_from_json(x) for k, x in v["fields"].items()})
    return v


def attrs_from_json(cls: type[Attrs], d: dict[str, Any]) -> Attrs:
    return cls(**{k: _value_from_json(v) for k, v in d.items()})
