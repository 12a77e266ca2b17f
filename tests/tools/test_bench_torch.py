"""tools/bench_torch.py: the timing protocol, the report's arithmetic, the flags, and (where torch and
transformers are installed) a CPU dry run of every code path but CUDA timing on tiny configs."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
import bench_report as R  # noqa: E402
import bench_timing as T  # noqa: E402
import bench_torch as B  # noqa: E402

HAVE_TORCH = all(importlib.util.find_spec(m) is not None for m in ("torch", "transformers"))
needs_torch = pytest.mark.skipif(
    not HAVE_TORCH, reason="needs torch and transformers, which are no graphc dependency (CI has neither)"
)


def test_steady_protocol_counts_calls_and_syncs() -> None:
    calls, syncs = [], []
    p = T.Protocol(warmup=4, rounds=3, calls=5)

    def call() -> None:
        calls.append(time.perf_counter())
        time.sleep(0.002)

    ms = T.steady_ms(call, lambda: syncs.append(len(calls)), p)
    assert len(calls) == 4 + 3 * 5
    # one sync after the warm-up, then one after each round, never inside one
    assert syncs == [4, 9, 14, 19]
    assert 2.0 <= ms < 20.0


def test_steady_protocol_keeps_the_best_round() -> None:
    durations = iter([0.0] * 2 + [0.008] * 2 + [0.001] * 2 + [0.004] * 2)  # warm-up, then three rounds

    def call() -> None:
        time.sleep(next(durations))

    ms = T.steady_ms(call, lambda: None, T.Protocol(warmup=2, rounds=3, calls=2))
    assert 1.0 <= ms < 3.5  # the 1 ms round, not the mean of the three


def test_kernel_names_exclude_copies_sets_and_syncs() -> None:
    kernels = ["ampere_fp16_s16816gemm_fp16_128x128", "triton_per_fused_add_native_layer_norm_0", "gemm_k1"]
    others = ["Memcpy DtoD (Device -> Device)", "Memset (Device)", "Device Synchronize", "Stream Synchronize"]
    assert [T.is_kernel(n) for n in kernels + others] == [True] * 3 + [False] * 4


def row(model: str, batch: int, graphc: tuple, torch: dict[str, tuple], exporter: str = "torchscript") -> R.Row:
    def m(a: float | None, b: float | None) -> R.Measure:
        return R.Measure(a_ms=a, b_ms=b)

    return R.Row(model, exporter, batch, "fp16", graphc=m(*graphc), torch={k: m(*v) for k, v in torch.items()})


def test_ratio_is_graphc_over_the_fastest_mode_of_each_method() -> None:
    r = row("bert", 1, (1.0, 0.8), {"eager": (4.0, 1.0), "default": (2.0, 0.5), "reduce-overhead": (0.5, None)})
    assert r.best_torch("a") == ("reduce-overhead", 0.5)
    assert r.best_torch("b") == ("default", 0.5)
    assert r.ratio("a") == pytest.approx(2.0)
    assert r.ratio("b") == pytest.approx(1.6)
    skipped = row("bert", 1, (1.0, None), {"eager": (None, None)})
    assert skipped.ratio("a") is None and skipped.ratio("b") is None


def test_geomeans_per_exporter_precision_batch() -> None:
    rows = [
        row("a", 1, (1.0, 1.0), {"eager": (2.0, 4.0)}),  # 0.5, 0.25
        row("b", 1, (2.0, 1.0), {"eager": (1.0, 1.0)}),  # 2.0, 1.0
        row("c", 1, (1.0, None), {"eager": (None, None)}),  # no ratio
        row("a", 32, (3.0, 3.0), {"eager": (1.0, 1.0)}),  # 3.0, 3.0
        row("a", 1, (1.0, 1.0), {"eager": (8.0, 8.0)}, exporter="dynamo"),
        row("d", 1, (9.0, 9.0), {"eager": (1.0, 1.0)}),  # incomplete (below): out of the means
    ]
    rows[-1].torch["default"] = R.Measure(skipped="budget")
    g = {(e["exporter"], e["batch"]): e for e in R.geomeans(rows)}
    assert g[("torchscript", 1)]["a"] == {"geomean": 1.0, "worst": 2.0, "n": 2, "of": 4, "incomplete": 1}
    assert g[("torchscript", 1)]["b"]["geomean"] == pytest.approx(0.5)
    assert g[("torchscript", 32)]["a"]["geomean"] == pytest.approx(3.0)
    assert g[("dynamo", 1)]["a"]["geomean"] == pytest.approx(0.125)
    assert R.geomean([]) is None


def test_markdown_has_every_row_reasons_and_geomeans() -> None:
    rows = [row("bert", 1, (1.0, 0.8), {"eager": (4.0, 1.0)}), row("gpt2", 1, (1.0, 0.5), {"eager": (2.0, 1.0)})]
    rows[1].torch["reduce-overhead"] = R.Measure(skipped="budget: ~30 s needed (prior), 3 s left")
    rows[1].graphc.errors.append("(b): RuntimeError: x|y")
    header = {"date": "2026-12-01", "command": "python tools/bench_torch.py --quick", "environment": {"gpu": "X"}}
    text = R.markdown(rows, header, ["eager", "reduce-overhead"], ["gpt2 reduce-overhead fp16 batch 1: budget"])
    lines = text.splitlines()
    table = [ln for ln in lines if ln.startswith("| bert") or ln.startswith("| gpt2")]
    assert len(table) == 2
    n_cols = lines[[i for i, ln in enumerate(lines) if ln.startswith("| model")][0]].count("|")
    assert all(ln.count("|") == n_cols for ln in table)  # a '|' in an error cannot break the table
    assert "| 0.25 (eager) | 0.80 (eager) |" in table[0]
    assert "reduce-overhead skipped: budget" in table[1]
    assert "gpu X" in text and "`python tools/bench_torch.py --quick`" in text
    # the gpt2 row lacks a mode: marked, and out of the means
    assert "| 0.50 (eager)* | 0.50 (eager)* |" in table[1]
    assert "| torchscript | fp16 | 1 | 0.25 (worst 0.25, 1/2) | 0.80 (worst 0.80, 1/2) |" in text


def test_merge_of_two_runs_is_one_table(tmp_path: Path) -> None:
    a = [row("bert", 1, (1.0, 0.8), {"eager": (4.0, 1.0)})]
    b = [row("gpt2", 1, (1.0, 0.5), {"eager": (2.0, 1.0)}), row("gpt2", 32, (3.0, 2.0), {"eager": (1.5, 1.0)})]
    b[0].torch["eager"].errors.append("(b): x")
    for name, rows, when in (("a", a, "d1"), ("b", b, "d2")):
        header = {"date": when, "command": f"run {name}", "environment": {"gpu": "X"}}
        R.write(rows, header, ["eager"], [f"skip {name}"], None, tmp_path / f"{name}.json")
    assert R.main([str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--json-out", str(tmp_path / "m.json")]) == 0
    doc = json.loads((tmp_path / "m.json").read_text())
    assert [(r["model"], r["batch"]) for r in doc["rows"]] == [("bert", 1), ("gpt2", 1), ("gpt2", 32)]
    assert doc["rows"][1]["torch"]["eager"]["errors"] == ["(b): x"] and doc["skipped"] == ["skip a", "skip b"]
    assert doc["header"]["command"] == "run a ; run b" and doc["header"]["date"] == "d1 ; d2"
    g = {e["batch"]: e for e in doc["geomeans"]}
    assert g[1]["a"]["geomean"] == pytest.approx(math.sqrt(0.25 * 0.5), rel=1e-3) and g[1]["a"]["n"] == 2
    assert g[32]["b"]["geomean"] == pytest.approx(2.0)
    assert R.main([str(tmp_path / "missing.json")]) == 2


def test_flags_quick_aliases_and_errors(capsys: pytest.CaptureFixture[str]) -> None:
    q = B.parse(["--quick"])
    assert (q.batch, q.precision, q.exporters, q.modes) == (
        [1, 32],
        ["fp16"],
        ["torchscript"],
        ["eager", "reduce-overhead"],
    )
    assert q.models == list(B.export_torch.CASES) and len(q.models) >= 10
    assert (q.device, q.warmup, q.rounds, q.calls, q.compile_backend) == ("cuda", 10, 3, 50, "inductor")
    assert q.budget_s == B.QUICK_BUDGET_S and B.parse(["--quick", "--budget-s", "90"]).budget_s == 90
    o = B.parse(["--quick", "--batch", "8", "--modes", "compile-cudagraphs,eager"])
    assert o.batch == [8] and o.modes == ["eager", "reduce-overhead"]  # the table's order, old names mapped
    full = B.parse([])
    assert full.budget_s is None and full.exporters == ["torchscript", "dynamo"]
    assert full.batch == [1, 8, 32] and full.precision == ["fp16", "bf16"] and full.modes == list(R.TORCH_MODES)
    d = B.parse(["--dry-run"])
    assert (d.device, d.tiny, d.seq, d.calls, d.compile_backend) == ("cpu", True, 16, 2, "eager")
    for bad in (["--models", "resnet50,alexnet"], ["--modes", "eager,turbo"], ["--batch", "one"]):
        with pytest.raises(SystemExit) as e:
            B.parse(bad)
        assert e.value.code == 2
    assert "alexnet" in capsys.readouterr().err


def test_budget_estimates_from_what_was_measured() -> None:
    b = B.Budget(100.0)
    assert b.compile_estimate("default", "bert") == (B.COMPILE_PRIOR_S["default"], "prior")
    b.compiles["default"]["gpt2"] = [10.0, 14.0]
    b.compiles["default"]["vit"] = [6.0]
    assert b.compile_estimate("default", "bert")[0] == pytest.approx(10.0)  # mean of the others' worst
    b.compiles["default"]["bert"] = [3.0]
    assert b.compile_estimate("default", "bert") == (3.0, "bert's earlier default compile")
    assert 99.0 < b.left() <= 100.0 and math.isinf(B.Budget(None).left())


def run_dry(tmp_path: Path, *flags: str) -> dict:
    js = tmp_path / "r.json"
    md = tmp_path / "r.md"
    rc = B.main(["--dry-run", "--json", str(js), "--out", str(md), *flags])
    doc = json.loads(js.read_text())
    doc["rc"], doc["md"] = rc, md.read_text()
    return doc


@needs_torch
@pytest.mark.slow
def test_dry_run_every_path_but_cuda_timing(tmp_path: Path) -> None:
    doc = run_dry(
        tmp_path, "--models", "resnet50,llama", "--exporters", "torchscript,dynamo", "--batch", "1,2",
        "--precision", "fp32", "--modes", "eager,default,reduce-overhead",
    )  # fmt: skip
    assert doc["rc"] == 0, doc["md"]
    rows = doc["rows"]
    assert {(r["model"], r["exporter"], r["batch"]) for r in rows} == {
        (m, e, b) for m in ("resnet50", "llama") for e in ("torchscript", "dynamo") for b in (1, 2)
    }
    for r in rows:
        g = r["graphc"]
        assert not g["errors"] and g["a_ms"] > 0 and g["b_ms"] is None and g["b_skipped"].startswith("cpu")
        assert g["cosine"] > 0.99999, r  # graphc's CPU engine in fp32 against PyTorch fp32
        assert g["kernels"] == g["extra"]["plan_kernels"] > 0
        for mode in ("eager", "default", "reduce-overhead"):
            t = r["torch"][mode]
            assert not t["errors"] and not t["skipped"] and t["a_ms"] > 0 and t["cosine"] > 0.99999, (mode, t)
        best = min(r["torch"][m]["a_ms"] for m in r["torch"])
        assert r["ratio"]["a"] == pytest.approx(g["a_ms"] / best, rel=1e-3)
        assert r["ratio"]["b"] is None
    # the same PyTorch numbers for both exporters of one (model, batch): one module, measured once
    by_key = {(r["model"], r["batch"], r["exporter"]): r for r in rows}
    assert by_key[("llama", 2, "torchscript")]["torch"] == by_key[("llama", 2, "dynamo")]["torch"]
    assert doc["header"]["environment"]["torch"] and doc["header"]["tiny"] is True
    assert len(doc["geomeans"]) == 4 and all(g["a"]["n"] == 2 for g in doc["geomeans"])
    assert doc["md"].count("\n| resnet50 |") == 4 and "llama" in doc["md"]


@needs_torch
@pytest.mark.slow
def test_dry_run_budget_skips_compiles_with_a_reason(tmp_path: Path) -> None:
    # 20 s: enough for one tiny model's exports, engine and eager (a prior of 15 s), not for a compile
    # (a prior of 30 s): the compile is skipped, said so in the row, the list and the table.
    doc = run_dry(
        tmp_path, "--models", "resnet50", "--exporters", "torchscript", "--batch", "1", "--precision", "fp32",
        "--modes", "eager,reduce-overhead", "--budget-s", "20",
    )  # fmt: skip
    assert doc["rc"] == 0
    (r,) = doc["rows"]
    assert r["graphc"]["a_ms"] > 0 and r["torch"]["eager"]["a_ms"] > 0
    assert r["torch"]["reduce-overhead"]["skipped"].startswith("budget: ~30 s needed (prior)")
    assert any("resnet50 reduce-overhead fp32 batch 1: budget" in s for s in doc["skipped"])
    assert "reduce-overhead skipped: budget" in doc["md"]
    # max-autotune's box per model: nothing compiles whose estimate (a prior of 120 s) is over it
    doc = run_dry(
        tmp_path, "--models", "resnet50", "--exporters", "torchscript", "--batch", "1", "--precision", "fp32",
        "--modes", "max-autotune-no-cudagraphs", "--autotune-box-s", "60",
    )  # fmt: skip
    (r,) = doc["rows"]
    assert r["torch"]["max-autotune-no-cudagraphs"]["skipped"].startswith("over the per-model box of 60 s")
    assert r["graphc"]["a_ms"] > 0 and r["ratio"]["a"] is None  # no PyTorch mode ran: no ratio


@needs_torch
@pytest.mark.gpu
@pytest.mark.slow
def test_cuda_tiny_run_times_both_sides_both_ways(tmp_path: Path) -> None:
    """The CUDA paths on a tiny BERT: graphc's engine and PyTorch eager, default and reduce-overhead,
    each timed (a) and (b) (reduce-overhead: (a) alone), with cosines and profiler kernel counts."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    js = tmp_path / "r.json"
    rc = B.main(
        ["--tiny", "--models", "bert", "--exporters", "torchscript", "--batch", "2", "--precision", "fp16",
         "--modes", "eager,default,reduce-overhead", "--calls", "5", "--json", str(js)]
    )  # fmt: skip
    doc = json.loads(js.read_text())
    (r,) = doc["rows"]
    assert rc == 0, r
    assert doc["header"]["environment"]["gpu"] and doc["header"]["environment"]["driver"]
    g = r["graphc"]
    assert g["a_ms"] > 0 and g["b_ms"] > 0 and g["cosine"] > 0.999 and g["kernels"] > 0, g
    assert g["extra"]["call"] == "engine.run(feeds, sync=False)"
    for mode in ("eager", "default"):
        t = r["torch"][mode]
        assert t["a_ms"] > 0 and t["b_ms"] > 0 and t["cosine"] > 0.999 and t["kernels"] > 0, (mode, t)
    ro = r["torch"]["reduce-overhead"]
    # (b) of reduce-overhead: mode default's replay (the same kernels), taken, not compiled again
    assert ro["a_ms"] > 0 and ro["b_ms"] == r["torch"]["default"]["b_ms"] and not ro["b_skipped"], ro
    assert ro["cosine"] > 0.999 and "mode default's" in ro["extra"]["b_of"], ro
    assert r["ratio"]["a"] and r["ratio"]["b"] and r["complete"]


