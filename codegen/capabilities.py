"""The CUDA target's fusion capabilities (the protocol is graphc/passes/capabilities.py): which
elementwise ops have a CUDA expression (codegen/expr.py) and which dtypes a CUDA type
(codegen/cuda_types.py). `compile()` hands this to the pass pipeline through the target context,
so the fusion passes never import codegen."""

from __future__ import annotations

from dataclasses import dataclass

from graphc.codegen.cuda_types import CUDA_TYPES
from graphc.codegen.expr import EXPRESSIONS
from graphc.ir.types import DType


@dataclass(frozen=True)
class CudaCapabilities:
    name: str = "cuda"

    def renders(self, op: str) -> bool:
        return op in EXPRESSIONS

    def stores(self, dtype: DType) -> bool:
        return dtype in CUDA_TYPES

    def fuses_epilogue(self, anchor: str, op: str, dtype: DType) -> bool:
        # Every anchor template renders the same store hook (codegen/epilogue.py), so the anchor
        # does not restrict the epilogue's ops today; the dtype must have a CUDA type.
        return self.renders(op) and self.stores(dtype)

    @property
    def fp32_ops(self) -> frozenset[str]:
        """Ops whose only CUDA kernels are apache-tvm's computing ones, which take float32 (see
        FP32_OPS in codegen/families/tvm_kernels.py, the one list): under fp16/bf16 the precision
        pass keeps them in float32 with Casts around them."""
        from graphc.codegen.families.tvm_kernels import FP32_OPS  # the families' import, on first use

        return FP32_OPS


CUDA = CudaCapabilities()
