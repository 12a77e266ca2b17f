"""Benchmark: graphc's fused conv + bias + ReLU (fp16, NHWC, tensor cores) against cuDNN through
PyTorch (conv2d + bias + relu, channels_last fp16), same process, same GPU.

    python tools/bench_conv.py            # ResNet-50's 3x3 convolutions at batch 32
    python tools/bench_conv.py --quick    # fewer repetitions
    python tools/bench_conv.py --tune     # also time every tile of the search space, keep the best

Timing: CUDA events around each replay of a CUDA graph of the launches (so the host's launch
overhead, which dominates PyTorch's three ops at batch 1, counts for neither side; --no-graphs
times plain launches), after a warm-up, median of many; inputs rotate over enough buffers to
exceed the L2 cache. Each graphc output is checked against PyTorch's first.
Needs a GPU with cupy, torch and NVRTC. These are the conv family's own kernels (every arch); what an
sm_90 engine runs instead (the wgmma implicit GEMM, the TMA GEMM) is timed by tools/bench_conv_sm90.py
(--set igemm for these layers and the rest of ResNet-50's).

    python tools/bench_conv.py --split-k [--batch 1 --batch 8 --batch 32] [--out DIR]

times every split-K conv of an sm_90 ResNet-50 (the layers of tools/bench_conv_sm90.py whose
heuristic splits K at that batch) in each split-K form, in one run: today's two launches (the
wgmma implicit GEMM, or the TMA GEMM for a stride-1 1x1, then the reduce kernel) against cluster
split-K (the implicit GEMM's K slices as one thread-block cluster, one launch; split_k_variants).
Each form is a CUDA graph of `iters` launch groups over rotating inputs (the pair, or the single
launch, so the gap between two launches counts), captured twice: plain launches, and with every
launch after the graph's first programmatic (PDL, as an sm_90 engine at batch 1 launches them);
microseconds per group, the median of 7 replays. Outputs are checked against cuDNN (PyTorch) first.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

# (name, H=W, C=K) of ResNet-50's 3x3 stride-1 convolutions
LAYERS = [("conv2_x", 56, 64), ("conv3_x", 28, 128), ("conv4_x", 14, 256), ("conv5_x", 7, 512)]
L2_BYTES = 64 << 20


def build_kernel(n: int, hw: int, c: int, k: int, params=None):
    """The conv family's kernel for relu(conv3x3(x, w) + b) in NHWC fp16."""
    from graphc.codegen.kernel import family_for
    from graphc.codegen.lower import lower_to_plan
    from graphc.ir.attrs import onnx_attrs_class
    from graphc.ir.builder import GraphBuilder
    from graphc.ir.types import DType, TensorType
    from graphc.ops.fused import ACC, OP, EpilogueOp, FusedAttrs
    from graphc.ops.layout_ops import ConvNHWCAttrs

    b = GraphBuilder("bench")
    x = b.add_input("x", TensorType(DType.float16, (n, hw, hw, c)))
    w = b.add_constant(np.zeros((k, 3, 3, c), np.float16), "w")
    bias = b.add_constant(np.zeros((k,), np.float16), "b")
    attrs = ConvNHWCAttrs(kernel_shape=(3, 3), pads=(1, 1, 1, 1))
    fa = FusedAttrs(
        anchor_op="ConvNHWC",
        anchor_domain="graphc",
        anchor_attrs=attrs,
        anchor_inputs=3,
        epilogue=(EpilogueOp("Relu", onnx_attrs_class("Relu")(), (ACC,)),),
        outputs=(OP(0),),
    )
    y = b.add_node("Fused", [x, w, bias], fa, domain="graphc").outputs[0]
    b.set_outputs([y])
    graph = b.build()
    plan = lower_to_plan(graph)
    step = plan.steps[0]
    weights = {name: c.data for name, c in graph.constants.items()}
    ctx = plan.context(step, weights, precision="fp16", params=params)
    fam = family_for(ctx)
    return fam, ctx, fam.generate(ctx)


