"""The op registry: for every op, its attrs class, type inference, numpy reference and traits.

The mechanism lives with the IR (the builder and the verifier look ops up here); the op
definitions live in graphc.ops and register into it when the op library is loaded
(`graphc.ops.load()`, which importing any graphc.ops module does). The IR never imports graphc.ops:
a lookup before the library is loaded is a clear error, not a hidden import.

An op is defined once: its numpy kernel in graphc.runtime.reference, and its type inference and
traits with `register_op` in graphc.ops:

    register_kernel("Relu", lambda ins, a, n: [np.maximum(ins[0], 0)])     # runtime/reference
    register_op("Relu", category=Category.ELEMENTWISE, infer=same_as_input)  # graphc/ops

- `infer(ctx) -> list[ValueType]` computes output types from input types, attributes and the
  values of inputs known at build time (constants, shapes of static tensors); it raises through
  `ctx.fail(...)`, which names the node and op.
- `compute(inputs, attrs, num_outputs) -> list[np.ndarray]` is the numpy reference the
  interpreter runs: always the kernel of the same (domain, op) in graphc.runtime.reference, the
  code a CPU engine runs. It must be vectorized (no Python loops over tensor elements).
- traits (`category`, `commutative`, `axis_reduction`, and the derived `elementwise`) are what
  passes and codegen ask instead of keeping op lists of their own.
- `value_infer(ctx)`, optional, gives output values known from types alone (Shape, Size), so
  that shape arithmetic resolves at build time.

The IR form of each ONNX op is its newest ONNX version; the frontend converts older versions.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn

import numpy as np

from graphc.errors import ShapeError
from graphc.ir.attrs import Attrs, onnx_attrs_class
from graphc.ir.types import DType, SequenceType, TensorType, ValueType
from graphc.runtime.reference import get_kernel


class Category(enum.Enum):
    ELEMENTWISE = "elementwise"  # pointwise with numpy broadcasting; fusable into epilogues
    REDUCTION = "reduction"
    NORMALIZATION = "normalization"
    MATMUL = "matmul"
    CONV = "conv"
    POOL = "pool"
    DATA = "data"  # data movement: transpose, slice, concat, gather...
    SHAPE = "shape"  # shape arithmetic: Shape, Size, Range... (folds away once shapes are bound)
    SEQUENCE = "sequence"
    CONTROL_FLOW = "control_flow"  # If, Loop, Scan: nodes that hold subgraphs
    FUSED = "fused"
    OTHER = "other"


@dataclass
class InferContext:
    """What type inference sees of one node."""

    op: str
    node_name: str
    attrs: Any
    input_types: list[ValueType | None]
    input_values: list[np.ndarray | None]
    num_outputs: int

    def fail(self, message: str) -> NoReturn:
        raise ShapeError(f"{self.op} node '{self.node_name}': {message}")

    def has_input(self, i: int) -> bool:
        return i < len(self.input_types) and self.input_types[i] is not None

    def type(self, i: int) -> TensorType:
        if not self.has_input(i):
            self.fail(f"input {i} is missing")
        t = self.input_types[i]
        if not isinstance(t, TensorType):
            self.fail(f"input {i} must be a tensor, got {t}")
        return t

    def rank(self, i: int) -> int:
        t = self.type(i)
        if t.shape is None:
            self.fail(f"input {i} has unknown rank")
        return len(t.shape)

    def value(self, i: int) -> np.ndarray | None:
        """The input's value if known at build time, else None (also for an omitted input)."""
        if i >= len(self.input_values):
            return None
        return self.input_values[i]

    def int_list(self, i: int) -> list[int] | None:
        v = self.value(i)
        return None if v is None else [int(x) for x in np.asarray(v).reshape(-1)]

    def axis(self, axis: int, rank: int) -> int:
        if not -rank <= axis < max(rank, 1):
            self.fail(f"axis {axis} is out of range for rank {rank}")
        return axis + rank if axis < 0 else axis


InferFn = Callable[[InferContext], list[ValueType]]
ComputeFn = Callable[[list[Any], Any, int], list[Any]]
ValueInferFn = Callable[[InferContext], list[np.ndarray | None]]


@dataclass(frozen=True)
class OpDef:
    op_type: str
    domain: str
    attrs: type[Attrs]
    infer: InferFn
    compute: ComputeFn
    category: Category
    value_infer: ValueInferFn | None = None
    # Inputs that must be known at compile time for the op to be compiled (e.g. Reshape's shape).
    static_inputs: tuple[int, ...] = ()
    # Traits: what passes and codegen ask instead of keeping their own op lists.
    commutative: bool = False  # a binary op whose two inputs may be swapped
    axis_reduction: bool = False  # a Reduce* op: reduces input 0 over `axes` (attr or input 1), keepdims
    doc: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def elementwise(self) -> bool:
        return self.category is Category.ELEMENTWISE


