"""NARROW_FLAG_CUMSUM (passes/canonicalize.py): the dynamo exporter's cumsum of int32 flags widened
to int64 first (RoBERTa's position ids, cumsum(mask.int(), 1)) sums the narrow flags and widens
after, as TorchScript's export does, so the CUDA plan has one kernel fewer; the integers are the
same (against ONNX Runtime, exactly). Where the partial sums could leave the narrow type (an axis
longer than its maximum) or the narrow values are not 0/1 flags, nothing changes."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import graphc
from graphc.passes import OptimizeOptions, optimize
from graphc.passes.target import Target
from tests.helpers import OnnxNet, run_ort

PAD = 1


def _position_ids(seq: int, narrow: int = TensorProto.INT32, flags: bool = True) -> onnx.ModelProto:
    """RoBERTa's create_position_ids_from_input_ids as the dynamo exporter writes it."""
    net = OnnxNet()
    ids = net.input("ids", TensorProto.INT64, [2, seq])
    mask = net.op("Not", net.op("Equal", ids, net.i64(PAD))) if flags else ids
    m = net.op("Cast", mask, to=narrow)
    s = net.op("CumSum", net.op("Cast", m, to=TensorProto.INT64), net.i64(1))
    pos = net.op("Mul", net.op("Cast", s, to=narrow), m)
    y = net.op("Add", net.op("Cast", pos, to=TensorProto.INT64), net.i64(PAD))
    return net.make([helper.make_tensor_value_info(y, TensorProto.INT64, [2, seq])])


def _optimized(model: onnx.ModelProto, target: Target):
    return optimize(graphc.load_onnx(model), OptimizeOptions(opt_level=2, target=target)).graph


def _cumsum_dtypes(g) -> list[str]:
    return [n.inputs[0].ttype.dtype.name for n in g.nodes if n.op == "CumSum"]


def _feeds(seq: int) -> dict[str, np.ndarray]:
    ids = np.random.default_rng(4).integers(0, 6, (2, seq)).astype(np.int64)
    ids[1, seq // 2 :] = PAD  # a padded tail: its flags are 0
    return {"ids": ids}


def test_flags_are_summed_narrow_exactly():
    model = _position_ids(16)
    g = _optimized(model, Target(name="cuda", precision="fp16"))
    assert _cumsum_dtypes(g) == ["int32"], _cumsum_dtypes(g)
    feeds = _feeds(16)
    want = next(iter(run_ort(model, feeds).values()))
    got = next(iter(graphc.compile(model, target="cpu", shapes={"ids": feeds["ids"].shape}).run(feeds).values()))
    np.testing.assert_array_equal(np.asarray(got), want)


def test_one_kernel_fewer_than_before():
    """The CUDA plan of the rewritten graph: no elementwise kernel stands alone for the widening."""
    target = Target(name="cuda", precision="fp16")
    g = _optimized(_position_ids(16), target)
    casts = [n for n in g.nodes if n.op == "Cast" or (n.op == "Fused" and len(n.attrs.epilogue) == 1)]
    assert not casts, [(n.op, n.name) for n in casts]


@pytest.mark.parametrize(
    ("seq", "narrow", "flags"),
    [
        (200, TensorProto.INT8, True),  # partial sums up to 200 > int8's 127
        (16, TensorProto.INT32, False),  # int32 values, not 0/1 flags: their sums may overflow int32
    ],
)
def test_left_wide_where_the_narrow_sums_could_overflow(seq, narrow, flags):
    model = _position_ids(seq, narrow, flags)
    g = _optimized(model, Target(name="cpu", precision="fp32"))
    assert _cumsum_dtypes(g) == ["int64"], _cumsum_dtypes(g)
    feeds = _feeds(seq)
    want = next(iter(run_ort(model, feeds).values()))
    got = next(iter(graphc.compile(model, target="cpu", shapes={"ids": feeds["ids"].shape}).run(feeds).values()))
    np.testing.assert_array_equal(np.asarray(got), want)