def load(src, arch: str):
    import cupy

    from graphc.codegen.nvrtc import compile_cubin

    mod = cupy.cuda.function.Module()
    mod.load(compile_cubin(src.source, src.name, arch))
    fn = mod.get_function(src.name)
    if src.shared_bytes > 48 * 1024:
        from cupy.cuda import driver

        attr = getattr(driver, "CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES", 8)
        driver.funcSetAttribute(fn.ptr, attr, src.shared_bytes)
    return mod, fn


def time_events(launch, n_buffers: int, warmup: int, reps: int) -> float:
    """Median milliseconds of launch(i) over rotating buffer index i, each timed with events."""
    import torch

    for i in range(warmup):
        launch(i % n_buffers)
    torch.cuda.synchronize()
    times = []
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        starts[i].record()
        launch(i % n_buffers)
        ends[i].record()
    torch.cuda.synchronize()
    times = [s.elapsed_time(e) for s, e in zip(starts, ends, strict=True)]
    return statistics.median(times)


def _external(cupy, ptr: int):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # cupy 14 prefers Stream.from_external
        return cupy.cuda.ExternalStream(ptr)


def graphed(launch, n_buffers: int):
    """launch(i) captured once per buffer into CUDA graphs (cupy's launches join torch's capture
    stream): replays time the GPU work without the host's launch overhead."""
    import cupy
    import torch

    stream = torch.cuda.Stream()
    graphs = []
    for i in range(n_buffers):
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=stream), _external(cupy, stream.cuda_stream):
            launch(i)
        graphs.append(g)
    return lambda i: graphs[i].replay()


