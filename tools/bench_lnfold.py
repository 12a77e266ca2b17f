"""Does the LayerNorm fold pay on an H200? (docs/layernorm_fold.md, step 1: the kernel alone)

    python tools/bench_lnfold.py [--shape 128x2304x768 ...] [--json OUT]

Per shape M x N x K (default: BERT-base's / ViT-B/16's QKV and FFN1 at batch 1), fp16, CUDA-graph
replays timed by the tuner's timer (codegen.tuner.replay_ms, the graphs taking turns), us:

- ``ln+gemm``: a graphc engine (sm_90, fp16 IO) of LayerNormalization -> MatMul -> Add, i.e. what
  a model runs today: the LayerNorm kernel and the GEMM (the wgmma cluster split-K at these rows,
  launched plain);
- ``ln+gemm pdl``: the same engine built with GRAPHC_PDL_CLUSTERS=1 (its cluster GEMM under PDL);
- ``gemm``: an engine of MatMul -> Add alone (what the GEMM costs without the norm);
- ``fold``: the cp.async wgmma kernel with LNFOLD (codegen/lnfold.py) at the engine GEMM's tile and
  K slices, one launch in a captured graph; its output checked against float64 first.

A fold that beats ``ln+gemm`` (and ``ln+gemm pdl``) is worth the compiler work of steps 2-3.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

DEFAULT_SHAPES = ("128x2304x768", "128x3072x768", "197x2304x768", "197x3072x768")
EPS = 1e-5


def _model(m: int, n: int, k: int, rng: np.random.Generator, norm: bool):
    from onnx import TensorProto, helper, numpy_helper

    g = (1 + 0.1 * rng.standard_normal(k)).astype(np.float32)
    b = (0.1 * rng.standard_normal(k)).astype(np.float32)
    w = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
    c = (0.1 * rng.standard_normal(n)).astype(np.float32)
    nodes = [helper.make_node("LayerNormalization", ["h", "g", "b"], ["y"], epsilon=EPS)] if norm else []
    nodes += [
        helper.make_node("MatMul", ["y" if norm else "h", "w"], ["m"]),
        helper.make_node("Add", ["m", "c"], ["o"]),
    ]
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(c, "c")]
    if norm:
        inits += [numpy_helper.from_array(g, "g"), numpy_helper.from_array(b, "b")]
    graph = helper.make_graph(
        nodes,
        "lnfold",
        [helper.make_tensor_value_info("h", TensorProto.FLOAT, [m, k])],
        [helper.make_tensor_value_info("o", TensorProto.FLOAT, [m, n])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model, (g, b, w, c)


def _engine(model, pdl_clusters: bool):
    import graphc
    from graphc.runtime.pdl import pdl_clusters as clusters_env

    with clusters_env(pdl_clusters):  # read when the engine is built
        return graphc.compile(model, target="cuda", precision="fp16", io_precision="fp16", arch=["sm_90"])


def _gemm_params(engine) -> dict:
    (p,) = [
        ln.params for s in engine.plan.steps for ln in s.launches if ln.family == "gemm" and not ln.params.get("reduce")
    ]
    return p


def bench_shape(m: int, n: int, k: int) -> dict:
    import cupy

    from graphc.codegen import lnfold
    from graphc.codegen.tuner import replay_ms

    rng = np.random.default_rng(0)
    model, (g, b, w, c) = _model(m, n, k, rng, norm=True)
    plain, pdl = _engine(model, False), _engine(model, True)
    gemm_only = _engine(_model(m, n, k, np.random.default_rng(0), norm=False)[0], False)
    p = _gemm_params(plain)
    if p.get("path") != "wgmma" or p.get("BM") != 64:
        return {"shape": f"{m}x{n}x{k}", "skipped": f"the engine's GEMM is not the 64-row wgmma kernel: {p}"}
    ctx = lnfold.context(m, n, k, splits=int(p.get("SPLITS", 1)), eps=EPS, bn=int(p["BN"]))
    kern, fn = lnfold.launchable(ctx)
    h = rng.standard_normal((m, k)).astype(np.float16)
    f = lnfold.fold_weights(g, b, w, c)
    dev = {name: cupy.asarray(x) for name, x in lnfold.host_args(ctx, kern, h, f).items()}
    args = tuple(dev[x] for x in kern.args)
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        fn(kern.grid, kern.block, args, shared_mem=kern.shared_bytes)
        stream.synchronize()
        ref = lnfold.reference(h, g, b, w, c, EPS)[0]
        out = cupy.asnumpy(dev[ctx.step.outputs[0]]).astype(np.float64)
        err = float(np.linalg.norm(out - ref) / np.linalg.norm(ref))
        stream.begin_capture()
        fn(kern.grid, kern.block, args, shared_mem=kern.shared_bytes)
        fold_graph = stream.end_capture()
    graphs = []
    for e in (plain, pdl, gemm_only):
        cctx = e.executor.default
        cctx.views["h"].set(h)
        cctx.run({name: cctx.views[name] for name in cctx.plan.inputs}, sync=True)  # captures its graph
        graphs.append((cctx.replay_graph(), cctx.stream, cctx.device))
    graphs.append((fold_graph, stream, cupy.cuda.Device().id))
    ms = replay_ms(graphs, rounds=9, calls=50)
    labels = ("ln+gemm", "ln+gemm pdl", "gemm", "fold")
    row = {"shape": f"{m}x{n}x{k}", "gemm_params": {key: p.get(key) for key in ("BN", "SPLITS", "CLUSTER")}}
    row.update({label: round(t * 1000, 2) for label, t in zip(labels, ms, strict=True)})
    row["fold_rel_err"] = err
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", action="append", help="MxNxK (repeatable)")
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args(argv)
    rows = []
    for shape in args.shape or DEFAULT_SHAPES:
        m, n, k = (int(v) for v in shape.lower().split("x"))
        row = bench_shape(m, n, k)
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
