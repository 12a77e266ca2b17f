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

    # Ops whose only CUDA kernels are apache-tvm's computing ones (codegen/families/tvm_kernels.py),
    # which take float32, not 16-bit floats (TVM's fp16 code needs cuda_fp16.h, which NVRTC from pip
    # lacks): under fp16/bf16 the precision pass keeps them in float32 with Casts around them.
    # tests/codegen/test_tvm_kernels.py checks this list against the family's.
    fp32_ops: frozenset[str] = frozenset(
        {
            "GridSample",
            "DFT",
            "STFT",
            "MeanVarianceNormalization",
            "NegativeLogLikelihoodLoss",
            "SoftmaxCrossEntropyLoss",
            "Det",
        }
    )


CUDA = CudaCapabilities()
