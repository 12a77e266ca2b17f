"""Dynamically quantized graphs (ONNX Runtime's `quantize_dynamic` output) in ops the CUDA target
has kernels for.

Three rewrites, CUDA target only (the CPU engine runs the integer ops by their references):

- QuantizeLinear whose scale (and zero point) are computed at run time, as DynamicQuantizeLinear's
  function body computes them: the same elementwise form passes/decompose_qdq.py writes for
  constant scales, Cast(Clip(Round(x / s) + zp, lo, hi)), with a per-tensor (or 1-D per-axis)
  scale reshaped to broadcast.
- ConvInteger / MatMulInteger with zero points, or with uint8 operands (the CUDA int8 kernels take
  symmetric int8 only): Cast(Conv|MatMul(float(x) - float(x_zp), float(w - w_zp)), int32). The
  weights' subtraction is folded at compile time when w is a constant. Exactness: every operand
  is an integer of at most 9 bits plus sign, so each product is exact in float32 and so is every
  partial sum below 2^24; past that the float32 sum rounds, with |error| <= K * 2^-24 * sum|x||w|
  (K = reduction length): a relative error of at most K * 6e-8 of the magnitude sum, which the
  following multiplication by x_scale * w_scale carries to the float output unchanged. The int8
  tensor-core path keeps its exact int32 accumulation where it applies (int8, no zero points).
- com.microsoft.DynamicQuantizeLSTM: unrolled like passes/decompose_rnn.py's LSTM, with ONNX
  Runtime's quantization (onnxruntime contrib ops doc; core/util/qmath.h GetQuantizationParameter):
  X (all steps at once) and each step's h are quantized to uint8 per tensor (range widened to
  include 0, scale = (max - min) / 255 in float32, 1 when max == min, zero point = round half to
  even of clamp(-min / scale)), and each product is the integer-valued float GEMM of
  (q - zp) x (w - w_zp) times x_scale * w_scale, as ORT scales its int32 sums (same bound as above).

Declined (logged; the CUDA target then names the op): non-static shapes, run-time weights of the
LSTM, sequence_lens on the LSTM, QuantizeLinear to types other than 8/16-bit integers or with
blocked run-time scales, MatMulInteger with a per-row A zero point.
"""

from __future__ import annotations

import logging

import numpy as np

from graphc.errors import CompileError
from graphc.ir.builder import GraphBuilder
from graphc.ir.graph import Graph, Node, Value
from graphc.ir.types import DType
from graphc.ops.quantize import INT_RANGES, division_dtype
from graphc.passes.decompose_qdq import FLOATS, QUANT_OUT
from graphc.passes.decompose_rnn import MAX_STEPS, _cols, _Ctx, _direction_slice, _unroll, lstm_cell
from graphc.passes.rewrite import Match, Op, Rule, Var, apply_rules_counted, static_shape
from graphc.runtime.reference.recurrent import _LSTMView, is_reverse, num_directions, resolve_activations

log = logging.getLogger(__name__)

RULE_Q = "quantize(x, s_runtime, zp) -> cast(clip(round(x / s) + zp, lo, hi))"
RULE_INT = "conv|matmul_integer(x, w, x_zp, w_zp) -> cast(conv|matmul(float(x) - x_zp, float(w - w_zp)), int32)"
RULE_LSTM = "dynamic_quantize_lstm -> uint8 fake-quantized X and h, integer-valued GEMMs, unrolled"


def _decline(node: Node, why: str) -> None:
    log.warning("%s node '%s' stays as it is for the CUDA target: %s", node.op, node.name, why)


def _const(m: Match, v: Value | None) -> np.ndarray | None:
    return None if v is None else m.graph.const(v.name)


# ---- QuantizeLinear with run-time scales ---------------------------------------------------------


