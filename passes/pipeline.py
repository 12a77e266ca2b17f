"""The ordered list of passes (see passes/manager.py for the ordering rules)."""

from __future__ import annotations

from graphc.passes.constant_folding import fold_constants
from graphc.passes.cse import eliminate_common_subexpressions
from graphc.passes.dce import eliminate_dead_code
from graphc.passes.manager import FixedPoint, Pass, Stage
from graphc.passes.simplify import simplify


def cleanup() -> FixedPoint:
    return FixedPoint(
        "cleanup",
        (
            Pass("constant_folding", fold_constants),
            Pass("simplify", simplify),
            Pass("cse", eliminate_common_subexpressions),
            Pass("dce", eliminate_dead_code),
        ),
    )


def stages() -> list[Stage]:
    return [cleanup()]
