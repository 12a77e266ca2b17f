"""Estimated run time of a CUDA plan at each size of a padded dim, without a GPU: what the bucket
ladder of graphc/profiles.py is bounded by (docs/dynamic_shapes.md, "The ladder").

est(n) sums, over the plan's launches at size n, the cost the sm_90 kernel selection itself uses:
the TMA GEMM's and the implicit GEMM's wave models (codegen/families/conv_sm90.py `tma_cost`,
`igemm_cost`; gemm_sm90.py `tile_cost`) for their launches, the GEMM family's cost model
(gemm.estimate_seconds) for its other tiles, bytes moved for every other launch, and a fixed
latency per launch. Which kernel, tile and split each step gets at n is decided by the ordinary code
generation (generate_kernels, hopper=True): nothing here re-implements a selection rule.

Getting the plan at every n cheaply: the passes take 1-2 s for ResNet-50 (most of it casting and
folding weights, which do not depend on n), so they run twice, at two sizes of the dim; every tensor
of the two lowered plans must be the same but for one axis of size mult * n (what the padding
analysis, graphc/padding.py, proves of the unoptimized graph). The plan at any other n is that plan
with those axes rescaled (tensor specs, the IR values code generation reads, and weights of
n-dependent shapes), and its kernels are generated from it (about 0.2 s for ResNet-50; no NVRTC).
Where the two plans differ otherwise the estimate is refused with the reason (the caller keeps the
rows ladder and logs it).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from graphc.errors import CompileError, GraphcError

log = logging.getLogger(__name__)

# Two constants turn the cost models' units into H200 seconds, fitted (relative least squares, then
# rounded) to the static engines of docs/results/h200_profiles_2026-12-01_1729.md (ResNet-50 and
# BERT-base at batch 1, 8, 12, 20, 22, 32): a fixed cost per launch of a CUDA-graph replay (launch,
# pipeline fill and drain), and the rate the tile models' MACs run at. The codegen models rank tiles
# at 700 TFLOP/s (gemm._RATE, where only ratios matter); whole models run their GEMMs and convs
# nearer 400. With these est (of the zoo models) is within -18..+24% of every measured time (of the
# torch exports), and its ratio between neighbouring measured batches from 8 up within -0.11..+0.07
# of the measured ratio but at BERT-base's 8 -> 12 (1.45 against 1.08: its batch-8 GEMMs ran slower
# than modelled); from 1 to 8 ResNet-50's is 0.33 low (1.45 against 1.78), see profiles.TIME_LIMIT.
LAUNCH_S = 2.0e-6
TILE_FLOPS = 400e12

# A ladder estimate generates the kernels at every size of the range (about 0.25 s each for ResNet-50
# on a 2-core machine): a wider range keeps the rows ladder (logged) rather than take minutes.
MAX_SIZES = 128

# The sm_90 archs whose kernel selection the estimate follows (codegen/build.py HOPPER_ARCHS).
HOPPER = "sm_90"


@dataclass(frozen=True)
class Axis:
    """A tensor axis of size mult * n."""

    axis: int
    mult: int


def why_no_estimate(opts: Any) -> str | None:
    """Why a compile with `opts` gets no time estimate (then its ladder bounds rows), or None."""
    if opts.target != "cuda":
        return f"target {opts.target} (the estimate follows the sm_90 kernel selection)"
    from graphc.codegen.build import engine_archs

    archs = engine_archs(opts)
    if HOPPER not in archs:
        return f"no sm_90 plan (archs {', '.join(archs)})"
    if opts.tune != "off":
        log.info("the bucket estimate follows the untuned kernel selection (tune=%s)", opts.tune)
    return None


def lowered(graph: Any, shapes: Mapping[str, Sequence[int]], opts: Any) -> tuple[Any, dict[str, np.ndarray]]:
    """The lowered plan and weights of `graph` at `shapes`, through the compile's own passes."""
    from graphc.codegen.lower import lower_to_plan
    from graphc.compiler import pass_target
    from graphc.ir.shapes import bind_shapes
    from graphc.passes.manager import OptimizeOptions, optimize

    bound = bind_shapes(graph, {k: tuple(v) for k, v in shapes.items()})
    if any(n.op in ("If", "Loop", "Scan") and n.domain == "" for n in bound.nodes):
        raise CompileError("the graph has control flow (its branches are planned apart)")
    result = optimize(bound, OptimizeOptions(opt_level=opts.opt_level, target=pass_target(opts)))
    plan = lower_to_plan(result.graph)
    return plan, {name: c.data for name, c in result.graph.constants.items()}


