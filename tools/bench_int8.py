"""INT8 against fp16 on graphc's own kernels: GEMMs and ResNet-50 convolutions (issue 13).

    python tools/bench_int8.py --out int8_bench.md [--iterations 50] [--quick] [--sweep] [--tma-sweep] [--mma]

Each problem is a one-node ONNX model compiled twice for the local GPU, and the same way:
- fp16: MatMul x [M, K] @ W [K, N] (or Conv, NCHW at the edges), `precision="fp16"`: graphc's fp16
  GEMM (mma.sync or the sm_90a path its rules pick) or its NHWC tensor-core conv.
- int8: what an int8 engine runs for that layer (passes/quantize_int8.py on CUDA): a MatMul as a
  1x1 ConvInteger over K-major weights, a Conv as ConvInteger (im2col + int8 GEMM), with the
  requantize epilogue an int8 layer feeds its successor with (dequantize per channel, Relu,
  QuantizeLinear to int8).
On sm_90 a GEMM's int8 layer runs twice: on the TMA kernel (gemm_sm90.generate_int8, the engine's
default for these K-major operands) and on the cp.async wgmma kernel (gemm_int8_wgmma.cu.j2, the
default before). Their outputs are checked: equal to the CPU int8 engine's within 1 LSB (the
requantize), 99.9% exactly (8192^3: the two GPU kernels against each other, the CPU would take
minutes).
Times: the median of single launches of the step's own kernels (graphc.bench per_kernel: CUDA
events, the edge transposes and casts of the models left out), so both sides count their layer's
kernels only; the im2col kernel counts for int8. Ratios are fp16 time / int8 time, same run, same GPU.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper, numpy_helper

RNG = np.random.default_rng(0)
# (M, N, K): BERT-base's linear layers at batch 32 x 128 tokens (FFN up and down, attention
# output, fused QKV), and 8192^3
GEMMS = [(4096, 3072, 768), (4096, 768, 3072), (4096, 768, 768), (4096, 2304, 768), (8192, 8192, 8192)]
CPU_CHECK_MAX_MACS = 2e10  # larger problems: the two GPU int8 kernels checked against each other
# ResNet-50 at batch 32: (name, C, HW, Co, kernel, stride)
CONVS = [
    ("stem 7x7/2", 3, 224, 64, 7, 2),
    ("res2 1x1 64->64", 64, 56, 64, 1, 1),
    ("res2 3x3 64", 64, 56, 64, 3, 1),
    ("res2 1x1 64->256", 64, 56, 256, 1, 1),
    ("res3 3x3 128", 128, 28, 128, 3, 1),
    ("res4 3x3 256", 256, 14, 256, 3, 1),
    ("res4 1x1 1024->256", 1024, 14, 256, 1, 1),
    ("res5 3x3 512", 512, 7, 512, 3, 1),
]


def _model(nodes, inputs, outputs, inits):
    g = helper.make_graph(nodes, "bench", inputs, outputs, inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _vi(name, t, shape):
    return helper.make_tensor_value_info(name, t, list(shape))


def _requant(acc: str, co: int, inits: list) -> list:
    """acc (int32) -> * scale[co] -> Relu -> QuantizeLinear: the int8 layer's epilogue."""
    inits += [
        numpy_helper.from_array(RNG.uniform(1e-4, 3e-4, (1, co, 1, 1)).astype(np.float32), "s"),
        numpy_helper.from_array(np.array(0.05, np.float32), "ys"),
        numpy_helper.from_array(np.array(0, np.int8), "yz"),
    ]
    return [
        helper.make_node("Cast", [acc], ["f"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["f", "s"], ["d"]),
        helper.make_node("Relu", ["d"], ["r"]),
        helper.make_node("QuantizeLinear", ["r", "ys", "yz"], ["y"]),
    ]


def epilogue_model(m: int, n: int, k: int, kind: str):
    """The int8 layer of gemm_models with another epilogue: "int32" (none: the int32 sums out),
    "dequant" (Cast, per-channel Mul: float32 out), "requant" (gemm_models' Relu + QuantizeLinear),
    "requant-norelu" (QuantizeLinear of the dequantized value, no Relu)."""
    inits = [numpy_helper.from_array(RNG.integers(-127, 128, (n, k, 1, 1)).astype(np.int8), "w")]
    nodes = [helper.make_node("ConvInteger", ["x", "w"], ["acc" if kind != "int32" else "y"], name="layer")]
    y_type = {"int32": TensorProto.INT32, "dequant": TensorProto.FLOAT}.get(kind, TensorProto.INT8)
    if kind != "int32":
        nodes += _requant("acc", n, inits)
        if kind == "dequant":
            nodes = nodes[:3]
            nodes[-1] = helper.make_node("Mul", ["f", "s"], ["y"])
        elif kind == "requant-norelu":
            nodes = [nd for nd in nodes if nd.op_type != "Relu"]
            nodes[-1] = helper.make_node("QuantizeLinear", ["d", "ys", "yz"], ["y"])
    return _model(nodes, [_vi("x", TensorProto.INT8, (m, k, 1, 1))], [_vi("y", y_type, (m, n, 1, 1))], inits)


EPILOGUES = ["int32", "dequant", "requant-norelu", "requant"]


def epilogue_rows(m: int, n: int, k: int, arch: list[str], iterations: int) -> list[str]:
    """The TMA kernel's time with each EPILOGUES epilogue, with and without FAST_DIV, each output
    equal to the CPU int8 engine's (int32 and float32: exactly; int8: within 1 LSB)."""
    import graphc

    feeds = {"x": _i8((m, k, 1, 1))}
    lines = []
    for kind in EPILOGUES:
        model = epilogue_model(m, n, k, kind)
        want = graphc.compile(model, target="cpu").run(feeds)
        for fast in (1, 0) if kind.startswith("requant") else (1,):
            ms, info = layer_ms(model, feeds, "fp32", arch, iterations, forced_tma={"FAST_DIV": fast})
            got = info["outputs"]
            if kind.startswith("requant"):
                ok = check_int8(got, want, f"{kind} FAST_DIV {fast}")
            elif not np.array_equal(got["y"], want["y"]):
                raise SystemExit(f"epilogue {kind}: outputs differ from the CPU engine's")
            else:
                ok = "equal"
            tma = next(q for q in info["params"] if q.get("path"))
            line = f"- epilogue {m}x{n}x{k} {kind} FAST_DIV {tma.get('FAST_DIV')}: {ms:.4f} ms ({ok}; {tma['path']})"
            print(line, flush=True)
            lines.append(line)
    return lines


def gemm_models(m: int, n: int, k: int):
    w = (RNG.standard_normal((k, n)) * 0.05).astype(np.float32)
    fp = _model(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="layer")],
        [_vi("x", TensorProto.FLOAT, (m, k))],
        [_vi("y", TensorProto.FLOAT, (m, n))],
        [numpy_helper.from_array(w, "w")],
    )
    inits = [numpy_helper.from_array(RNG.integers(-127, 128, (n, k, 1, 1)).astype(np.int8), "w")]
    nodes = [helper.make_node("ConvInteger", ["x", "w"], ["acc"], name="layer"), *_requant("acc", n, inits)]
    i8 = _model(nodes, [_vi("x", TensorProto.INT8, (m, k, 1, 1))], [_vi("y", TensorProto.INT8, (m, n, 1, 1))], inits)
    return fp, i8, {"x": RNG.standard_normal((m, k)).astype(np.float32)}, {"x": _i8((m, k, 1, 1))}


