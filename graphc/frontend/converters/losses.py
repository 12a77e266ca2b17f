"""Converters of loss ops.

SoftmaxCrossEntropyLoss-13 only added bfloat16 to -12; NegativeLogLikelihoodLoss-13 and -22 only
widened the types of -12 (22 added bfloat16). Attributes and semantics are unchanged since 12,
the first version of both, so every version is the IR op as it stands.
"""

from __future__ import annotations

from graphc.frontend.registry import passthrough

passthrough("SoftmaxCrossEntropyLoss", "NegativeLogLikelihoodLoss", since=12)
