"""ResNet-50's convolutions on Hopper: graphc's conv kernel ("tc", the conv family), the sm_90a kernels
of codegen/families/conv_sm90.py (the TMA GEMM for stride-1 1x1 convs, "tma"; the wgmma implicit GEMM
for the stem, 3x3 and strided 1x1 convs, "ig") and cuDNN (PyTorch conv2d, channels_last fp16, + bias
(+ residual) + ReLU), in one run on one GPU.

    python tools/bench_conv_sm90.py [--batch 32 --batch 1] [--set 1x1|igemm|all] [--out DIR]
    python tools/bench_conv_sm90.py --compile-only      # NVRTC every kernel, no GPU
    python tools/bench_conv_sm90.py --model --batch 32  # ResNet-50 engines with and without the igemm

Each graphc variant's output is poisoned (NaN), compared with PyTorch's (relative Frobenius error,
must be < 1e-2), then timed: `iters` launches over rotating inputs (together over 3x the L2) in one
CUDA graph, the median of 7 replays, per launch; PyTorch's ops are captured and timed the same way.
Rows stream to DIR/conv_sm90.jsonl; a table last.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tools.bench_timing import graph_launch_ms  # noqa: E402

# (input H = W, Cin, Cout, residual add, ReLU): every distinct stride-1 1x1 conv of ResNet-50 (v1.5)
LAYERS = [
    (56, 64, 64, False, True),
    (56, 64, 256, True, True),  # conv3 of stage 1 (residual + ReLU)
    (56, 64, 256, False, False),  # stage 1's projection shortcut (stride 1)
    (56, 256, 64, False, True),
    (56, 256, 128, False, True),
    (28, 128, 512, True, True),
    (28, 512, 128, False, True),
    (28, 512, 256, False, True),
    (14, 256, 1024, True, True),
    (14, 1024, 256, False, True),
    (14, 1024, 512, False, True),
    (7, 512, 2048, True, True),
    (7, 2048, 512, False, True),
]


# (input H = W, Cin, Cout, kernel R = S, stride, residual add, ReLU): every distinct ResNet-50 (v1.5)
# conv that is not a stride-1 1x1 (those are LAYERS): the stem, the 3x3 convs of stride 1 and 2, the
# strided 1x1 projection shortcuts. Pads R // 2.
IGEMM_LAYERS = [
    (56, 64, 64, 3, 1, False, True),
    (28, 128, 128, 3, 1, False, True),
    (14, 256, 256, 3, 1, False, True),
    (7, 512, 512, 3, 1, False, True),
    (224, 3, 64, 7, 2, False, True),  # the stem
    (56, 128, 128, 3, 2, False, True),
    (28, 256, 256, 3, 2, False, True),
    (14, 512, 512, 3, 2, False, True),
    (56, 256, 512, 1, 2, False, False),  # projection shortcuts (their add + ReLU run in conv3's epilogue)
    (28, 512, 1024, 1, 2, False, False),
    (14, 1024, 2048, 1, 2, False, False),
]


def out_hw(hw: int, r: int, stride: int) -> int:
    return (hw + 2 * (r // 2) - r) // stride + 1


def conv_ctx(n: int, hw: int, c: int, k: int, residual: bool, relu: bool, r: int = 1, stride: int = 1):
    """The plan step of Fused[ConvNHWC RxR + bias (+ residual) (+ ReLU)] and its weights."""
    from graphc.codegen.lower import lower_to_plan
    from graphc.ir.attrs import onnx_attrs_class
    from graphc.ir.builder import GraphBuilder
    from graphc.ir.types import DType, TensorType
    from graphc.ops.fused import ACC, IN, OP, EpilogueOp, FusedAttrs
    from graphc.ops.layout_ops import ConvNHWCAttrs

    b = GraphBuilder("bench")
    ins = [
        b.add_input("x", TensorType(DType.float16, (n, hw, hw, c))),
        b.add_constant(np.zeros((k, r, r, c), np.float16), "w"),
        b.add_constant(np.zeros((k,), np.float16), "b"),
    ]
    epi: list = []
    last = ACC
    if residual:
        oh = out_hw(hw, r, stride)
        ins.append(b.add_input("r", TensorType(DType.float16, (n, oh, oh, k))))
        epi.append(EpilogueOp("Add", onnx_attrs_class("Add")(), (last, IN(3))))
        last = OP(len(epi) - 1)
    if relu:
        epi.append(EpilogueOp("Relu", onnx_attrs_class("Relu")(), (last,)))
        last = OP(len(epi) - 1)
    fa = FusedAttrs(
        anchor_op="ConvNHWC",
        anchor_domain="graphc",
        anchor_attrs=ConvNHWCAttrs(kernel_shape=(r, r), strides=(stride, stride), pads=(r // 2,) * 4),
        anchor_inputs=3,
        epilogue=tuple(epi),
        outputs=(last,),
    )
    y = b.add_node("Fused", ins, fa, domain="graphc").outputs[0]
    b.set_outputs([y])
    graph = b.build()
    plan = lower_to_plan(graph)
    weights = {name: cst.data for name, cst in graph.constants.items()}
    return plan.context(plan.steps[0], weights, precision="fp16")


def candidates(n, hw, c, k, residual, relu) -> tuple[Any, list[tuple[str, Any, list]]]:
    from graphc.codegen.families import conv_sm90, gemm_sm90
    from graphc.codegen.kernel import family_for

    ctx = conv_ctx(n, hw, c, k, residual, relu)
    out = [("tc", None, family_for(ctx).generate(ctx))]
    prob = conv_sm90.gemm_problem(ctx)
    if isinstance(prob, str):
        return ctx, out
    h = gemm_sm90.heuristic(prob)
    vs = [None]
    for bn in (128, 256):
        if bn != h["BN"] and bn <= prob.N:
            vs.append({"BN": bn})
    if h["SPLITS"] == 1:
        vs.append({"BN": 128, "PINGPONG": 1})
    for p in vs:
        try:
            out.append(("tma" + ("*" if p is None else ""), p, conv_sm90.generate(ctx, p)))
        except Exception as e:  # noqa: BLE001 - a variant that does not render is reported and skipped
            print(f"  skip {p}: {e}")
    return ctx, out


def igemm_candidates(n, hw, c, k, r, stride, residual, relu) -> tuple[Any, list[tuple[str, Any, list]]]:
    """The conv family's kernel ("tc"), the wgmma implicit GEMM's heuristic choice ("ig*") and its
    neighbours (other tile widths, a shallower pipeline, two blocks per SM, split-K)."""
    from graphc.codegen.families import conv_sm90
    from graphc.codegen.families.conv import conv_step, geometry
    from graphc.codegen.kernel import ceil_div, family_for

    ctx = conv_ctx(n, hw, c, k, residual, relu, r, stride)
    out = [("tc", None, family_for(ctx).generate(ctx))]
    g = geometry(ctx, conv_step(ctx))
    h = conv_sm90.igemm_heuristic(g)
    ktiles = ceil_div(g.rsc, conv_sm90.IGEMM_BK)
    vs: list = [None]
    for bn in conv_sm90.IGEMM_BNS:
        if bn != h["BN"] and bn // 2 < k:
            vs.append({"BN": bn, "SPLITS": h["SPLITS"] if bn >= h["BN"] else 1})
    vs.append({"BN": h["BN"], "SPLITS": h["SPLITS"], "STAGES": 4})
    if h["BN"] <= 128:
        vs.append({"BN": h["BN"], "SPLITS": h["SPLITS"], "MINB": 2})
    if h["SPLITS"] == 1 and ktiles >= 24:
        vs.append({"BN": h["BN"], "SPLITS": 2})
    if h["SPLITS"] > 1:
        vs.append({"BN": h["BN"], "SPLITS": 1})
    if h["B_MODE"] == "tma":
        vs.append({**h, "B_MODE": "cp"})
    if ceil_div(g.m, conv_sm90.IGEMM_BM) * ceil_div(k, 128) < 132 and ktiles >= 24:
        # too few tiles for the SMs: the split-K neighbourhood (one launch and two)
        for bn, splits, extra in (
            (64, 2, {}),
            (64, 3, {}),
            (128, 2, {"SERIAL": 0}),
            (128, 3, {}),
            (128, 4, {"MINB": 2, "STAGES": 3}),
            (256, 4, {}),
            (256, 5, {}),
        ):
            if bn // 2 < k:
                vs.append({"BN": bn, "SPLITS": splits, **extra})
    seen, uniq = set(), []
    for p in vs:  # the heuristic's own choice once
        key = None if p is None else tuple(sorted(p.items()))
        if key not in seen:
            seen.add(key)
            uniq.append(p)
    vs = uniq
    for p in vs:
        try:
            out.append(("ig" + ("*" if p is None else ""), p, conv_sm90.igemm_generate(ctx, p)))
        except Exception as e:  # noqa: BLE001 - a variant that does not render is reported and skipped
            print(f"  skip {p}: {e}")
    return ctx, out


def model_bench(batches: list[int], cache: Path | None, compile_only: bool) -> int:
    """ResNet-50 (models/resnet.py full, fp16, sm_90) as one engine per batch, twice: with the wgmma
    implicit GEMM where conv_sm90's rules select it, and with it switched off (those convs on the conv
    family's kernel); both CUDA-graph replays (graphc.bench), outputs compared."""
    import graphc
    import models
    from graphc.codegen.families import conv_sm90

    real = conv_sm90.igemm_selected
    engines = {}
    for n in batches:
        model = models.build("resnet", size="full", batch=n)
        for label in ("igemm", "no-igemm"):
            conv_sm90.igemm_selected = real if label == "igemm" else (lambda g: "switched off by the benchmark")
            t0 = time.time()
            eng = graphc.compile(model, target="cuda", precision="fp16", arch=["sm_90"], cache_dir=cache)
            conv_sm90.igemm_selected = real
            count = sum(ln.params.get("variant") == "igemm" for s in eng.plan.steps for ln in s.launches)
            print(f"# batch {n} {label}: compiled in {time.time() - t0:.1f} s, {count} igemm launches", flush=True)
            engines[(n, label)] = eng
    if compile_only:
        return 0
    from graphc.bench import benchmark

    for n in batches:
        feeds = {"pixel_values": np.random.default_rng(0).standard_normal((n, 3, 224, 224)).astype(np.float32)}
        outs, ms = {}, {}
        for label in ("igemm", "no-igemm"):
            eng = engines[(n, label)]
            outs[label] = np.asarray(next(iter(eng.run(feeds, to_numpy=True).values())), np.float64)
            ms[label] = benchmark(eng, feeds, iterations=100, warmup=10)["latency"]["median_ms"]
        ref = outs["no-igemm"]
        err = float(np.linalg.norm(outs["igemm"] - ref) / np.linalg.norm(ref))
        print(
            f"ResNet-50 batch {n} fp16 sm_90: igemm {ms['igemm']:.3f} ms, without {ms['no-igemm']:.3f} ms "
            f"({ms['no-igemm'] / ms['igemm']:.2f}x); outputs rel. diff {err:.1e}",
            flush=True,
        )
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, action="append")
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--cache", type=Path)
    ap.add_argument("--compile-only", action="store_true")
    ap.add_argument(
        "--set", choices=("1x1", "igemm", "all"), default="1x1", help="stride-1 1x1 layers, the others, or both"
    )
    ap.add_argument("--out", type=Path, default=Path("."))
    ap.add_argument("--model", action="store_true", help="whole ResNet-50 engines with and without the igemm")
    args = ap.parse_args(argv)
    if args.model:
        return model_bench(args.batch or [32], args.cache, args.compile_only)
    from graphc.codegen.nvrtc import CompileJob, compile_all

    todo = []
    for n in args.batch or [32, 1]:
        if args.set in ("1x1", "all"):
            todo += [
                (n, hw, c, k, 1, 1, res, relu, candidates(n, hw, c, k, res, relu)) for hw, c, k, res, relu in LAYERS
            ]
        if args.set in ("igemm", "all"):
            todo += [(n, *lay, igemm_candidates(n, *lay)) for lay in IGEMM_LAYERS]
    every = [s for *_, (_, cands) in todo for _, _, ss in cands for s in ss]
    t0 = time.time()
    cubins = iter(
        compile_all(
            [CompileJob(s.name, s.source, s.params.get("requires_arch", "sm_90")) for s in every], cache_dir=args.cache
        )
    )
    print(f"# compiled {len(every)} kernels in {time.time() - t0:.1f} s", flush=True)
    if args.compile_only:
        return 0

    import warnings

    import cupy
    import torch
    import torch.nn.functional as F

    from graphc.runtime.cuda import allow_large_shared_memory
    from graphc.runtime.tensormap import TensorMapTable, is_tmap_arg, spec_from_json, tmap_index

    warnings.filterwarnings("ignore", category=DeprecationWarning)  # cupy's ExternalStream
    torch.backends.cudnn.benchmark = True
    props = torch.cuda.get_device_properties(0)
    cudnn = torch.backends.cudnn.version()
    print(f"# {props.name}, {props.multi_processor_count} SMs, torch {torch.__version__}, cuDNN {cudnn}")
    args.out.mkdir(parents=True, exist_ok=True)
    log = (args.out / "conv_sm90.jsonl").open("a")
    table = []
    for n, hw, c, k, r, stride, residual, relu, (ctx, cands) in todo:
        oh = out_hw(hw, r, stride)
        g = torch.Generator(device="cuda").manual_seed(n * 31 + hw * 7 + c + k)
        per = n * (hw * hw * c + oh * oh * k * (2 if residual else 1)) * 2
        sets = max(2, min(16, -(-3 * 60 * 2**20 // per)))
        cl = torch.channels_last
        xs = [
            torch.randn(n, c, hw, hw, device="cuda", generator=g).half().contiguous(memory_format=cl)
            for _ in range(sets)
        ]
        rs = [
            torch.randn(n, k, oh, oh, device="cuda", generator=g).half().contiguous(memory_format=cl)
            for _ in range(sets)
        ]
        w = (torch.randn(k, c, r, r, device="cuda", generator=g) / (c * r * r) ** 0.5).half()
        w = w.contiguous(memory_format=cl)
        bias = torch.randn(k, device="cuda", generator=g).half()

        def torch_go(i, xs=xs, rs=rs, w=w, bias=bias, residual=residual, relu=relu, stride=stride, r=r):
            y = F.conv2d(xs[i % len(xs)], w, bias, stride=stride, padding=r // 2)
            if residual:
                y = y + rs[i % len(rs)]
            return F.relu(y) if relu else y

        ref = torch_go(0).float()
        for i in range(3):
            torch_go(i)
        t_ref = graph_launch_ms(torch, cupy, torch_go, args.iters)
        out = cupy.empty((n, oh, oh, k), dtype=cupy.float16)
        xv = [cupy.from_dlpack(x.permute(0, 2, 3, 1)) for x in xs]
        rv = [cupy.from_dlpack(r.permute(0, 2, 3, 1)) for r in rs]
        wv = cupy.from_dlpack(w.permute(0, 2, 3, 1).contiguous())
        bv = cupy.from_dlpack(bias)
        flop = 2.0 * n * oh * oh * c * r * r * k
        rows = []
        for label, p, ss in cands:
            cub = [next(cubins) for _ in ss]
            row = {"N": n, "HW": hw, "C": c, "K": k, "R": r, "stride": stride, "residual": residual, "relu": relu}
            row["kernel"] = label
            row.update({"params": {q: v for q, v in ss[0].params.items() if q != "tmaps"}, "cudnn_ms": t_ref})
            try:
                fns = []
                for s, cb in zip(ss, cub, strict=True):
                    mod = cupy.cuda.function.Module()
                    mod.load(cb)
                    fn = mod.get_function(s.name)
                    if s.shared_bytes > 48 * 1024:
                        allow_large_shared_memory(fn, s.shared_bytes)
                    specs = [spec_from_json(d, s.name) for d in s.params.get("tmaps", [])]
                    tabs = [
                        TensorMapTable(cupy, [(sp, {"x": xv[j], "w": wv}[sp.tensor].data.ptr) for sp in specs])
                        if specs
                        else None
                        for j in range(sets)
                    ]
                    fns.append((fn, s, mod, tabs))
                ws = cupy.empty(max(max(s.workspace_bytes for s in ss), 1), dtype=cupy.uint8)
                fixed = {"w": wv, "b": bv, "@workspace": ws, ctx.step.outputs[0]: out}

                def go(i, fns=fns, sets=sets, xv=xv, rv=rv, fixed=fixed):
                    j = i % sets
                    names = {"x": xv[j], "r": rv[j], **fixed}
                    for fn, s, _, tabs in fns:
                        a = tuple(tabs[j].arg(tmap_index(x, s.name)) if is_tmap_arg(x) else names[x] for x in s.args)
                        fn(s.grid, s.block, a, shared_mem=s.shared_bytes)

                out.fill(float("nan"))
                go(0)
                cupy.cuda.Device().synchronize()
                got = torch.from_dlpack(out).permute(0, 3, 1, 2).float()
                err = float((got - ref).norm() / ref.norm()) if not torch.isnan(got).any() else float("nan")
                row["err"] = err
                if not err < 1e-2:
                    raise RuntimeError(f"wrong result: rel err {err}")
                row["ms"] = graph_launch_ms(torch, cupy, go, args.iters)
                row["ratio"] = t_ref / row["ms"]
                row["tflops"] = flop / row["ms"] / 1e9
            except Exception as e:  # noqa: BLE001 - a failing candidate is infinitely slow
                row["error"] = str(e)[:300]
                print(f"  FAIL {n} {hw} {c}->{k} {label} {p}: {row['error']}", flush=True)
            log.write(json.dumps(row) + "\n")
            log.flush()
            rows.append(row)
        ok = {r["kernel"]: r for r in rows if "ms" in r}
        fam = "tma" if r == 1 and stride == 1 else "ig"
        mine = [row for lb, row in ok.items() if lb.startswith(fam)]
        best = min(mine, key=lambda row: row["ms"]) if mine else None

        def us(lb, ok=ok):
            if lb not in ok:
                return "      -                 "
            return f"{ok[lb]['ms'] * 1e3:7.1f} us {ok[lb]['tflops']:5.1f} TF {ok[lb]['ratio']:4.2f}x"

        bp = best["params"] if best else {}
        keys = ("BN", "PINGPONG") if fam == "tma" else ("BN", "STAGES", "SPLITS", "MINB", "SERIAL", "B_MODE")
        what = "/".join(str(bp.get(q, "-")) for q in keys)
        line = (
            f"N={n:2} {hw:3}x{hw:3} {c:4}->{k:4} {r}x{r}/s{stride} {'res ' if residual else '    '}"
            f"{'relu' if relu else '    '} M={n * oh * oh:6} cuDNN {t_ref * 1e3:7.1f} us | tc {us('tc')} | "
            f"{fam}* {us(fam + '*')} | best {best['ratio'] if best else 0:4.2f}x "
            f"{best['ms'] * 1e3 if best else 0:7.1f} us {what}"
        )
        print(line, flush=True)
        table.append(line)
        xs = rs = xv = rv = []
        torch.cuda.empty_cache()
    print("\n".join(["", f"# {props.name}; ratio = cuDNN time / ours", *table]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