def conv_models(batch: int, c: int, hw: int, co: int, k: int, s: int):
    p = k // 2
    o = (hw + 2 * p - k) // s + 1
    w = (RNG.standard_normal((co, c, k, k)) * 0.05).astype(np.float32)
    attrs = {"strides": [s, s], "pads": [p] * 4}
    fp = _model(
        [helper.make_node("Conv", ["x", "w"], ["y"], name="layer", **attrs)],
        [_vi("x", TensorProto.FLOAT, (batch, c, hw, hw))],
        [_vi("y", TensorProto.FLOAT, (batch, co, o, o))],
        [numpy_helper.from_array(w, "w")],
    )
    inits = [numpy_helper.from_array(RNG.integers(-127, 128, (co, c, k, k)).astype(np.int8), "w")]
    nodes = [helper.make_node("ConvInteger", ["x", "w"], ["acc"], name="layer", **attrs), *_requant("acc", co, inits)]
    i8 = _model(
        nodes,
        [_vi("x", TensorProto.INT8, (batch, c, hw, hw))],
        [_vi("y", TensorProto.INT8, (batch, co, o, o))],
        inits,
    )
    x = RNG.standard_normal((batch, c, hw, hw)).astype(np.float32)
    return fp, i8, {"x": x}, {"x": _i8(x.shape)}


