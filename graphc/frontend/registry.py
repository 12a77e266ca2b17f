"""Converters from ONNX nodes to IR nodes, one per (op, version range).

The IR form of an op is its newest ONNX version. For a node of a model at opset N, the frontend
takes the converter registered with the largest `since` not above N:

- `passthrough("Relu", since=6)` declares that ONNX versions from 6 on mean what the IR op means,
  with the same attribute names: the node is copied, attributes typed by the op's attrs class;
- `@converter("Softmax", since=1)` registers a function for versions whose form differs (an
  attribute that became an input, other semantics); it emits IR nodes and returns the values of
  the node's outputs.

An op with no converter at the model's opset is unsupported, and the frontend lists it.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from graphc.ir.graph import Value

if TYPE_CHECKING:
    from graphc.frontend.context import ConvertContext

ConverterFn = Callable[["ConvertContext"], Sequence[Value]]

_CONVERTERS: dict[tuple[str, str], list[tuple[int, ConverterFn]]] = {}


def converter(op_type: str, since: int, domain: str = "") -> Callable[[ConverterFn], ConverterFn]:
    def deco(fn: ConverterFn) -> ConverterFn:
        _add(op_type, domain, since, fn)
        return fn

    return deco


def passthrough(*op_types: str, since: int, domain: str = "") -> None:
    """ONNX versions >= since of these ops are the IR op as they stand."""
    for op in op_types:
        _add(op, domain, since, _default_converter)


def _add(op_type: str, domain: str, since: int, fn: ConverterFn) -> None:
    entries = _CONVERTERS.setdefault((domain, op_type), [])
    if any(s == since for s, _ in entries):
        raise ValueError(f"converter for {op_type} since {since} registered twice")
    bisect.insort(entries, (since, fn), key=lambda e: e[0])


def find_converter(op_type: str, domain: str, opset: int) -> ConverterFn | None:
    _ensure_loaded()
    entries = _CONVERTERS.get((domain, op_type))
    if not entries:
        return None
    best = None
    for since, fn in entries:
        if since <= opset:
            best = fn
    return best


def supported_ops() -> dict[tuple[str, str], list[int]]:
    """(domain, op) -> the `since` versions that have converters."""
    _ensure_loaded()
    return {k: [s for s, _ in v] for k, v in sorted(_CONVERTERS.items())}


def _default_converter(ctx: ConvertContext) -> Sequence[Value]:
    node = ctx.emit(
        ctx.op_type, ctx.inputs, ctx.typed_attrs(), outputs=ctx.output_names, name=ctx.name, domain=ctx.domain
    )
    return node.outputs


_loaded = False


def _ensure_loaded() -> None:
    global _loaded
    if not _loaded:
        _loaded = True  # set first: the modules being imported may look ops up themselves
        try:
            import graphc.frontend.converters  # noqa: F401
        except BaseException:
            _loaded = False  # a half-loaded registry must not hide the import error
            raise
