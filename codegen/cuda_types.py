"""How each IR dtype is stored, loaded and computed with in generated CUDA code.

16-bit floats are stored as 16-bit integers (see templates/common.cuh) and computed in fp32, so
every fused epilogue and elementwise DAG accumulates in fp32 whatever the storage precision.
"""

from __future__ import annotations

from dataclasses import dataclass

from graphc.errors import CompileError
from graphc.ir.types import DType


@dataclass(frozen=True)
class CudaType:
    storage: str  # C type of an element in memory
    compute: str  # C type arithmetic happens in
    load: str  # format string turning a stored value {} into the compute type
    store: str  # format string turning a compute value {} into the stored type

    def to_compute(self, expr: str) -> str:
        return self.load.format(expr)

    def to_storage(self, expr: str) -> str:
        return self.store.format(expr)


CUDA_TYPES: dict[DType, CudaType] = {
    DType.float32: CudaType("float", "float", "{}", "{}"),
    DType.float16: CudaType("gc_half", "float", "gc_h2f({})", "gc_f2h({})"),
    DType.bfloat16: CudaType("gc_bf16", "float", "gc_bf2f({})", "gc_f2bf({})"),
    DType.float64: CudaType("double", "double", "{}", "{}"),
    # FP8 E4M3 (fp8 engines' GEMM operands): bytes, computed in fp32; stores saturate (common.cuh)
    DType.float8e4m3fn: CudaType("unsigned char", "float", "gc_e4m32f({})", "gc_f2e4m3({})"),
    DType.int8: CudaType("signed char", "int", "(int)({})", "(signed char)({})"),
    DType.uint8: CudaType("unsigned char", "unsigned", "(unsigned)({})", "(unsigned char)({})"),
    DType.int16: CudaType("short", "int", "(int)({})", "(short)({})"),
    DType.uint16: CudaType("unsigned short", "unsigned", "(unsigned)({})", "(unsigned short)({})"),
    DType.int32: CudaType("int", "int", "{}", "{}"),
    DType.uint32: CudaType("unsigned", "unsigned", "{}", "{}"),
    DType.int64: CudaType("long long", "long long", "{}", "{}"),
    DType.uint64: CudaType("unsigned long long", "unsigned long long", "{}", "{}"),
    DType.bool: CudaType("unsigned char", "bool", "({} != 0)", "(unsigned char)({})"),
}


def cuda_type(dtype: DType, where: str = "") -> CudaType:
    try:
        return CUDA_TYPES[dtype]
    except KeyError:
        raise CompileError(
            f"{where.rstrip(': ')}: dtype {dtype.name} has no CUDA kernels"
            if where
            else f"dtype {dtype.name} has no CUDA kernels"
        ) from None


def _by_numpy_name() -> dict[str, DType]:
    names: dict[str, DType] = {}
    for d in DType:
        if d is not DType.string:
            names.setdefault(d.numpy.name, d)  # the first in DType's order, as the scan below finds
    return names


# numpy's dtype.name is computed in Python on every access (ml_dtypes' types too): scanning DType
# for each lookup cost ~0.3 ms, and codegen asks for every tensor of every step (2.5 s of a
# ResNet-50 bucket estimate, graphc/bucket_cost.py). Names are looked up once, here.
_BY_NUMPY_NAME = _by_numpy_name()


def dtype_from_numpy_name(name: str) -> DType:
    if isinstance(name, str):
        d = _BY_NUMPY_NAME.get(name)
        if d is not None:
            return d
    # Not a known name: the scan, which also compares other objects (a numpy dtype equals its
    # name) as this function always has, and raises for what matches nothing.
    for d in DType:
        if d is not DType.string and d.numpy.name == name:
            return d
    raise CompileError(f"unknown dtype {name}")
