"""passes/canonicalize_views.py: transpose(reshape(transpose(x))) chains that keep element order
become one Reshape. The order test is checked against numpy on random chains; the pass on small
graphs against ONNX Runtime; and a CUDA-target compile of a patch embedding keeps only the input's
NHWC transpose."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import graphc
from graphc.passes.canonicalize_views import cancel_view_chains, keeps_order
from tests.helpers import run_ort

RNG = np.random.default_rng(5)


def _brute(xs, p, s, q) -> bool:
    x = np.arange(int(np.prod(xs))).reshape(xs)
    return bool((x.transpose(p).reshape(s).transpose(q).ravel() == np.arange(x.size)).all())


def _factorizations(n: int) -> list[tuple[int, ...]]:
    out = [(n,)]
    for a in range(2, n):
        if n % a == 0:
            out += [(a, *rest) for rest in _factorizations(n // a)]
    return out


def test_keeps_order_is_sound_on_every_small_chain():
    # Every x of 12 elements of rank <= 3 (size-1 axes too), every p, every reshape of rank <= 3
    # and every q: the analysis never says "keeps order" where a brute-force permutation says it
    # does not. It may miss a chain that keeps order only through a finer factorization than the
    # dims show (x (2, 2, 3), p (1, 2, 0), s (3, 2, 2), q (2, 0, 1)): such a chain stays as it is.
    found = missed = 0
    shapes = [s for s in _factorizations(12) if len(s) <= 3] + [(1, 3, 4), (2, 1, 6), (3, 4, 1)]
    for xs in shapes:
        for p in itertools.permutations(range(len(xs))):
            for s in shapes:
                for q in itertools.permutations(range(len(s))):
                    want, got = _brute(xs, p, s, q), keeps_order(xs, p, s, q)
                    assert want or not got, (xs, p, s, q)
                    found += got
                    missed += want and not got
    assert found > 10 * missed > 0, (found, missed)


def _chain(xs, p, s, q) -> onnx.ModelProto:
    out_shape = [s[i] for i in q]
    nodes = [
        helper.make_node("Transpose", ["x"], ["t"], perm=list(p)),
        helper.make_node("Reshape", ["t", "shape"], ["r"]),
        helper.make_node("Transpose", ["r"], ["y0"], perm=list(q)),
        helper.make_node("Relu", ["y0"], ["y"]),
    ]
    g = helper.make_graph(
        nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(xs))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)],
        [numpy_helper.from_array(np.array(s, np.int64), "shape")],
    )  # fmt: skip
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


@pytest.mark.parametrize(
    "xs,p,s,q,collapses",
    [
        ((2, 3, 3, 8), (0, 3, 1, 2), (2, 8, 9), (0, 2, 1), True),  # NHWC -> NCHW, flatten, swap back
        ((1, 4, 4, 16), (0, 3, 1, 2), (1, 16, 16), (0, 2, 1), True),
        ((2, 3, 3, 8), (0, 3, 1, 2), (2, 8, 9), (1, 0, 2), False),  # a real permutation stays
        ((2, 6, 4), (0, 2, 1), (2, 4, 2, 3), (0, 2, 3, 1), True),  # a head merge undone: (2, 2, 3, 4)
        ((2, 6, 4), (0, 2, 1), (2, 4, 2, 3), (0, 3, 2, 1), False),
    ],
)
def test_pass_on_small_graphs_matches_onnxruntime(xs, p, s, q, collapses):
    assert _brute(xs, p, s, q) == collapses
    model = _chain(xs, p, s, q)
    g0 = graphc.bind_shapes(graphc.load_onnx(model), {})
    g1 = cancel_view_chains(g0)
    counts = g1.op_counts()
    assert counts.get("Transpose", 0) == (0 if collapses else 2), counts
    x = RNG.standard_normal(xs).astype(np.float32)
    want = run_ort(model, {"x": x})["y"]
    np.testing.assert_array_equal(graphc.interpret(g1, {"x": x})["y"], want)


def test_chain_with_a_second_reader_keeps_the_inner_transpose():
    m = _chain((2, 3, 3, 8), (0, 3, 1, 2), (2, 8, 9), (0, 2, 1))
    m.graph.node.append(helper.make_node("Relu", ["t"], ["u"]))
    m.graph.output.append(helper.make_tensor_value_info("u", TensorProto.FLOAT, [2, 8, 3, 3]))
    g1 = cancel_view_chains(graphc.bind_shapes(graphc.load_onnx(m), {}))
    assert g1.op_counts().get("Transpose", 0) == 1  # the one u needs; y's chain is a reshape
    x = RNG.standard_normal((2, 3, 3, 8)).astype(np.float32)
    want = run_ort(m, {"x": x})
    got = graphc.interpret(g1, {"x": x})
    for k in want:
        np.testing.assert_array_equal(got[k], want[k])


def test_cuda_patch_embedding_keeps_only_the_input_transpose():
    # ViT's conv(x).flatten(2).transpose(1, 2): the layout pass runs the conv in NHWC; its NCHW
    # restore, the flatten and the transpose are one reshape, so the only Transpose kernel left is
    # the input's NCHW -> NHWC.
    from graphc.codegen.capabilities import CUDA
    from graphc.passes.manager import OptimizeOptions, optimize
    from graphc.passes.target import Target

    w = RNG.normal(0, 0.2, (16, 3, 4, 4)).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[4, 4], strides=[4, 4]),
        helper.make_node("Reshape", ["c", "flat"], ["f"]),
        helper.make_node("Transpose", ["f"], ["y"], perm=[0, 2, 1]),
    ]
    g = helper.make_graph(
        nodes, "patch", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 16, 16])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.array([2, 16, 16], np.int64), "flat")],
    )  # fmt: skip
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    target = dataclasses.replace(Target("cuda", "fp32", False), capabilities=CUDA)
    g1 = optimize(graphc.bind_shapes(graphc.load_onnx(m), {}), OptimizeOptions(opt_level=2, target=target, verify=True))
    transposes = [n for n in g1.graph.nodes if n.op == "Transpose"]
    assert [tuple(n.attrs.perm) for n in transposes] == [(0, 2, 3, 1)]
