"""Optional, OptionalHasElement and OptionalGetElement on run-time optionals: None is the empty optional, a
numpy array or a list (a sequence) a present one."""

from __future__ import annotations

import numpy as np

from graphc.runtime.reference.registry import register_kernel


def optional(ins: list, attrs, n: int) -> list:
    """Its input (a present optional), or None (the empty optional of the type attribute)."""
    return [ins[0] if ins else None]


def has_element(ins: list, attrs, n: int) -> list[np.ndarray]:
    """False without an input (or an empty name) and for the empty optional; True otherwise."""
    return [np.array(bool(ins) and ins[0] is not None)]


def get_element(ins: list, attrs, n: int) -> list:
    if not ins or ins[0] is None:
        raise ValueError("the optional is empty: it has no element to get")
    return [ins[0]]


register_kernel("Optional", optional, domain="graphc")
register_kernel("OptionalHasElement", has_element)
register_kernel("OptionalGetElement", get_element)
