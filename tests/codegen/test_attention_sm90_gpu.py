"""The sm_90a wgmma flash-attention kernel (templates/attention_sm90.cu.j2) on an sm_90 GPU against
graphc's numpy reference: sequence lengths 1, 7, 128, 197, 300 (one key tile, several, a partial
last one), head dims 64 and 128, fp16 and bf16, every tile of its search space (1 or 2 consumer
warpgroups, 64 or 128 keys a tile, 1 or 2 stages; the overlapped schedule or not), causal
and windowed bands, bool and additive masks of several broadcast shapes (rows whose every key is
masked: exactly 0), grouped- and multi-query attention, nonpad_kv_seqlen, softcap, both layouts;
then one engine end to end, whose attention must run on this kernel.

Outputs are poisoned with NaN, so an element no kernel writes fails. Error measures and tolerances
are test_attention_gpu's (relative norm and elementwise).

Run on an sm_90 GPU:  python -m pytest tests/codegen/test_attention_sm90_gpu.py -q
"""

from __future__ import annotations

import dataclasses
import functools
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from test_attention_gpu import Case, _context, check, launch, make_inputs, reference  # noqa: E402

from graphc.codegen.families.attention import SM90_TILES, problem_of, sm90_candidates  # noqa: E402
from graphc.codegen.kernel import family_for  # noqa: E402

pytestmark = pytest.mark.gpu


@functools.cache
def _on_sm90() -> bool:
    from graphc.runtime.cuda import device_arch

    return device_arch() == "sm_90"


# the tiles of the search space, each also with the overlapped schedule (where every key fits two
# stages; elsewhere the plain one)
VARIANTS = [{"WG": w, "BN": b, "OVERLAP": o} for o in (0, 1) for w, b in SM90_TILES]


def _tile(case: Case, i: int) -> Case:
    """`case` forced onto variant i (cycling) of VARIANTS, with the stages its key length needs and
    the heuristic's register cap."""
    v = VARIANTS[i % len(VARIANTS)]
    ctx, _, _ = _context(case)
    prob = problem_of(ctx)
    (p,) = sm90_candidates(prob, [v]) or sm90_candidates(prob, [dict(v, OVERLAP=0)])
    tag = f"-w{p['WG']}n{p['BN']}s{p['STAGES']}m{p.get('MINB', 0)}" + ("o" if p.get("OVERLAP") else "")
    return dataclasses.replace(case, id=case.id + tag, params=p)


