"""INT8 calibration (graphc/calibrate.py): thresholds on known distributions, sample loading,
the JSON cache, and the CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest

import graphc
import models
from graphc.calibrate import BINS, Calibrator, TensorStats, _kl_divergences, entropy_threshold, load_samples, threshold
from graphc.cli import main as cli
from graphc.errors import CompileError, InputError


def _stats(x: np.ndarray, *more: np.ndarray) -> TensorStats:
    s = TensorStats()
    for a in (x, *more):
        s.add(a, keep_histogram=True)
    return s


def test_percentile_of_a_gaussian():
    x = np.random.default_rng(0).standard_normal(2_000_000).astype(np.float32)
    s = _stats(x)
    # P(|x| > 3.8906) = 1e-4 for a standard normal; a bin is max|x| / 2048 (about 0.0025) wide
    assert abs(threshold(s, "percentile", 99.99) - 3.8906) < 0.05
    assert abs(threshold(s, "percentile", 95.0) - 1.9600) < 0.01
    assert threshold(s, "minmax", 0) == pytest.approx(float(np.abs(x).max()))


def test_entropy_clips_outliers_and_keeps_the_bulk():
    x = np.random.default_rng(1).standard_normal(1_000_000).astype(np.float32)
    x[:20] = 60.0  # far outliers
    s = _stats(x)
    t = threshold(s, "entropy", 0)
    assert s.amax == 60.0
    assert 2.5 < t < 8.0, t
    # A uniform distribution has nothing to clip: the threshold stays near its end.
    u = _stats(np.random.default_rng(2).uniform(-1, 1, 500_000).astype(np.float32))
    assert threshold(u, "entropy", 0) > 0.9


def test_entropy_coarse_to_fine_is_near_the_exhaustive_minimum():
    x = np.abs(np.random.default_rng(3).laplace(size=500_000))
    top = float(x.max())
    hist, _ = np.histogram(x, bins=BINS, range=(0, top))
    kl = _kl_divergences(hist.astype(np.float64), np.arange(128, BINS + 1), 128)
    coarse = round(entropy_threshold(hist, top) / top * BINS)
    exhaustive = round(entropy_threshold(hist, top, coarse=1) / top * BINS)
    assert exhaustive == 128 + int(np.argmin(kl))
    # KL is flat and a little noisy near its minimum: the coarse search lands within 5% of it
    assert kl[coarse - 128] <= 1.05 * kl.min()


def test_histogram_widens_when_a_later_sample_goes_beyond():
    a = np.linspace(-1, 1, 1001, dtype=np.float32)
    s = _stats(a, 10 * a)
    assert s.hist_max >= 10.0 and s.amax == 10.0
    assert s.hist.sum() + s.zeros == 2 * a.size


def test_load_samples_npz_folder_and_errors(tmp_path):
    x = np.random.default_rng(0).standard_normal((5, 1, 3)).astype(np.float32)
    np.savez(tmp_path / "calib.npz", x=x)
    got = load_samples(tmp_path / "calib.npz", ["x"])
    assert len(got) == 5 and np.array_equal(got[3]["x"], x[3])
    d = tmp_path / "feeds"
    d.mkdir()
    for i in range(3):
        np.savez(d / f"{i:02d}.npz", x=x[i])
    assert [f["x"].tolist() for f in load_samples(d, ["x"])] == [x[i].tolist() for i in range(3)]
    with pytest.raises(InputError, match="no array for input"):
        load_samples(tmp_path / "calib.npz", ["y"])
    np.savez(tmp_path / "bad.npz", x=x, y=x[:2])
    with pytest.raises(InputError, match="same N"):
        load_samples(tmp_path / "bad.npz", ["x", "y"])
    with pytest.raises(CompileError, match="calibration_method"):
        Calibrator(None, method="kl")


@pytest.fixture(scope="module")
def resnet():
    m = models.build("resnet", size="tiny")
    samples = [models.sample_inputs("resnet", m, seed=i) for i in range(4)]
    shapes = {k: v.shape for k, v in samples[0].items()}
    return m, samples, shapes


def test_cache_round_trips_and_is_reused(resnet, tmp_path):
    m, samples, shapes = resnet
    cache = tmp_path / "calib.json"
    kw = dict(target="cpu", precision="int8", shapes=shapes, calibration_cache=cache)
    first = graphc.compile(m, calibration_data=samples, **kw)
    q = first.report["quantization"]
    assert q["cache"] == "written" and q["samples"] == 4 and q["integer_ops"]["ConvInteger"] > 0
    doc = json.loads(cache.read_text())
    assert doc["method"] == "entropy" and set(doc["tensors"]) == set(q["tensors"])
    again = graphc.compile(m, **kw)  # no samples: everything from the cache
    assert again.report["quantization"]["cache"] == "hit"
    feed = models.sample_inputs("resnet", m, seed=50)
    a, b = first.run(feed), again.run(feed)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    # another method does not reuse the entropy thresholds
    with pytest.raises(CompileError, match="needs samples"):
        graphc.compile(m, calibration_method="minmax", **kw)
    cache.write_text("{not json")
    with pytest.raises(CompileError, match="not readable JSON"):
        graphc.compile(m, **kw)


def test_cli_compiles_an_int8_engine(resnet, tmp_path, capsys):
    m, samples, shapes = resnet
    models.save(m, tmp_path / "r.onnx")
    np.savez(tmp_path / "calib.npz", **{k: np.stack([s[k] for s in samples]) for k in samples[0]})
    shape = "x".join(map(str, next(iter(shapes.values()))))
    name = next(iter(shapes))
    rc = cli(
        ["compile", str(tmp_path / "r.onnx"), "-o", str(tmp_path / "r.engine"), "--target", "cpu", "--int8",
         "--shapes", f"{name}:{shape}", "--calibration-data", str(tmp_path / "calib.npz"),
         "--calibration-method", "percentile", "--report", str(tmp_path / "r.json")]
    )  # fmt: skip
    assert rc == 0, capsys.readouterr().err
    rep = json.loads((tmp_path / "r.json").read_text())["quantization"]
    assert rep["method"] == "percentile" and rep["samples"] == 4 and rep["tensors"]
    engine = graphc.runtime.load(tmp_path / "r.engine")
    assert engine.run(samples[0])
