"""Models with loops the optimizer cannot unroll, for the host-loop tests of both targets
(tests/runtime/test_cpu_host_loop.py, tests/runtime/test_cuda_host_loop.py and its `-m gpu`
twin): a trip count that is a run-time input, a while loop whose exit is computed from data, a
greedy decode-like loop, a static loop longer than MAX_UNROLL with a scan output, a long Scan, and
a loop whose carried value changes shape (refused)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

FL, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL
# the greedy loop's state width: odd, since a CUDA Gather of float32 rows of even width is written with
# 8-byte containers that runtime/validate.py refuses when it reads the engine back (a bug outside the loops)
HIDDEN = 5


def _model(g: onnx.GraphProto, opset: int = 17) -> onnx.ModelProto:
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


def _scalar(name: str, elem: int) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, [])


def trip_count_model() -> onnx.ModelProto:
    """y = Loop(M) { h = tanh(h @ W + x * i) }: the trip count M is an input (known only at run
    time), the body reads the iteration number and a captured input, steps before and after."""
    w = (np.random.default_rng(1).standard_normal((4, 4)) * 0.5).astype(np.float32)
    body = helper.make_graph(
        [
            helper.make_node("Cast", ["i"], ["fi"], to=FL),
            helper.make_node("Mul", ["x", "fi"], ["xi"]),
            helper.make_node("MatMul", ["h", "w"], ["hw"]),
            helper.make_node("Add", ["hw", "xi"], ["s"]),
            helper.make_node("Tanh", ["s"], ["h_out"]),
            helper.make_node("Identity", ["c"], ["c_out"]),
        ],
        "body",
        [_scalar("i", I64), _scalar("c", B), helper.make_tensor_value_info("h", FL, [2, 4])],
        [_scalar("c_out", B), helper.make_tensor_value_info("h_out", FL, [2, 4])],
    )
    g = helper.make_graph(
        [
            helper.make_node("Relu", ["x0"], ["h0"]),
            helper.make_node("Loop", ["M", "", "h0"], ["hT"], name="rnn_loop", body=body),
            helper.make_node("Mul", ["hT", "two"], ["y"]),
        ],
        "trip_count",
        [
            helper.make_tensor_value_info("M", I64, []),
            helper.make_tensor_value_info("x0", FL, [2, 4]),
            helper.make_tensor_value_info("x", FL, [2, 4]),
        ],  # fmt: skip
        [helper.make_tensor_value_info("y", FL, [2, 4])],
        initializer=[numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.array(2.0, np.float32), "two")],
    )
    return _model(g)


def while_model(max_trip: int | None = None) -> onnx.ModelProto:
    """A while loop: (n, v) = Loop(cond=sum(v) < limit) { v = v * 1.5 + 1; n = n + 1 }, the exit
    computed from data every iteration; no trip count at all, or a constant `max_trip` (exporters
    write INT64_MAX for a Python while loop)."""
    body = helper.make_graph(
        [
            helper.make_node("Mul", ["v", "k"], ["vk"]),
            helper.make_node("Add", ["vk", "one"], ["v_out"]),
            helper.make_node("Add", ["n", "one_i"], ["n_out"]),
            helper.make_node("ReduceSum", ["v_out"], ["s"], keepdims=0),
            helper.make_node("Less", ["s", "limit"], ["c_out"]),
        ],
        "body",
        [
            _scalar("i", I64),
            _scalar("c", B),
            helper.make_tensor_value_info("n", I64, []),
            helper.make_tensor_value_info("v", FL, [3]),
        ],  # fmt: skip
        [
            _scalar("c_out", B),
            helper.make_tensor_value_info("n_out", I64, []),
            helper.make_tensor_value_info("v_out", FL, [3]),
        ],  # fmt: skip
        initializer=[
            numpy_helper.from_array(np.array(1.5, np.float32), "k"),
            numpy_helper.from_array(np.array(1.0, np.float32), "one"),
            numpy_helper.from_array(np.array(1, np.int64), "one_i"),
        ],
    )
    g = helper.make_graph(
        [
            helper.make_node("ReduceSum", ["v0"], ["s0"], keepdims=0),
            helper.make_node("Less", ["s0", "limit"], ["c0"]),
            helper.make_node(
                "Loop", ["" if max_trip is None else "M", "c0", "n0", "v0"], ["n", "v"], name="while", body=body
            ),  # fmt: skip
        ],
        "while",
        [helper.make_tensor_value_info("v0", FL, [3]), helper.make_tensor_value_info("limit", FL, [])],
        [helper.make_tensor_value_info("n", I64, []), helper.make_tensor_value_info("v", FL, [3])],
        initializer=[numpy_helper.from_array(np.array(0, np.int64), "n0")]
        + ([] if max_trip is None else [numpy_helper.from_array(np.array(max_trip, np.int64), "M")]),
    )
    return _model(g)


def greedy_decode_model(vocab: int = 8, steps: int = 6, eos: int = 1, seed: int = 0) -> onnx.ModelProto:
    """Greedy decoding: from a start token, `steps` at most; each step embeds the last token, mixes
    it into a state, takes the argmax of the logits, writes it at position i of a fixed-size token
    buffer (Where over the positions), and stops early when it is the end token (the exit from data)."""
    rng = np.random.default_rng(seed)
    emb = rng.standard_normal((vocab, HIDDEN)).astype(np.float32)
    wh = (rng.standard_normal((HIDDEN, HIDDEN)) * 0.6).astype(np.float32)
    wo = rng.standard_normal((HIDDEN, vocab)).astype(np.float32)
    body = helper.make_graph(
        [
            helper.make_node("Gather", ["emb", "tok"], ["e"], axis=0),
            helper.make_node("MatMul", ["h", "wh"], ["hh"]),
            helper.make_node("Add", ["hh", "e"], ["pre"]),
            helper.make_node("Tanh", ["pre"], ["h_out"]),
            helper.make_node("MatMul", ["h_out", "wo"], ["logits"]),
            helper.make_node("ArgMax", ["logits"], ["nt"], axis=1, keepdims=0),
            helper.make_node("Equal", ["positions", "i"], ["here"]),
            helper.make_node("Where", ["here", "nt", "buf"], ["buf_out"]),
            helper.make_node("Identity", ["nt"], ["tok_out"]),
            helper.make_node("Squeeze", ["nt", "ax0"], ["nts"]),
            helper.make_node("Equal", ["nts", "eos"], ["stop"]),
            helper.make_node("Not", ["stop"], ["c_out"]),
        ],
        "body",
        [_scalar("i", I64), _scalar("c", B), helper.make_tensor_value_info("tok", I64, [1]),
         helper.make_tensor_value_info("h", FL, [1, HIDDEN]), helper.make_tensor_value_info("buf", I64, [steps])],
        [_scalar("c_out", B), helper.make_tensor_value_info("tok_out", I64, [1]),
         helper.make_tensor_value_info("h_out", FL, [1, HIDDEN]),
         helper.make_tensor_value_info("buf_out", I64, [steps])],
    )  # fmt: skip
    g = helper.make_graph(
        [helper.make_node("Loop", ["M", "", "tok0", "h0", "buf0"], ["tok", "h", "tokens"], name="decode", body=body)],
        "greedy",
        [helper.make_tensor_value_info("tok0", I64, [1]), helper.make_tensor_value_info("h0", FL, [1, HIDDEN])],
        [helper.make_tensor_value_info("tokens", I64, [steps]), helper.make_tensor_value_info("h", FL, [1, HIDDEN])],
        initializer=[
            numpy_helper.from_array(emb, "emb"),
            numpy_helper.from_array(wh, "wh"),
            numpy_helper.from_array(wo, "wo"),
            numpy_helper.from_array(np.array(steps, np.int64), "M"),
            numpy_helper.from_array(np.full((steps,), -1, np.int64), "buf0"),
            numpy_helper.from_array(np.arange(steps, dtype=np.int64), "positions"),
            numpy_helper.from_array(np.array([0], np.int64), "ax0"),
            numpy_helper.from_array(np.array(eos, np.int64), "eos"),
        ],
    )
    return _model(g)


def long_static_loop_model(trip: int = 100) -> onnx.ModelProto:
    """A static trip count over MAX_UNROLL with a scan output: cumulative h = h * 0.99 + x,
    each iteration's h stacked (preallocated [trip, 2, 3])."""
    body = helper.make_graph(
        [
            helper.make_node("Mul", ["h", "d"], ["hd"]),
            helper.make_node("Add", ["hd", "x"], ["h_out"]),
            helper.make_node("Identity", ["h_out"], ["scan"]),
            helper.make_node("Identity", ["c"], ["c_out"]),
        ],
        "body",
        [_scalar("i", I64), _scalar("c", B), helper.make_tensor_value_info("h", FL, [2, 3])],
        [
            _scalar("c_out", B),
            helper.make_tensor_value_info("h_out", FL, [2, 3]),
            helper.make_tensor_value_info("scan", FL, [2, 3]),
        ],  # fmt: skip
        initializer=[numpy_helper.from_array(np.array(0.99, np.float32), "d")],
    )
    g = helper.make_graph(
        [helper.make_node("Loop", ["M", "", "h0"], ["hT", "hs"], name="long_loop", body=body)],
        "long_loop",
        [helper.make_tensor_value_info("h0", FL, [2, 3]), helper.make_tensor_value_info("x", FL, [2, 3])],
        [helper.make_tensor_value_info("hT", FL, [2, 3]), helper.make_tensor_value_info("hs", FL, [trip, 2, 3])],
        initializer=[numpy_helper.from_array(np.array(trip, np.int64), "M")],
    )
    return _model(g)


