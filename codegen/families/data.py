"""The data movement family: Transpose, Slice, Concat, Split, Pad, Gather, GatherElements, GatherND,
Expand, Tile, Resize, DepthToSpace, SpaceToDepth, Trilu, CumSum, CumProd, ScatterND, ScatterElements,
OneHot, EyeLike, Range and ConstantOfShape: one template per kernel kind (templates/data_*.cu.j2,
their shared pieces in data_common.cu.j2); this file plans the index math (sizes, strides,
offsets, constants) and the templates write it as CUDA.

Most of these move elements without looking at them, so kernels copy raw bits. Where an op keeps
runs of k adjacent elements together (the innermost dim untouched, or cut at multiples of k),
k elements are moved as one "wide" element of up to 16 bytes (a vector load and store). Static
inputs (Slice starts/ends/axes/steps, Pad pads, Tile repeats, Split sizes, Resize scales/sizes,
Expand shape, CumSum axis, Trilu k...) come from the weights and are baked in with the shapes.
Every kernel guards its bounds; index math is in long long.

A Fused node anchored on Transpose, Gather or Concat (passes/fuse_data_epilogues.py) is one typed
kernel: a thread per output element loads the element it reads and runs the fused epilogue on it
(an input's Cast, an embedding's position bias), so the epilogue may store another dtype.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from graphc.codegen.cuda_types import cuda_type, dtype_from_numpy_name
from graphc.codegen.kernel import KernelSource, StepContext, ceil_div, grid_1d, register_family, render
from graphc.ir.types import DType

BLOCK = 256
SUPPORTED = frozenset(
    {
        "Transpose",
        "Slice",
        "Concat",
        "Split",
        "Pad",
        "Gather",
        "GatherElements",
        "GatherND",
        "Expand",
        "Tile",
        "Resize",
        "DepthToSpace",
        "SpaceToDepth",
        "Trilu",
        "CumSum",
        "CumProd",
        "ScatterND",
        "ScatterElements",
        "OneHot",
        "EyeLike",
        "Range",
        "ConstantOfShape",
    }
)


# ---- helpers -------------------------------------------------------------------------------------


def strides_of(shape: Sequence[int]) -> list[int]:
    out = [0] * len(shape)
    acc = 1
    for d in reversed(range(len(shape))):
        out[d] = acc
        acc *= shape[d]
    return out


def dims_of(shape: Sequence[int]) -> list[tuple[int, int]]:
    """(size, stride) of each dim of a row-major index space: what data_common's `coords` macro
    turns into the coordinates of a flat index."""
    return list(zip((int(s) for s in shape), strides_of(shape), strict=True))


def wide_factor(itemsize: int, values: Sequence[int]) -> int:
    """The largest k (a power of two, k * itemsize <= 16) dividing every value."""
    k = 16 // itemsize if itemsize <= 16 else 1
    while k > 1 and any(v % k for v in values):
        k //= 2
    return max(k, 1)


def raw_bits(value: Any, dt: DType, k: int = 1) -> int:
    """The raw bits of `value` in dtype dt, repeated k times, as one unsigned integer (little
    endian: element 0 in the low bytes); data_common's `bits` macro writes it as a literal."""
    one = np.asarray(value).astype(dt.numpy).reshape(()).tobytes()
    return int.from_bytes(one * k, "little")


def _map_kernel(
    ctx: StepContext,
    template: str,
    total: int,
    elem_bytes: int,
    args: list[str],
    suffix: str = "",
    family_params: dict | None = None,
    **env: Any,
) -> KernelSource:
    """A kernel of one thread per element of [0, total) (grid-stride) from `template`."""
    name = ctx.kernel_name(suffix)
    block = int((ctx.params or {}).get("block", BLOCK))
    source = render(template, name=name, total=total, block=block, elem_bytes=elem_bytes, **env)
    params = {"elem_bytes": elem_bytes, "block": block, **(family_params or {})}
    return KernelSource("data", name, source, grid_1d(total, block), (block, 1, 1), args, params=params)


def _dt(ctx: StepContext, name: str) -> DType:
    return dtype_from_numpy_name(ctx.spec(name).dtype)


def _shape(ctx: StepContext, name: str) -> tuple[int, ...]:
    return tuple(int(d) for d in ctx.spec(name).shape)


def _const(ctx: StepContext, i: int, what: str) -> np.ndarray | None:
    """Static input i of the step (None if omitted); it must be a weight."""
    names = ctx.step.inputs
    if i >= len(names) or names[i] is None:
        return None
    n = names[i]
    if ctx.tensors[n].kind != "weight" or n not in ctx.weights:
        raise ctx.fail(f"{what} ('{n}') must be a constant for the cuda target")
    return np.asarray(ctx.weights[n])


def _ints(a: np.ndarray | None) -> list[int] | None:
    return None if a is None else [int(v) for v in np.asarray(a).reshape(-1)]


# ---- affine copies: out[c] = in[base + sum c_d * mult_d] -------------------------------------------


