"""K-major weights for GEMMs whose N breaks 16-byte loads (CUDA target).

The GEMM kernels copy operand tiles to shared memory in 16-byte chunks (cp.async) along each
operand's contiguous dimension; a row-major weight B [K, N] is N-contiguous, so when N is not a
multiple of the chunk (8 fp16/bf16 or 4 fp32 elements) every row's start is misaligned and the
kernel falls back to element-wise loads. GPT-2's LM head (N = 50257, the vocabulary) ran at 38
TFLOP/s that way on an H200, 28% of the model's time. Stored transposed, [N, K], the same weight
is K-contiguous, and K (768 there) is a multiple of the chunk: the kernel reads it as the "k"
layout (codegen/families/gemm.py) with full-width loads.

So: MatMul(x, W) and graphc.MatMul(x, W, trans_b=0) with a 2-D constant W [K, N], N % chunk != 0
and K % chunk == 0, become graphc.MatMul(x, W^T, trans_b=1); Gemm(transB=0) becomes Gemm(transB=1)
over W^T. The transposed copy is made here, once, at compile time. A weight that another node
also reads is left alone (the copy would double its memory). Fused nodes are not rewritten: their
anchor's flags live inside the Fused attributes, and the case that motivated this, an LM head, has
no epilogue.

Runs after the precision pass (the chunk depends on the final dtype), for target="cuda" only: the
CPU engine's numpy GEMM gains nothing from it.
"""

from __future__ import annotations

import logging

import numpy as np

from graphc.ir.builder import GraphBuilder
from graphc.ir.graph import Graph, Node, Value
from graphc.ops.internal import INTERNAL_DOMAIN
from graphc.passes.rewrite import Const, Match, Op, Rule, Var, apply_rules_counted

log = logging.getLogger(__name__)

RULE = "matmul(x, W[K, N]) with N unaligned -> graphc.matmul(x, W^T, trans_b=1)"
CHUNK_BYTES = 16


def _wants_k_major(w: np.ndarray) -> bool:
    if w.ndim != 2 or (w.dtype.kind != "f" and w.dtype.name != "bfloat16"):
        return False
    chunk = CHUNK_BYTES // w.dtype.itemsize
    k, n = w.shape
    return n % chunk != 0 and k % chunk == 0 and n > 1


def _sole_reader(m: Match, name: str) -> bool:
    return len(m.graph.users(m.values[name].name)) == 1 and not m.graph.is_output(m.values[name].name)


def _transposed(m: Match, b: GraphBuilder) -> Value:
    w = m.const("w")
    return b.add_constant(np.ascontiguousarray(w.T), f"{m.values['w'].name}/k_major")


def _matmul(m: Match, b: GraphBuilder) -> Value | None:
    root: Node = m.root
    alpha = 1.0
    if root.domain == INTERNAL_DOMAIN:
        if root.attrs.trans_b:
            return None
        alpha = float(root.attrs.alpha)
        trans_a = int(root.attrs.trans_a)
    else:
        trans_a = 0
    if not _sole_reader(m, "w"):
        return None
    attrs = {"trans_a": trans_a, "trans_b": 1, "alpha": alpha}
    return b.add_node(
        "MatMul", [m.value("x"), _transposed(m, b)], attrs, name=root.name, domain=INTERNAL_DOMAIN, keep_name=True
    ).outputs[0]


def _gemm(m: Match, b: GraphBuilder) -> Value | None:
    root: Node = m.root
    if root.attrs.transB or not _sole_reader(m, "w"):
        return None
    attrs = {"alpha": root.attrs.alpha, "beta": root.attrs.beta, "transA": root.attrs.transA, "transB": 1}
    ins = [m.value("x"), _transposed(m, b), *(m.new(v) for v in root.inputs[2:])]
    return b.add_node("Gemm", ins, attrs, name=root.name, keep_name=True).outputs[0]


def _weight() -> Const:
    return Const("w", pred=_wants_k_major)


def _matrix() -> Var:  # graphc.MatMul takes operands of rank 2 or more (ONNX MatMul also rank 1)
    return Var("x", pred=lambda v: getattr(v.type, "shape", None) is not None and len(v.type.shape) >= 2)


RULES = [
    Rule(RULE, Op("MatMul", _matrix(), _weight()), _matmul),
    Rule(RULE, Op("MatMul", _matrix(), _weight(), domain=INTERNAL_DOMAIN), _matmul),
    Rule(RULE, Op("Gemm", Var("x"), _weight(), any_inputs=True), _gemm),
]


def k_major_gemm_weights(graph: Graph, *, fired: list[str] | None = None) -> Graph:
    """The rewrite above, one sweep (its results never match again: trans_b is set)."""
    return apply_rules_counted(graph, RULES, "GEMMs reading their weight K-major", fired=fired)
