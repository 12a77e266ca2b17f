"""What compile and inspect print (kernel counts, node changes, fusions, units) and the memory
timeline picture with its peak."""

from __future__ import annotations

import re

import pytest

import graphc
import models
from graphc.cli import main
from graphc.inspect import compile_summary, draw_memory, format_bytes, kernel_counts, memory_peak


@pytest.fixture(scope="module")
def bert_engine():
    m = models.build("bert", size="tiny")
    feeds = models.sample_inputs("bert", m)
    return graphc.compile(m, target="cpu", shapes={k: v.shape for k, v in feeds.items()})


def test_memory_peak_is_the_most_live_bytes(bert_engine):
    plan, memory = bert_engine.plan, bert_engine.memory
    peak = memory_peak(plan, memory)
    places = memory.placements.values()

    def live(step):
        return sum(p.nbytes for p in places if p.first <= step <= p.last)

    assert peak.live_bytes == live(peak.step) == sum(memory.placements[t].nbytes for t in peak.tensors)
    assert all(live(s) <= peak.live_bytes for s in range(-1, len(plan.steps) + 1))
    assert all(memory.placements[t].first <= peak.step <= memory.placements[t].last for t in peak.tensors)
    # the planner's bound counts aligned sizes: at least the raw peak, at most the arena
    assert peak.live_bytes <= memory.lower_bound_bytes <= memory.arena_bytes


def test_memory_picture(bert_engine, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    png = tmp_path / "mem.png"
    peak = draw_memory(bert_engine.plan, bert_engine.memory, png, title="bert tiny")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert peak.tensors
    bert_engine.save(tmp_path / "b.engine")
    assert main(["inspect", str(tmp_path / "b.engine"), "--memory", str(tmp_path / "cli.png")]) == 0
    assert (tmp_path / "cli.png").stat().st_size > 1000
    out = capsys.readouterr().out
    assert f"memory peak: {format_bytes(peak.live_bytes)}" in out
    for t in peak.tensors:
        assert t in out  # every tensor that sets the peak is named, with the op that writes it


def test_format_bytes():
    assert [format_bytes(n) for n in (0, 512, 1024, 1536, 3 * 2**20 + 2**18, 2**31)] == [
        "0 B",
        "512 B",
        "1.00 KiB",
        "1.50 KiB",
        "3.25 MiB",
        "2.00 GiB",
    ]


def test_kernel_counts_cpu(bert_engine):
    steps = bert_engine.plan.steps
    views = sum(1 for s in steps if s.alias)
    assert kernel_counts(bert_engine.plan) == f"{len(steps)} steps ({views} views), {len(steps) - views} numpy kernels"


def _report(passes, fusions):
    return {
        "nodes_before": 10,
        "nodes_after": 4,
        "optimize_seconds": 0.0123,
        "passes": [{"name": n, "seconds": 0.001, "nodes_before": b, "nodes_after": a} for n, b, a in passes],
        "ops_after": {"Fused[MatMul]": 1},
        "fusions": fusions,
        "near_misses": [],
        "memory": {"arena_bytes": 2048, "naive_bytes": 4096, "workspace_bytes": 0, "arena_over_lower_bound": 1.0},
    }


def test_summary_signs_node_changes_and_keeps_transposes_out_of_fusions():
    text = compile_summary(
        _report(
            [("constant_folding", 146, 20), ("fold_batchnorm", 20, 139), ("constant_folding", 139, 129), ("cse", 4, 4)],
            [
                {"node": "mm", "kind": "Fused[MatMul]", "absorbed": ["mm", "add"]},
                {"node": "t", "kind": "Transpose", "absorbed": ["t1", "t2"]},
            ],
        )
    )
    assert re.search(r"constant_folding \(x2\) +[\d.]+ ms  -136 nodes", text), text
    assert re.search(r"fold_batchnorm +[\d.]+ ms  \+119 nodes", text), text
    assert "removed" not in text
    assert "fusions: 1\n" in text and "Fused[MatMul] 'mm' <- mm, add" in text
    assert "'t'" not in text and "data-movement rewrites (not fusions): 1 (Transpose)" in text
    assert "optimizer: 10 -> 4 nodes in 12.3 ms" in text and "arena 2.00 KiB" in text
