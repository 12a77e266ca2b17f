"""Liveness, memory planning and its validator: property tests and the zoo."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import graphc
import models
from graphc.codegen.lower import lower_to_plan
from graphc.codegen.memory import lifetimes_from_plan, plan_memory, validate_memory_plan
from graphc.passes import optimize
from graphc.runtime.plan import ARENA, INPUT, KernelPlan, Step, TensorSpec


def synthetic_plan(sizes: list[int], lasts: list[int], n_outputs: int, inplace: list[bool]) -> KernelPlan:
    """Step k writes tensor t{k} (t0 is a graph input); t{k} is read by step lasts[k]; the last
    n_outputs tensors are graph outputs. inplace[k]: step k may write over its first input."""
    n = len(sizes)
    tensors = {}
    for k in range(n):
        tensors[f"t{k}"] = TensorSpec(f"t{k}", "uint8", [sizes[k]], sizes[k], INPUT if k == 0 else ARENA)
    readers: dict[int, list[str]] = {}
    for k in range(n):
        last = max(k + 1, min(lasts[k], n - 1)) if k < n - 1 else k
        readers.setdefault(last, []).append(f"t{k}")
    steps = []
    for k in range(1, n):
        ins = readers.get(k, []) or [f"t{k - 1}"]
        steps.append(
            Step(
                index=k - 1,
                name=f"s{k}",
                kind="X",
                op="X",
                domain="",
                attrs={},
                inputs=ins,
                outputs=[f"t{k}"],
                inplace=[0] if inplace[k] else [],
            )
        )
    # steps are indexed from 0; tensor t{k} is written by step k-1
    outputs = [f"t{k}" for k in range(max(1, n - n_outputs), n)]
    return KernelPlan(tensors, steps, ["t0"], outputs, outputs)


@settings(max_examples=150, deadline=None)
@given(
    st.integers(min_value=2, max_value=40).flatmap(
        lambda n: st.tuples(
            st.lists(st.integers(1, 5000), min_size=n, max_size=n),
            st.lists(st.integers(0, n), min_size=n, max_size=n),
            st.integers(0, 3),
            st.lists(st.booleans(), min_size=n, max_size=n),
        )
    )
)
def test_random_lifetimes_give_valid_plans_never_worse_than_naive(args):
    sizes, lasts, n_out, inplace = args
    plan = synthetic_plan(sizes, lasts, n_out, inplace)
    mem = plan_memory(plan)
    assert validate_memory_plan(plan, mem) == []
    assert mem.lower_bound_bytes <= mem.arena_bytes <= mem.naive_bytes


def test_validator_catches_overlaps_and_out_of_arena():
    plan = synthetic_plan([1000, 1000, 1000, 1000], [3, 3, 3, 3], 1, [False] * 4)
    mem = plan_memory(plan)
    assert validate_memory_plan(plan, mem) == []
    # t1 and t2 are both live at step 2: put them on the same bytes
    mem.placements["t2"].offset = mem.placements["t1"].offset
    assert any("overlap" in p for p in validate_memory_plan(plan, mem))
    mem2 = plan_memory(plan)
    mem2.placements["t3"].offset = mem2.arena_bytes
    assert any("outside the arena" in p for p in validate_memory_plan(plan, mem2))


def test_inplace_reuse_of_a_dying_input():
    # a chain: each tensor dies where the next is written; in-place gives one buffer for all
    n = 6
    plan = synthetic_plan([4096] * n, [k + 1 for k in range(n)], 1, [True] * n)
    mem = plan_memory(plan)
    assert validate_memory_plan(plan, mem) == []
    assert mem.arena_bytes == 4096
    no_inplace = plan_memory(synthetic_plan([4096] * n, [k + 1 for k in range(n)], 1, [False] * n))
    assert no_inplace.arena_bytes == 2 * 4096


def _optimized(name: str, size: str):
    m = models.build(name, size=size)
    feeds = models.sample_inputs(name, m)
    g = graphc.bind_shapes(graphc.load_onnx(m), {k: v.shape for k, v in feeds.items()})
    return optimize(g).graph


@pytest.mark.parametrize("name", ["mlp", "resnet", "mobilenetv2", "bert", "vit"])
def test_zoo_plans_are_valid_and_near_the_lower_bound(name):
    plan = lower_to_plan(_optimized(name, "tiny"))
    mem = plan_memory(plan)
    assert validate_memory_plan(plan, mem) == []
    assert mem.arena_bytes <= 1.05 * mem.lower_bound_bytes, mem.candidates
    lt = lifetimes_from_plan(plan)
    assert lt.lower_bound == mem.lower_bound_bytes


def test_aliases_take_no_memory():
    plan = lower_to_plan(_optimized("resnet", "tiny"))
    mem = plan_memory(plan)
    aliases = [n for n, t in plan.tensors.items() if t.kind == "alias"]
    assert aliases, "the flatten before the classifier should be an alias"
    for a in aliases:
        assert a not in mem.placements and a in mem.aliases


def test_cpu_engine_runs_through_the_planned_arena():
    """A planning bug would corrupt values: every tensor is a view at its offset in one buffer."""
    m = models.build("bert", size="tiny")
    feeds = models.sample_inputs("bert", m)
    eng = graphc.compile(m, target="cpu", shapes={k: v.shape for k, v in feeds.items()}, verify=True)
    ref = graphc.interpret(graphc.load_onnx(m), feeds)
    out = eng.run(feeds)
    for k in ref:
        np.testing.assert_allclose(out[k], ref[k], rtol=1e-5, atol=1e-5)
    assert eng.report["memory"]["arena_bytes"] <= eng.report["memory"]["naive_bytes"]