def long_scan_model(length: int = 80) -> onnx.ModelProto:
    """Scan over `length` > MAX_UNROLL steps of x [length, 3] along axis 0 and of z [2, length]
    along axis 1 (reversed): a running sum state and two scan outputs, one at axis 1."""
    body = helper.make_graph(
        [
            helper.make_node("Add", ["acc", "xt"], ["acc_out"]),
            helper.make_node("Unsqueeze", ["acc_out", "ax0"], ["acc_b"]),
            helper.make_node("Unsqueeze", ["zt", "ax1"], ["zt_b"]),
            helper.make_node("Mul", ["acc_b", "zt_b"], ["y1"]),
            helper.make_node("Neg", ["acc_out"], ["y2"]),
        ],
        "body",
        [
            helper.make_tensor_value_info("acc", FL, [3]),
            helper.make_tensor_value_info("xt", FL, [3]),
            helper.make_tensor_value_info("zt", FL, [2]),
        ],  # fmt: skip
        [
            helper.make_tensor_value_info("acc_out", FL, [3]),
            helper.make_tensor_value_info("y1", FL, [2, 3]),
            helper.make_tensor_value_info("y2", FL, [3]),
        ],  # fmt: skip
        initializer=[
            numpy_helper.from_array(np.array([0], np.int64), "ax0"),
            numpy_helper.from_array(np.array([1], np.int64), "ax1"),
        ],
    )
    g = helper.make_graph(
        [
            helper.make_node(
                "Scan", ["acc0", "x", "z"], ["acc", "ys1", "ys2"], name="long_scan", body=body, num_scan_inputs=2,
                scan_input_axes=[0, 1], scan_input_directions=[0, 1], scan_output_axes=[1, 0],
            )
        ],
        "long_scan",
        [helper.make_tensor_value_info("acc0", FL, [3]), helper.make_tensor_value_info("x", FL, [length, 3]),
         helper.make_tensor_value_info("z", FL, [2, length])],
        [helper.make_tensor_value_info("acc", FL, [3]), helper.make_tensor_value_info("ys1", FL, [2, length, 3]),
         helper.make_tensor_value_info("ys2", FL, [length, 3])],
    )  # fmt: skip
    return _model(g)


