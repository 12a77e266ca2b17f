"""The CPU "Done when" of issue 13, measured: int8 CPU engines against ONNX Runtime.

    python tools/int8_accuracy.py --check cnn bert qdq calib [--size full] [--samples 16]
    python tools/int8_accuracy.py --check search --model resnet --accuracy cosine:0.9999

- cnn / bert: the zoo ResNet (full: ResNet-50 at 224) and BERT (full: BERT-base) as int8 CPU
  engines calibrated on `--samples` feeds (seeds 0..N-1), cosine of each output to ONNX
  Runtime's fp32 run on a held-out feed (seed 1000).
- qdq: the zoo ResNet quantized by ONNX Runtime (quantize_static, QDQ, uint8 activations,
  per-channel int8 weights, 3 calibration feeds), compiled with --precision int8 (its own scales),
  against ONNX Runtime's own int8 run (ORT_ENABLE_ALL: its QLinear kernels): the largest
  difference in units of the output's quantization step.
- calib: the wall time of calibrating `--calib-samples` (64) feeds of the ResNet, from the
  report (quantization.seconds and its split), and the whole compile.
- search: `--accuracy SPEC` on `--model`: the layers kept float and each point tried.

Each check prints one JSON line (machine, load average and versions in the first line).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))


def _cos(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def _ort(model, feeds: dict, optimized: bool = False) -> list[np.ndarray]:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.graph_optimization_level = (
        ort.GraphOptimizationLevel.ORT_ENABLE_ALL if optimized else ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    )
    return ort.InferenceSession(model.SerializeToString(), so).run(None, feeds)


def _emit(check: str, **fields) -> None:
    print(json.dumps({"check": check, **fields}), flush=True)


def _cpu_int8(model, calib: list[dict], **options):
    """graphc's CPU int8 engine of `model`, calibrated on `calib`, for the shapes of its first sample."""
    import graphc

    return graphc.compile(
        model,
        target="cpu",
        precision="int8",
        calibration_data=calib,
        shapes={k: v.shape for k, v in calib[0].items()},
        **options,
    )


def check_int8(name: str, size: str, samples: int, method: str) -> None:
    import models

    m = models.build(name, size=size)
    calib = [models.sample_inputs(name, m, seed=i) for i in range(samples)]
    test = models.sample_inputs(name, m, seed=1000)
    t0 = time.perf_counter()
    e = _cpu_int8(m, calib, calibration_method=method)
    compile_s = time.perf_counter() - t0
    ours = list(e.run(test).values())
    ref = _ort(m, test)
    q = e.report["quantization"]
    _emit(
        name,
        size=size,
        samples=samples,
        method=method,
        cosine=[round(_cos(a, b), 6) for a, b in zip(ours, ref, strict=True)],
        integer_ops=q["integer_ops"],
        calibration_s=q["seconds"],
        compile_s=round(compile_s, 2),
    )


def check_qdq(size: str) -> None:
    import onnx
    from check_quantized import quantize_qdq
    from onnx import numpy_helper

    import graphc
    import models

    m = models.build("resnet", size=size)
    folder = Path(os.environ.get("TMPDIR", "/tmp")) / f"int8_accuracy_{os.getpid()}"
    folder.mkdir(exist_ok=True)
    src, dst = folder / "resnet.onnx", folder / "resnet.qdq.onnx"
    models.save(m, src)
    quantize_qdq(src, dst, [models.sample_inputs("resnet", m, seed=i) for i in range(3)])
    qdq = onnx.load(dst)
    feeds = models.sample_inputs("resnet", m, seed=7)
    e = graphc.compile(qdq, target="cpu", precision="int8", shapes={k: v.shape for k, v in feeds.items()})
    ours = list(e.run(feeds).values())[0]
    theirs = _ort(qdq, feeds, optimized=True)[0]
    last = [n for n in qdq.graph.node if n.output[0] == qdq.graph.output[0].name][0]
    inits = {i.name: numpy_helper.to_array(i) for i in qdq.graph.initializer}
    step = float(inits[last.input[1]])
    diff = np.abs(ours - theirs)
    _emit(
        "qdq",
        size=size,
        integer_ops=e.report["quantization"]["integer_ops"],
        max_diff_steps=round(float(diff.max()) / step, 4),
        equal_fraction=round(float(np.mean(diff <= step * 1e-3)), 6),
        cosine=round(_cos(ours, theirs), 6),
    )


def check_calibration_time(size: str, samples: int, method: str) -> None:
    import models

    m = models.build("resnet", size=size)
    calib = [models.sample_inputs("resnet", m, seed=i) for i in range(samples)]
    t0 = time.perf_counter()
    e = _cpu_int8(m, calib, calibration_method=method)
    q = e.report["quantization"]
    _emit(
        "calib",
        size=size,
        samples=samples,
        method=method,
        calibration_s=q["seconds"],
        split=q["seconds_split"],
        compile_s=round(time.perf_counter() - t0, 2),
        load_avg_after=os.getloadavg()[0],
    )


def check_search(name: str, size: str, samples: int, spec: str, validation: int) -> None:
    import models

    m = models.build(name, size=size)
    calib = [models.sample_inputs(name, m, seed=i) for i in range(samples)]
    val = [models.sample_inputs(name, m, seed=500 + i) for i in range(validation)]
    t0 = time.perf_counter()
    e = _cpu_int8(
        m,
        calib,
        accuracy=spec,
        validation_data=val,
        accuracy_progress=lambda line: print(line, file=sys.stderr, flush=True),
    )
    acc = e.report["quantization"]["accuracy"]
    test = models.sample_inputs(name, m, seed=1000)
    ref = _ort(m, test)
    ours = list(e.run(test).values())
    _emit(
        "search",
        model=name,
        size=size,
        spec=spec,
        kept=acc["kept"],
        points=[{k: p[k] for k in ("kept", "value", "holds")} for p in acc["points"]],
        sensitivity_s=acc["seconds"]["sensitivity"],
        search_s=acc["seconds"]["total"],
        compile_s=round(time.perf_counter() - t0, 2),
        held_out_cosine_to_ort=[round(_cos(a, b), 6) for a, b in zip(ours, ref, strict=True)],
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--check", nargs="+", choices=["cnn", "bert", "qdq", "calib", "search"], required=True)
    p.add_argument("--size", default="tiny", choices=["tiny", "full"])
    p.add_argument("--samples", type=int, default=16)
    p.add_argument("--calib-samples", type=int, default=64)
    p.add_argument("--method", default="entropy", choices=["entropy", "minmax", "percentile"])
    p.add_argument("--model", default="resnet")
    p.add_argument("--accuracy", default="cosine:0.999")
    p.add_argument("--validation", type=int, default=8, help="search: validation feeds (seeds 500..)")
    args = p.parse_args(argv)
    import numpy
    import onnxruntime

    _emit(
        "machine",
        date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        cpus=os.cpu_count(),
        load_avg=os.getloadavg()[0],
        python=platform.python_version(),
        numpy=numpy.__version__,
        onnxruntime=onnxruntime.__version__,
        openblas_threads=os.environ.get("OPENBLAS_NUM_THREADS"),
    )
    for c in args.check:
        if c == "cnn":
            check_int8("resnet", args.size, args.samples, args.method)
        elif c == "bert":
            check_int8("bert", args.size, args.samples, args.method)
        elif c == "qdq":
            check_qdq(args.size)
        elif c == "calib":
            check_calibration_time(args.size, args.calib_samples, args.method)
        else:
            check_search(args.model, args.size, args.samples, args.accuracy, args.validation)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