def _i8(shape) -> np.ndarray:
    return RNG.integers(-128, 128, shape).astype(np.int8)


def _patched(hopper: bool = True, int8_kernel: str = "default", forced_tma: dict | None = None):
    """The compiler's int8 kernel choice for one compile: hopper=False, an engine without
    Hopper-only kernels (mma.sync where sm_90a would use wgmma); int8_kernel "wgmma", the cp.async
    wgmma kernel where the TMA one would run; forced_tma, parameters merged into the TMA kernel's.
    Returns the undo function."""
    import graphc.codegen.build as build
    from graphc.codegen.families import gemm_int8, gemm_sm90

    saved = (build.HOPPER_ARCHS, gemm_int8.hopper_path, gemm_sm90.generate_int8)
    if not hopper:
        build.HOPPER_ARCHS = ()
    if int8_kernel == "wgmma":
        gemm_int8.hopper_path = lambda prob: "wgmma"
    if forced_tma:
        orig = saved[2]
        gemm_sm90.generate_int8 = lambda ctx, prob, params=None: orig(ctx, prob, {**(params or {}), **forced_tma})

    def undo() -> None:
        build.HOPPER_ARCHS, gemm_int8.hopper_path, gemm_sm90.generate_int8 = saved

    return undo


def compile_layer(model, precision: str, arch: list[str], **patch):
    import graphc

    undo = _patched(**patch)
    try:
        return graphc.compile(model, target="cuda", precision=precision, arch=arch)
    finally:
        undo()


def layer_ms(
    model, feeds, precision: str, arch: list[str], iterations: int, hopper: bool = True, **patch
) -> tuple[float, dict]:
    """The summed median time of the launches of step 'layer' (the node's own kernels: not the
    edge casts and transposes, whose steps have names of their own), and the engine's outputs
    (info["outputs"]). hopper=False and `patch`: see _patched."""
    from graphc.bench import benchmark

    eng = compile_layer(model, precision, arch, hopper=hopper, **patch)
    feeds = {s.name: feeds[s.name].astype(s.dtype) for s in eng.inputs}
    outputs = eng.run(feeds, to_numpy=True)
    r = benchmark(eng, feeds, iterations=iterations, warmup=10, per_kernel=True)
    rows = [row for row in r["kernels"] if row["step"] == "layer"]
    if not rows:
        raise SystemExit(f"no kernel of node 'layer' in {[row['step'] for row in r['kernels']]}")
    params = [ln.params for s in eng.plan.steps if s.name == "layer" for ln in s.launches]
    return sum(row["median_ms"] for row in rows), {"device": r["device"], "params": params, "outputs": outputs}


def check_int8(got: dict, want: dict, what: str) -> str:
    """Requantized int8 outputs within 1 LSB and 99.9% equal (a * b + c may contract to an FMA on
    the GPU: 1 ulp before the rounding); a summary, or SystemExit."""
    a, b = got["y"].astype(np.int32), want["y"].astype(np.int32)
    diff = np.abs(a - b)
    same = float((diff == 0).mean())
    if diff.max() > 1 or same < 0.999:
        raise SystemExit(f"{what}: int8 outputs differ: max {diff.max()}, equal {same:.5f}")
    return f"{what}: max diff {diff.max()}, equal {same:.5f}"


