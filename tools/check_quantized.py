"""Quantized (QDQ) versions of the PyTorch exports: quantize each with ONNX Runtime's
`quantize_static` (uint8 activations calibrated on a few batches, per-channel int8 weights), then
compare four runs of the same inputs against ONNX Runtime executing the Q/DQ ops as written (graph
optimizations off, the format's definition):

- graphc (CPU engine, or a CUDA engine with --target cuda),
- ONNX Runtime with its optimizations (its int8 kernels: the usual deployment),
- and, for scale, the float model against the QDQ definition (the quantization error itself).

In a deep network, an activation that sits on a rounding boundary lands one quantization step away
when the sums run in another order, and that carries through later layers; so neither graphc nor
ONNX Runtime's int8 kernels reproduce the definition bit for bit. The check passes when graphc is
at least as close to the definition (cosine) as ONNX Runtime's own int8 kernels, less 0.001.

    python tools/check_quantized.py --exports /path/to/exports [--models resnet50,bert] [--target cuda]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
from bench_torch import cosine  # noqa: E402
from check_models import export_inputs  # noqa: E402

import graphc  # noqa: E402

CALIBRATION_BATCHES = 4
MARGIN = 1e-3


def ort_run(path: str, feeds: dict, optimize: bool) -> list[np.ndarray]:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    if not optimize:
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"]).run(None, feeds)


def quantize_qdq(src: Path, dst: Path, batches: list[dict]) -> None:
    """ONNX Runtime's quantize_static in the QDQ format: uint8 activations calibrated on `batches`
    (feed dicts), per-channel int8 weights in 7 bits (reduce_range: ORT's own int8 kernels on an x86
    CPU without VNNI saturate 8-bit weights' pair sums, so its run would not be the exact reference;
    tests/helpers.py INT8_EXACT_LO). tests/helpers.py quantizes the zoo models with it too."""
    from onnxruntime import quantization as q

    class Calibration(q.CalibrationDataReader):
        def __init__(self) -> None:
            self.batches = iter(batches)

        def get_next(self):
            return next(self.batches, None)

    q.quantize_static(
        str(src),
        str(dst),
        Calibration(),
        quant_format=q.QuantFormat.QDQ,
        activation_type=q.QuantType.QUInt8,
        weight_type=q.QuantType.QInt8,
        per_channel=True,
        reduce_range=True,
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--exports", required=True, type=Path)
    p.add_argument("--models", default="resnet50,mobilenetv2,vit,bert,gpt2")
    p.add_argument("--exporter", default="torchscript")
    p.add_argument("--target", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--precision", default="fp32")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--seq", type=int, default=128)
    args = p.parse_args(argv)
    print(
        "| model | Q nodes | graphc cos to QDQ | ORT int8 cos to QDQ | float model cos to QDQ "
        "| graphc max err / scale | ok |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    bad = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            src, spec = args.exports / f"{name}.{args.exporter}.onnx", args.exports / f"{name}.json"
            dst = Path(tmp) / f"{name}.qdq.onnx"
            calibration = [export_inputs(spec, args.batch, args.seq, seed=i) for i in range(CALIBRATION_BATCHES)]
            quantize_qdq(src, dst, calibration)
            import onnx

            n_q = sum(n.op_type == "QuantizeLinear" for n in onnx.load(dst, load_external_data=False).graph.node)
            feeds = export_inputs(spec, args.batch, args.seq, seed=CALIBRATION_BATCHES + 1)
            definition = ort_run(str(dst), feeds, optimize=False)[0]
            int8 = ort_run(str(dst), feeds, optimize=True)[0]
            floating = ort_run(str(src), feeds, optimize=True)[0]
            shapes = {k: v.shape for k, v in feeds.items()}
            eng = graphc.compile(str(dst), target=args.target, precision=args.precision, shapes=shapes)
            outs = eng.run(feeds, to_numpy=True) if args.target == "cuda" else eng.run(feeds)
            ours = np.asarray(next(iter(outs.values())))
            c_ours, c_int8 = cosine(ours, definition), cosine(int8, definition)
            err = float(np.abs(ours.astype(np.float64) - definition).max() / np.abs(definition).max())
            ok = c_ours >= c_int8 - MARGIN and np.isfinite(ours).all()
            bad += not ok
            print(
                f"| {name} | {n_q} | {c_ours:.5f} | {c_int8:.5f} | {cosine(floating, definition):.5f} | "
                f"{err:.3g} | {'yes' if ok else 'NO'} |",
                flush=True,
            )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
