"""ai.onnx.ml TreeEnsemble (opset 5) against ONNX's ReferenceEvaluator on random forests: every
comparison mode and set membership, NaN features with missing-value tracking, several targets,
every aggregate function, leaves as roots, float32 and float64; interpreter and CPU engine. Bad
attributes are one-line errors; the CUDA target has no kernel and check says so."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import graphc

ML = "ai.onnx.ml"


def _forest(rng, n_trees=4, depth=3, features=5, n_targets=3, members=True, leaf_root=False):
    """Complete binary trees of `depth` levels of interior nodes, numbered depth-first (true branch
    first), tree by tree: the order in which ONNX's reference reads membership sets is then node
    order, as the spec has it."""
    f = {k: [] for k in ("modes", "splits", "feats", "t_ids", "f_ids", "t_leaf", "f_leaf", "mtt", "members",
                         "leaf_w", "leaf_t", "roots")}  # fmt: skip

    def leaf() -> int:
        f["leaf_w"].append(float(rng.standard_normal()))
        f["leaf_t"].append(int(rng.integers(0, n_targets)))
        return len(f["leaf_w"]) - 1

    def node(level: int) -> int:
        i = len(f["modes"])
        mode = int(rng.integers(0, 7 if members else 6))
        f["modes"].append(mode)
        f["feats"].append(int(rng.integers(0, features)))
        # integer splits often, so that features (integers half the time) fall on them: LEQ vs LT
        exact = mode in (4, 5) or rng.random() < 0.5
        f["splits"].append(float(rng.integers(-2, 3)) if exact else float(rng.standard_normal()))
        if mode == 6:  # no 0 among the members: ONNX's reference stops a set at a falsy value
            f["members"] += [float(v) for v in rng.choice([-2, -1, 1, 2], 2, replace=False)] + [np.nan]
        f["mtt"].append(int(rng.integers(0, 2)))
        for k in ("t_ids", "f_ids", "t_leaf", "f_leaf"):
            f[k].append(0)
        for side in ("t", "f"):
            if level + 1 < depth:
                f[f"{side}_ids"][i], f[f"{side}_leaf"][i] = node(level + 1), 0
            else:
                f[f"{side}_ids"][i], f[f"{side}_leaf"][i] = leaf(), 1
        return i

    for _ in range(n_trees):
        f["roots"].append(node(0))
    if leaf_root:  # a tree that is one leaf: a root whose both successors are the same leaf
        j = leaf()
        f["roots"].append(len(f["modes"]))
        for k, v in (("modes", 0), ("feats", 0), ("splits", 0.0), ("mtt", 0), ("t_ids", j), ("f_ids", j),
                     ("t_leaf", 1), ("f_leaf", 1)):  # fmt: skip
            f[k].append(v)
    f["n_targets"] = n_targets
    return f


def _model(f, dtype, agg, rows, features=5, **override):
    np_t = np.float32 if dtype == TensorProto.FLOAT else np.float64
    attrs = dict(
        nodes_modes=numpy_helper.from_array(np.array(f["modes"], np.uint8)),
        nodes_splits=numpy_helper.from_array(np.array(f["splits"], np_t)),
        nodes_featureids=f["feats"], nodes_truenodeids=f["t_ids"], nodes_falsenodeids=f["f_ids"],
        nodes_trueleafs=f["t_leaf"], nodes_falseleafs=f["f_leaf"], nodes_missing_value_tracks_true=f["mtt"],
        leaf_weights=numpy_helper.from_array(np.array(f["leaf_w"], np_t)), leaf_targetids=f["leaf_t"],
        tree_roots=f["roots"], n_targets=f["n_targets"], aggregate_function=agg, post_transform=0,
    )  # fmt: skip
    if f["members"]:
        attrs["membership_values"] = numpy_helper.from_array(np.array(f["members"], np_t))
    attrs.update(override)
    node = helper.make_node("TreeEnsemble", ["X"], ["Y"], domain=ML, **attrs)
    g = helper.make_graph(
        [node], "forest", [helper.make_tensor_value_info("X", dtype, [rows, features])],
        [helper.make_tensor_value_info("Y", dtype, [rows, f["n_targets"]])],
    )  # fmt: skip
    m = helper.make_model(g, opset_imports=[helper.make_opsetid(ML, 5), helper.make_opsetid("", 21)])
    m.ir_version = 10
    return m


@pytest.mark.parametrize("agg", [0, 1, 2, 3])
@pytest.mark.parametrize("dtype", [TensorProto.FLOAT, TensorProto.DOUBLE])
@pytest.mark.parametrize("seed", [0, 1])
def test_against_the_onnx_reference(agg, dtype, seed):
    from onnx.reference import ReferenceEvaluator

    rng = np.random.default_rng(seed)
    f = _forest(rng)
    # integers most of the time, so that features fall on the integer splits (LEQ against LT...)
    x = rng.integers(-2, 3, (64, 5)).astype(np.float64) + (rng.random((64, 5)) < 0.2) * rng.standard_normal((64, 5))
    x[rng.random((64, 5)) < 0.1] = np.nan  # missing values
    x = x.astype(np.float32 if dtype == TensorProto.FLOAT else np.float64)
    m = _model(f, dtype, agg, 64)
    (want,) = ReferenceEvaluator(m).run(None, {"X": x})
    got = graphc.interpret(graphc.load_onnx(m), {"X": x})["Y"]
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    cpu = graphc.compile(m, target="cpu")
    np.testing.assert_allclose(np.asarray(cpu.run({"X": x})["Y"]), want, rtol=1e-6, atol=1e-6)


def test_a_leaf_root_adds_its_leaf():
    # the forest with a one-leaf tree gives the forest's sum without it plus that leaf's weight
    rng = np.random.default_rng(7)
    f = _forest(rng, members=False, leaf_root=True)
    x = rng.standard_normal((6, 5)).astype(np.float32)
    with_leaf = graphc.interpret(graphc.load_onnx(_model(f, TensorProto.FLOAT, 1, 6)), {"X": x})["Y"]
    g = {**f, "roots": f["roots"][:-1]}
    without = graphc.interpret(graphc.load_onnx(_model(g, TensorProto.FLOAT, 1, 6)), {"X": x})["Y"]
    expected = without.copy()
    expected[:, f["leaf_t"][-1]] += np.float32(f["leaf_w"][-1])
    np.testing.assert_allclose(with_leaf, expected, rtol=1e-6)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"post_transform": 1}, r"post_transform 1: graphc computes NONE \(0\) only"),
        ({"leaf_targetids": [7] * 32}, r"leaf_targetids must lie in \[0, n_targets\)"),
        ({"tree_roots": [0, 99]}, r"tree_roots \[0, 99\] must be node indices below 28"),
    ],
)
def test_bad_attributes_are_one_line(override, message):
    f = _forest(np.random.default_rng(3), members=False)
    m = _model(f, TensorProto.FLOAT, 1, 4, **override)
    with pytest.raises(graphc.GraphcError, match=message) as e:
        graphc.load_onnx(m)
    assert "\n" not in str(e.value) and "TreeEnsemble" in str(e.value)


def test_no_cuda_kernel_and_check_says_so(tmp_path):
    import onnx

    from graphc.cli import main

    m = _model(_forest(np.random.default_rng(4), members=False), TensorProto.FLOAT, 1, 4)
    path = tmp_path / "forest.onnx"
    onnx.save(m, str(path))
    assert main(["check", str(path), "--target", "cuda"]) != 0
    assert main(["check", str(path), "--target", "cpu"]) == 0
