"""The reduction family renders and compiles (NVRTC, sm_80 and sm_90) for representative variants:
row and column layouts, vector and scalar loads, cached and long rows, every reducer, the
normalizations, and fused epilogues (their store hook must appear in the kernel). No GPU needed;
tests/codegen/test_reduction_gpu.py checks the numbers on one.
"""

from __future__ import annotations

import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from graphc.codegen.families.reduction import lin_expr, pow2ceil, reduce_view
from graphc.ir.builder import GraphBuilder
from graphc.ir.types import DType, TensorType
from graphc.ops.fused import ACC, IN, OP, EpilogueOp, FusedAttrs
from graphc.ops.registry import get_op
from helpers import make_node_model, rand

sys.path.insert(0, str(Path(__file__).parent))  # rd_helpers beside this file
from rd_helpers import compile_each, kernels_of  # noqa: E402

BF16 = ml_dtypes.bfloat16
F32, F16 = np.float32, np.float16


def _model(op, x, attrs=None, inits=None, **kw):
    return make_node_model(op, {"x": x}, attrs, initializers=inits, **kw)


def _axes(*a):
    return {"axes": np.array(a, np.int64)}


# ---- planning (pure Python) ---------------------------------------------------------------------


def test_reduce_view_merges_and_drops_unit_dims():
    v = reduce_view((3, 1, 7, 10), [2, 3])
    assert (v.out, v.r, v.contiguous, v.column) == (3, 70, True, False)
    assert v.base == "o * 70ll" or v.base == "(o * 70ll)"
    v = reduce_view((7, 3, 33, 5), [1, 3])  # rows with gaps: element r at (r / 5) * 165 + r % 5
    assert (v.out, v.r, v.contiguous, v.column) == (231, 15, False, False)
    assert v.roff == "((r / 5ll) * 165ll + (r % 5ll))"
    v = reduce_view((1000, 7), [0])
    assert (v.out, v.r, v.column) == (7, 1000, True)
    v = reduce_view((4, 5), [])
    assert (v.out, v.r, v.column) == (20, 1, True)


def test_lin_expr():
    assert lin_expr("o", []) == "0ll"
    assert lin_expr("o", [(5, 3)]) == "(o * 3ll)"
    assert lin_expr("o", [(4, 100), (5, 1)]) == "((o / 5ll) * 100ll + (o % 5ll))"
    assert [pow2ceil(n) for n in (0, 1, 2, 3, 1000, 1024)] == [1, 1, 2, 4, 1024, 1024]


# ---- render + compile ---------------------------------------------------------------------------

_CASES = {
    # op, input, attrs, initializers, expected kernel params (subset)
    "sum-row-vec-f16": ("ReduceSum", rand((3, 7, 1000), F16), {"keepdims": 0}, _axes(2), {"vec": 8, "tpr": 16}),
    "mean-row-8193": ("ReduceMean", rand((300, 8193)), {}, _axes(1), {"vec": 1, "tpr": 1024}),
    "max-column-bf16": ("ReduceMax", rand((1000, 7), BF16), {}, _axes(0), {"tx": 8}),
    "lse-gaps": ("ReduceLogSumExp", rand((7, 3, 33, 5)), {}, _axes(1, 3), {"vec": 1}),
    "lse-column": ("ReduceLogSumExp", rand((7, 3, 33, 5)), {}, _axes(0, 2), {"tx": 16, "ty": 16}),
    "prod-i64": ("ReduceProd", rand((4, 9), np.int64), {}, _axes(1), {}),
    "l1-i32": ("ReduceL1", rand((4, 9, 3), np.int32), {}, _axes(1), {}),
    "l2-f16": ("ReduceL2", rand((4, 9), F16), {}, _axes(1), {}),
    "logsum-i64": ("ReduceLogSum", rand((4, 9), np.int64, low=1, high=9), {}, _axes(1), {}),
    "sumsq-all": ("ReduceSumSquare", rand((4, 9)), {"keepdims": 0}, {}, {}),
    "min-bool": ("ReduceMin", rand((4, 9), np.bool_), {}, _axes(0), {}),
    "sum-split": ("ReduceSum", rand((3, 300000)), {}, _axes(1), {"splits": 37}),
    "argmax-last": ("ArgMax", rand((3, 1000), F16), {"axis": 1, "select_last_index": 1}, {}, {"vec": 8}),
    "argmin-column": ("ArgMin", rand((300, 7), np.int32), {"axis": 0}, {}, {}),
    "gap": ("GlobalAveragePool", rand((2, 64, 7, 7), F16), {}, {}, {}),
    "gmp": ("GlobalMaxPool", rand((2, 3, 9, 9)), {}, {}, {}),
}


