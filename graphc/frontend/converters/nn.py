"""Converters of nn ops: convolutions, pools, LRN, MaxUnpool.

Version notes (onnx.defs history):
- Conv 1/11/22, MaxPool 1/8/10/11/12/22, AveragePool 1/7/10/11/19/22, LpPool 2/11/18/22,
  GlobalAveragePool/GlobalMaxPool 1/22, GlobalLpPool 2/22, LRN 1/13, MaxUnpool 9/11/22 only add
  attributes whose defaults keep the older behaviour (storage_order, ceil_mode, dilations,
  count_include_pad) and types, or reword the docs (SAME pads as output = ceil(in / stride); the
  pool rule that a ceil-mode window starting in the end padding is dropped, written down in 22,
  is what ORT and PyTorch do at every version). So they pass through from their first version.
- LpPool-1 and GlobalLpPool-1 took `p` as a float; version 2 made it an int.
- ConvTranspose-1's formula for splitting an odd total padding (`pads[start] = total/2` unless
  SAME_UPPER) contradicted its own auto_pad text (extra padding at the end for SAME_UPPER); the
  maintainers called it a doc error (onnx/onnx#1609) and 11 fixed the text. ONNX Runtime and the
  ONNX reference apply the fixed rule at every version, and so does graphc: ConvTranspose also
  passes through from 1.
"""

from __future__ import annotations

from graphc.frontend.context import ConvertContext
from graphc.frontend.registry import converter, passthrough

passthrough("Conv", since=1)
passthrough("ConvTranspose", since=1)
passthrough("ConvInteger", since=10)
passthrough("DeformConv", since=19)
passthrough("MaxPool", "AveragePool", since=1)
passthrough("LpPool", "GlobalLpPool", since=2)
passthrough("GlobalAveragePool", "GlobalMaxPool", since=1)
passthrough("LRN", since=1)
passthrough("MaxUnpool", since=9)


def _float_p_to_int(ctx: ConvertContext):
    p = ctx.attr("p")
    attrs = ctx.typed_attrs(drop=("p",))
    if p is not None:
        if float(p) != int(p):
            raise ctx.fail(f"p = {p} is not an integer (the IR op takes an int p)")
        attrs = attrs.replace(p=int(p))
    node = ctx.emit(ctx.op_type, ctx.inputs, attrs, outputs=ctx.output_names, name=ctx.name)
    return node.outputs


converter("LpPool", since=1)(_float_p_to_int)
converter("GlobalLpPool", since=1)(_float_p_to_int)
