"""Shared test helpers: one-node ONNX models, ONNX Runtime as the oracle, tolerance tables."""

from __future__ import annotations

import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import graphc
from models.mlp import residual_mlp_model  # noqa: F401  (tests import it from here)

# Tolerances per dtype for comparing graphc's reference with ONNX Runtime or numpy. Tight
# enough to catch a wrong formula: fp32 at 1e-5 relative, not the 1e-1 that hides bugs.
TOLERANCE: dict[np.dtype, tuple[float, float]] = {
    np.dtype(np.float64): (1e-10, 1e-12),
    np.dtype(np.float32): (1e-5, 1e-6),
    np.dtype(np.float16): (2e-3, 1e-3),
}

ONNX_OPSET = onnx.defs.onnx_opset_version()


def np_to_onnx_dtype(dt: np.dtype) -> int:
    return helper.np_dtype_to_tensor_dtype(np.dtype(dt))


def make_node_model(
    op_type: str,
    inputs: Mapping[str, np.ndarray],
    attrs: Mapping[str, Any] | None = None,
    *,
    outputs: Sequence[str] = ("y",),
    initializers: Mapping[str, np.ndarray] | None = None,
    opset: int | None = None,
    input_order: Sequence[str] | None = None,
    domain: str = "",
) -> onnx.ModelProto:
    """A model of one node. `inputs` are graph inputs; `initializers` are constants (both are
    node inputs in the order of `input_order`, default inputs then initializers). An empty name
    in `input_order` is an omitted optional input."""
    initializers = dict(initializers or {})
    order = list(input_order) if input_order is not None else [*inputs, *initializers]
    node = helper.make_node(op_type, order, list(outputs), domain=domain, **(attrs or {}))
    g_inputs = [helper.make_tensor_value_info(k, np_to_onnx_dtype(v.dtype), v.shape) for k, v in inputs.items()]
    g_outputs = [helper.make_tensor_value_info(o, TensorProto.UNDEFINED, None) for o in outputs if o]
    inits = [numpy_helper.from_array(np.asarray(v), k) for k, v in initializers.items()]
    graph = helper.make_graph([node], f"test_{op_type}", g_inputs, g_outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(domain, opset or ONNX_OPSET)])
    model.ir_version = min(model.ir_version, 10)
    # Let ONNX fill in the output types so ORT accepts the model.
    return onnx.shape_inference.infer_shapes(model)


def run_ort(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.log_severity_level = 3
    opts.intra_op_num_threads = 1  # tiny test models: thread start-up costs more than it saves
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, dict(feeds)), strict=True))


def run_graphc(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    graph = graphc.load_onnx(model)
    return graphc.interpret(graph, feeds)


def assert_close(
    actual: np.ndarray,
    expected: np.ndarray,
    *,
    rtol: float | None = None,
    atol: float | None = None,
    what: str = "",
) -> None:
    actual = np.asarray(actual)
    expected = np.asarray(expected)
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype} != {expected.dtype}"
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    if actual.dtype.itemsize == 1 and actual.dtype.kind == "V" or actual.dtype.name.startswith("float8"):
        # 1-byte ml_dtypes floats: compare as float32 (NaNs equal)
        actual, expected = actual.astype(np.float32), expected.astype(np.float32)
    if actual.dtype.kind in "fc" or actual.dtype.name in ("bfloat16",):
        r, a = TOLERANCE.get(actual.dtype, (1e-2, 1e-2))
        np.testing.assert_allclose(
            actual.astype(np.float64),
            expected.astype(np.float64),
            rtol=r if rtol is None else rtol,
            atol=a if atol is None else atol,
            equal_nan=True,
            err_msg=what,
        )
    else:
        np.testing.assert_array_equal(actual, expected, err_msg=what)


def check_against_ort(
    op_type: str,
    inputs: Mapping[str, np.ndarray],
    attrs: Mapping[str, Any] | None = None,
    *,
    rtol: float | None = None,
    atol: float | None = None,
    **kw: Any,
) -> dict[str, np.ndarray]:
    """Build a one-node model, run it through ORT and graphc, compare every output."""
    model = make_node_model(op_type, inputs, attrs, **kw)
    expected = run_ort(model, inputs)
    actual = run_graphc(model, inputs)
    assert set(actual) == set(expected), f"outputs {sorted(actual)} != {sorted(expected)}"
    for k in expected:
        assert_close(actual[k], expected[k], rtol=rtol, atol=atol, what=f"{op_type} output {k}")
    return actual


