"""Normalization ops against ONNX Runtime, and against numpy formulas where ORT has no kernel."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

from graphc.errors import ShapeError, UnsupportedOpError
from helpers import assert_close, check_against_ort, make_node_model, rand, run_graphc, run_ort

FLOATS = [np.float32, np.float16, np.float64]


def _typed_outputs(model: onnx.ModelProto, outputs: dict[str, tuple[np.dtype, tuple]]) -> onnx.ModelProto:
    """Set output types ONNX shape inference leaves out (context-dependent functions)."""
    for vi in model.graph.output:
        dt, shape = outputs[vi.name]
        vi.CopyFrom(helper.make_tensor_value_info(vi.name, helper.np_dtype_to_tensor_dtype(np.dtype(dt)), shape))
    return model


def _np_normalize(x: np.ndarray, axes: tuple[int, ...], eps: float) -> np.ndarray:
    eps = float(np.float32(eps))  # ONNX float attributes are float32
    x = x.astype(np.float64)
    mean = x.mean(axis=axes, keepdims=True)
    var = x.var(axis=axes, keepdims=True)
    return (x - mean) / np.sqrt(var + eps)


# ---- BatchNormalization ------------------------------------------------------------------------


def _bn_inputs(shape, dtype, stat_dtype=None, seed=0):
    c = shape[1]
    sd = stat_dtype or dtype
    return {
        "x": rand(shape, dtype, seed=seed),
        "scale": rand((c,), sd, seed=seed + 1),
        "B": rand((c,), sd, seed=seed + 2),
        "mean": rand((c,), sd, seed=seed + 3),
        "var": rand((c,), sd, seed=seed + 4, low=0.1, high=2.0),
    }


@pytest.mark.parametrize("shape", [(2, 3), (2, 3, 5), (1, 4, 3, 5), (2, 3, 2, 1, 3)])
@pytest.mark.parametrize("dtype", FLOATS)
def test_batchnorm_inference(shape, dtype):
    check_against_ort("BatchNormalization", _bn_inputs(shape, dtype), {"epsilon": 1e-3})


def test_batchnorm_mixed_types():
    # Opset 15: X float16 with float32 scale/bias/statistics.
    check_against_ort("BatchNormalization", _bn_inputs((2, 3, 4), np.float16, np.float32))


@pytest.mark.parametrize("shape", [(4, 3), (2, 3, 5), (2, 2, 3, 3)])
def test_batchnorm_training_mode(shape):
    ins = _bn_inputs(shape, np.float32, seed=5)
    got = check_against_ort(
        "BatchNormalization", ins, {"training_mode": 1, "momentum": 0.8}, outputs=["y", "rmean", "rvar"]
    )
    axes = (0, *range(2, len(shape)))
    cur_mean, cur_var = ins["x"].mean(axis=axes), ins["x"].var(axis=axes)
    assert_close(got["rmean"], (ins["mean"] * 0.8 + cur_mean * 0.2).astype(np.float32), rtol=1e-5)
    assert_close(got["rvar"], (ins["var"] * 0.8 + cur_var * 0.2).astype(np.float32), rtol=1e-5)


def test_batchnorm_training_mode_y_only():
    ins = _bn_inputs((3, 2, 4), np.float64, seed=6)
    model = make_node_model("BatchNormalization", ins, {"training_mode": 1})
    got = run_graphc(_typed_outputs(model, {"y": (np.float64, (3, 2, 4))}), ins)["y"]
    s = ins["scale"][:, None]
    b = ins["B"][:, None]
    assert_close(got, _np_normalize(ins["x"], (0, 2), 1e-5) * s + b)


@pytest.mark.parametrize("opset", [7, 9, 14])
def test_batchnorm_older_opsets(opset):
    check_against_ort("BatchNormalization", _bn_inputs((2, 3, 4), np.float32, seed=7), opset=opset)


def test_batchnorm_opset6_is_test():
    ins = _bn_inputs((2, 3, 4), np.float32, seed=8)
    got = run_graphc(make_node_model("BatchNormalization", ins, {"is_test": 1}, opset=6), ins)["y"]
    want = (ins["x"] - ins["mean"][:, None]) / np.sqrt(ins["var"][:, None] + 1e-5)
    assert_close(got, (want * ins["scale"][:, None] + ins["B"][:, None]).astype(np.float32))


def test_batchnorm_opset7_spatial0():
    # Per-feature statistics of shape X.shape[1:].
    x = rand((3, 2, 4), seed=9)
    params = {k: rand((2, 4), seed=i) for i, k in enumerate(("scale", "B", "mean"))}
    params["var"] = rand((2, 4), seed=5, low=0.1, high=2.0)
    check_against_ort("BatchNormalization", {"x": x, **params}, {"spatial": 0}, opset=7)


def test_batchnorm_old_training_forms_refused():
    ins = _bn_inputs((2, 3, 4), np.float32)
    outs = ["y", "m", "v", "saved_m", "saved_v"]
    m = make_node_model("BatchNormalization", ins, {}, outputs=outs, opset=9)
    m = _typed_outputs(m, {k: (np.float32, (2, 3, 4) if k == "y" else (3,)) for k in outs})
    with pytest.raises(UnsupportedOpError, match="training-mode outputs"):
        run_graphc(m, ins)
    m = _typed_outputs(
        make_node_model("BatchNormalization", ins, {"is_test": 0}, opset=6), {"y": (np.float32, (2, 3, 4))}
    )
    with pytest.raises(UnsupportedOpError, match="is_test=0"):
        run_graphc(m, ins)


def test_batchnorm_bad_inputs():
    ins = _bn_inputs((2, 3, 4), np.float32)
    ins["scale"] = rand((4,))
    with pytest.raises(ShapeError, match="BatchNormalization node .*scale has 4 elements"):
        run_graphc(_typed_outputs(make_node_model("BatchNormalization", ins), {"y": (np.float32, (2, 3, 4))}), ins)


# ---- InstanceNormalization ---------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(2, 3, 5), (1, 4, 3, 5), (3, 2, 1), (2, 3, 2, 2, 3)])
@pytest.mark.parametrize("dtype", FLOATS)
def test_instancenorm(shape, dtype):
    c = shape[1]
    ins = {"x": rand(shape, dtype), "s": rand((c,), dtype, seed=1), "b": rand((c,), dtype, seed=2)}
    if dtype == np.float64:  # no ORT kernel
        got = run_graphc(make_node_model("InstanceNormalization", ins, {"epsilon": 1e-2}), ins)["y"]
        view = (-1,) + (1,) * (len(shape) - 2)
        norm = _np_normalize(ins["x"], tuple(range(2, len(shape))), 1e-2)
        assert_close(got, norm * ins["s"].reshape(view) + ins["b"].reshape(view))
        return
    check_against_ort("InstanceNormalization", ins, {"epsilon": 1e-2})


def test_instancenorm_opset6():
    ins = {"x": rand((2, 3, 7)), "s": rand((3,), seed=1), "b": rand((3,), seed=2)}
    check_against_ort("InstanceNormalization", ins, opset=6)


# ---- GroupNormalization ------------------------------------------------------------------------


def _gn_numpy(x, scale, bias, groups, eps):
    n, c = x.shape[:2]
    y = _np_normalize(x.reshape(n, groups, -1), (2,), eps).reshape(x.shape)
    view = (-1,) + (1,) * (x.ndim - 2)
    return y * scale.reshape(view) + bias.reshape(view)


@pytest.mark.parametrize("shape,groups", [((2, 6, 5), 3), ((1, 4, 3, 3), 2), ((3, 6), 6), ((2, 5, 7), 1)])
@pytest.mark.parametrize("dtype", FLOATS)
def test_groupnorm(shape, groups, dtype):
    c = shape[1]
    ins = {"x": rand(shape, dtype), "s": rand((c,), dtype, seed=1), "b": rand((c,), dtype, seed=2)}
    model = make_node_model("GroupNormalization", ins, {"num_groups": groups, "epsilon": 1e-3}, opset=21)
    model = _typed_outputs(model, {"y": (dtype, shape)})
    got = run_graphc(model, ins)["y"]
    want = _gn_numpy(*(ins[k].astype(np.float64) for k in "xsb"), groups, 1e-3).astype(dtype)
    assert_close(got, want)
    if dtype == np.float32:
        assert_close(got, run_ort(model, ins)["y"])


@pytest.fixture
def allow_deprecated_ops(monkeypatch):
    """The ONNX checker refuses GroupNormalization at opsets 18-20 (deprecated there), though
    such models exist and ONNX Runtime runs them; let the converter be tested past it."""
    real = onnx.checker.check_model

    def check(model, *args, **kw):
        try:
            real(model, *args, **kw)
        except onnx.checker.ValidationError as e:
            if "deprecated" not in str(e):
                raise

    monkeypatch.setattr(onnx.checker, "check_model", check)


@pytest.mark.parametrize("constant_params", [True, False])
def test_groupnorm_opset18_per_group_params(allow_deprecated_ops, constant_params):
    x = rand((2, 6, 5), seed=3)
    s, b = rand((3,), seed=4), rand((3,), seed=5)
    if constant_params:
        model = make_node_model(
            "GroupNormalization", {"x": x}, {"num_groups": 3}, initializers={"s": s, "b": b}, opset=18
        )
        feeds = {"x": x}
    else:
        model = make_node_model("GroupNormalization", {"x": x, "s": s, "b": b}, {"num_groups": 3}, opset=18)
        feeds = {"x": x, "s": s, "b": b}
    model = _typed_outputs(model, {"y": (np.float32, x.shape)})
    got = run_graphc(model, feeds)["y"]
    want = _gn_numpy(x, np.repeat(s, 2), np.repeat(b, 2), 3, 1e-5).astype(np.float32)
    assert_close(got, want)
    assert_close(got, run_ort(model, feeds)["y"])


def test_groupnorm_groups_must_divide_channels():
    ins = {"x": rand((2, 6, 5)), "s": rand((6,)), "b": rand((6,))}
    model = _typed_outputs(
        make_node_model("GroupNormalization", ins, {"num_groups": 4}, opset=21), {"y": (np.float32, (2, 6, 5))}
    )
    with pytest.raises(ShapeError, match="GroupNormalization node .*num_groups=4"):
        run_graphc(model, ins)


# ---- LayerNormalization ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "shape,axis", [((3, 5), -1), ((2, 3, 7), -1), ((2, 3, 7), 1), ((2, 3, 7), 0), ((2, 1, 4, 3), -2), ((9,), 0)]
)
@pytest.mark.parametrize("dtype", FLOATS)
def test_layernorm(shape, axis, dtype):
    norm_shape = shape[axis:]
    ins = {"x": rand(shape, dtype), "s": rand(norm_shape, dtype, seed=1), "b": rand(norm_shape, dtype, seed=2)}
    got = check_against_ort("LayerNormalization", ins, {"axis": axis, "epsilon": 1e-3}, outputs=["y", "mean", "istd"])
    # Mean and InvStdDev are float32 (stash_type=1) whatever X is.
    assert got["mean"].dtype == np.float32 and got["istd"].dtype == np.float32


@pytest.mark.parametrize("dtype", FLOATS)
def test_layernorm_no_bias_one_output(dtype):
    ins = {"x": rand((4, 6), dtype, seed=3), "s": rand((6,), dtype, seed=4)}
    check_against_ort("LayerNormalization", ins)


def test_layernorm_broadcast_scale():
    # Scale broadcasts to the normalized dims (unidirectional broadcasting).
    ins = {"x": rand((2, 3, 4)), "s": rand((1, 4), seed=1), "b": rand((4,), seed=2)}
    check_against_ort("LayerNormalization", ins, {"axis": 1})


def test_layernorm_float16_large_values():
    # x*x of 300 overflows float16; statistics in float32 do not.
    x = (rand((2, 8), np.float16, seed=5) * 150 + 300).astype(np.float16)
    ins = {"x": x, "s": np.ones((8,), np.float16)}
    got = run_graphc(make_node_model("LayerNormalization", ins), ins)["y"]
    assert np.isfinite(got).all()
    assert_close(got, _np_normalize(x, (1,), 1e-5).astype(np.float16))


def test_layernorm_stash_type_double():
    ins = {"x": rand((3, 5), np.float32), "s": rand((5,), seed=1)}
    model = make_node_model("LayerNormalization", ins, {"stash_type": 11}, outputs=["y", "mean", "istd"])
    got = run_graphc(model, ins)
    assert got["mean"].dtype == np.float64 and got["istd"].dtype == np.float64
    assert_close(got["mean"], ins["x"].astype(np.float64).mean(axis=1, keepdims=True))


def test_layernorm_bad_scale():
    ins = {"x": rand((2, 3, 4)), "s": rand((3,))}
    with pytest.raises(ShapeError, match="LayerNormalization node .*Scale"):
        run_graphc(_typed_outputs(make_node_model("LayerNormalization", ins), {"y": (np.float32, (2, 3, 4))}), ins)


# ---- RMSNormalization --------------------------------------------------------------------------


@pytest.mark.parametrize("shape,axis", [((3, 5), -1), ((2, 3, 7), 1), ((2, 3, 7), -3), ((9,), 0)])
@pytest.mark.parametrize("dtype", FLOATS)
def test_rmsnorm(shape, axis, dtype):
    ins = {"x": rand(shape, dtype), "s": rand(shape[axis:], dtype, seed=1)}
    check_against_ort("RMSNormalization", ins, {"axis": axis, "epsilon": 1e-4}, opset=23)


# ---- LpNormalization ---------------------------------------------------------------------------


@pytest.mark.parametrize("p", [1, 2])
@pytest.mark.parametrize("shape,axis", [((3, 5), -1), ((2, 3, 7), 1), ((2, 3, 7), 0), ((6,), 0)])
@pytest.mark.parametrize("dtype", FLOATS)
def test_lpnorm(p, shape, axis, dtype):
    check_against_ort("LpNormalization", {"x": rand(shape, dtype)}, {"p": p, "axis": axis})


def test_lpnorm_default_and_opset1():
    x = rand((3, 4), seed=2)
    check_against_ort("LpNormalization", {"x": x})
    check_against_ort("LpNormalization", {"x": x}, {"axis": 0}, opset=1)


@pytest.mark.parametrize("p", [1, 2])
def test_lpnorm_zero_norm_gives_zero(p):
    x = np.array([[0.0, 0.0, 0.0], [3.0, -4.0, 0.0]], dtype=np.float32)
    got = run_graphc(make_node_model("LpNormalization", {"x": x}, {"p": p}), {"x": x})["y"]
    norm = np.abs(x).sum(axis=1, keepdims=True) if p == 1 else np.sqrt((x * x).sum(axis=1, keepdims=True))
    want = np.where(norm == 0, 0, x / np.where(norm == 0, 1, norm)).astype(np.float32)
    assert_close(got, want)


def test_lpnorm_p3_refused():
    x = rand((2, 3))
    model = _typed_outputs(make_node_model("LpNormalization", {"x": x}, {"p": 3}), {"y": (np.float32, (2, 3))})
    with pytest.raises(ShapeError, match="LpNormalization node .*p=3"):
        run_graphc(model, {"x": x})


# ---- MeanVarianceNormalization -----------------------------------------------------------------


@pytest.mark.parametrize(
    "shape,axes", [((2, 3, 4, 5), None), ((2, 3, 4, 5), [0, 1, 2, 3]), ((3, 7), [1]), ((2, 3, 5), [-1, 0])]
)
@pytest.mark.parametrize("dtype", FLOATS)
def test_mvn(shape, axes, dtype):
    x = rand(shape, dtype, seed=4)
    attrs = {} if axes is None else {"axes": axes}
    model = _typed_outputs(make_node_model("MeanVarianceNormalization", {"x": x}, attrs), {"y": (dtype, shape)})
    if dtype == np.float64:  # no ORT kernel
        got = run_graphc(model, {"x": x})["y"]
        ax = tuple(a % len(shape) for a in (axes or [0, 2, 3]))
        want = (x - x.mean(axis=ax, keepdims=True)) / (x.std(axis=ax, keepdims=True) + 1e-9)
        assert_close(got, want)
        return
    assert_close(run_graphc(model, {"x": x})["y"], run_ort(model, {"x": x})["y"])


def test_mvn_opset9():
    x = rand((2, 3, 4, 2), seed=5)
    model = _typed_outputs(
        make_node_model("MeanVarianceNormalization", {"x": x}, opset=9), {"y": (np.float32, x.shape)}
    )
    assert_close(run_graphc(model, {"x": x})["y"], run_ort(model, {"x": x})["y"])


def test_mvn_constant_input_is_zero_not_nan():
    x = np.full((2, 3, 2, 2), 0.7, dtype=np.float32)
    model = _typed_outputs(make_node_model("MeanVarianceNormalization", {"x": x}), {"y": (np.float32, x.shape)})
    got = run_graphc(model, {"x": x})["y"]
    np.testing.assert_array_equal(got, np.zeros_like(x))


# ---- bfloat16 ----------------------------------------------------------------------------------


@pytest.mark.parametrize("op", ["LayerNormalization", "RMSNormalization", "InstanceNormalization"])
def test_bfloat16_matches_float32(op):
    import ml_dtypes

    bf16 = ml_dtypes.bfloat16
    x32 = rand((2, 3, 8), seed=6)
    s32 = rand((8,) if op != "InstanceNormalization" else (3,), seed=7)
    ins32 = {"x": x32, "s": s32}
    if op == "InstanceNormalization":
        ins32["b"] = rand((3,), seed=8)
    ins = {k: v.astype(bf16).astype(np.float32) for k, v in ins32.items()}
    model = make_node_model(op, ins, {}, opset=23)
    want = run_graphc(model, ins)["y"].astype(bf16)
    for vi in list(model.graph.input) + list(model.graph.output):
        vi.type.tensor_type.elem_type = onnx.TensorProto.BFLOAT16
    got = run_graphc(model, {k: v.astype(bf16) for k, v in ins.items()})["y"]
    assert got.dtype == bf16
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=1e-2, atol=1e-2)
