"""A CPU engine with string tensors: each gets an object array of its own (a view of the arena's
bytes as object pointers crashed the process), and its aliases view that array."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

import graphc


def test_string_inputs_and_views_run():
    g = helper.make_graph(
        [
            helper.make_node("Identity", ["s"], ["t"]),
            helper.make_node("Reshape", ["s", "shape"], ["r"]),
            helper.make_node("Equal", ["s", "s2"], ["eq"]),
        ],
        "strings",
        [
            helper.make_tensor_value_info("s", TensorProto.STRING, [2, 2]),
            helper.make_tensor_value_info("s2", TensorProto.STRING, [2, 2]),
        ],
        [
            helper.make_tensor_value_info("t", TensorProto.STRING, [2, 2]),
            helper.make_tensor_value_info("r", TensorProto.STRING, [4]),
            helper.make_tensor_value_info("eq", TensorProto.BOOL, [2, 2]),
        ],
        [helper.make_tensor("shape", TensorProto.INT64, [1], [4])],
    )
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 19)])
    engine = graphc.compile(model, target="cpu")
    s = np.array([["ab", "c"], ["", "dé"]], dtype=object)
    s2 = np.array([["ab", "x"], ["", "d"]], dtype=object)
    for _ in range(2):  # a second run reuses the engine's arrays
        out = engine.run({"s": s, "s2": s2})
        assert out["t"].tolist() == s.tolist()
        assert out["r"].tolist() == s.reshape(4).tolist()
        assert out["eq"].tolist() == [[True, False], [True, False]]
