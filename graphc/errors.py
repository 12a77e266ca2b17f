"""The errors graphc raises on bad input.

Every user-facing failure is a `GraphcError`; the CLI prints its message on one line and exits
non-zero. Anything else escaping is a bug in graphc.
"""

from __future__ import annotations


class GraphcError(Exception):
    """Base of every error graphc raises for bad input or an unsupported model."""


class ModelLoadError(GraphcError):
    """The ONNX file is missing, malformed, truncated, or fails the ONNX checker."""


class UnsupportedOpError(GraphcError):
    """The model uses ops (or op forms) that graphc does not implement.

    `unsupported` lists (op_type, domain, opset, node names) for every offending op type, so the
    user sees all of them at once.
    """

    def __init__(self, message: str, unsupported: list[tuple[str, str, int, list[str]]]):
        super().__init__(message)
        self.unsupported = unsupported


class ShapeError(GraphcError):
    """Type or shape inference failed, or a symbolic dim is unbound where a concrete one is needed."""


class InputError(GraphcError):
    """Inputs given at run time do not match the graph (missing, wrong dtype or shape)."""


class VerificationError(GraphcError):
    """The IR verifier found a broken graph (a graphc bug when it follows a pass)."""


class CompileError(GraphcError):
    """Compilation failed: an op has no kernel for the target, or code generation failed."""
