"""The CUDA target compiles engines with optimization profiles here (NVRTC needs no GPU): every
bucket's kernels are in the engine file, and the file validates as a whole. On a GPU machine the
`gpu` test runs the loaded engine at min, a middle shape and max against ONNX Runtime."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

import graphc
import models
from graphc.runtime.format import read_engine

pytestmark = pytest.mark.slow  # six CUDA builds through NVRTC (about a minute on two cores)


def _names_profile(names, lo, opt, hi):
    return dict(
        min_shapes={n: list(lo) for n in names},
        opt_shapes={n: list(opt) for n in names},
        max_shapes={n: list(hi) for n in names},
    )


CASES = {
    # small ranges: each bucket is a full CUDA build (NVRTC time on a 2-core CI machine)
    "resnet": (("pixel_values",), (1, 3, 32, 32), (2, 3, 32, 32), (2, 3, 32, 32)),
    "bert": (("input_ids", "attention_mask"), (1, 4), (2, 4), (2, 5)),
}


@pytest.fixture(scope="module", params=sorted(CASES))
def cuda_engine(request, tmp_path_factory):
    name = request.param
    names, lo, opt, hi = CASES[name]
    model = models.build(name, size="tiny")
    d = tmp_path_factory.mktemp(f"cuda-{name}")
    engine = graphc.compile(
        model, target="cuda", arch=["sm_90"], cache_dir=d / "cache", **_names_profile(names, lo, opt, hi)
    )
    path = d / "m.engine"
    engine.save(path)
    return name, model, engine, path


def test_every_bucket_is_built_and_validates(cuda_engine):
    name, _model, engine, path = cuda_engine
    ef = read_engine(path)  # every bucket's plan and launches checked against the kernel table
    (p,) = ef.profiles
    want = {"resnet": [{"batch": 1}, {"batch": 2}], "bert": None}[name]
    if want is not None:
        assert sorted((b.sizes for b in p.buckets), key=lambda s: s["batch"]) == want
    else:
        assert {(b.sizes["batch"], b.sizes["seq"]) for b in p.buckets} == {(1, 4), (1, 5), (2, 4), (2, 5)}
    kernels = set(ef.manifest["kernels"])
    for b in p.buckets:
        if b.main:
            continue
        used = {ln.digest for s in b.plan.steps for ln in s.launches}
        assert used and used <= kernels
        assert {d for d in used if d in ef.cubins["sm_90"]} == used  # a cubin for each, not only source
        # a bucket's plan is specialized to its own shapes
        assert [b.plan.tensors[n].shape for n in b.plan.inputs] == [b.shapes[n] for n in b.plan.inputs]
    assert engine.profiles[0].describe() == p.describe()


@pytest.mark.gpu
def test_cuda_profile_engine_matches_onnxruntime(cuda_engine):
    import graphc.runtime

    name, model, _engine, path = cuda_engine
    loaded = graphc.runtime.load(path)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names, lo, _opt, hi = CASES[name]
    mid = tuple((a + b) // 2 for a, b in zip(lo, hi, strict=True))
    rng = np.random.default_rng(0)
    for shape in (lo, mid, hi):
        if name == "bert":
            feeds = {n: rng.integers(0, 2 if n == "attention_mask" else 64, size=shape).astype(np.int64) for n in names}
            feeds["attention_mask"][:, 0] = 1
        else:
            feeds = {names[0]: rng.standard_normal(shape).astype(np.float32)}
        got = loaded.run(feeds, to_numpy=True)
        for o, ref in zip([o.name for o in sess.get_outputs()], sess.run(None, feeds), strict=True):
            scale = float(np.abs(ref).max()) or 1.0
            assert float(np.abs(got[o] - ref).max()) <= 1e-3 * scale  # fp32 kernels, TF32 off
