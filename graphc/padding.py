"""May a dynamic dim be padded? The batch-independence analysis behind shape buckets.

An engine with a profile holds a few static plans ("buckets"); a request smaller than its bucket
along a dim is padded up to it and the outputs are sliced back. That is only correct when no op
mixes the padded rows into the real ones along that dim: a Conv over the batch is fine, a Softmax
over a sequence of keys is not (the padded keys get attention weight), nor is a BatchNorm in
training form, a reduction over the batch, or a Reshape that interleaves the batch with another dim.

The analysis binds the graph twice, at two sizes of the one dim (every other dim fixed), folds the
exporters' shape arithmetic into constants, and walks the nodes of both in step. Every value gets
a state: independent of the dim (None), `Dyn(axis, mult)` (the dim lives on one axis of size
mult*N, and the rows of a prefix of it depend only on the same prefix of the inputs), or `Taint`
(its content depends on N in any other way). Ops are known by rule, never by guess: an op without
a rule that sees a Dyn input taints its results. The dim is paddable when every graph output is
None or Dyn; the Dyn ones are what the runtime slices back. Conservative by construction: a false
"not paddable" costs compile time (exact-size plans), a false "paddable" would cost correctness.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from graphc.ir.graph import Graph, Node

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Dyn:
    axis: int
    mult: int


@dataclass(frozen=True)
class Taint:
    reason: str


State = Dyn | Taint | None


@dataclass
class PadVerdict:
    """paddable, and if so where each output carries the dim (public name -> (axis, mult));
    outputs independent of the dim are absent. `reason` says why not (one line)."""

    paddable: bool
    reason: str = ""
    outputs: dict[str, tuple[int, int]] = field(default_factory=dict)


# Inputs that only give a shape, axes or sizes: their content may follow the dim (a folded
# Shape -> Concat), because the rule then checks the shapes that result, not the content.
_SHAPE_INPUTS: dict[str, frozenset[int]] = {
    "Reshape": frozenset({1}),
    "Expand": frozenset({1}),
    "ConstantOfShape": frozenset({0}),
    "Range": frozenset({1}),
    "Slice": frozenset({1, 2}),
    "Squeeze": frozenset({1}),
    "Unsqueeze": frozenset({1}),
    "Tile": frozenset({1}),
    "Resize": frozenset({1, 2, 3}),
    "Upsample": frozenset({1}),
    "Split": frozenset({1}),
    "Pad": frozenset({1}),
}
# Ops that keep samples apart along axis 0 only (a window or a per-sample statistic over the rest).
_AXIS0_ONLY = frozenset(
    {
        "Conv",
        "ConvTranspose",
        "ConvInteger",
        "MaxPool",
        "AveragePool",
        "LpPool",
        "GlobalAveragePool",
        "GlobalMaxPool",
        "GlobalLpPool",
        "InstanceNormalization",
        "GroupNormalization",
        "LRN",
        "Resize",
        "Upsample",
        "DepthToSpace",
        "SpaceToDepth",
        "BatchNormalization",
    }
)
_LAYOUT = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze"})
_PASS = frozenset({"Identity", "Dropout", "Cast", "CastLike"})


def _shape(v) -> tuple[int, ...]:
    return tuple(int(d) for d in v.type.shape)


def _from_shapes(s1: Sequence[int], s2: Sequence[int], n1: int, n2: int, what: str) -> State:
    if len(s1) != len(s2):
        return Taint(f"{what} changes rank with the dim")
    diff = [i for i, (a, b) in enumerate(zip(s1, s2, strict=True)) if a != b]
    if not diff:
        return None
    if len(diff) > 1:
        return Taint(f"{what} holds the dim on {len(diff)} axes")
    ax = diff[0]
    mult, rem = divmod(s2[ax] - s1[ax], n2 - n1)
    if rem or mult < 1 or s1[ax] != mult * n1:
        return Taint(f"{what} has a size along the dim that is not a multiple of it ({s1[ax]} at {n1})")
    return Dyn(ax, mult)


def analyse_padding(g1: Graph, g2: Graph, n1: int, n2: int, label: str) -> PadVerdict:
    """Whether dim `label` (bound to n1 in g1 and n2 > n1 in g2, all else equal) may be padded."""
    if [(n.op, n.name) for n in g1.nodes] != [(n.op, n.name) for n in g2.nodes]:
        return PadVerdict(False, f"the graph's structure changes with {label}")
    states: dict[str, State] = {}
    for a, b in zip(g1.inputs, g2.inputs, strict=True):
        states[a.name] = _from_shapes(_shape(a), _shape(b), n1, n2, f"input '{a.name}'")
    if set(g1.constants) != set(g2.constants):
        return PadVerdict(False, f"the graph's constants change with {label}")
    for name, c1 in g1.constants.items():
        states[name] = _constant_state(name, c1.data, g2.constants[name].data, n1, n2, label)
    consts = {k: c.data for k, c in g1.constants.items()}
    consts2 = {k: c.data for k, c in g2.constants.items()}
    for nd1, nd2 in zip(g1.nodes, g2.nodes, strict=True):
        _visit(nd1, nd2, states, (consts, consts2), n1, n2, label, g1.opset)
    verdict = PadVerdict(True)
    for public, v in zip(g1.output_names, g1.outputs, strict=True):
        s = states.get(v.name)
        if isinstance(s, Taint):
            return PadVerdict(False, s.reason)
        if isinstance(s, Dyn):
            verdict.outputs[public] = (s.axis, s.mult)
    return verdict


def _constant_state(name: str, d1: np.ndarray, d2: np.ndarray, n1: int, n2: int, label: str) -> State:
    if d1.shape == d2.shape and d1.dtype == d2.dtype and np.array_equal(d1, d2):
        return None
    s = _from_shapes(d1.shape, d2.shape, n1, n2, f"constant '{name}'")
    if isinstance(s, Dyn):
        # A folded constant along the dim (position ids 0..N-1) is a Dyn value when the smaller
        # one is the prefix of the larger: the rows of a prefix do not depend on N.
        prefix = np.take(d2, np.arange(d1.shape[s.axis]), axis=s.axis)
        if prefix.dtype == d1.dtype and np.array_equal(prefix, d1):
            return s
    return Taint(f"constant '{name}' (computed from the shapes) depends on {label}")


def _visit(
    nd1: Node, nd2: Node, states: dict[str, State], both: tuple, n1: int, n2: int, label: str, opset: int
) -> None:
    """`both`: the constants of the graph at n1 and at n2 (name -> array)."""
    consts = both[0]
    ins: list[State] = [None if v is None else states.get(v.name) for v in nd1.inputs]
    outs = [
        _from_shapes(_shape(o1), _shape(o2), n1, n2, f"{nd1.op} '{nd1.name}'")
        for o1, o2 in zip(nd1.outputs, nd2.outputs, strict=True)
    ]
    shape_ins = _SHAPE_INPUTS.get(nd1.op, frozenset())
    tainted = [s for i, s in enumerate(ins) if isinstance(s, Taint) and i not in shape_ins]
    if tainted:
        for o in nd1.outputs:
            states[o.name] = tainted[0]
        return
    data = [s if not isinstance(s, Taint) else None for s in ins]
    if all(s is None for i, s in enumerate(ins) if i not in shape_ins) and not any(isinstance(s, Taint) for s in ins):
        # nothing about this node follows the dim (its outputs' shapes confirm it)
        for o, s in zip(nd1.outputs, outs, strict=True):
            states[o.name] = s
        return
    where = f"{nd1.op} '{nd1.name}'"
    reason = _rule(nd1, data, outs, consts, opset, where, label)
    if reason is not None and nd1.op in ("Gather", "GatherND") and _row_local_gather(nd1, data, outs, both, (n1, n2)):
        reason = None
    has_dyn = any(isinstance(s, Dyn) for s in data)
    for o, s in zip(nd1.outputs, outs, strict=True):
        if reason is not None:
            states[o.name] = Taint(reason)
        elif s is None and has_dyn:
            states[o.name] = Taint(f"{where} does not keep {label} as an axis of its result")
        else:
            states[o.name] = s


def _norm(axis: int, rank: int) -> int:
    return axis + rank if axis < 0 else axis


def _rank(node: Node, i: int) -> int:
    v = node.input(i)
    return 0 if v is None else len(v.type.shape)


def _const_ints(node: Node, i: int, consts) -> list[int] | None:
    v = node.input(i)
    if v is None or v.name not in consts:
        return None
    return [int(x) for x in np.asarray(consts[v.name]).reshape(-1)]


def _rule(node: Node, ins: list[State], outs: list[State], consts, opset: int, where: str, label: str) -> str | None:
    """None when the op keeps the rows of the dim apart (and its results carry the dim where
    expected), else why not."""
    from graphc.passes.op_traits import is_pointwise

    op = node.op
    out = outs[0] if outs else None
    if isinstance(out, Taint):
        return out.reason
    dyn = [(i, s) for i, s in enumerate(ins) if isinstance(s, Dyn)]
    rank_out = len(node.outputs[0].type.shape) if node.outputs else 0

    def aligned() -> str | None:
        # broadcasting aligns axes from the right; every Dyn input must land on the output's axis
        for i, s in dyn:
            if not isinstance(out, Dyn) or rank_out - _rank(node, i) + s.axis != out.axis or s.mult != out.mult:
                return f"{where} broadcasts {label} onto another axis"
        return None

    if node.domain == "" and (is_pointwise(op) or op in _PASS or op == "Where"):
        if op == "Dropout" and node.input(2) is not None:
            return f"{where} has a training_mode input"
        return aligned()
    if op in _AXIS0_ONLY:
        if op == "BatchNormalization" and int(getattr(node.attrs, "training_mode", 0) or 0):
            return f"{where} is in training form (batch statistics)"
        if any(i != 0 for i, _ in dyn) or not dyn or dyn[0][1].axis != 0:
            return f"{where} mixes values along {label} (only a batch axis 0 is kept apart)"
        if not isinstance(out, Dyn) or out.axis != 0 or out.mult != dyn[0][1].mult:
            return f"{where} does not keep {label} on axis 0"
        return None
    if op in ("MatMul", "MatMulInteger"):
        ra, rb = _rank(node, 0), _rank(node, 1)
        for i, s in dyn:
            if i > 1:
                continue
            r = ra if i == 0 else rb
            contracted = (r - 1 if i == 0 else max(r - 2, 0)) if r >= 1 else 0
            if s.axis == contracted:
                return f"{where} sums over {label}"
            if i == 0:
                want = rank_out - 2 if s.axis == r - 2 and r >= 2 else rank_out - r + s.axis
            else:
                want = rank_out - 1 if s.axis == r - 1 and r >= 2 else rank_out - r + s.axis
            if not isinstance(out, Dyn) or out.axis != want:
                return f"{where} moves {label} across the product"
        return None
    if op == "Gemm":
        ta, tb = int(node.attrs.transA), int(node.attrs.transB)
        for i, s in dyn:
            if i == 0:
                k, want = (1, 0) if ta == 0 else (0, 0)
            elif i == 1:
                k, want = (0, 1) if tb == 0 else (1, 1)
            else:
                want, k = rank_out - _rank(node, 2) + s.axis, -1
            if s.axis == k:
                return f"{where} sums over {label}"
            if not isinstance(out, Dyn) or out.axis != want:
                return f"{where} moves {label} across the product"
        return None
    if op == "Transpose":
        if not dyn:
            return None
        perm = list(node.attrs.perm) if node.attrs.perm else list(reversed(range(_rank(node, 0))))
        if not isinstance(out, Dyn) or perm.index(dyn[0][1].axis) != out.axis:
            return f"{where} moves {label} to another axis than its result shows"
        return None
    if op in _LAYOUT:
        return _layout_rule(node, ins, out, where, label)
    if op in ("Expand", "Tile"):
        s = ins[0]
        if isinstance(s, Dyn):
            if op == "Tile":
                return f"{where} repeats along {label}"
            return aligned()
        return None  # a constant broadcast along the dim: every row the same
    if op in ("ConstantOfShape",):
        return None
    if op == "Range":
        if isinstance(ins[0], Dyn) or isinstance(ins[2], Dyn) or not isinstance(out, Dyn):
            return f"{where} starts or steps with {label}"
        return None
    if op == "Concat":
        axis = _norm(int(node.attrs.axis), rank_out)
        if isinstance(out, Dyn) and out.axis == axis:
            return f"{where} concatenates along {label}"
        return aligned()
    if op == "Split":
        axis = _norm(int(node.attrs.axis), rank_out)
        if dyn and dyn[0][1].axis == axis:
            return f"{where} splits along {label}"
        return None
    if op == "Slice":
        s = ins[0]
        if not isinstance(s, Dyn):
            return f"{where} slices a value along {label}"
        axes = _const_ints(node, 3, consts)
        if node.input(3) is None:
            starts = _const_ints(node, 1, consts)
            axes = list(range(len(starts))) if starts is not None else None
        if axes is None:
            return f"{where} has axes that are not constants"
        if s.axis in {_norm(a, _rank(node, 0)) for a in axes}:
            return f"{where} slices along {label}"
        return aligned()
    if op == "Gather":
        axis = _norm(int(node.attrs.axis), _rank(node, 0))
        d, idx = ins[0], ins[1]
        if isinstance(d, Dyn) and isinstance(idx, Dyn):
            return f"{where} takes {label} from both its data and its indices"
        if isinstance(d, Dyn):
            if d.axis == axis:
                return f"{where} gathers along {label}"
            want = d.axis if d.axis < axis else d.axis - 1 + _rank(node, 1)
        elif isinstance(idx, Dyn):
            want = axis + idx.axis
        else:
            return None
        if not isinstance(out, Dyn) or out.axis != want:
            return f"{where} moves {label}"
        return None
    reduced = _reduced_axes(node, consts, opset)
    if reduced is not None:
        s = ins[0]
        if any(i != 0 for i, _ in dyn):
            return f"{where} takes {label} on a parameter input"
        if isinstance(s, Dyn) and s.axis in reduced:
            return f"{where} reduces over {label}"
        return None
    if op == "Pad":
        return _pad_rule(node, ins, consts, where, label) or aligned()
    if op in ("Shape", "Size"):
        return f"{where} reads {label} into a value"
    return f"{where}: {op} has no padding rule here, so {label} is not padded through it"


def _row_local_gather(node: Node, ins: list[State], outs: list[State], both: tuple, ns: tuple[int, int]) -> bool:
    """A Gather (or GatherND) that indexes the dim's axis of its data with indices that are
    constants (folded from the shapes) keeping to their own row: index row r (along the indices'
    axis of the dim) only picks data rows r*m .. r*m + m - 1, m the data's multiple. Transformers'
    padding masks do this: the mask flattened and gathered at `b * seq + k` (TorchScript), or
    indexed at (b, k) (dynamo's GatherND); each sample still reads only its own mask, so the rows
    stay apart. Checked on the constants of both bindings."""
    d, idx, out = ins[0], ins[1], outs[0] if outs else None
    name = node.input(1).name if node.input(1) is not None else None
    if not (isinstance(d, Dyn) and isinstance(idx, Dyn) and isinstance(out, Dyn)) or any(name not in c for c in both):
        return False
    if node.op == "Gather":
        axis = _norm(int(node.attrs.axis), _rank(node, 0))
        if d.axis != axis or out.axis != axis + idx.axis or out.mult != idx.mult:
            return False
    else:  # GatherND: the last axis of the indices holds a tuple of indices into the leading data axes
        k = _shape(node.inputs[1])[-1]
        if int(node.attrs.batch_dims) != 0 or d.axis >= k or idx.axis == _rank(node, 1) - 1:
            return False
        if out.axis != idx.axis or out.mult != idx.mult:
            return False
    for consts, n in zip(both, ns, strict=True):
        ix = np.asarray(consts[name])
        if ix.dtype.kind not in "iu" or ix.shape[idx.axis] != idx.mult * n:
            return False
        if node.op == "GatherND":
            ix = ix[..., d.axis]
        ix = np.where(ix < 0, ix + d.mult * n, ix)  # negative indices count from the end
        rows = np.arange(ix.shape[idx.axis]) // idx.mult
        rows = rows.reshape([-1 if a == idx.axis else 1 for a in range(ix.ndim)])
        if not (np.all(ix >= rows * d.mult) and np.all(ix < (rows + 1) * d.mult)):
            return False
    return True


def _pad_rule(node: Node, ins: list[State], consts, where: str, label: str) -> str | None:
    """Pad keeps rows apart when it pads nothing on the dim's axis: a begin and an end pad that
    cancel (pads [1, -1], a shift) would keep the size and still move every row."""
    s = ins[0]
    if not isinstance(s, Dyn):
        return f"{where} pads a value along {label}"
    r = _rank(node, 0)
    pads = _const_ints(node, 1, consts) if node.input(1) is not None else list(getattr(node.attrs, "pads", ()) or ())
    if pads is None or not pads:
        return f"{where} has pads that are not constants"
    axes = _const_ints(node, 3, consts) if node.input(3) is not None else list(range(len(pads) // 2))
    if axes is None or len(pads) != 2 * len(axes):
        return f"{where} has axes that are not constants"
    for k, a in enumerate(axes):
        if _norm(a, r) == s.axis and (pads[k] or pads[k + len(axes)]):
            return f"{where} pads along {label}"
    return None


def _reduced_axes(node: Node, consts, opset: int) -> set[int] | None:
    """The axes a normalization or reduction combines values over, or None when the op is not one."""
    from graphc.passes.op_traits import is_axes_reduction

    op, r = node.op, _rank(node, 0)
    attrs = node.attrs
    if op in ("LayerNormalization", "RMSNormalization"):
        return set(range(_norm(int(attrs.axis), r), r))
    if op in ("Softmax", "LogSoftmax", "Hardmax"):
        axis = _norm(int(attrs.axis), r)
        return {axis} if opset >= 13 else set(range(axis, r))
    if op in ("ArgMax", "ArgMin", "LpNormalization", "CumSum", "TopK"):
        if op == "CumSum":
            ax = _const_ints(node, 1, consts)
            return {_norm(ax[0], r)} if ax else set(range(r))
        return {_norm(int(attrs.axis), r)}
    if node.domain == "" and is_axes_reduction(node):
        axes = list(getattr(attrs, "axes", None) or [])
        if not axes and node.input(1) is not None:
            got = _const_ints(node, 1, consts)
            if got is None:
                return set(range(r))  # axes unknown here: assume every axis
            axes = got
        if not axes:
            return set() if int(getattr(attrs, "noop_with_empty_axes", 0) or 0) else set(range(r))
        return {_norm(a, r) for a in axes}
    return None


def _layout_rule(node: Node, ins: list[State], out: State, where: str, label: str) -> str | None:
    """A reshape keeps rows apart when the elements before the dim's axis are the same number in
    and out (so each prefix row of the flattened data maps onto a prefix of the result's axis)."""
    s = ins[0]
    if not isinstance(s, Dyn):
        return None if out is None else f"{where} makes {label} from a shape"
    if not isinstance(out, Dyn):
        return f"{where} folds {label} into another axis"
    before_in = math.prod(_shape(node.inputs[0])[: s.axis])
    before_out = math.prod(_shape(node.outputs[0])[: out.axis])
    if before_in != before_out:
        return f"{where} interleaves {label} with another axis"
    return None


__all__ = ["Dyn", "PadVerdict", "Taint", "analyse_padding"]
