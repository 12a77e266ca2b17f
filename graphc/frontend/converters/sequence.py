"""Converters of sequence ops: every one was introduced in opset 11 and has kept its form since
(SplitToSequence-24 only widened its types)."""

from __future__ import annotations

from graphc.frontend.registry import passthrough

passthrough(
    "SplitToSequence",
    "SequenceAt",
    "SequenceConstruct",
    "SequenceEmpty",
    "SequenceInsert",
    "SequenceErase",
    "SequenceLength",
    "ConcatFromSequence",
    since=11,
)