def nested_loop_model(inner: int = 70) -> onnx.ModelProto:
    """A Loop in a Loop's body: g = g + tanh(g * j * 0.01 + i) * x for j < `inner` (longer than
    MAX_UNROLL), then h = g / 2, M times (an input): the inner loop reads the outer iteration number
    and a capture of the outer scope (x, through two levels)."""
    inner_body = helper.make_graph(
        [
            helper.make_node("Cast", ["j"], ["fj"], to=FL),
            helper.make_node("Mul", ["g", "fj"], ["gj"]),
            helper.make_node("Mul", ["gj", "small"], ["gs"]),
            helper.make_node("Cast", ["i"], ["fi"], to=FL),
            helper.make_node("Add", ["gs", "fi"], ["ga"]),
            helper.make_node("Tanh", ["ga"], ["t"]),
            helper.make_node("Mul", ["t", "x"], ["tx"]),
            helper.make_node("Add", ["g", "tx"], ["g_out"]),
            helper.make_node("Identity", ["c2"], ["c2_out"]),
        ],
        "inner",
        [_scalar("j", I64), _scalar("c2", B), helper.make_tensor_value_info("g", FL, [2, 3])],
        [_scalar("c2_out", B), helper.make_tensor_value_info("g_out", FL, [2, 3])],
        initializer=[numpy_helper.from_array(np.array(0.01, np.float32), "small")],
    )
    outer_body = helper.make_graph(
        [
            helper.make_node("Loop", ["N", "", "h"], ["hi"], body=inner_body),
            helper.make_node("Mul", ["hi", "half"], ["h_out"]),
            helper.make_node("Identity", ["c"], ["c_out"]),
        ],
        "outer",
        [_scalar("i", I64), _scalar("c", B), helper.make_tensor_value_info("h", FL, [2, 3])],
        [_scalar("c_out", B), helper.make_tensor_value_info("h_out", FL, [2, 3])],
        initializer=[
            numpy_helper.from_array(np.array(inner, np.int64), "N"),
            numpy_helper.from_array(np.array(0.5, np.float32), "half"),
        ],
    )
    g = helper.make_graph(
        [helper.make_node("Loop", ["M", "", "h0"], ["h"], name="outer", body=outer_body)],
        "nested_loop",
        [
            helper.make_tensor_value_info("M", I64, []),
            helper.make_tensor_value_info("h0", FL, [2, 3]),
            helper.make_tensor_value_info("x", FL, [2, 3]),
        ],  # fmt: skip
        [helper.make_tensor_value_info("h", FL, [2, 3])],
    )
    return _model(g)