def rand(
    shape: Sequence[int], dtype: Any = np.float32, *, seed: int = 0, low: float = -2.0, high: float = 2.0
) -> np.ndarray:
    rng = np.random.default_rng(seed)
    dt = np.dtype(dtype)
    if dt == np.bool_:
        return np.asarray(rng.random(shape) < 0.5)
    if dt.kind in "iu":
        lo = max(int(low), np.iinfo(dt).min)
        return np.asarray(rng.integers(lo, max(int(high), lo + 1) + 1, size=shape).astype(dt))
    return np.asarray(rng.uniform(low, high, size=shape).astype(dt))


# ONNX Runtime's CPU kernels for uint8 x int8 products on x86 with AVX2 but no VNNI sum pairs of
# products in saturating int16 (vpmaddubsw): |a0*b0 + a1*b1| reaches 2*255*128 > 32767 with 8-bit
# int8 operands, and ORT's result is then not the exact integer sum graphc computes (the tests that
# compare with ORT failed on such a CPU only). ORT's quantizer writes 7-bit weights on x86
# (reduce_range) for that reason; references from ORT take int8 weights in that range.
INT8_EXACT_LO, INT8_EXACT_HI = -64, 64  # [lo, hi): pairs of products fit in int16


def int8_weights(rng: np.random.Generator, shape: Sequence[int]) -> np.ndarray:
    """int8 values ORT multiplies exactly by uint8 on every x86 CPU (see INT8_EXACT_LO)."""
    return rng.integers(INT8_EXACT_LO, INT8_EXACT_HI, shape).astype(np.int8)


def quantize_zoo_model(name: str, folder) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """A tiny zoo model quantized by ONNX Runtime's tool (tools/check_quantized.py quantize_qdq: QDQ
    format, uint8 activations calibrated on three batches, per-channel int8 weights), and inputs."""
    import sys
    from pathlib import Path

    import models

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
    from check_quantized import quantize_qdq

    m = models.build(name, size="tiny")
    src, dst = Path(folder) / f"{name}.onnx", Path(folder) / f"{name}.qdq.onnx"
    onnx.save(m, src)
    quantize_qdq(src, dst, [models.sample_inputs(name, m, seed=i) for i in range(3)])
    return onnx.load(dst), models.sample_inputs(name, m, seed=7)


def have_nvrtc() -> bool:
    """Whether NVRTC (cuda-bindings and the nvidia-cuda-nvrtc wheel) loads here: code generation's
    tests compile real cubins without a GPU where it does."""
    try:
        from graphc.codegen.nvrtc import nvrtc_version

        nvrtc_version()
        return True
    except Exception:
        return False


def cuobjdump_path() -> str | None:
    """cuobjdump from PATH, else from the nvidia-cuda-cuobjdump wheel (the test extra), else None."""
    found = shutil.which("cuobjdump")
    if found:
        return found
    try:
        import nvidia
    except ImportError:
        return None
    for root in nvidia.__path__:
        for cand in Path(root).glob("*/bin/cuobjdump"):
            return str(cand)
    return None


class OnnxNet:
    """A tiny onnx.helper graph writer for hand-built test models: graph inputs, constants as
    initializers (c0, c1, ...), nodes by op (output names op<n>, node names PREFIX/Op_<n>)."""

    prefix = "n"

    def __init__(self) -> None:
        self.nodes: list = []
        self.inits: list = []
        self.inputs: list = []
        self.n = 0

    def input(self, name: str, elem: int, shape) -> str:
        self.inputs.append(helper.make_tensor_value_info(name, elem, shape))
        return name

    def c(self, value, dtype=np.float32) -> str:
        self.n += 1
        name = f"c{self.n}"
        self.inits.append(numpy_helper.from_array(np.asarray(value, dtype=dtype), name))
        return name

    def i64(self, value) -> str:
        return self.c(value, np.int64)

    def op(self, op: str, *inputs: str, **attrs) -> str:
        self.n += 1
        out = f"{op.lower()}{self.n}"
        self.nodes.append(helper.make_node(op, list(inputs), [out], name=f"{self.prefix}/{op}_{self.n}", **attrs))
        return out

    def make(self, outs: list, opset: int = 18, ir_version: int = 9, infer: bool = False) -> onnx.ModelProto:
        """The model of the nodes so far with graph outputs `outs` (ValueInfoProtos)."""
        g = helper.make_graph(self.nodes, "t", self.inputs, outs, self.inits)
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
        m.ir_version = ir_version
        return onnx.shape_inference.infer_shapes(m) if infer else m
