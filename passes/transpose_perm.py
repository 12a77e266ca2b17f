"""Permutation algebra for transpose elimination.

Conventions (ONNX's): `Transpose(x, p)` has `out.shape[i] == x.shape[p[i]]`, so
`Transpose(Transpose(x, p), q) == Transpose(x, compose(p, q))` with `compose(p, q)[i] == p[q[i]]`.
"""

from __future__ import annotations

from collections.abc import Sequence

from graphc.ir.graph import Node
from graphc.ir.types import Dim, TensorType

Perm = tuple[int, ...]


def perm_of(node: Node) -> Perm | None:
    """The perm of a Transpose node; the spec's default (reverse the axes) when the attribute is
    absent and the input's rank is known, else None."""
    if node.attrs.perm is not None:
        return tuple(int(i) for i in node.attrs.perm)
    t = node.inputs[0].type
    if not isinstance(t, TensorType) or t.shape is None:
        return None
    return tuple(range(len(t.shape) - 1, -1, -1))


def compose(p: Perm, q: Perm) -> Perm:
    """The one perm that Transpose(Transpose(x, p), q) applies."""
    return tuple(p[i] for i in q)


def inverse(p: Perm) -> Perm:
    inv = [0] * len(p)
    for i, j in enumerate(p):
        inv[j] = i
    return tuple(inv)


def is_identity(p: Sequence[int]) -> bool:
    return tuple(p) == tuple(range(len(p)))


def is_last_two_swap(p: Sequence[int]) -> bool:
    """p swaps the last two axes and keeps the others in place (what a matmul flag does)."""
    n = len(p)
    return n >= 2 and tuple(p) == (*range(n - 2), n - 1, n - 2)


def permute(shape: Sequence[Dim], p: Perm) -> tuple[Dim, ...]:
    """The shape of Transpose(x, p) for x of `shape`."""
    return tuple(shape[i] for i in p)


def unpermute(shape: Sequence[Dim], p: Perm) -> tuple[Dim, ...]:
    """The shape of x such that Transpose(x, p) has `shape`."""
    return permute(shape, inverse(p))


def moves_only_unit_dims(p: Perm, in_shape: Sequence[Dim]) -> bool:
    """Transpose(x, p) of x with `in_shape` keeps the order of every dim that is not 1, so it moves
    no data: it is a Reshape. Symbolic or unknown dims count as not 1."""
    kept = [i for i in p if in_shape[i] != 1]
    return kept == sorted(kept)
