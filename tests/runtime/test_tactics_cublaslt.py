"""The cuBLASLt vendor tactic without a GPU: the column-major call against numpy (a model of what
cublasLtMatmul reads), the compiler's lowering and selection, the engine record, its schema and
validation, and the error when nvmath-python is missing."""

from __future__ import annotations

import itertools
import sys

import numpy as np
import pytest

import graphc
from graphc.errors import CompileError
from graphc.runtime.errors import EngineError
from graphc.runtime.format import read_engine
from graphc.runtime.tactics_cublaslt import ACTS, VendorGemm, emulate, gelu_tanh, import_cublaslt, lt_call
from tests.runtime.tactics_models import gemm_model
from tests.runtime.test_engine_checks import refused, rewrite


def _row_major_ref(a, b, g: VendorGemm, c, bias):
    """graphc's row-major meaning of a record: per batch, act(alpha A @ B + beta C + bias)."""
    out = []
    for i in range(g.batch):
        A = a.reshape(-1)[i * g.a_stride :][: g.m * g.k].reshape((g.k, g.m) if g.a_trans else (g.m, g.k))
        B = b.reshape(-1)[i * g.b_stride :][: g.k * g.n].reshape((g.n, g.k) if g.b_trans else (g.k, g.n))
        A = A.T if g.a_trans else A
        B = B.T if g.b_trans else B
        y = g.alpha * (A.astype(np.float32) @ B.astype(np.float32))
        if c is not None:
            y = y + g.beta * c.reshape(-1)[i * g.c_stride :][: g.m * g.n].reshape(g.m, g.n)
        if bias is not None:
            y = y + bias
        y = np.maximum(y, 0) if g.act == "relu" else gelu_tanh(y) if g.act == "gelu_tanh" else y
        out.append(y)
    return np.stack(out).reshape(-1)


GRID = list(itertools.product([False, True], [False, True], [1, 3], [False, True], [False, True], ACTS))


@pytest.mark.parametrize("a_trans,b_trans,batch,bias,res,act", GRID)
def test_the_column_major_call_computes_the_row_major_gemm(a_trans, b_trans, batch, bias, res, act):
    rng = np.random.default_rng(0)
    M, N, K = 5, 7, 3  # odd, unequal: a swapped rows/cols or ld shows
    sa = M * K if batch > 1 else 0
    g = VendorGemm(
        m=M, n=N, k=K, a="A", b="B", d="D", batch=batch, a_trans=a_trans, b_trans=b_trans,
        a_stride=sa, b_stride=0 if batch > 1 else 0, d_stride=M * N if batch > 1 else 0,
        c="C" if res else None, c_stride=M * N if batch > 1 and res else 0, beta=0.5 if res else 0.0,
        bias="bias" if bias else None, alpha=1.5, act=act,
    )  # fmt: skip
    a = rng.standard_normal(batch * M * K).astype(np.float32)
    b = rng.standard_normal(K * N).astype(np.float32)
    c = rng.standard_normal(batch * M * N).astype(np.float32)
    v = rng.standard_normal(N).astype(np.float32)
    call = lt_call(g)
    got = emulate(call, {"A": a, "B": b, "C": c, "D": np.zeros(batch * M * N)}, g.alpha, g.beta,
                  v if bias else None, act, np.float32)  # fmt: skip
    want = _row_major_ref(a, b, g, c if res else None, v if bias else None)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_the_call_swaps_operands_and_keeps_d_row_major():
    call = lt_call(VendorGemm(m=4, n=6, k=8, a="A", b="B", d="D"))
    assert (call.a.buffer, call.a.rows, call.a.cols, call.a.ld) == ("B", 6, 8, 6)  # B [K, N] read as [N, K]
    assert (call.b.buffer, call.b.rows, call.b.cols, call.b.ld) == ("A", 8, 4, 8)
    assert (call.d.rows, call.d.cols, call.d.ld, call.trans_a, call.trans_b) == (6, 4, 6, 0, 0)
    t = lt_call(VendorGemm(m=4, n=6, k=8, a="A", b="B", d="D", b_trans=True, bias="v", act="gelu_tanh"))
    assert (t.a.rows, t.a.cols, t.a.ld, t.trans_a, t.epilogue) == (8, 6, 8, 1, 36)  # GELU_BIAS


