"""Data-dependent If on the CPU target: each branch a planned sub-plan, chosen on the host at run
time (graphc/host_if.py, runtime/cpu.py host_if_kernel); against ONNX Runtime, through a saved and
reloaded engine, nested, and with malformed sub-plans refused in one line."""

from __future__ import annotations

import copy

import cf_models as M
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import graphc
import graphc.runtime
from graphc.runtime.errors import EngineError
from helpers import run_ort

F = TensorProto.FLOAT
RNG = np.random.default_rng(5)


def _nested_model() -> onnx.ModelProto:
    """y = If(s > 0) then (If(t > 0) then relu(x) @ W1 else x @ W1 * 2) else Reshape(x, [3, 2])^T @ W2 - 1.
    The outer condition and the inner one are computed from inputs; both branches hold constants
    and shape arithmetic on a capture (Shape -> Gather -> Concat -> Reshape)."""
    w1 = RNG.standard_normal((3, 4)).astype(np.float32)
    w2 = RNG.standard_normal((3, 4)).astype(np.float32)
    inner_then = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("MatMul", ["r", "w1"], ["it"])],
        "inner_then",
        [],
        [helper.make_tensor_value_info("it", F, [2, 4])],
    )
    inner_else = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w1"], ["m"]), helper.make_node("Mul", ["m", "two"], ["ie"])],
        "inner_else",
        [],
        [helper.make_tensor_value_info("ie", F, [2, 4])],
        initializer=[numpy_helper.from_array(np.array(2.0, np.float32), "two")],
    )
    outer_then = helper.make_graph(
        [
            helper.make_node("ReduceSum", ["t"], ["ts"], keepdims=0),
            helper.make_node("Greater", ["ts", "zero"], ["tc"]),
            helper.make_node("If", ["tc"], ["ot"], then_branch=inner_then, else_branch=inner_else),
        ],
        "outer_then",
        [],
        [helper.make_tensor_value_info("ot", F, [2, 4])],
    )
    outer_else = helper.make_graph(
        [
            helper.make_node("Shape", ["x"], ["sh"]),
            helper.make_node("Gather", ["sh", "i1"], ["d1"], axis=0),
            helper.make_node("Concat", ["d1", "two_i"], ["newshape"], axis=0),
            helper.make_node("Reshape", ["x", "newshape"], ["xr"]),
            helper.make_node("Transpose", ["xr"], ["xt"], perm=[1, 0]),
            helper.make_node("MatMul", ["xt", "w2"], ["em"]),
            helper.make_node("Sub", ["em", "one"], ["oe"]),
        ],
        "outer_else",
        [],
        [helper.make_tensor_value_info("oe", F, [2, 4])],
        initializer=[
            numpy_helper.from_array(np.array(1.0, np.float32), "one"),
            numpy_helper.from_array(np.array([1], np.int64), "i1"),
            numpy_helper.from_array(np.array([2], np.int64), "two_i"),
        ],
    )
    g = helper.make_graph(
        [
            helper.make_node("ReduceSum", ["s"], ["ss"], keepdims=0),
            helper.make_node("Greater", ["ss", "zero"], ["c"]),
            helper.make_node("If", ["c"], ["y"], then_branch=outer_then, else_branch=outer_else),
        ],
        "nested",
        [
            helper.make_tensor_value_info("x", F, [2, 3]),
            helper.make_tensor_value_info("s", F, [3]),
            helper.make_tensor_value_info("t", F, [3]),
        ],
        [helper.make_tensor_value_info("y", F, [2, 4])],
        initializer=[
            numpy_helper.from_array(w1, "w1"),
            numpy_helper.from_array(w2, "w2"),
            numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
        ],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


def _close(out: dict, ref: dict) -> None:
    for k, r in ref.items():
        np.testing.assert_allclose(out[k], r, rtol=1e-5, atol=1e-6, err_msg=k)


@pytest.fixture(scope="module")
def if_engines(tmp_path_factory):
    model = M.if_on_input()
    eng = graphc.compile(model, target="cpu")
    path = tmp_path_factory.mktemp("hostif") / "if.engine"
    eng.save(path)
    return model, eng, graphc.runtime.load(path)


@pytest.mark.parametrize("cond", [True, False])
def test_if_on_an_input_runs_the_branch_the_data_picks(if_engines, cond):
    model, eng, loaded = if_engines
    feeds = {"c": np.array(cond), "x": RNG.standard_normal((2, 3)).astype(np.float32)}
    ref = run_ort(model, feeds)
    _close(eng.run(feeds), ref)
    _close(loaded.run(feeds), ref)


def test_the_report_says_the_branches_are_sub_plans_chosen_on_the_host(if_engines):
    _, eng, _ = if_engines
    (line,) = eng.report["control_flow"]
    assert "If node 'If_0'" in line and "sub-plan" in line and "on the host" in line


def test_nested_data_dependent_ifs_match_onnx_runtime(tmp_path):
    model = _nested_model()
    eng = graphc.compile(model, target="cpu")
    assert len(eng.report["control_flow"]) == 2  # the outer If and the one inside its then-branch
    eng.save(tmp_path / "n.engine")
    loaded = graphc.runtime.load(tmp_path / "n.engine")
    x = RNG.standard_normal((2, 3)).astype(np.float32)
    seen = set()
    for s_sign, t_sign in [(1, 1), (1, -1), (-1, 1), (-1, -1)]:
        feeds = {"x": x, "s": np.full(3, s_sign, np.float32), "t": np.full(3, t_sign, np.float32)}
        ref = run_ort(model, feeds)
        seen.add(float(ref["y"].sum()))
        _close(eng.run(feeds), ref)
        _close(loaded.run(feeds), ref)
    assert len(seen) == 3  # three distinct paths were taken (s<0 ignores t)


def test_a_malformed_sub_plan_is_one_engine_error(if_engines):
    from graphc.cpu_kernels import cpu_kernel
    from graphc.runtime.cpu import CPUExecutor

    _, eng, _ = if_engines
    plan = copy.deepcopy(eng.plan)
    step = next(s for s in plan.steps if s.op == "If")
    del step.attrs["else_branch"]["plan"]
    with pytest.raises(EngineError, match=r"step 'If_0' \(If\): its else_branch sub-plan is malformed"):
        CPUExecutor(plan, eng.memory, eng.weights, cpu_kernel)
    plan = copy.deepcopy(eng.plan)
    step = next(s for s in plan.steps if s.op == "If")
    step.attrs["then_branch"]["inputs_from"] = [0, 7]
    with pytest.raises(EngineError, match="sub-plan's inputs do not match"):
        CPUExecutor(plan, eng.memory, eng.weights, cpu_kernel)


def test_graphc_check_says_both_targets_run_it():
    from graphc.support import check_model

    assert check_model(M.if_on_input(), target="cpu").supported
    assert check_model(M.if_on_input(), target="cuda").supported  # graphc/host_if_cuda.py


def test_branches_that_return_a_constant_or_a_capture_as_is(tmp_path):
    """then: a constant of the branch; else: a view of the captured input (sub-plans without kernels)."""
    k = np.arange(6, dtype=np.float32).reshape(2, 3)
    then_g = helper.make_graph(
        [helper.make_node("Constant", [], ["k"], value=numpy_helper.from_array(k, "kv"))],
        "then",
        [],
        [helper.make_tensor_value_info("k", F, [2, 3])],
    )
    else_g = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["e"])], "else", [], [helper.make_tensor_value_info("e", F, [2, 3])]
    )
    g = helper.make_graph(
        [helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)],
        "consts",
        [helper.make_tensor_value_info("c", TensorProto.BOOL, []), helper.make_tensor_value_info("x", F, [2, 3])],
        [helper.make_tensor_value_info("y", F, [2, 3])],
    )
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    eng = graphc.compile(model, target="cpu")
    eng.save(tmp_path / "c.engine")
    loaded = graphc.runtime.load(tmp_path / "c.engine")
    x = RNG.standard_normal((2, 3)).astype(np.float32)
    for cond in (True, False):
        feeds = {"c": np.array(cond), "x": x}
        ref = run_ort(model, feeds)
        _close(eng.run(feeds), ref)
        _close(loaded.run(feeds), ref)