def bench_layer(
    n: int,
    hw: int,
    c: int,
    arch: str,
    warmup: int,
    reps: int,
    tune: bool,
    verbose: bool = False,
    use_graphs: bool = True,
):
    import cupy
    import torch
    import torch.nn.functional as F

    k = c
    g = torch.Generator(device="cuda").manual_seed(0)
    in_bytes = n * hw * hw * c * 2
    n_buf = max(2, min(16, -(-2 * L2_BYTES // in_bytes)))
    xs = [
        torch.randn(n, c, hw, hw, device="cuda", generator=g).half().contiguous(memory_format=torch.channels_last)
        for _ in range(n_buf)
    ]
    w = (torch.randn(k, c, 3, 3, device="cuda", generator=g) / (3 * c**0.5)).half()
    bias = torch.randn(k, device="cuda", generator=g).half()
    w_cl = w.contiguous(memory_format=torch.channels_last)

    # cuDNN through PyTorch
    torch.backends.cudnn.benchmark = True

    def torch_launch(i):
        return F.relu(F.conv2d(xs[i], w_cl, bias, padding=1))

    ref = torch_launch(0)
    for i in range(3):  # cuDNN's algorithm search happens here, before any capture
        torch_launch(i % n_buf)
    torch.cuda.synchronize()
    t_torch = time_events(graphed(torch_launch, n_buf) if use_graphs else torch_launch, n_buf, warmup, reps)

    # graphc: NHWC buffers are the channels_last tensors' storage (N, H, W, C)
    x_cp = [cupy.from_dlpack(x.permute(0, 2, 3, 1)) for x in xs]
    w_krsc = cupy.from_dlpack(w.permute(0, 2, 3, 1).contiguous())
    b_cp = cupy.from_dlpack(bias)
    out = cupy.empty((n, hw, hw, k), dtype=cupy.float16)

    fam, ctx, srcs = build_kernel(n, hw, c, k)
    candidates = [(srcs[0].params, srcs)]
    if tune and fam.search_space is not None:
        candidates = []
        for p in fam.search_space(ctx):
            _, _, ss = build_kernel(n, hw, c, k, params=p)
            candidates.append((ss[0].params, ss))
    best = None
    for params, ss in candidates:
        # one or two launches (split-K: partial sums into the workspace, then the reduction)
        fns = [load(s, arch) for s in ss]
        ws = cupy.empty(max(1, max(s.workspace_bytes for s in ss) // 4), dtype=cupy.float32)
        args = [[{"x": None, "w": w_krsc, "b": b_cp, "@workspace": ws}.get(a, out) for a in s.args] for s in ss]

        def launch(i, fns=fns, ss=ss, args=args):
            for (_mod, fn), s, a in zip(fns, ss, args, strict=True):
                a = tuple(x_cp[i] if name == "x" else v for name, v in zip(s.args, a, strict=True))
                fn(s.grid, s.block, a, shared_mem=s.shared_bytes)

        out.fill(float("nan"))
        launch(0)
        cupy.cuda.Device().synchronize()
        got = torch.from_dlpack(out).permute(0, 3, 1, 2).float()
        err = float((got - ref.float()).norm() / ref.float().norm())
        timed = graphed(launch, n_buf) if use_graphs else launch
        ms = time_events(timed, n_buf, warmup, reps) if err < 1e-2 else float("inf")
        if verbose:
            print(f"    {params} {ms * 1e3:.1f} us (rel err {err:.1e})")
        if best is None or ms < best[0]:
            best = (ms, params, err)
    flops = 2.0 * n * hw * hw * k * 9 * c
    return best, t_torch, flops


# ---- split-K forms on sm_90 (--split-k) ----------------------------------------------------------
SPLIT_BATCHES = (1, 8, 32)
PORTABLE_CLUSTER = 8


def split_k_layers(n: int) -> list[tuple]:
    """(hw, c, k, r, stride, residual, relu, conv context, the heuristic's form) of every ResNet-50
    layer whose sm_90 kernel splits K at batch n: "tma" (a stride-1 1x1 on the TMA GEMM) or "ig"."""
    from bench_conv_sm90 import IGEMM_LAYERS, LAYERS, conv_ctx

    from graphc.codegen.families import conv_sm90, gemm_sm90
    from graphc.codegen.families.conv import conv_step, geometry

    out = []
    for hw, c, k, res, relu in LAYERS:
        ctx = conv_ctx(n, hw, c, k, res, relu)
        prob = conv_sm90.gemm_problem(ctx)
        if not isinstance(prob, str) and conv_sm90.selected(prob) and gemm_sm90.heuristic(prob)["SPLITS"] > 1:
            out.append((hw, c, k, 1, 1, res, relu, ctx, "tma"))
    for hw, c, k, r, stride, res, relu in IGEMM_LAYERS:
        ctx = conv_ctx(n, hw, c, k, res, relu, r, stride)
        if conv_sm90.igemm_heuristic(geometry(ctx, conv_step(ctx)))["SPLITS"] > 1:
            out.append((hw, c, k, r, stride, res, relu, ctx, "ig"))
    return out


def split_k_variants(ctx, form: str) -> list[tuple[str, list]]:
    """(label, kernels) of each form timed for one layer. "ig"-layers: the heuristic's two launches
    ("two"), the same tile and slices as one cluster ("cluster"), the cluster at the next larger
    slice count ("cluster+"); "tma"-layers: the TMA GEMM and its reduce kernel ("tma"), the implicit
    GEMM as a cluster at the TMA GEMM's slice count with 64- and 128-column tiles ("ig64c", "ig128c"),
    and the implicit GEMM's own heuristic (two launches or unsplit, "ig")."""
    from graphc.codegen.families import conv_sm90, gemm_sm90
    from graphc.codegen.families.conv import conv_step, geometry
    from graphc.codegen.kernel import ceil_div

    g = geometry(ctx, conv_step(ctx))
    h = conv_sm90.igemm_heuristic(g)
    ktiles = ceil_div(g.rsc, conv_sm90.IGEMM_BK)
    vs: list[tuple[str, Any]] = []
    if form == "ig":
        s = h["SPLITS"]
        vs += [("two", {**h, "CLUSTER": 0}), ("cluster", {**h, "CLUSTER": 1})]
        more = next((t for t in (2, 3, 4, 6, 8) if t > s and ktiles // t >= 3), None)
        if more is not None:
            vs.append(("cluster+", {**h, "SPLITS": more, "CLUSTER": 1}))
    else:
        s = min(PORTABLE_CLUSTER, gemm_sm90.heuristic(conv_sm90.gemm_problem(ctx))["SPLITS"])
        vs.append(("ig", None))
        for bn in (64, 128):
            vs.append((f"ig{bn}c", {"BN": bn, "SPLITS": s, "CLUSTER": 1}))
    out: list[tuple[str, list]] = []
    if form == "tma":
        out.append(("tma", conv_sm90.generate(ctx)))
    for label, p in vs:
        try:
            out.append((label, conv_sm90.igemm_generate(ctx, p)))
        except Exception as e:  # noqa: BLE001 - a variant that does not render is reported and skipped
            print(f"  skip {label} {p}: {e}", flush=True)
    return out


def graph_us(stream, groups: list, iters: int, reps: int = 7, lead=None) -> float:
    """Median microseconds per launch group: `iters` groups (callables that launch on `stream`,
    rotating over operand sets; the first one `lead` where given) captured into one CUDA graph,
    replays timed with events."""
    import cupy

    for i in range(3):
        groups[i % len(groups)]()
    stream.synchronize()
    stream.begin_capture()
    try:
        for i in range(iters):
            (lead if i == 0 and lead is not None else groups[i % len(groups)])()
    finally:
        graph = stream.end_capture()
    graph.launch(stream)
    stream.synchronize()
    times = []
    for _ in range(reps):
        a, b = cupy.cuda.Event(), cupy.cuda.Event()
        a.record(stream)
        graph.launch(stream)
        b.record(stream)
        b.synchronize()
        times.append(cupy.cuda.get_elapsed_time(a, b) * 1e3 / iters)
    return statistics.median(times)


def split_k_bench(batches: list[int], iters: int, out_dir: Path) -> int:
    import json
    import warnings

    import cupy
    import torch
    import torch.nn.functional as F
    from cuda.bindings import driver

    from graphc.codegen.nvrtc import CompileJob, compile_all
    from graphc.runtime.cuda import ProgrammaticLaunch, allow_large_shared_memory
    from graphc.runtime.tensormap import TensorMapTable, is_tmap_arg, spec_from_json, tmap_index

    warnings.filterwarnings("ignore", category=DeprecationWarning)
    todo = [(n, lay, split_k_variants(lay[7], lay[8])) for n in batches for lay in split_k_layers(n)]
    every = [k for *_, vs in todo for _, ks in vs for k in ks]
    t0 = time.time()
    cubins = iter(compile_all([CompileJob(k.name, k.source, k.params.get("requires_arch", "sm_90")) for k in every]))
    print(f"# compiled {len(every)} kernels in {time.time() - t0:.1f} s", flush=True)
    props = torch.cuda.get_device_properties(0)
    print(
        f"# {props.name}, {props.multi_processor_count} SMs, torch {torch.__version__}, "
        f"driver {cupy.cuda.runtime.driverGetVersion()}; us per launch group (graph of {iters})",
        flush=True,
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    log = (out_dir / "conv_split_k.jsonl").open("a")
    stream = cupy.cuda.Stream(non_blocking=True)
    table = []
    for n, (hw, c, k, r, stride, res, relu, ctx, form), variants in todo:
        oh = (hw + 2 * (r // 2) - r) // stride + 1
        gen = torch.Generator(device="cuda").manual_seed(n * 31 + hw * 7 + c + k + r)
        per = n * (hw * hw * c + oh * oh * k * (2 if res else 1)) * 2
        sets = max(2, min(16, -(-3 * 60 * 2**20 // per)))
        cl = torch.channels_last
        xs = [
            torch.randn(n, c, hw, hw, device="cuda", generator=gen).half().contiguous(memory_format=cl)
            for _ in range(sets)
        ]
        rs = [
            torch.randn(n, k, oh, oh, device="cuda", generator=gen).half().contiguous(memory_format=cl)
            for _ in range(sets)
        ]
        w = (
            (torch.randn(k, c, r, r, device="cuda", generator=gen) / (c * r * r) ** 0.5)
            .half()
            .contiguous(memory_format=cl)
        )
        bias = torch.randn(k, device="cuda", generator=gen).half()
        y = F.conv2d(xs[0].float(), w.float(), bias.float(), stride=stride, padding=r // 2)
        y = y + rs[0].float() if res else y
        ref = F.relu(y) if relu else y
        xv = [cupy.from_dlpack(x.permute(0, 2, 3, 1)) for x in xs]
        rv = [cupy.from_dlpack(t.permute(0, 2, 3, 1)) for t in rs]
        wv, bv = cupy.from_dlpack(w.permute(0, 2, 3, 1).contiguous()), cupy.from_dlpack(bias)
        out = cupy.empty((n, oh, oh, k), dtype=cupy.float16)
        torch.cuda.synchronize()
        row_us, first = {}, None
        for label, ks in variants:
            cub = [next(cubins) for _ in ks]
            row = {
                "N": n,
                "HW": hw,
                "C": c,
                "K": k,
                "R": r,
                "stride": stride,
                "form": form,
                "variant": label,
                "params": [{q: v for q, v in kk.params.items() if q != "tmaps"} for kk in ks],
            }
            try:
                ws = cupy.empty(max(1, max(kk.workspace_bytes for kk in ks)), dtype=cupy.uint8)
                loaded = []
                for kk, cb in zip(ks, cub, strict=True):
                    mod = cupy.cuda.function.Module()
                    mod.load(cb)
                    fn = mod.get_function(kk.name)
                    if kk.shared_bytes > 48 * 1024:
                        allow_large_shared_memory(fn, kk.shared_bytes)
                    specs = [spec_from_json(d, kk.name) for d in kk.params.get("tmaps", [])]
                    tabs = [
                        TensorMapTable(cupy, [(sp, {"x": xv[j], "w": wv}[sp.tensor].data.ptr) for sp in specs])
                        if specs
                        else None
                        for j in range(sets)
                    ]
                    loaded.append((kk, fn, mod, tabs))

                named = [
                    {"x": xv[j], "r": rv[j], "w": wv, "b": bv, "@workspace": ws, ctx.step.outputs[0]: out}
                    for j in range(sets)
                ]
                bound = [
                    [
                        tuple(tabs[j].arg(tmap_index(a, kk.name)) if is_tmap_arg(a) else named[j][a] for a in kk.args)
                        for kk, _, _, tabs in loaded
                    ]
                    for j in range(sets)
                ]

                plain = []
                for j in range(sets):
                    calls = [(fn, kk, a) for (kk, fn, _, _), a in zip(loaded, bound[j], strict=True)]

                    def go(calls=calls):
                        for fn, kk, a in calls:
                            fn(tuple(kk.grid), tuple(kk.block), a, shared_mem=kk.shared_bytes, stream=stream)

                    plain.append(go)
                out.fill(float("nan"))
                cupy.cuda.Device().synchronize()  # the fill ran on cupy's stream, not on `stream`
                plain[0]()
                stream.synchronize()
                got = torch.from_dlpack(out).permute(0, 3, 1, 2).float()
                err = float((got - ref).norm() / ref.norm()) if not torch.isnan(got).any() else float("nan")
                row["err"] = err
                if first is None:
                    first = got.clone()
                row["maxdiff_vs_first"] = float((got - first).abs().max())
                if not err < 1e-2:
                    raise RuntimeError(f"wrong result: rel err {err}")
                row["plain_us"] = graph_us(stream, plain, iters)
                # PDL: every launch but the graph's first programmatic (an engine's chain)
                pdl = [
                    [
                        ProgrammaticLaunch(driver, fn, kk.grid, kk.block, a, kk.shared_bytes, stream, kk.name)
                        for (kk, fn, _, _), a in zip(loaded, bound[j], strict=True)
                    ]
                    for j in range(sets)
                ]
                fn0, kk0, a0 = (loaded[0][1], loaded[0][0], bound[0][0])

                def lead(fn0=fn0, kk0=kk0, a0=a0, rest=pdl[0][1:]):
                    fn0(tuple(kk0.grid), tuple(kk0.block), a0, shared_mem=kk0.shared_bytes, stream=stream)
                    for f in rest:
                        f()

                groups = [lambda pl=pl: [f() for f in pl] for pl in pdl]
                row["pdl_us"] = graph_us(stream, groups, iters, lead=lead)
            except Exception as e:  # noqa: BLE001 - a failing variant is reported, the rest still run
                row["error"] = str(e)[:300]
                print(f"  FAIL N={n} {hw} {c}->{k} {r}x{r}/s{stride} {label}: {row['error']}", flush=True)
            log.write(json.dumps(row) + "\n")
            log.flush()
            row_us[label] = row
        cells = " | ".join(
            f"{lb} {v['plain_us']:6.2f}/{v['pdl_us']:6.2f}" if "pdl_us" in v else f"{lb} -" for lb, v in row_us.items()
        )
        line = f"N={n:2} {hw:3}x{hw:<3} {c:4}->{k:4} {r}x{r}/s{stride} {form:3} M={n * oh * oh:6} | {cells}"
        print(line, flush=True)
        table.append(line)
        xs = rs = xv = rv = []
        torch.cuda.empty_cache()
    print("\n".join(["", f"# {props.name}; us per launch group, plain / PDL", *table]))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer repetitions")
    ap.add_argument("--tune", action="store_true", help="time every tile of the search space")
    ap.add_argument("--batch", type=int, action="append", help="default 32; --split-k: 1, 8 and 32")
    ap.add_argument("--layers", default="", help="comma-separated layer names (default: all)")
    ap.add_argument("--verbose", action="store_true", help="with --tune: print every candidate's time")
    ap.add_argument(
        "--no-graphs",
        action="store_true",
        help="time plain launches (host launch overhead included) instead of CUDA graph replays",
    )
    ap.add_argument(
        "--split-k", action="store_true", help="sm_90: ResNet-50's split-K convs, two launches vs a cluster"
    )
    ap.add_argument("--out", type=Path, default=Path("."), help="--split-k: DIR/conv_split_k.jsonl")
    ap.add_argument("--iters", type=int, default=20, help="--split-k: launch groups per graph")
    args = ap.parse_args(argv)
    if args.split_k:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        batches = args.batch or list(SPLIT_BATCHES)
        return split_k_bench(batches, args.iters, args.out)
    batch = (args.batch or [32])[0]
    import cupy
    import torch

    from graphc.codegen.nvrtc import nvrtc_version

    arch = "sm_" + cupy.cuda.Device(0).compute_capability
    warmup, reps = (5, 20) if args.quick else (20, 100)
    print(
        f"# GPU {torch.cuda.get_device_name(0)} ({arch}), driver {cupy.cuda.runtime.driverGetVersion()}, "
        f"torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}, NVRTC {nvrtc_version()}"
    )
    how = "plain launches" if args.no_graphs else "CUDA graph replays"
    print(f"# relu(conv3x3(x) + b), fp16 NHWC, batch {batch}; median of {reps} {how} (CUDA events)")
    header = (
        f"{'layer':8} {'HxWxC':>12} {'graphc us':>10} {'TFLOP/s':>8} {'cuDNN us':>9} {'TFLOP/s':>8} {'ratio':>6}  tile"
    )
    print(header)
    ratios = []
    chosen = [x for x in LAYERS if not args.layers or x[0] in args.layers.split(",")]
    for name, hw, c in chosen:
        (ms, params, err), t_torch, flops = bench_layer(batch, hw, c, arch, warmup, reps, args.tune, args.verbose)
        ratio = t_torch / ms
        ratios.append(ratio)
        tile = f"{params.get('bm')}x{params.get('bn')}x{params.get('bkc', 0) * 8} s{params.get('stages')}"
        tile += f" k/{params.get('splits', 1)}"
        print(
            f"{name:8} {f'{hw}x{hw}x{c}':>12} {ms * 1e3:10.1f} {flops / ms / 1e9:8.1f} "
            f"{t_torch * 1e3:9.1f} {flops / t_torch / 1e9:8.1f} {ratio:6.2f}  {tile} (rel err {err:.1e})"
        )
    geo = float(np.exp(np.mean(np.log(ratios))))
    print(f"# graphc / cuDNN speed (cuDNN time / graphc time): geometric mean {geo:.2f} (target >= 0.50)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