def _cases() -> list[Case]:
    cases: list[Case] = []
    i = 0
    for s in (1, 7, 128, 197, 300):
        for d in (64, 128):
            mode = ("fp16", "bf16")[(s + d // 64) % 2]
            tag = f"{mode}-s{s}-d{d}"
            feats = [
                Case(f"{tag}-plain", mode, b=2, sq=s, sk=s, qh=4, kvh=4, d=d, rank=4, attrs={"scale": 0.125}),
                Case(f"{tag}-causal-gqa", mode, b=2, sq=s, sk=s, qh=6, kvh=2, d=d, attrs={"is_causal": 1}),
                Case(f"{tag}-bool-pad", mode, b=3, sq=s, sk=s, qh=2, kvh=2, d=d, mask="bool", mask_shape=(3, 1, 1, s)),
            ]
            if s >= 7:  # rows 3 and sq - 1 attend nothing
                feats.append(
                    Case(
                        f"{tag}-add-dead",
                        mode,
                        b=2,
                        sq=s,
                        sk=s,
                        qh=2,
                        kvh=1,
                        d=d,
                        mask="add",
                        mask_shape=(2, 1, s, s),
                        dead_rows=True,
                    )
                )
            for c in feats:
                cases.append(_tile(c, i))
                i += 1
    extra = [
        Case("fp16-causal-sq<sk", "fp16", b=1, sq=33, sk=200, qh=2, kvh=2, d=128, attrs={"is_causal": 1}),
        Case("bf16-causal-sq>sk", "bf16", b=1, sq=150, sk=40, qh=2, kvh=1, attrs={"is_causal": 1}),
        Case("fp16-mqa", "fp16", b=2, sq=197, sk=197, qh=12, kvh=1, rank=4),
        Case("bf16-window", "bf16", b=1, sq=300, sk=300, qh=2, kvh=2, attrs={"is_causal": 1, "left_window_size": 50}),
        Case(
            "fp16-window-lr",
            "fp16",
            b=1,
            sq=100,
            sk=300,
            qh=2,
            kvh=2,
            attrs={"left_window_size": 20, "right_window_size": 7},
        ),
        Case("fp16-softcap", "fp16", b=2, sq=140, sk=140, qh=2, kvh=2, d=128, attrs={"softcap": 2.0, "scale": 0.5}),
        Case("bf16-nonpad", "bf16", b=3, sq=5, sk=300, qh=2, kvh=2, nonpad=[300, 33, 0], attrs={"is_causal": 1}),
        Case("fp16-nonpad-long", "fp16", b=2, sq=197, sk=197, qh=2, kvh=2, d=128, nonpad=[150, 197]),
        Case("fp16-add-2d", "fp16", b=2, sq=130, sk=129, qh=3, kvh=1, mask="add", mask_shape=(130, 129)),
        Case("bf16-add-short", "bf16", b=2, sq=20, sk=300, qh=2, kvh=2, mask="add", mask_shape=(2, 1, 1, 160)),
        Case(
            "fp16-bool-heads-4d",
            "fp16",
            b=2,
            sq=65,
            sk=65,
            qh=4,
            kvh=4,
            d=128,
            rank=4,
            mask="bool",
            mask_shape=(2, 4, 65, 65),
            attrs={"is_causal": 1},
        ),
        # masked_rows "mean" (rows with no kept key: the mean of V over all keys): causal with left
        # padding and a wholly padded batch entry, grouped-query; kv lengths of 0
        Case(
            "fp16-mean-causal-leftpad-gqa",
            "fp16",
            b=3,
            sq=197,
            sk=197,
            qh=6,
            kvh=2,
            mask="bool",
            mask_shape=(3, 1, 1, 197),
            pad=[0, 70, 197],
            attrs={"is_causal": 1, "masked_rows": "mean"},
        ),
        Case(
            "bf16-mean-nonpad-d128",
            "bf16",
            b=3,
            sq=5,
            sk=300,
            qh=2,
            kvh=2,
            d=128,
            nonpad=[300, 33, 0],
            attrs={"is_causal": 1, "masked_rows": "mean"},
        ),
        Case("fp16-default-scale", "fp16", b=1, sq=17, sk=17, qh=1, kvh=1, d=128),
        Case("fp16-bert-b4", "fp16", b=4, sq=128, sk=128, qh=12, kvh=12, rank=4),
        Case("fp16-vit-b4", "fp16", b=4, sq=197, sk=197, qh=12, kvh=12, rank=4),
        Case("bf16-gpt2-b4", "bf16", b=4, sq=128, sk=128, qh=12, kvh=12, rank=4, attrs={"is_causal": 1}),
    ]
    for c in extra:
        cases.append(_tile(c, i))
        i += 1
    # the heuristic's own choice (select_sm90) on the shapes
    cases += [dataclasses.replace(c, id=c.id + "-default") for c in extra[-3:]]
    # the overlapped schedule on every extra case whose keys fit two stages of some tile
    for j, c in enumerate(extra):
        prob = problem_of(_context(c)[0])
        for w, b in SM90_TILES[j % 2 :] + SM90_TILES[: j % 2]:
            ps = sm90_candidates(prob, [{"WG": w, "BN": b, "OVERLAP": 1}])
            if ps:
                tag = f"-w{w}n{b}m{ps[0].get('MINB', 0)}-overlap"
                cases.append(dataclasses.replace(c, id=c.id + tag, params=ps[0]))
                break
    return cases


CASES = _cases()


def _kernels(case: Case):
    from graphc.codegen.families.attention import select_sm90
    from graphc.codegen.nvrtc import CompileJob, compile_all

    ctx, ins, attrs = _context(case)
    ks = family_for(ctx).generate(ctx) if case.params else select_sm90(ctx)
    assert ks and all(k.params["path"] == "sm90" for k in ks), [k.params for k in ks]
    cubins = compile_all([CompileJob(k.name, k.source, k.params["requires_arch"]) for k in ks])
    return ctx, ins, attrs, list(zip(ks, cubins, strict=True))


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_sm90_kernel(case: Case):
    if not _on_sm90():
        pytest.skip("the wgmma kernel runs on sm_90 only")
    ctx, ins, attrs, kernels = _kernels(case)
    out = launch(kernels, ctx, ins)
    check(case, out, reference(case, ins, attrs), f"{[k.params for k, _ in kernels]}: ")


def test_sm90_engine_runs_wgmma_attention():
    """graphc.compile on this GPU (an sm_90 plan): the Attention node runs the wgmma kernel, and the
    engine's output matches the reference."""
    if not _on_sm90():
        pytest.skip("needs an sm_90 GPU")
    import graphc
    from helpers import make_node_model

    case = Case("e2e", "fp16", b=2, sq=197, sk=197, qh=12, kvh=4, mask="bool", mask_shape=(2, 1, 1, 197))
    ins, attrs = make_inputs(case)
    feeds = {"q": ins[0], "k": ins[1], "v": ins[2], "mask": ins[3]}
    model = make_node_model(
        "Attention", feeds, {"q_num_heads": 12, "kv_num_heads": 4}, input_order=["q", "k", "v", "mask"], opset=23
    )
    engine = graphc.compile(model, target="cuda")
    steps = engine.plan.for_arch("sm_90").steps
    paths = [ln.params.get("path") for s in steps for ln in s.launches if ln.family == "attention"]
    assert paths == ["sm90"], paths
    out = engine.run(feeds, to_numpy=True)["y"]
    check(case, np.asarray(out), reference(case, ins, attrs))
