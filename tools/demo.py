"""The main job (README's first command): build a zoo model, compile it for the GPU when there is
one and for the CPU otherwise, run it, compare with ONNX Runtime, and print the report.

    python tools/demo.py [--model resnet] [--size tiny|full] [--precision fp16]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: the models package

import numpy as np  # noqa: E402

import graphc  # noqa: E402
import models  # noqa: E402
from graphc.cli import compare_outputs  # noqa: E402
from graphc.inspect import compile_summary, format_bytes  # noqa: E402


def gpu_present() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="resnet", choices=models.list_models())
    p.add_argument("--size", default="tiny", choices=["tiny", "full"])
    p.add_argument(
        "--precision", default=None, choices=["fp32", "fp16", "bf16"], help="default: fp16 on a GPU, fp32 on the CPU"
    )
    p.add_argument("--target", choices=["cuda", "cpu"], help="default: cuda when a GPU is present, else cpu")
    args = p.parse_args(argv)
    target = args.target or ("cuda" if gpu_present() else "cpu")
    precision = args.precision or ("fp16" if target == "cuda" else "fp32")

    print(f"1. building the zoo model '{args.model}' ({args.size}) with seeded random weights")
    model = models.build(args.model, size=args.size)
    feeds = models.sample_inputs(args.model, model)
    shapes = {k: v.shape for k, v in feeds.items()}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"{args.model}.onnx"
        models.save(model, path)
        print(f"   {path.name}: {len(model.graph.node)} ONNX nodes, inputs {shapes}")

        print(f"2. compiling for {target} in {precision}" + ("" if target == "cuda" else " (no GPU found)"))
        t0 = time.perf_counter()
        engine = graphc.compile(str(path), target=target, precision=precision, shapes=shapes)
        print(f"   compiled in {time.perf_counter() - t0:.2f} s")
        # the CLI's summary (its last line is the memory plan): one wording and one set of units
        print("   " + compile_summary(engine.report, max_lines=4).replace("\n", "\n   "))
        engine_path = Path(tmp) / f"{args.model}.engine"
        engine.save(engine_path)
        print(f"   engine file: {format_bytes(engine_path.stat().st_size)}")

        print("3. loading the engine file and running it")
        loaded = graphc.runtime.load(engine_path)
        outs = loaded.run(feeds, to_numpy=True) if target == "cuda" else loaded.run(feeds)
        for k, v in outs.items():
            print(f"   {k}: {v.dtype}{list(v.shape)}")

        print("4. comparing with ONNX Runtime on the same inputs")
        import onnxruntime as ort

        sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        names = [o.name for o in sess.get_outputs()]
        ref = dict(zip(names, sess.run(names, feeds), strict=True))
        ok, lines = compare_outputs({k: np.asarray(v) for k, v in outs.items()}, ref, precision)
        for line in lines:
            print("   " + line)
    print("OK: graphc matches ONNX Runtime" if ok else "MISMATCH: graphc differs from ONNX Runtime")
    return 0 if ok else 1


if __name__ == "__main__":
    import graphc.runtime  # noqa: F401

    sys.exit(main())