def _broadcast_runtime(b: GraphBuilder, v: Value, rank: int, axis: int, name: str) -> Value | None:
    """A run-time scale or zero point laid out to broadcast against x (rank `rank`): per tensor as
    it is, 1-D per axis reshaped to [1, .., C, .., 1]; None for other layouts."""
    shape = static_shape(v)
    if shape is None:
        return None
    if len(shape) == 0 or (len(shape) == 1 and shape[0] == 1):
        return v
    if len(shape) != 1:
        return None
    target = [1] * rank
    target[axis % rank] = shape[0]
    return b.op("Reshape", [v, b.add_constant(np.array(target, np.int64), f"{name}_shape")], name=name)


def _quantize_runtime(m: Match, b: GraphBuilder) -> Value | None:
    root: Node = m.root
    x, s = m.value("x"), m.value("s")
    if m.graph.const(s.name) is not None:
        return None  # constant scales: passes/decompose_qdq.py
    out = root.outputs[0].ttype.dtype
    shape = static_shape(x)
    zp = root.inputs[2] if len(root.inputs) > 2 else None
    a = root.attrs
    if out not in QUANT_OUT or x.ttype.dtype not in FLOATS or shape is None or a.block_size:
        _decline(root, f"run-time scale with output {out.name}, input {x.ttype.dtype.name} or blocked/dynamic shape")
        return None
    name = root.name
    s_b = _broadcast_runtime(b, m.new(s), len(shape), a.axis, f"{name}/scale_b")
    zp_b = None if zp is None else _broadcast_runtime(b, m.new(zp), len(shape), a.axis, f"{name}/zp_b")
    if s_b is None or (zp is not None and zp_b is None):
        _decline(root, "the run-time scale is neither per tensor nor 1-D per axis")
        return None
    div = DType.from_numpy(division_dtype(x.ttype.dtype.numpy, s.ttype.dtype.numpy, a.precision))
    work = DType.float64 if div is DType.float64 else DType.float32
    xd = x if x.ttype.dtype is div else b.op("Cast", [x], {"to": div.value}, name=f"{name}/x")
    sd = s_b if s.ttype.dtype is div else b.op("Cast", [s_b], {"to": div.value}, name=f"{name}/s")
    q = b.op("Div", [xd, sd], name=f"{name}/div")
    if div is not work:
        q = b.op("Cast", [q], {"to": work.value}, name=f"{name}/widen")
    r = b.op("Round", [q], name=f"{name}/round")
    if zp_b is not None:
        zf = b.op("Cast", [zp_b], {"to": work.value}, name=f"{name}/zero_point")
        r = b.op("Add", [r, zf], name=f"{name}/shift")
    lo, hi = INT_RANGES[out]
    lo_c = b.add_constant(np.array(lo, dtype=work.numpy), f"{name}/lo")
    hi_c = b.add_constant(np.array(hi, dtype=work.numpy), f"{name}/hi")
    c = b.op("Clip", [r, lo_c, hi_c], name=f"{name}/saturate")
    return b.op("Cast", [c], {"to": out.value}, name=name)


# ---- ConvInteger / MatMulInteger with zero points ------------------------------------------------


def _needs_lowering(node: Node) -> bool:
    zps = any(v is not None for v in node.inputs[2:4])
    int8 = all(v.ttype.dtype is DType.int8 for v in node.inputs[:2])
    return zps or not int8