def growing_loop_model() -> onnx.ModelProto:
    """A loop whose carried value grows every iteration (Concat): refused on the engines."""
    body = helper.make_graph(
        [helper.make_node("Concat", ["v", "one"], ["v_out"], axis=0), helper.make_node("Identity", ["c"], ["c_out"])],
        "body",
        [_scalar("i", I64), _scalar("c", B), helper.make_tensor_value_info("v", FL, ["n"])],
        [_scalar("c_out", B), helper.make_tensor_value_info("v_out", FL, ["m"])],
        initializer=[numpy_helper.from_array(np.ones(1, np.float32), "one")],
    )
    g = helper.make_graph(
        [helper.make_node("Loop", ["M", "", "v0"], ["v"], name="grow", body=body)],
        "grow",
        [helper.make_tensor_value_info("M", I64, []), helper.make_tensor_value_info("v0", FL, [2])],
        [helper.make_tensor_value_info("v", FL, ["k"])],
    )
    return _model(g)


def feeds_for(name: str, seed: int = 0) -> dict[str, np.ndarray]:
    r = np.random.default_rng(seed)
    if name == "trip_count":
        return {"M": np.array(7 + seed, np.int64), "x0": r.standard_normal((2, 4)).astype(np.float32),
                "x": (r.standard_normal((2, 4)) * 0.3).astype(np.float32)}  # fmt: skip
    if name == "while":
        return {"v0": r.uniform(0, 1, 3).astype(np.float32), "limit": np.array(40.0 + 30 * seed, np.float32)}
    if name == "greedy":
        return {"tok0": np.array([1 + seed % 7], np.int64), "h0": r.standard_normal((1, HIDDEN)).astype(np.float32)}
    if name == "nested_loop":
        return {"M": np.array(2 + seed, np.int64), "h0": r.standard_normal((2, 3)).astype(np.float32),
                "x": (r.standard_normal((2, 3)) * 0.2).astype(np.float32)}  # fmt: skip
    if name == "long_loop":
        return {"h0": r.standard_normal((2, 3)).astype(np.float32), "x": r.standard_normal((2, 3)).astype(np.float32)}
    if name == "long_scan":
        return {"acc0": r.standard_normal(3).astype(np.float32), "x": r.standard_normal((80, 3)).astype(np.float32),
                "z": r.standard_normal((2, 80)).astype(np.float32)}  # fmt: skip
    raise KeyError(name)


MODELS = {
    "trip_count": trip_count_model,
    "while": while_model,
    "greedy": greedy_decode_model,
    "long_loop": long_static_loop_model,
    "long_scan": long_scan_model,
    "nested_loop": nested_loop_model,
}
