"""The data movement family: Transpose, Slice, Concat, Split, Pad, Gather, GatherElements, GatherND,
Expand, Tile, Resize, DepthToSpace, SpaceToDepth, Trilu, CumSum, CumProd, ScatterND, ScatterElements,
OneHot, EyeLike, Range and ConstantOfShape (data.cu.j2).

Most of these move elements without looking at them, so kernels copy raw bits. Where an op keeps
runs of k adjacent elements together (the innermost dim untouched, or cut at multiples of k),
k elements are moved as one "wide" element of up to 16 bytes (a vector load and store). Static
inputs (Slice starts/ends/axes/steps, Pad pads, Tile repeats, Split sizes, Resize scales/sizes,
Expand shape, CumSum axis, Trilu k...) come from the weights and are baked in with the shapes.
Every kernel guards its bounds; index math is in long long.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
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

_BITS = {1: "unsigned char", 2: "unsigned short", 4: "unsigned int", 8: "unsigned long long", 16: "gc_v16"}


# ---- helpers -------------------------------------------------------------------------------------


def strides_of(shape: Sequence[int]) -> list[int]:
    out = [0] * len(shape)
    acc = 1
    for d in reversed(range(len(shape))):
        out[d] = acc
        acc *= shape[d]
    return out


def coord_lines(shape: Sequence[int], var: str = "i", prefix: str = "c") -> list[str]:
    """Declarations `const long long c<d> = ...;` of the coordinates of row-major index var."""
    lines = []
    st = strides_of(shape)
    for d, (s, t) in enumerate(zip(shape, st, strict=True)):
        c = var if t == 1 else f"({var} / {t}ll)"
        if d > 0:
            c = f"({c} % {s}ll)"
        lines.append(f"const long long {prefix}{d} = {c};")
    return lines


def wide_factor(itemsize: int, values: Sequence[int]) -> int:
    """The largest k (a power of two, k * itemsize <= 16) dividing every value."""
    k = 16 // itemsize if itemsize <= 16 else 1
    while k > 1 and any(v % k for v in values):
        k //= 2
    return max(k, 1)


def bits_literal(value: Any, dt: DType, k: int = 1) -> str:
    """The raw bits of `value` in dtype dt, repeated k times, as a literal of the wide type."""
    one = np.asarray(value).astype(dt.numpy).reshape(()).tobytes()
    raw = one * k
    if len(raw) == 16:
        lo = int.from_bytes(raw[:8], "little")
        hi = int.from_bytes(raw[8:], "little")
        return f"gc_v16{{{lo}ull, {hi}ull}}"
    return f"(({_BITS[len(raw)]}){int.from_bytes(raw, 'little')}ull)"


def _indent(lines: Sequence[str], n: int = 4) -> str:
    pad = " " * n
    return "\n".join(pad + ln for ln in lines)


@dataclass
class Kernel:
    """A map kernel: `body` runs for every i in [0, total)."""

    params: list[str]
    args: list[str]
    body: list[str]
    total: int
    elem_bytes: int
    preamble: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def _emit(ctx: StepContext, k: Kernel, suffix: str = "", family_params: dict | None = None) -> KernelSource:
    name = ctx.kernel_name(suffix)
    block = int((ctx.params or {}).get("block", BLOCK))
    source = render(
        "data.cu.j2",
        mode="map",
        name=name,
        elem_t=_BITS[k.elem_bytes],
        preamble=k.preamble,
        params=k.params,
        body=_indent(k.body),
        total=k.total,
        block=block,
    )
    params = {"elem_bytes": k.elem_bytes, "block": block, **(family_params or {})}
    return KernelSource("data", name, source, grid_1d(k.total, block), (block, 1, 1), k.args, params=params)


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

    def expr(self, var: str = "i") -> tuple[list[str], str]:
        """(coordinate declarations, offset expression) for index var."""
        if not self.shape:
            return [], f"{self.base}ll"
        lines = coord_lines(self.shape, var)
        terms = [f"{self.base}ll"] if self.base else []
        for d, m in enumerate(self.mults):
            if m == 0:
                continue
            terms.append(f"c{d}" if m == 1 else f"c{d} * ({m}ll)")
        return lines, " + ".join(terms) if terms else "0ll"


def _gather_copy(ctx: StepContext, src: str, dst: str, amap: Affine, itemsize: int, suffix: str = "") -> KernelSource:
    """out (dense, amap.shape) = src[amap(i)]."""
    a = amap.simplified()
    total = math.prod(a.shape)
    a, k = a.widen(itemsize)
    lines, off = a.expr()
    body = [*lines, f"out0[i] = in0[{off}];"]
    params = ["const gc_e* __restrict__ in0", "gc_e* __restrict__ out0"]
    return _emit(ctx, Kernel(params, [src, dst], body, total // k, itemsize * k), suffix, {"wide": k})


def _scatter_copy(ctx: StepContext, src: str, dst: str, amap: Affine, itemsize: int, suffix: str = "") -> KernelSource:
    """dst[amap(i)] = src (dense, amap.shape)."""
    a = amap.simplified()
    total = math.prod(a.shape)
    a, k = a.widen(itemsize)
    lines, off = a.expr()
    body = [*lines, f"out0[{off}] = in0[i];"]
    params = ["const gc_e* __restrict__ in0", "gc_e* __restrict__ out0"]
    return _emit(ctx, Kernel(params, [src, dst], body, total // k, itemsize * k), suffix, {"wide": k})


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
    blines = coord_lines(bsizes, "b", "bc") if batch else []

    def batch_expr(strides: dict[int, int]) -> str:
        if not batch:
            return "0ll"
        return "(" + " + ".join(f"{_strip(blines[k])} * {strides[d]}ll" for k, d in enumerate(batch)) + ")"

    a_size, q_size = sizes[a_dim], sizes[q_dim]
    ta, tq = ceil_div(a_size, 32), ceil_div(q_size, 32)
    name = ctx.kernel_name()
    source = render(
        "data.cu.j2",
        mode="transpose",
        name=name,
        elem_t=_BITS[itemsize],
        preamble="",
        ta=ta,
        tq=tq,
        in_batch=batch_expr(dict(enumerate(in_st))),
        out_batch=batch_expr(out_st_by_in),
        a_size=a_size,
        q_size=q_size,
        q_in_stride=in_st[q_dim],
        a_out_stride=out_st_by_in[a_dim],
    )
    nb = math.prod(bsizes)
    return KernelSource("data", name, source, (ta * tq * nb, 1, 1), (32, 8, 1), [src, dst], params={"tiled": True})


def _strip(decl: str) -> str:
    """The expression of a `const long long x = expr;` declaration."""
    return decl.split(" = ", 1)[1].rstrip(";")


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
    st = strides_of(in_shape)
    lines = coord_lines(out_shape)
    terms = []
    for d, (i_s, o_s) in enumerate(zip(in_shape, out_shape, strict=True)):
        if i_s == 1:
            continue
        c = f"c{d}" if i_s == o_s else f"(c{d} % {i_s}ll)"
        terms.append(c if st[d] == 1 else f"{c} * {st[d]}ll")
    body = [*lines, f"out0[i] = in0[{' + '.join(terms) or '0'}];"]
    params = ["const gc_e* __restrict__ in0", "gc_e* __restrict__ out0"]
    return [_emit(ctx, Kernel(params, [x, y], body, math.prod(out_shape), itemsize * k), family_params={"wide": k})]


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
    lines = coord_lines(out_shape)
    terms, conds = [], []
    for d in range(rank):
        b, e = widths[d]
        crop = max(-b, 0)
        length = in_shape[d] - crop - max(-e, 0)  # the cropped axis (negative pads crop first)
        t = f"c{d}" if b == 0 else f"(c{d} - {max(b, 0)}ll)"
        if b <= 0 and e <= 0:
            t = f"(c{d} + {crop}ll)" if crop else f"c{d}"
        elif mode == "constant":
            conds.append(f"{t} >= 0 && {t} < {length}ll")
            t = f"({t} + {crop}ll)" if crop else t
        elif mode == "edge":
            t = f"(min(max({t}, 0ll), {length - 1}ll) + {crop}ll)"
        elif mode == "wrap":
            t = f"((({t}) % {length}ll + {length}ll) % {length}ll + {crop}ll)"
        elif mode == "reflect":
            if length == 1:
                t = f"{crop}ll"
            else:
                per = 2 * (length - 1)
                u = f"((({t}) % {per}ll + {per}ll) % {per}ll)"
                t = f"(({u}) < {length}ll ? ({u}) : {per}ll - ({u})) + {crop}ll"
                t = f"({t})"
        if in_shape[d] != 1 or mode != "constant":
            terms.append(t if st[d] == 1 else f"{t} * {st[d]}ll")
    src = " + ".join(terms) or "0ll"
    if mode == "constant" and conds:
        fill = bits_literal(cv, dt, k)
        inside = " && ".join(f"({c})" for c in conds)
        body = [*lines, f"const bool inside = {inside};", f"out0[i] = inside ? in0[{src}] : {fill};"]
    elif math.prod(in_shape) == 0:
        body = [f"out0[i] = {bits_literal(cv, dt, k)};"]
    else:
        body = [*lines, f"out0[i] = in0[{src}];"]
    params = ["const gc_e* __restrict__ in0", "gc_e* __restrict__ out0"]
    return [_emit(ctx, Kernel(params, [x, y], body, math.prod(out_shape), dt.itemsize * k), family_params={"wide": k})]


def _gen_trilu(ctx: StepContext, attrs) -> list[KernelSource]:
    x, y = ctx.step.inputs[0], ctx.step.outputs[0]
    shape = _shape(ctx, x)
    if math.prod(shape) == 0:
        return []
    kv = _const(ctx, 1, "k")
    k = int(kv.reshape(-1)[0]) if kv is not None else 0
    rows, cols = shape[-2], shape[-1]
    keep = f"col - row >= {k}ll" if attrs.upper else f"col - row <= {k}ll"
    body = [
        f"const long long col = i % {cols}ll;",
        f"const long long row = (i / {cols}ll) % {rows}ll;",
        f"out0[i] = ({keep}) ? in0[i] : gc_e{{}};",
    ]
    params = ["const gc_e* __restrict__ in0", "gc_e* __restrict__ out0"]
    return [_emit(ctx, Kernel(params, [x, y], body, math.prod(shape), _dt(ctx, x).itemsize))]


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
            "data.cu.j2",
            mode="rows",
            name=name,
            elem_t=_BITS[itemsize * k],
            preamble="",
            idx_t=_idx_t(ctx, ids),
            ni=ni,
            axis_len=a_len,
            inner=inner,
            block=block,
        )
        return [KernelSource("data", name, source, (outer * ni, 1, 1), (block, 1, 1), [x, ids, y], params={"wide": k})]
    body = [
        f"const long long r = i % {inner}ll;",
        f"const long long n = (i / {inner}ll) % {ni}ll;",
        f"const long long o = i / {inner * ni}ll;",
        "long long id = (long long)in1[n];",
        f"if (id < 0) id += {a_len}ll;",
        f"out0[i] = (id >= 0 && id < {a_len}ll) ? in0[(o * {a_len}ll + id) * {inner}ll + r] : gc_e{{}};",
    ]
    params = ["const gc_e* __restrict__ in0", f"const {_idx_t(ctx, ids)}* __restrict__ in1", "gc_e* __restrict__ out0"]
    return [_emit(ctx, Kernel(params, [x, ids, y], body, total // k, itemsize * k), family_params={"wide": k})]


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
    lines = coord_lines(ishape)
    terms = [f"c{d} * {dst[d]}ll" for d in range(rank) if d != axis and ishape[d] != 1]
    body = [
        *lines,
        "long long id = (long long)in1[i];",
        f"if (id < 0) id += {dshape[axis]}ll;",
        f"const bool valid = id >= 0 && id < {dshape[axis]}ll;",
        f"out0[i] = valid ? in0[{' + '.join([*terms, f'id * {dst[axis]}ll'])}] : gc_e{{}};",
    ]
    params = ["const gc_e* __restrict__ in0", f"const {_idx_t(ctx, ids)}* __restrict__ in1", "gc_e* __restrict__ out0"]
    return [_emit(ctx, Kernel(params, [x, ids, y], body, total, _dt(ctx, x).itemsize))]


def _nd_offset_lines(dshape: Sequence[int], b: int, k: int, ptr: str, row: str) -> list[str]:
    """Lines computing `off` (and `valid`) from the k indices at ptr[row * k ...]: the offset of
    slice (batch, idx...) in data, negatives wrapped."""
    dst = strides_of(dshape)
    lines = ["long long off = 0;", "bool valid = true;"]
    for j in range(k):
        d = b + j
        lines += [
            f"{{ long long v = (long long){ptr}[{row} * {k}ll + {j}ll];",
            f"  if (v < 0) v += {dshape[d]}ll;",
            f"  valid = valid && v >= 0 && v < {dshape[d]}ll;",
            f"  off += v * {dst[d]}ll; }}",
        ]
    return lines


def _gen_gather_nd(ctx: StepContext, attrs) -> list[KernelSource]:
    x, ids, y = ctx.step.inputs[0], ctx.step.inputs[1], ctx.step.outputs[0]
    dshape = _shape(ctx, x)
    ishape = _shape(ctx, ids)
    b, k = attrs.batch_dims, ishape[-1]
    total = math.prod(_shape(ctx, y))
    if total == 0:
        return []
    batch = math.prod(dshape[:b])
    m = math.prod(ishape[b:-1])  # index tuples per batch
    s = math.prod(dshape[b + k :])  # elements per gathered slice
    bstride = math.prod(dshape[b:])
    body = [
        f"const long long r = i % {s}ll;",
        f"const long long t = i / {s}ll;  // index tuple number (batch * {m} + m)",
        f"const long long bi = t / {m}ll;",
        *_nd_offset_lines(dshape, b, k, "in1", "t"),
        f"out0[i] = valid ? in0[bi * {bstride}ll + off + r] : gc_e{{}};",
    ]
    del batch
    params = ["const gc_e* __restrict__ in0", f"const {_idx_t(ctx, ids)}* __restrict__ in1", "gc_e* __restrict__ out0"]
    return [_emit(ctx, Kernel(params, [x, ids, y], body, total, _dt(ctx, x).itemsize))]


# ---- ScatterND, ScatterElements (copy, then scatter the updates) --------------------------------


_ATOMIC_ADD = {DType.float32: "float", DType.float64: "double", DType.int32: "int", DType.int64: "unsigned long long"}


def _scatter_store(ctx: StepContext, reduction: str, dt: DType, target: str) -> list[str]:
    if reduction == "none":
        return [f"{target} = in2[i];"]
    if reduction == "add" and dt in _ATOMIC_ADD:
        t = _ATOMIC_ADD[dt]
        ct = cuda_type(dt).storage
        return [f"atomicAdd(reinterpret_cast<{t}*>(&{target}), ({t})(({ct})in2[i]));"]
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
    ct = cuda_type(dt).storage
    if ctx.step.op == "ScatterND":
        k = _shape(ctx, ids)[-1]
        s = math.prod(dshape[k:])
        body = [
            f"const long long r = i % {s}ll;",
            f"const long long t = i / {s}ll;",
            *_nd_offset_lines(dshape, 0, k, "in1", "t"),
            "if (valid) {",
            *("  " + ln for ln in _scatter_store(ctx, attrs.reduction, dt, "out0[off + r]")),
            "}",
        ]
    else:
        rank = len(dshape)
        axis = attrs.axis + rank if attrs.axis < 0 else attrs.axis
        dst = strides_of(dshape)
        terms = [f"c{d} * {dst[d]}ll" for d in range(rank) if d != axis]
        target = f"out0[{' + '.join([*terms, f'id * {dst[axis]}ll'])}]"
        body = [
            *coord_lines(ushape),
            "long long id = (long long)in1[i];",
            f"if (id < 0) id += {dshape[axis]}ll;",
            f"if (id >= 0 && id < {dshape[axis]}ll) {{",
            *("  " + ln for ln in _scatter_store(ctx, attrs.reduction, dt, target)),
            "}",
        ]
    params = [
        f"const {_idx_t(ctx, ids)}* __restrict__ in1",
        f"const {ct}* __restrict__ in2",
        f"{ct}* __restrict__ out0",
    ]
    # The raw-bits type is unused here: updates are stored typed (atomics need the type).
    kernels.append(_emit(ctx, Kernel(params, [ids, upd, y], body, total, dt.itemsize), "_scatter"))
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
    body = [
        f"const long long r = i % {inner}ll;",
        f"const long long d = (i / {inner}ll) % {depth}ll;",
        f"const long long o = i / {inner * depth}ll;",
        f"long long id = (long long)in0[o * {inner}ll + r];",
        f"if (id < 0) id += {depth}ll;",
        "out0[i] = id == d ? in2[1] : in2[0];",
    ]
    params = [
        f"const {_idx_t(ctx, ids)}* __restrict__ in0",
        "const gc_e* __restrict__ in2",
        "gc_e* __restrict__ out0",
    ]
    return [_emit(ctx, Kernel(params, [ids, vals, y], body, total, _dt(ctx, y).itemsize))]


def _one_bits(dt: DType, v: int) -> str:
    return bits_literal(v, dt)


def _gen_eyelike(ctx: StepContext, attrs) -> list[KernelSource]:
    y = ctx.step.outputs[0]
    rows, cols = _shape(ctx, y)
    dt = _dt(ctx, y)
    if rows * cols == 0:
        return []
    body = [
        f"const long long col = i % {cols}ll, row = i / {cols}ll;",
        f"out0[i] = col - row == {attrs.k}ll ? {_one_bits(dt, 1)} : {_one_bits(dt, 0)};",
    ]
    return [_emit(ctx, Kernel(["gc_e* __restrict__ out0"], [y], body, rows * cols, dt.itemsize))]


def _gen_constant_of_shape(ctx: StepContext, attrs) -> list[KernelSource]:
    y = ctx.step.outputs[0]
    dt = _dt(ctx, y)
    total = math.prod(_shape(ctx, y))
    if total == 0:
        return []
    v = 0 if attrs.value is None else attrs.value.array.reshape(-1)[0]
    k = wide_factor(dt.itemsize, [total])
    body = [f"out0[i] = {bits_literal(v, dt, k)};"]
    return [_emit(ctx, Kernel(["gc_e* __restrict__ out0"], [y], body, total // k, dt.itemsize * k))]


def _gen_range(ctx: StepContext, attrs) -> list[KernelSource]:
    y = ctx.step.outputs[0]
    dt = _dt(ctx, y)
    total = math.prod(_shape(ctx, y))
    if total == 0:
        return []
    start = _const(ctx, 0, "start").reshape(-1)[0]
    delta = _const(ctx, 2, "delta").reshape(-1)[0]
    ct = cuda_type(dt)
    if dt is DType.float32:
        # start + i * delta, rounded after each op as numpy does (no fused multiply-add).
        val = f"__fadd_rn({float(start)!r}f, __fmul_rn((float)i, {float(delta)!r}f))"
    elif dt is DType.float64:
        val = f"__dadd_rn({float(start)!r}, __dmul_rn((double)i, {float(delta)!r}))"
    elif dt.is_int:
        val = f"({ct.storage})({int(start)}ll + i * ({int(delta)}ll))"
    else:
        raise ctx.fail(f"Range of {dt.name} has no CUDA kernel")
    body = [f"out[i] = {val};"]
    return [_emit(ctx, Kernel([f"{ct.storage}* __restrict__ out"], [y], body, total, dt.itemsize))]


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
        "data.cu.j2",
        mode="scan",
        name=name,
        elem_t=_BITS[dt.itemsize],
        preamble="",
        in_t=ct.storage,
        acc_t=acc_t,
        load=ct.to_compute("p[k]"),
        store=ct.to_storage(f"({ct.compute})(v)"),
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


def _table(name: str, ctype: str, values: np.ndarray, fmt) -> str:
    items = ", ".join(fmt(v) for v in values.reshape(-1))
    return f"__device__ const {ctype} {name}[{values.size}] = {{{items}}};\n"


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
    pre = []
    lines = coord_lines(out_shape)
    masks = []
    for a, (_, idx, w, mask) in axes.items():
        pre.append(_table(f"gc_ri{a}", "int", idx, lambda v: str(int(v))))
        if w is not None:
            pre.append(_table(f"gc_rw{a}", wct, w, lambda v: f"{float(v)!r}f" if wct == "float" else repr(float(v))))
        if mask is not None:
            pre.append(_table(f"gc_rm{a}", "unsigned char", mask.astype(np.uint8), lambda v: str(int(v))))
            masks.append(f"gc_rm{a}[c{a}]")
    fixed = [f"c{d} * {st[d]}ll" for d in range(len(in_shape)) if d not in axes and in_shape[d] != 1]
    ct = cuda_type(dt)
    body = list(lines)
    body.append(f"const long long fixed = {' + '.join(fixed) if fixed else '0ll'};")
    if nearest:
        src = " + ".join(["fixed", *(f"(long long)gc_ri{a}[c{a}] * {st[a]}ll" for a in axes)])
        value = f"in0[{src}]"
        if masks:
            fill = bits_literal(attrs.extrapolation_value, dt) if dt.itemsize <= 8 else None
            value = f"({' || '.join(masks)}) ? {fill} : {value}"
        body.append(f"out0[i] = {value};")
        elem = dt.itemsize
        params = ["const gc_e* __restrict__ in0", "gc_e* __restrict__ out0"]
    else:
        # Nested tap loops: the first resized axis innermost, as the reference resizes one axis
        # after another (each axis' sum rounded to the working type before the next).
        order = list(axes)
        body.append(f"{wct} v{len(order)} = 0;")
        depth = 0
        for lvl in range(len(order) - 1, -1, -1):
            a = order[lvl]
            taps = axes[a][0]
            body.append("  " * depth + f"for (int t{a} = 0; t{a} < {taps}; ++t{a}) {{")
            depth += 1
            body.append(
                "  " * depth + f"const {wct} w{a} = gc_rw{a}[c{a} * {taps} + t{a}];"
                f" const long long o{a} = (long long)gc_ri{a}[c{a} * {taps} + t{a}] * {st[a]}ll;"
            )
            if lvl > 0:
                body.append("  " * depth + f"{wct} v{lvl} = 0;")
        offs = " + ".join(["fixed", *(f"o{a}" for a in order)])
        body.append("  " * depth + f"v1 += w{order[0]} * ({wct})({ct.to_compute(f'in0[{offs}]')});")
        for lvl in range(1, len(order) + 1):
            depth -= 1
            body.append("  " * depth + "}")
            if lvl < len(order):
                a = order[lvl]
                body.append("  " * depth + f"v{lvl + 1} += w{a} * v{lvl};")
        res = f"v{len(order)}"
        if masks:
            res = f"(({' || '.join(masks)}) ? ({wct}){attrs.extrapolation_value!r} : {res})"
        if dt.is_float:
            body.append(f"out0[i] = {ct.to_storage(f'({ct.compute})({res})')};")
        else:
            info = np.iinfo(dt.numpy)
            body.append(f"const double r = rint((double)({res}));")
            body.append(
                f"out0[i] = ({ct.storage})(r < {float(info.min)!r} ? {float(info.min)!r} : "
                f"(r > {float(info.max)!r} ? {float(info.max)!r} : r));"
            )
        elem = dt.itemsize
        params = [f"const {ct.storage}* __restrict__ in0", f"{ct.storage}* __restrict__ out0"]
    k = Kernel(params, [x, y], body, total, elem, preamble="".join(pre))
    return [_emit(ctx, k, family_params={"mode": attrs.mode})]


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


def _matches(ctx: StepContext) -> bool:
    return ctx.step.domain == "" and ctx.step.op in SUPPORTED


def _generate(ctx: StepContext) -> list[KernelSource]:
    step = ctx.step
    return _GENERATORS[step.op](ctx, ctx.attrs)


def _search_space(ctx: StepContext) -> list[dict[str, Any]]:
    return [{"block": b} for b in (128, 256, 512)]


register_family("data", _matches, _generate, _search_space)
