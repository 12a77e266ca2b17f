"""Attention and RotaryEmbedding kernels on a GPU against graphc's numpy reference (the ops'
compute): odd sequence lengths, batch 1 and 3, 1 to 12 heads, grouped-query and multi-query
attention, causal and windowed bands, bool and additive masks of several broadcast shapes (a short
key axis too), fully masked rows, softcap, nonpad_kv_seqlen, head dims 32/64/80/128 (flash) and
72/40 (simple), both layouts (3-D and 4-D), fp32/fp16/bf16, every flash tile of the search space.

Most cases are built by the family's generate() on a one-step plan, compiled with NVRTC for the
local GPU (all at once, in parallel, cached) and launched with cupy on outputs poisoned with NaN,
so an element no kernel writes fails the test. A few go end to end through
graphc.compile(target="cuda") on one-node ONNX models. The error measure is
||out - ref|| / ||ref|| plus an elementwise bound, and rows the reference zeroes (every key
masked) must be exactly 0.

Run on a GPU machine:  python -m pytest tests/codegen/test_attention_gpu.py -q
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from graphc.codegen.families.attention import FLASH_TILES, problem_of, standalone_context, valid
from graphc.codegen.kernel import family_for
from graphc.ir.types import DType
from graphc.ops.registry import get_op

pytestmark = pytest.mark.gpu

F16, BF16, F32 = DType.float16, DType.bfloat16, DType.float32
DT = {"fp32": F32, "fp16": F16, "bf16": BF16}
# ||out - ref|| / ||ref|| limits; P is rounded to the input precision before P.V (flash)
TOL = {"fp32": 2e-5, "fp16": 3e-3, "bf16": 2e-2}
# elementwise: |out - ref| <= ATOL * max|ref| + RTOL * |ref|
ELEM = {"fp32": (1e-5, 1e-4), "fp16": (4e-3, 1e-2), "bf16": (3e-2, 5e-2)}


@dataclass
class Case:
    id: str
    mode: str
    op: str = "Attention"
    b: int = 2
    sq: int = 7
    sk: int = 7
    qh: int = 2
    kvh: int = 2
    d: int = 64
    dv: int | None = None
    rank: int = 3
    attrs: dict[str, Any] = field(default_factory=dict)
    mask: str | None = None  # "bool" | "add"
    mask_shape: tuple[int, ...] | None = None
    dead_rows: bool = False  # mask out every key of some query rows
    pad: list[int] | None = None  # left padding of the keys per batch entry (a bool mask's False)
    nonpad: list[int] | None = None
    params: dict[str, Any] | None = None
    expect_path: str | None = None
    # RotaryEmbedding
    rot: dict[str, Any] | None = None


def _attn_cases() -> list[Case]:
    cases: list[Case] = []
    shapes = [  # (b, sq, sk, qh, kvh, d)
        (1, 1, 7, 1, 1, 64),
        (3, 7, 7, 12, 12, 64),
        (2, 128, 128, 12, 4, 64),
        (1, 1000, 1000, 2, 1, 64),
        (3, 77, 200, 4, 2, 128),
        (2, 129, 129, 3, 3, 80),
        (2, 33, 65, 2, 2, 32),
        (2, 50, 70, 2, 1, 72),
    ]
    for mode in ("fp32", "fp16", "bf16"):
        for b, sq, sk, qh, kvh, d in shapes:
            tag = f"{mode}-{b}x{sq}x{sk}-h{qh}k{kvh}-d{d}"
            cases.append(Case(f"{tag}-plain", mode, b=b, sq=sq, sk=sk, qh=qh, kvh=kvh, d=d, attrs={"scale": 0.125}))
        # masks of each kind and broadcast shape, causal, both layouts
        cases += [
            Case(f"{mode}-causal", mode, b=3, sq=130, sk=130, qh=4, kvh=2, attrs={"is_causal": 1}),
            Case(f"{mode}-causal-sq<sk", mode, b=1, sq=33, sk=200, qh=2, kvh=2, d=128, attrs={"is_causal": 1}),
            Case(f"{mode}-causal-sq>sk", mode, b=1, sq=150, sk=40, qh=2, kvh=1, attrs={"is_causal": 1}),
            Case(f"{mode}-bool-pad", mode, b=3, sq=65, sk=65, qh=12, kvh=12, mask="bool", mask_shape=(3, 1, 1, 65)),
            Case(
                f"{mode}-bool-dead",
                mode,
                b=2,
                sq=70,
                sk=90,
                qh=2,
                kvh=2,
                mask="bool",
                mask_shape=(2, 1, 70, 90),
                dead_rows=True,
            ),
            Case(f"{mode}-add-2d", mode, b=2, sq=33, sk=47, qh=3, kvh=1, mask="add", mask_shape=(33, 47)),
            Case(
                f"{mode}-add-dead-4d",
                mode,
                b=1,
                sq=64,
                sk=64,
                qh=2,
                kvh=2,
                rank=4,
                mask="add",
                mask_shape=(1, 1, 64, 64),
                dead_rows=True,
                attrs={"is_causal": 1},
            ),
            Case(f"{mode}-add-short", mode, b=2, sq=20, sk=100, qh=2, kvh=2, mask="add", mask_shape=(2, 1, 1, 60)),
            Case(
                f"{mode}-bool-heads",
                mode,
                b=2,
                sq=31,
                sk=31,
                qh=4,
                kvh=4,
                d=128,
                rank=4,
                mask="bool",
                mask_shape=(2, 4, 31, 31),
            ),
            Case(f"{mode}-4d-gqa", mode, b=3, sq=100, sk=100, qh=6, kvh=2, rank=4),
            Case(
                f"{mode}-window", mode, b=1, sq=200, sk=200, qh=2, kvh=2, attrs={"is_causal": 1, "left_window_size": 50}
            ),
            Case(
                f"{mode}-window-lr",
                mode,
                b=1,
                sq=100,
                sk=130,
                qh=2,
                kvh=2,
                attrs={"left_window_size": 20, "right_window_size": 7},
            ),
            Case(f"{mode}-softcap", mode, b=2, sq=40, sk=40, qh=2, kvh=2, attrs={"softcap": 2.0, "scale": 0.5}),
            Case(f"{mode}-nonpad", mode, b=3, sq=5, sk=90, qh=2, kvh=2, nonpad=[90, 33, 0], attrs={"is_causal": 1}),
            Case(f"{mode}-default-scale", mode, b=1, sq=17, sk=17, qh=1, kvh=1, d=128),
            Case(f"{mode}-dv-differs", mode, b=1, sq=20, sk=30, qh=2, kvh=2, d=64, dv=32, rank=4),
        ]
        # masked_rows "mean": rows with no kept key store the mean of V over all keys (compared
        # with the reference like every other row): causal with left padding and a wholly padded
        # batch entry (grouped-query), a dead-row mask in the 4-D layout, kv lengths of 0
        mean = {"masked_rows": "mean"}
        cases += [
            Case(
                f"{mode}-mean-causal-leftpad-gqa",
                mode,
                b=3,
                sq=130,
                sk=130,
                qh=4,
                kvh=2,
                mask="bool",
                mask_shape=(3, 1, 1, 130),
                pad=[0, 40, 130],
                attrs={"is_causal": 1, **mean},
            ),
            Case(
                f"{mode}-mean-bool-dead-4d-mqa",
                mode,
                b=2,
                sq=70,
                sk=90,
                qh=3,
                kvh=1,
                rank=4,
                mask="bool",
                mask_shape=(2, 1, 70, 90),
                dead_rows=True,
                attrs=mean,
            ),
            Case(
                f"{mode}-mean-nonpad",
                mode,
                b=3,
                sq=5,
                sk=90,
                qh=2,
                kvh=2,
                nonpad=[90, 33, 0],
                attrs={"is_causal": 1, **mean},
            ),
        ]
        if mode != "fp32":
            # the simple kernel on half precision, forced
            cases.append(
                Case(
                    f"{mode}-forced-simple-mean",
                    mode,
                    b=3,
                    sq=77,
                    sk=77,
                    qh=4,
                    kvh=2,
                    mask="bool",
                    mask_shape=(3, 1, 1, 77),
                    pad=[0, 20, 77],
                    attrs={"is_causal": 1, **mean},
                    params={"path": "simple", "WARPS": 8},
                    expect_path="simple",
                )
            )
            cases.append(
                Case(
                    f"{mode}-forced-simple",
                    mode,
                    b=2,
                    sq=77,
                    sk=77,
                    qh=4,
                    kvh=2,
                    mask="bool",
                    mask_shape=(2, 1, 1, 77),
                    attrs={"is_causal": 1},
                    params={"path": "simple", "WARPS": 8},
                    expect_path="simple",
                )
            )
    # every flash tile of the search space, on an odd shape, with a mask and causal
    for i, (bm, bn, w) in enumerate(FLASH_TILES):
        for d in (64, 128):
            mode = ("fp16", "bf16")[(i + d // 64) % 2]
            p = {"path": "flash", "BM": bm, "BN": bn, "WARPS": w}
            c = Case(
                f"{mode}-tile-{bm}x{bn}w{w}-d{d}",
                mode,
                b=2,
                sq=200,
                sk=211,
                qh=2,
                kvh=1,
                d=d,
                mask="add",
                mask_shape=(2, 1, 1, 211),
                attrs={"is_causal": i % 2},
                params=p,
            )
            if valid(problem_of(_context(c)[0]), p):
                cases.append(c)
    return cases


def _rot_cases() -> list[Case]:
    out = []
    for mode in ("fp32", "fp16", "bf16"):
        for inter in (0, 1):
            out.append(
                Case(
                    f"{mode}-rope-3d-pos-i{inter}",
                    mode,
                    op="RotaryEmbedding",
                    rot={"shape": (2, 7, 3 * 64), "num_heads": 3, "interleaved": inter, "pos": True},
                )
            )
            out.append(
                Case(
                    f"{mode}-rope-4d-partial-i{inter}",
                    mode,
                    op="RotaryEmbedding",
                    rot={"shape": (3, 2, 5, 80), "rotary_embedding_dim": 32, "interleaved": inter, "pos": False},
                )
            )
    return out


# ---- inputs and the reference ----------------------------------------------------------------------


def _np_dtype(mode: str):
    return DT[mode].numpy


def make_inputs(case: Case, seed: int = 0) -> tuple[list[np.ndarray | None], Any]:
    """The node's inputs (None: omitted) and attrs."""
    rng = np.random.default_rng(seed)
    dt = _np_dtype(case.mode)
    if case.op == "RotaryEmbedding":
        r = case.rot
        shape = r["shape"]
        head = shape[3] if len(shape) == 4 else shape[2] // r["num_heads"]
        rot = r.get("rotary_embedding_dim") or head
        b, s = shape[0], shape[2] if len(shape) == 4 else shape[1]
        x = rng.uniform(-1, 1, size=shape).astype(dt)
        if r["pos"]:
            maxp = 50
            ang = rng.uniform(0, 6.3, size=(maxp, rot // 2))
            pos = rng.integers(0, maxp, size=(b, s)).astype(np.int64)
            ins = [x, np.cos(ang).astype(dt), np.sin(ang).astype(dt), pos]
        else:
            ang = rng.uniform(0, 6.3, size=(b, s, rot // 2))
            ins = [x, np.cos(ang).astype(dt), np.sin(ang).astype(dt)]
        attrs = get_op("RotaryEmbedding").attrs(
            interleaved=r["interleaved"],
            num_heads=r.get("num_heads"),
            rotary_embedding_dim=r.get("rotary_embedding_dim", 0),
        )
        return ins, attrs
    dv = case.dv or case.d
    if case.rank == 3:
        q = rng.standard_normal((case.b, case.sq, case.qh * case.d))
        k = rng.standard_normal((case.b, case.sk, case.kvh * case.d))
        v = rng.standard_normal((case.b, case.sk, case.kvh * dv))
        heads = {"q_num_heads": case.qh, "kv_num_heads": case.kvh}
    else:
        q = rng.standard_normal((case.b, case.qh, case.sq, case.d))
        k = rng.standard_normal((case.b, case.kvh, case.sk, case.d))
        v = rng.standard_normal((case.b, case.kvh, case.sk, dv))
        heads = {}
    ins: list[np.ndarray | None] = [q.astype(dt), k.astype(dt), v.astype(dt)]
    mask = None
    if case.mask is not None:
        shape = case.mask_shape
        keep = rng.uniform(size=shape) > 0.3
        if len(shape) >= 2:
            keep[..., 0] = True  # most rows keep a key
        if case.dead_rows:
            keep[..., 3, :] = False
            keep[..., shape[-2] - 1, :] = False
        if case.pad is not None:  # left padding: under is_causal a row sees only padding up to it
            keep = np.ones(shape, dtype=bool)
            for i, n in enumerate(case.pad):
                keep[i, ..., :n] = False
        mask = keep if case.mask == "bool" else np.where(keep, rng.uniform(-2, 2, size=shape), -np.inf).astype(dt)
    ins.append(mask)
    if case.nonpad is not None:
        ins += [None, None, np.asarray(case.nonpad, dtype=np.int64)]
    while ins and ins[-1] is None:
        ins.pop()
    attrs = get_op("Attention").attrs(**heads, **case.attrs)
    return ins, attrs


def reference(case: Case, ins: list[np.ndarray | None], attrs) -> np.ndarray:
    return get_op(case.op).compute(ins, attrs, 1)[0]


# ---- building and running ------------------------------------------------------------------------


def _context(case: Case):
    ins, attrs = make_inputs(case)
    specs = [None if x is None else (x.shape, DType.from_numpy(x.dtype)) for x in ins]
    return standalone_context(case.op, specs, attrs, params=case.params), ins, attrs


CASES = _attn_cases() + _rot_cases()


@functools.cache
def _built() -> dict[str, Any]:
    """Every case's kernels, compiled at once for the local GPU."""
    from graphc.codegen.nvrtc import CompileJob, compile_all
    from graphc.runtime.cuda import device_arch

    arch = device_arch()
    gen, jobs = {}, []
    for case in CASES:
        ctx, ins, attrs = _context(case)
        ks = family_for(ctx).generate(ctx)
        gen[case.id] = (ctx, ins, attrs, ks)
        jobs += [CompileJob(k.name, k.source, arch) for k in ks]
    cubins = iter(compile_all(jobs))
    return {cid: (ctx, ins, attrs, [(k, next(cubins)) for k in ks]) for cid, (ctx, ins, attrs, ks) in gen.items()}


def _to_device(x: np.ndarray):
    import cupy

    return cupy.asarray(np.ascontiguousarray(x).view(np.uint8).reshape(-1))


def launch(kernels, ctx, ins: list[np.ndarray | None]) -> np.ndarray:
    import cupy

    dev = {}
    for name, x in zip(ctx.step.inputs, ins, strict=False):
        if name is not None:
            dev[name] = _to_device(x)
    (out,) = ctx.step.outputs
    spec = ctx.tensors[out]
    dev[out] = cupy.full(spec.nbytes, 0xFF, dtype=cupy.uint8)  # NaN in every float format
    for k, cubin in kernels:
        mod = cupy.cuda.function.Module()
        mod.load(cubin)
        fn = mod.get_function(k.name)
        if k.shared_bytes > 48 * 1024:
            drv = cupy.cuda.driver
            attr = getattr(drv, "CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES", 8)
            drv.funcSetAttribute(fn.ptr, attr, k.shared_bytes)
        fn(k.grid, k.block, tuple(dev[a] for a in k.args), shared_mem=k.shared_bytes)
    cupy.cuda.runtime.deviceSynchronize()
    dt = np.dtype(ml_dtypes.bfloat16) if spec.dtype == "bfloat16" else np.dtype(spec.dtype)
    return cupy.asnumpy(dev[out]).view(dt).reshape(tuple(spec.shape))


def check(case: Case, out: np.ndarray, ref: np.ndarray, what: str = "") -> None:
    assert out.shape == ref.shape and out.dtype == ref.dtype
    o, r = out.astype(np.float64), ref.astype(np.float64)
    assert np.isfinite(o).all(), f"{what}{np.count_nonzero(~np.isfinite(o))} elements unwritten or not finite"
    den = np.linalg.norm(r)
    err = np.linalg.norm(o - r) / (den if den > 0 else 1.0)
    assert err < TOL[case.mode], f"{what}relative error {err:.3g} >= {TOL[case.mode]}"
    atol, rtol = ELEM[case.mode]
    bound = atol * max(np.abs(r).max(initial=0.0), 1e-30) + rtol * np.abs(r)
    bad = np.abs(o - r) > bound
    assert not bad.any(), f"{what}{bad.sum()} elements off, worst {np.abs(o - r).max():.3g}"
    if case.op == "Attention":
        # rows the reference zeroes (they attend nothing) are exactly zero
        dv = case.dv or case.d
        if case.rank == 3:
            ro, rr = o.reshape(case.b, case.sq, case.qh, dv), r.reshape(case.b, case.sq, case.qh, dv)
        else:
            ro, rr = o, r
        dead = (rr == 0).all(axis=-1)
        assert (ro[dead] == 0).all(), f"{what}rows the reference zeroes are not zero"
        if case.attrs.get("masked_rows") != "mean":
            assert case.dead_rows <= bool(dead.any()), "the case meant to have rows that attend nothing"


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_kernel(case: Case):
    ctx, ins, attrs, kernels = _built()[case.id]
    if case.expect_path:
        assert kernels[0][0].params["path"] == case.expect_path
    out = launch(kernels, ctx, ins)
    check(case, out, reference(case, ins, attrs), f"{[k.params for k, _ in kernels]}: ")


# ---- end to end: graphc.compile(target="cuda") on one-node ONNX models --------------------------


def _onnx_case(case: Case):
    from helpers import make_node_model

    ins, attrs = make_inputs(case)
    names = ["q", "k", "v", "mask", "past_k", "past_v", "nonpad"] if case.op == "Attention" else ["x", "c", "s", "p"]
    feeds = {n: x for n, x in zip(names, ins, strict=False) if x is not None}
    order = [n if x is not None else "" for n, x in zip(names, ins, strict=False)]
    onnx_attrs = {k: v for k, v in _attr_dict(attrs).items()}
    model = make_node_model(case.op, feeds, onnx_attrs, input_order=order, opset=23)
    return model, feeds, ins, attrs


def _attr_dict(attrs) -> dict[str, Any]:
    defaults = type(attrs)()
    out = {}
    for f in attrs.__dataclass_fields__:
        v = getattr(attrs, f)
        if v is not None and v != getattr(defaults, f):
            out[f] = v
    return out


E2E = [
    Case(
        "e2e-fp16-gqa-causal-bool",
        "fp16",
        b=2,
        sq=77,
        sk=77,
        qh=12,
        kvh=4,
        mask="bool",
        mask_shape=(2, 1, 1, 77),
        attrs={"is_causal": 1, "scale": 0.125},
    ),
    # > 48 KB of dynamic shared memory: the executor must raise the kernel's limit
    Case("e2e-fp16-d128-4d", "fp16", b=2, sq=300, sk=300, qh=4, kvh=4, d=128, rank=4),
    Case("e2e-fp32-add", "fp32", b=3, sq=33, sk=33, qh=2, kvh=2, rank=4, mask="add", mask_shape=(33, 33)),
    Case(
        "e2e-fp16-rope",
        "fp16",
        op="RotaryEmbedding",
        rot={"shape": (2, 7, 3 * 64), "num_heads": 3, "interleaved": 0, "pos": True},
    ),
]


@pytest.mark.parametrize("case", E2E, ids=lambda c: c.id)
def test_end_to_end(case: Case):
    import graphc

    model, feeds, ins, attrs = _onnx_case(case)
    engine = graphc.compile(model, target="cuda")
    fams = engine.report["cuda"]["families"]
    assert fams.get("attention" if case.op == "Attention" else "rotary"), fams
    out = engine.run(feeds, to_numpy=True)["y"]
    check(case, np.asarray(out), reference(case, ins, attrs))
