"""Tensor and sequence types of IR values.

A dim is an int (concrete), a str (a named symbolic dim such as "batch", bound later by
`bind_shapes`), or None (unknown: produced where inference cannot tell, e.g. NonZero's count or a
Reshape whose target shape is computed at run time before shapes are bound).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from graphc.runtime.dtypes import Dim, DType, Shape

__all__ = ["DType", "Dim", "SequenceType", "Shape", "TensorType", "ValueType", "dim_str"]


def dim_str(d: Dim) -> str:
    return "?" if d is None else str(d)


@dataclass(frozen=True)
class TensorType:
    """dtype and shape of a tensor value. `shape` is None when even the rank is unknown."""

    dtype: DType
    shape: Shape | None

    @property
    def rank(self) -> int:
        if self.shape is None:
            raise ValueError("rank of a tensor of unknown rank")
        return len(self.shape)

    @property
    def is_static(self) -> bool:
        return self.shape is not None and all(isinstance(d, int) for d in self.shape)

    @property
    def static_shape(self) -> tuple[int, ...]:
        if not self.is_static:
            raise ValueError(f"shape {self} is not concrete")
        return self.shape  # type: ignore[return-value]

    @property
    def numel(self) -> int:
        return math.prod(self.static_shape)

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize

    def with_shape(self, shape: Shape | None) -> TensorType:
        return TensorType(self.dtype, None if shape is None else tuple(shape))

    def with_dtype(self, dtype: DType) -> TensorType:
        return TensorType(dtype, self.shape)

    def __str__(self) -> str:
        if self.shape is None:
            return f"{self.dtype.short}[*]"
        return f"{self.dtype.short}[{','.join(dim_str(d) for d in self.shape)}]"

    @staticmethod
    def of(array: np.ndarray) -> TensorType:
        return TensorType(DType.from_numpy(array.dtype), tuple(int(d) for d in array.shape))


@dataclass(frozen=True)
class SequenceType:
    """A sequence of tensors (SplitToSequence). `length` is None when unknown."""

    elem: TensorType
    length: int | None = None

    @property
    def is_static(self) -> bool:
        return False

    def __str__(self) -> str:
        return f"seq<{self.elem}>" + ("" if self.length is None else f"x{self.length}")


@dataclass(frozen=True)
class OptionalType:
    """An optional tensor or sequence (ONNX optional_type): present or empty, known only at run
    time where it is a graph input. At run time an empty optional is None."""

    elem: TensorType | SequenceType

    @property
    def is_static(self) -> bool:
        return False

    def __str__(self) -> str:
        return f"opt<{self.elem}>"


ValueType = TensorType | SequenceType | OptionalType


def kind_of(t: ValueType) -> str:
    """'a tensor', 'a sequence' or 'an optional': how errors name a value's kind."""
    return "an optional" if isinstance(t, OptionalType) else "a sequence" if isinstance(t, SequenceType) else "a tensor"