def scaled_axes(plan_a: Any, plan_b: Any, na: int, nb: int) -> dict[str, Axis]:
    """Each tensor's axis of size mult * n, from the plans at sizes na < nb; a CompileError naming
    the first step or tensor where the two plans are not the same plan at two sizes."""
    steps_a = [(s.name, s.op, tuple(s.inputs), tuple(s.outputs)) for s in plan_a.steps]
    steps_b = [(s.name, s.op, tuple(s.inputs), tuple(s.outputs)) for s in plan_b.steps]
    if steps_a != steps_b:
        first = next((a for a, b in zip(steps_a, steps_b, strict=False) if a != b), None)
        raise CompileError(f"the passes make other steps at sizes {na} and {nb} (first: {first or 'the count'})")
    if set(plan_a.tensors) != set(plan_b.tensors):
        raise CompileError(f"the plans at sizes {na} and {nb} have other tensors")
    out: dict[str, Axis] = {}
    for name, tb in plan_b.tensors.items():
        sa, sb = plan_a.tensors[name].shape, tb.shape
        if len(sa) != len(sb):
            raise CompileError(f"tensor '{name}' has rank {len(sa)} at size {na} and {len(sb)} at {nb}")
        diff = [i for i, (x, y) in enumerate(zip(sa, sb, strict=True)) if x != y]
        if not diff:
            continue
        i = diff[0]
        if len(diff) > 1 or sb[i] % nb or sa[i] * nb != sb[i] * na:
            raise CompileError(f"tensor '{name}' is {sa} at size {na} and {sb} at {nb}: not one axis of mult * n")
        out[name] = Axis(i, sb[i] // nb)
    return out


def plan_at(plan: Any, weights: Mapping[str, np.ndarray], axes: Mapping[str, Axis], n: int) -> tuple[Any, dict]:
    """`plan` (and its weights) with every axis of `axes` at mult * n."""
    from graphc.ir.graph import Value

    def shape(name: str, old: Sequence[int]) -> list[int]:
        a = axes.get(name)
        if a is None:
            return list(old)
        s = list(old)
        s[a.axis] = a.mult * n
        return s

    tensors = {}
    for name, t in plan.tensors.items():
        if name in axes:
            s = shape(name, t.shape)
            t = dataclasses.replace(t, shape=s, nbytes=int(np.prod(s)) * np.dtype(t.dtype).itemsize)
        tensors[name] = t

    def value(v: Value | None) -> Value | None:
        if v is None or v.name not in axes:
            return v
        return Value(v.name, v.ttype.with_shape(tuple(shape(v.name, v.ttype.static_shape))))

    nodes = {
        k: dataclasses.replace(
            node, inputs=tuple(value(v) for v in node.inputs), outputs=tuple(value(v) for v in node.outputs)
        )
        for k, node in plan.nodes.items()
    }
    w = dict(weights)
    for name in weights:
        if name in axes:  # a folded shape constant of n-dependent shape: its values only matter to the kernel text
            w[name] = np.resize(np.asarray(weights[name]), shape(name, np.shape(weights[name])))
    return dataclasses.replace(plan, tensors=tensors, nodes=nodes), w


def plan_seconds(plan: Any, weights: Mapping[str, np.ndarray], opts: Any) -> float:
    """The estimated seconds of one replay of `plan` on sm_90 (see the module docstring)."""
    from graphc.codegen.build import generate_kernels
    from graphc.codegen.families.gemm_tactics import check_tactics, tactic_options

    # Steps alike in op, attrs and operand specs get the same kernels: each is generated once (a
    # transformer's twelve layers are one), the others counted.
    count: dict[tuple, int] = {}
    first: dict[tuple, Any] = {}
    for step in plan.steps:
        if step.alias:
            continue
        key = _signature(plan, step)
        count[key] = count.get(key, 0) + 1
        first.setdefault(key, step)
    unique = dataclasses.replace(plan, steps=list(first.values()))
    kernels = generate_kernels(
        unique, dict(weights), precision=opts.precision, allow_tf32=opts.allow_tf32, hopper=True,
        tactics=check_tactics(getattr(opts, "tactics", ())), tactic_options=tactic_options(opts),
    )  # fmt: skip
    total = 0.0
    for key, step in first.items():
        made = kernels.steps.get(step.name)
        if made is None:  # a data-dependent If's step: no launch of its own
            continue
        ctx = plan.context(step, weights, precision=opts.precision, allow_tf32=opts.allow_tf32)
        if made.vendor is not None:  # a cuBLASLt call: the GEMM's own roofline
            seconds = LAUNCH_S + _gemm_roofline(ctx)
        else:
            seconds = sum(LAUNCH_S + launch_seconds(ctx, ln) for ln in made.launches)
        total += seconds * count[key]
    return total


def _signature(plan: Any, step: Any) -> tuple:
    """What a step's kernels depend on: op, typed attrs, and each operand's spec (its shape, dtype,
    kind and view offset: alignment picks vector widths and TMA)."""
    node = plan.nodes.get(step.name)

    def spec(name: str | None) -> tuple:
        if name is None:
            return ()
        t = plan.tensors[name]
        return (tuple(t.shape), t.dtype, t.kind, t.alias_offset)

    return (
        step.op,
        step.domain,
        node.attrs if node is not None else step.name,
        tuple(spec(n) for n in step.inputs),
        tuple(spec(n) for n in step.outputs),
    )


def launch_seconds(ctx: Any, ln: Any) -> float:
    """One launch's estimated seconds, past its fixed latency."""
    from graphc.codegen.families import conv_sm90, gemm, gemm_sm90
    from graphc.codegen.families.gemm import SM_COUNT

    p = ln.params
    mac_s = TILE_FLOPS / 2 / SM_COUNT  # one SM's MACs a second
    if p.get("reduce"):
        return 0.0  # a split-K reduce: the tile models charge it with their split (round trip, launch)
    if ln.family == "conv" and p.get("variant") == "igemm":
        return conv_sm90.igemm_cost(p["M"], p["N"], p["K"], p["BN"], p["SPLITS"], bool(p.get("CLUSTER"))) / mac_s
    if p.get("path") == "tma":
        if ln.family == "conv":
            prob = conv_sm90.gemm_problem(ctx)
            assert not isinstance(prob, str), prob
            return conv_sm90.tma_cost(prob, p["BN"], p["SPLITS"]) / mac_s
        return gemm_sm90.tile_cost(gemm.problem_of(ctx), p["BN"], p["SPLITS"], p.get("BM", gemm_sm90.BM)) / mac_s
    if ln.family == "gemm" and p.get("path") in ("mma", "wgmma", "simt", "tf32") and "BM" in p:
        # its own model, at its own rate for ranking (gemm._RATE["wgmma"]): rescaled to TILE_FLOPS
        return gemm.estimate_seconds(gemm.problem_of(ctx), p) * gemm._RATE["wgmma"] / TILE_FLOPS
    if ln.family in ("gemm", "conv"):
        return max(_bytes_seconds(ctx), _gemm_roofline(ctx))
    return _bytes_seconds(ctx)


def _bytes_seconds(ctx: Any) -> float:
    from graphc.codegen.families.gemm import _BW

    names = {n for n in (*ctx.step.inputs, *ctx.step.outputs) if n is not None}
    return sum(ctx.tensors[n].nbytes for n in names) / _BW


def _gemm_roofline(ctx: Any) -> float:
    """A GEMM's or conv's MACs at the rate of the path its precision runs on (launches without a
    tile model: the conv family's own kernel, vendor calls)."""
    from graphc.codegen.families import gemm
    from graphc.codegen.families.conv import conv_step, geometry

    rate = gemm._RATE["mma" if ctx.precision in ("fp16", "bf16") else "tf32" if ctx.allow_tf32 else "simt"]
    try:
        cs = conv_step(ctx)
        if cs is not None:
            g = geometry(ctx, cs)
            macs = g.m * g.k * g.rsc // max(1, g.group)
        else:
            prob = gemm.problem_of(ctx)
            macs = prob.batch * prob.M * prob.N * prob.K
    except GraphcError:
        return 0.0
    return 2.0 * macs / rate


@dataclass
class Estimate:
    """est(n) in seconds for each n of a range, or why there is none."""

    seconds: dict[int, float]
    why_not: str | None = None


def estimate_sizes(graph: Any, shapes_at: Any, sizes: Sequence[int], opt: int, opts: Any, where: str = "") -> Estimate:
    """est(n) for every n of `sizes` (at least two, `opt` among them); `shapes_at(n)` gives the
    input shapes at n."""
    why = why_no_estimate(opts)
    if why is not None:
        return Estimate({}, why)
    if len(sizes) > MAX_SIZES:
        why = f"{len(sizes)} sizes, over the {MAX_SIZES} the estimate generates kernels for"
        log.info("%sno time estimate for the bucket ladder (rows bound it instead): %s", where, why)
        return Estimate({}, why)
    lo, hi = min(sizes), max(sizes)
    # The axes from two sizes away from the smallest (batch 1 is where the passes most often make
    # another plan: a Reshape of a batch of one folds away); the smallest gets its own plan.
    na = next((n for n in (opt, hi - 1) if lo < n < hi), lo)
    try:
        plan_a, _ = lowered(graph, shapes_at(na), opts)
        plan_b, weights = lowered(graph, shapes_at(hi), opts)
        axes = scaled_axes(plan_a, plan_b, na, hi)
        own = {hi: (plan_b, weights)}
        if na != lo:
            own[lo] = lowered(graph, shapes_at(lo), opts)
        out = {}
        for n in sizes:
            p, w = own[n] if n in own else plan_at(plan_b, weights, axes, n)
            out[n] = plan_seconds(p, w, opts)
    except GraphcError as e:
        log.warning("%sno time estimate for the bucket ladder (rows bound it instead): %s", where, e)
        return Estimate({}, str(e))
    return Estimate(out)


__all__ = ["LAUNCH_S", "Estimate", "estimate_sizes", "plan_at", "plan_seconds", "scaled_axes", "why_no_estimate"]
