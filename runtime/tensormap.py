"""TMA tensor maps (CUtensorMap) of a kernel launch: typed specs, validated before any GPU work, and
encoded by the driver once the device addresses are known.

A launch whose kernel reads an operand through the bulk tensor copy engine names it by an argument
"@tmap:I", I indexing the launch's `params["tmaps"]`: a list of JSON specs

    {"tensor": name, "dtype": "float16", "dims": [inner, ...], "strides": [bytes of dim 1, ...],
     "box": [inner, ...], "swizzle": "128B"}

"dtype" is the tensor's own dtype, or "uint8" for any 1-byte tensor (int8 GEMM operands, FP8 bytes):
the copy engine moves bits, and the driver's 1-byte map type is UINT8.

A tensor map holds the tensor's device address, so it is encoded per execution context (each has its
own arena) when the context is created: cuTensorMapEncodeTiled, then the 128 bytes are copied into a
small device buffer of the context, and the kernel gets a pointer to its map (PTX allows the tensor
map of cp.async.bulk.tensor in global memory; a map written by the host before the launch needs no
tensormap proxy fence). The buffer never moves, so a captured CUDA graph stays valid. Passing maps
by value as __grid_constant__ parameters would need a 128-byte struct argument, which cupy's
launcher does not take.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from graphc.runtime.errors import EngineError

TMAP_BYTES = 128
TMAP_ALIGN = 64
PREFIX = "@tmap:"

# Closed tables: a spec names one of these, never a driver enum value.
_DTYPES = {"float16": ("FLOAT16", 2), "bfloat16": ("BFLOAT16", 2), "float32": ("FLOAT32", 4), "uint8": ("UINT8", 1)}
# The tensor dtypes a map of each dtype may read: its own, and for raw bytes every 1-byte type.
_READS = {"uint8": frozenset({"uint8", "int8", "float8_e4m3fn"})}
_SWIZZLES = {"none": ("NONE", 0), "32B": ("32B", 32), "64B": ("64B", 64), "128B": ("128B", 128)}


@dataclass(frozen=True)
class TensorMapSpec:
    tensor: str
    dtype: str
    dims: tuple[int, ...]  # elements, innermost first
    strides: tuple[int, ...]  # bytes, of dims[1:]
    box: tuple[int, ...]  # elements per copy, innermost first
    swizzle: str = "128B"

    @property
    def itemsize(self) -> int:
        return _DTYPES[self.dtype][1]

    def footprint(self) -> int:
        """Bytes from the tensor's base to one past the last element the map can address."""
        last = (self.dims[0] - 1) * self.itemsize + sum(
            (d - 1) * s for d, s in zip(self.dims[1:], self.strides, strict=True)
        )
        return last + self.itemsize

    def to_json(self) -> dict[str, Any]:
        return {
            "tensor": self.tensor,
            "dtype": self.dtype,
            "dims": list(self.dims),
            "strides": list(self.strides),
            "box": list(self.box),
            "swizzle": self.swizzle,
        }


def is_tmap_arg(arg: str) -> bool:
    return arg.startswith(PREFIX)


def tmap_index(arg: str, where: str) -> int:
    tail = arg[len(PREFIX) :]
    if not tail.isdigit():
        raise EngineError(f"{where}: bad tensor-map argument {arg!r}")
    return int(tail)