@dataclass
class Affine:
    """An index space `shape` mapped to offsets base + sum(c_d * mult_d) of another tensor."""

    shape: list[int]
    mults: list[int]
    base: int = 0

    def simplified(self) -> Affine:
        shape, mults, base = [], [], self.base
        for s, m in zip(self.shape, self.mults, strict=True):
            if s == 1:
                continue
            if shape and mults[-1] == m * s:  # dim d merges with d+1
                shape[-1] *= s
                mults[-1] = m
                continue
            shape.append(s)
            mults.append(m)
        return Affine(shape, mults, base)

    def widen(self, itemsize: int, other_last: int | None = None) -> tuple[Affine, int]:
        """Move k adjacent elements at once where the last dim is contiguous and every offset
        stays a multiple of k (`other_last`: the other side's last-dim run must divide too)."""
        if not self.shape or self.mults[-1] != 1:
            return self, 1
        vals = [self.shape[-1], self.base, *self.mults[:-1]]
        if other_last is not None:
            vals.append(other_last)
        k = wide_factor(itemsize, vals)
        if k == 1:
            return self, 1
        shape = self.shape[:-1] + [self.shape[-1] // k]
        return Affine(shape, [m // k for m in self.mults[:-1]] + [1], self.base // k), k


def _affine_copy(
    ctx: StepContext, src: str, dst: str, amap: Affine, itemsize: int, suffix: str, scatter: bool
) -> KernelSource:
    a = amap.simplified()
    total = math.prod(a.shape)
    a, k = a.widen(itemsize)
    return _map_kernel(
        ctx,
        "data_copy.cu.j2",
        total // k,
        itemsize * k,
        [src, dst],
        suffix,
        {"wide": k},
        dims=dims_of(a.shape),
        mults=a.mults,
        base=a.base,
        scatter=scatter,
    )


def _gather_copy(ctx: StepContext, src: str, dst: str, amap: Affine, itemsize: int, suffix: str = "") -> KernelSource:
    """out (dense, amap.shape) = src[amap(i)]."""
    return _affine_copy(ctx, src, dst, amap, itemsize, suffix, scatter=False)


def _scatter_copy(ctx: StepContext, src: str, dst: str, amap: Affine, itemsize: int, suffix: str = "") -> KernelSource:
    """dst[amap(i)] = src (dense, amap.shape)."""
    return _affine_copy(ctx, src, dst, amap, itemsize, suffix, scatter=True)


# ---- Transpose (and DepthToSpace / SpaceToDepth as transposes of a 6-D view) --------------------


def transpose_kernels(
    ctx: StepContext, src: str, dst: str, in_shape: Sequence[int], perm: Sequence[int], itemsize: int
) -> list[KernelSource]:
    # Drop size-1 dims, then merge input dims that stay adjacent and in order in the output.
    keep = [d for d in range(len(in_shape)) if in_shape[d] != 1]
    perm2 = [keep.index(p) for p in perm if in_shape[p] != 1]
    shape = [in_shape[d] for d in keep]
    runs: list[list[int]] = []
    for p in perm2:
        if runs and runs[-1][-1] + 1 == p:
            runs[-1].append(p)
        else:
            runs.append([p])
    order = sorted(range(len(runs)), key=lambda k: runs[k][0])  # runs in input order
    sizes = [math.prod(shape[d] for d in runs[k]) for k in order]  # merged input dims
    mperm = [order.index(k) for k in range(len(runs))]  # output dim j = merged input dim mperm[j]
    n = len(sizes)
    in_st = strides_of(sizes)
    out_sizes = [sizes[p] for p in mperm]
    if math.prod(sizes) == 0:
        return []
    if n >= 2 and mperm[-1] != n - 1 and sizes[-1] >= 16 and sizes[mperm[-1]] >= 16:
        return [_tiled_transpose(ctx, src, dst, sizes, mperm, itemsize)]
    amap = Affine(out_sizes, [in_st[p] for p in mperm])
    return [_gather_copy(ctx, src, dst, amap, itemsize)]


def _tiled_transpose(
    ctx: StepContext, src: str, dst: str, sizes: list[int], mperm: list[int], itemsize: int
) -> KernelSource:
    n = len(sizes)
    a_dim, q_dim = n - 1, mperm[-1]  # the input's inner dim; the input dim that is the output's inner
    in_st = strides_of(sizes)
    out_sizes = [sizes[p] for p in mperm]
    out_st_by_in = {p: s for p, s in zip(mperm, strides_of(out_sizes), strict=True)}
    batch = [d for d in mperm if d not in (a_dim, q_dim)]  # output order
    bsizes = [sizes[d] for d in batch]
    bdims = [
        (size, bstride, in_st[d], out_st_by_in[d]) for (size, bstride), d in zip(dims_of(bsizes), batch, strict=True)
    ]
    a_size, q_size = sizes[a_dim], sizes[q_dim]
    ta, tq = ceil_div(a_size, 32), ceil_div(q_size, 32)
    name = ctx.kernel_name()
    source = render(
        "data_transpose.cu.j2",
        name=name,
        elem_bytes=itemsize,
        ta=ta,
        tq=tq,
        batch=bdims,
        a_size=a_size,
        q_size=q_size,
        q_in_stride=in_st[q_dim],
        a_out_stride=out_st_by_in[a_dim],
    )
    nb = math.prod(bsizes)
    return KernelSource("data", name, source, (ta * tq * nb, 1, 1), (32, 8, 1), [src, dst], params={"tiled": True})


def _gen_transpose(ctx: StepContext, attrs) -> list[KernelSource]:
    x, y = ctx.step.inputs[0], ctx.step.outputs[0]
    shape = _shape(ctx, x)
    perm = list(attrs.perm) if attrs.perm is not None else list(range(len(shape) - 1, -1, -1))
    return transpose_kernels(ctx, x, y, shape, perm, _dt(ctx, x).itemsize)


def _gen_depth_space(ctx: StepContext, attrs) -> list[KernelSource]:
    x, y = ctx.step.inputs[0], ctx.step.outputs[0]
    n, c, h, w = _shape(ctx, x)
    b = attrs.blocksize
    if ctx.step.op == "DepthToSpace":
        if attrs.mode == "DCR":
            view, perm = (n, b, b, c // (b * b), h, w), (0, 3, 4, 1, 5, 2)
        else:
            view, perm = (n, c // (b * b), b, b, h, w), (0, 1, 4, 2, 5, 3)
    else:
        view = (n, c, h // b, b, w // b, b)
        perm = (0, 3, 5, 1, 2, 4) if attrs.mode == "DCR" else (0, 1, 3, 5, 2, 4)
    return transpose_kernels(ctx, x, y, view, perm, _dt(ctx, x).itemsize)


# ---- Slice, Expand, Concat, Split ---------------------------------------------------------------


def _gen_slice(ctx: StepContext, attrs) -> list[KernelSource]:
    from graphc.ops.data_movement import slice_axis

    x, y = ctx.step.inputs[0], ctx.step.outputs[0]
    shape = _shape(ctx, x)
    rank = len(shape)
    starts, ends = _ints(_const(ctx, 1, "starts")), _ints(_const(ctx, 2, "ends"))
    axes = _ints(_const(ctx, 3, "axes")) or list(range(len(starts)))
    steps = _ints(_const(ctx, 4, "steps")) or [1] * len(starts)
    st = strides_of(shape)
    out_shape = list(shape)
    mults = list(st)
    base = 0
    for a, s, e, p in zip(axes, starts, ends, steps, strict=True):
        a = a + rank if a < 0 else a
        sl, size = slice_axis(shape[a], s, e, p)
        out_shape[a] = size
        if size:
            base += sl.start * st[a]
            mults[a] = p * st[a]
    if math.prod(out_shape) == 0:
        return []
    return [_gather_copy(ctx, x, y, Affine(out_shape, mults, base), _dt(ctx, x).itemsize)]


def _gen_expand(ctx: StepContext, attrs) -> list[KernelSource]:
    x, y = ctx.step.inputs[0], ctx.step.outputs[0]
    out_shape = _shape(ctx, y)
    in_shape = _shape(ctx, x)
    padded = (1,) * (len(out_shape) - len(in_shape)) + in_shape
    st = strides_of(padded)
    mults = [0 if p == 1 and o != 1 else s for p, o, s in zip(padded, out_shape, st, strict=True)]
    if math.prod(out_shape) == 0:
        return []
    return [_gather_copy(ctx, x, y, Affine(list(out_shape), mults), _dt(ctx, x).itemsize)]


def _gen_concat(ctx: StepContext, attrs) -> list[KernelSource]:
    """One copy per input into its slab of the output (each a strided 2-D copy)."""
    y = ctx.step.outputs[0]
    out_shape = _shape(ctx, y)
    rank = len(out_shape)
    axis = attrs.axis + rank if attrs.axis < 0 else attrs.axis
    ost = strides_of(out_shape)
    itemsize = _dt(ctx, y).itemsize
    out, offset = [], 0
    for j, x in enumerate(ctx.step.inputs):
        shape = _shape(ctx, x)
        if math.prod(shape):
            out.append(_scatter_copy(ctx, x, y, Affine(list(shape), list(ost), offset * ost[axis]), itemsize, f"_{j}"))
        offset += shape[axis]
    return out


def _gen_split(ctx: StepContext, attrs) -> list[KernelSource]:
    """One copy per output from its slab of the input."""
    x = ctx.step.inputs[0]
    shape = _shape(ctx, x)
    rank = len(shape)
    axis = attrs.axis + rank if attrs.axis < 0 else attrs.axis
    st = strides_of(shape)
    itemsize = _dt(ctx, x).itemsize
    out, offset = [], 0
    for j, y in enumerate(ctx.step.outputs):
        oshape = _shape(ctx, y)
        if math.prod(oshape):
            out.append(_gather_copy(ctx, x, y, Affine(list(oshape), list(st), offset * st[axis]), itemsize, f"_{j}"))
        offset += oshape[axis]
    return out


# ---- Tile, Pad, Trilu ---------------------------------------------------------------------------


def _gen_tile(ctx: StepContext, attrs) -> list[KernelSource]:
    x, y = ctx.step.inputs[0], ctx.step.outputs[0]
    in_shape = list(_shape(ctx, x))
    out_shape = list(_shape(ctx, y))
    if math.prod(out_shape) == 0:
        return []
    itemsize = _dt(ctx, x).itemsize
    k = wide_factor(itemsize, [in_shape[-1]]) if in_shape else 1
    if k > 1:
        in_shape[-1] //= k
        out_shape[-1] //= k
    tile = list(zip(in_shape, out_shape, strides_of(in_shape), strict=True))
    return [
        _map_kernel(
            ctx,
            "data_tile.cu.j2",
            math.prod(out_shape),
            itemsize * k,
            [x, y],
            family_params={"wide": k},
            dims=dims_of(out_shape),
            tile=tile,
        )
    ]


def _gen_pad(ctx: StepContext, attrs) -> list[KernelSource]:
    from graphc.ops.data_movement import pad_widths

    x, y = ctx.step.inputs[0], ctx.step.outputs[0]
    in_shape = list(_shape(ctx, x))
    out_shape = list(_shape(ctx, y))
    if math.prod(out_shape) == 0:
        return []
    dt = _dt(ctx, x)
    rank = len(in_shape)
    pads = _ints(_const(ctx, 1, "pads"))
    value = _const(ctx, 2, "constant_value")
    axes = _ints(_const(ctx, 3, "axes"))

    def fail(msg: str) -> None:
        raise ctx.fail(msg)

    widths = pad_widths(rank, pads, axes, fail)
    mode = attrs.mode
    cv = value.reshape(-1)[0] if value is not None and value.size else 0
    k = 1
    if rank and widths[-1] == (0, 0) and math.prod(in_shape):
        k = wide_factor(dt.itemsize, [in_shape[-1]])
        in_shape[-1] //= k
        out_shape[-1] //= k
    if math.prod(in_shape) == 0:  # nothing to copy from: every element is the constant
        mode = "constant"
    st = strides_of(in_shape)
    axes = []
    for d in range(rank):
        b, e = widths[d]
        crop = max(-b, 0)
        length = in_shape[d] - crop - max(-e, 0)  # the cropped axis (negative pads crop first)
        axes.append({"b": b, "e": e, "crop": crop, "length": length, "stride": st[d], "in_size": in_shape[d]})
    return [
        _map_kernel(
            ctx,
            "data_pad.cu.j2",
            math.prod(out_shape),
            dt.itemsize * k,
            [x, y],
            family_params={"wide": k},
            dims=dims_of(out_shape),
            axes=axes,
            mode=mode,
            empty=math.prod(in_shape) == 0,
            fill=raw_bits(cv, dt, k),
        )
    ]


def _gen_trilu(ctx: StepContext, attrs) -> list[KernelSource]:
    x, y = ctx.step.inputs[0], ctx.step.outputs[0]
    shape = _shape(ctx, x)
    if math.prod(shape) == 0:
        return []
    kv = _const(ctx, 1, "k")
    k = int(kv.reshape(-1)[0]) if kv is not None else 0
    rows, cols = shape[-2], shape[-1]
    return [
        _map_kernel(
            ctx,
            "data_trilu.cu.j2",
            math.prod(shape),
            _dt(ctx, x).itemsize,
            [x, y],
            rows=rows,
            cols=cols,
            k=k,
            upper=bool(attrs.upper),
        )
    ]


# ---- Gather, GatherElements, GatherND -----------------------------------------------------------


def _idx_t(ctx: StepContext, name: str) -> str:
    return cuda_type(_dt(ctx, name)).storage


def _gen_gather(ctx: StepContext, attrs) -> list[KernelSource]:
    x, ids, y = ctx.step.inputs[0], ctx.step.inputs[1], ctx.step.outputs[0]
    shape = _shape(ctx, x)
    rank = len(shape)
    axis = attrs.axis + rank if attrs.axis < 0 else attrs.axis
    outer, a_len, inner = math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1 :])
    ni = math.prod(_shape(ctx, ids))
    total = outer * ni * inner
    if total == 0:
        return []
    itemsize = _dt(ctx, x).itemsize
    k = wide_factor(itemsize, [inner])
    inner //= k
    if inner >= 32:
        # An embedding lookup: one block per gathered row, wide loads along it.
        block = min(256, max(32, 1 << (inner - 1).bit_length()))
        name = ctx.kernel_name()
        source = render(
            "data_gather_rows.cu.j2",
            name=name,
            elem_bytes=itemsize * k,
            idx_t=_idx_t(ctx, ids),
            ni=ni,
            axis_len=a_len,
            inner=inner,
            block=block,
        )
        return [KernelSource("data", name, source, (outer * ni, 1, 1), (block, 1, 1), [x, ids, y], params={"wide": k})]
    return [
        _map_kernel(
            ctx,
            "data_gather.cu.j2",
            total // k,
            itemsize * k,
            [x, ids, y],
            family_params={"wide": k},
            idx_t=_idx_t(ctx, ids),
            inner=inner,
            ni=ni,
            axis_len=a_len,
        )
    ]


def _gen_gather_elements(ctx: StepContext, attrs) -> list[KernelSource]:
    x, ids, y = ctx.step.inputs[0], ctx.step.inputs[1], ctx.step.outputs[0]
    dshape = _shape(ctx, x)
    ishape = _shape(ctx, ids)
    rank = len(dshape)
    axis = attrs.axis + rank if attrs.axis < 0 else attrs.axis
    total = math.prod(ishape)
    if total == 0:
        return []
    dst = strides_of(dshape)
    return [
        _map_kernel(
            ctx,
            "data_gather_elements.cu.j2",
            total,
            _dt(ctx, x).itemsize,
            [x, ids, y],
            idx_t=_idx_t(ctx, ids),
            dims=dims_of(ishape),
            terms=[(d, dst[d]) for d in range(rank) if d != axis and ishape[d] != 1],
            axis_len=dshape[axis],
            axis_stride=dst[axis],
        )
    ]


def _nd_dims(dshape: Sequence[int], b: int, k: int) -> list[tuple[int, int]]:
    """(size, stride) of the k data dims from b on that an index tuple names (data_common's
    `nd_offset` macro)."""
    dst = strides_of(dshape)
    return [(dshape[b + j], dst[b + j]) for j in range(k)]


def _gen_gather_nd(ctx: StepContext, attrs) -> list[KernelSource]:
    x, ids, y = ctx.step.inputs[0], ctx.step.inputs[1], ctx.step.outputs[0]
    dshape = _shape(ctx, x)
    ishape = _shape(ctx, ids)
    b, k = attrs.batch_dims, ishape[-1]
    total = math.prod(_shape(ctx, y))
    if total == 0:
        return []
    m = math.prod(ishape[b:-1])  # index tuples per batch
    return [
        _map_kernel(
            ctx,
            "data_gather_nd.cu.j2",
            total,
            _dt(ctx, x).itemsize,
            [x, ids, y],
            idx_t=_idx_t(ctx, ids),
            slice=math.prod(dshape[b + k :]),  # elements per gathered slice
            m=m,
            nd_dims=_nd_dims(dshape, b, k),
            batch_stride=math.prod(dshape[b:]),
        )
    ]


# ---- ScatterND, ScatterElements (copy, then scatter the updates) --------------------------------


# dtypes with an atomicAdd (data_scatter.cu.j2 names their CUDA types)
_ATOMIC_ADD = frozenset({DType.float32, DType.float64, DType.int32, DType.int64})


def _check_reduction(ctx: StepContext, reduction: str, dt: DType) -> None:
    if reduction == "none" or (reduction == "add" and dt in _ATOMIC_ADD):
        return
    raise ctx.fail(f"reduction '{reduction}' on {dt.name} has no CUDA kernel (none, or add on f32/f64/i32/i64)")


def _gen_scatter(ctx: StepContext, attrs) -> list[KernelSource]:
    x, ids, upd = ctx.step.inputs[:3]
    y = ctx.step.outputs[0]
    dshape = _shape(ctx, x)
    dt = _dt(ctx, x)
    kernels = []
    if math.prod(dshape):
        kernels.append(_gather_copy(ctx, x, y, Affine(list(dshape), strides_of(dshape)), dt.itemsize, "_copy"))
    ushape = _shape(ctx, upd)
    total = math.prod(ushape)
    if total == 0:
        return kernels
    _check_reduction(ctx, attrs.reduction, dt)
    env: dict[str, Any] = {
        "idx_t": _idx_t(ctx, ids),
        "ct": cuda_type(dt).storage,
        "dtype": dt.numpy.name,
        "reduction": attrs.reduction,
        "nd": ctx.step.op == "ScatterND",
    }
    if env["nd"]:
        k = _shape(ctx, ids)[-1]
        env.update(slice=math.prod(dshape[k:]), nd_dims=_nd_dims(dshape, 0, k))
    else:
        rank = len(dshape)
        axis = attrs.axis + rank if attrs.axis < 0 else attrs.axis
        dst = strides_of(dshape)
        env.update(
            dims=dims_of(ushape),
            terms=[(d, dst[d]) for d in range(rank) if d != axis],
            axis_len=dshape[axis],
            axis_stride=dst[axis],
        )
    # Updates are stored typed (atomics need the type); gc_e, the raw-bits type, is unused here.
    kernels.append(_map_kernel(ctx, "data_scatter.cu.j2", total, dt.itemsize, [ids, upd, y], "_scatter", **env))
    return kernels


# ---- OneHot, EyeLike, Range, ConstantOfShape ----------------------------------------------------


def _gen_onehot(ctx: StepContext, attrs) -> list[KernelSource]:
    ids, _, vals = ctx.step.inputs[:3]
    y = ctx.step.outputs[0]
    out_shape = _shape(ctx, y)
    total = math.prod(out_shape)
    if total == 0:
        return []
    depth = int(_const(ctx, 1, "depth").reshape(-1)[0])
    rank = len(out_shape)
    axis = attrs.axis + rank if attrs.axis < 0 else attrs.axis
    inner = math.prod(out_shape[axis + 1 :])
    return [
        _map_kernel(
            ctx,
            "data_onehot.cu.j2",
            total,
            _dt(ctx, y).itemsize,
            [ids, vals, y],
            idx_t=_idx_t(ctx, ids),
            inner=inner,
            depth=depth,
        )
    ]


def _gen_eyelike(ctx: StepContext, attrs) -> list[KernelSource]:
    y = ctx.step.outputs[0]
    rows, cols = _shape(ctx, y)
    dt = _dt(ctx, y)
    if rows * cols == 0:
        return []
    env = {"cols": cols, "k": attrs.k, "one": raw_bits(1, dt), "zero": raw_bits(0, dt)}
    return [_map_kernel(ctx, "data_eyelike.cu.j2", rows * cols, dt.itemsize, [y], **env)]


def _gen_constant_of_shape(ctx: StepContext, attrs) -> list[KernelSource]:
    y = ctx.step.outputs[0]
    dt = _dt(ctx, y)
    total = math.prod(_shape(ctx, y))
    if total == 0:
        return []
    v = 0 if attrs.value is None else attrs.value.array.reshape(-1)[0]
    k = wide_factor(dt.itemsize, [total])
    return [_map_kernel(ctx, "data_fill.cu.j2", total // k, dt.itemsize * k, [y], value=raw_bits(v, dt, k))]


def _gen_range(ctx: StepContext, attrs) -> list[KernelSource]:
    y = ctx.step.outputs[0]
    dt = _dt(ctx, y)
    total = math.prod(_shape(ctx, y))
    if total == 0:
        return []
    start = _const(ctx, 0, "start").reshape(-1)[0]
    delta = _const(ctx, 2, "delta").reshape(-1)[0]
    if dt in (DType.float32, DType.float64):
        lits = repr(float(start)), repr(float(delta))
    elif dt.is_int:
        lits = str(int(start)), str(int(delta))
    else:
        raise ctx.fail(f"Range of {dt.name} has no CUDA kernel")
    env = {"ct": cuda_type(dt).storage, "dtype": dt.numpy.name, "start": lits[0], "delta": lits[1]}
    return [_map_kernel(ctx, "data_range.cu.j2", total, dt.itemsize, [y], **env)]


# ---- CumSum, CumProd -------------------------------------------------------------------------------------


def _gen_cumsum(ctx: StepContext, attrs) -> list[KernelSource]:
    x, y = ctx.step.inputs[0], ctx.step.outputs[0]
    shape = _shape(ctx, x)
    total = math.prod(shape)
    if total == 0:
        return []
    dt = _dt(ctx, x)
    axis = int(_const(ctx, 1, "axis").reshape(-1)[0])
    axis = axis + len(shape) if axis < 0 else axis
    outer, length, inner = math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1 :])
    ct = cuda_type(dt)
    if dt.is_float:
        acc_t = "double" if dt is DType.float64 else "float"
    elif dt.is_signed:
        acc_t = "long long"  # wraps like the dtype's own sum once stored back
    else:
        acc_t = "unsigned long long"
    block_scan = inner == 1 and length >= 64
    block = 256 if block_scan else 128
    name = ctx.kernel_name()
    source = render(
        "data_scan.cu.j2",
        name=name,
        elem_bytes=dt.itemsize,
        in_t=ct.storage,
        acc_t=acc_t,
        ct=ct,
        block_scan=block_scan,
        op="*" if ctx.step.op == "CumProd" else "+",
        identity=1 if ctx.step.op == "CumProd" else 0,
        exclusive=bool(attrs.exclusive),
        reverse=bool(attrs.reverse),
        length=length,
        inner=inner,
        lines=outer * inner,
        block=block,
    )
    grid = (outer, 1, 1) if block_scan else (ceil_div(outer * inner, block), 1, 1)
    return [KernelSource("data", name, source, grid, (block, 1, 1), [x, y], params={"block_scan": block_scan})]


# ---- Resize ---------------------------------------------------------------------------------------


def _resize_tables(ctx: StepContext, attrs, in_shape, plan, work: np.dtype):
    """Per resized axis: (taps per output coord, index table, weight table or None, mask or None).
    The tables come from the reference's own coordinate and window code, so every coordinate
    transformation mode and nearest mode agrees with it exactly."""
    from graphc.ops.resize import nearest_index, source_coords

    ctm = attrs.coordinate_transformation_mode
    axes = {}
    for a in plan.axes:
        in_len, out_len, scale = in_shape[a], plan.out_shape[a], plan.scales[a]
        roi_a = plan.roi[a]
        identity = scale == 1.0 and out_len == in_len
        if identity and (ctm != "tf_crop_and_resize" or roi_a == (0.0, 1.0)):
            continue
        coords, extrapolated = source_coords(ctm, out_len, in_len, scale, roi_a)
        mask = extrapolated if extrapolated is not None and extrapolated.any() else None
        if attrs.mode == "nearest":
            idx = nearest_index(coords, attrs.nearest_mode, in_len).reshape(out_len, 1)
            axes[a] = (1, idx, None, mask)
            continue
        idx, w = interp_taps(coords, in_len, scale, attrs, work)
        taps = idx.shape[1]
        axes[a] = (taps, idx, w, mask)
    return axes


def interp_taps(x: np.ndarray, in_len: int, scale: float, attrs, work: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """Input indices and weights (out_len, taps) of each output's interpolation window: the
    reference's own (graphc.ops.resize.interp_window), in the kernel's working type."""
    from graphc.ops.resize import interp_window

    idx, w = interp_window(x, in_len, scale, attrs)
    return idx, w.astype(work)


def _gen_resize(ctx: StepContext, attrs) -> list[KernelSource]:
    from graphc.ops.resize import resize_plan

    x, y = ctx.step.inputs[0], ctx.step.outputs[0]
    in_shape = _shape(ctx, x)
    out_shape = _shape(ctx, y)
    total = math.prod(out_shape)
    if total == 0:
        return []
    if math.prod(in_shape) == 0:
        raise ctx.fail("resizing an empty input has no CUDA kernel")
    dt = _dt(ctx, x)

    def fail(msg: str) -> None:
        raise ctx.fail(msg)

    roi = _const(ctx, 1, "roi")
    scales = _const(ctx, 2, "scales")
    sizes = _const(ctx, 3, "sizes")
    plan = resize_plan(in_shape, attrs, roi, scales, sizes, fail)
    nearest = attrs.mode == "nearest"
    work = np.dtype(np.float32) if dt.is_float and dt.itemsize <= 4 else np.dtype(np.float64)
    wct = "float" if work == np.float32 else "double"
    axes = _resize_tables(ctx, attrs, in_shape, plan, work)
    st = strides_of(in_shape)
    if not axes:
        # Every axis keeps its length at scale 1 (exporters write such Resizes for a target size
        # equal to the input's): the reference returns the input, so the kernel is a plain copy.
        return [_gather_copy(ctx, x, y, Affine(list(in_shape), st), dt.itemsize)]
    tables, taxes = [], []
    for a, (taps, idx, w, mask) in axes.items():
        # Per resized axis: input indices (ri), weights (rw), extrapolation mask (rm), as Python
        # numbers (floats print as their shortest repr, which the working type reads back exactly).
        tables.append({"kind": "ri", "axis": a, "items": [int(v) for v in idx.reshape(-1)]})
        if w is not None:
            tables.append({"kind": "rw", "axis": a, "items": [float(v) for v in w.reshape(-1)]})
        if mask is not None:
            tables.append({"kind": "rm", "axis": a, "items": [int(v) for v in mask.reshape(-1)]})
        taxes.append({"axis": a, "taps": taps, "stride": st[a], "mask": mask is not None})
    env: dict[str, Any] = {
        "nearest": nearest,
        "tables": tables,
        "axes": taxes,
        "dims": dims_of(out_shape),
        "fixed": [(d, st[d]) for d in range(len(in_shape)) if d not in axes and in_shape[d] != 1],
        "ct": cuda_type(dt),
        "wct": wct,
        "is_float": dt.is_float,
        "fill": raw_bits(attrs.extrapolation_value, dt),
        "extrapolation": repr(attrs.extrapolation_value),
    }
    if not dt.is_float:
        info = np.iinfo(dt.numpy)
        env.update(int_min=repr(float(info.min)), int_max=repr(float(info.max)))
    k = _map_kernel(ctx, "data_resize.cu.j2", total, dt.itemsize, [x, y], family_params={"mode": attrs.mode}, **env)
    return [k]


# ---- the family ---------------------------------------------------------------------------------

_GENERATORS = {
    "Transpose": _gen_transpose,
    "DepthToSpace": _gen_depth_space,
    "SpaceToDepth": _gen_depth_space,
    "Slice": _gen_slice,
    "Expand": _gen_expand,
    "Concat": _gen_concat,
    "Split": _gen_split,
    "Tile": _gen_tile,
    "Pad": _gen_pad,
    "Trilu": _gen_trilu,
    "Gather": _gen_gather,
    "GatherElements": _gen_gather_elements,
    "GatherND": _gen_gather_nd,
    "ScatterND": _gen_scatter,
    "ScatterElements": _gen_scatter,
    "OneHot": _gen_onehot,
    "EyeLike": _gen_eyelike,
    "Range": _gen_range,
    "ConstantOfShape": _gen_constant_of_shape,
    "CumSum": _gen_cumsum,
    "CumProd": _gen_cumsum,
    "Resize": _gen_resize,
}


# ---- fused: a data movement anchor with an epilogue (passes/fuse_data_epilogues.py) -------------

# The anchors whose element each output index reads is one load (or a zero): the epilogue runs
# on it at that output index.
EPILOGUE_ANCHORS = frozenset({"Transpose", "Gather", "Concat"})


def _fused_anchor(ctx: StepContext) -> str | None:
    step = ctx.step
    if step.op != "Fused" or step.domain != "graphc":
        return None
    a = ctx.attrs
    return a.anchor_op if a.anchor_domain == "" and a.anchor_op in EPILOGUE_ANCHORS else None


def _load_body(ctx: StepContext, op: str, attrs, anchor_inputs: list[str], out_shape: tuple[int, ...]) -> str:
    """CUDA statements that set `acc` (compute type) to the element output index i reads."""
    ct = cuda_type(_dt(ctx, anchor_inputs[0]))
    rank = len(out_shape)
    if op == "Transpose":
        in_shape = _shape(ctx, anchor_inputs[0])
        perm = list(attrs.perm) if attrs.perm is not None else list(range(rank - 1, -1, -1))
        ist = strides_of(in_shape)
        a = Affine(list(out_shape), [ist[p] for p in perm]).simplified()
        coords = "".join(
            f"    const long long c{d} = {_coord_expr(d, size, stride)};\n"
            for d, (size, stride) in enumerate(dims_of(a.shape))
        )
        off = " + ".join(f"c{d} * {m}ll" for d, m in enumerate(a.mults) if m) or "0ll"
        return coords + f"    const {ct.compute} acc = {ct.to_compute(f'in0[{off}]')};"
    if op == "Gather":
        shape = _shape(ctx, anchor_inputs[0])
        axis = attrs.axis + len(shape) if attrs.axis < 0 else attrs.axis
        a_len, inner = shape[axis], math.prod(shape[axis + 1 :])
        ni = math.prod(_shape(ctx, anchor_inputs[1]))
        load = ct.to_compute(f"in0[(o * {a_len}ll + id) * {inner}ll + r]")
        return (
            f"    const long long r = i % {inner}ll;\n"
            f"    const long long n = (i / {inner}ll) % {ni}ll;\n"
            f"    const long long o = i / {inner * ni}ll;\n"
            f"    long long id = (long long)in1[n];\n"
            f"    if (id < 0) id += {a_len}ll;\n"
            f"    const {ct.compute} acc = (id >= 0 && id < {a_len}ll) ? {load} : ({ct.compute})0;"
        )
    # Concat: the input whose slab along the axis holds output coordinate a.
    axis = attrs.axis + rank if attrs.axis < 0 else attrs.axis
    inner, olen = math.prod(out_shape[axis + 1 :]), out_shape[axis]
    lines = [
        f"    const long long r = i % {inner}ll;",
        f"    const long long a = (i / {inner}ll) % {olen}ll;",
        f"    const long long o = i / {inner * olen}ll;",
        f"    {ct.compute} acc;",
    ]
    offset, branches = 0, []
    for k, x in enumerate(anchor_inputs):
        n = _shape(ctx, x)[axis]
        if n:
            load = ct.to_compute(f"in{k}[(o * {n}ll + (a - {offset}ll)) * {inner}ll + r]")
            branches.append((offset + n, load))
        offset += n
    for j, (end, load) in enumerate(branches):
        last = j == len(branches) - 1
        head = "" if j == 0 else "else "
        lines.append(f"    {head}{'' if last else f'if (a < {end}ll) '}acc = {load};")
    return "\n".join(lines)


def _coord_expr(d: int, size: int, stride: int) -> str:
    c = "i" if stride == 1 else f"(i / {stride}ll)"
    return c if d == 0 else f"({c} % {size}ll)"


def _gen_fused(ctx: StepContext) -> list[KernelSource]:
    from graphc.codegen.epilogue import render_epilogue, step_operands

    step, a = ctx.step, ctx.attrs
    anchor_inputs = list(step.inputs[: a.anchor_inputs])
    if any(n is None for n in anchor_inputs):
        raise ctx.fail(f"a fused {a.anchor_op} with an omitted input")
    out_specs = [ctx.tensors[o] for o in step.outputs]
    out_shape = tuple(int(d) for d in out_specs[0].shape)
    total = math.prod(out_shape)
    if total == 0:
        return []
    acc_dt = _dt(ctx, anchor_inputs[0])
    name = ctx.kernel_name()
    where = f"{step.kind} node '{step.name}': "
    ops = {i: op for i, op in step_operands(ctx).items() if i >= a.anchor_inputs}
    epi = render_epilogue(a.epilogue, a.outputs, ops, out_specs, out_shape, acc_dt, where=where, name=f"{name}_epi")
    params = []
    for k, x in enumerate(anchor_inputs):
        # Gather's indices are read as integers; everything else in the anchor's dtype.
        dt = _dt(ctx, x)
        params.append(f"const {cuda_type(dt).storage}* __restrict__ in{k}")
    params += epi.params
    body = _load_body(ctx, a.anchor_op, a.anchor_attrs, anchor_inputs, out_shape)
    block = int((ctx.params or {}).get("block", BLOCK))
    source = render(
        "data_epilogue.cu.j2",
        name=name,
        epilogue=epi,
        epilogue_name=f"{name}_epi",
        params=params,
        body=body,
        total=total,
        block=block,
    )
    args = anchor_inputs + [step.inputs[i] for i in epi.inputs] + list(step.outputs)
    return [KernelSource("data", name, source, grid_1d(total, block), (block, 1, 1), args, params={"block": block})]


def _matches(ctx: StepContext) -> bool:
    return (ctx.step.domain == "" and ctx.step.op in SUPPORTED) or _fused_anchor(ctx) is not None


def _generate(ctx: StepContext) -> list[KernelSource]:
    step = ctx.step
    if _fused_anchor(ctx) is not None:
        return _gen_fused(ctx)
    return _GENERATORS[step.op](ctx, ctx.attrs)


def _search_space(ctx: StepContext) -> list[dict[str, Any]]:
    return [{"block": b} for b in (128, 256, 512)]


register_family("data", _matches, _generate, _search_space)
