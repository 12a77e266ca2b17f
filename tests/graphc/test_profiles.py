"""Engines with optimization profiles (issue 14), CPU target: a dynamic-batch CNN and a dynamic
batch+sequence transformer, each compiled once with a profile, run at min, a middle shape and max
against ONNX Runtime, saved and loaded, and refused outside the profile with one line."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

import graphc
import graphc.runtime
import models
from graphc.errors import CompileError
from graphc.runtime.errors import EngineInputError


def _close(got: np.ndarray, ref: np.ndarray) -> None:
    """Within 1e-4 of ONNX Runtime's output scale (issue 14's bar)."""
    assert got.shape == ref.shape and got.dtype == ref.dtype
    scale = float(np.abs(ref).max()) or 1.0
    err = float(np.abs(got.astype(np.float64) - ref).max())
    assert err <= 1e-4 * scale, f"max abs err {err:.3g} at scale {scale:.3g}"


def _ort(model, feeds):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds), strict=True))


@pytest.fixture(scope="module")
def cnn():
    model = models.build("resnet", size="tiny")
    engine = graphc.compile(
        model,
        target="cpu",
        min_shapes={"pixel_values": [1, 3, 32, 32]},
        opt_shapes={"pixel_values": [4, 3, 32, 32]},
        max_shapes={"pixel_values": [8, 3, 32, 32]},
    )
    return model, engine


def _bert_profile(lo=(1, 4), opt=(2, 5), hi=(6, 6)):
    names = ("input_ids", "attention_mask")
    return dict(
        min_shapes={n: list(lo) for n in names},
        opt_shapes={n: list(opt) for n in names},
        max_shapes={n: list(hi) for n in names},
    )


@pytest.fixture(scope="module")
def bert():
    model = models.build("bert", size="tiny")
    return model, graphc.compile(model, target="cpu", **_bert_profile())


def _bert_feeds(b: int, s: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    mask = np.ones((b, s), np.int64)
    mask[0, -1] = 0  # one padded token: the attention mask takes part
    return {"input_ids": rng.integers(0, 64, size=(b, s)).astype(np.int64), "attention_mask": mask}


def test_cnn_batch_is_padded_to_buckets(cnn):
    _model, engine = cnn
    (p,) = engine.profiles
    (dim,) = p.dims
    assert (dim.name, dim.padded, dim.min, dim.opt, dim.max) == ("batch", True, 1, 4, 8)
    # min, opt, max and a ladder that pads no request by more than 25% (graphc.profiles.MAX_PADDING)
    assert sorted(b.sizes["batch"] for b in p.buckets) == [1, 2, 3, 4, 5, 7, 8]
    assert engine.inputs[0].shape == [4, 3, 32, 32]  # the engine's own plan is the opt bucket


@pytest.mark.parametrize("batch", [1, 3, 6, 8])  # 6 is padded to the bucket 7
def test_cnn_matches_onnxruntime_across_the_range(cnn, batch):
    model, engine = cnn
    x = np.random.default_rng(batch).standard_normal((batch, 3, 32, 32)).astype(np.float32)
    got = engine.run({"pixel_values": x})
    ref = _ort(model, {"pixel_values": x})
    assert set(got) == set(ref)
    for k in ref:
        _close(got[k], ref[k])


def test_transformer_pads_batch_and_runs_sequence_exactly(bert):
    _model, engine = bert
    dims = {g.name: g for g in engine.profiles[0].dims}
    assert dims["batch"].padded
    assert not dims["seq"].padded and "MatMul" in dims["seq"].reason  # attention over the keys
    sizes = {(b.sizes["batch"], b.sizes["seq"]) for b in engine.profiles[0].buckets}
    assert sizes == {(b, s) for b in (1, 2, 3, 5, 6) for s in (4, 5, 6)}


@pytest.mark.parametrize("shape", [(1, 4), (4, 5), (6, 6), (2, 5)])  # batch 4 is padded to 5
def test_transformer_matches_onnxruntime_across_the_range(bert, shape):
    model, engine = bert
    feeds = _bert_feeds(*shape)
    got = engine.run(feeds)
    ref = _ort(model, feeds)
    for k in ref:
        _close(got[k], ref[k])


def test_saved_engine_runs_every_shape_after_loading(cnn, bert, tmp_path):
    for (model, engine), feeds in (
        (cnn, {"pixel_values": np.random.default_rng(7).standard_normal((6, 3, 32, 32)).astype(np.float32)}),
        (bert, _bert_feeds(4, 6, seed=7)),
    ):
        path = tmp_path / "m.engine"
        engine.save(path)
        loaded = graphc.runtime.load(path)
        assert [p.describe() for p in loaded.profiles] == [p.describe() for p in engine.profiles]
        ref = _ort(model, feeds)
        got = loaded.run(feeds)
        for k in ref:
            _close(got[k], ref[k])


@pytest.mark.parametrize(
    "shape, message",
    [
        ((9, 3, 32, 32), "input 'pixel_values' dim 0 is 9, outside the profile's range 1..8"),
        ((2, 3, 31, 32), "input 'pixel_values' dim 2 is 31, outside the profile's range fixed at 32"),
    ],
)
def test_cnn_refuses_shapes_outside_the_profile(cnn, shape, message):
    _model, engine = cnn
    with pytest.raises(EngineInputError) as e:
        engine.run({"pixel_values": np.zeros(shape, np.float32)})
    assert str(e.value) == message


def test_transformer_refuses_disagreeing_and_outside_dims(bert):
    _model, engine = bert
    feeds = _bert_feeds(2, 5)
    feeds["attention_mask"] = np.ones((2, 4), np.int64)
    with pytest.raises(EngineInputError, match="^input 'attention_mask' dim 1 is 4 but input 'input_ids' dim 1 is 5"):
        engine.run(feeds)
    with pytest.raises(EngineInputError, match=r"^input 'input_ids' dim 1 is 7, outside the profile's range 4\.\.6$"):
        engine.run(_bert_feeds(2, 7))
    with pytest.raises(EngineInputError, match="has rank 1"):
        engine.run({"input_ids": np.zeros(4, np.int64), "attention_mask": np.zeros(4, np.int64)})


def test_several_profiles(tmp_path):
    model = models.build("mlp", size="tiny")
    name = model.graph.input[0].name
    feat = model.graph.input[0].type.tensor_type.shape.dim[1].dim_value
    engine = graphc.compile(
        model,
        target="cpu",
        min_shapes=[{name: [1, feat]}, {name: [16, feat]}],
        opt_shapes=[{name: [2, feat]}, {name: [16, feat]}],
        max_shapes=[{name: [4, feat]}, {name: [20, feat]}],
    )
    assert len(engine.profiles) == 2
    path = tmp_path / "m.engine"
    engine.save(path)
    loaded = graphc.runtime.load(path)
    for batch in (1, 3, 16, 18, 20):
        x = np.random.default_rng(batch).standard_normal((batch, feat)).astype(np.float32)
        ref = _ort(model, {name: x})
        got = loaded.run({name: x})
        for k in ref:
            _close(got[k], ref[k])
    with pytest.raises(EngineInputError, match="^profile 0: .* 1..4; profile 1: .* 16..20$"):
        loaded.run({name: np.zeros((8, feat), np.float32)})


def test_batcher_takes_the_profile_range(cnn):
    _model, engine = cnn
    x = np.random.default_rng(3).standard_normal((1, 3, 32, 32)).astype(np.float32)
    with graphc.runtime.Batcher(engine, max_batch=8, max_wait_ms=1) as b:
        futures = [b.submit({"pixel_values": x + i}) for i in range(5)]
        outs = [f.result(timeout=60) for f in futures]
    for i, out in enumerate(outs):
        ref = engine.run({"pixel_values": x + i})
        _close(out["logits"], ref["logits"])


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(min_shapes={"pixel_values": [1, 3, 32, 32]}), "opt_shapes is missing"),
        (
            _bert_profile() | {"min_shapes": {"pixel_values": [1, 3, 32, 32]}},
            "the model has no input 'attention_mask'; its inputs are ['pixel_values']",
        ),
        (
            dict(
                min_shapes={"pixel_values": [4, 3, 32, 32]},
                opt_shapes={"pixel_values": [2, 3, 32, 32]},
                max_shapes={"pixel_values": [8, 3, 32, 32]},
            ),
            "input 'pixel_values' dim 0: needs min <= opt <= max, got 4, 2, 8",
        ),
        (
            dict(
                min_shapes={"pixel_values": [1, 4, 32, 32]},
                opt_shapes={"pixel_values": [2, 4, 32, 32]},
                max_shapes={"pixel_values": [8, 4, 32, 32]},
            ),
            "input 'pixel_values' dim 1 is fixed at 3 in the model; the profile gives 4..4",
        ),
        (
            dict(
                min_shapes={"pixel_values": [1, 3, 32]},
                opt_shapes={"pixel_values": [2, 3, 32]},
                max_shapes={"pixel_values": [8, 3, 32]},
            ),
            "input 'pixel_values' has rank 4",
        ),
    ],
)
def test_profile_errors_are_one_line(kwargs, message):
    model = models.build("resnet", size="tiny")
    with pytest.raises(CompileError) as e:
        graphc.compile(model, target="cpu", **kwargs)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_shapes_and_profile_may_not_both_set_a_dim():
    model = models.build("bert", size="tiny")
    with pytest.raises(CompileError, match="dim 'batch' has a size in shapes and a range in the profile"):
        graphc.compile(model, target="cpu", shapes={"batch": 2}, **_bert_profile())
    with pytest.raises(CompileError, match="input 'input_ids' has a shape in shapes and in the profile"):
        graphc.compile(model, target="cpu", shapes={"input_ids": (2, 5)}, **_bert_profile())


def test_too_many_exact_sizes_is_refused_with_the_reason():
    model = models.build("bert", size="tiny")
    with pytest.raises(CompileError) as e:
        graphc.compile(model, target="cpu", **_bert_profile((1, 1), (2, 8), (4, 100)))
    msg = str(e.value)
    assert "over the limit of 64" in msg and "'seq' (100 sizes" in msg and "\n" not in msg


def test_report_and_build_info_say_what_was_built(bert):
    _model, engine = bert
    (rep,) = engine.report["profiles"]
    assert rep["min"]["input_ids"] == [1, 4] and rep["max"]["input_ids"] == [6, 6]
    assert len(rep["buckets"]) == 15
    # the largest bucket's arena bounds the memory of any one run
    assert rep["arena_bytes_max"] >= engine.memory.arena_bytes
    assert engine.build_info["options"]["max_shapes"]["input_ids"] == [6, 6]


@pytest.mark.parametrize("lo, opt, hi", [(1, 8, 32), (1, 1, 1), (3, 3, 100), (1, 4, 8), (16, 20, 64), (2, 2, 3)])
def test_padded_buckets_pad_no_request_by_more_than_a_quarter(lo, opt, hi):
    from graphc.profiles import MAX_PADDING, padded_sizes

    sizes = padded_sizes(lo, opt, hi)
    assert {lo, opt, hi} <= set(sizes) and sizes == sorted(set(sizes)) and lo <= sizes[0] and sizes[-1] <= hi
    for n in range(lo, hi + 1):
        bucket = min(b for b in sizes if b >= n)
        assert bucket <= MAX_PADDING * n, (n, bucket)
    assert padded_sizes(1, 8, 32) == [1, 2, 3, 5, 7, 8, 10, 13, 17, 22, 28, 32]


def test_a_repeated_request_shape_skips_the_checks_but_not_for_other_requests(bert):
    model, engine = bert
    feeds = _bert_feeds(3, 5, seed=11)
    first = engine.run(feeds)
    seen = len(engine.dynamic._seen)
    again = engine.run({k: v.copy() for k, v in feeds.items()})  # same names, dtypes and shapes: remembered
    assert len(engine.dynamic._seen) == seen
    for k in first:
        np.testing.assert_array_equal(first[k], again[k])
    ref = _ort(model, feeds)
    for k in ref:
        _close(again[k], ref[k])
    # the same shapes with another dtype, an extra input or a list are checked in full, every time
    with pytest.raises(EngineInputError, match="has dtype int32"):
        engine.run({k: v.astype(np.int32) for k, v in feeds.items()})
    with pytest.raises(EngineInputError, match="unknown input"):
        engine.run({**feeds, "extra": feeds["input_ids"]})
    with pytest.raises(EngineInputError, match="is missing"):
        engine.run({"input_ids": feeds["input_ids"]})
    got = engine.run({k: v.tolist() for k, v in feeds.items()})
    for k in ref:
        _close(got[k], ref[k])


def test_a_bucket_is_the_plan_a_static_engine_of_its_shape_has(cnn):
    """Why a dynamic engine at a bucket's shape is as fast as a static one: it is the same plan."""
    model, engine = cnn
    (p,) = engine.profiles
    for batch in (4, 8):  # the engine's own plan (opt) and another bucket
        static = graphc.compile(model, target="cpu", shapes={"pixel_values": [batch, 3, 32, 32]})
        bucket = next(b for b in p.buckets if b.sizes["batch"] == batch)
        plan, memory = (engine.plan, engine.memory) if bucket.main else (bucket.plan, bucket.memory)
        # every step, launch, tensor and arena offset (plan.nodes is the IR, for reports only)
        assert plan.to_json() == static.plan.to_json() and memory == static.memory