_REGISTRY: dict[tuple[str, str], OpDef] = {}


def register_op(
    op_type: str,
    *,
    infer: InferFn,
    category: Category,
    domain: str = "",
    attrs: type[Attrs] | None = None,
    value_infer: ValueInferFn | None = None,
    static_inputs: Sequence[int] = (),
    commutative: bool = False,
    axis_reduction: bool = False,
    doc: str = "",
) -> OpDef:
    """Define an op. For ONNX ops `attrs` defaults to the class generated from onnx.defs."""
    key = (domain, op_type)
    if key in _REGISTRY:
        raise ValueError(f"op {op_type!r} (domain {domain!r}) is registered twice")
    if attrs is None:
        attrs = onnx_attrs_class(op_type, domain)
    # The reference is the runtime's kernel of the same name, never a function given here, so the
    # interpreter and a CPU engine (which has only the runtime) run the same code.
    try:
        compute = get_kernel(op_type, domain)
    except KeyError as e:
        raise ValueError(f"op {op_type!r} (domain {domain!r}) has no reference kernel: {e}") from None
    opdef = OpDef(
        op_type=op_type,
        domain=domain,
        attrs=attrs,
        infer=infer,
        compute=compute,
        category=category,
        value_infer=value_infer,
        static_inputs=tuple(static_inputs),
        commutative=commutative,
        axis_reduction=axis_reduction,
        doc=doc,
    )
    _REGISTRY[key] = opdef
    return opdef


def get_op(op_type: str, domain: str = "") -> OpDef:
    try:
        return _REGISTRY[(domain, op_type)]
    except KeyError:
        if not _REGISTRY:
            raise KeyError(
                f"no op {op_type!r} in domain {domain!r}: the op library is not loaded (call graphc.ops.load())"
            ) from None
        raise KeyError(f"no op {op_type!r} in domain {domain!r}") from None


def has_op(op_type: str, domain: str = "") -> bool:
    return (domain, op_type) in _REGISTRY


def all_ops() -> list[OpDef]:
    return sorted(_REGISTRY.values(), key=lambda o: (o.domain, o.op_type))


# ---------------------------------------------------------------------------------------------
# Helpers shared by op families.


def same_as_input(ctx: InferContext) -> list[ValueType]:
    """Output 0 has the type of input 0 (unary elementwise ops)."""
    return [ctx.type(0)] * max(ctx.num_outputs, 1)


def broadcast_shapes(ctx: InferContext, *shapes: tuple | None) -> tuple | None:
    """Numpy (multidirectional) broadcasting over dims that may be symbolic or unknown."""
    if any(s is None for s in shapes):
        return None
    rank = max((len(s) for s in shapes), default=0)
    out = []
    for i in range(rank):
        dims = [s[len(s) - rank + i] for s in shapes if len(s) - rank + i >= 0]
        non_one = [d for d in dims if d != 1]
        if not non_one:
            out.append(1)
            continue
        ints = {d for d in non_one if isinstance(d, int)}
        if len(ints) > 1:
            ctx.fail(f"shapes {' and '.join(str(tuple(s)) for s in shapes)} do not broadcast")
        if ints:
            out.append(ints.pop())
            continue
        syms = {d for d in non_one if isinstance(d, str)}
        # A symbolic dim broadcast with an unknown one: the symbol is the best guess only if the
        # unknown one is 1 or equal; keep it unknown to stay honest.
        out.append(syms.pop() if len(syms) == 1 and None not in non_one else None)
    return tuple(out)


def broadcast_infer(ctx: InferContext, dtype: DType | None = None) -> list[ValueType]:
    """Elementwise op over all inputs with broadcasting; output dtype = input 0's or `dtype`."""
    types = [ctx.type(i) for i in range(len(ctx.input_types)) if ctx.has_input(i)]
    shape = broadcast_shapes(ctx, *(t.shape for t in types))
    return [TensorType(dtype or types[0].dtype, shape)]


def tensor(dtype: DType, shape: Sequence[Any] | None) -> TensorType:
    return TensorType(dtype, None if shape is None else tuple(shape))


def sequence_of(elem: TensorType, length: int | None = None) -> SequenceType:
    return SequenceType(elem, length)
