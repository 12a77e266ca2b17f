"""The package as installed: pyproject.toml lists every subpackage and template, declares only what
is imported, and the editable install made by `make install` imports the real graphc from the
clone's parent folder and runs `python -m models` from anywhere."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+; on 3.10 these checks skip

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
SETUPTOOLS = PYPROJECT["tool"]["setuptools"]


def _package_of(folder: Path) -> str | None:
    """The import name of a source folder under the package-dir mapping."""
    rel = folder.relative_to(ROOT).as_posix()
    best = None
    for pkg, src in SETUPTOOLS["package-dir"].items():
        if (rel == src or rel.startswith(src + "/")) and (best is None or len(src) > len(best[1])):
            best = (pkg, src)
    if best is None:
        return None
    pkg, src = best
    tail = rel[len(src) :].strip("/")
    return pkg + ("." + tail.replace("/", ".") if tail else "")


def test_every_subpackage_is_listed():
    listed = set(SETUPTOOLS["packages"])
    missing = []
    for src in set(SETUPTOOLS["package-dir"].values()):
        for init in (ROOT / src).rglob("__init__.py"):
            name = _package_of(init.parent)
            if name and name not in listed:
                missing.append(name)
    assert not missing, f"add to [tool.setuptools] packages: {sorted(missing)}"


def test_templates_are_package_data():
    data = SETUPTOOLS["package-data"]["graphc.codegen.templates"]
    assert "graphc.codegen.templates" in SETUPTOOLS["packages"]
    files = [p.name for p in (ROOT / "codegen" / "templates").iterdir() if p.is_file()]
    assert files
    uncovered = [f for f in files if not any(Path(f).match(g) for g in data)]
    assert not uncovered, f"templates not shipped: {uncovered}"


def test_license_is_an_spdx_string():
    # a TOML table is deprecated in setuptools >= 77 and prints a warning on every install
    assert isinstance(PYPROJECT["project"]["license"], str)
    assert any(r.startswith("setuptools>=77") for r in PYPROJECT["build-system"]["requires"])


def _imported_top_level_names() -> set[str]:
    names: set[str] = set()
    pattern = re.compile(r"^\s*(?:from|import)\s+([A-Za-z_][A-Za-z0-9_]*)", re.MULTILINE)
    for folder in ("graphc", "passes", "codegen", "runtime", "models", "tools"):
        for py in (ROOT / folder).rglob("*.py"):
            names.update(pattern.findall(py.read_text()))
    return names


def test_dependencies_are_imported():
    """Every declared dependency is imported somewhere (networkx was declared and never used)."""
    import_name = {"ml_dtypes": "ml_dtypes"}
    deps = [re.split(r"[<>=!~ \[]", d, maxsplit=1)[0] for d in PYPROJECT["project"]["dependencies"]]
    imported = _imported_top_level_names()
    unused = [d for d in deps if import_name.get(d, d.replace("-", "_")) not in imported]
    assert "networkx" not in deps
    assert not unused, f"declared but never imported: {unused}"


def _make_install_done() -> bool:
    return any(Path(p, "_graphc_clone.pth").exists() for p in sys.path if p)


needs_make_install = pytest.mark.skipif(
    not _make_install_done(), reason="the environment was not made by `make install` (no _graphc_clone.pth)"
)


@needs_make_install
def test_import_graphc_from_the_clones_parent(tmp_path):
    # the clone's parent: it holds a folder named graphc (the clone) with no __init__.py in it
    (tmp_path / "graphc").symlink_to(ROOT, target_is_directory=True)
    code = "import graphc, graphc.passes, graphc.runtime; print(graphc.__file__); print(graphc.compile.__name__)"
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    first = out.stdout.splitlines()[0]
    assert first != "None" and Path(first).resolve() == (ROOT / "graphc" / "__init__.py").resolve()


@needs_make_install
def test_python_m_models_from_anywhere(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "models", "mlp", "-o", str(tmp_path / "m.onnx")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "m.onnx").stat().st_size > 0


@needs_make_install
def test_make_install_does_not_rerun_pip():
    """`make install` is a stamp that depends on pyproject.toml: up to date after an install."""
    if shutil.which("make") is None:
        pytest.skip("no make")
    stamps = list((ROOT / ".venv").glob(".graphc-installed.*"))
    if not stamps or max(p.stat().st_mtime for p in stamps) < (ROOT / "pyproject.toml").stat().st_mtime:
        pytest.skip("pyproject.toml changed since the last make install")
    extras = max(stamps, key=lambda p: p.stat().st_mtime).name.split(".", 2)[2]  # the last install's
    out = subprocess.run(
        ["make", "-q", "install", f"EXTRAS={extras}"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, "make install would run pip again"


@pytest.mark.slow
def test_wheel_builds_without_setuptools_warnings_and_ships_everything(tmp_path):
    """A wheel (what `pip install` builds) with no setuptools warning, holding every subpackage and
    template. Needs the build backend from the package index (pip's build isolation)."""
    import zipfile

    out = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if out.returncode != 0 and "setuptools" in out.stderr and "No matching distribution" in out.stderr:
        pytest.skip("no setuptools>=77 to be had for the isolated build")
    assert out.returncode == 0, out.stderr[-2000:]
    text = out.stdout + out.stderr
    noise = [ln for ln in text.splitlines() if re.search(r"Warning|deprecated|is absent from", ln)]
    assert not noise, "\n".join(noise)
    (wheel,) = tmp_path.glob("graphc-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    for pkg in SETUPTOOLS["packages"]:
        assert f"{pkg.replace('.', '/')}/__init__.py" in names or pkg == "graphc.codegen.templates", pkg
    templates = [p.name for p in (ROOT / "codegen" / "templates").iterdir() if p.is_file()]
    assert all(f"graphc/codegen/templates/{t}" in names for t in templates)