def _kernel_path(params: list[dict]) -> str:
    return next((q.get("path") for q in params if q.get("path") and not q.get("im2col")), "?")


SWEEP = [
    {"path": "wgmma", "BM": 128, "BN": 256, "STAGES": 4},
    {"path": "wgmma", "BM": 128, "BN": 128, "STAGES": 3},
    {"path": "wgmma", "BM": 128, "BN": 128, "STAGES": 4},
    {"path": "wgmma", "BM": 64, "BN": 128, "STAGES": 4},
    {"path": "wgmma", "BM": 64, "BN": 256, "STAGES": 3},
    {"path": "mma", "BM": 128, "BN": 128, "BK": 64, "WM": 2, "WN": 2, "STAGES": 4},
    {"path": "mma", "BM": 128, "BN": 256, "BK": 64, "WM": 2, "WN": 4, "STAGES": 3},
]


# The int8 TMA kernel's schedules (gemm_sm90.generate_int8 parameters; STAGES: the deepest ring)
TMA_SWEEP = [
    {"BN": 128},
    {"BN": 192},
    {"BN": 256},
    {"BN": 128, "OVERLAP": 1},
    {"BN": 192, "OVERLAP": 1},
    {"BN": 128, "PINGPONG": 1},
    {"BN": 192, "PINGPONG": 1},
    {"BN": 256, "WARP_EPI": 1},
]


# 8192^3 (each output checked against the cp.async kernel's)
TMA_SWEEP_LARGE = [{"BN": 192}, {"BN": 256}, {"BN": 192, "PINGPONG": 1}, {"BN": 192, "OVERLAP": 1}]


def tma_sweep(
    model, feeds, arch: list[str], iterations: int, want: dict, schedules: list[dict]
) -> list[tuple[dict, float]]:
    """The int8 layer on the TMA kernel at each of `schedules`, each output checked."""
    out = []
    for forced in schedules:
        try:
            ms, info = layer_ms(model, feeds, "fp32", arch, iterations, forced_tma=forced)
        except Exception as e:  # a schedule that does not fit this problem: reported, not fatal
            print(f"  tma {forced}: {type(e).__name__}: {str(e)[:200]}", flush=True)
            continue
        if _kernel_path(info["params"]) != "int8_tma":
            print(f"  tma {forced}: not taken ({_kernel_path(info['params'])})", flush=True)
            continue
        check_int8(info["outputs"], want, f"tma {forced}")
        out.append((forced, ms))
        print(f"  tma {forced}: {ms:.4f} ms", flush=True)
    return out


def _schedules(mnk: tuple[int, int, int]) -> list[dict]:
    return TMA_SWEEP if np.prod(mnk) <= CPU_CHECK_MAX_MACS else TMA_SWEEP_LARGE


def _warm(job: tuple) -> str:
    """Compile one engine (a worker process): its kernels land in the kernel cache, so that the
    timed runs' compiles are cache hits."""
    model, precision, arch, patch = job
    try:
        compile_layer(model, precision, arch, **patch)
        return ""
    except Exception as e:
        return f"{type(e).__name__}: {str(e)[:200]}"


