"""The runtime's attrs table: it is what onnx.defs and the op registry give, it decodes every
attrs the compiler writes to the same values, and it refuses what does not fit."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

import graphc.ops
from graphc.ir.attrs import attrs_to_json, onnx_attrs_class
from graphc.ir.fused import ACC, IN, OP, EpilogueOp, FusedAttrs
from graphc.ir.registry import all_ops, get_op
from graphc.ops.attrs_schema_gen import build_table, generate, target_path
from graphc.runtime import attrs_schema
from graphc.runtime.attrs import AttrRecord, AttrsError, TensorAttr, decode_attrs, make_record
from graphc.runtime.reference import get_kernel, kernel_names

graphc.ops.load()

# ONNX ops whose attrs graphc extends with attributes of its own (no ONNX file carries them).
GRAPHC_OWN = {"Attention": {"masked_rows"}}


def test_committed_table_is_what_the_generator_writes():
    text, changed = generate()
    assert not changed, "the attrs table is stale: run python -m graphc.ops.attrs_schema_gen (it bumps the version)"
    assert target_path().read_text() == text


def test_table_fields_are_the_onnx_schema_and_the_attrs_classes():
    import onnx.defs

    table = attrs_schema.OPS
    assert table == build_table()
    conv = table[("", "Conv")]
    assert conv["auto_pad"] == ("str", True, "NOTSET") and conv["group"] == ("int", True, 1)
    assert table[("", "Gemm")]["beta"] == ("float", True, 1.0)  # the spec's default, not 0
    assert table[("", "Cast")]["to"] == ("int", False, None)  # required
    for (domain, op), fields in table.items():
        cls = get_op(op, domain).attrs
        assert set(fields) == {f.name for f in dataclasses.fields(cls)}, op
        if domain == "":
            own = GRAPHC_OWN.get(op, set())
            assert cls is onnx_attrs_class(op) or (own and issubclass(cls, onnx_attrs_class(op))), op
            assert set(fields) == set(onnx.defs.get_schema(op).attributes) | own, op


def test_every_op_has_a_kernel_and_a_table_entry():
    ops = {(o.domain, o.op_type) for o in all_ops()}
    assert ops == set(kernel_names())
    fused = (attrs_schema.FUSED[0], attrs_schema.FUSED[1])
    assert ops == set(attrs_schema.OPS) | {fused}
    for o in all_ops():
        assert o.compute is get_kernel(o.op_type, o.domain)  # interpreter and CPU engine: the same code


def _round_trip(attrs, op: str | None = None, domain: str = "") -> AttrRecord:
    # The JSON an engine holds, through json text as a file would carry it.
    return decode_attrs(op or type(attrs).op_type, domain, json.loads(json.dumps(attrs_to_json(attrs))))


def test_decode_gives_the_ir_values():
    a = get_op("Conv").attrs(pads=(1, 1, 1, 1), strides=(2, 2), group=2)
    r = _round_trip(a)
    for name, v in a.items():
        assert getattr(r, name) == v and type(getattr(r, name)) is type(v), name
    c = get_op("ConstantOfShape").attrs(value=np.array([2.5], np.float16))
    r = _round_trip(c)
    assert r.value == c.value and r.value.array.dtype == np.float16
    g = _round_trip(get_op("Gemm").attrs())
    assert g.beta == 1.0 and g.transA == 0


def test_decode_graphc_own_attribute_of_an_onnx_op():
    a = get_op("Attention").attrs(is_causal=1, masked_rows="mean")
    r = _round_trip(a)
    assert r.masked_rows == "mean" and r.is_causal == 1 and r.scale is None
    assert _round_trip(get_op("Attention").attrs()).masked_rows == "zero"
    assert attrs_schema.OPS[("", "Attention")]["masked_rows"] == ("str", True, "zero")


def test_decode_fused_nested_form():
    add = get_op("Add").attrs()
    relu = get_op("Relu").attrs()
    fa = FusedAttrs(
        anchor_op="Conv",
        anchor_attrs=get_op("Conv").attrs(pads=(1, 1, 1, 1)),
        anchor_inputs=2,
        epilogue=(EpilogueOp("Add", add, (ACC, IN(2))), EpilogueOp("Relu", relu, (OP(0),))),
        outputs=(OP(1),),
    )
    r = _round_trip(fa, "Fused", "graphc")
    assert r.anchor_op == "Conv" and r.anchor_attrs.pads == (1, 1, 1, 1) and r.anchor_attrs.auto_pad == "NOTSET"
    assert [e.op for e in r.epilogue] == ["Add", "Relu"]
    assert [(x.kind, x.index) for x in r.epilogue[0].args] == [("acc", 0), ("in", 2)]
    # The same kernel on both forms gives the same numbers.
    rng = np.random.default_rng(0)
    ins = [rng.standard_normal(s).astype(np.float32) for s in [(1, 3, 5, 5), (4, 3, 3, 3), (1, 4, 5, 5)]]
    k = get_kernel("Fused", "graphc")
    np.testing.assert_array_equal(k(ins, fa, 1)[0], k(ins, r, 1)[0])


@pytest.mark.parametrize(
    "op, domain, data, message",
    [
        ("Conv", "", {"grup": 2}, "unknown attribute 'grup'"),
        ("Conv", "", {"group": "2"}, "expected an int"),
        ("Conv", "", {"group": True}, "expected an int"),
        ("Conv", "", {"pads": [1, "x"]}, r"pads\[1\]: expected an int"),
        ("Conv", "", [1, 2], "must be an object"),
        ("Cast", "", {}, "required attribute 'to'"),
        ("dataclass", "", {}, "not in the attrs table"),
        ("register_op", "", {}, "not in the attrs table"),
        ("ConstantOfShape", "", {"value": {"__tensor__": "object", "shape": [1], "data": [1]}}, "dtype"),
        ("ConstantOfShape", "", {"value": {"__tensor__": "float32", "shape": [2], "data": [1]}}, "hold 2"),
        ("ConstantOfShape", "", {"value": {"__tensor__": "float32", "shape": [2**40], "data": []}}, "at most"),
        ("Fused", "graphc", {"outputs": [{"__dataclass__": "dataclass", "fields": {}}]}, "expected a Ref"),
        (
            "Fused",
            "graphc",
            {"epilogue": [{"__dataclass__": "get_op", "fields": {}}], "outputs": []},
            "expected an EpilogueOp",
        ),
        ("Fused", "graphc", {"outputs": [{"__dataclass__": "Ref", "fields": {"kind": "acc"}}]}, "has no acc"),
        (
            "Fused",
            "graphc",
            {"outputs": [{"__dataclass__": "Ref", "fields": {"kind": "op", "index": 0}}]},
            "not before",
        ),
    ],
)
def test_decode_refuses_what_does_not_fit(op, domain, data, message):
    with pytest.raises(AttrsError, match=message):
        decode_attrs(op, domain, data)


def test_make_record_fills_defaults_and_refuses_unknown_fields():
    r = make_record("MaxPool", {"kernel_shape": (2, 2)})
    assert r.auto_pad == "NOTSET" and r.storage_order == 0 and r.kernel_shape == (2, 2)
    with pytest.raises(AttrsError, match="unknown"):
        make_record("MaxPool", {"kernel": (2, 2)})
    with pytest.raises(AttributeError):
        r.kernel_shape = (3, 3)
    assert TensorAttr(np.zeros(2)) == TensorAttr(np.zeros(2))


# ---- the loader uses the table -----------------------------------------------------------------


@pytest.fixture(scope="module")
def conv_engine(tmp_path_factory):
    import graphc
    from helpers import make_node_model

    rng = np.random.default_rng(1)
    feeds = {
        "x": rng.standard_normal((1, 3, 6, 6)).astype(np.float32),
        "w": rng.standard_normal((4, 3, 3, 3)).astype(np.float32),
    }
    model = make_node_model("Conv", feeds, {"pads": [1, 1, 1, 1]})
    eng = graphc.compile(model, target="cpu")
    path = tmp_path_factory.mktemp("eng") / "conv.engine"
    eng.save(path)
    return eng, feeds, path


def _edit(path, out, edit):
    """A copy of the engine with its manifest edited and resealed (its digest recomputed, as a
    deliberate editor would), so that the attrs table's own checks are what is tested."""
    import hashlib
    import zipfile

    from graphc.runtime.container import make_comment

    with zipfile.ZipFile(path) as z:
        items = {n: z.read(n) for n in z.namelist()}
    m = json.loads(items["manifest.json"])
    edit(m)
    items["manifest.json"] = json.dumps(m).encode()
    with zipfile.ZipFile(out, "w") as z:
        z.comment = make_comment(hashlib.sha256(items["manifest.json"]).hexdigest())
        for n, d in items.items():
            z.writestr(n, d)
    return out


