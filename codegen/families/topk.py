"""The topk family: ONNX TopK (largest or smallest, any axis, values and int64 indices, ties by the
lower index first as ONNX specifies, NaN above every number as the reference sorts).

One block per line along the axis. Lines that fit in shared memory are bitonic-sorted there
(`sort`); longer ones take K rounds of a block-wide search for the next element in the output
order (`select`), which the compile log names since it costs O(K * N) per line. `sorted=0`
leaves the order unspecified in ONNX; the kernel writes the sorted order either way, which is
what the reference gives.
"""

from __future__ import annotations

import logging
import math

from graphc.codegen.cuda_types import cuda_type, dtype_from_numpy_name
from graphc.codegen.kernel import KernelSource, StepContext, register_family, render
from graphc.ir.types import DType

log = logging.getLogger(__name__)

# Shared memory of the sort variant: P * (key bytes + 4) must stay within the 48 KiB a block gets
# without opting in: 4096 entries of 4-byte keys, 2048 of 8-byte keys.
SORT_BYTES = 48 * 1024
SELECT_BLOCK = 256
_FLOATS = (DType.float16, DType.bfloat16, DType.float32, DType.float64)


def _matches(ctx: StepContext) -> bool:
    return ctx.step.op == "TopK" and ctx.step.domain == ""


def _key_type(dtype: DType, compute: str) -> tuple[str, int]:
    """The C type keys are compared in, and its size in bytes."""
    if dtype in (DType.float16, DType.bfloat16, DType.float32):
        return "float", 4
    sizes = {"double": 8, "long long": 8, "unsigned long long": 8, "int": 4, "unsigned": 4}
    return compute, sizes[compute]


def sort_capacity(key_bytes: int) -> int:
    """The longest line (a power of two) the sort variant holds in shared memory."""
    p = 1
    while 2 * p * (key_bytes + 4) < SORT_BYTES:  # strictly below: room for the static rest
        p *= 2
    return p


def _generate(ctx: StepContext) -> list[KernelSource]:
    step = ctx.step
    where = f"{step.kind} node '{step.name}': "
    x = ctx.input_spec(0)
    assert x is not None
    dtype = dtype_from_numpy_name(x.dtype)
    if dtype is DType.bool:
        raise ctx.fail("TopK of bool has no CUDA kernel (ONNX TopK takes numbers)")
    ct = cuda_type(dtype, where)
    shape = tuple(int(d) for d in x.shape)
    rank = len(shape)
    axis = ctx.attrs.axis + rank if ctx.attrs.axis < 0 else ctx.attrs.axis
    out_shape = tuple(int(d) for d in ctx.tensors[step.outputs[0]].shape)
    n, k = shape[axis], out_shape[axis]
    outer, inner = math.prod(shape[:axis]), math.prod(shape[axis + 1 :])
    lines = outer * inner
    if k == 0 or lines == 0:
        return []  # empty outputs: nothing to write
    if len(step.outputs) < 2:
        raise ctx.fail("TopK needs both outputs for the cuda target")
    kt, key_bytes = _key_type(dtype, ct.compute)
    name = ctx.kernel_name()
    cap = sort_capacity(key_bytes)
    common = {
        "name": name,
        "T": ct.storage,
        "kt": kt,
        "load_v": f"({kt})({ct.to_compute('v')})",
        "is_float": dtype in _FLOATS,
        "largest": bool(ctx.attrs.largest),
        "N": n,
        "K": k,
        "inner": inner,
    }
    if n <= cap:
        p = 1 << max(0, (n - 1).bit_length())
        block = min(max(p // 2, 32), 512)
        source = render("topk.cu.j2", variant="sort", P=p, block=block, **common)
        params = {"variant": "sort", "P": p, "block": block}
    else:
        block = SELECT_BLOCK
        log.info(
            "TopK node '%s': lines of %d elements exceed the %d a shared-memory sort holds; "
            "%d rounds of a block-wide search per line (O(K * N))",
            step.name,
            n,
            cap,
            k,
        )
        source = render("topk.cu.j2", variant="select", block=block, **common)
        params = {"variant": "select", "block": block}
    args = [step.inputs[0], step.outputs[0], step.outputs[1]]
    return [KernelSource("topk", name, source, (lines, 1, 1), (block, 1, 1), args, params=params)]


register_family("topk", _matches, _generate)
