"""`graphc check --target cuda` against the CUDA compile itself (NVRTC, sm_90, no GPU needed) over the
models available here (issue 12: check said "supported" for models whose CUDA compile then failed):
the control-flow models of the tests, one transformer export per architecture from tests/corpus/, and
the trained models of tools/fetch_trained_models.py's cache where it is here (GRAPHC_CORPUS_CACHE or
~/.cache/graphc/trained_models). Check and compile must agree both ways."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import cf_models as M
import pytest
from host_if_models import data_if_model, ill_typed_else_model, nested_if_model

import graphc
from graphc.support import check_model

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))


def _agree(model, shapes, label: str) -> None:
    rep = check_model(model, target="cuda", shapes=shapes)
    try:
        graphc.compile(model, target="cuda", shapes=shapes, arch=["sm_90"])
        compiled, why = True, ""
    except graphc.errors.GraphcError as e:
        compiled, why = False, str(e).splitlines()[0]
    said = "supported" if rep.supported else "; ".join(f.line()[:160] for f in rep.findings[:3])
    assert rep.supported == compiled, f"{label}: check says {said!r}; the compile {'succeeds' if compiled else why!r}"


HANDMADE = {
    "if_on_input": (M.if_on_input, None),
    "if_on_shape": (M.if_on_shape, None),
    "loop_static": (lambda: M.loop_static(5), None),
    "loop_long": (lambda: M.loop_static(100), None),  # stays a loop: both refuse it
    "scan": (lambda: M.scan_cumsum(4), None),
    "data_if": (data_if_model, None),
    "nested_if": (nested_if_model, None),
    "ill_typed_else": (ill_typed_else_model, {"x": (2, 3)}),
    "ill_typed_else_unbound": (ill_typed_else_model, None),  # a symbolic dim: both refuse it
}


@pytest.mark.parametrize("name", sorted(HANDMADE))
def test_check_agrees_with_the_cuda_compile_on_control_flow(name):
    make, shapes = HANDMADE[name]
    _agree(make(), shapes, name)


def _one_export_per_architecture() -> list[str]:
    manifest = json.loads((ROOT / "tests" / "corpus" / "manifest.json").read_text())
    chosen: dict[str, str] = {}
    for key in sorted(manifest):  # the dynamo export where there is one (it writes sequences), else the first
        fam = manifest[key]["model"]
        if fam not in chosen or (".dynamo." in key and ".dynamo." not in chosen[fam]):
            chosen[fam] = key
    return sorted(chosen.values())


@pytest.mark.slow
@pytest.mark.parametrize("key", _one_export_per_architecture())
def test_check_agrees_with_the_cuda_compile_on_transformer_exports(key):
    entry = json.loads((ROOT / "tests" / "corpus" / "manifest.json").read_text())[key]
    _agree(str(ROOT / "tests" / "corpus" / entry["file"]), entry["inputs"], key)


def _trained() -> list[str]:
    from fetch_trained_models import CORPUS

    return sorted(m.name for w in CORPUS for m in w.members)


@pytest.mark.slow
@pytest.mark.parametrize("name", _trained())
def test_check_agrees_with_the_cuda_compile_on_trained_models(name):
    from check_models import export_inputs
    from fetch_trained_models import default_cache

    path = default_cache() / "models" / f"{name}.onnx"
    if not path.exists():
        pytest.skip(f"{path} is not here (python tools/fetch_trained_models.py --fetch-only)")
    feeds = export_inputs(path.with_suffix(".json"), 1, 128)
    _agree(str(path), {k: v.shape for k, v in feeds.items()}, name)
