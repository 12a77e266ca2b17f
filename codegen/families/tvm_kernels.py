"""The tvm family: CUDA kernels written by apache-tvm (graphc[tvm]) for the long tail, the ops that
have a numpy reference but no graphc template on the cuda target (or forms of them a template
refuses, such as ScatterElements/ScatterND with reduction mul/max/min).

It is consulted last: registered after every template family, and as the fallback for the ops
in FALLBACK_OPS (install_fallbacks, called by codegen/families/__init__.py), there only
when the template itself refuses the step. Each op below is a te/topi compute, specialized to the
step's static shapes and attributes; graphc/tvm_source.py has TVM schedule, lower and print it,
and the source goes through graphc's own NVRTC like any template's. Every step TVM serves is
logged, and the engine's launches record it (family "tvm", params.source "apache-tvm").

Without TVM installed, or with CompileOptions(tvm=False) / `--no-tvm`, these ops are refused as
before, with one line that names the node, the op and how to get the kernel.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import logging
import math
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from graphc.codegen.kernel import KernelSource, StepContext, register_family
from graphc.errors import CompileError

log = logging.getLogger(__name__)


@contextlib.contextmanager
def _thread_per_index(total: int, threads: int) -> Iterator[Any]:
    """Inside an IRBuilder: a 1-D launch of `threads`-wide blocks covering `total` indices; yields
    the thread's index, the body guarded by index < total (the scatters' copy and update loops)."""
    from tvm import te
    from tvm.script.ir_builder import tirx as T

    bx, tx = te.thread_axis("blockIdx.x"), te.thread_axis("threadIdx.x")
    blocks = max(1, -(-total // threads))
    with T.frame_scope([T.attr(bx, "thread_extent", blocks), T.attr(tx, "thread_extent", threads)]):
        tid = bx * threads + tx
        with T.If(tid < total), T.Then():
            yield tid


_ALLOWED: contextvars.ContextVar[bool] = contextvars.ContextVar("graphc_tvm_allowed", default=True)


@contextlib.contextmanager
def tvm_allowed(allowed: bool) -> Iterator[None]:
    """Within the block, TVM-written kernels are used (True) or refused (False: --no-tvm)."""
    token = _ALLOWED.set(bool(allowed))
    try:
        yield
    finally:
        _ALLOWED.reset(token)


# ---- the computes ----------------------------------------------------------------------------
# Each takes the StepContext and returns (inputs used, compute) where compute(*placeholders) makes
# the te output(s); a form the compute does not define raises ctx.fail with the reason.


def _shape(ctx: StepContext, name: str) -> tuple[int, ...]:
    return tuple(int(d) for d in ctx.tensors[name].shape)


def _const_int(ctx: StepContext, i: int, what: str) -> int | None:
    names = ctx.step.inputs
    if i >= len(names) or names[i] is None:
        return None
    v = ctx.weights.get(names[i])
    if v is None:
        raise ctx.fail(f"{what} must be a constant for the cuda target")
    return int(np.asarray(v).reshape(-1)[0])


_SCATTER_MODES = {"none": "update", "add": "add", "mul": "mul", "max": "max", "min": "min"}


def _scatter_elements(ctx: StepContext):
    from tvm import topi

    a = ctx.attrs
    if a.reduction not in _SCATTER_MODES:
        raise ctx.fail(f"reduction {a.reduction!r} is not one of {sorted(_SCATTER_MODES)}")
    rank = len(_shape(ctx, ctx.step.inputs[0]))
    axis = a.axis + rank if a.axis < 0 else a.axis

    # topi's GPU form: a copy kernel, then one thread per line along the axis applying its
    # updates in order (so duplicates reduce in the reference's order)
    def compute(data, idx, upd):
        return topi.gpu.scatter_elements(data, idx, upd, axis, _SCATTER_MODES[a.reduction])

    return [0, 1, 2], compute


def _scatter_nd(ctx: StepContext):
    from tvm import te, tirx
    from tvm.script.ir_builder import IRBuilder
    from tvm.script.ir_builder import tirx as T

    mode = ctx.attrs.reduction
    if mode not in _SCATTER_MODES:
        raise ctx.fail(f"reduction {mode!r} is not one of {sorted(_SCATTER_MODES)}")
    dshape = _shape(ctx, ctx.step.inputs[0])
    ishape = _shape(ctx, ctx.step.inputs[1])
    k = ishape[-1]
    rows = math.prod(ishape[:-1])
    inner = math.prod(dshape[k:])
    total = math.prod(dshape)
    threads = 256

    # ONNX's indices are [..., k] (topi's scatter_nd wants k first): a copy kernel, then one thread
    # per element of a slice, applying every update row in order (duplicates reduce in order).
    def gen(data_b, idx_b, upd_b, out_b):
        data, idx, upd, out = (T.buffer_proxy(b) for b in (data_b, idx_b, upd_b, out_b))
        with IRBuilder() as ib:
            with T.seq_scope():
                with _thread_per_index(total, threads) as tid:
                    out[tid] = data[tid]
                with _thread_per_index(inner, threads) as j, T.serial(0, rows) as i:
                    index = j.astype("int64")
                    stride = inner
                    for ax in reversed(range(k)):
                        v = idx[i * k + ax].astype("int64")
                        v = v + (v < 0).astype("int64") * dshape[ax]  # negative: from the end
                        index = index + v * stride
                        stride *= dshape[ax]
                    u = upd[i * inner + j]
                    if mode == "none":
                        out[index] = u
                    elif mode == "add":
                        out[index] = out[index] + u
                    elif mode == "mul":
                        out[index] = out[index] * u
                    elif mode == "max":
                        out[index] = tirx.max(out[index], u)
                    else:
                        out[index] = tirx.min(out[index], u)
            return ib.get()

    def compute(data, idx, upd):
        out_buf = tirx.decl_buffer(data.shape, data.dtype, "out_buf")
        return te.extern(
            [data.shape],
            [data, idx, upd],
            lambda ins, outs: gen(ins[0], ins[1], ins[2], outs[0]),
            dtype=data.dtype,
            out_buffers=[out_buf],
            name="scatter_nd_onnx",
        )

    return [0, 1, 2], compute


def _dft(ctx: StepContext):
    from tvm import te, tirx

    a = ctx.attrs
    xshape = _shape(ctx, ctx.step.inputs[0])
    oshape = _shape(ctx, ctx.step.outputs[0])
    rank = len(xshape)
    axis_v = _const_int(ctx, 2, "axis")
    axis = (-2 if axis_v is None else axis_v) % rank
    inverse, onesided = bool(a.inverse), bool(a.onesided)
    d = xshape[axis]
    complex_in = xshape[-1] == 2
    length = _const_int(ctx, 1, "dft_length")
    n = length if length is not None else (2 * (d - 1) if inverse and onesided else d)
    irfft = inverse and onesided
    terms = min(n // 2 + 1, d) if irfft else min(n, d)
    sign = 1.0 if inverse else -1.0
    scale = 1.0 / n if inverse else 1.0

    def compute(x):
        dt = x.dtype
        r = te.reduce_axis((0, terms), name="t")

        def at(idx, pos, comp):
            i = list(idx[:-1])
            i[axis] = pos
            return x[(*i, comp)]

        def body(*idx):
            k = idx[axis]
            # the angle's integer part reduced mod n first, so cos/sin see arguments below 2*pi
            phase = ((k.astype("int64") * r.astype("int64")) % n).astype(dt) * tirx.const(2 * math.pi / n, dt)
            c, s = te.cos(phase), te.sin(phase) * tirx.const(sign, dt)
            xr = at(idx, r, 0)
            xi = at(idx, r, 1) if complex_in else tirx.const(0, dt)
            re = xr * c - xi * s  # (xr + i xi) * (cos + i*sign*sin)
            im = xi * c + xr * s
            if irfft:
                # Hermitian input: bins 1..n/2-1 count twice, bin 0 and the Nyquist bin once
                w = te.if_then_else(
                    tirx.any(r == 0, tirx.all(n % 2 == 0, r * 2 == n)), tirx.const(1, dt), tirx.const(2, dt)
                )
                return te.sum(re * w * tirx.const(scale, dt), axis=r)
            val = te.if_then_else(idx[-1] == 0, re, im)
            return te.sum(val * tirx.const(scale, dt), axis=r)

        return te.compute(oshape, body, name="dft")

    return [0], compute


def _stft(ctx: StepContext):
    from tvm import te, tirx

    xshape = _shape(ctx, ctx.step.inputs[0])
    oshape = _shape(ctx, ctx.step.outputs[0])
    step = _const_int(ctx, 1, "frame_step")
    names = ctx.step.inputs
    has_window = len(names) > 2 and names[2] is not None
    fl = _const_int(ctx, 3, "frame_length")
    ws = _shape(ctx, names[2])[0] if has_window else (fl if fl is not None else xshape[1])
    length = fl if fl is not None else ws
    terms = min(ws, length)
    complex_in = xshape[-1] == 2
    assert step is not None

    def compute(x, *window):
        dt = x.dtype
        r = te.reduce_axis((0, terms), name="t")

        def body(b, f, k, comp):
            phase = ((k.astype("int64") * r.astype("int64")) % length).astype(dt) * tirx.const(2 * math.pi / length, dt)
            c, s = te.cos(phase), -te.sin(phase)
            w = window[0][r] if window else tirx.const(1, dt)
            xr = x[b, f * step + r, 0] * w
            xi = x[b, f * step + r, 1] * w if complex_in else tirx.const(0, dt)
            return te.sum(te.if_then_else(comp == 0, xr * c - xi * s, xi * c + xr * s), axis=r)

        return te.compute(oshape, body, name="stft")

    return ([0, 2] if has_window else [0]), compute


def _reverse_sequence(ctx: StepContext):
    from tvm import te

    a = ctx.attrs
    rank = len(_shape(ctx, ctx.step.inputs[0]))
    b = a.batch_axis % rank
    tm = a.time_axis % rank

    def compute(x, lens):
        def body(*idx):
            # in the index type (int32 for these static shapes): lengths above 2**31 cannot occur
            n = lens[idx[b]].astype("int32")
            t = idx[tm]
            src = list(idx)
            src[tm] = te.if_then_else(t < n, n - 1 - t, t)
            return x[tuple(src)]

        return te.compute(x.shape, body, name="reverse_sequence")

    return [0, 1], compute


def _mvn(ctx: StepContext):
    from tvm import te, tirx, topi

    xshape = _shape(ctx, ctx.step.inputs[0])
    rank = len(xshape)
    axes = sorted({a % rank for a in ctx.attrs.axes})
    count = math.prod(xshape[a] for a in axes)

    # the reference's two passes (mean, then the mean of squared deviations) and its epsilon on the
    # standard deviation; dlight's GeneralReduction makes it one kernel, a block per group
    def compute(x):
        dt = x.dtype
        inv = tirx.const(1.0 / count, dt)
        mean = te.compute(
            topi.sum(x, axis=axes, keepdims=True).shape,
            lambda *i: topi.sum(x, axis=axes, keepdims=True)(*i) * inv,
            name="mean",
        )
        d = te.compute(xshape, lambda *i: x(*i) - mean(*[0 if k in axes else v for k, v in enumerate(i)]), name="d")
        var = topi.sum(d * d, axis=axes, keepdims=True)
        return te.compute(
            xshape,
            lambda *i: (
                d(*i)
                / (te.sqrt(var(*[0 if k in axes else v for k, v in enumerate(i)]) * inv) + tirx.const(MVN_EPSILON, dt))
            ),
            name="mvn",
        )

    return [0], compute


MVN_EPSILON = 1e-9  # runtime/reference/normalization.py's


def _max_unpool(ctx: StepContext):
    from tvm import te, tirx
    from tvm.script.ir_builder import IRBuilder
    from tvm.script.ir_builder import tirx as T

    n_in = math.prod(_shape(ctx, ctx.step.inputs[0]))
    n_out = math.prod(_shape(ctx, ctx.step.outputs[0]))
    threads = 256

    # zeros, then each input element to its flat index (MaxPool's Indices, over the whole tensor);
    # an index outside the output is skipped (the reference raises; a kernel cannot)
    def gen(x_b, idx_b, out_b):
        x, idx, out = (T.buffer_proxy(b) for b in (x_b, idx_b, out_b))
        with IRBuilder() as ib:
            with T.seq_scope():
                for total, body in ((n_out, "zero"), (n_in, "scatter")):
                    with _thread_per_index(total, threads) as tid:
                        if body == "zero":
                            out[tid] = tirx.const(0, out_b.dtype)
                        else:
                            j = idx[tid].astype("int64")
                            with T.If(tirx.all(j >= 0, j < n_out)), T.Then():
                                out[j] = x[tid]
            return ib.get()

    def compute(x, idx):
        out_buf = tirx.decl_buffer(_shape(ctx, ctx.step.outputs[0]), x.dtype, "out_buf")
        return te.extern(
            [out_buf.shape],
            [x, idx],
            lambda ins, outs: gen(ins[0], ins[1], outs[0]),
            dtype=x.dtype,
            out_buffers=[out_buf],
            name="max_unpool",
        )

    return [0, 1], compute


def _loss(ctx: StepContext):
    """NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss (graphc's TIR, IRBuilder): one thread
    per sample position for reduction none; for sum and mean one thread walks every position in
    order (the long tail: correct, not fast), accumulating in the output and a local weight sum."""
    from tvm import te, tirx
    from tvm.script.ir_builder import IRBuilder
    from tvm.script.ir_builder import tirx as T

    a = ctx.attrs
    sce = ctx.step.op == "SoftmaxCrossEntropyLoss"
    xshape = _shape(ctx, ctx.step.inputs[0])
    dt = ctx.spec(ctx.step.inputs[0]).dtype
    if dt not in ("float32", "float64"):
        raise ctx.fail(f"TVM's loss kernel takes float32/float64 scores, not {dt}")
    n_cls = xshape[1]
    inner = math.prod(xshape[2:])
    positions = xshape[0] * inner
    names = ctx.step.inputs
    has_weight = len(names) > 2 and names[2] is not None
    want_logp = sce and len(ctx.step.outputs) > 1
    ignore = a.ignore_index
    reduced = a.reduction in ("sum", "mean")
    threads = 1 if reduced else 256

    def gen(x_b, t_b, w_b, out_b, lp_b):
        x, tgt, out = T.buffer_proxy(x_b), T.buffer_proxy(t_b), T.buffer_proxy(out_b)
        w_in = T.buffer_proxy(w_b) if w_b is not None else None
        logp = T.buffer_proxy(lp_b) if lp_b is not None else None
        with IRBuilder() as ib:
            bx, tx = te.thread_axis("blockIdx.x"), te.thread_axis("threadIdx.x")
            blocks = 1 if reduced else max(1, -(-positions // threads))
            with T.frame_scope([T.attr(bx, "thread_extent", blocks), T.attr(tx, "thread_extent", threads)]):
                wsum = T.buffer_proxy(T.decl_buffer([1], dt, scope="local"))
                lse = T.buffer_proxy(T.decl_buffer([1], dt, scope="local"))
                acc = T.buffer_proxy(T.decl_buffer([1], dt, scope="local"))
                zero = tirx.const(0, dt)

                def position(p):
                    nb, d = p // inner, p % inner
                    base = nb * n_cls * inner + d  # x[nb, 0, d]
                    t = tgt[p].astype("int64")
                    active = tirx.const(True) if ignore is None else t != tirx.const(ignore, "int64")
                    safe = te.if_then_else(active, t, tirx.const(0, "int64"))
                    if sce:
                        lse[0] = x[base]
                        with T.serial(1, n_cls) as c:
                            lse[0] = tirx.max(lse[0], x[base + c * inner])
                        acc[0] = zero
                        with T.serial(0, n_cls) as c:
                            acc[0] = acc[0] + te.exp(x[base + c * inner] - lse[0])
                        lse[0] = lse[0] + te.log(acc[0])
                        if logp is not None:
                            with T.serial(0, n_cls) as c:
                                logp[base + c * inner] = x[base + c * inner] - lse[0]
                        picked = x[base + safe * inner] - lse[0]
                    else:
                        picked = x[base + safe * inner]
                    w = w_in[safe] if w_in is not None else tirx.const(1, dt)
                    w = te.if_then_else(active, w, zero)
                    return te.if_then_else(active, -picked * w, zero), w

                if reduced:
                    out[0] = zero
                    wsum[0] = zero
                    with T.serial(0, positions) as p:
                        loss, w = position(p)
                        out[0] = out[0] + loss
                        wsum[0] = wsum[0] + w
                    if a.reduction == "mean":
                        out[0] = out[0] / wsum[0]
                else:
                    p = bx * threads + tx
                    with T.If(p < positions), T.Then():
                        loss, _ = position(p)
                        out[p] = loss
            return ib.get()

    oshape = _shape(ctx, ctx.step.outputs[0])

    def compute(x, tgt, *weight):
        bufs = [tirx.decl_buffer(oshape, x.dtype, "out_buf")]
        if want_logp:
            bufs.append(tirx.decl_buffer(xshape, x.dtype, "logp_buf"))
        ins = [x, tgt, *weight]
        made = te.extern(
            [b.shape for b in bufs],
            ins,
            lambda i, o: gen(i[0], i[1], i[2] if has_weight else None, o[0], o[1] if want_logp else None),
            dtype=[x.dtype] * len(bufs),
            out_buffers=bufs,
            name="loss",
        )
        return list(made) if isinstance(made, (list, tuple)) else made

    return ([0, 1, 2] if has_weight else [0, 1]), compute


def _broadcast_index(shape: tuple[int, ...], out_rank: int, idx: tuple) -> tuple:
    """The index into an input of `shape` that numpy broadcasting reads for output index `idx`."""
    lead = out_rank - len(shape)
    return tuple(0 if d == 1 else idx[lead + i] for i, d in enumerate(shape))


def _bit_shift(ctx: StepContext):
    from tvm import te, tirx

    left = ctx.attrs.direction == "LEFT"
    a_shape, b_shape = (_shape(ctx, n) for n in ctx.step.inputs[:2])
    oshape = _shape(ctx, ctx.step.outputs[0])
    dt = ctx.spec(ctx.step.inputs[0]).dtype
    if not dt.startswith(("uint", "int")):
        raise ctx.fail(f"BitShift takes integer tensors, not {dt}")
    bits = np.dtype(dt).itemsize * 8
    signed = dt.startswith("int")
    udt = f"uint{bits}"

    # C leaves a shift by a negative amount or by the width or more undefined; the reference (numpy,
    # ONNX opset 28) gives 0, or -1 for a right shift of a negative value, so those are explicit.
    def compute(a, b):
        def body(*i):
            x = a(*_broadcast_index(a_shape, len(oshape), i))
            n = b(*_broadcast_index(b_shape, len(oshape), i))
            # n in [0, bits) as (n >> log2(bits)) == 0: TVM 0.27's simplifier fails on `n < bits`
            # for uint32/uint64 (it rewrites the comparison into an unsigned subtraction from 0)
            in_range = (n >> tirx.const(bits.bit_length() - 1, dt)) == tirx.const(0, dt)
            ok = tirx.all(n >= tirx.const(0, dt), in_range) if signed else in_range
            safe = te.if_then_else(ok, n, tirx.const(0, dt))
            if left:
                # through the unsigned type: bits past the sign bit drop without signed overflow
                shifted = (x.astype(udt) << safe.astype(udt)).astype(dt) if signed else x << safe
                return te.if_then_else(ok, shifted, tirx.const(0, dt))
            fill = te.if_then_else(x < tirx.const(0, dt), tirx.const(-1, dt), tirx.const(0, dt)) if signed else 0
            return te.if_then_else(ok, x >> safe, tirx.const(fill, dt) if not signed else fill)

        return te.compute(oshape, body, name="bit_shift")

    return [0, 1], compute


def _bit_cast(ctx: StepContext):
    from tvm import te, tirx

    src = ctx.spec(ctx.step.inputs[0]).dtype
    dst = ctx.spec(ctx.step.outputs[0]).dtype
    if np.dtype(src).itemsize != np.dtype(dst).itemsize:
        raise ctx.fail(f"BitCast from {src} to {dst} changes the element size; TVM's kernel keeps it")

    def compute(x):
        return te.compute(x.shape, lambda *i: tirx.reinterpret(dst, x(*i)), name="bit_cast")

    return [0], compute


DET_MAX = 64  # a thread holds its matrix in local memory: M*M elements


def _det(ctx: StepContext):
    """Det: one thread per matrix, LU with partial pivoting (as LAPACK's getrf, which numpy's det
    uses) on a copy in local memory; the determinant is the product of the pivots, its sign
    flipped per row swap."""
    from tvm import te, tirx
    from tvm.script.ir_builder import IRBuilder
    from tvm.script.ir_builder import tirx as T

    xshape = _shape(ctx, ctx.step.inputs[0])
    m = xshape[-1]
    dt = ctx.spec(ctx.step.inputs[0]).dtype
    if dt not in ("float32", "float64"):
        raise ctx.fail(f"TVM's Det kernel takes float32/float64 matrices, not {dt}")
    if m > DET_MAX:
        raise ctx.fail(f"TVM's Det kernel holds a matrix per thread, up to {DET_MAX}x{DET_MAX}; this one is {m}x{m}")
    count = math.prod(xshape[:-2])
    threads = 64

    def gen(x_b, out_b):
        x, out = T.buffer_proxy(x_b), T.buffer_proxy(out_b)
        with IRBuilder() as ib:
            bx, tx = te.thread_axis("blockIdx.x"), te.thread_axis("threadIdx.x")
            with T.frame_scope(
                [T.attr(bx, "thread_extent", max(1, -(-count // threads))), T.attr(tx, "thread_extent", threads)]
            ):
                a = T.buffer_proxy(T.decl_buffer([m * m], dt, scope="local"))
                det = T.buffer_proxy(T.decl_buffer([1], dt, scope="local"))
                best = T.buffer_proxy(T.decl_buffer([1], dt, scope="local"))
                piv = T.buffer_proxy(T.decl_buffer([1], "int32", scope="local"))
                tmp = T.buffer_proxy(T.decl_buffer([1], dt, scope="local"))
                b = bx * threads + tx
                with T.If(b < count), T.Then():
                    base = b.astype("int64") * (m * m)
                    with T.serial(0, m * m) as i:
                        a[i] = x[base + i]
                    det[0] = tirx.const(1, dt)
                    with T.serial(0, m) as k:
                        piv[0] = k
                        best[0] = te.abs(a[k * m + k])
                        with T.serial(k + 1, m) as i, T.If(te.abs(a[i * m + k]) > best[0]), T.Then():
                            best[0] = te.abs(a[i * m + k])
                            piv[0] = i
                        with T.If(piv[0] != k), T.Then():
                            with T.serial(0, m) as j:
                                tmp[0] = a[k * m + j]
                                a[k * m + j] = a[piv[0] * m + j]
                                a[piv[0] * m + j] = tmp[0]
                            det[0] = -det[0]
                        det[0] = det[0] * a[k * m + k]
                        with T.If(a[k * m + k] != tirx.const(0, dt)), T.Then(), T.serial(k + 1, m) as i:
                            tmp[0] = a[i * m + k] / a[k * m + k]
                            with T.serial(k + 1, m) as j:
                                a[i * m + j] = a[i * m + j] - tmp[0] * a[k * m + j]
                    out[b] = det[0]
            return ib.get()

    def compute(x):
        out_buf = tirx.decl_buffer(_shape(ctx, ctx.step.outputs[0]), x.dtype, "out_buf")
        return te.extern(
            [out_buf.shape], [x], lambda i, o: gen(i[0], o[0]), dtype=x.dtype, out_buffers=[out_buf], name="det"
        )

    return [0], compute


Builder = Callable[[StepContext], tuple[list[int], Callable[..., Any]]]
TVM_OPS: dict[str, Builder] = {
    "ScatterElements": _scatter_elements,
    "ScatterND": _scatter_nd,
    "DFT": _dft,
    "STFT": _stft,
    "ReverseSequence": _reverse_sequence,
    "MeanVarianceNormalization": _mvn,
    "MaxUnpool": _max_unpool,
    "NegativeLogLikelihoodLoss": _loss,
    "SoftmaxCrossEntropyLoss": _loss,
    "BitShift": _bit_shift,
    "BitCast": _bit_cast,
    "Det": _det,
}
# Ops whose kernels only move elements (and write zeros): 16-bit floats travel as uint16.
BIT_COPY_OPS = frozenset({"ReverseSequence", "MaxUnpool"})
# Ops a template family serves in some forms: TVM is asked only when that family refuses a step.
FALLBACK_OPS = frozenset({"ScatterElements", "ScatterND", "BitShift", "BitCast"})
# The ops whose only CUDA kernels are TVM's computing ones: TVM's fp16 code needs cuda_fp16.h,
# which NVRTC from pip lacks, so they take float32 and, under fp16/bf16, the precision pass keeps
# them in float32 with Casts around them. The CUDA capabilities' fp32_ops is this set.
FP32_OPS = frozenset(TVM_OPS) - BIT_COPY_OPS - FALLBACK_OPS


# ---- the family ------------------------------------------------------------------------------


def _op(ctx: StepContext) -> str | None:
    s = ctx.step
    return s.op if s.domain == "" and s.op in TVM_OPS else None


def _generate(ctx: StepContext, template_error: CompileError | None = None) -> list[KernelSource]:
    from graphc import tvm_source

    op = ctx.step.op
    why = "" if template_error is None else f" (its template: {_reason(template_error, ctx)})"
    if not _ALLOWED.get():
        raise ctx.fail(f"{op} has no graphc CUDA kernel{why}; TVM would write one, but --no-tvm (tvm=False) refuses it")
    if not tvm_source.available():
        raise ctx.fail(f"{op} has no graphc CUDA kernel{why}; apache-tvm can write one: {tvm_source.INSTALL_HINT}")
    where = f"{ctx.step.kind} node '{ctx.step.name}': "
    try:
        ins, outs, compute = compute_of(ctx)
        if any(math.prod(t.shape) == 0 for t in outs):
            return []  # nothing to write
        key = _cache_key(ctx, ins, outs)
        kernels = _BUILT.get(key)
        fresh = kernels is None
        if kernels is None:
            kernels = _BUILT[key] = tvm_source.build(ctx.kernel_name(), ins, outs, compute, where)
    except CompileError as e:
        if template_error is None:
            raise
        # both reasons, the template's first (it is the one a user of graphc without TVM knows)
        raise ctx.fail(f"{_reason(template_error, ctx)}; nor can apache-tvm's kernel: {_reason(e, ctx)}") from e
    log.log(
        logging.INFO if fresh else logging.DEBUG,  # once per step (build.py logs the compile's total)
        "%s node '%s': %d CUDA kernel(s) written by apache-tvm %s%s",
        op,
        ctx.step.name,
        len(kernels),
        tvm_source.version(),
        why,
    )
    params = {"source": "apache-tvm", "tvm": tvm_source.version(), "op": op}
    return [
        KernelSource("tvm", k.name, k.source, k.grid, k.block, k.args, params=dict(params, kernel=i))
        for i, k in enumerate(kernels)
    ]


# TVM's kernels by what determines them: a compile generates each step's kernels once per arch set
# (codegen/build.py's generate_for_archs asks again for Hopper), and TVM's lowering takes up to
# seconds for the largest index expressions.
_BUILT: dict[tuple, list[Any]] = {}
_BUILT_MAX = 256


def _cache_key(ctx: StepContext, ins: list[Any], outs: list[Any]) -> tuple:
    if len(_BUILT) >= _BUILT_MAX:
        _BUILT.clear()
    consts = tuple(
        (n, np.asarray(ctx.weights[n]).tobytes()) for n in ctx.step.inputs if n is not None and n in ctx.weights
    )
    return (ctx.kernel_name(), ctx.step.op, repr(ctx.attrs), tuple(ins), tuple(outs), consts)


def compute_of(ctx: StepContext) -> tuple[list[Any], list[Any], Callable[..., Any]]:
    """The step's TVM inputs and outputs (graphc/tvm_source.TensorArg) and its te compute."""
    from graphc import tvm_source

    used, compute = TVM_OPS[ctx.step.op](ctx)
    names = [ctx.step.inputs[i] for i in used]

    def dtype(name: str) -> str:
        dt = ctx.spec(name).dtype
        # ops that only move elements move 16-bit floats as their bits (TVM's fp16 code would need
        # cuda_fp16.h, which NVRTC from pip lacks)
        return "uint16" if ctx.step.op in BIT_COPY_OPS and dt in ("float16", "bfloat16") else dt

    ins = [tvm_source.TensorArg(n, _shape(ctx, n), dtype(n)) for n in names]
    outs = [tvm_source.TensorArg(o, _shape(ctx, o), dtype(o)) for o in ctx.step.outputs]
    return ins, outs, compute


def _reason(e: CompileError, ctx: StepContext) -> str:
    msg = str(e)
    marker = f"node '{ctx.step.name}': "
    i = msg.find(marker)
    return msg[i + len(marker) :] if i >= 0 else msg


def _matches(ctx: StepContext) -> bool:
    return _op(ctx) is not None


register_family("tvm", _matches, _generate)


def install_fallbacks() -> None:
    """Wrap the template families that serve FALLBACK_OPS in some forms: where such a family refuses
    a step of those ops, TVM is asked (and the template's reason is logged with it)."""
    from graphc.codegen import kernel

    for i, fam in enumerate(kernel._FAMILIES):
        if fam.name == "tvm" or getattr(fam.generate, "_tvm_fallback", False):
            continue

        def generate(ctx: StepContext, _orig=fam.generate) -> list[KernelSource]:
            try:
                return _orig(ctx)
            except CompileError as e:
                if ctx.step.domain != "" or ctx.step.op not in FALLBACK_OPS:
                    raise
                return _generate(ctx, template_error=e)

        generate._tvm_fallback = True  # type: ignore[attr-defined]
        kernel._FAMILIES[i] = dataclasses.replace(fam, generate=generate)


def tvm_report(plan_steps: Any) -> dict[str, Any] | None:
    """The compile report's record of the steps whose launches apache-tvm wrote, or None."""
    steps = [s for s in plan_steps if any(ln.family == "tvm" for ln in s.launches)]
    if not steps:
        return None
    from graphc import tvm_source

    return {
        "version": tvm_source.version(),
        "steps": [s.name for s in steps],
        "ops": sorted({s.op for s in steps}),
        "kernels": sum(len(s.launches) for s in steps),
    }
