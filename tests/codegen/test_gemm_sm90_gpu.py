"""The Hopper TMA GEMM (codegen/families/gemm_sm90.py) on an sm_90 GPU against float64 numpy: odd
shapes (tile edges in M, N and K), every operand layout, each tile width, split-K, batches, bf16,
alpha / beta C and a fused bias + Gelu + residual epilogue; then a whole engine (compile, save,
load, CUDA-graph replay in two execution contexts) whose GEMMs run on it.

Outputs and the workspace are poisoned with NaN, so an element no kernel writes fails. Tensor maps
are built by the runtime's own code (runtime/tensormap.py).

Run on a GPU machine:  python -m pytest tests/codegen/test_gemm_sm90_gpu.py -q
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from test_gemm_gpu import TOL, Case, _bias_gelu_residual, _inputs, reference  # noqa: E402

from graphc.ops.fused import ACC, IN, OP, EpilogueOp  # noqa: E402
from graphc.ops.registry import get_op  # noqa: E402
from helpers import residual_mlp_model  # noqa: E402

pytestmark = pytest.mark.gpu


def _cases() -> list[Case]:
    cases = []
    for mode in ("fp16", "bf16"):
        for ta in (0, 1):
            for tb in (0, 1):
                m, n, k = 200, 136, 520  # edges in every dim (K: 8 full tiles + 8)
                cases.append(
                    Case(
                        f"{mode}-t{ta}{tb}",
                        mode,
                        "MatMul",
                        [(k, m) if ta else (m, k), (n, k) if tb else (k, n)],
                        domain="graphc",
                        attrs={"trans_a": ta, "trans_b": tb},
                        params={"BN": 128, "STAGES": 4, "SPLITS": 1},
                    )
                )
    for bn, st in ((64, 8), (64, 3), (128, 6), (192, 5), (256, 4), (256, 2)):
        cases.append(
            Case(f"fp16-bn{bn}-s{st}", "fp16", "MatMul", [(300, 1096), (1096, 520)], params={"BN": bn, "STAGES": st})
        )
    # more tiles than CTAs: the persistent loop and the stage ring wrap across tiles
    cases.append(Case("fp16-persistent", "fp16", "MatMul", [(2176, 256), (256, 2112)], params={"BN": 128, "STAGES": 3}))
    cases.append(Case("fp16-split", "fp16", "MatMul", [(128, 3072), (3072, 768)], params={"BN": 128, "SPLITS": 4}))
    # BN 64 (the mid-M tile): split-K, ping-pong and OVERLAP over many tiles a CTA, B [N, K] too
    cases.append(Case("fp16-bn64-split", "fp16", "MatMul", [(1030, 776), (776, 200)], params={"BN": 64, "SPLITS": 3}))
    for sched in ("PINGPONG", "OVERLAP", "WARP_EPI"):
        cases.append(
            Case(
                f"bf16-bn64-{sched.lower()}",
                "bf16",
                "MatMul",
                [(2184, 520), (1000, 520)],
                domain="graphc",
                attrs={"trans_b": 1},
                params={"BN": 64, sched: 1},
            )
        )
    # ping-pong consumers: each layout, both widths, many tiles per CTA, split-K, a fused epilogue
    for ta, tb in ((0, 0), (1, 1), (0, 1)):
        cases.append(
            Case(
                f"fp16-pingpong-t{ta}{tb}",
                "fp16",
                "MatMul",
                [(520, 304) if ta else (300, 520), (136, 520) if tb else (520, 136)],
                domain="graphc",
                attrs={"trans_a": ta, "trans_b": tb},
                params={"BN": 128, "PINGPONG": 1},
            )
        )
    # more K tiles than stages and several units per warpgroup: the main loops must stay ordered
    cases.append(
        Case("fp16-pingpong-deep", "fp16", "MatMul", [(2176, 1024), (1024, 2112)], params={"BN": 128, "PINGPONG": 1})
    )
    cases.append(
        Case("bf16-pingpong-many", "bf16", "MatMul", [(2176, 192), (192, 2112)], params={"BN": 192, "PINGPONG": 1})
    )
    cases.append(
        Case(
            "fp16-split-776",
            "fp16",
            "MatMul",
            [(197, 3072), (3072, 776)],
            params={"BN": 192, "SPLITS": 3},
        )
    )
    f = _bias_gelu_residual(96, 200)
    cases.append(
        Case(
            "fp16-fused-split",
            "fp16",
            "MatMul",
            [(96, 4096), (4096, 200), *f["extra"]],
            n_anchor=2,
            epilogue=f["epilogue"],
            outputs=f["outputs"],
            params={"BN": 256, "SPLITS": 6},
        )
    )
    cases.append(
        Case(
            "bf16-pingpong-fused",
            "bf16",
            "MatMul",
            [(96, 4096), (4096, 200), *f["extra"]],
            n_anchor=2,
            epilogue=f["epilogue"],
            outputs=f["outputs"],
            params={"BN": 128, "PINGPONG": 1},
        )
    )
    f = _bias_gelu_residual(333, 264)
    cases.append(
        Case(
            "bf16-fused",
            "bf16",
            "MatMul",
            [(333, 768), (768, 264), *f["extra"]],
            n_anchor=2,
            epilogue=f["epilogue"],
            outputs=f["outputs"],
        )
    )
    cases.append(
        Case(
            "fp16-gemm-c",
            "fp16",
            "Gemm",
            [(130, 264), (200, 264), (200,)],
            attrs={"transB": 1, "alpha": 0.5, "beta": 1.5},
        )
    )
    cases.append(
        Case("fp16-batched", "fp16", "MatMul", [(3, 130, 64), (3, 64, 72)], domain="graphc", params={"BN": 128})
    )
    cases.append(Case("bf16-bshared-a", "bf16", "MatMul", [(136, 96), (4, 96, 72)]))
    # the epilogue stores: 8 columns per thread (VEC_EPI 1, the default) against one element per
    # call (VEC_EPI 0), erff against the fast GELU, on an FFN-like bias + Gelu with an M tail
    bg = (EpilogueOp("Add", get_op("Add").attrs(), (ACC, IN(2))), EpilogueOp("Gelu", get_op("Gelu").attrs(), (OP(0),)))
    for vec, fast in ((1, 1), (1, 0), (0, 0), (0, 1), (2, 1)):
        for mode in ("fp16", "bf16"):
            cases.append(
                Case(
                    f"{mode}-ffn-vec{vec}-fast{fast}",
                    mode,
                    "MatMul",
                    [(520, 256), (256, 776), (776,)],
                    n_anchor=2,
                    epilogue=bg,
                    outputs=(OP(1),),
                    params={"VEC_EPI": vec, "FAST_GELU": fast},
                )
            )
    # GELU's tanh form (GPT-2's): tanhf against the fast sigmoid form (gc_gelu_tanh_fast); the
    # accumulators (256 products of uniform(-1, 1) values) span about -15..15
    bt = (
        EpilogueOp("Add", get_op("Add").attrs(), (ACC, IN(2))),
        EpilogueOp("Gelu", get_op("Gelu").attrs(approximate="tanh"), (OP(0),)),
    )
    for vec, fast in ((1, 1), (1, 0), (0, 1)):
        for mode in ("fp16", "bf16"):
            cases.append(
                Case(
                    f"{mode}-ffn-tanh-vec{vec}-fast{fast}",
                    mode,
                    "MatMul",
                    [(520, 256), (256, 776), (776,)],
                    n_anchor=2,
                    epilogue=bt,
                    outputs=(OP(1),),
                    params={"VEC_EPI": vec, "FAST_GELU": fast},
                )
            )
    cases.append(
        Case(
            "fp16-ffn-pingpong-vec",
            "fp16",
            "MatMul",
            [(2176, 256), (256, 776), (776,)],
            n_anchor=2,
            epilogue=bg,
            outputs=(OP(1),),
            params={"BN": 192, "PINGPONG": 1},
        )
    )
    cases.append(
        Case(
            "fp16-ffn-pingpong-frag",
            "fp16",
            "MatMul",
            [(2176, 256), (256, 776), (776,)],
            n_anchor=2,
            epilogue=bg,
            outputs=(OP(1),),
            params={"BN": 192, "PINGPONG": 1, "VEC_EPI": 2},
        )
    )
    # a per-row input (broadcast along the 8 columns) and two outputs, one of them pre-activation
    row2 = (
        EpilogueOp("Mul", get_op("Mul").attrs(), (ACC, IN(2))),
        EpilogueOp("Relu", get_op("Relu").attrs(), (OP(0),)),
    )
    for vec in (1, 2):
        cases.append(
            Case(
                f"fp16-rowscale-2out-vec{vec}",
                "fp16",
                "MatMul",
                [(300, 256), (256, 264), (300, 1)],
                n_anchor=2,
                epilogue=row2,
                outputs=(OP(0), OP(1)),
                params={"VEC_EPI": vec},
            )
        )
    cases.append(
        Case(
            "bf16-cast-f32-frag",
            "bf16",
            "MatMul",
            [(200, 320), (320, 136), (200, 136)],
            n_anchor=2,
            epilogue=(
                EpilogueOp("Add", get_op("Add").attrs(), (ACC, IN(2))),
                EpilogueOp("Cast", get_op("Cast").attrs(to=1), (OP(0),)),
            ),
            outputs=(OP(1),),
            params={"VEC_EPI": 2},
        )
    )
    # a float32 output: two 16-byte stores per 8 columns
    cast = (
        EpilogueOp("Add", get_op("Add").attrs(), (ACC, IN(2))),
        EpilogueOp("Cast", get_op("Cast").attrs(to=1), (OP(0),)),
    )
    cases.append(
        Case(
            "bf16-cast-f32",
            "bf16",
            "MatMul",
            [(200, 320), (320, 136), (200, 136)],
            n_anchor=2,
            epilogue=cast,
            outputs=(OP(1),),
        )
    )
    # N = 132 (B stored [N, K]): not a multiple of 8, the element-wise stores
    cases.append(
        Case(
            "fp16-n132",
            "fp16",
            "MatMul",
            [(200, 256), (132, 256), (132,)],
            domain="graphc",
            attrs={"trans_b": 1},
            n_anchor=2,
            epilogue=bg,
            outputs=(OP(1),),
        )  # fmt: skip
    )
    cases += _overlap_cases(bg, row2, cast)
    cases += _tall_cases(bg, row2)
    cases += _odd_n_cases(bg, row2)
    # narrow MLPs (gemm_sm90.narrow_mlp: ConvNeXt's stage 0): N or K below one tile, bias + Gelu
    for cid, n, k in (("fp16-narrow-k96", 384, 96), ("bf16-narrow-n96", 96, 384)):
        cases.append(
            Case(
                cid,
                cid[:4],
                "MatMul",
                [(3200, k), (n, k), (n,)],
                domain="graphc",
                attrs={"trans_b": 1},
                n_anchor=2,
                epilogue=bg,
                outputs=(OP(1),),
            )
        )
    return cases


def _odd_n_cases(bg, row2) -> list[Case]:
    """N odd (B stored [N, K], as GPT-2's 50257-column LM head): the per-warp schedules with the
    element-wise stores (ov_chunk_scalar), OVERLAP at both widths (many tiles a CTA, M and N
    edges), the tall tile's per-warp epilogue, ping-pong with it; bias + Gelu and a per-row input
    with two outputs in the epilogue."""
    out = []
    for bn in (128, 192):
        out.append(
            Case(
                f"fp16-oddn-overlap-bn{bn}",
                "fp16",
                "MatMul",
                [(2184, 520), (1067, 520)],
                domain="graphc",
                attrs={"trans_b": 1},
                params={"BN": bn, "OVERLAP": 1},
            )
        )
    out.append(
        Case(
            "bf16-oddn-ffn-overlap",
            "bf16",
            "MatMul",
            [(2176, 768), (1545, 768), (1545,)],
            domain="graphc",
            attrs={"trans_b": 1},
            n_anchor=2,
            epilogue=bg,
            outputs=(OP(1),),
            params={"BN": 128, "OVERLAP": 1},
        )
    )
    for cid, params in (
        ("fp16-oddn-2out-tall", {"BM": 192, "BN": 128, "WARP_EPI": 1}),
        ("fp16-oddn-2out-warpepi-pp", {"BN": 192, "PINGPONG": 1, "WARP_EPI": 1}),
    ):
        out.append(
            Case(
                cid,
                "fp16",
                "MatMul",
                [(2600, 256), (1063, 256), (2600, 1)],
                domain="graphc",
                attrs={"trans_b": 1},
                n_anchor=2,
                epilogue=row2,
                outputs=(OP(0), OP(1)),
                params=params,
            )
        )
    return out


def _tall_cases(bg, row2) -> list[Case]:
    """BM 192: three consumer warpgroups of 64 rows, 512 threads. Every layout with edges in M
    (M = 392: a last row tile of 8 rows, two warpgroups wholly past M; M = 330: the third
    warpgroup's rows partly past it), N and K; many tiles per CTA (the ring wraps); each width, a shorter
    ring, split-K; the epilogue forms (element-wise, in the accumulator layout, per warp), bias +
    Gelu, bias + Gelu + residual, a per-row input with two outputs, bf16."""
    out = []
    for ta, tb in ((0, 0), (1, 1), (0, 1), (1, 0)):
        m, n, k = 392, 136, 520  # 2 row tiles: 192 + 200 = 192 + 192 + 8
        out.append(
            Case(
                f"fp16-tall-t{ta}{tb}",
                "fp16",
                "MatMul",
                [(k, m) if ta else (m, k), (n, k) if tb else (k, n)],
                domain="graphc",
                attrs={"trans_a": ta, "trans_b": tb},
                params={"BM": 192, "BN": 128},
            )
        )
    out.append(Case("fp16-tall-m330", "fp16", "MatMul", [(330, 256), (256, 200)], params={"BM": 192, "BN": 192}))
    out.append(Case("bf16-tall-persistent", "bf16", "MatMul", [(6304, 256), (256, 776)], params={"BM": 192, "BN": 192}))
    out.append(
        Case(
            "fp16-tall-s3",
            "fp16",
            "MatMul",
            [(2200, 1088), (1088, 1064)],
            params={"BM": 192, "BN": 192, "STAGES": 3},
        )
    )
    out.append(
        Case(
            "fp16-tall-split", "fp16", "MatMul", [(197, 3072), (3072, 776)], params={"BM": 192, "BN": 128, "SPLITS": 4}
        ),
    )
    for vec in (0, 2):
        out.append(
            Case(
                f"fp16-tall-ffn-vec{vec}",
                "fp16",
                "MatMul",
                [(520, 256), (256, 776), (776,)],
                n_anchor=2,
                epilogue=bg,
                outputs=(OP(1),),
                params={"BM": 192, "BN": 128, "VEC_EPI": vec},
            )
        )
    for mode, bn, we in (("fp16", 192, 0), ("bf16", 128, 0), ("fp16", 192, 1)):
        out.append(
            Case(
                f"{mode}-tall-ffn-bn{bn}-we{we}",
                mode,
                "MatMul",
                [(2176, 768), (768, 1544), (1544,)],
                n_anchor=2,
                epilogue=bg,
                outputs=(OP(1),),
                params={"BM": 192, "BN": bn, "WARP_EPI": we},
            )
        )
    f = _bias_gelu_residual(2184, 1064)
    out.append(
        Case(
            "fp16-tall-fused-bn192",
            "fp16",
            "MatMul",
            [(2184, 768), (768, 1064), *f["extra"]],
            n_anchor=2,
            epilogue=f["epilogue"],
            outputs=f["outputs"],
            params={"BM": 192, "BN": 192},
        )
    )
    out.append(
        Case(
            "fp16-tall-rowscale-2out",
            "fp16",
            "MatMul",
            [(2600, 256), (256, 1064), (2600, 1)],
            n_anchor=2,
            epilogue=row2,
            outputs=(OP(0), OP(1)),
            params={"BM": 192, "BN": 128, "WARP_EPI": 1},
        )
    )
    return out


def _overlap_cases(bg, row2, cast) -> list[Case]:
    """OVERLAP 1: a tile's epilogue during the next tile's main loop, from the other accumulator
    array. Many tiles per CTA (both arrays, an odd count per CTA), M and N edges, K shorter than the
    chunks (K = 64: one K step, the chunks after it), a K tail, every layout, both widths, the
    fused epilogue forms (bias + Gelu, a per-row input with two outputs, a float32 output)."""
    out = []
    for bn in (128, 192):
        for ta, tb in ((0, 0), (1, 1)):
            out.append(
                Case(
                    f"fp16-overlap-bn{bn}-t{ta}{tb}",
                    "fp16",
                    "MatMul",
                    [(520, 2184) if ta else (2184, 520), (2112, 520) if tb else (520, 2112)],
                    domain="graphc",
                    attrs={"trans_a": ta, "trans_b": tb},
                    params={"BN": bn, "OVERLAP": 1},
                )
            )
    out.append(Case("bf16-overlap-k64", "bf16", "MatMul", [(2180, 64), (64, 1048)], params={"BN": 128, "OVERLAP": 1}))
    out.append(
        Case("fp16-overlap-deep", "fp16", "MatMul", [(1000, 2048), (2048, 776)], params={"BN": 192, "OVERLAP": 1})
    )
    for mode, bn in (("fp16", 128), ("bf16", 192)):
        out.append(
            Case(
                f"{mode}-ffn-overlap-bn{bn}",
                mode,
                "MatMul",
                [(2176, 768), (768, 1544), (1544,)],
                n_anchor=2,
                epilogue=bg,
                outputs=(OP(1),),
                params={"BN": bn, "OVERLAP": 1},
            )
        )
    out.append(
        Case(
            "fp16-rowscale-2out-overlap",
            "fp16",
            "MatMul",
            [(2600, 256), (256, 1064), (2600, 1)],
            n_anchor=2,
            epilogue=row2,
            outputs=(OP(0), OP(1)),
            params={"BN": 128, "OVERLAP": 1},
        )
    )
    out.append(
        Case(
            "bf16-cast-f32-overlap",
            "bf16",
            "MatMul",
            [(2200, 320), (320, 2200), (2200, 2200)],
            n_anchor=2,
            epilogue=cast,
            outputs=(OP(1),),
            params={"BN": 192, "OVERLAP": 1},
        )
    )
    f = _bias_gelu_residual(2184, 1064)  # bias + Gelu + residual [M, N]: BN 192 loads its inputs late
    out.append(
        Case(
            "fp16-fused-overlap-bn192",
            "fp16",
            "MatMul",
            [(2184, 768), (768, 1064), *f["extra"]],
            n_anchor=2,
            epilogue=f["epilogue"],
            outputs=f["outputs"],
            params={"BN": 192, "OVERLAP": 1},
        )
    )
    # WARP_EPI: the per-warp epilogue in the cooperative and ping-pong schedules
    for mode, bn, pp in (("fp16", 256, 0), ("bf16", 128, 1), ("fp16", 192, 1)):
        out.append(
            Case(
                f"{mode}-fused-warpepi-bn{bn}-pp{pp}",
                mode,
                "MatMul",
                [(2184, 768), (768, 1064), *f["extra"]],
                n_anchor=2,
                epilogue=f["epilogue"],
                outputs=f["outputs"],
                params={"BN": bn, "PINGPONG": pp, "WARP_EPI": 1},
            )
        )
    out.append(
        Case(
            "fp16-ffn-warpepi-pp192",
            "fp16",
            "MatMul",
            [(2176, 256), (256, 776), (776,)],
            n_anchor=2,
            epilogue=bg,
            outputs=(OP(1),),
            params={"BN": 192, "PINGPONG": 1, "WARP_EPI": 1},
        )
    )
    out.append(
        Case(
            "fp16-rowscale-2out-warpepi",
            "fp16",
            "MatMul",
            [(2600, 256), (256, 1064), (2600, 1)],
            n_anchor=2,
            epilogue=row2,
            outputs=(OP(0), OP(1)),
            params={"BN": 256, "WARP_EPI": 1},
        )
    )
    # the defaults on a residual epilogue, B stored [N, K]: the tall rule (BM 192, per-warp epilogue)
    # at 4096x768x768 with BN 128 (132 tiles), at N = 1024 with BN 192
    for cid, n in (("fp16-default-tall-res-bn128", 768), ("fp16-default-tall-res", 1024)):
        out.append(
            Case(
                cid,
                "fp16",
                "MatMul",
                [(4096, 768), (n, 768), (4096, n)],
                domain="graphc",
                attrs={"trans_b": 1},
                n_anchor=2,
                epilogue=(EpilogueOp("Add", get_op("Add").attrs(), (ACC, IN(2))),),
                outputs=(OP(0),),
            )
        )
    return out


CASES = _cases()


@functools.cache
def _built() -> dict[str, Any]:
    from graphc.codegen.families import gemm_sm90
    from graphc.codegen.nvrtc import CompileJob, compile_all
    from graphc.runtime.cuda import device_arch

    if device_arch() != "sm_90":
        return {}
    gen, jobs = {}, []
    for case in CASES:
        params, case.params = case.params, None
        ctx = case.context()
        ks = gemm_sm90.generate(ctx, params)
        case.params = params
        gen[case.id] = (ctx, ks)
        jobs += [CompileJob(k.name, k.source, k.params.get("requires_arch", "sm_90")) for k in ks]
    cubins = iter(compile_all(jobs))
    return {cid: (ctx, [(k, next(cubins)) for k in ks]) for cid, (ctx, ks) in gen.items()}


def _run(case: Case):
    import cupy

    from graphc.runtime.cuda import allow_large_shared_memory
    from graphc.runtime.tensormap import TensorMapTable, is_tmap_arg, tmap_index, validate_launch

    if case.id not in _built():
        pytest.skip("needs an sm_90 GPU (TMA, wgmma)")
    ctx, kernels = _built()[case.id]
    xs = _inputs(case, ctx, np.random.default_rng(1))
    dev = {n: cupy.asarray(x) for n, x in zip(ctx.step.inputs, xs, strict=True)}
    for o in ctx.step.outputs:
        spec = ctx.tensors[o]
        dt = np.dtype(getattr(ml_dtypes, spec.dtype)) if spec.dtype == "bfloat16" else np.dtype(spec.dtype)
        dev[o] = cupy.full(spec.nbytes, 0xFF, dtype=cupy.uint8).view(dt).reshape(tuple(spec.shape))
    ws = cupy.full(max(max(k.workspace_bytes for k, _ in kernels), 1), 0xFF, dtype=cupy.uint8)
    keep = []
    for k, cubin in kernels:
        mod = cupy.cuda.function.Module()
        mod.load(cubin)
        fn = mod.get_function(k.name)
        if k.shared_bytes > 48 * 1024:
            allow_large_shared_memory(fn, k.shared_bytes)
        specs = validate_launch(k.params, k.args, ctx.tensors, k.name)
        table = TensorMapTable(cupy, [(s, dev[s.tensor].data.ptr) for s in specs]) if specs else None
        keep.append((mod, table))
        named = {"@workspace": ws, **dev}
        args = tuple(table.arg(tmap_index(a, k.name)) if is_tmap_arg(a) else named[a] for a in k.args)
        fn(k.grid, k.block, args, shared_mem=k.shared_bytes)
    cupy.cuda.runtime.deviceSynchronize()
    outs = [cupy.asnumpy(dev[o]).astype(np.float64) for o in ctx.step.outputs]
    return outs, reference(case, [x.astype(np.float64) for x in xs]), kernels


# the epilogue form each case must get (VEC_EPI): the vector stores wherever N % 8 == 0 unless
# turned off, and never under split-K (the reduce kernel runs the epilogue)
def _want_vec(case: Case, splits: int) -> int:
    if case.id == "fp16-n132" or "-oddn-" in case.id or splits > 1:
        return 0
    return (case.params or {}).get("VEC_EPI", 1)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_gemm_sm90(case: Case):
    outs, refs, kernels = _run(case)
    assert kernels[0][0].params["path"] == "tma"
    main = kernels[0][0].params
    assert main["VEC_EPI"] == _want_vec(case, main["SPLITS"]), main
    if case.id.startswith("fp16-default-tall-res"):
        bn = 128 if case.id.endswith("bn128") else 192
        assert (main.get("BM"), main["BN"], main.get("WARP_EPI"), main.get("OVERLAP")) == (192, bn, 1, None), main
    for out, ref in zip(outs, refs, strict=True):
        assert np.isfinite(out).all(), f"{np.count_nonzero(~np.isfinite(out))} elements unwritten or not finite"
        err = np.linalg.norm(out - ref) / max(np.linalg.norm(ref), 1e-30)
        assert err < TOL[case.mode], f"relative error {err:.3g} >= {TOL[case.mode]} with {kernels[0][0].params}"


def test_engine_runs_tma_gemms(tmp_path):
    """MatMul + bias + Gelu and a residual MatMul as one sm_90 engine: built, saved, loaded, run
    through CUDA-graph replay in the default and a second context, against numpy."""

    import graphc
    from graphc.runtime.cuda import device_arch

    if device_arch() != "sm_90":
        pytest.skip("needs an sm_90 GPU")
    rng = np.random.default_rng(2)
    m, d, h = 4096, 768, 3072  # batch 32 x 128 tokens: both GEMMs are selected for TMA
    model, weights = residual_mlp_model(m, d, h, rng)
    w1, b1, w2 = weights["w1"], weights["b1"], weights["w2"]
    eng = graphc.compile(model, target="cuda", precision="fp16", arch=["sm_90"])
    paths = [ln.params.get("path") for s in eng.plan.steps for ln in s.launches if ln.family == "gemm"]
    assert paths.count("tma") == 2, paths
    sched = [
        (ln.params.get("OVERLAP"), ln.params.get("BM"), ln.params.get("WARP_EPI"))
        for s in eng.plan.steps
        for ln in s.launches
        if ln.family == "gemm"
    ]
    # the OVERLAP rule (bias + ReLU), the tall rule (the residual: BM 192, per-warp epilogue)
    assert sched == [(1, None, None), (None, 192, 1)], sched
    path = tmp_path / "mlp.engine"
    eng.save(path)
    loaded = graphc.runtime.load(path)
    x = rng.standard_normal((m, d)).astype(np.float32)
    ref = np.maximum(x @ w1 + b1, 0) @ w2 + x
    for run in (loaded.run, loaded.create_context().run):
        for _ in range(2):  # capture, then replay
            got = np.asarray(run({"x": x}, to_numpy=True)["y"], np.float64)
            err = np.linalg.norm(got - ref) / np.linalg.norm(ref)
            assert err < 5e-3, err