def _compile(model, **kw):
    return graphc.compile(model, target="cuda", precision="fp16", arch=["sm_90"], **kw)


def _vendor(eng):
    return [s for s in eng.plan.steps if s.vendor is not None]


CASES = [
    dict(m=64, n=96, k=32, epilogue="bias_gelu"),
    dict(m=64, n=96, k=32, epilogue="bias_relu"),
    dict(m=33, n=40, k=24, epilogue="bias_res"),
    dict(m=33, n=40, k=24, epilogue="res"),
    dict(m=16, n=24, k=40, epilogue="none", trans_b=True),
    dict(m=16, n=24, k=40, epilogue="bias", trans_b=True, alpha=0.5),
    dict(m=16, n=24, k=40, epilogue="none", alpha=0.25),
    dict(m=8, n=24, k=16, epilogue="bias", batch=3),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items()))
def test_the_recorded_call_computes_the_model(case):
    """Lowering end to end: the engine's record, run through the model of cublasLtMatmul on the
    engine's own weights, equals the ONNX model's numpy reference."""
    model, ref, make_feeds = gemm_model(**case)
    eng = _compile(model, tactics=["cublaslt"], extra={"tactics_force": True})
    (step,) = _vendor(eng)
    assert not step.launches
    g = VendorGemm.from_json(step.vendor)
    feeds = make_feeds()
    bufs = {
        **{k: np.asarray(v, np.float32) for k, v in eng.weights.items()},
        **{k: v.astype(np.float32) for k, v in feeds.items()},
    }  # noqa: E501
    # the step may read a cast of an input; here every fp16 input is the tensor itself
    bias = bufs[g.bias] if g.bias else None
    got = emulate(lt_call(g), bufs, g.alpha, g.beta, bias, g.act, np.float32, g.bias_stride)
    np.testing.assert_allclose(got.reshape(ref(feeds).shape), ref(feeds), rtol=2e-3, atol=2e-3)


def test_horizontally_fused_linears_are_one_batched_call_with_a_bias_per_batch():
    """Linears sharing an input become one batched GEMM (horizontal fusion) with a [B, 1, N] bias:
    one cuBLASLt call with BIAS_BATCH_STRIDE = N."""
    from tools.bench_tactics import gemm_model as bench_model

    model, _ref = bench_model(32, 64, 16, "bias_gelu", 3)  # slabs of 256-byte multiples: fused
    for node in model.graph.node:  # every copy reads x0: the shape horizontal fusion takes
        if node.op_type == "MatMul":
            node.input[0] = "x0"
    del model.graph.input[1:]
    eng = _compile(model, tactics=["cublaslt"], extra={"tactics_force": True})
    (step,) = _vendor(eng)
    g = VendorGemm.from_json(step.vendor)
    assert (g.batch, g.bias_stride, g.a_stride) == (3, 64, 0)
    x = np.random.default_rng(2).standard_normal((32, 16)).astype(np.float16)
    bufs = {**{k: np.asarray(v, np.float32) for k, v in eng.weights.items()}, g.a: x.astype(np.float32)}
    got = emulate(lt_call(g), bufs, g.alpha, g.beta, bufs[g.bias], g.act, np.float32, g.bias_stride)
    from tools.bench_tactics import reference

    # the batched GEMM carries the bias; each GELU runs after the split, on its slab
    want = np.stack([reference(x, None, w, b, "bias") for _name, _x, w, b in _ref])
    np.testing.assert_allclose(got.reshape(want.shape), want, rtol=2e-3, atol=2e-3)


def test_erf_gelu_is_mapped_and_recorded_and_can_be_kept_off():
    model, _ref, _f = gemm_model(64, 96, 32, "bias_gelu_erf")
    eng = _compile(model, tactics=["cublaslt"], extra={"tactics_force": True})
    (step,) = _vendor(eng)
    assert step.vendor["gelu_from_erf"] and step.vendor["act"] == "gelu_tanh"
    assert eng.report["tactics"]["cublaslt"]["erf_gelu_as_tanh"] == 1
    off = _compile(model, tactics=["cublaslt"], extra={"tactics_force": True, "tactics_erf_gelu": False})
    assert not _vendor(off)


