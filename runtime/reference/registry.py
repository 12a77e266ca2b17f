"""The table of reference kernels: (domain, op) -> the numpy function that computes the op.

A kernel is `fn(inputs, attrs, num_outputs) -> list of arrays`; `attrs` is anything with the op's
attribute fields (the IR's typed attrs in the interpreter, a decoded `AttrRecord` in a CPU engine),
so the interpreter and the CPU executor run the same code. The table is filled by the family
modules of this package at import and is closed: a name that is not in it is not run.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

KernelFn = Callable[[list[Any], Any, int], list[Any]]

_KERNELS: dict[tuple[str, str], KernelFn] = {}


def register_kernel(op_type: str, fn: KernelFn, *, domain: str = "") -> KernelFn:
    key = (domain, op_type)
    if key in _KERNELS:
        raise ValueError(f"reference kernel {op_type!r} (domain {domain!r}) is registered twice")
    _KERNELS[key] = fn
    return fn


def get_kernel(op_type: str, domain: str = "") -> KernelFn:
    """The reference kernel of an op; KeyError naming it if there is none."""
    try:
        return _KERNELS[(domain, op_type)]
    except KeyError:
        where = f" in domain {domain!r}" if domain else ""
        raise KeyError(f"no reference kernel for op {op_type!r}{where}") from None


def has_kernel(op_type: str, domain: str = "") -> bool:
    return (domain, op_type) in _KERNELS


def kernel_names() -> list[tuple[str, str]]:
    return sorted(_KERNELS)
