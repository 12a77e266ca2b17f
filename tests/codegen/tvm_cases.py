"""One-node models of every op (and form) whose CUDA kernel apache-tvm writes (the tvm family,
codegen/families/tvm_kernels.py), with seeded feeds: shared by tests/codegen/test_tvm_kernels.py,
its GPU test, and tools/tvm_gpu_check.py (which builds them into engines for the H200)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx

from helpers import make_node_model

Case = tuple[onnx.ModelProto, dict[str, np.ndarray]]


def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def scatter_elements(reduction: str, axis: int, dtype=np.float32) -> Case:
    r = _rng(1)
    data = r.standard_normal((5, 6)).astype(dtype) if dtype == np.float32 else r.integers(-9, 9, (5, 6)).astype(dtype)
    ishape = (3, 6) if axis == 0 else (5, 4)
    # duplicates on purpose (the reductions combine them), and negative indices
    idx = r.integers(-(5 if axis == 0 else 6), 5 if axis == 0 else 6, ishape).astype(np.int64)
    upd = (r.standard_normal(ishape) if dtype == np.float32 else r.integers(-5, 5, ishape)).astype(dtype)
    m = make_node_model(
        "ScatterElements", {"data": data, "indices": idx, "updates": upd}, {"axis": axis, "reduction": reduction}
    )
    return m, {"data": data, "indices": idx, "updates": upd}


def scatter_nd(reduction: str, k: int) -> Case:
    r = _rng(2)
    data = r.standard_normal((4, 3, 5)).astype(np.float32)
    rows = 6
    dims = data.shape[:k]
    idx = np.stack([r.integers(0, d, rows) for d in dims], axis=-1).reshape(2, 3, k).astype(np.int64)
    upd = r.standard_normal((2, 3, *data.shape[k:])).astype(np.float32)
    m = make_node_model("ScatterND", {"data": data, "indices": idx, "updates": upd}, {"reduction": reduction})
    return m, {"data": data, "indices": idx, "updates": upd}


def dft(shape, axis: int, inverse: int = 0, onesided: int = 0, length: int | None = None) -> Case:
    x = _rng(4).standard_normal(shape).astype(np.float32)
    inits = {"axis": np.array(axis, np.int64)}
    order = ["x", "dft_length" if length is not None else "", "axis"]
    if length is not None:
        inits["dft_length"] = np.array(length, np.int64)
    m = make_node_model(
        "DFT", {"x": x}, {"inverse": inverse, "onesided": onesided}, initializers=inits, input_order=order, opset=20
    )
    return m, {"x": x}


def stft(window: bool, onesided: int, complex_in: bool = False, length: int | None = None) -> Case:
    r = _rng(5)
    x = r.standard_normal((2, 40, 2 if complex_in else 1)).astype(np.float32)
    inits = {"step": np.array(6, np.int64)}
    ins = {"x": x}
    order = ["x", "step", "", ""]
    if window:
        ins["w"] = (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(12) / 12)).astype(np.float32)
        order[2] = "w"
    if length is not None:
        inits["fl"] = np.array(length, np.int64)
        order[3] = "fl"
    m = make_node_model("STFT", ins, {"onesided": onesided}, initializers=inits, input_order=order, opset=17)
    return m, dict(ins)


def reverse_sequence(batch_axis: int, time_axis: int, dtype=np.float32) -> Case:
    r = _rng(6)
    shape = (4, 6, 3) if batch_axis == 0 else (6, 4, 3)
    x = r.standard_normal(shape).astype(dtype)
    lens = np.array([1, 6, 3, 0], np.int64)
    m = make_node_model("ReverseSequence", {"x": x, "lens": lens}, {"batch_axis": batch_axis, "time_axis": time_axis})
    return m, {"x": x, "lens": lens}


def mvn(axes: list[int], shape=(2, 3, 4, 5)) -> Case:
    x = (_rng(7).standard_normal(shape) * 3 + 1).astype(np.float32)
    return make_node_model("MeanVarianceNormalization", {"x": x}, {"axes": axes}), {"x": x}


def max_unpool() -> Case:
    r = _rng(8)
    x = r.standard_normal((2, 3, 2, 3)).astype(np.float32)
    # distinct flat positions in a [2, 3, 4, 6] output (kernel 2, stride 2), as MaxPool would give
    out = 2 * 3 * 4 * 6
    idx = r.choice(out, size=x.size, replace=False).reshape(x.shape).astype(np.int64)
    m = make_node_model("MaxUnpool", {"x": x, "i": idx}, {"kernel_shape": [2, 2], "strides": [2, 2]})
    return m, {"x": x, "i": idx}


def loss(op: str, reduction: str, weight: bool, ignore: int | None, log_prob: bool = False) -> Case:
    r = _rng(9)
    x = r.standard_normal((3, 5, 4)).astype(np.float32)
    if op == "NegativeLogLikelihoodLoss":
        x = x - np.log(np.exp(x).sum(axis=1, keepdims=True))  # log-probabilities
    t = r.integers(0, 5, (3, 4)).astype(np.int64)
    if ignore is not None:
        t[0, 1] = t[2, 3] = ignore
    ins = {"x": x, "t": t}
    if weight:
        ins["w"] = r.uniform(0.5, 2, 5).astype(np.float32)
    attrs = {"reduction": reduction, **({"ignore_index": ignore} if ignore is not None else {})}
    outputs = ("loss", "logp") if log_prob else ("loss",)
    return make_node_model(op, ins, attrs, outputs=outputs, opset=13), dict(ins)


def bit_shift(direction: str, dtype, b_shape=(3, 4)) -> Case:
    r = _rng(10)
    info = np.iinfo(dtype)
    a = r.integers(info.min, info.max, (3, 4), dtype=dtype, endpoint=True)
    bits = np.dtype(dtype).itemsize * 8
    # in range, the width and past it, and (signed) negative amounts
    low = -3 if info.min < 0 else 0
    b = r.integers(low, bits + 3, b_shape).astype(dtype)
    m = make_node_model("BitShift", {"a": a, "b": b}, {"direction": direction})
    return m, {"a": a, "b": b}


def bit_cast(src, dst) -> Case:
    x = _rng(11).standard_normal((3, 5)).astype(src)
    return make_node_model("BitCast", {"x": x}, {"to": helper_dtype(dst)}), {"x": x}


def helper_dtype(dt) -> int:
    from onnx import helper

    return helper.np_dtype_to_tensor_dtype(np.dtype(dt))


def det(shape) -> Case:
    x = _rng(12).standard_normal(shape).astype(np.float32)
    x[..., 0, :] *= 0.01  # a small first row: pivoting matters
    if len(shape) > 2:
        x[0, 1] = x[0, 0]  # a singular matrix (two equal rows): det 0
    return make_node_model("Det", {"x": x}), {"x": x}


CASES: dict[str, Callable[[], Case]] = {
    "scatter_elements_mul_axis0": lambda: scatter_elements("mul", 0),
    "scatter_elements_max_axis1": lambda: scatter_elements("max", 1),
    "scatter_elements_min_axis1": lambda: scatter_elements("min", 1),
    "scatter_elements_add_int8": lambda: scatter_elements("add", 0, np.int8),
    "scatter_nd_mul_k1": lambda: scatter_nd("mul", 1),
    "scatter_nd_max_k2": lambda: scatter_nd("max", 2),
    "scatter_nd_min_k2": lambda: scatter_nd("min", 2),
    "dft_real": lambda: dft((2, 16, 1), 1),
    "dft_complex_axis0": lambda: dft((12, 3, 2), 0),
    "dft_onesided": lambda: dft((3, 10, 1), 1, onesided=1),
    "dft_inverse": lambda: dft((2, 9, 2), 1, inverse=1),
    "dft_irfft": lambda: dft((2, 6, 2), 1, inverse=1, onesided=1),
    "dft_length_pad": lambda: dft((2, 7, 1), 1, length=12),
    "dft_length_trunc": lambda: dft((2, 16, 2), 1, length=10),
    "stft_window_onesided": lambda: stft(True, 1),
    "stft_window_full": lambda: stft(True, 0),
    "stft_complex_length": lambda: stft(False, 0, complex_in=True, length=8),
    "reverse_sequence_batch0": lambda: reverse_sequence(0, 1),
    "reverse_sequence_time0": lambda: reverse_sequence(1, 0),
    "reverse_sequence_float16_bits": lambda: reverse_sequence(0, 1, np.float16),
    "mvn_default_axes": lambda: mvn([0, 2, 3]),
    "mvn_last_axis": lambda: mvn([-1]),
    "max_unpool_2d": max_unpool,
    "nll_none": lambda: loss("NegativeLogLikelihoodLoss", "none", False, None),
    "nll_mean_weight_ignore": lambda: loss("NegativeLogLikelihoodLoss", "mean", True, 4),
    "nll_sum": lambda: loss("NegativeLogLikelihoodLoss", "sum", False, None),
    "sce_mean": lambda: loss("SoftmaxCrossEntropyLoss", "mean", False, None),
    "sce_none_weight_ignore_logp": lambda: loss("SoftmaxCrossEntropyLoss", "none", True, 0, log_prob=True),
    "sce_sum_logp": lambda: loss("SoftmaxCrossEntropyLoss", "sum", False, -1, log_prob=True),
    "bit_shift_left_uint8": lambda: bit_shift("LEFT", np.uint8),
    "bit_shift_right_uint64_broadcast": lambda: bit_shift("RIGHT", np.uint64, (4,)),
    "bit_shift_left_int16": lambda: bit_shift("LEFT", np.int16),
    "bit_shift_right_int32": lambda: bit_shift("RIGHT", np.int32),
    "bit_cast_f32_i32": lambda: bit_cast(np.float32, np.int32),
    "det_2d": lambda: det((5, 5)),
    "det_batched": lambda: det((3, 4, 4)),
}
