"""The memory timeline picture (needs matplotlib, an optional extra)."""

from __future__ import annotations

import pytest

import graphc
import models
from graphc.cli import main
from graphc.inspect import draw_memory


def test_memory_picture(tmp_path):
    pytest.importorskip("matplotlib")
    m = models.build("bert", size="tiny")
    feeds = models.sample_inputs("bert", m)
    eng = graphc.compile(m, target="cpu", shapes={k: v.shape for k, v in feeds.items()})
    png = tmp_path / "mem.png"
    draw_memory(eng.plan, eng.memory, png, title="bert tiny")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    eng.save(tmp_path / "b.engine")
    assert main(["inspect", str(tmp_path / "b.engine"), "--memory", str(tmp_path / "cli.png")]) == 0
    assert (tmp_path / "cli.png").stat().st_size > 1000
