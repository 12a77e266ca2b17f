"""Cold NVRTC time of whole models: each model compiled for CUDA (no GPU needed) into an empty kernel
cache, with the number of launches, distinct kernels and the seconds NVRTC took.

    python tools/time_nvrtc.py --exports /path/to/exports [--models resnet50,bert,gpt2] [--arch sm_90]

The exports are tools/export_torch.py's NAME.torchscript.onnx files.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import graphc  # noqa: E402

SHAPES = {"resnet50": {"batch": 1}, "mobilenetv2": {"batch": 1}, "vit": {"batch": 1}}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--exports", required=True, type=Path)
    p.add_argument("--models", default="resnet50,bert,gpt2")
    p.add_argument("--precision", default="fp16")
    p.add_argument("--arch", help="comma-separated archs (default: graphc.compile's)")
    args = p.parse_args(argv)
    print("| model | launches | kernels | NVRTC s |\n| --- | --- | --- | --- |")
    for name in args.models.split(","):
        cache = Path(tempfile.mkdtemp(prefix="graphc_nvrtc_"))
        try:
            eng = graphc.compile(
                str(args.exports / f"{name}.torchscript.onnx"),
                target="cuda",
                precision=args.precision,
                shapes=SHAPES.get(name, {"batch": 1, "seq": 128}),
                arch=args.arch.split(",") if args.arch else None,
                cache_dir=cache,
            )
        finally:
            shutil.rmtree(cache, ignore_errors=True)
        cuda = eng.report["cuda"]
        print(f"| {name} | {cuda['launches']} | {cuda['kernels']} | {eng.report['timings']['nvrtc']:.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
