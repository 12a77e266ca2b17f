"""The layers of docs/architecture.md, enforced: an AST scan of every import in the source folders
(lazy imports inside functions included; imports under `if TYPE_CHECKING:` excluded, since they
never run), and a fresh interpreter that loads and runs a CPU engine.

    runtime/   imports only the stdlib, numpy, ml_dtypes, safetensors, msgspec, cupy, cuda bindings,
               cryptography (signing), itself and the leaf modules graphc.errors and graphc._version
    graphc/ir  imports nothing of graphc.ops, passes, codegen, frontend, or the compiler entry points
    passes/    imports nothing of graphc.codegen
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent

# Folder -> the import name its files live under (pyproject.toml's package-dir).
PACKAGES = {"graphc": "graphc", "passes": "graphc.passes", "codegen": "graphc.codegen", "runtime": "graphc.runtime"}

# Modules of graphc that import nothing but the stdlib: the runtime may use them.
LEAF_MODULES = ("graphc.errors", "graphc._version")
# nvmath: the cuBLASLt vendor tactic's bindings (runtime/tactics_cublaslt.py), imported only when an engine uses it
RUNTIME_THIRD_PARTY = ("numpy", "ml_dtypes", "safetensors", "msgspec", "cupy", "cuda", "cryptography", "nvmath")

ABOVE_IR = ("graphc.ops", "graphc.passes", "graphc.codegen", "graphc.frontend", "graphc.compiler", "graphc.cli")
COMPILER = (
    "graphc.ir",
    "graphc.ops",
    "graphc.passes",
    "graphc.codegen",
    "graphc.frontend",
    "graphc.compiler",
    "graphc.cli",
    "graphc.interpreter",
    "graphc.cpu_kernels",
)


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT)
    base = PACKAGES[rel.parts[0]]
    parts = list(rel.with_suffix("").parts[1:])
    if parts and parts[-1] == "__init__":
        parts.pop()
    return ".".join([base, *parts])


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports_of(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in a file that can run."""
    tree = ast.parse(path.read_text(), str(path))
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            skip |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    out = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            # `from graphc import ops` imports graphc.ops: name each imported submodule too.
            out.append((node.lineno, name))
            out += [(node.lineno, f"{name}.{a.name}") for a in node.names if name in ("graphc", "graphc.runtime")]
    return out


def _within(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def _files(folder: str) -> list[Path]:
    return sorted((ROOT / folder).rglob("*.py"))


def _violations(files: list[Path], bad) -> list[str]:
    out = []
    for f in files:
        for line, name in imports_of(f):
            if bad(name):
                out.append(f"{f.relative_to(ROOT)}:{line}: {name}")
    return out


def _runtime_import_ok(name: str) -> bool:
    if _within(name, ("graphc.runtime", *LEAF_MODULES, *RUNTIME_THIRD_PARTY)):
        return True
    top = name.split(".")[0]
    return top != "graphc" and top in sys.stdlib_module_names


def test_runtime_imports_nothing_of_the_compiler():
    bad = _violations(_files("runtime"), lambda n: not _runtime_import_ok(n))
    assert not bad, "the runtime imports beyond its layer:\n" + "\n".join(bad)


def test_leaf_modules_import_only_the_stdlib():
    files = [ROOT / "graphc" / (m.split(".")[1] + ".py") for m in LEAF_MODULES]
    bad = _violations(files, lambda n: n.split(".")[0] not in sys.stdlib_module_names)
    assert not bad, "a leaf module the runtime uses imports more than the stdlib:\n" + "\n".join(bad)


def test_ir_imports_nothing_above_it():
    bad = _violations(_files("graphc/ir"), lambda n: _within(n, ABOVE_IR))
    assert not bad, "graphc/ir imports from a layer above it:\n" + "\n".join(bad)


def test_passes_import_no_codegen():
    bad = _violations(_files("passes"), lambda n: _within(n, ("graphc.codegen",)))
    assert not bad, "passes/ imports codegen:\n" + "\n".join(bad)


def test_reference_kernels_import_nothing_of_the_compiler():
    """The numpy kernels are the runtime's (a narrower check than the runtime rule, with a message
    that says where a kernel's helper belongs)."""
    bad = _violations(_files("runtime/reference"), lambda n: _within(n, COMPILER) or n.split(".")[0] == "onnx")
    assert not bad, "a reference kernel imports the compiler (move the helper into runtime/reference):\n" + "\n".join(
        bad
    )


def test_the_scan_sees_the_imports_it_must_catch(tmp_path, monkeypatch):
    """The scanner resolves relative, lazy and `from graphc import x` imports, and skips TYPE_CHECKING."""
    pkg = tmp_path / "runtime"
    pkg.mkdir()
    f = pkg / "probe.py"
    f.write_text(
        textwrap.dedent(
            """
            from typing import TYPE_CHECKING
            from . import cpu
            from .. import ops
            from graphc import ir
            if TYPE_CHECKING:
                import onnx
            def later():
                import jinja2
            """
        )
    )
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    names = {n for _, n in imports_of(f)}
    assert {"graphc.runtime.cpu", "graphc.ops", "graphc.ir", "jinja2"} <= names
    assert "onnx" not in names
    assert not _runtime_import_ok("graphc.ops") and not _runtime_import_ok("jinja2")
    assert _runtime_import_ok("graphc.runtime.plan") and _runtime_import_ok("zipfile")


# ---- a CPU engine in a fresh interpreter -------------------------------------------------------

_RUN_ENGINE = """
import json, sys
import numpy as np
import graphc.runtime

feeds = dict(np.load(sys.argv[2]))
out = graphc.runtime.load(sys.argv[1]).run(feeds)
np.savez(sys.argv[3], **out)
forbidden = ("onnx", "jinja2", "graphc.ops", "graphc.ir", "graphc.passes", "graphc.codegen",
             "graphc.frontend", "graphc.compiler", "graphc.interpreter", "graphc.cpu_kernels")
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in ("onnx", "jinja2")
                        or any(m == f or m.startswith(f + ".") for f in forbidden))))
"""


@pytest.mark.parametrize("model", ["bert", "resnet"])
def test_loading_and_running_a_cpu_engine_imports_no_compiler(model, tmp_path):
    import graphc
    import models

    m = models.build(model, size="tiny")
    feeds = models.sample_inputs(model, m)
    eng = graphc.compile(m, target="cpu", shapes={k: v.shape for k, v in feeds.items()})
    path = tmp_path / f"{model}.engine"
    eng.save(path)
    np.savez(tmp_path / "feeds.npz", **feeds)
    proc = subprocess.run(
        [sys.executable, "-c", _RUN_ENGINE, str(path), str(tmp_path / "feeds.npz"), str(tmp_path / "out.npz")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == []
    # The fresh interpreter ran the same kernels: the same numbers as the engine in this process.
    want = eng.run(feeds)
    with np.load(tmp_path / "out.npz") as got:
        assert set(got.files) == set(want)
        for k in want:
            np.testing.assert_array_equal(got[k], want[k])
