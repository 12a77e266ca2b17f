"""A stand-in for nvmath.bindings.cublasLt over tools/fake_cupy.py's host memory, for running a
tactic engine's real run path (VendorSteps, CUDAContext, capture and replay) without a GPU.

It implements cuBLASLt's documented semantics on its own terms, independently of
runtime/tactics_cublaslt.emulate: column-major matrices (element (r, c) at r + c * ld), op(X) from
TRANSA/TRANSB, D = epilogue(alpha op(A) op(B) + beta C + bias), bias along D's rows, strided batches.
Descriptor attributes are read back from the host buffers the caller passes, as the library does."""

from __future__ import annotations

import ctypes
import enum
import itertools
from typing import Any

import numpy as np

from tests.fake_gpu import F  # tools/fake_cupy.py

_DT = {0: np.float32, 2: np.float16, 14: None}  # bfloat16 (14): ml_dtypes, below
try:
    import ml_dtypes

    _DT[14] = ml_dtypes.bfloat16
except ImportError:  # pragma: no cover
    pass


class MatmulDescAttribute(enum.IntEnum):
    TRANSA = 3
    TRANSB = 4
    EPILOGUE = 7
    BIAS_POINTER = 8
    BIAS_BATCH_STRIDE = 10


class MatrixLayoutAttribute(enum.IntEnum):
    BATCH_COUNT = 5
    STRIDED_BATCH_OFFSET = 6


class MatmulPreferenceAttribute(enum.IntEnum):
    MAX_WORKSPACE_BYTES = 1
    MIN_ALIGNMENT_A_BYTES = 5
    MIN_ALIGNMENT_B_BYTES = 6
    MIN_ALIGNMENT_C_BYTES = 7
    MIN_ALIGNMENT_D_BYTES = 8


_ids = itertools.count(1)
_objects: dict[int, dict[str, Any]] = {}
calls: list[dict[str, Any]] = []  # one entry per cublasLtMatmul, for the tests


def _read(buf: int, size: int, signed: bool = True) -> int:
    return int.from_bytes(ctypes.string_at(buf, size), "little", signed=signed)


def get_version() -> int:
    return 130100


def create() -> int:
    return next(_ids)


def destroy(handle: int) -> None:
    pass


def matmul_desc_create(compute: int, scale: int) -> int:
    h = next(_ids)
    _objects[h] = {"compute": compute, "scale": scale, "attrs": {}}
    return h


def _set(h: int, attr: int, buf: int, size: int) -> None:
    _objects[h]["attrs"][int(attr)] = _read(buf, size)


matmul_desc_set_attribute = matrix_layout_set_attribute = matmul_preference_set_attribute = _set


def matmul_desc_destroy(h: int) -> None:
    _objects.pop(h, None)


def matrix_layout_create(dtype: int, rows: int, cols: int, ld: int) -> int:
    h = next(_ids)
    _objects[h] = {"dtype": dtype, "rows": rows, "cols": cols, "ld": ld, "attrs": {}}
    return h


matrix_layout_destroy = matmul_desc_destroy


def matmul_preference_create() -> int:
    h = next(_ids)
    _objects[h] = {"attrs": {}}
    return h


matmul_preference_destroy = matmul_desc_destroy

_RESULT = np.dtype({"names": ["algo", "workspace_size", "state", "waves_count", "reserved"],
                    "formats": [("<u8", (8,)), "<u8", "<i4", "<f4", ("<i4", (4,))],
                    "offsets": [0, 64, 72, 76, 80], "itemsize": 96})  # fmt: skip


class MatmulHeuristicResult:
    def __init__(self, n: int):
        self._data = np.zeros(n, dtype=_RESULT)
        self.ptr = self._data.ctypes.data


WORKSPACE = 4096  # what the fake's algorithms ask for


def matmul_algo_get_heuristic(handle, desc, la, lb, lc, ld, pref, n, results, count) -> None:
    data = np.frombuffer((ctypes.c_char * (96 * n)).from_address(results), dtype=_RESULT)
    data["workspace_size"][:2] = [WORKSPACE, 0]
    data["algo"][:2, 0] = [7, 8]
    ctypes.c_int32.from_address(count).value = 2


def _matrix(layout: dict, ptr: int, batch: int) -> np.ndarray:
    """[batch, rows, cols] view (column-major: element (r, c) at r + c * ld) of fake memory."""
    dt = np.dtype(_DT[layout["dtype"]])
    stride = layout["attrs"].get(int(MatrixLayoutAttribute.STRIDED_BATCH_OFFSET), 0)
    span = (batch - 1) * stride + (layout["cols"] - 1) * layout["ld"] + layout["rows"]
    flat = F._bytes_at(ptr, span * dt.itemsize).view(dt)
    s = dt.itemsize
    return np.lib.stride_tricks.as_strided(
        flat, (batch, layout["rows"], layout["cols"]), (stride * s, s, layout["ld"] * s), writeable=True
    )


def matmul(handle, desc, alpha, a, la, b, lb, beta, c, lc, d, ld, algo, ws, ws_size, stream) -> None:
    D, A, B, C = _objects[desc], _objects[la], _objects[lb], _objects[lc]
    L = _objects[ld]
    batch = L["attrs"].get(int(MatrixLayoutAttribute.BATCH_COUNT), 1)
    al = ctypes.c_float.from_address(alpha).value
    be = ctypes.c_float.from_address(beta).value
    at = D["attrs"]
    epi = at.get(int(MatmulDescAttribute.EPILOGUE), 1)
    assert algo != 0 and ws_size >= 0
    calls.append({"epilogue": epi, "batch": batch, "ws": ws, "ws_size": ws_size, "algo": algo})

    def op() -> None:
        x = _matrix(A, a, batch).astype(np.float32)
        y = _matrix(B, b, batch).astype(np.float32)
        x = x.transpose(0, 2, 1) if at.get(int(MatmulDescAttribute.TRANSA), 0) == 1 else x
        y = y.transpose(0, 2, 1) if at.get(int(MatmulDescAttribute.TRANSB), 0) == 1 else y
        acc = al * (x @ y)
        if be != 0.0:
            acc = acc + be * _matrix(C, c, batch).astype(np.float32)
        if epi in (4, 6, 36):  # BIAS, RELU_BIAS, GELU_BIAS: a vector over D's rows
            rows, dt = L["rows"], np.dtype(_DT[L["dtype"]])
            bstride = at.get(int(MatmulDescAttribute.BIAS_BATCH_STRIDE), 0)
            ptr = at[int(MatmulDescAttribute.BIAS_POINTER)]
            for i in range(batch):
                acc[i] += (
                    F._bytes_at(ptr + i * bstride * dt.itemsize, rows * dt.itemsize)
                    .view(dt)
                    .astype(np.float32)[:, None]
                )
        if epi in (2, 6):
            acc = np.maximum(acc, 0)
        if epi in (32, 36):
            acc = 0.5 * acc * (1 + np.tanh(np.sqrt(2 / np.pi) * (acc + 0.044715 * acc**3)))
        _matrix(L, d, batch)[...] = acc.astype(_DT[L["dtype"]])

    F.enqueue(op)