def _weight(m: Match, b: GraphBuilder, w: Value, zp: Value | None, conv: bool) -> Value | None:
    """float(w - w_zp), folded when both are constants; per-output-channel zero points of a conv
    broadcast over [M, C/g, k...]."""
    name = m.root.name
    wd, zd = _const(m, w), _const(m, zp)
    rank = len(static_shape(w) or ())
    if wd is not None and (zp is None or zd is not None):
        z = np.zeros((), np.int32) if zd is None else zd.astype(np.int32)
        if conv and z.ndim == 1:
            z = z.reshape((-1,) + (1,) * (wd.ndim - 1))
        return b.add_constant(np.ascontiguousarray((wd.astype(np.int32) - z).astype(np.float32)), f"{name}/w_shifted")
    wf = b.op("Cast", [m.new(w)], {"to": DType.float32.value}, name=f"{name}/w_float")
    if zp is None:
        return wf
    zf = b.op("Cast", [m.new(zp)], {"to": DType.float32.value}, name=f"{name}/w_zp_float")
    zshape = static_shape(zp)
    if zshape is None:
        return None
    if conv and len(zshape) == 1 and zshape[0] != 1:
        target = np.array([zshape[0]] + [1] * (rank - 1), np.int64)
        zf = b.op("Reshape", [zf, b.add_constant(target, f"{name}/w_zp_shape")], name=f"{name}/w_zp_b")
    return b.op("Sub", [wf, zf], name=f"{name}/w_shifted")


def _integer_op(m: Match, b: GraphBuilder) -> Value | None:
    root: Node = m.root
    if not _needs_lowering(root):
        return None  # symmetric int8: the int8 kernels (codegen/families/gemm_int8.py) take it
    ins = list(root.inputs) + [None] * (4 - len(root.inputs))
    x, w, xzp, wzp = ins[:4]
    conv = root.op == "ConvInteger"
    if xzp is not None:
        zs = static_shape(xzp)
        if zs is None or int(np.prod(zs)) != 1:
            _decline(root, f"the input zero point has shape {zs} (only a per-tensor one is lowered)")
            return None
    name = root.name
    xf = b.op("Cast", [m.new(x)], {"to": DType.float32.value}, name=f"{name}/x_float")
    if xzp is not None:
        zf = b.op("Cast", [m.new(xzp)], {"to": DType.float32.value}, name=f"{name}/x_zp_float")
        xf = b.op("Sub", [xf, zf], name=f"{name}/x_shifted")
    wf = _weight(m, b, w, wzp, conv)
    if wf is None:
        _decline(root, "the weight zero point's shape is not static")
        return None
    log.info("%s node '%s': lowered to a float32 %s of the zero-point-shifted integers", root.op, name, root.op[:-7])
    if conv:
        y = b.op("Conv", [xf, wf], dict(root.attrs.items()), name=f"{name}/conv")
    else:
        y = b.op("MatMul", [xf, wf], name=f"{name}/matmul")
    return b.op("Cast", [y], {"to": DType.int32.value}, name=name)


# ---- com.microsoft.DynamicQuantizeLSTM -----------------------------------------------------------


def _fake_quantize(c: _Ctx, v: Value, hint: str) -> tuple[Value, Value]:
    """v quantized to uint8 per tensor as ORT's GetQuantizationParameter + MlasQuantizeLinear do:
    returns (q - zp as an integer-valued float tensor, the scale)."""
    zero, one, top = c.const(0.0, f"{hint}/zero"), c.const(1.0, f"{hint}/one"), c.const(255.0, f"{hint}/top")
    lo = c.op("Min", [c.op("ReduceMin", [v], f"{hint}/rmin", {"keepdims": 0}), zero], f"{hint}/lo")
    hi = c.op("Max", [c.op("ReduceMax", [v], f"{hint}/rmax", {"keepdims": 0}), zero], f"{hint}/hi")
    raw = c.op("Div", [c.op("Sub", [hi, lo], f"{hint}/range"), top], f"{hint}/raw_scale")
    scale = c.op("Where", [c.op("Equal", [hi, lo], f"{hint}/flat"), one, raw], f"{hint}/scale")
    zp = c.op(
        "Round",
        [
            c.op(
                "Clip",
                [c.op("Neg", [c.op("Div", [lo, scale], f"{hint}/lo_s")], f"{hint}/nlo"), zero, top],
                f"{hint}/zp_c",
            )
        ],
        f"{hint}/zp",
    )
    q = c.op("Add", [c.op("Round", [c.op("Div", [v, scale], f"{hint}/v_s")], f"{hint}/v_r"), zp], f"{hint}/v_zp")
    q = c.op("Clip", [q, zero, top], f"{hint}/q")
    return c.op("Sub", [q, zp], f"{hint}/q_centered"), scale


