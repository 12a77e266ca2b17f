"""Errors of the runtime. graphc.errors is a leaf module (no compiler imports), so the runtime's
errors can share its base class and the CLI reports them like every other user error."""

from __future__ import annotations

from graphc.errors import GraphcError, InputError


class EngineError(GraphcError):
    """An engine file is invalid (corrupt, wrong version, out-of-range offsets), or cannot run
    here (no suitable GPU, no kernel for this GPU)."""


class EngineInputError(EngineError, InputError):
    """Inputs given to an engine do not match its input specs."""