def warm_cache(jobs: list[tuple], workers: int) -> None:
    """Every engine of the run compiled first, in parallel (spawned processes: no CUDA context is
    inherited); failures show again when the run compiles the engine itself."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    t0 = time.time()
    with ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn")) as pool:
        errors = [e for e in pool.map(_warm, jobs) if e]
    print(f"compiled {len(jobs)} engines in {time.time() - t0:.0f} s ({len(errors)} failed)", flush=True)


def sweep(model, feeds, arch: list[str], iterations: int) -> list[tuple[dict, float]]:
    """The int8 layer with each SWEEP tile forced (the family's heuristic replaced for the compile)."""
    from graphc.codegen.families import gemm_int8

    orig = gemm_int8.heuristic
    out = []
    for forced in SWEEP:

        def pick(prob, path="mma", forced=forced):
            return dict(forced, _eff=1.0) if path == forced["path"] else orig(prob, path)

        gemm_int8.heuristic = pick
        try:
            ms = layer_ms(
                model, feeds, "fp32", arch, iterations, hopper=forced["path"] == "wgmma", int8_kernel="wgmma"
            )[0]
        except Exception as e:  # a tile that does not fit this problem: reported, not fatal
            print(f"  {forced}: {type(e).__name__}: {str(e)[:200]}", flush=True)
            continue
        finally:
            gemm_int8.heuristic = orig
        out.append((forced, ms))
        print(f"  {forced}: {ms:.4f} ms", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="markdown file to write (and .json beside it)")
    ap.add_argument("--iterations", type=int, default=50)
    ap.add_argument("--batch", type=int, default=32, help="conv batch (ResNet-50 at batch 32)")
    ap.add_argument("--quick", action="store_true", help="the GEMMs and four convs only")
    ap.add_argument("--gemms-only", action="store_true", help="no convolutions")
    ap.add_argument(
        "--sweep", action="store_true", help="also time the GEMMs' cp.async int8 kernels at the SWEEP tiles"
    )
    ap.add_argument(
        "--tma-sweep", action="store_true", help="also time the GEMMs' int8 TMA kernel at the TMA_SWEEP schedules"
    )
    ap.add_argument("--mma", action="store_true", help="also time the int8 mma.sync kernels where sm_90a has wgmma")
    ap.add_argument("--epilogues", action="store_true", help="the TMA kernel at 4096x3072x768 with EPILOGUES")
    ap.add_argument("--workers", type=int, default=12, help="processes compiling the engines before the timed runs")
    args = ap.parse_args(argv)
    import subprocess

    cc = subprocess.run(
        ["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"], capture_output=True, text=True, check=True
    ).stdout.split()[0]
    arch = [f"sm_{cc.replace('.', '')}"]  # before any CUDA context: the compile workers are spawned
    hopper = arch == ["sm_90"]
    problems = [("gemm", f"{m}x{n}x{k}", (m, n, k), 2.0 * m * n * k, gemm_models(m, n, k)) for m, n, k in GEMMS]
    convs = [] if args.gemms_only else CONVS[:3] + CONVS[5:6] if args.quick else CONVS
    for name, c, hw, co, k, s in convs:
        o = (hw + 2 * (k // 2) - k) // s + 1
        flops = 2.0 * args.batch * co * o * o * c * k * k
        problems.append(("conv", f"{name} (N={args.batch})", None, flops, conv_models(args.batch, c, hw, co, k, s)))
    jobs = []
    for kind, _, mnk, _, (fp, i8, _, _) in problems:
        jobs += [(fp, "fp16", arch, {}), (i8, "fp32", arch, {})]
        if kind == "gemm" and hopper:
            jobs.append((i8, "fp32", arch, {"int8_kernel": "wgmma"}))
            if args.tma_sweep:
                jobs += [(i8, "fp32", arch, {"forced_tma": f}) for f in _schedules(mnk)]
        if args.mma:
            jobs.append((i8, "fp32", arch, {"hopper": False}))
    warm_cache(jobs, args.workers)
    rows = []
    device = None
    checks = []
    for kind, label, mnk, flops, (fp, i8, fp_feeds, i8_feeds) in problems:
        t_fp, info_fp = layer_ms(fp, fp_feeds, "fp16", arch, args.iterations)
        t_i8, info_i8 = layer_ms(i8, i8_feeds, "fp32", arch, args.iterations)
        t_wg, info_wg = None, None
        if kind == "gemm" and hopper:
            t_wg, info_wg = layer_ms(i8, i8_feeds, "fp32", arch, args.iterations, int8_kernel="wgmma")
        t_mma = layer_ms(i8, i8_feeds, "fp32", arch, args.iterations, hopper=False)[0] if args.mma else None
        device = info_i8["device"]
        want = None
        if kind == "gemm":
            if np.prod(mnk) <= CPU_CHECK_MAX_MACS:
                import graphc

                want = graphc.compile(i8, target="cpu").run(i8_feeds)
                checks.append(check_int8(info_i8["outputs"], want, f"{label} {_kernel_path(info_i8['params'])} vs CPU"))
                if info_wg:
                    checks.append(check_int8(info_wg["outputs"], want, f"{label} int8_wgmma vs CPU"))
            elif info_wg:
                want = info_wg["outputs"]
                checks.append(
                    check_int8(info_i8["outputs"], want, f"{label} {_kernel_path(info_i8['params'])} vs int8_wgmma")
                )
            print(checks[-1], flush=True)
        row = {
            "kind": kind,
            "problem": label,
            "fp16_ms": t_fp,
            "int8_ms": t_i8,
            "fp16_tflops": flops / t_fp / 1e9,
            "int8_tops": flops / t_i8 / 1e9,
            "speedup": t_fp / t_i8,
            "int8_wgmma_ms": t_wg,
            "int8_mma_ms": t_mma,
            "fp16_params": info_fp["params"],
            "int8_params": info_i8["params"],
        }
        if args.sweep and kind == "gemm":
            row["sweep"] = sweep(i8, i8_feeds, arch, args.iterations)
        if args.tma_sweep and kind == "gemm" and hopper:
            row["tma_sweep"] = tma_sweep(i8, i8_feeds, arch, args.iterations, want, _schedules(mnk))
        rows.append(row)
        wg = f"  int8 wgmma {t_wg:8.4f} ms (x{t_fp / t_wg:.2f})" if t_wg else ""
        mma = f"  int8 mma.sync {t_mma:8.4f} ms" if t_mma else ""
        print(f"{label:28s} fp16 {t_fp:8.4f} ms  int8 {t_i8:8.4f} ms  x{t_fp / t_i8:.2f}{wg}{mma}", flush=True)
    lines = [
        f"date {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; GPU {device['name']} (sm_{device['sm']}); "
        f"driver {device['driver']}, CUDA runtime {device['runtime']}; median of single launches, "
        f"{args.iterations} iterations",
        "",
        "| problem | fp16 ms | fp16 TFLOP/s | int8 ms | int8 TOP/s | fp16 / int8 | int8 kernel "
        "| int8 cp.async wgmma ms | fp16 / wgmma | int8 mma.sync ms |",
        "| --- | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: |",
    ]
    for r in rows:
        path = _kernel_path(r["int8_params"])
        wg = f"{r['int8_wgmma_ms']:.4f} | {r['fp16_ms'] / r['int8_wgmma_ms']:.2f}" if r["int8_wgmma_ms"] else "- | -"
        mma = f"{r['int8_mma_ms']:.4f}" if r["int8_mma_ms"] else "-"
        lines.append(
            f"| {r['kind']} {r['problem']} | {r['fp16_ms']:.4f} | {r['fp16_tflops']:.0f} | {r['int8_ms']:.4f} | "
            f"{r['int8_tops']:.0f} | {r['speedup']:.2f} | {path} | {wg} | {mma} |"
        )
    for r in rows:
        tma = next((q for q in r["int8_params"] if q.get("path") == "int8_tma"), None)
        if tma:
            keys = ("BN", "STAGES", "PINGPONG", "OVERLAP", "WARP_EPI", "VEC_EPI")
            lines.append(f"- {r['problem']}: int8_tma default { ({k: tma[k] for k in keys if k in tma}) }")
    for r in rows:
        for forced, ms in r.get("tma_sweep", []):
            lines.append(f"- tma sweep {r['problem']}: {forced} {ms:.4f} ms (fp16 / int8 {r['fp16_ms'] / ms:.2f})")
        for forced, ms in r.get("sweep", []):
            lines.append(f"- sweep {r['problem']}: {forced} {ms:.4f} ms (fp16 / int8 {r['fp16_ms'] / ms:.2f})")
    if args.epilogues and hopper:
        lines += ["", *epilogue_rows(4096, 3072, 768, arch, args.iterations)]
    lines += ["", "Output checks:", *[f"- {c}" for c in checks]]
    args.out.write_text("\n".join(lines) + "\n")
    for r in rows:
        r.pop("outputs", None)
    args.out.with_suffix(".json").write_text(json.dumps({"device": device, "rows": rows}, indent=1, default=str))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
