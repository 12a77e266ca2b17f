"""The Hopper TMA GEMM (codegen/families/gemm_sm90.py) against cuBLAS (torch.matmul) and graphc's
older GEMM paths, in one run on one GPU: many variants per shape, each checked, then timed.

    python tools/bench_gemm_sm90.py [--quick] [--dtype fp16 --dtype bf16] [--out DIR]
    python tools/bench_gemm_sm90.py --compile-only --cache DIR   # NVRTC every variant, no GPU
    python tools/bench_gemm_sm90.py --overlap [--epilogue bias-gelu] --shape MxNxK   # epilogue schedules
    python tools/bench_gemm_sm90.py --sweep [--epilogue bias-gelu] [--shape MxNxK]     # tile heights too

Each variant's output is poisoned (NaN) before a checked run on fresh random inputs and compared
with torch's fp32 product (relative Frobenius error); a NaN left or an error above 1e-2 fails it.
Times are per launch: `iters` launches captured in one CUDA graph (both sides), the median of
several timed replays; the launches rotate over operand sets that together exceed 3x the L2.
Tensor maps are encoded for each operand set (they hold its addresses). Results stream to
DIR/gemm_sm90.jsonl; a table last.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tools.bench_timing import graph_launch_ms  # noqa: E402

BIG = [(4096, 4096, 4096), (8192, 8192, 8192)]
NK = [(768, 768), (2304, 768), (3072, 768), (768, 3072)]
LINEAR = [(m, n, k) for m in (128, 197, 4096, 6304) for n, k in NK]
QUICK = [(4096, 4096, 4096), (4096, 768, 768), (4096, 3072, 768), (128, 768, 768)]
SWEEP = [(m, n, k) for m in (4096, 6304) for n, k in NK]  # the transformers' linear layers at batch 32
MID = [(1024, n, k) for n, k in NK]  # the same layers at batch 8 (128 tokens)


def variants(prob, lean: bool = False) -> list[dict[str, Any]]:
    """The variants timed per shape; `lean`: the deepest ring only, K splits only where a
    split-free launch has fewer tiles than SMs."""
    from graphc.codegen.families import gemm_sm90 as g

    out = []
    tiles = {bn: g.units(prob, bn, 1) for bn in g.BNS}
    for bn in g.BNS:
        for s in (1, 2, 3, 4, 6, 8):
            if s > 1 and (tiles[bn] * s > 4 * g.SM_COUNT or -(-prob.K // 64) // s < 3):
                continue
            if lean and s > 1 and tiles[bn] >= g.SM_COUNT:
                continue
            for st in sorted({g.max_stages(bn), g.max_stages(bn) - (s == 1 and not lean)}):
                out.append({"BN": bn, "STAGES": st, "SPLITS": s, "PINGPONG": 0})
            if bn in g.PINGPONG_BNS and s == 1:
                out.append({"BN": bn, "STAGES": g.max_stages(bn), "SPLITS": s, "PINGPONG": 1})
    return out


def context(m: int, n: int, k: int, dtype, b_layout: str, epilogue: str = "none"):
    """The GEMM step; epilogue "bias-gelu": Gelu(acc + bias[n]) fused, as an FFN's first layer;
    "bias-res": acc + bias[n] + residual[m, n], as its second."""
    from graphc.codegen.families.gemm import standalone_context
    from graphc.ops.fused import ACC, IN, OP, EpilogueOp
    from graphc.ops.registry import get_op

    kw: dict[str, Any] = {}
    shapes = [(m, k), (n, k) if b_layout == "k" else (k, n)]
    if b_layout == "k":
        kw = {"domain": "graphc", "attrs": get_op("MatMul", "graphc").attrs(trans_b=1)}
    if epilogue == "bias-gelu":
        shapes.append((n,))
        kw["n_anchor"] = 2
        kw["epilogue"] = (
            EpilogueOp("Add", get_op("Add").attrs(), (ACC, IN(2))),
            EpilogueOp("Gelu", get_op("Gelu").attrs(), (OP(0),)),
        )
        kw["outputs"] = (OP(1),)
    elif epilogue == "bias-res":  # acc + bias[n] + residual[m, n], as an FFN's second layer
        shapes += [(n,), (m, n)]
        kw["n_anchor"] = 2
        kw["epilogue"] = (
            EpilogueOp("Add", get_op("Add").attrs(), (ACC, IN(2))),
            EpilogueOp("Add", get_op("Add").attrs(), (OP(0), IN(3))),
        )
        kw["outputs"] = (OP(1),)
    return standalone_context("MatMul", shapes, dtype, **kw)


def epilogue_variants(prob) -> list[dict[str, Any]]:
    """With a fused epilogue: the heuristic tile with the element-wise epilogue and erff (the code
    before the vector epilogue), the vector epilogue with erff, with the fast GELU, and the
    ping-pong schedules with both, each with the epilogue in the accumulator layout (VEC_EPI 2) too."""
    from graphc.codegen.families import gemm_sm90 as g

    h = g.heuristic(prob)
    out = [
        {**h, "VEC_EPI": 0, "FAST_GELU": 0},
        {**h, "VEC_EPI": 1, "FAST_GELU": 0},
        {**h, "VEC_EPI": 1, "FAST_GELU": 1},
        {**h, "VEC_EPI": 2, "FAST_GELU": 1},
    ]
    for bn in g.PINGPONG_BNS:
        for mode in (1, 2):
            out.append(
                {"BN": bn, "STAGES": g.max_stages(bn), "SPLITS": 1, "PINGPONG": 1, "VEC_EPI": mode, "FAST_GELU": 1}
            )
    return out


def overlap_variants(prob, epilogue: str = "none") -> list[dict[str, Any]]:
    """The epilogue schedules side by side: cooperative (each width), ping-pong, each also with the
    per-warp epilogue (WARP_EPI), and OVERLAP (the epilogue of a tile during the next tile's main
    loop), each with the deepest ring."""
    from graphc.codegen.families import gemm_sm90 as g

    extra = {"VEC_EPI": 1, "FAST_GELU": 1} if epilogue != "none" else {}
    out = [{"BN": bn, "STAGES": g.max_stages(bn), "SPLITS": 1, "PINGPONG": 0, **extra} for bn in g.BNS]
    out.append({"BN": 256, "STAGES": g.max_stages(256), "SPLITS": 1, "PINGPONG": 0, "WARP_EPI": 1, **extra})
    for w in (0, 1):
        out += [
            {
                "BN": bn,
                "STAGES": g.max_stages(bn),
                "SPLITS": 1,
                "PINGPONG": 1,
                **({"WARP_EPI": 1} if w else {}),
                **extra,
            }
            for bn in g.PINGPONG_BNS
        ]
    out += [{"BN": bn, "STAGES": g.max_stages(bn), "SPLITS": 1, "OVERLAP": 1, **extra} for bn in g.OVERLAP_BNS]
    return out


def sweep_variants(prob, epilogue: str = "none") -> list[dict[str, Any]]:
    """The schedules of the tile-shape sweep (--sweep), each with the deepest ring and the vector
    epilogue: 128-row tiles cooperative (BN 192, 256), ping-pong (BN 192; 128 too with an
    epilogue), OVERLAP (BN 128, 192); 192-row tiles (three consumer warpgroups, cooperative) at
    BN 128 and 192, each also with the per-warp epilogue (WARP_EPI), BN 192 with one stage less."""
    from graphc.codegen.families import gemm_sm90 as g

    extra = {"VEC_EPI": 1, "FAST_GELU": 1} if epilogue != "none" else {}

    def v(bn: int, bm: int = 128, **kw) -> dict[str, Any]:
        tall = {"BM": bm} if bm != 128 else {}
        return {**tall, "BN": bn, "STAGES": g.max_stages(bn, bm), "SPLITS": 1, "PINGPONG": 0, **kw, **extra}

    out = [v(192), v(256), v(192, PINGPONG=1), v(128, OVERLAP=1), v(192, OVERLAP=1)]
    if epilogue != "none":
        out.append(v(128, PINGPONG=1))
    out += [v(128, 192), v(128, 192, WARP_EPI=1), v(192, 192), v(192, 192, WARP_EPI=1)]
    out.append({**v(192, 192), "STAGES": g.max_stages(192, 192) - 1})
    return out


def mid_variants(prob, epilogue: str = "none") -> list[dict[str, Any]]:
    """The schedules of the mid-M sweep (--mid, 256 < M < 4096): the mid-M rule's widths (twice the
    tiles of BN 128 at BN 64), K split 1-4 where the slices keep 3 K tiles or more, cooperative, per-warp
    epilogue, ping-pong and OVERLAP where they exist, each with the deepest ring and the vector
    epilogue."""
    from graphc.codegen.families import gemm_sm90 as g

    extra = {"VEC_EPI": 1, "FAST_GELU": 1} if epilogue != "none" else {}
    ktiles = -(-prob.K // g.BK)
    out = []
    for bn in g.MID_BNS:
        base = {"BN": bn, "STAGES": g.max_stages(bn), "PINGPONG": 0, **extra}
        for s in (1, 2, 3, 4):
            if s == 1 or ktiles // s >= 3:
                out.append({**base, "SPLITS": s})
        out.append({**base, "SPLITS": 1, "WARP_EPI": 1})
        out.append({**base, "SPLITS": 1, "PINGPONG": 1})
        out.append({**base, "SPLITS": 1, "OVERLAP": 1})
    return out


def kernels_for(
    ctx,
    prob,
    quick: bool,
    lean: bool = False,
    epilogue: str = "none",
    overlap: bool = False,
    sweep: bool = False,
    mid: bool = False,
) -> list[tuple[str, dict | None, list]]:
    """(label, params, KernelSources) of every candidate: the TMA variants, graphc's default
    and its cp.async wgmma path."""
    from graphc.codegen.families import gemm_sm90 as g
    from graphc.codegen.kernel import family_for

    out = []
    h = g.heuristic(prob)
    if epilogue != "none":
        h = {**h, "VEC_EPI": 1, "FAST_GELU": 1}
    if mid:
        vs = mid_variants(prob, epilogue)
    elif sweep:
        vs = sweep_variants(prob, epilogue)
    elif overlap:
        vs = overlap_variants(prob, epilogue)
    else:
        vs = [h] if quick else (epilogue_variants(prob) if epilogue != "none" else variants(prob, lean))
    if h not in vs:
        vs.insert(0, h)
    for p in vs:
        try:
            out.append(("tma" + ("*" if p == h else ""), p, g.generate(ctx, p)))
        except Exception as e:  # noqa: BLE001 - a variant that does not render is reported and skipped
            print(f"  skip {p}: {e}")
    if overlap or sweep or mid:  # the TMA schedules only
        return out
    fam = family_for(ctx)
    out.append(("default", None, fam.generate(ctx)))
    try:
        ctx.params = {"path": "wgmma"}
        out.append(("wgmma", {"path": "wgmma"}, fam.generate(ctx)))
    except Exception as e:  # noqa: BLE001
        print(f"  no wgmma: {e}")
    finally:
        ctx.params = None
    return out


def compile_sources(ks, cache) -> list[bytes]:
    from graphc.codegen.nvrtc import CompileJob, compile_all

    return compile_all(
        [CompileJob(k.name, k.source, k.params.get("requires_arch", "sm_90")) for k in ks], cache_dir=cache
    )


class Hang(RuntimeError):
    pass


class Shape:
    def __init__(self, torch, cupy, dt_name: str, m: int, n: int, k: int, b_layout: str, epilogue: str = "none"):
        self.torch, self.cupy = torch, cupy
        self.m, self.n, self.k, self.b_layout, self.epilogue = m, n, k, b_layout, epilogue
        tdt = {"fp16": torch.float16, "bf16": torch.bfloat16}[dt_name]
        per = (m * k + k * n) * 2
        self.sets = max(2, min(24, -(-3 * 60 * 2**20 // per)))
        g = torch.Generator(device="cuda").manual_seed(m * 7 + n * 13 + k)
        bshape = (n, k) if b_layout == "k" else (k, n)
        self.a = [torch.randn((m, k), generator=g, device="cuda").to(tdt) for _ in range(self.sets)]
        self.b = [torch.randn(bshape, generator=g, device="cuda").to(tdt) for _ in range(self.sets)]
        self.out = torch.empty((m, n), device="cuda", dtype=tdt)
        self.bias = torch.randn((n,), generator=g, device="cuda").to(tdt)
        self.res = torch.randn((m, n), generator=g, device="cuda").to(tdt) if epilogue == "bias-res" else None

    def torch_launch(self, fused: bool = False):
        """cuBLAS's plain GEMM; `fused`: what PyTorch runs for Linear + GELU (addmm with the bias,
        then the GELU kernel)."""
        torch = self.torch

        def go(i):
            b = self.b[i % self.sets]
            b = b.t() if self.b_layout == "k" else b
            if fused:
                torch.nn.functional.gelu(torch.addmm(self.bias, self.a[i % self.sets], b), approximate="none")
            else:
                torch.matmul(self.a[i % self.sets], b, out=self.out)

        return go

    def graphc_launch(self, ks, cubins):
        from graphc.runtime.cuda import allow_large_shared_memory
        from graphc.runtime.tensormap import TensorMapTable, is_tmap_arg, spec_from_json, tmap_index

        cupy = self.cupy
        fns = []
        for k, cub in zip(ks, cubins, strict=True):
            mod = cupy.cuda.function.Module()
            mod.load(cub)
            fn = mod.get_function(k.name)
            if k.shared_bytes > 48 * 1024:
                allow_large_shared_memory(fn, k.shared_bytes)
            fns.append((fn, k, mod))
        ws = cupy.empty(max(max(k.workspace_bytes for k in ks), 1), dtype=cupy.uint8)
        outv = cupy.asarray(self.out)
        biasv = cupy.asarray(self.bias)
        resv = cupy.asarray(self.res) if self.res is not None else None
        av = [cupy.asarray(x) for x in self.a]
        bv = [cupy.asarray(x) for x in self.b]
        tables = []  # per operand set, per kernel
        for i in range(self.sets):
            per = []
            for _, k, _ in fns:
                specs = [spec_from_json(d, k.name) for d in k.params.get("tmaps", [])]
                addr = {"x0": av[i].data.ptr, "x1": bv[i].data.ptr}
                per.append(TensorMapTable(cupy, [(s, addr[s.tensor]) for s in specs]) if specs else None)
            tables.append(per)

        def go(i):
            j = i % self.sets
            names = {"x0": av[j], "x1": bv[j], "x2": biasv, "x3": resv, "y0": outv, "@workspace": ws}
            for q, (fn, k, _) in enumerate(fns):
                args = tuple(tables[j][q].arg(tmap_index(a, k.name)) if is_tmap_arg(a) else names[a] for a in k.args)
                fn(k.grid, k.block, args, shared_mem=k.shared_bytes)

        go.keep = (fns, ws, tables)  # type: ignore[attr-defined]
        return go

    def check(self, go) -> float:
        torch = self.torch
        for a, b in zip(self.a[:1], self.b[:1], strict=True):  # fresh values in set 0
            a.normal_()
            b.normal_()
        self.out.fill_(float("nan"))
        go(0)
        done = torch.cuda.Event()
        done.record()
        deadline = time.time() + 10.0
        while not done.query():  # a kernel that hangs ends the run (its row says so) instead of the lease
            if time.time() > deadline:
                raise Hang("no completion within 10 s")
            time.sleep(0.001)
        torch.cuda.synchronize()
        ours = self.out.float()
        if torch.isnan(ours).any():
            return float("nan")
        b = self.b[0].float()
        ref = self.a[0].float() @ (b.t() if self.b_layout == "k" else b)
        if self.epilogue == "bias-gelu":
            ref = torch.nn.functional.gelu(ref + self.bias.float())
        elif self.epilogue == "bias-res":
            ref = ref + self.bias.float() + self.res.float()
        return float((ours - ref).norm() / ref.norm())

    def time(self, go, iters: int, reps: int = 7) -> float:
        """Median ms per launch: `iters` launches (rotating operand sets) captured in one CUDA
        graph, its replays timed with events, so host launch overhead is out of both sides."""
        return graph_launch_ms(self.torch, self.cupy, go, iters, reps)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="four shapes, the heuristic variant only")
    ap.add_argument("--dtype", action="append", choices=["fp16", "bf16"])
    ap.add_argument("--layout", action="append", choices=["mn", "k"], help="B layout: mn = [K, N], k = [N, K]")
    ap.add_argument("--shape", action="append", help="MxNxK")
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--cache", type=Path, help="NVRTC cache directory")
    ap.add_argument("--compile-only", action="store_true")
    ap.add_argument("--lean", action="store_true", help="fewer variants per shape (see variants())")
    ap.add_argument("--epilogue", choices=["none", "bias-gelu", "bias-res"], default="none", help="a fused epilogue")
    ap.add_argument("--overlap", action="store_true", help="the epilogue schedules: cooperative, ping-pong, OVERLAP")
    ap.add_argument("--sweep", action="store_true", help="tile heights 128 and 192, every schedule (sweep_variants)")
    ap.add_argument("--mid", action="store_true", help="M = 1024 (or --shape): BN 64 to 192, split 1-4 (mid_variants)")
    ap.add_argument("--out", type=Path, default=Path("."))
    args = ap.parse_args(argv)

    from graphc.codegen.families.gemm import problem_of
    from graphc.ir.types import DType

    dts = args.dtype or ["fp16"]
    layouts = args.layout or ["mn"]
    shapes = (
        [tuple(int(x) for x in s.split("x")) for s in args.shape]
        if args.shape
        else (QUICK if args.quick else SWEEP if args.sweep else MID if args.mid else BIG + LINEAR)
    )
    todo = []
    for dt in dts:
        dtype = DType.float16 if dt == "fp16" else DType.bfloat16
        for lay in layouts:
            for m, n, k in shapes:
                ctx = context(m, n, k, dtype, lay, args.epilogue)
                prob = problem_of(ctx)
                cands = kernels_for(ctx, prob, args.quick, args.lean, args.epilogue, args.overlap, args.sweep, args.mid)
                todo.append((dt, lay, (m, n, k), cands))
    every = [k for *_, cands in todo for _, _, ks in cands for k in ks]
    t0 = time.time()
    cubins = iter(compile_sources(every, args.cache))
    print(f"# compiled {len(every)} kernels in {time.time() - t0:.1f} s", flush=True)
    if args.compile_only:
        return 0

    import warnings

    import cupy
    import torch

    warnings.filterwarnings("ignore", category=DeprecationWarning)  # cupy's ExternalStream

    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    props = torch.cuda.get_device_properties(0)
    print(f"# {props.name}, {props.multi_processor_count} SMs, torch {torch.__version__}, CUDA {torch.version.cuda}")
    args.out.mkdir(parents=True, exist_ok=True)
    log = (args.out / "gemm_sm90.jsonl").open("a")
    table = []
    for dt, lay, (m, n, k), cands in todo:
        sh = Shape(torch, cupy, dt, m, n, k, lay, args.epilogue)
        flop = 2.0 * m * n * k
        t_ref = sh.time(sh.torch_launch(), args.iters)
        extra = {}
        if args.epilogue == "bias-gelu":  # the ratio stays against the plain GEMM of cuBLAS
            extra = {"epilogue": args.epilogue, "torch_fused_ms": sh.time(sh.torch_launch(fused=True), args.iters)}
        elif args.epilogue != "none":
            extra = {"epilogue": args.epilogue}
        rows = []
        for label, p, ks in cands:
            cub = [next(cubins) for _ in ks]
            row = {"dtype": dt, "b": lay, "M": m, "N": n, "K": k, "kernel": label, "params": p, "cublas_ms": t_ref}
            row.update(extra)
            try:
                go = sh.graphc_launch(ks, cub)
                err = sh.check(go)
                row["err"] = err
                if not err < 1e-2:
                    raise RuntimeError(f"wrong result: rel err {err}")
                row["ms"] = sh.time(go, args.iters)
                row["ratio"] = t_ref / row["ms"]
                row["tflops"] = flop / row["ms"] / 1e9
            except Exception as e:  # noqa: BLE001 - a failing candidate is infinitely slow
                row["error"] = str(e)[:300]
                print(f"  FAIL {dt} {lay} {m}x{n}x{k} {label} {p}: {row['error']}", flush=True)
                if isinstance(e, Hang):
                    log.write(json.dumps(row) + "\n")
                    log.close()
                    os._exit(3)  # the GPU is stuck in that kernel: nothing more can be timed
            log.write(json.dumps(row) + "\n")
            log.flush()
            rows.append(row)
            if "ms" in row and (args.overlap or args.sweep or args.mid):
                print(f"    {label:5} {p} {row['ms']:.4f} ms {row['ratio']:.2f}x", flush=True)
            elif "ms" in row and args.epilogue != "none":
                print(
                    f"    {label:8} {p} {row['ms']:.4f} ms {row['ratio']:.2f}x "
                    f"(torch addmm+gelu {row.get('torch_fused_ms', float('nan')):.4f} ms)"
                )
        ok = [r for r in rows if "ms" in r]
        tma = [r for r in ok if r["kernel"].startswith("tma")]
        best = min(tma, key=lambda r: r["ms"]) if tma else None
        heur = next((r for r in ok if r["kernel"] == "tma*"), None)
        old = {r["kernel"]: r for r in ok if not r["kernel"].startswith("tma")}
        line = (
            f"{dt:4} {lay:2} {f'{m}x{n}x{k}':>16} cuBLAS {t_ref:8.4f} ms {flop / t_ref / 1e9:6.1f} TF | "
            f"tma best {best['ratio'] if best else 0:5.2f}x {best['params'] if best else '-'} | "
            f"heur {heur['ratio'] if heur else 0:5.2f}x | "
            f"default {old['default']['ratio'] if 'default' in old else 0:5.2f}x | "
            f"wgmma {old['wgmma']['ratio'] if 'wgmma' in old else 0:5.2f}x"
        )
        print(line, flush=True)
        table.append(line)
        del sh
        torch.cuda.empty_cache()
    print("\n".join(["", f"# {props.name}, torch {torch.__version__}; ratio = cuBLAS time / ours", *table]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
