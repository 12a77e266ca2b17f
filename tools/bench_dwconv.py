"""Micro-benchmark of graphc's NHWC depthwise conv kernel (fp16, bias, no epilogue) on the
depthwise layers of ConvNeXt-T and MobileNetV2, for several strip lengths QT, against cuDNN
(PyTorch's channels_last conv2d, when PyTorch is installed) and optionally against an older
conv.cu.j2 (the one-pixel-a-thread kernel).

    python3 tools/bench_dwconv.py [--old-template OLD/conv.cu.j2] [--json OUT.json] [--md OUT.md]

Each kernel is timed as one CUDA-graph replay of 200 launches (so host launch cost is not
counted), rotating through enough input/output buffers to exceed the L2 cache, best of 3; its
output is checked against PyTorch's (or, without PyTorch, against graphc.interpret on a slice).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger("bench_dwconv")
LAUNCHES = 200
ROTATE_BYTES = 256 << 20  # more than an H200's 50 MB of L2


@dataclass(frozen=True)
class Layer:
    name: str
    n: int
    h: int
    w: int
    c: int
    r: int
    stride: int
    pad: int
    qts: tuple[Any, ...]  # forced QT values; None: the heuristic's; ("vc", v, qt): both forced


LAYERS = [
    Layer("convnext-s0-b32", 32, 56, 56, 96, 7, 1, 3, (1, 2, 3, 4, 5, None, ("vc", 4, 6))),
    Layer("convnext-s1-b32", 32, 28, 28, 192, 7, 1, 3, (1, 2, None)),
    Layer("convnext-s2-b32", 32, 14, 14, 384, 7, 1, 3, (1, None)),
    Layer("convnext-s3-b32", 32, 7, 7, 768, 7, 1, 3, (1, None)),
    Layer("convnext-s0-b1", 1, 56, 56, 96, 7, 1, 3, (1, 4, None)),
    Layer("convnext-s3-b1", 1, 7, 7, 768, 7, 1, 3, (4, None)),
    Layer("mbv2-112x32-s1-b32", 32, 112, 112, 32, 3, 1, 1, (1, None)),
    Layer("mbv2-112x96-s2-b32", 32, 112, 112, 96, 3, 2, 1, (1, 2, None)),
    Layer("mbv2-56x144-s1-b32", 32, 56, 56, 144, 3, 1, 1, (1, 4, None)),
    Layer("mbv2-56x144-s2-b32", 32, 56, 56, 144, 3, 2, 1, (1, None)),
    Layer("mbv2-7x960-s1-b32", 32, 7, 7, 960, 3, 1, 1, (1, None)),
    Layer("mbv2-56x144-s1-b1", 1, 56, 56, 144, 3, 1, 1, (1, None)),
]


def layer_graph(layer: Layer, seed: int = 0):
    from graphc.ir.builder import GraphBuilder
    from graphc.ir.types import DType, TensorType
    from graphc.ops.layout_ops import ConvNHWCAttrs

    rng = np.random.default_rng(seed)
    b = GraphBuilder(layer.name)
    x = b.add_input("x", TensorType(DType.float16, (layer.n, layer.h, layer.w, layer.c)))
    wt = (rng.standard_normal((layer.c, layer.r, layer.r, 1)) / layer.r).astype(np.float16)
    bias = rng.standard_normal(layer.c).astype(np.float16)
    attrs = ConvNHWCAttrs(
        kernel_shape=(layer.r, layer.r), strides=(layer.stride,) * 2, pads=(layer.pad,) * 4, dilations=(1, 1),
        group=layer.c,
    )  # fmt: skip
    y = b.add_node("ConvNHWC", [x, b.add_constant(wt, "w"), b.add_constant(bias, "b")], attrs, domain="graphc")
    b.set_outputs([y.outputs[0]])
    return b.build()


def _old_depthwise_params(g, *_args) -> dict[str, Any]:
    """The one-pixel-a-thread kernel's parameters (conv.py before the strips), for --old-template."""
    from graphc.codegen.kernel import ceil_div

    vc = 1
    if g.kg == 1:
        for cand in (16 // g.dtype.itemsize, 8 // g.dtype.itemsize, 4 // g.dtype.itemsize, 2):
            if cand > 1 and g.c % cand == 0:
                vc = cand
                break
    cv = ceil_div(g.k, vc)
    cvb = min(cv, 32)
    while cvb > 1 and math.prod(g.kernel) * cvb * vc * 4 > 32 * 1024:
        cvb //= 2
    return {"vc": vc, "cvb": cvb, "pix": max(1, 256 // cvb), "strips": g.m, "tail": g.k % vc != 0}


@contextlib.contextmanager
def _old_kernel(template: Path):
    """Render conv.cu.j2 from the file `template` (the other templates from the package)."""
    import jinja2

    from graphc.codegen import kernel as kernel_mod
    from graphc.codegen.families import conv as conv_family

    env = jinja2.Environment(
        loader=jinja2.ChoiceLoader(
            [
                jinja2.DictLoader({"conv.cu.j2": template.read_text()}),
                jinja2.FileSystemLoader(str(kernel_mod.TEMPLATE_DIR)),
            ]
        ),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    saved = kernel_mod._env, conv_family._depthwise_params
    kernel_mod._env, conv_family._depthwise_params = (lambda: env), _old_depthwise_params
    try:
        yield
    finally:
        kernel_mod._env, conv_family._depthwise_params = saved


def kernel_for(graph, params: dict[str, Any] | None):
    from graphc.codegen.kernel import family_for
    from graphc.codegen.lower import lower_to_plan

    plan = lower_to_plan(graph)
    weights = {k: c.data for k, c in graph.constants.items()}
    (step,) = [s for s in plan.steps if not s.alias]
    ctx = plan.context(step, weights, params=params)
    (src,) = family_for(ctx).generate(ctx)
    return src


def _compile(job: tuple[str, str, str]) -> bytes:
    from graphc.codegen.nvrtc import compile_cubin

    return compile_cubin(*job)


def time_graph(cp, launch_one, nbuf: int) -> float:
    """Microseconds a launch: one CUDA graph of LAUNCHES launches, replayed, best of 3."""
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        for i in range(3):
            launch_one(i % nbuf, stream)
        stream.begin_capture()
        for i in range(LAUNCHES):
            launch_one(i % nbuf, stream)
        graph = stream.end_capture()
        graph.launch(stream)
        stream.synchronize()
        best = math.inf
        for _ in range(3):
            start, end = cp.cuda.Event(), cp.cuda.Event()
            start.record(stream)
            graph.launch(stream)
            end.record(stream)
            end.synchronize()
            best = min(best, cp.cuda.get_elapsed_time(start, end) * 1000 / LAUNCHES)
    return best


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old-template", type=Path, help="an older conv.cu.j2 to time as 'old'")
    ap.add_argument("--layers", help="comma-separated layer names (default: all)")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--md", type=Path)
    ap.add_argument("--arch", help="compile for this arch only, time nothing (a check without a GPU)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    from graphc.codegen.build import local_gpu_arch

    arch = args.arch or local_gpu_arch()
    if arch is None:
        print("bench_dwconv: no GPU (--arch compiles only)", file=sys.stderr)
        return 2
    layers = [la for la in LAYERS if not args.layers or la.name in args.layers.split(",")]
    # every variant's source first, compiled in parallel
    variants = []  # (layer, graph, label, src)
    for la in layers:
        g = layer_graph(la)
        if args.old_template:
            with _old_kernel(args.old_template):
                variants.append((la, g, "old", kernel_for(g, None)))
        mine: dict[tuple[int, int], list[Any]] = {}
        for qt in la.qts:
            params = None if qt is None else {"vc": qt[1], "qt": qt[2]} if isinstance(qt, tuple) else {"qt": qt}
            src = kernel_for(g, params)
            key = (src.params["vc"], src.params["qt"])
            v = mine.setdefault(key, [la, g, f"vc{key[0]} qt{key[1]}", src])
            if qt is None:
                v[2] += " (default)"
        variants += [tuple(v) for v in mine.values()]
    with ProcessPoolExecutor(max_workers=8) as pool:
        cubins = list(pool.map(_compile, [(s.source, s.name, arch) for _, _, _, s in variants]))
    if args.arch:
        for la, _, label, src in variants:
            log.info("%-20s %-18s compiled for %s, grid %s block %s", la.name, label, arch, src.grid, src.block)
        return 0
    import cupy as cp

    try:
        import torch
        import torch.nn.functional as F

        torch.backends.cudnn.benchmark = True
    except ImportError:
        torch = None
    rows = []
    for (la, g, label, src), cubin in zip(variants, cubins, strict=True):
        mod = cp.cuda.function.Module()
        mod.load(cubin)
        fn = mod.get_function(src.name)
        x_shape = (la.n, la.h, la.w, la.c)
        out_shape = tuple(g.outputs[0].type.static_shape)
        per = 2 * (math.prod(x_shape) + math.prod(out_shape))
        nbuf = max(2, min(32, -(-ROTATE_BYTES // per)))
        rng = np.random.default_rng(1)
        xs = [cp.asarray(rng.standard_normal(x_shape).astype(np.float16)) for _ in range(nbuf)]
        ys = [cp.empty(out_shape, np.float16) for _ in range(nbuf)]
        consts = {k: cp.asarray(c.data) for k, c in g.constants.items()}
        y_name = g.outputs[0].name

        def launch(i, stream, fn=fn, src=src, xs=xs, ys=ys, consts=consts, y_name=y_name):
            a = [xs[i] if n == "x" else ys[i] if n == y_name else consts[n] for n in src.args]
            fn(src.grid, src.block, tuple(a), shared_mem=src.shared_bytes, stream=stream)

        us = time_graph(cp, launch, nbuf)
        row = {"layer": la.name, "kernel": label, "us": round(us, 2), "GB/s": round(per / us / 1e3, 1)}
        row.update({k: src.params[k] for k in ("vc", "qt", "cvb", "pix") if k in src.params})
        if torch is not None:
            tx = torch.as_tensor(xs[0], device="cuda").permute(0, 3, 1, 2)  # NCHW view of NHWC memory
            tw = torch.as_tensor(consts["w"], device="cuda").permute(0, 3, 1, 2).contiguous()
            tb = torch.as_tensor(consts["b"], device="cuda")
            ref = F.conv2d(tx, tw, tb, stride=la.stride, padding=la.pad, groups=la.c).permute(0, 2, 3, 1)
            got = torch.as_tensor(ys[0], device="cuda")
            row["max_err"] = float((got.float() - ref.float()).abs().max())
        rows.append(row)
        log.info("%-20s %-18s %8.2f us %7.1f GB/s %s", la.name, label, us, row["GB/s"], row.get("max_err", ""))
    if torch is not None:
        for la in layers:
            xs = [
                torch.randn(la.n, la.c, la.h, la.w, device="cuda", dtype=torch.float16).to(
                    memory_format=torch.channels_last
                )
                for _ in range(max(2, min(32, -(-ROTATE_BYTES // (4 * la.n * la.h * la.w * la.c)))))
            ]
            tw = torch.randn(la.c, 1, la.r, la.r, device="cuda", dtype=torch.float16)
            tb = torch.randn(la.c, device="cuda", dtype=torch.float16)
            for i in range(3):
                F.conv2d(xs[i % len(xs)], tw, tb, stride=la.stride, padding=la.pad, groups=la.c)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for i in range(LAUNCHES):
                    F.conv2d(xs[i % len(xs)], tw, tb, stride=la.stride, padding=la.pad, groups=la.c)
            best = math.inf
            for _ in range(3):
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                graph.replay()
                e.record()
                e.synchronize()
                best = min(best, s.elapsed_time(e) * 1000 / LAUNCHES)
            rows.append({"layer": la.name, "kernel": f"cuDNN (torch {torch.__version__})", "us": round(best, 2)})
            log.info("%-20s %-18s %8.2f us", la.name, "cuDNN", best)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    if args.md:
        lines = ["| layer | kernel | us | GB/s | max err vs cuDNN |", "| --- | --- | --- | --- | --- |"]
        lines += [
            f"| {r['layer']} | {r['kernel']} | {r['us']} | {r.get('GB/s', '')} | {r.get('max_err', '')} |" for r in rows
        ]
        args.md.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