@pytest.mark.parametrize("case", list(_CASES))
def test_reduce_compiles(case):
    op, x, attrs, inits, expect = _CASES[case]
    ks = kernels_of(_model(op, x, attrs, inits), family="reduction")
    assert len(ks) == (2 if "splits" in expect else 1)
    for k, v in expect.items():
        assert ks[0].params[k] == v, (k, ks[0].params)
    compile_each(ks)


def test_split_reduce_uses_the_workspace():
    ks = kernels_of(_model("ReduceL2", rand((2, 100000), F16), {}, _axes(1)), family="reduction")
    part, final = ks
    assert part.args == ["x", "@workspace"] and final.args[0] == "@workspace"
    assert part.workspace_bytes == final.workspace_bytes == 2 * part.params["splits"] * 4
    assert "return x * x;" in part.source and "gc_sqrt(acc)" in final.source
    assert "return x * x;" not in final.source
    compile_each(ks, archs=("sm_80",))


_ROW_CASES = {
    "softmax-f16-1000": ("Softmax", rand((3, 1000), F16), {"axis": -1}, {}, {"vec": 8, "vstore": True, "items": 4}),
    "logsoftmax-8193": ("LogSoftmax", rand((3, 8193)), {"axis": -1}, {}, {"vec": 1, "tpr": 1024, "items": 9}),
    "softmax-long-bf16": ("Softmax", rand((2, 40000), BF16), {"axis": -1}, {}, {"items": 0}),
    "softmax-r7": ("Softmax", rand((50, 7)), {"axis": -1}, {}, {"tpr": 2}),
    "hardmax-row": ("Hardmax", rand((3, 1000)), {"axis": -1}, {}, {}),
    "softmax-axis0": ("Softmax", rand((5, 33, 7)), {"axis": 0}, {}, {"block": 128}),
    "hardmax-axis1": ("Hardmax", rand((5, 33, 7), F16), {"axis": 1}, {}, {}),
    "rms-bf16": ("RMSNormalization", rand((3, 3000), BF16), {"axis": -1}, {"s": rand((3000,), BF16)}, {"tpr": 128}),
    "bn-f16": (
        "BatchNormalization",
        rand((2, 6, 7, 9), F16),
        {},
        {k: rand((6,), F16, low=0.5) for k in ("s", "b", "m", "v")},
        {},
    ),
    "lpnorm-row": ("LpNormalization", rand((3, 1000), F16), {"axis": -1, "p": 1}, {}, {"tpr": 32}),
    "lpnorm-axis0": ("LpNormalization", rand((5, 33)), {"axis": 0, "p": 2}, {}, {"block": 128}),
    "instancenorm": ("InstanceNormalization", rand((2, 6, 7, 9)), {}, {"s": rand((6,)), "b": rand((6,))}, {}),
}


@pytest.mark.parametrize("case", list(_ROW_CASES))
def test_rowwise_compiles(case):
    op, x, attrs, inits, expect = _ROW_CASES[case]
    ks = kernels_of(_model(op, x, attrs, inits), family="reduction")
    assert len(ks) == 1
    for k, v in expect.items():
        assert ks[0].params[k] == v, (k, ks[0].params)
    compile_each(ks)


def test_layernorm_stats_outputs_and_forced_params():
    x = rand((3, 7, 1000), F16)
    m = _model(
        "LayerNormalization",
        x,
        {"axis": -1},
        {"s": rand((1000,), F16), "b": rand((1000,), F16)},
        outputs=("y", "m", "i"),
    )
    ks = kernels_of(m)
    assert ks[0].args == ["x", "s", "b", "y", "m", "i"]
    assert "st0[row] = " in ks[0].source and "st1[row] = " in ks[0].source
    compile_each(ks)
    ks = kernels_of(m, params={"tpr": 32})  # the tuner's choice: 1000 fp16 over 32 lanes
    assert ks[0].params["tpr"] == 32 and ks[0].grid == (6, 1, 1)
    compile_each(ks, archs=("sm_90",))


