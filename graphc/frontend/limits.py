"""How large a tensor graphc agrees to plan for, checked as soon as shapes are known (after the
ONNX file is read, and again once input shapes are bound), so that a dim of 2**40 is one error
line instead of a petabyte allocation deep inside a compile. Exact Python integers: a product of
dims never wraps the way an int64 one does."""

from __future__ import annotations

import math
import os

from graphc.errors import ShapeError


def _physical_memory() -> int:
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 64 * 2**30


def max_tensor_bytes() -> int:
    """The cap: GRAPHC_MAX_TENSOR_BYTES, else this machine's physical memory."""
    env = os.environ.get("GRAPHC_MAX_TENSOR_BYTES")
    if env:
        try:
            value = int(env)
        except ValueError:
            raise ShapeError(f"GRAPHC_MAX_TENSOR_BYTES={env!r} is not a number of bytes") from None
        if value > 0:
            return value
        raise ShapeError(f"GRAPHC_MAX_TENSOR_BYTES={env!r} must be positive")
    return _physical_memory()


def known_bytes(shape: tuple | None, itemsize: int) -> int:
    """Bytes of a tensor counting only its known dims (symbolic ones as 1): a lower bound."""
    if shape is None:
        return 0
    return math.prod(d for d in shape if isinstance(d, int)) * itemsize


def check_value_sizes(graph) -> None:
    """Refuse a graph any of whose values (inputs, constants, results) needs more bytes than the cap."""
    from graphc.ir.types import TensorType

    cap = max_tensor_bytes()
    for name, v in graph.values.items():
        t = v.type
        if not isinstance(t, TensorType):
            continue
        n = known_bytes(t.shape, t.dtype.itemsize)
        if n > cap:
            raise ShapeError(
                f"value '{name}' ({t}) needs {n} bytes, more than the {cap} graphc plans for on this "
                "machine (GRAPHC_MAX_TENSOR_BYTES)"
            )


__all__ = ["check_value_sizes", "known_bytes", "max_tensor_bytes"]