def _int_weight(w: np.ndarray, scale: np.ndarray, zp: np.ndarray | None, d: int) -> tuple[np.ndarray, np.ndarray]:
    """Direction d of a [D, K, 4H] quantized weight: float(w - zp) [K, 4H] and its scale ([] or [4H])."""
    s = np.asarray(scale, np.float32).reshape(w.shape[0], -1)[d]
    z = np.zeros(1, np.int32) if zp is None else np.asarray(zp).astype(np.int32).reshape(w.shape[0], -1)[d]
    return (w[d].astype(np.int32) - z[None, :]).astype(np.float32), (s if s.size > 1 else s.reshape(()))


def _lstm_declines(m: Match) -> str | None:
    node = m.root
    ins = list(node.inputs) + [None] * (12 - len(node.inputs))
    if any(static_shape(v) is None for v in ins if v is not None):
        return "a shape is not static (bind the input shapes)"
    if ins[0].ttype.dtype is not DType.float32:
        return f"X of {ins[0].ttype.dtype.name}"
    if ins[4] is not None:
        return "sequence_lens is given"
    for i, what in ((1, "W"), (2, "R"), (8, "W_scale"), (9, "W_zero_point"), (10, "R_scale"), (11, "R_zero_point")):
        if (i in (1, 2, 8, 10) or ins[i] is not None) and (ins[i] is None or _const(m, ins[i]) is None):
            return f"{what} is not a constant"
    return None


