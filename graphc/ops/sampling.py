"""GridSample, Col2Im and DFT: type inference (the numpy kernels are in
graphc.runtime.reference.sampling). The attrs are the latest ONNX forms (GridSample 22, Col2Im
18, DFT 20); the frontend converts older versions (GridSample 16's mode names, DFT 17's axis
attribute)."""

from __future__ import annotations

from graphc.ir.types import DType, TensorType
from graphc.ops.registry import Category, InferContext, register_op


def _grid_sample_infer(ctx: InferContext) -> list[TensorType]:
    x, grid = ctx.type(0), ctx.type(1)
    if not x.dtype.is_float or not grid.dtype.is_float:
        ctx.fail(f"X and grid must be float tensors, got {x.dtype.name} and {grid.dtype.name}")
    if ctx.attrs.mode not in ("nearest", "linear", "cubic"):
        ctx.fail(f"mode must be nearest, linear or cubic, got {ctx.attrs.mode!r}")
    if ctx.attrs.padding_mode not in ("zeros", "border", "reflection"):
        ctx.fail(f"padding_mode must be zeros, border or reflection, got {ctx.attrs.padding_mode!r}")
    if x.shape is None or grid.shape is None:
        return [x.with_shape(None)]
    nd = len(x.shape) - 2
    if nd < 1 or len(grid.shape) != nd + 2 or grid.shape[-1] not in (nd, None):
        ctx.fail(f"grid {grid} does not match X {x} ({nd} spatial axes: grid [N, *out, {nd}])")
    if ctx.attrs.mode == "cubic" and nd != 2:
        ctx.fail("cubic mode is defined for 2-D inputs only")
    return [x.with_shape((x.shape[0], x.shape[1], *grid.shape[1:-1]))]


register_op("GridSample", category=Category.DATA, infer=_grid_sample_infer)


def _roi_align_infer(ctx: InferContext) -> list[TensorType]:
    """RoiAlign: X [N, C, H, W], rois [R, 4] (x1, y1, x2, y2), batch_indices [R] -> [R, C, oh, ow]."""
    x, rois, idx = ctx.type(0), ctx.type(1), ctx.type(2)
    a = ctx.attrs
    if not x.dtype.is_float or rois.dtype != x.dtype:
        ctx.fail(f"X and rois must be float tensors of one type, got {x.dtype.name} and {rois.dtype.name}")
    if idx.dtype != DType.int64:
        ctx.fail(f"batch_indices must be int64, got {idx.dtype.name}")
    if a.mode not in ("avg", "max"):
        ctx.fail(f"mode must be avg or max, got {a.mode!r}")
    if a.coordinate_transformation_mode not in ("half_pixel", "output_half_pixel"):
        ctx.fail(
            f"coordinate_transformation_mode {a.coordinate_transformation_mode!r} is not half_pixel or "
            "output_half_pixel"
        )
    if a.output_height < 1 or a.output_width < 1 or a.sampling_ratio < 0:
        ctx.fail(f"output {a.output_height}x{a.output_width} and sampling_ratio {a.sampling_ratio} must be >= 1, >= 0")
    if x.shape is not None and len(x.shape) != 4:
        ctx.fail(f"X {x} must be [N, C, H, W]")
    if rois.shape is not None and (len(rois.shape) != 2 or rois.shape[1] not in (4, None)):
        ctx.fail(f"rois {rois} must be [num_rois, 4]")
    if idx.shape is not None and len(idx.shape) != 1:
        ctx.fail(f"batch_indices {idx} must be [num_rois]")
    r = rois.shape[0] if rois.shape is not None else (idx.shape[0] if idx.shape is not None else None)
    c = x.shape[1] if x.shape is not None else None
    return [x.with_shape((r, c, a.output_height, a.output_width))]


register_op("RoiAlign", category=Category.DATA, infer=_roi_align_infer)


def _col2im_infer(ctx: InferContext) -> list[TensorType]:
    x = ctx.type(0)
    image, block = ctx.int_list(1), ctx.int_list(2)
    if x.shape is not None and len(x.shape) != 3:
        ctx.fail(f"input must be [N, C * prod(block_shape), L], got {x}")
    if image is None or block is None:
        nd = ctx.type(1).shape[0] if ctx.type(1).shape else None
        rank = None if not isinstance(nd, int) else nd + 2
        n = None if x.shape is None else x.shape[0]
        return [x.with_shape(None if rank is None else (n, *([None] * (rank - 1))))]
    if len(image) != len(block):
        ctx.fail(f"image_shape {image} and block_shape {block} differ in length")
    kprod = 1
    for b in block:
        kprod *= b
    n, ck = (None, None) if x.shape is None else x.shape[:2]
    c = ck // kprod if isinstance(ck, int) else None
    if isinstance(ck, int) and ck % kprod:
        ctx.fail(f"input dim 1 ({ck}) is not a multiple of the block size {kprod}")
    return [x.with_shape((n, c, *image))]