def test_erf_and_tanh_gelu_differ_by_less_than_half_an_fp16_ulp_at_one():
    from math import erf, pi, sqrt

    x = np.linspace(-10, 10, 200001)
    exact = 0.5 * x * (1 + np.vectorize(erf)(x / sqrt(2)))
    tanh = 0.5 * x * (1 + np.tanh(sqrt(2 / pi) * (x + 0.044715 * x**3)))
    assert np.abs(exact - tanh).max() < 4.8e-4 < float(np.spacing(np.float16(1))) / 2


def test_off_unless_named_and_unknown_tactics_refused():
    model, _ref, _f = gemm_model(64, 96, 32, "bias_gelu")
    assert not _vendor(_compile(model))
    with pytest.raises(CompileError, match="unknown tactic 'cudnn'"):
        _compile(model, tactics=["cudnn"])
    with pytest.raises(CompileError, match="cuda target"):
        graphc.compile(model, target="cpu", tactics=["cublaslt"])


def test_steps_cublaslt_cannot_run_exactly_stay_on_graphc_kernels():
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.ones((8, 16), np.float16), "W")
    nodes = [helper.make_node("MatMul", ["x", "W"], ["mm"]), helper.make_node("Sigmoid", ["mm"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [4, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [4, 16])], [w])  # fmt: skip
    eng = _compile(helper.make_model(g, opset_imports=[helper.make_opsetid("", 20)]), tactics=["cublaslt"],
                   extra={"tactics_force": True})  # fmt: skip
    assert not _vendor(eng) and all(s.launches for s in eng.plan.steps if not s.alias)


@pytest.fixture(scope="module")
def engine_path(tmp_path_factory):
    model, _ref, _f = gemm_model(33, 40, 24, "bias_res")
    eng = _compile(model, tactics=["cublaslt"], extra={"tactics_force": True})
    path = tmp_path_factory.mktemp("tactics") / "t.engine"
    eng.save(path)
    return path


def test_the_record_survives_save_and_validation(engine_path):
    ef = read_engine(engine_path)
    (step,) = [s for s in ef.plan.steps if s.vendor]
    assert step.vendor["library"] == "cublaslt" and step.vendor["c"] == "r" and step.vendor["beta"] == 1.0


def _edit_vendor(**kw):
    def edit(m):
        for s in m["plan"]["steps"]:
            if s.get("vendor"):
                s["vendor"].update(kw)

    return edit


@pytest.mark.parametrize(
    "change,match",
    [
        (dict(library="cudnn"), "schema"),
        (dict(act="sigmoid"), "schema"),
        (dict(k=25), "reads"),  # a K past the operands' bytes
        (dict(m=34), "reads|packed"),
        (dict(bias="r"), "bias"),
        (dict(d="r"), "writes"),
        (dict(a="W_unknown"), "not an input"),
    ],
)
def test_a_changed_record_is_refused(engine_path, tmp_path, change, match):
    refused(rewrite(engine_path, tmp_path / "bad.engine", _edit_vendor(**change)), match)


def test_a_vendor_step_with_a_workspace_of_graphc_is_refused(engine_path, tmp_path):
    def edit(m):
        m["memory"]["workspace_bytes"] = 256
        for s in m["plan"]["steps"]:
            if s.get("vendor"):
                s["workspace_bytes"] = 256

    refused(rewrite(engine_path, tmp_path / "bad.engine", edit), "also has launches or a workspace")


def test_a_missing_nvmath_is_one_line_naming_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "nvmath", None)
    monkeypatch.setitem(sys.modules, "nvmath.bindings", None)
    with pytest.raises(EngineError) as e:
        import_cublaslt(3)
    msg = str(e.value)
    assert "\n" not in msg and "3 GEMM step(s)" in msg and "cuBLASLt" in msg and "pip install" in msg
    assert "nvmath-python" in msg