def _real_steps(m):
    return [s for s in m["plan"]["steps"] if not s.get("alias")]


def test_loaded_engine_runs_through_the_table(conv_engine):
    import graphc.runtime

    eng, feeds, path = conv_engine
    loaded = graphc.runtime.load(path)
    got, want = loaded.run(feeds), eng.run(feeds)
    for k in want:
        np.testing.assert_array_equal(got[k], want[k])


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda m: m.update(attrs_schema=attrs_schema.SCHEMA_VERSION + 1), "attrs table version"),
        (lambda m: m.pop("attrs_schema"), "no attrs table version"),
        (lambda m: _real_steps(m)[0].update(op="dataclass"), "has no CPU kernel"),
        (lambda m: _real_steps(m)[0].update(op="get_op", domain="graphc"), "has no CPU kernel"),
        (lambda m: _real_steps(m)[0]["attrs"].update(group="1"), "expected an int"),
        (lambda m: _real_steps(m)[0]["attrs"].update(__class__="x"), "unknown attribute"),
    ],
)
def test_loader_refuses_attrs_that_do_not_fit(conv_engine, tmp_path, edit, message):
    import graphc.runtime
    from graphc.runtime import EngineError

    _, _, path = conv_engine
    with pytest.raises(EngineError, match=message):
        graphc.runtime.load(_edit(path, tmp_path / "bad.engine", edit))


def test_fused_step_referring_to_a_missing_input_is_refused():
    from graphc.runtime import EngineError
    from graphc.runtime.cpu import reference_kernel
    from graphc.runtime.plan import Step

    fa = FusedAttrs(epilogue=(EpilogueOp("Add", get_op("Add").attrs(), (IN(0), IN(3))),), outputs=(OP(0),))
    data = json.loads(json.dumps(attrs_to_json(fa)))
    ok = Step(0, "n0", "Fused[Elementwise]", "Fused", "graphc", data, ["a", "b", "c", "d"], ["y"])
    x = np.arange(4, dtype=np.float32)
    np.testing.assert_array_equal(reference_kernel(ok)([x, None, None, x])[0], x + x)
    bad = Step(0, "n0", "Fused[Elementwise]", "Fused", "graphc", data, ["a", "b"], ["y"])
    with pytest.raises(EngineError, match="step 'n0'.*input the step does not have"):
        reference_kernel(bad)
