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
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer repetitions")
    ap.add_argument("--tune", action="store_true", help="time every tile of the search space")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--layers", default="", help="comma-separated layer names (default: all)")
    ap.add_argument("--verbose", action="store_true", help="with --tune: print every candidate's time")
    ap.add_argument(
        "--no-graphs",
        action="store_true",
        help="time plain launches (host launch overhead included) instead of CUDA graph replays",
    )
    args = ap.parse_args(argv)
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
    print(f"# relu(conv3x3(x) + b), fp16 NHWC, batch {args.batch}; median of {reps} {how} (CUDA events)")
    header = (
        f"{'layer':8} {'HxWxC':>12} {'graphc us':>10} {'TFLOP/s':>8} {'cuDNN us':>9} {'TFLOP/s':>8} {'ratio':>6}  tile"
    )
    print(header)
    ratios = []
    chosen = [x for x in LAYERS if not args.layers or x[0] in args.layers.split(",")]
    for name, hw, c in chosen:
        (ms, params, err), t_torch, flops = bench_layer(args.batch, hw, c, arch, warmup, reps, args.tune, args.verbose)
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