def spec_from_json(d: Any, where: str) -> TensorMapSpec:
    """A spec from its JSON form, every field checked against the driver's limits."""
    if not isinstance(d, dict) or set(d) != {"tensor", "dtype", "dims", "strides", "box", "swizzle"}:
        raise EngineError(f"{where}: a tensor map needs exactly tensor, dtype, dims, strides, box, swizzle")

    def ints(key: str) -> tuple[int, ...]:
        v = d[key]
        if not isinstance(v, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
            raise EngineError(f"{where}: tensor map field {key!r} must be a list of integers")
        return tuple(v)

    spec = TensorMapSpec(
        str(d["tensor"]), str(d["dtype"]), ints("dims"), ints("strides"), ints("box"), str(d["swizzle"])
    )
    if spec.dtype not in _DTYPES:
        raise EngineError(f"{where}: tensor map dtype {spec.dtype!r} is not one of {sorted(_DTYPES)}")
    if spec.swizzle not in _SWIZZLES:
        raise EngineError(f"{where}: tensor map swizzle {spec.swizzle!r} is not one of {sorted(_SWIZZLES)}")
    rank = len(spec.dims)
    if not 1 <= rank <= 5 or len(spec.strides) != rank - 1 or len(spec.box) != rank:
        raise EngineError(
            f"{where}: tensor map of rank {rank} with {len(spec.strides)} strides, {len(spec.box)} box dims"
        )
    if any(x < 1 or x > 2**32 for x in spec.dims):
        raise EngineError(f"{where}: tensor map dims {spec.dims} out of range [1, 2^32]")
    if any(s <= 0 or s % 16 or s >= 2**40 for s in spec.strides):
        raise EngineError(f"{where}: tensor map strides {spec.strides} must be positive multiples of 16 below 2^40")
    if any(b < 1 or b > 256 for b in spec.box):
        raise EngineError(f"{where}: tensor map box {spec.box} out of range [1, 256]")
    inner = spec.box[0] * spec.itemsize
    if inner % 16:
        raise EngineError(f"{where}: tensor map box row of {inner} bytes is not a multiple of 16")
    sw = _SWIZZLES[spec.swizzle][1]
    if sw and inner > sw:
        raise EngineError(f"{where}: a {spec.swizzle} swizzled box row holds at most {sw} bytes, not {inner}")
    return spec


def validate_launch(
    params: dict[str, Any], args: list[str], tensors: dict[str, Any], where: str
) -> list[TensorMapSpec]:
    """The tensor maps of one launch, checked: every "@tmap:I" names a spec, every spec names a
    tensor of the plan with its dtype, and the map addresses nothing beyond the tensor's bytes."""
    raw = params.get("tmaps", [])
    if not isinstance(raw, list):
        raise EngineError(f"{where}: params.tmaps must be a list")
    specs = [spec_from_json(d, f"{where}, tensor map {i}") for i, d in enumerate(raw)]
    for a in args:
        if is_tmap_arg(a) and tmap_index(a, where) >= len(specs):
            raise EngineError(f"{where}: argument {a} names no tensor map (the launch has {len(specs)})")
    for i, s in enumerate(specs):
        t = tensors.get(s.tensor)
        if t is None:
            raise EngineError(f"{where}: tensor map {i} reads unknown tensor '{s.tensor}'")
        if getattr(t, "dtype", None) not in _READS.get(s.dtype, {s.dtype}):
            raise EngineError(f"{where}: tensor map {i} reads '{s.tensor}' as {s.dtype}, it is {t.dtype}")
        nbytes = int(getattr(t, "nbytes", 0))
        if s.footprint() > nbytes:
            raise EngineError(
                f"{where}: tensor map {i} spans {s.footprint()} bytes of '{s.tensor}', which has {nbytes}"
            )
    return specs


def _driver():
    try:
        from cuda.bindings import driver
    except ImportError as e:
        raise EngineError(
            "kernels with tensor maps need cuda-bindings: pip install cuda-bindings, "
            "or in a clone of graphc: pip install -e '.[cuda]'"
        ) from e
    (err,) = driver.cuInit(0)
    if err != driver.CUresult.CUDA_SUCCESS:
        raise EngineError(f"cuInit failed: {err}")
    return driver


def encode(spec: TensorMapSpec, address: int) -> bytes:
    """The 128 bytes of the driver's CUtensorMap for `spec` at device address `address`."""
    if address % 16:
        raise EngineError(f"tensor '{spec.tensor}' at {address:#x} is not 16-byte aligned for a tensor map")
    drv = _driver()
    dt = getattr(drv.CUtensorMapDataType, "CU_TENSOR_MAP_DATA_TYPE_" + _DTYPES[spec.dtype][0])
    sw = getattr(drv.CUtensorMapSwizzle, "CU_TENSOR_MAP_SWIZZLE_" + _SWIZZLES[spec.swizzle][0])
    err, tmap = drv.cuTensorMapEncodeTiled(
        dt,
        len(spec.dims),
        address,
        [drv.cuuint64_t(x) for x in spec.dims],
        [drv.cuuint64_t(x) for x in spec.strides],
        [drv.cuuint32_t(x) for x in spec.box],
        [drv.cuuint32_t(1)] * len(spec.dims),
        drv.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        sw,
        drv.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        drv.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
    )
    if err != drv.CUresult.CUDA_SUCCESS:
        raise EngineError(f"cuTensorMapEncodeTiled failed for tensor '{spec.tensor}' {spec.to_json()}: {err}")
    words = [int(w) for w in tmap.opaque]
    return b"".join(w.to_bytes(8, "little") for w in words)


class TensorMapTable:
    """The tensor maps of one execution context, in one device buffer (64-byte aligned slots)."""

    def __init__(self, cupy: Any, entries: list[tuple[TensorMapSpec, int]]):
        import numpy as np

        self.count = len(entries)
        host = np.zeros(max(1, self.count) * TMAP_BYTES, dtype=np.uint8)
        for i, (spec, addr) in enumerate(entries):
            host[i * TMAP_BYTES : (i + 1) * TMAP_BYTES] = np.frombuffer(encode(spec, addr), dtype=np.uint8)
        self.buffer = cupy.asarray(host)  # cupy allocations are 256-byte aligned
        if self.buffer.data.ptr % TMAP_ALIGN:
            raise EngineError("the tensor-map buffer is not 64-byte aligned")

    def arg(self, i: int) -> Any:
        """A kernel argument pointing at map i (a uint8 view, which cupy passes as its pointer)."""
        return self.buffer[i * TMAP_BYTES : (i + 1) * TMAP_BYTES]
