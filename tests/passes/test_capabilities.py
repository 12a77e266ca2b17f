"""The fusion passes ask the target's capabilities (passes/capabilities.py) what a fused kernel can
hold; the CUDA target's come from codegen (handed in by compile()), and nothing under passes/
imports codegen."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import numpy as np
import pytest

import graphc
from graphc.codegen.capabilities import CUDA
from graphc.ir.text import parse_graph
from graphc.ir.types import DType
from graphc.passes import OptimizeOptions, optimize
from graphc.passes.capabilities import REFERENCE, FusionCapabilities
from graphc.passes.fuse_elementwise import fuse_elementwise
from graphc.passes.fuse_epilogue import fuse_epilogues
from graphc.passes.target import Target

PASSES = Path(graphc.passes.__file__).parent

CONV_RELU = """
graph g (opset 17)
  input  %x: f32[1,2,6,6]
  const  %w: f32[3,2,3,3] = given
  %y: f32[1,3,4,4] = Conv[c](%x, %w)
  %r: f32[1,3,4,4] = Relu[r](%y)
  %n: f32[1,3,4,4] = Neg[n](%r)
  output %n: f32[1,3,4,4]
"""
W = np.random.default_rng(0).standard_normal((3, 2, 3, 3)).astype(np.float32)


@dataclasses.dataclass(frozen=True)
class _Only:
    """A target whose kernels render only the ops given."""

    ops: frozenset[str]
    name: str = "only"

    def renders(self, op: str) -> bool:
        return op in self.ops

    def stores(self, dtype: DType) -> bool:
        return dtype is DType.float32

    def fuses_epilogue(self, anchor: str, op: str, dtype: DType) -> bool:
        return anchor == "Conv" and self.renders(op)


def _epilogue_ops(g) -> list[str]:
    (fused,) = [n for n in g.nodes if n.op == "Fused"]
    return [e.op for e in fused.attrs.epilogue]


def test_implementations_satisfy_the_protocol():
    for caps in (REFERENCE, CUDA, _Only(frozenset())):
        assert isinstance(caps, FusionCapabilities)


def test_epilogue_takes_only_what_the_target_renders():
    g = parse_graph(CONV_RELU, {"w": W})
    assert _epilogue_ops(fuse_epilogues(g, REFERENCE)) == ["Relu", "Neg"]
    assert _epilogue_ops(fuse_epilogues(g, _Only(frozenset({"Relu"})))) == ["Relu"]
    assert fuse_epilogues(g, _Only(frozenset())) is g


def test_the_target_context_carries_the_capabilities_into_the_pipeline():
    g = parse_graph(CONV_RELU, {"w": W})
    target = Target(capabilities=_Only(frozenset({"Relu"})))
    out = optimize(g, OptimizeOptions(opt_level=2, target=target)).graph
    assert _epilogue_ops(out) == ["Relu"] and [n.op for n in out.nodes] == ["Fused", "Neg"]


def test_cuda_renders_less_than_the_reference():
    # BitShift has a numpy reference but no CUDA expression: the CPU engine fuses it, CUDA not.
    text = """
    graph g (opset 17)
      input  %x: u32[4]
      input  %s: u32[4]
      %a: u32[4] = BitShift[b](%x, %s) {direction='LEFT'}
      %y: u32[4] = Add[add](%a, %x)
      output %y: u32[4]
    """
    g = parse_graph(text)
    assert [n.op for n in fuse_elementwise(g, REFERENCE).nodes] == ["Fused"]
    assert [n.op for n in fuse_elementwise(g, CUDA).nodes] == ["BitShift", "Fused"]
    # e4m3 is stored (fp8 engines' GEMM operands, codegen/cuda_types.py); e5m2 is not
    assert CUDA.stores(DType.float16) and CUDA.stores(DType.float8e4m3fn) and not CUDA.stores(DType.float8e5m2)


@pytest.mark.parametrize("path", sorted(PASSES.glob("*.py")), ids=lambda p: p.name)
def test_no_pass_imports_codegen(path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            assert not (node.module or "").startswith("graphc.codegen"), f"{path.name} imports {node.module}"
        elif isinstance(node, ast.Import):
            assert not any(a.name.startswith("graphc.codegen") for a in node.names), path.name
