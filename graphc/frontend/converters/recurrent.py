"""Converters of recurrent ops (LSTM, GRU, RNN).

- Versions 7 and 14/22 are the IR op: 14 added `layout` (7 reads as layout 0, the IR default) and
  22 only widened the types.
- Version 1 (and GRU 3) also carry `output_sequence`, which only said whether the Y output may be
  left out; whether Y is produced is told by the node's outputs, so the attribute is dropped.
  GRU 1 has no `linear_before_reset`, whose IR default (0) is its meaning.
"""

from __future__ import annotations

from graphc.frontend.context import ConvertContext
from graphc.frontend.registry import converter, passthrough
from graphc.ir.graph import Value

passthrough("LSTM", "GRU", "RNN", since=7)


def _v1(ctx: ConvertContext) -> list[Value]:
    node = ctx.emit(
        ctx.op_type, ctx.inputs, ctx.typed_attrs(drop=("output_sequence",)), outputs=ctx.output_names, name=ctx.name
    )
    return list(node.outputs)


for _op in ("LSTM", "GRU", "RNN"):
    converter(_op, since=1)(_v1)
converter("GRU", since=3)(_v1)
