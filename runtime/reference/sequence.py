"""Sequence ops: SplitToSequence, SequenceAt, SequenceConstruct, SequenceEmpty, SequenceInsert,
SequenceErase, SequenceLength, ConcatFromSequence.

At run time a sequence is a Python list of numpy arrays. Its type (SequenceType) holds one element
type that describes every element: a dim is an int only where all elements agree on it, and the
length is known where it follows from the graph (SequenceConstruct, inserts and erases on a known
length, splits of a static axis).

This module holds the numpy kernels (what the interpreter and a CPU engine run); type
inference and traits are in graphc.ops.sequence.
"""

from __future__ import annotations

import numpy as np

from graphc.runtime.dtypes import Dim
from graphc.runtime.reference.registry import register_kernel


def _at_compute(ins, attrs, n):
    seq, pos = ins
    return [seq[int(np.asarray(pos).reshape(-1)[0])]]


def _insert_compute(ins, attrs, n):
    seq, t = list(ins[0]), ins[1]
    if len(ins) > 2 and ins[2] is not None:
        pos = int(np.asarray(ins[2]).reshape(-1)[0])
        seq.insert(pos + len(seq) if pos < 0 else pos, t)
    else:
        seq.append(t)
    return [seq]


def _erase_compute(ins, attrs, n):
    seq = list(ins[0])
    pos = int(np.asarray(ins[1]).reshape(-1)[0]) if len(ins) > 1 and ins[1] is not None else -1
    del seq[pos]
    return [seq]


# ---- SplitToSequence, ConcatFromSequence -------------------------------------------------------


def _split_lengths(dim: Dim, split: np.ndarray | None) -> list[int] | None:
    """Part lengths along the axis: a scalar split gives chunks of that size (the last one
    smaller); a 1-D split lists them; no split gives parts of length 1."""
    if split is None:
        return None if not isinstance(dim, int) else [1] * dim
    split = np.asarray(split)
    if split.ndim == 0:
        if not isinstance(dim, int):
            return None
        size = int(split)
        if size <= 0:
            raise ValueError(f"split {size} must be positive")
        return [size] * (dim // size) + ([dim % size] if dim % size else [])
    return [int(v) for v in split]


def _split_to_seq_compute(ins, attrs, n):
    x = ins[0]
    axis = attrs.axis + x.ndim if attrs.axis < 0 else attrs.axis
    split = ins[1] if len(ins) > 1 else None
    lengths = _split_lengths(x.shape[axis], split)
    parts = np.split(x, np.cumsum(lengths)[:-1], axis=axis) if lengths else []
    if split is None and not attrs.keepdims:
        parts = [np.squeeze(p, axis=axis) for p in parts]
    return [parts]


def _concat_from_seq_compute(ins, attrs, n):
    seq = ins[0]
    if attrs.new_axis:
        return [np.stack(seq, axis=attrs.axis)]
    return [np.concatenate(seq, axis=attrs.axis)]


register_kernel("SequenceEmpty", lambda ins, a, n: [[]])
register_kernel("SequenceConstruct", lambda ins, a, n: [list(ins)])
register_kernel("SequenceAt", _at_compute)
register_kernel("SequenceLength", lambda ins, a, n: [np.array(len(ins[0]), dtype=np.int64)])
register_kernel("SequenceInsert", _insert_compute)
register_kernel("SequenceErase", _erase_compute)
register_kernel("SplitToSequence", _split_to_seq_compute)
register_kernel("ConcatFromSequence", _concat_from_seq_compute)
