"""Helpers shared by the pattern fusion passes (fuse_layernorm, fuse_gelu, fuse_attention).

- Constant tests with a tolerance fit for the constant's dtype (exporters write sqrt(2) or
  0.044715 rounded to float32, float16 or bfloat16).
- `closed_interior`: the check that a match's interior values feed only the match, for patterns
  that mark a node `shared` because the pattern itself reads it twice (LayerNorm's x - mean).
- `relaxed`: a pattern's copy with every node shared, to tell near misses (a pattern that is
  there but whose interior someone else reads) from no pattern at all.
- `apply_until_stable`: a pass-local fixed point over rules that build on each other's results
  (a normalization node built by one rule absorbs its scale and bias in the next rounds).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import numpy as np

from graphc.ir.graph import Graph, Node, Value
from graphc.ir.types import DType, TensorType
from graphc.passes.fuse_common import same_shape
from graphc.passes.report import add_near_miss
from graphc.passes.rewrite import Const, Match, Op, Pattern, Rule, Var, apply_rules, match

# Relative tolerance for irrational constants (sqrt(2), sqrt(2/pi), 0.044715) in float32 or
# wider; narrower dtypes get their own rounding error (machine epsilon) instead.
CONST_RTOL = 1e-4


def is_float_data(data: np.ndarray) -> bool:
    """Whether `data` holds floats: numpy's (kind "f") or ml_dtypes' bfloat16 and float8 types,
    which numpy files under kind "V" (a model exported in bf16 has its scales and mask fills
    there, and a test of kind "f" alone would silently skip its fusions)."""
    if data.dtype.kind == "f":
        return True
    if data.dtype.kind != "V":
        return False
    try:
        return DType.from_numpy(data.dtype).is_float
    except (KeyError, TypeError, ValueError):
        return False


def scalar(data: np.ndarray) -> float | None:
    """The value of a one-element float or integer constant, else None."""
    if data.dtype == object or data.size != 1 or not (data.dtype.kind in "iu" or is_float_data(data)):
        return None
    return float(np.asarray(data, dtype=np.float64).reshape(()))


def const_tol(data: np.ndarray) -> float:
    try:
        eps = float(np.finfo(data.dtype).eps)
    except ValueError:  # integer constants are exact
        eps = 0.0
    return max(CONST_RTOL, eps)


def is_scalar(value: float, *, approx: bool = False) -> Callable[[np.ndarray], bool]:
    """A Const predicate: a one-element constant equal to `value` (exactly, or within the
    dtype-aware relative tolerance with `approx`)."""

    def pred(data: np.ndarray) -> bool:
        s = scalar(data)
        if s is None:
            return False
        if not approx:
            return s == value
        return abs(s - value) <= const_tol(data) * abs(value)

    return pred


def is_float(v: Value) -> bool:
    return isinstance(v.type, TensorType) and v.type.dtype.is_float


def closed_interior(m: Match) -> str | None:
    """None when every value a non-root matched node makes is read only by matched nodes and is
    no graph output; else a message naming the first outside reader."""
    inside = {id(n) for n in m.matched}
    g = m.graph
    for n in m.matched:
        if n is m.root:
            continue
        for o in n.outputs:
            if g.is_output(o.name):
                return f"'{o.name}' (made by {n.op} '{n.name}') is a graph output"
            for u in g.users(o.name):
                if id(u) not in inside:
                    return f"'{o.name}' (made by {n.op} '{n.name}') is also used by {u.op} '{u.name}'"
    return None


def relaxed(p: Pattern) -> Pattern:
    """`p` with every Op shared: it matches whether or not outside nodes read the interior."""
    if isinstance(p, Op):
        return Op(
            p.ops,
            *(relaxed(i) for i in p.inputs),
            name=p.name,
            pred=p.pred,
            shared=True,
            output=p.output,
            any_inputs=p.any_inputs,
            domain=p.domain,
        )
    return p


def apply_until_stable(graph: Graph, rules: Sequence[Rule], *, max_rounds: int = 8) -> Graph:
    """apply_rules repeatedly until nothing fires; returns `graph` itself when nothing did."""
    g = graph
    for _ in range(max_rounds):
        new = apply_rules(g, rules)
        if new is g:
            break
        g = new
    return g


def near_misses(graph: Graph, rules: Iterable[Rule], what: str) -> list[str]:
    """Messages for places where a rule's pattern is there but its interior is read elsewhere.

    Each rule is tried in its relaxed form at every node of its root op; a match that passes the
    rule's predicate (apart from the interior check) but not the strict match is a near miss.
    """
    by_op: dict[tuple[str, str], list[tuple[Rule, Pattern]]] = {}
    for rule in rules:
        for op in rule.pattern.ops:
            by_op.setdefault((rule.pattern.domain, op), []).append((rule, _relaxed_cached(rule.pattern)))
    out: list[str] = []
    seen: set[str] = set()
    for node in graph.nodes:
        if node.name in seen:
            continue
        for rule, pattern in by_op.get((node.domain, node.op), ()):
            m = match(graph, pattern, node)
            if m is None or (rule.predicate is not None and not _predicate_ignoring_interior(rule, m)):
                continue
            why = closed_interior(m)
            if why is None:
                continue  # the strict rule declined for another reason (e.g. a builder check)
            out.append(f"{what} ending at {node.op} '{node.name}' not fused: {why}")
            seen.update(n.name for n in m.matched)
            break
    return out


_RELAXED: dict[int, tuple[Pattern, Pattern]] = {}


def _relaxed_cached(p: Op) -> Pattern:
    hit = _RELAXED.get(id(p))
    if hit is None or hit[0] is not p:
        hit = _RELAXED[id(p)] = (p, relaxed(p))
    return hit[1]


def _predicate_ignoring_interior(rule: Rule, m: Match) -> bool:
    pred = getattr(rule.predicate, "without_interior", rule.predicate)
    return bool(pred(m))


def with_interior_check(pred: Callable[[Match], bool] | None) -> Callable[[Match], bool]:
    """A rule predicate: `pred` and the closed-interior check (for patterns with shared nodes).
    The bare `pred` stays reachable for the near-miss search."""

    def full(m: Match) -> bool:
        return (pred is None or pred(m)) and closed_interior(m) is None

    full.without_interior = pred if pred is not None else (lambda m: True)  # type: ignore[attr-defined]
    return full


def record_near_misses(graph: Graph, messages: Sequence[str]) -> Graph:
    """`graph` with `messages` added to meta["near_misses"]; the same object if none is new."""
    old = list(graph.meta.get("near_misses", ()))
    new = [msg for msg in messages if msg not in old]
    if not new:
        return graph
    meta = dict(graph.meta)
    for msg in new:
        add_near_miss(meta, msg)
    return graph.with_nodes(graph.nodes, meta=meta)


def producer_op(graph: Graph, v: Value | None, *ops: str) -> Node | None:
    """The ONNX-domain node of one of `ops` that makes `v`, or None."""
    if v is None:
        return None
    n = graph.producer(v.name)
    if n is None or n.domain or n.op not in ops:
        return None
    return n


def is_onnx(node: Node | None, *ops: str) -> bool:
    """Whether `node` is an ONNX-domain node of one of `ops`."""
    return node is not None and not node.domain and node.op in ops


def static_dims(v: Value | None) -> tuple[int, ...] | None:
    """The shape of `v` where every dim is a known int, else None."""
    if v is None:
        return None
    s = v.ttype.shape
    if s is None or not all(isinstance(d, int) for d in s):
        return None
    return tuple(s)


__all__ = [
    "CONST_RTOL",
    "Const",
    "Op",
    "Var",
    "apply_until_stable",
    "closed_interior",
    "const_tol",
    "is_float",
    "is_onnx",
    "is_scalar",
    "near_misses",
    "producer_op",
    "record_near_misses",
    "relaxed",
    "same_shape",
    "scalar",
    "static_dims",
    "with_interior_check",
]