@needs_torch
@pytest.mark.gpu
@pytest.mark.slow
def test_cuda_reduce_overhead_alone_gets_b_from_a_default_compile(tmp_path: Path) -> None:
    """--quick's PyTorch set (eager, reduce-overhead) has no mode default: reduce-overhead's (b) is a
    torch.cuda.CUDAGraph around a mode-default compile made for it, and the row's ratio (b) counts it."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    js = tmp_path / "r.json"
    rc = B.main(
        ["--tiny", "--models", "bert", "--exporters", "torchscript", "--batch", "2", "--precision", "fp16",
         "--modes", "reduce-overhead", "--calls", "5", "--json", str(js)]
    )  # fmt: skip
    (r,) = json.loads(js.read_text())["rows"]
    assert rc == 0, r
    ro = r["torch"]["reduce-overhead"]
    assert ro["a_ms"] > 0 and ro["b_ms"] > 0 and not ro["b_skipped"] and not ro["errors"], ro
    assert "compiled for (b) alone" in ro["extra"]["b_of"] and ro["extra"]["b_compile_s"] > 0, ro
    assert r["ratio"]["b"] == pytest.approx(r["graphc"]["b_ms"] / ro["b_ms"], rel=1e-3)


class FakeDynamo:
    def __init__(self) -> None:
        self.resets = 0

    def reset(self) -> None:
        self.resets += 1


def fake_bench(budget_s: float | None, modes: list[str]) -> B.Bench:
    """A Bench without torch: its reduce-overhead (b) phase, with torch_mode replaced."""
    bench = object.__new__(B.Bench)
    bench.args = B.parse(["--modes", ",".join(modes)])
    bench.budget = B.Budget(budget_s)
    bench.skipped, bench.rows = [], []
    bench.torch = type("T", (), {"_dynamo": FakeDynamo()})()
    bench.save = lambda: None
    return bench


def state_with(measures: dict[tuple[str, int], dict[str, R.Measure]]) -> B.ModelState:
    st = B.ModelState("bert", B.export_torch.CASES["bert"], master=None)
    st.torch = measures
    return st


def test_reduce_overhead_b_takes_defaults_replay_without_compiling() -> None:
    bench = fake_bench(None, ["eager", "default", "reduce-overhead"])
    bench.torch_mode = lambda *a, **k: pytest.fail("compiled although mode default's replay was there")
    ro = R.Measure(a_ms=0.5, b_skipped=B.RO_PENDING)
    st = state_with({("fp16", 1): {"default": R.Measure(a_ms=0.9, b_ms=0.41), "reduce-overhead": ro}})
    bench.reduce_overhead_graph(st)
    assert ro.b_ms == 0.41 and ro.b_skipped is None and "mode default's" in ro.extra["b_of"]


def test_reduce_overhead_b_compiles_default_where_it_did_not_run() -> None:
    bench = fake_bench(None, ["eager", "reduce-overhead"])
    calls = []

    def torch_mode(state, mode, precision, batch, steady=True):
        calls.append((mode, precision, batch, steady))
        return R.Measure(b_ms=0.37 if batch == 1 else None, setup_s=4.0, errors=[] if batch == 1 else ["(b): boom"])

    bench.torch_mode = torch_mode
    ro1, ro32 = R.Measure(a_ms=0.5, b_skipped=B.RO_PENDING), R.Measure(a_ms=2.0, b_skipped=B.RO_PENDING)
    failed = R.Measure(errors=["RuntimeError: x"])  # (a) failed: nothing to pair, nothing compiled
    st = state_with({("fp16", 1): {"reduce-overhead": ro1}, ("fp16", 32): {"reduce-overhead": ro32},
                     ("bf16", 1): {"reduce-overhead": failed}})  # fmt: skip
    bench.reduce_overhead_graph(st)
    assert calls == [("default", "fp16", 1, False), ("default", "fp16", 32, False)]  # (b) only: no (a) timed
    assert ro1.b_ms == 0.37 and ro1.b_skipped is None and ro1.extra["b_compile_s"] == 4.0
    assert ro32.b_ms is None and ro32.errors == ["(b): boom"]
    assert failed.b_ms is None and failed.errors == ["RuntimeError: x"]
    assert bench.torch._dynamo.resets == 2  # a fresh dynamo after each compile made for (b)


def test_reduce_overhead_b_skipped_with_a_reason_when_the_budget_is_out() -> None:
    bench = fake_bench(5.0, ["eager", "reduce-overhead"])  # below the 30 s prior of a default compile
    bench.torch_mode = lambda *a, **k: pytest.fail("compiled over the budget")
    ro = R.Measure(a_ms=0.5, b_skipped=B.RO_PENDING)
    bench.reduce_overhead_graph(state_with({("fp16", 1): {"reduce-overhead": ro}}))
    assert ro.b_ms is None and ro.b_skipped.startswith("budget: ~30 s needed for a mode-default compile (prior)")
    assert bench.skipped == [f"bert reduce-overhead (b) fp16 batch 1: {ro.b_skipped}"]


def test_selectable_batch_8_bf16_dynamo_with_quick() -> None:
    a = B.parse(["--quick", "--batch", "1,8,32", "--precision", "fp16,bf16", "--exporters", "dynamo"])
    assert (a.batch, a.precision, a.exporters, a.budget_s) == ([1, 8, 32], ["fp16", "bf16"], ["dynamo"], 400.0)
    assert B.COMPILE_ORDER.index(B.RO_GRAPH) > B.COMPILE_ORDER.index("default")