def test_layernorm_preloads_its_parameters():
    """Scale and bias spanning the row are read VEC-wide with it (registers g0, g1); a broadcast
    scale stays a scalar load; a forced "preload": 0 keeps the scalar loads."""
    x = rand((1024, 768), F16)
    m = _model("LayerNormalization", x, {"axis": -1}, {"s": rand((768,), F16), "b": rand((768,), F16)})
    (k,) = kernels_of(m)
    assert k.params["preload"] == 1 and k.params["vec"] == 8
    assert "* (g0[k][e])" in k.source and "y += g1[k][e];" in k.source
    compile_each([k], archs=("sm_90",))
    (k,) = kernels_of(m, params={"tpr": 32, "preload": 0})
    assert k.params["preload"] == 0 and "g0[k][e]" not in k.source
    one = _model("LayerNormalization", x, {"axis": -1}, {"s": rand((1,), F16), "b": rand((768,), F16)})
    (k,) = kernels_of(one)
    assert "g0[k][e]" not in k.source and "y += g0" not in k.source and "y += g1[k][e];" in k.source
    compile_each([k], archs=("sm_80",))


def test_groupnorm_channel_index():
    x = rand((2, 6, 7, 9))
    m = _model("GroupNormalization", x, {"num_groups": 3}, {"s": rand((6,)), "b": rand((6,))})
    from onnx import helper

    m.graph.output[0].CopyFrom(helper.make_tensor_value_info("y", 1, x.shape))
    (k,) = kernels_of(m)
    assert "((row % 3ll) * 2ll + r / 63ll)" in k.source
    compile_each([k], archs=("sm_80",))


def _fused(anchor, attrs, x, params, epilogue, outputs, extra):
    b = GraphBuilder("fused")
    ins = [b.add_input("x", TensorType(DType.from_numpy(x.dtype), x.shape))]
    ins += [b.add_constant(p, f"p{i}") for i, p in enumerate(params)]
    n_anchor = len(ins)
    ins += [b.add_input(f"e{k}", TensorType(DType.from_numpy(e.dtype), e.shape)) for k, e in enumerate(extra)]
    fa = FusedAttrs(
        anchor_op=anchor,
        anchor_attrs=get_op(anchor).attrs(**attrs),
        anchor_inputs=n_anchor,
        epilogue=tuple(EpilogueOp(op, get_op(op).attrs(), args) for op, args in epilogue),
        outputs=outputs,
    )
    node = b.add_node("Fused", ins, fa, domain="graphc", outputs=len(outputs))
    b.set_outputs(list(node.outputs))
    return b.build()


def test_fused_epilogues_in_store_hook():
    x, r = rand((5, 1000), F16), rand((5, 1000), F16)
    g = _fused(
        "LayerNormalization",
        {"axis": -1},
        x,
        [rand((1000,), F16), rand((1000,), F16)],
        [("Add", (ACC, IN(3))), ("Relu", (OP(0),))],
        (OP(1), ACC),
        [r],
    )
    (k,) = kernels_of(g, family="reduction")
    # The epilogue reads the residual and stores both outputs; the vector store path carries it.
    assert k.params["vstore"] and "in3[idx]" in k.source and "_epi_v(" in k.source
    assert "out1[0] = gc_f2h(acc)" in k.source
    compile_each([k])
    g = _fused("Softmax", {"axis": 1}, rand((5, 33, 7)), [], [("Mul", (ACC, IN(1)))], (OP(0),), [rand((5, 33, 7))])
    (k,) = kernels_of(g, family="reduction")
    assert "in1[idx]" in k.source
    compile_each([k], archs=("sm_90",))
    b = GraphBuilder("fused")
    xv = b.add_input("x", TensorType(DType.float32, (7, 100)))
    axes = b.add_constant(np.array([1], np.int64), "axes")
    fa = FusedAttrs(
        anchor_op="ReduceSum",
        anchor_attrs=get_op("ReduceSum").attrs(keepdims=0),
        anchor_inputs=2,
        epilogue=(
            EpilogueOp("Sqrt", get_op("Sqrt").attrs(), (ACC,)),
            EpilogueOp("Cast", get_op("Cast").attrs(to=10), (OP(0),)),
        ),
        outputs=(OP(1),),
    )
    node = b.add_node("Fused", [xv, axes], fa, domain="graphc")
    b.set_outputs([node.outputs[0]])
    (k,) = kernels_of(b.build(), family="reduction")
    assert "sqrtf(acc)" in k.source and "gc_f2h(" in k.source
    compile_each([k], archs=("sm_80",))


def test_search_space():
    from rd_helpers import plan_of

    from graphc.codegen.kernel import family_for

    plan, w = plan_of(_model("Softmax", rand((3, 1000)), {"axis": -1}))
    ctx = plan.context(plan.steps[0], w)
    space = family_for(ctx).search_space(ctx)
    assert {"tpr": 64} in space and all(1 <= p["tpr"] <= 1024 for p in space)
