"""Converters of GridSample, Col2Im and DFT (IR ops in their latest ONNX forms).

- GridSample 16 named its modes bilinear / bicubic; 20 renamed them linear / cubic and allowed
  N-D inputs (22 only widened the types).
- DFT 17 takes `axis` as an attribute (default 1); 20 made it an input (default -2).
- RoiAlign 10 has no coordinate_transformation_mode: it behaves as 16's "output_half_pixel"
  (16's default is "half_pixel").
"""

from __future__ import annotations

from graphc.frontend.context import ConvertContext
from graphc.frontend.registry import converter, passthrough
from graphc.ir.graph import Value

passthrough("GridSample", since=20)
passthrough("Col2Im", since=18)
passthrough("DFT", since=20)
passthrough("NonMaxSuppression", since=10)
passthrough("STFT", "MelWeightMatrix", since=17)
passthrough("RoiAlign", since=16)

_GRID_SAMPLE_16_MODES = {"bilinear": "linear", "bicubic": "cubic", "nearest": "nearest"}


def _text(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


@converter("GridSample", since=16)
def _grid_sample_16(ctx: ConvertContext) -> list[Value]:
    mode = _text(ctx.attr("mode", "bilinear"))
    if mode not in _GRID_SAMPLE_16_MODES:
        raise ctx.fail(f"mode {mode!r} is not bilinear, bicubic or nearest (GridSample-16)")
    attrs = {
        "mode": _GRID_SAMPLE_16_MODES[mode],
        "padding_mode": _text(ctx.attr("padding_mode", "zeros")),
        "align_corners": int(ctx.attr("align_corners", 0)),
    }
    return list(ctx.emit("GridSample", ctx.inputs, attrs, outputs=ctx.output_names, name=ctx.name).outputs)


@converter("DFT", since=17)
def _dft_17(ctx: ConvertContext) -> list[Value]:
    axis = ctx.constant(int(ctx.attr("axis", 1)), "axis", "int64")
    ins = list(ctx.inputs) + [None] * (2 - len(ctx.inputs))
    attrs = {"inverse": int(ctx.attr("inverse", 0)), "onesided": int(ctx.attr("onesided", 0))}
    return list(ctx.emit("DFT", [ins[0], ins[1], axis], attrs, outputs=ctx.output_names, name=ctx.name).outputs)


@converter("RoiAlign", since=10)
def _roi_align_10(ctx: ConvertContext) -> list[Value]:
    attrs = {k: _text(v) if isinstance(v, bytes) else v for k, v in ctx.attrs.items()}
    attrs["coordinate_transformation_mode"] = "output_half_pixel"
    return list(ctx.emit("RoiAlign", ctx.inputs, attrs, outputs=ctx.output_names, name=ctx.name).outputs)
