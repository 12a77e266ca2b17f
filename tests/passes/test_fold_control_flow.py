"""fold_control_flow: If on constants and static shapes inlined, small static Loop/Scan unrolled;
the folded graph against ONNX Runtime through the interpreter and the CPU engine, and compiled for
CUDA here (NVRTC); data-dependent and too-long control flow stays."""

from __future__ import annotations

import logging

import cf_models as M
import numpy as np
import pytest

import graphc
from graphc.ir.shapes import bind_shapes
from graphc.passes.fold_control_flow import MAX_UNROLL, fold_control_flow
from helpers import assert_close, run_ort

RNG = np.random.default_rng(11)
X = RNG.standard_normal((2, 3)).astype(np.float32)
CONTROL = {"If", "Loop", "Scan"}

CASES = {
    "if_const_true": (lambda: M.if_on_constant(True), {"x": X}),
    "if_const_false": (lambda: M.if_on_constant(False), {"x": X}),
    "if_shape_eq": (lambda: M.if_on_shape(2), {"x": X}),
    "if_shape_ne": (lambda: M.if_on_shape(4), {"x": RNG.standard_normal((4, 3)).astype(np.float32)}),
    "loop_5": (lambda: M.loop_static(5), {"x": X, "acc0": X}),
    "loop_0": (lambda: M.loop_static(0), {"x": X, "acc0": X}),
    "loop_nested_if": (lambda: M.loop_static(6, nested_if=True), {"x": X, "acc0": X}),
    "scan_fwd": (lambda: M.scan_cumsum(4), {"s0": X, "x": RNG.standard_normal((2, 4, 3)).astype(np.float32)}),
    "scan_rev_axis1": (
        lambda: M.scan_cumsum(3, True, 1),
        {"s0": X, "x": RNG.standard_normal((2, 3, 3)).astype(np.float32)},
    ),
}


def _ops(graph) -> set[str]:
    return {n.op for n in graph.nodes}


@pytest.mark.parametrize("case", sorted(CASES))
def test_folds_to_a_tensor_graph_with_the_same_numbers(case):
    make, feeds = CASES[case]
    model = make()
    g = graphc.load_onnx(model)
    # An If whose condition is known while loading is inlined by the frontend already (only the
    # taken branch is converted); loops and scans are left to the pass.
    assert bool(_ops(g) & CONTROL) == (not case.startswith("if_"))
    folded = fold_control_flow(g)
    assert not _ops(folded) & CONTROL, folded
    expected = run_ort(model, feeds)
    got = graphc.interpret(folded, feeds)
    engine = graphc.compile(model, target="cpu")
    ran = engine.run(feeds)
    for k in expected:
        assert_close(got[k], expected[k], rtol=1e-5, atol=1e-6, what=f"{case} interpreter {k}")
        assert_close(ran[k], expected[k], rtol=1e-5, atol=1e-6, what=f"{case} cpu engine {k}")


def test_symbolic_shape_condition_folds_once_shapes_are_bound():
    g = graphc.load_onnx(M.if_on_shape("N"))
    assert fold_control_flow(g) is g  # N unknown: the comparison is data
    bound = bind_shapes(g, {"x": (2, 3)})
    assert not _ops(fold_control_flow(bound)) & CONTROL


def test_data_dependent_control_flow_stays():
    for model in (M.if_on_input(), M.loop_static(8, early_exit=True)):
        g = graphc.load_onnx(model)
        assert fold_control_flow(g) is g


def test_loop_longer_than_the_bound_stays_and_says_so(caplog):
    g = graphc.load_onnx(M.loop_static(MAX_UNROLL + 1))
    with caplog.at_level(logging.INFO, logger="graphc.passes.fold_control_flow"):
        assert fold_control_flow(g) is g
    assert f"more than MAX_UNROLL={MAX_UNROLL}" in caplog.text
    g = graphc.load_onnx(M.loop_static(MAX_UNROLL))
    assert not _ops(fold_control_flow(g)) & CONTROL


@pytest.mark.parametrize("case", ["loop_nested_if", "scan_fwd", "if_shape_eq"])
def test_folded_models_compile_for_cuda(case):
    pytest.importorskip("cuda.bindings")
    make, _ = CASES[case]
    engine = graphc.compile(make(), target="cuda")
    assert engine.report["kernels"] >= 1
