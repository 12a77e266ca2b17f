"""A small ONNX graph writer shared by the model builders.

It hands out unique value names, turns numpy arrays into initializers, draws seeded random
weights, and spells the ops whose ONNX form changed between opsets (Unsqueeze and Split took
their axes/split as inputs in 13, ReduceMean in 18; LayerNormalization exists from 17) so each
builder writes one form and gets the right one for the opset it was asked for.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

DEFAULT_OPSET = 17
MIN_OPSET = 11  # Clip's min/max are inputs from 11; everything else here is older.
PRODUCER = "graphc.models"
CONFIG_KEY = "graphc.models.config"  # metadata_props key: the builder's name and arguments, JSON

Dim = int | str  # a concrete size or a symbolic name such as "batch"


def check_opset(opset: int) -> int:
    newest = onnx.defs.onnx_opset_version()
    if not MIN_OPSET <= opset <= newest:
        raise ValueError(f"opset {opset} is out of range: the model zoo writes opsets {MIN_OPSET}..{newest}")
    return opset


class GraphWriter:
    """Accumulates nodes, initializers and graph inputs/outputs for one model."""

    def __init__(self, name: str, opset: int, seed: int) -> None:
        self.name = name
        self.opset = check_opset(opset)
        self.rng = np.random.default_rng(seed)
        self.dtype = np.dtype(np.float32)  # every zoo model is float32
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[onnx.ValueInfoProto] = []
        self._used: set[str] = set()
        self._consts: dict[tuple, str] = {}  # small constants are shared, keyed by value

    # -- names -------------------------------------------------------------------------------
    def fresh(self, hint: str) -> str:
        """A value name not used yet: `hint`, or `hint_2`, `hint_3`, ..."""
        name, k = hint, 1
        while name in self._used:
            k += 1
            name = f"{hint}_{k}"
        self._used.add(name)
        return name

    # -- graph inputs, outputs, initializers ------------------------------------------------------
    def input(self, name: str, elem_type: int, shape: Sequence[Dim]) -> str:
        self._used.add(name)
        self.inputs.append(helper.make_tensor_value_info(name, elem_type, list(shape)))
        return name

    def output(self, value: str, name: str, elem_type: int, shape: Sequence[Dim]) -> str:
        """Expose node output `value` as graph output `name`: the value is renamed (in the node that
        makes it and in every later use), so no Identity node stands in between."""
        if name in self._used and name != value:
            raise ValueError(f"graph output name {name!r} is taken")
        producer = next((n for n in self.nodes if value in n.output), None)
        if producer is None:
            raise ValueError(f"{value!r} is not a node output")
        self._used.add(name)
        for node in self.nodes:
            for field in (node.input, node.output):
                for i, v in enumerate(field):
                    if v == value:
                        field[i] = name
        self.outputs.append(helper.make_tensor_value_info(name, elem_type, list(shape)))
        return name

    def initializer(self, array: np.ndarray, name: str) -> str:
        name = self.fresh(name)
        # np.require, not np.ascontiguousarray: the latter turns a 0-d array into 1-d.
        self.initializers.append(numpy_helper.from_array(np.require(array, requirements="C"), name))
        return name

    def const(self, value: float | int | Sequence, dtype: np.dtype | type | None = None, name: str = "") -> str:
        """A small constant (a scalar or a 1-D list) as an initializer, shared between uses."""
        arr = np.asarray(value, dtype=dtype if dtype is not None else self.dtype)
        key = (arr.dtype.str, arr.shape, arr.tobytes())
        if key not in self._consts:
            hint = name or f"const_{arr.dtype.name}_" + "_".join(str(v) for v in arr.ravel()[:4])
            hint = hint.replace("-", "m").replace(".", "p")
            self._consts[key] = self.initializer(arr, hint)
        return self._consts[key]

    def i64(self, values: Sequence[int] | int, name: str = "") -> str:
        return self.const(values, np.int64, name)

    # -- random weights --------------------------------------------------------------------------
    def normal(self, name: str, shape: Sequence[int], std: float, mean: float = 0.0) -> str:
        w = self.rng.standard_normal(tuple(shape), dtype=np.float32) * np.float32(std) + np.float32(mean)
        return self.initializer(w.astype(self.dtype), name)

    def uniform(self, name: str, shape: Sequence[int], low: float, high: float) -> str:
        w = self.rng.uniform(low, high, size=tuple(shape)).astype(self.dtype)
        return self.initializer(w, name)

    # -- nodes ----------------------------------------------------------------------------------
    def op(self, op_type: str, inputs: Sequence[str], name: str, n_out: int = 1, **attrs: object) -> str:
        """Append a node named `name`; returns its output (use `op_n` for several outputs)."""
        return self.op_n(op_type, inputs, name, n_out, **attrs)[0]

    def op_n(self, op_type: str, inputs: Sequence[str], name: str, n_out: int, **attrs: object) -> list[str]:
        node_name = self.fresh(name)
        outs = [self.fresh(f"{node_name}_output_{i}") for i in range(n_out)]
        self.nodes.append(helper.make_node(op_type, list(inputs), outs, name=node_name, **attrs))
        return outs

    # -- ops whose form depends on the opset ------------------------------------------------------
    def unsqueeze(self, x: str, axes: Sequence[int], name: str) -> str:
        if self.opset >= 13:
            return self.op("Unsqueeze", [x, self.i64(list(axes))], name)
        return self.op("Unsqueeze", [x], name, axes=list(axes))

    def reduce_mean(self, x: str, axes: Sequence[int], name: str, keepdims: int = 1) -> str:
        if self.opset >= 18:
            return self.op("ReduceMean", [x, self.i64(list(axes))], name, keepdims=keepdims)
        return self.op("ReduceMean", [x], name, axes=list(axes), keepdims=keepdims)

    def split(self, x: str, sizes: Sequence[int], axis: int, name: str) -> list[str]:
        if self.opset >= 13:
            return self.op_n("Split", [x, self.i64(list(sizes))], name, len(sizes), axis=axis)
        return self.op_n("Split", [x], name, len(sizes), axis=axis, split=list(sizes))

    def slice(self, x: str, starts: str, ends: str, axes: Sequence[int], name: str) -> str:
        """Slice with starts/ends given as int64 values (inputs since opset 10)."""
        return self.op("Slice", [x, starts, ends, self.i64(list(axes))], name)

    # -- composite layers shared by several families ---------------------------------------------
    def linear(
        self, x: str, d_in: int, d_out: int, prefix: str, std: float | None = None, bias_std: float = 0.02
    ) -> str:
        """x @ W + b with W [d_in, d_out] (MatMul + Add, as exporters write nn.Linear on 3-D input)."""
        w = self.normal(f"{prefix}.weight", (d_in, d_out), std if std is not None else 1 / math.sqrt(d_in))
        b = self.normal(f"{prefix}.bias", (d_out,), bias_std)
        y = self.op("MatMul", [x, w], f"{prefix}/MatMul")
        return self.op("Add", [y, b], f"{prefix}/Add")

    def gemm(self, x: str, d_in: int, d_out: int, prefix: str, std: float | None = None) -> str:
        """Gemm(x, W^T, b) with W [d_out, d_in] stored as nn.Linear stores it (transB=1)."""
        w = self.normal(f"{prefix}.weight", (d_out, d_in), std if std is not None else 1 / math.sqrt(d_in))
        b = self.normal(f"{prefix}.bias", (d_out,), 0.02)
        return self.op("Gemm", [x, w, b], f"{prefix}/Gemm", alpha=1.0, beta=1.0, transB=1)

    def layer_norm(self, x: str, dim: int, prefix: str, form: str, eps: float) -> str:
        """LayerNorm over the last axis: one LayerNormalization node (opset >= 17) or the
        ReduceMean/Sub/Pow/ReduceMean/Add/Sqrt/Div/Mul/Add chain the TorchScript exporter writes."""
        gamma = self.uniform(f"{prefix}.weight", (dim,), 0.8, 1.2)
        beta = self.normal(f"{prefix}.bias", (dim,), 0.05)
        if form == "fused":
            return self.op("LayerNormalization", [x, gamma, beta], f"{prefix}/LayerNormalization", axis=-1, epsilon=eps)
        mean = self.reduce_mean(x, [-1], f"{prefix}/ReduceMean")
        d = self.op("Sub", [x, mean], f"{prefix}/Sub")
        sq = self.op("Pow", [d, self.const(2.0)], f"{prefix}/Pow")
        var = self.reduce_mean(sq, [-1], f"{prefix}/ReduceMean_1")
        var_eps = self.op("Add", [var, self.const(eps)], f"{prefix}/Add")
        std = self.op("Sqrt", [var_eps], f"{prefix}/Sqrt")
        normed = self.op("Div", [d, std], f"{prefix}/Div")
        scaled = self.op("Mul", [normed, gamma], f"{prefix}/Mul")
        return self.op("Add", [scaled, beta], f"{prefix}/Add_1")

    def gelu_erf(self, x: str, prefix: str) -> str:
        """x * 0.5 * (1 + erf(x / sqrt 2)), in the node order the TorchScript exporter writes."""
        t = self.op("Div", [x, self.const(math.sqrt(2.0))], f"{prefix}/Div")
        t = self.op("Erf", [t], f"{prefix}/Erf")
        t = self.op("Add", [t, self.const(1.0)], f"{prefix}/Add")
        t = self.op("Mul", [x, t], f"{prefix}/Mul")
        return self.op("Mul", [t, self.const(0.5)], f"{prefix}/Mul_1")

    # -- the model -------------------------------------------------------------------------------
    def model(self, config: dict, doc: str) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, self.name, self.inputs, self.outputs, self.initializers)
        opset = [helper.make_opsetid("", self.opset)]
        model = helper.make_model(
            graph,
            opset_imports=opset,
            producer_name=PRODUCER,
            doc_string=doc,
            # The oldest IR version that carries this opset, so older runtimes read the file too.
            ir_version=helper.find_min_ir_version_for(opset, ignore_unknown=True),
        )
        helper.set_model_props(model, {CONFIG_KEY: json.dumps(config, sort_keys=True)})
        return model


def layernorm_form(layernorm: str | None, opset: int) -> str:
    """'fused' (one LayerNormalization node) or 'decomposed'; None picks fused where it exists."""
    if layernorm is None:
        return "fused" if opset >= 17 else "decomposed"
    if layernorm not in ("fused", "decomposed"):
        raise ValueError(f"layernorm must be 'fused' or 'decomposed', not {layernorm!r}")
    if layernorm == "fused" and opset < 17:
        raise ValueError(f"layernorm='fused' needs opset >= 17 (LayerNormalization), not {opset}")
    return layernorm
