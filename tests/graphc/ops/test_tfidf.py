"""TfIdfVectorizer (integer pools) against ONNX's ReferenceEvaluator (its trie walk) on random
token rows and pools: every mode with and without weights, gram lengths 1..3, skips 0..3, 1-D and
2-D inputs, int32 and int64; through the interpreter and a CPU engine. Bad attributes are one-line
errors; string pools are refused by name; CUDA has no kernel and check says so."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import graphc


def _model(x, *, mode, lo, hi, skip, pool_grams, weights=False, seed=0):
    rng = np.random.default_rng(seed)
    pool, counts, n = [], [], 0
    for length, grams in enumerate(pool_grams, start=1):  # pool_grams[i]: the (i + 1)-grams
        counts.append(n)
        for g in grams:
            assert len(g) == length
            pool += list(g)
            n += length
    total = sum(len(g) for g in pool_grams)
    idx = rng.permutation(total).tolist()  # any order of output columns
    attrs = dict(mode=mode, min_gram_length=lo, max_gram_length=hi, max_skip_count=skip, ngram_counts=counts,
                 ngram_indexes=idx, pool_int64s=pool)  # fmt: skip
    if weights:
        attrs["weights"] = rng.uniform(0.5, 2.0, total).astype(np.float32).tolist()
    node = helper.make_node("TfIdfVectorizer", ["X"], ["Y"], **attrs)
    dt = TensorProto.INT32 if x.dtype == np.int32 else TensorProto.INT64
    size = max(idx) + 1
    g = helper.make_graph(
        [node], "tfidf", [helper.make_tensor_value_info("X", dt, list(x.shape))],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [*x.shape[:-1], size])],
    )  # fmt: skip
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 9)])
    m.ir_version = 8
    return m


def _pool(rng, vocab=6):
    uni = [(int(v),) for v in rng.choice(vocab, 3, replace=False)]
    bi = [tuple(int(v) for v in rng.integers(0, vocab, 2)) for _ in range(4)]
    tri = [tuple(int(v) for v in rng.integers(0, vocab, 3)) for _ in range(2)]
    return [uni, bi, tri]


@pytest.mark.parametrize("mode", ["TF", "IDF", "TFIDF"])
@pytest.mark.parametrize("weights", [False, True])
@pytest.mark.parametrize(("lo", "hi", "skip"), [(1, 1, 0), (1, 2, 0), (2, 2, 3), (1, 3, 2), (2, 3, 1), (3, 3, 0)])
@pytest.mark.parametrize("shape", [(12,), (3, 9)])
def test_against_the_onnx_reference(mode, weights, lo, hi, skip, shape):
    from onnx.reference import ReferenceEvaluator

    rng = np.random.default_rng(hash((mode, weights, lo, hi, skip, shape)) % 2**32)
    x = rng.integers(0, 6, shape).astype(np.int32 if len(shape) == 1 else np.int64)
    pool = _pool(rng)
    m = _model(x, mode=mode, lo=lo, hi=hi, skip=skip, pool_grams=pool, weights=weights, seed=1)
    if weights or mode == "TF":
        (want,) = ReferenceEvaluator(m).run(None, {"X": x})
    else:  # ONNX's reference needs weights for IDF and TFIDF: from its TF counts, as the spec says
        (tf,) = ReferenceEvaluator(_model(x, mode="TF", lo=lo, hi=hi, skip=skip, pool_grams=pool, seed=1)).run(
            None, {"X": x}
        )
        want = (tf > 0).astype(np.float32) if mode == "IDF" else tf
    got = graphc.interpret(graphc.load_onnx(m), {"X": x})["Y"]
    assert got.dtype == np.float32 and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-6)
    cpu = graphc.compile(m, target="cpu")
    np.testing.assert_allclose(np.asarray(cpu.run({"X": x})["Y"]), want, rtol=1e-6)


def test_bad_attributes_are_one_line():
    x = np.zeros(4, np.int64)
    m = _model(x, mode="TF", lo=1, hi=2, skip=0, pool_grams=[[(1,), (2,)], [(1, 2)]])
    m.graph.node[0].attribute[-2].ints[:] = [0, 1]  # ngram_indexes: 2 entries for 3 n-grams
    with pytest.raises(graphc.GraphcError, match="the pool holds 3 n-grams, ngram_indexes has 2 entries") as e:
        graphc.load_onnx(m)
    assert "\n" not in str(e.value) and "TfIdfVectorizer" in str(e.value)
    node = helper.make_node("TfIdfVectorizer", ["X"], ["Y"], mode="TF", min_gram_length=1, max_gram_length=1,
                            max_skip_count=0, ngram_counts=[0], ngram_indexes=[0], pool_strings=["a"])  # fmt: skip
    g = helper.make_graph(
        [node], "s", [helper.make_tensor_value_info("X", TensorProto.INT64, [3])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1])],
    )  # fmt: skip
    ms = helper.make_model(g, opset_imports=[helper.make_opsetid("", 9)])
    with pytest.raises(graphc.GraphcError, match="pool_strings: graphc has no string tensors"):
        graphc.load_onnx(ms)


def test_no_cuda_kernel_and_check_says_so(tmp_path):
    import onnx

    from graphc.cli import main

    m = _model(np.zeros(5, np.int64), mode="TF", lo=1, hi=1, skip=0, pool_grams=[[(1,), (3,)]])
    path = tmp_path / "tfidf.onnx"
    onnx.save(m, str(path))
    assert main(["check", str(path), "--target", "cuda"]) != 0
    with pytest.raises(graphc.GraphcError, match="TfIdfVectorizer.*no CUDA kernel"):
        graphc.compile(m, target="cuda", arch=["sm_90"])
