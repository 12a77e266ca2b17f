"""What a target can fuse: the protocol the fusion passes ask, so that passes import nothing from
codegen. The target context (passes/target.py) carries one; `compile()` hands in the CUDA
target's (codegen/capabilities.py) for target="cuda".

`REFERENCE` is the CPU engine's: a fused node there runs the ops' numpy references one after the
other (graphc/ops/fused.py), so any elementwise op of the registry on any numeric dtype fuses.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from graphc.ir.types import DType
from graphc.ops.registry import Category, get_op, has_op


@runtime_checkable
class FusionCapabilities(Protocol):
    """Questions a fusion pass asks the target. `op` is an ONNX op of the default domain."""

    name: str

    def renders(self, op: str) -> bool:
        """The target can compute `op` inside a fused kernel (an expression for it)."""
        ...

    def stores(self, dtype: DType) -> bool:
        """The target's fused kernels can load and store tensors of `dtype`."""
        ...

    def fuses_epilogue(self, anchor: str, op: str, dtype: DType) -> bool:
        """`op` on `dtype` can ride in the epilogue of an `anchor` kernel ("Conv", "MatMul",
        "Gemm", "graphc.MatMul")."""
        ...


@dataclass(frozen=True)
class ReferenceCapabilities:
    """Every elementwise op the registry defines, on every dtype numpy holds but strings."""

    name: str = "reference"

    def renders(self, op: str) -> bool:
        return has_op(op) and get_op(op).category is Category.ELEMENTWISE

    def stores(self, dtype: DType) -> bool:
        return dtype is not DType.string

    def fuses_epilogue(self, anchor: str, op: str, dtype: DType) -> bool:
        # The CPU engine runs ConvInteger/MatMulInteger as steps of their own (their int32 results
        # stay visible, as the int8 tests read them); fusing them would not make numpy faster.
        return anchor not in INTEGER_ANCHORS and self.renders(op) and self.stores(dtype)


INTEGER_ANCHORS = frozenset({"ConvInteger", "MatMulInteger"})
REFERENCE = ReferenceCapabilities()
