"""Element types (DType): the ONNX TensorProto element codes, their numpy dtypes and short names.

They live in the runtime because both sides speak them: an engine's tensors and the reference
kernels (graphc.runtime.reference) need them without the compiler, and the IR's TensorType is
built on them (graphc.ir.types re-exports DType).
"""

from __future__ import annotations

import enum

import ml_dtypes
import numpy as np

# A dim is an int (concrete), a str (a named symbolic dim such as "batch"), or None (unknown).
Dim = int | str | None
Shape = tuple[Dim, ...]


class DType(enum.Enum):
    """Element types. Values are the ONNX TensorProto.DataType codes (fixed by the ONNX spec)."""

    float32 = 1
    uint8 = 2
    int8 = 3
    uint16 = 4
    int16 = 5
    int32 = 6
    int64 = 7
    string = 8
    bool = 9
    float16 = 10
    float64 = 11
    uint32 = 12
    uint64 = 13
    complex64 = 14
    complex128 = 15
    bfloat16 = 16
    float8e4m3fn = 17
    float8e4m3fnuz = 18
    float8e5m2 = 19
    float8e5m2fnuz = 20
    uint4 = 21
    int4 = 22
    float4e2m1 = 23
    float8e8m0 = 24
    uint2 = 25
    int2 = 26

    @property
    def numpy(self) -> np.dtype:
        return _TO_NUMPY[self]

    @property
    def itemsize(self) -> int:
        return self.numpy.itemsize

    @property
    def is_float(self) -> bool:
        return self in _FLOATS

    @property
    def is_int(self) -> bool:
        return self in _INTS

    @property
    def is_signed(self) -> bool:
        return self in _FLOATS or self in (DType.int8, DType.int16, DType.int32, DType.int64, DType.int4, DType.int2)

    @property
    def short(self) -> str:
        """Short name used in the text form: f32, f16, bf16, i64, bool..."""
        return _SHORT[self]

    @staticmethod
    def from_numpy(dtype: np.dtype | type) -> DType:
        dt = np.dtype(dtype)
        try:
            return _FROM_NUMPY[dt]
        except KeyError:
            if dt.kind in ("U", "S", "O"):
                return DType.string
            raise ValueError(f"numpy dtype {dt} has no graphc DType") from None

    @staticmethod
    def from_onnx(code: int) -> DType:
        try:
            return DType(code)
        except ValueError:
            raise ValueError(f"ONNX element type {code} is not supported by graphc") from None

    @staticmethod
    def from_short(name: str) -> DType:
        return _FROM_SHORT[name]


_TO_NUMPY: dict[DType, np.dtype] = {
    DType.float32: np.dtype(np.float32),
    DType.uint8: np.dtype(np.uint8),
    DType.int8: np.dtype(np.int8),
    DType.uint16: np.dtype(np.uint16),
    DType.int16: np.dtype(np.int16),
    DType.int32: np.dtype(np.int32),
    DType.int64: np.dtype(np.int64),
    DType.string: np.dtype(object),
    DType.bool: np.dtype(np.bool_),
    DType.float16: np.dtype(np.float16),
    DType.float64: np.dtype(np.float64),
    DType.uint32: np.dtype(np.uint32),
    DType.uint64: np.dtype(np.uint64),
    DType.complex64: np.dtype(np.complex64),
    DType.complex128: np.dtype(np.complex128),
    DType.bfloat16: np.dtype(ml_dtypes.bfloat16),
    DType.float8e4m3fn: np.dtype(ml_dtypes.float8_e4m3fn),
    DType.float8e4m3fnuz: np.dtype(ml_dtypes.float8_e4m3fnuz),
    DType.float8e5m2: np.dtype(ml_dtypes.float8_e5m2),
    DType.float8e5m2fnuz: np.dtype(ml_dtypes.float8_e5m2fnuz),
    DType.uint4: np.dtype(ml_dtypes.uint4),
    DType.int4: np.dtype(ml_dtypes.int4),
    DType.float4e2m1: np.dtype(ml_dtypes.float4_e2m1fn),
    DType.float8e8m0: np.dtype(ml_dtypes.float8_e8m0fnu),
    DType.uint2: np.dtype(ml_dtypes.uint2),
    DType.int2: np.dtype(ml_dtypes.int2),
}
_FROM_NUMPY = {v: k for k, v in _TO_NUMPY.items() if k is not DType.string}
_FLOATS = frozenset(
    {
        DType.float32,
        DType.float16,
        DType.float64,
        DType.bfloat16,
        DType.float8e4m3fn,
        DType.float8e4m3fnuz,
        DType.float8e5m2,
        DType.float8e5m2fnuz,
        DType.float4e2m1,
        DType.float8e8m0,
    }
)
_INTS = frozenset(
    {
        DType.uint8,
        DType.int8,
        DType.uint16,
        DType.int16,
        DType.int32,
        DType.int64,
        DType.uint32,
        DType.uint64,
        DType.uint4,
        DType.int4,
        DType.uint2,
        DType.int2,
    }
)
_SHORT = {
    DType.float32: "f32",
    DType.float16: "f16",
    DType.bfloat16: "bf16",
    DType.float64: "f64",
    DType.int8: "i8",
    DType.int16: "i16",
    DType.int32: "i32",
    DType.int64: "i64",
    DType.uint8: "u8",
    DType.uint16: "u16",
    DType.uint32: "u32",
    DType.uint64: "u64",
    DType.bool: "bool",
    DType.string: "str",
    DType.complex64: "c64",
    DType.complex128: "c128",
    DType.float8e4m3fn: "f8e4m3fn",
    DType.float8e4m3fnuz: "f8e4m3fnuz",
    DType.float8e5m2: "f8e5m2",
    DType.float8e5m2fnuz: "f8e5m2fnuz",
    DType.uint4: "u4",
    DType.int4: "i4",
    DType.float4e2m1: "f4e2m1",
    DType.float8e8m0: "f8e8m0",
    DType.uint2: "u2",
    DType.int2: "i2",
}
_FROM_SHORT = {v: k for k, v in _SHORT.items()}
