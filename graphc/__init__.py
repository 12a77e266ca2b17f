"""graphc: a deep-learning graph compiler. ONNX in, fast engines out.

Imports are lazy: `import graphc.runtime` to run an engine pulls in neither onnx nor jinja2.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from graphc._version import __version__

if TYPE_CHECKING:
    from graphc.errors import (
        CompileError,
        GraphcError,
        InputError,
        ModelLoadError,
        ShapeError,
        UnsupportedOpError,
    )
    from graphc.frontend import load_onnx
    from graphc.interpreter import interpret
    from graphc.ir.shapes import bind_shapes

_LAZY = {
    "load_onnx": ("graphc.frontend", "load_onnx"),
    "interpret": ("graphc.interpreter", "interpret"),
    "bind_shapes": ("graphc.ir.shapes", "bind_shapes"),
    "GraphcError": ("graphc.errors", "GraphcError"),
    "ModelLoadError": ("graphc.errors", "ModelLoadError"),
    "UnsupportedOpError": ("graphc.errors", "UnsupportedOpError"),
    "ShapeError": ("graphc.errors", "ShapeError"),
    "InputError": ("graphc.errors", "InputError"),
    "CompileError": ("graphc.errors", "CompileError"),
    "EngineError": ("graphc.runtime.errors", "EngineError"),
    "compile": ("graphc.compiler", "compile"),
    "CompileOptions": ("graphc.compiler", "CompileOptions"),
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    try:
        module, attr = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'graphc' has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value
    return value
