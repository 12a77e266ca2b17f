"""How close to fp32 can a model get in fp16 or bf16 at all? Two PyTorch measurements on the
models of tools/export_torch.py (same weights and inputs as the exports, seed 0):

- "model cast": the whole module cast to the precision (what PyTorch itself gives);
- "weights only": every parameter and buffer rounded to the precision and back, computed in fp32,
  i.e. the error of storing the weights in that format, with no rounding of activations at all.

Both as the cosine similarity of the first output to the fp32 output. An engine that stores its
weights in the precision cannot expect to beat "weights only" by much.

    python tools/precision_floor.py --models resnet50,mobilenetv2 --precision bf16,fp16 [--device cuda]
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import export_torch  # noqa: E402
import numpy as np  # noqa: E402
from bench_torch import cosine  # noqa: E402

DTYPES = {"fp16": "float16", "bf16": "bfloat16"}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="resnet50,mobilenetv2")
    p.add_argument("--precision", default="bf16,fp16")
    p.add_argument("--device", default="cpu")
    p.add_argument("--seq", type=int, default=128)
    args = p.parse_args(argv)
    import torch

    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    print("| model | precision | model cast: cosine | weights only: cosine |")
    print("| --- | --- | --- | --- |")
    for name in args.models.split(","):
        case = export_torch.CASES[name]
        dims = {"batch": 1, "seq": args.seq}
        module = export_torch._module(case, 0, "scaled", dims).to(args.device)
        rng = np.random.default_rng(0)
        feeds = {s.name: torch.from_numpy(export_torch._example(s, dims, rng)).to(args.device) for s in case.inputs}
        with torch.inference_mode():
            ref = module(**feeds)[0].float().cpu().numpy()
            for precision in args.precision.split(","):
                dtype = getattr(torch, DTYPES[precision])
                cast = copy.deepcopy(module).to(dtype)
                typed = {k: (v.to(dtype) if v.is_floating_point() else v) for k, v in feeds.items()}
                c_cast = cosine(ref, cast(**typed)[0].float().cpu().numpy())
                rounded = copy.deepcopy(module)
                for t in [*rounded.parameters(), *rounded.buffers()]:
                    if t.is_floating_point():
                        t.copy_(t.to(dtype).float())
                c_weights = cosine(ref, rounded(**feeds)[0].float().cpu().numpy())
                print(f"| {name} | {precision} | {c_cast:.6f} | {c_weights:.6f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