def _dq_lstm(m: Match, b: GraphBuilder) -> list[Value] | None:
    node = m.root
    why = _lstm_declines(m)
    if why is not None:
        _decline(node, why)
        return None
    a = node.attrs
    ins = list(node.inputs) + [None] * (12 - len(node.inputs))
    seq, batch, isize = static_shape(ins[0])
    if seq > MAX_STEPS:
        raise CompileError(
            f"DynamicQuantizeLSTM node '{node.name}': sequence length {seq} is above the {MAX_STEPS} steps the CUDA "
            "target unrolls (passes/lower_int_quant.py); shorten the sequence or compile with --target cpu"
        )
    c = _Ctx(b, m, node.name, np.dtype(np.float32))
    dirs, hs = num_directions(a.direction), static_shape(ins[2])[1]
    view = _LSTMView(tuple(x for x in a.activations.split(",") if x), (), (), a.clip if a.clip > 0 else None,
                     a.direction, a.input_forget)  # fmt: skip
    acts = resolve_activations("LSTM", view, dirs)
    log.info("DynamicQuantizeLSTM node '%s': unrolled over %d steps x %d direction(s) for the CUDA target",
             node.name, seq, dirs)  # fmt: skip
    if view.clip is None:
        clip = lambda v, hint: v  # noqa: E731
    else:
        lo, hi = c.const(-view.clip, "clip_lo"), c.const(view.clip, "clip_hi")
        clip = lambda v, hint: c.op("Clip", [v, lo, hi], hint)  # noqa: E731
    w, r = _const(m, ins[1]), _const(m, ins[2])
    ws, wz, rs, rz = (_const(m, ins[i]) for i in (8, 9, 10, 11))
    x2 = c.op("Reshape", [m.new(ins[0]), c.ints([seq * batch, isize], "x2_shape")], "x2")
    xq, xs = _fake_quantize(c, x2, "xq")  # X is quantized once, over every step and direction
    bias = _const(m, ins[3]) if ins[3] is not None else None
    lens = np.full(batch, seq, np.int64)
    ys, last_h, last_c = [], [], []
    for d in range(dirs):
        dn = f"d{d}"
        wi, wsd = _int_weight(w, ws, wz, d)
        ri, rsd = _int_weight(r, rs, rz, d)
        ri_c, rs_c = c.const(ri, f"{dn}/r_int"), c.const(rsd, f"{dn}/r_scale")
        proj = c.op("MatMul", [xq, c.const(wi, f"{dn}/w_int")], f"{dn}/proj_int")
        proj = c.op("Mul", [proj, c.op("Mul", [xs, c.const(wsd, f"{dn}/w_scale")], f"{dn}/proj_scale")], f"{dn}/proj")
        if bias is not None:
            bd = bias[d, : 4 * hs] + bias[d, 4 * hs :]
            proj = c.op("Add", [proj, c.const(bd.astype(np.float32), f"{dn}/bias")], f"{dn}/proj_b")
        elif ins[3] is not None:
            bv = _direction_slice(c, ins[3], d, 0, f"{dn}/b")
            bsum = c.op(
                "Add", [_cols(c, bv, 0, 4 * hs, f"{dn}/wb"), _cols(c, bv, 4 * hs, 8 * hs, f"{dn}/rb")], f"{dn}/bs"
            )
            proj = c.op("Add", [proj, bsum], f"{dn}/proj_b")

        def state(i: int, hint: str, d: int = d) -> Value:
            if ins[i] is None:
                return c.const(np.zeros((batch, hs)), hint)
            return _direction_slice(c, ins[i], d, 0, hint)

        peep = None
        if ins[7] is not None:
            p = _direction_slice(c, ins[7], d, 0, f"{dn}/p")
            peep = [_cols(c, p, k * hs, (k + 1) * hs, f"{dn}/p{k}") for k in range(3)]  # i, o, f
        f_act, g_act, h_act = acts[d]

        def step(xp, h, cell, s, ri_c=ri_c, rs_c=rs_c, peep=peep, f_act=f_act, g_act=g_act, h_act=h_act):
            hq, hsc = _fake_quantize(c, h, f"{s}/hq")
            rec = c.op("MatMul", [hq, ri_c], f"{s}/rec_int")
            rec = c.op("Mul", [rec, c.op("Mul", [hsc, rs_c], f"{s}/rec_scale")], f"{s}/rec")
            g = c.op("Add", [xp, rec], f"{s}/gates")
            return lstm_cell(c, g, cell, hs, peep, [f_act, g_act, h_act], clip, view.input_forget, s)

        y, h, cell = _unroll(c, step, proj, state(5, f"{dn}/h0"), state(6, f"{dn}/c0"), lens,
                             is_reverse(a.direction, d), dn)  # fmt: skip
        ys.append(y)
        last_h.append(c.op("Unsqueeze", [h, c.ints([0], f"{dn}/h_axis")], f"{dn}/y_h"))
        last_c.append(c.op("Unsqueeze", [cell, c.ints([0], f"{dn}/c_axis")], f"{dn}/y_c"))

    def join(parts: list[Value], axis: int, hint: str) -> Value:
        return parts[0] if len(parts) == 1 else c.op("Concat", parts, hint, {"axis": axis})

    results = [join(ys, 1, "Y"), join(last_h, 0, "Y_h"), join(last_c, 0, "Y_c")]
    return [c.op("Identity", [v], f"out{i}") for i, v in enumerate(results[: len(node.outputs)])]


RULES = [
    Rule(RULE_Q, Op("QuantizeLinear", Var("x"), Var("s"), any_inputs=True), _quantize_runtime),
    Rule(RULE_INT, Op(("ConvInteger", "MatMulInteger"), any_inputs=True), _integer_op),
    Rule(RULE_LSTM, Op("DynamicQuantizeLSTM", any_inputs=True, domain="com.microsoft"), _dq_lstm),
]


def lower_int_quant(graph: Graph, *, fired: list[str] | None = None) -> Graph:
    """The three rewrites above, for the CUDA target."""
    return apply_rules_counted(graph, RULES, "dynamic-quantization ops in float form", fired=fired)