register_op("Col2Im", category=Category.DATA, infer=_col2im_infer, static_inputs=(1, 2))


def _dft_infer(ctx: InferContext) -> list[TensorType]:
    x = ctx.type(0)
    if not x.dtype.is_float:
        ctx.fail(f"input must be a float tensor, got {x.dtype.name}")
    if x.shape is None:
        return [x.with_shape(None)]
    rank = len(x.shape)
    if x.shape[-1] not in (1, 2, None):
        ctx.fail(f"the last axis must have size 1 (real) or 2 (complex), got {x}")
    axis_v = ctx.int_list(2) if ctx.has_input(2) else [-2]
    if axis_v is None:
        return [x.with_shape(tuple(None for _ in x.shape))]
    axis = axis_v[0] % rank
    if axis == rank - 1:
        ctx.fail("axis may not be the last (real/imaginary) axis")
    inverse, onesided = bool(ctx.attrs.inverse), bool(ctx.attrs.onesided)
    d = x.shape[axis]
    if ctx.has_input(1):
        lv = ctx.int_list(1)
        n = None if lv is None else lv[0]
    else:
        n = (2 * (d - 1) if inverse and onesided else d) if isinstance(d, int) else None
    if inverse and onesided:
        out_d, last = n, 1
    else:
        out_d = (n // 2 + 1 if onesided else n) if isinstance(n, int) else None
        last = 2
    shape = list(x.shape)
    shape[axis], shape[-1] = out_d, last
    return [x.with_shape(tuple(shape))]


register_op("DFT", category=Category.OTHER, infer=_dft_infer, static_inputs=(1, 2))


def _nms_infer(ctx: InferContext) -> list[TensorType]:
    b, s = ctx.type(0), ctx.type(1)
    if not b.dtype.is_float or s.dtype != b.dtype:
        ctx.fail(f"boxes and scores must be float tensors of one type, got {b.dtype.name} and {s.dtype.name}")
    if b.shape is not None and (len(b.shape) != 3 or b.shape[2] not in (4, None)):
        ctx.fail(f"boxes must be [batches, boxes, 4], got {b}")
    if s.shape is not None and len(s.shape) != 3:
        ctx.fail(f"scores must be [batches, classes, boxes], got {s}")
    if ctx.attrs.center_point_box not in (0, 1):
        ctx.fail(f"center_point_box must be 0 or 1, got {ctx.attrs.center_point_box}")
    # how many boxes survive depends on the data
    return [TensorType(DType.int64, (None, 3))]


register_op("NonMaxSuppression", category=Category.OTHER, infer=_nms_infer)


def _stft_infer(ctx: InferContext) -> list[TensorType]:
    x = ctx.type(0)
    if not x.dtype.is_float:
        ctx.fail(f"signal must be a float tensor, got {x.dtype.name}")
    if x.shape is not None and (len(x.shape) != 3 or x.shape[2] not in (1, 2, None)):
        ctx.fail(f"signal must be [batch, length, 1 or 2], got {x}")
    if ctx.attrs.onesided and x.shape is not None and x.shape[2] == 2:
        ctx.fail("onesided is defined for real signals only")
    step = ctx.int_list(1)
    length = None
    if ctx.has_input(3):  # frame_length given (its value may be known only at run time)
        length = ctx.int_list(3)
    elif ctx.has_input(2):  # else the window's length
        w = ctx.type(2).shape
        length = [w[0]] if w and isinstance(w[0], int) else None
    elif x.shape is not None and isinstance(x.shape[1], int):  # else the whole signal
        length = [x.shape[1]]
    batch, total = (None, None) if x.shape is None else x.shape[:2]
    frames = bins = None
    if step is not None and length is not None and isinstance(total, int):
        if step[0] <= 0 or length[0] <= 0 or length[0] > total:
            ctx.fail(f"frame_step {step[0]} and frame length {length[0]} do not fit {total} samples")
        frames = 1 + (total - length[0]) // step[0]
    if length is not None:
        bins = length[0] // 2 + 1 if ctx.attrs.onesided else length[0]
    return [x.with_shape((batch, frames, bins, 2))]


register_op("STFT", category=Category.OTHER, infer=_stft_infer, static_inputs=(1, 3))


def _mel_infer(ctx: InferContext) -> list[TensorType]:
    num_mel, dft_len = ctx.int_list(0), ctx.int_list(1)
    try:
        dt = DType.from_onnx(ctx.attrs.output_datatype)
    except (KeyError, ValueError):
        ctx.fail(f"output_datatype {ctx.attrs.output_datatype} is not a tensor type graphc has")
    rows = None if dft_len is None else dft_len[0] // 2 + 1
    return [TensorType(dt, (rows, None if num_mel is None else num_mel[0]))]


register_op("MelWeightMatrix", category=Category.OTHER, infer=_mel_infer, static_inputs=(0, 1, 2, 3, 4))