def test_graphc_import_does_not_import_nvmath():
    import subprocess

    code = "import graphc, graphc.runtime, sys; graphc.compile; print('nvmath' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_the_c_enum_values_are_nvmaths():
    lt = pytest.importorskip("nvmath.bindings.cublasLt")
    from nvmath.bindings import cublas

    from graphc.runtime import tactics_cublaslt as t

    names = {("none", False): "DEFAULT", ("relu", False): "RELU", ("none", True): "BIAS",
             ("relu", True): "RELU_BIAS", ("gelu_tanh", False): "GELU", ("gelu_tanh", True): "GELU_BIAS"}  # fmt: skip
    assert {k: getattr(lt.Epilogue, v).value for k, v in names.items()} == t._EPILOGUE
    assert cublas.ComputeType.COMPUTE_32F.value == t._COMPUTE_32F
    assert (cublas.Operation.N.value, cublas.Operation.T.value) == (t._OP_N, t._OP_T)


def test_inspect_lists_the_vendor_steps(engine_path):
    from graphc.inspect import describe_engine

    text = describe_engine(read_engine(engine_path), "t.engine")
    assert "1 cuBLASLt calls (vendor tactic)" in text
    assert "vendor cublaslt: 1 x 33x40x24 act none, bias b, C r (beta 1.0)" in text


@pytest.mark.parametrize(
    "m,n,k,b_trans,vendor",
    [
        (4096, 3072, 768, False, True),  # BERT-base FFN1 at batch 32: graphc 0.89x cuBLAS
        (6304, 768, 3072, False, True),
        (1024, 768, 768, False, True),
        (128, 768, 768, False, True),  # batch 1, K = 768: graphc 0.86x
        (197, 3072, 768, False, True),
        (128, 768, 3072, False, False),  # batch 1, K = 3072: graphc's split-K as fast
        (197, 768, 3072, False, False),
        (128, 50257, 768, True, False),  # GPT-2's lm_head over a B stored [N, K]: graphc 5x
        (128, 50257, 768, False, True),  # the same over B [K, N]: cuBLAS 1.4x
        (1024, 50257, 768, True, False),  # at batch 8 too: cuBLASLt 0.18x in the engine
        (4096, 50257, 768, True, False),
    ],
)
def test_the_rule(m, n, k, b_trans, vendor):
    from graphc.codegen.families.gemm_tactics import prefer_vendor

    assert prefer_vendor(VendorGemm(m=m, n=n, k=k, a="a", b="b", d="d", b_trans=b_trans)) is vendor


def test_the_rule_decides_without_force():
    # K = 3072 at M = 64: graphc's kernels; K = 768: cuBLASLt
    m1, _r, _f = gemm_model(64, 96, 3072, "bias_res")
    m2, _r, _f = gemm_model(64, 96, 768, "bias_res")
    assert not _vendor(_compile(m1, tactics=["cublaslt"]))
    assert len(_vendor(_compile(m2, tactics=["cublaslt"]))) == 1


def test_the_cli_flag(tmp_path, capsys):
    import onnx

    from graphc.cli import main

    model, _r, _f = gemm_model(64, 96, 768, "bias_gelu")
    src = tmp_path / "m.onnx"
    onnx.save(model, src)
    out = tmp_path / "m.engine"
    argv = ["compile", str(src), "-o", str(out), "--target", "cuda", "--precision", "fp16", "--arch", "sm_90", "-q"]
    assert main([*argv, "--tactics", "cublaslt"]) == 0
    assert [s.vendor["act"] for s in read_engine(out).plan.steps if s.vendor] == ["gelu_tanh"]
    capsys.readouterr()
    assert main([*argv, "--tactics", "cudnn"]) != 0
    err = [ln for ln in capsys.readouterr().err.splitlines() if "error" in ln]
    assert len(err) == 1 and "unknown tactic 'cudnn'" in err[0]
    assert main(["compile", str(src), "-o", str(out), "--target", "cpu", "--tactics", "cublaslt", "-q"]) != 0
    assert "--tactics" in capsys.readouterr().err
