"""Converters of linalg ops.

Version notes (onnx.defs history):
- Gemm-7 dropped the `broadcast` attribute of 1/6 for unidirectional (numpy) broadcasting of C;
  9 added integer types, 11 made C optional (beta stays 1.0 by default), 13 bfloat16. Versions
  1/6 become the IR op without `broadcast`: with broadcast=0 C already has the output's shape,
  and the legacy broadcast of a rank <= 2 C onto (M, N) matches its trailing dims, as numpy does.
- MatMul 1/9/13 and Det 11/22 only add types; Einsum 12/28, MatMulInteger 10.
"""

from __future__ import annotations

from graphc.frontend.context import ConvertContext
from graphc.frontend.registry import converter, passthrough

passthrough("Gemm", since=7)
passthrough("MatMul", since=1)
passthrough("Einsum", since=12)
passthrough("MatMulInteger", since=10)
passthrough("Det", since=11)


@converter("Gemm", since=1)
def _gemm_v1(ctx: ConvertContext):
    attrs = ctx.typed_attrs(drop=("broadcast",))
    node = ctx.emit("Gemm", ctx.inputs, attrs, outputs=ctx.output_names, name=ctx.name)
    return node.outputs
