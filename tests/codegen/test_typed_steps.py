"""Typed steps: families generate from the IR node (typed attrs, TensorTypes), never from the step's
JSON attrs; code generation returns each step's launches and workspace without touching the
lowered plan, and the memory plan of the complete plan sizes the workspace from them."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from graphc.codegen.build import complete_plan, generate_kernels
from graphc.codegen.kernel import StepContext, family_for
from graphc.codegen.lower import lower_to_plan
from graphc.codegen.memory import plan_memory, validate_memory_plan
from graphc.errors import CompileError
from graphc.ir.attrs import onnx_attrs_class
from graphc.ir.builder import GraphBuilder
from graphc.ir.types import DType, TensorType
from graphc.runtime.plan import align

# the two-kernel split-K (partials, then gemm_reduce), not the one-launch default
SPLIT_K = {"BM": 64, "BN": 64, "BK": 32, "WM": 2, "WN": 2, "STAGES": 3, "SPLITS": 5, "SERIAL": 0}


def _graph():
    """x (50, 3000) @ w (3000, 70), then a Transpose of the product with perm (1, 0)."""
    b = GraphBuilder("t")
    x = b.add_input("x", TensorType(DType.float16, (50, 3000)))
    w = b.add_constant(np.zeros((3000, 70), np.float16), "w")
    y = b.add_node("MatMul", [x, w], onnx_attrs_class("MatMul")(), name="mm").outputs[0]
    t = b.add_node("Transpose", [y], onnx_attrs_class("Transpose")(perm=(1, 0)), name="tr").outputs[0]
    b.set_outputs([t])
    return b.build()


def test_families_read_the_node_not_the_json():
    graph = _graph()
    plan = lower_to_plan(graph)
    tr = next(s for s in plan.steps if s.op == "Transpose")
    assert tr.attrs["perm"] == [1, 0]  # the engine file's record of the attrs
    ctx = plan.context(tr, {})
    assert ctx.attrs.perm == (1, 0) and ctx.input_type(0) == TensorType(DType.float16, (50, 70))
    (want,) = family_for(ctx).generate(ctx)
    # The JSON scrambled: a family that decoded it would fail or emit another kernel.
    garbled = dataclasses.replace(ctx, step=dataclasses.replace(tr, attrs={"perm": [0, 1], "junk": 1}))
    (got,) = family_for(garbled).generate(garbled)
    assert got.source == want.source


def test_a_step_paired_with_another_node_is_refused():
    plan = lower_to_plan(_graph())
    mm, tr = (next(s for s in plan.steps if s.op == op) for op in ("MatMul", "Transpose"))
    with pytest.raises(CompileError, match="paired with node 'mm'"):
        StepContext(tr, plan.nodes["mm"], plan.tensors, {})
    assert plan.context(mm, {}).node is plan.nodes["mm"]


def test_codegen_returns_launches_and_the_memory_plan_takes_the_workspace():
    graph = _graph()
    lowered = lower_to_plan(graph)
    weights = {k: c.data for k, c in graph.constants.items()}
    kernels = generate_kernels(lowered, weights, precision="fp16", choices={"mm": SPLIT_K})
    # the lowered plan is left as lowering made it
    assert all(s.launches == [] and s.workspace_bytes == 0 for s in lowered.steps)
    mm = kernels.steps["mm"]
    assert [ln.family for ln in mm.launches] == ["gemm", "gemm"]  # split-K partials, then the reduce
    assert mm.workspace_bytes == 5 * 50 * 70 * 4
    assert kernels.steps["tr"].workspace_bytes == 0
    plan = complete_plan(lowered, kernels)
    assert type(plan).__name__ == "KernelPlan" and not hasattr(plan, "nodes")
    assert [len(s.launches) for s in plan.steps] == [2, 1]
    assert all(ln.digest in kernels.sources for s in plan.steps for ln in s.launches)
    memory = plan_memory(plan)
    assert memory.workspace_bytes == align(5 * 50 * 70 * 4)
    assert validate_memory_plan(plan, memory) == []
    # JSON of the complete plan round-trips with its launches (what an engine file holds)
    from graphc.runtime.plan import KernelPlan

    again = KernelPlan.from_json(plan.to_json())
    assert again.steps[0].launches == plan.steps[0].launches and again.steps[0].workspace_bytes == mm.workspace_bytes
