"""graphc.runtime: load and run engines. Imports nothing of the compiler (no onnx, no jinja2):
CPU engines run the runtime's own numpy reference kernels (graphc.runtime.reference)."""

from __future__ import annotations

from typing import Any

from graphc.runtime.batcher import Batcher, BatcherStats
from graphc.runtime.errors import EngineError, EngineInputError


def load(
    path: Any, device: int = 0, *, verify_key: Any = None, pdl: bool | None = None, output_ring: int | None = None
):
    """Load an engine file (validated before it touches the GPU); with `verify_key` (a PEM ed25519
    public key), only an engine signed by its private key (`graphc sign`). `pdl=False` launches
    every kernel the ordinary way (programmatic dependent launch, sm_90+: docs/launches.md).
    `output_ring=0`: engine.run copies its outputs into new arrays instead of having the kernels
    write them into output slots the caller has given back (2 by default; docs/usage.md)."""
    from graphc.runtime.format import load as _load

    return _load(path, device, verify_key=verify_key, pdl=pdl, output_ring=output_ring)


__all__ = ["Batcher", "BatcherStats", "EngineError", "EngineInputError", "load"]
