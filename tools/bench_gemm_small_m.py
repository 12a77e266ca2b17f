"""Small-M GEMMs (batch-1 linear layers) on sm_90: every split-K form against cuBLAS in one run.

    python tools/bench_gemm_small_m.py [--shape MxNxK ...] [--layout mn|k] [--out DIR]
    python tools/bench_gemm_small_m.py --rules      # main's old default, two-launch, the sm_90 rules
    python tools/bench_gemm_small_m.py --mid        # 256 < M < 4096: TMA, wgmma, mma.sync, the engine's
    python tools/bench_gemm_small_m.py --compile-only --limit 3      # NVRTC a few variants, no GPU

Per shape it times graphc's default (today's heuristic: one-launch "serial" split-K, where the last
K slice of a tile to finish sums all partials), the same tile as a two-launch split (SERIAL 0: the
reduce kernel), without split, with fewer serial splits, split-K across a thread-block cluster
(CLUSTER 1: partials reduced through distributed shared memory) for several tiles and split
counts, small tiles without split, the Hopper TMA GEMM and the cp.async wgmma path. Checking and
timing are bench_gemm_sm90's: outputs poisoned then compared with torch's fp32 product, times per
launch from CUDA-graph replays of `iters` launches rotating over operand sets larger than 3x L2,
cuBLAS (torch.matmul) timed the same way. Rows stream to DIR/gemm_small_m.jsonl; a table last.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SHAPES = [
    (128, 768, 768),
    (128, 2304, 768),
    (128, 3072, 768),
    (128, 768, 3072),
    (197, 768, 768),
    (197, 2304, 768),
    (197, 3072, 768),
    (197, 768, 3072),
    (128, 50257, 768),
]
# --mid: batch 3..24 of BERT/GPT-2 (128 tokens) linear layers, M = batch * 128 between the small-M
# rules (M <= 256) and the TMA rule (M >= 4096)
MID_M = (1536, 2048, 2560, 512, 1024, 3072, 384)  # batch 12-20 (slower than batch 32 in engines) first
MID_NK = [(768, 768), (2304, 768), (3072, 768), (768, 3072)]
MID_SHAPES = [(m, n, k) for m in MID_M for n, k in MID_NK]
# (BM, BN, WM, WN) of the cluster and no-split sweeps
CLUSTER_TILES = [(64, 64, 2, 2), (64, 32, 2, 2), (32, 64, 1, 2), (128, 64, 2, 2), (64, 128, 2, 2)]
SMALL_TILES = [(64, 32, 2, 2), (32, 64, 1, 2), (16, 64, 1, 2), (64, 64, 2, 2)]


def _mma(bm: int, bn: int, wm: int, wn: int, bk: int = 32, stages: int = 4, **kw: Any) -> dict[str, Any]:
    return {"path": "mma", "BM": bm, "BN": bn, "BK": bk, "WM": wm, "WN": wn, "STAGES": stages, **kw}


def variants(prob) -> list[tuple[str, dict[str, Any] | None]]:
    """(label, forced params) of every mma.sync variant; None: the default heuristic."""
    from graphc.codegen.families.gemm import heuristic, public, valid

    h = public(heuristic(prob, "mma"))
    tile = {k: h[k] for k in ("path", "BM", "BN", "BK", "WM", "WN", "STAGES")}
    out: list[tuple[str, dict[str, Any] | None]] = [("default", None)]
    s0 = h.get("SPLITS", 1)
    ktiles = -(-prob.K // 32)
    if s0 > 1:
        out.append(("two-launch", {**tile, "SPLITS": s0, "SERIAL": 0}))
        out.append(("cluster-same", {**tile, "SPLITS": s0, "CLUSTER": 1}) if s0 <= 8 else ("skip", None))
    out.append(("nosplit", {**tile, "SPLITS": 1}))
    for s in (2, 4, 8):  # the serial and two-launch forms at other split counts
        if s != s0 and ktiles // s >= 2 and (prob.N <= 8192 or s == 2):
            out.append((f"serial-{s}", {**tile, "SPLITS": s, "SERIAL": 1}))
            out.append((f"two-launch-{s}", {**tile, "SPLITS": s, "SERIAL": 0}))
    big = prob.N > 8192
    for bm, bn, wm, wn in CLUSTER_TILES:
        for s in (2, 4, 6, 8):
            if ktiles // s < 2 or (big and s > 2):
                continue
            out.append((f"cluster-{bm}x{bn}-s{s}", _mma(bm, bn, wm, wn, SPLITS=s, CLUSTER=1)))
    for s in (4, 6):
        out.append((f"cluster-64x64-bk64-s{s}", _mma(64, 64, 2, 2, bk=64, stages=3, SPLITS=s, CLUSTER=1)))
    for bm, bn, wm, wn in SMALL_TILES:
        out.append((f"nosplit-{bm}x{bn}", _mma(bm, bn, wm, wn, SPLITS=1)))
    if big:
        for bm, bn, wm, wn in [(128, 128, 2, 2), (128, 256, 2, 4), (64, 128, 2, 2), (64, 256, 1, 4), (128, 64, 2, 2)]:
            out.append((f"nosplit-{bm}x{bn}", _mma(bm, bn, wm, wn, SPLITS=1)))
    seen, uniq = set(), []
    for label, p in out:
        if label == "skip":
            continue
        key = json.dumps(p, sort_keys=True)
        if key in seen or (p is not None and not valid(prob, p)):
            continue
        seen.add(key)
        uniq.append((label, p))
    return uniq


# The mma.sync configuration main's heuristic chose for each shape before this change (c5fc8de):
# 64 x 64 tiles (BK 32, 4 stages), one-launch serial split-K; K = 3072 went to the TMA GEMM already.
MAIN_SPLITS = {
    (128, 768, 768): 6,
    (128, 2304, 768): 3,
    (128, 3072, 768): 1,
    (197, 768, 768): 4,
    (197, 2304, 768): 1,
    (197, 3072, 768): 1,
}


def rule_kernels(ctx, prob) -> list[tuple[str, dict | None, list]]:
    """--rules: main's default before this change (serial split-K), the same tile as a two-launch
    split, and what an sm_90 engine runs now (gemm_sm90.select: the small-M rules)."""
    from graphc.codegen.families import gemm_sm90 as g
    from graphc.codegen.families.gemm import valid
    from graphc.codegen.kernel import family_for

    fam = family_for(ctx)
    out = []
    key = (prob.M, prob.N, prob.K)
    old: list[tuple[str, dict]] = []
    if key in MAIN_SPLITS:
        s = MAIN_SPLITS[key]
        old.append(("main-default", _mma(64, 64, 2, 2, SPLITS=s, SERIAL=1)))
        if s > 1:
            old.append(("two-launch", _mma(64, 64, 2, 2, SPLITS=s, SERIAL=0)))
    elif prob.N > 8192:
        old.append(("main-default", _mma(128, 128, 2, 2, SPLITS=1)))
    if prob.N <= 8192:  # split-K across a cluster on the wgmma kernel too
        old.append(("wgmma-nosplit", {"path": "wgmma", "BM": 64, "BN": 64, "BK": 64, "STAGES": 6, "SPLITS": 1}))
        tiles = [(64, 64, s) for s in (2, 3, 4, 6, 8)] + [(64, 128, 2), (64, 128, 4), (128, 64, 4)]
        for bm, bn, splits in tiles:
            wp = {"path": "wgmma", "BM": bm, "BN": bn, "BK": 64, "STAGES": 4, "SPLITS": splits, "CLUSTER": 1}
            old.append((f"wgmma-cluster-{bm}x{bn}-s{splits}", wp))
    for label, p in old:
        if not valid(prob, p):
            continue
        ctx.params = p
        try:
            out.append((label, p, fam.generate(ctx)))
        finally:
            ctx.params = None
    kind, p = g.small_m_params(prob)
    chosen = g.select(dataclasses.replace(ctx, precision="fp16"))  # as an fp16 sm_90 engine's step
    if not chosen:
        raise RuntimeError(f"gemm_sm90.select chose nothing for {key}")
    out.append((f"sm90-rules-{kind if kind == 'tma' else p['path']}", p, chosen))
    return out


def engine_kernels(ctx, prob) -> list:
    """What an fp16 sm_90 engine's GEMM step runs (codegen/build.py's order: gemm_sm90.select, else
    the cp.async wgmma path for `_large_gemm`, else the default mma.sync heuristic)."""
    from graphc.codegen.build import _large_gemm
    from graphc.codegen.families import gemm_sm90 as g
    from graphc.codegen.kernel import family_for

    ectx = dataclasses.replace(ctx, precision="fp16")
    fam = family_for(ectx)
    ks = g.select(ectx)
    if not ks and _large_gemm(ectx):
        ks = fam.generate(ectx.with_params({"path": "wgmma"}))
    return ks or fam.generate(ectx)


def mid_kernels(ctx, prob) -> list[tuple[str, dict | None, list]]:
    """--mid: the TMA GEMM (its heuristic, BN 64/128/192/256 unsplit, OVERLAP at 64-192, and 2 or 4 K slices where a BN
    leaves SMs idle), the cp.async wgmma path (its heuristic, 128 x 128 and 128 x 256 unsplit, cluster split-K
    where the small-M rule would split), mma.sync (the default heuristic) and, where none of those
    is what the engine runs now, the engine's kernels ("engine"). Duplicate kernels are dropped."""
    from graphc.codegen.families import gemm_sm90 as g
    from graphc.codegen.families.gemm import heuristic, public, valid
    from graphc.codegen.kernel import family_for

    fam = family_for(ctx)
    ktiles = -(-prob.K // 64)
    cands: list[tuple[str, str, dict | None]] = []
    if g.unsupported(prob) is None:
        h = g.heuristic(prob)
        cands.append(("tma*", "tma", h))
        for bn in g.TMA_BNS:
            if bn in g.OVERLAP_BNS:
                ov = {"BN": bn, "STAGES": g.max_stages(bn), "SPLITS": 1, "PINGPONG": 0, "OVERLAP": 1}
                cands.append((f"tma-bn{bn}-ov", "tma", ov))
            for s in (1, 2, 4):
                # split where the slices still fit about one wave and keep 4 K tiles (the heuristic's floor)
                if s > 1 and (g.units(prob, bn, s) > g.SM_COUNT * 5 // 4 or ktiles // s < 4):
                    continue
                cands.append(
                    (f"tma-bn{bn}-s{s}", "tma", {"BN": bn, "STAGES": g.max_stages(bn), "SPLITS": s, "PINGPONG": 0})
                )
    wh = public(heuristic(prob, "wgmma"))
    cands.append(("wgmma", "gemm", {"path": "wgmma"}))
    for bm, bn in ((128, 128), (128, 256)):
        cands.append(
            (
                f"wgmma-{bm}x{bn}",
                "gemm",
                {"path": "wgmma", "BM": bm, "BN": bn, "BK": 64, "STAGES": 6 if bn == 128 else 4, "SPLITS": 1},
            )
        )
    wc = g.wgmma_cluster_params(prob)
    if wc is not None and wc["SPLITS"] > 1:
        cands.append((f"wgmma-cluster-s{wc['SPLITS']}", "gemm", wc))
    cands.append(("mma", "gemm", None))
    out, seen = [], {}
    for label, kind, p in cands:
        if kind == "gemm" and p is not None and "BM" in p and not valid(prob, p):
            continue
        try:
            if kind == "tma":
                ks = g.generate(ctx, p)
            else:
                ctx.params = p
                ks = fam.generate(ctx)
        except Exception as e:  # noqa: BLE001 - a variant that does not render is reported and skipped
            print(f"  skip {label} {p}: {e}")
            continue
        finally:
            ctx.params = None
        key = tuple(k.source for k in ks)
        if key in seen:
            continue
        seen[key] = label
        out.append((label, p if p != {"path": "wgmma"} else wh, ks))
    eng = engine_kernels(ctx, prob)
    now = seen.get(tuple(k.source for k in eng))
    if now is None:
        out.append(("engine", eng[0].params, eng))
    else:  # the engine's kernels are one of the variants: its label says so
        out = [(f"{lab}=engine" if lab == now else lab, p, ks) for lab, p, ks in out]
    return out


def kernels_for(ctx, prob, limit: int | None = None) -> list[tuple[str, dict | None, list]]:
    from graphc.codegen.families import gemm_sm90 as g
    from graphc.codegen.kernel import family_for

    fam = family_for(ctx)
    out = []
    for label, p in variants(prob)[:limit]:
        ctx.params = p
        try:
            out.append((label, p, fam.generate(ctx)))
        except Exception as e:  # noqa: BLE001 - a variant that does not render is reported and skipped
            print(f"  skip {label} {p}: {e}")
        finally:
            ctx.params = None
    if limit is None and g.unsupported(prob) is None:
        h = g.heuristic(prob)
        tma = [("tma*", h)] + [
            (f"tma-bn{bn}-s{s}", {"BN": bn, "STAGES": g.max_stages(bn), "SPLITS": s, "PINGPONG": 0})
            for bn in (128, 192)
            for s in (1, 2, 4, 8)
            if -(-prob.K // 64) // s >= 3 and g.units(prob, bn, s) <= 4 * g.SM_COUNT
        ]
        for label, p in tma:
            if label != "tma*" and p == {k: h.get(k) for k in p}:
                continue
            try:
                out.append((label, p, g.generate(ctx, p)))
            except Exception as e:  # noqa: BLE001
                print(f"  skip {label} {p}: {e}")
    if limit is None:
        try:
            ctx.params = {"path": "wgmma"}
            out.append(("wgmma", {"path": "wgmma"}, fam.generate(ctx)))
        except Exception as e:  # noqa: BLE001
            print(f"  no wgmma: {e}")
        finally:
            ctx.params = None
    return out


def _us(by: dict[str, dict], label: str) -> str:
    return f"{by[label]['ms'] * 1e3:6.1f}" if label in by else "     -"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", action="append", help="MxNxK (default: the batch-1 linear layers)")
    ap.add_argument("--layout", action="append", choices=["mn", "k"], help="B layout: mn = [K, N], k = [N, K]")
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--cache", type=Path, help="NVRTC cache directory")
    ap.add_argument("--compile-only", action="store_true")
    ap.add_argument("--limit", type=int, help="first N mma variants per shape only (with --compile-only)")
    ap.add_argument("--rules", action="store_true", help="main's old default, two-launch, the sm_90 rules only")
    ap.add_argument(
        "--mid", action="store_true", help="256 < M < 4096 (MID_SHAPES): TMA, wgmma, mma.sync, the engine's"
    )
    ap.add_argument("--out", type=Path, default=Path("."))
    args = ap.parse_args(argv)

    from graphc.codegen.families.gemm import problem_of
    from graphc.ir.types import DType
    from tools.bench_gemm_sm90 import Hang, Shape, compile_sources, context

    default = MID_SHAPES if args.mid else SHAPES
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shape] if args.shape else default
    pick = mid_kernels if args.mid else (rule_kernels if args.rules else lambda c, p: kernels_for(c, p, args.limit))
    todo = []
    for lay in args.layout or ["mn"]:
        for m, n, k in shapes:
            ctx = context(m, n, k, DType.float16, lay)
            prob = problem_of(ctx)
            todo.append((lay, (m, n, k), pick(ctx, prob)))
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
    props = torch.cuda.get_device_properties(0)
    print(f"# {props.name}, {props.multi_processor_count} SMs, torch {torch.__version__}, CUDA {torch.version.cuda}")
    args.out.mkdir(parents=True, exist_ok=True)
    log = (args.out / ("gemm_mid_m.jsonl" if args.mid else "gemm_small_m.jsonl")).open("a")
    table = []
    for lay, (m, n, k), cands in todo:
        sh = Shape(torch, cupy, "fp16", m, n, k, lay)
        t_ref = sh.time(sh.torch_launch(), args.iters)
        rows = []
        for label, p, ks in cands:
            cub = [next(cubins) for _ in ks]
            row = {"b": lay, "M": m, "N": n, "K": k, "kernel": label, "params": p, "cublas_ms": t_ref}
            row["used"] = {q: v for q, v in ks[0].params.items() if q not in ("M", "N", "K", "tmaps")}
            row["launches"] = len(ks)
            try:
                go = sh.graphc_launch(ks, cub)
                err = sh.check(go)
                row["err"] = err
                if not err < 1e-2:
                    raise RuntimeError(f"wrong result: rel err {err}")
                row["ms"] = sh.time(go, args.iters)
                row["ratio"] = t_ref / row["ms"]
            except Exception as e:  # noqa: BLE001 - a failing candidate is infinitely slow
                row["error"] = str(e)[:300]
                print(f"  FAIL {lay} {m}x{n}x{k} {label} {p}: {row['error']}", flush=True)
                if isinstance(e, Hang):
                    log.write(json.dumps(row) + "\n")
                    log.close()
                    os._exit(3)
            log.write(json.dumps(row) + "\n")
            log.flush()
            rows.append(row)
        ok = sorted((r for r in rows if "ms" in r), key=lambda r: r["ms"])
        by = {r["kernel"]: r for r in ok}
        clus = [r for r in ok if r["kernel"].startswith("cluster")]
        line = (
            f"{lay:2} {f'{m}x{n}x{k}':>15} cuBLAS {t_ref * 1e3:6.1f} us | default {_us(by, 'default')} "
            f"two-launch {_us(by, 'two-launch')} nosplit {_us(by, 'nosplit')} | best {ok[0]['kernel'] if ok else '-'} "
            f"{ok[0]['ms'] * 1e3 if ok else 0:6.1f} ({t_ref / ok[0]['ms'] if ok else 0:4.2f}x) | best cluster "
            f"{clus[0]['kernel'] if clus else '-'} {clus[0]['ms'] * 1e3 if clus else 0:6.1f}"
        )
        if args.mid:
            eng = next((r for r in rows if r["kernel"].endswith("engine")), None)
            best_of = {f: next((r for r in ok if r["kernel"].startswith(f)), None) for f in ("tma", "wgmma", "mma")}
            line = (
                f"{f'{m}x{n}x{k}':>15} cuBLAS {t_ref * 1e3:6.1f} us | engine "
                f"{eng['ms'] * 1e3 if eng and 'ms' in eng else float('nan'):6.1f} | best "
                f"{ok[0]['kernel'] if ok else '-'} {ok[0]['ms'] * 1e3 if ok else 0:6.1f} "
                f"({t_ref / ok[0]['ms'] if ok else 0:4.2f}x) | "
                + " ".join(f"{f} {r['ms'] * 1e3 if r else float('nan'):6.1f}" for f, r in best_of.items())
            )
        print(line, flush=True)
        for r in ok[:8]:
            print(f"    {r['kernel']:28} {r['ms'] * 1e3:7.2f} us {r['ratio']:5.2f}x", flush=True)
        table.append(line)
        del sh
        torch.cuda.empty_cache()
    print("\n".join(["", f"# {props.name}, torch {torch.__version__}; times per launch, us", *table]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
