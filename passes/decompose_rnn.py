"""LSTM / GRU / RNN as MatMul and elementwise ops, unrolled over time, for the CUDA target (which
has GEMM and elementwise kernels, not a recurrent kernel).

Per direction d, with G gates and hidden size H:

    P = reshape(X, [S*B, I]) @ W[d]^T + bias       one MatMul for every time step at once
    for each step (time t = k forward, S-1-k reverse):
        g = P[t] + h @ R[d]^T                      MatMul; the Add rides in its epilogue
        gates = slices of g along the last axis; peepholes, clip, activations: elementwise ops,
        which elementwise fusion joins into a few kernels per step
    Y = concat of the steps' h (in time order), Y_h / Y_c = the last step's states

The biases Wb + Rb fold into the projection's bias, except GRU's Rb_h under linear_before_reset
(inside r * (h @ Rh^T + Rb_h)). Absent initial states are zero constants, so the first step's
recurrent MatMul and peephole products fold away as constants when R and P are constants.
Layout 1 is two Transposes at the edges.

Constant sequence_lens below the sequence length are written out too: step k of entry b reads
time lens[b]-1-k (reverse) or k, finished entries keep their state through Where, and Y is
gathered back into time order with zeros past each entry's length (the reference's semantics).

The node stays (declined, logged; the CUDA target then names it) when a shape is not static or
sequence_lens is known only at run time (a constant, or a value computed from constants and
static shapes, is known at compile time). A sequence longer than MAX_STEPS is refused with a
CompileError naming the node: the unrolled graph grows with the length (about 10-20 nodes per
step and direction), and a persistent recurrent kernel, which would not, is not part of graphc yet.

The math is graphc.runtime.reference.recurrent's (same activation table, same alpha/beta
resolution), so the decomposed graph computes what the interpreter computes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from graphc.errors import CompileError
from graphc.ir.builder import GraphBuilder
from graphc.ir.graph import Graph, Node, Value
from graphc.ir.types import DType
from graphc.passes.rewrite import Match, Op, Rule, apply_rules_counted, static_shape
from graphc.runtime.reference.recurrent import (
    NUM_GATES,
    Activation,
    is_reverse,
    num_directions,
    resolve_activations,
)

log = logging.getLogger(__name__)

RULE = "rnn(x, w, r, ...) -> matmul(x, w^T) then per step matmul(h, r^T) + gate math, unrolled"
MAX_STEPS = 512
FLOATS = frozenset({DType.float32, DType.float16, DType.bfloat16, DType.float64})


@dataclass
class _Ctx:
    b: GraphBuilder
    m: Match
    name: str
    dtype: np.dtype

    def const(self, data: np.ndarray | float | list, hint: str, dtype: np.dtype | type | None = None) -> Value:
        return self.b.add_constant(np.asarray(data, dtype=dtype or self.dtype), f"{self.name}/{hint}")

    def ints(self, data: list[int], hint: str) -> Value:
        return self.const(np.array(data, np.int64), hint, np.int64)

    def op(self, op: str, inputs: list[Value | None], hint: str, attrs: dict | None = None) -> Value:
        return self.b.op(op, inputs, attrs, name=f"{self.name}/{hint}")

    def known(self, v: Value | None) -> np.ndarray | None:
        """v's value when known at compile time: a constant, or (small) computed from constants."""
        if v is None:
            return None
        data = self.m.graph.const(v.name)
        return data if data is not None else self.b.known_value(self.m.new(v))


def _direction_slice(c: _Ctx, v: Value, d: int, axis: int, hint: str, transpose: bool = False) -> Value:
    """v[d] along `axis` (that axis dropped), optionally with its last two axes swapped: a
    constant when v is one, else Gather (+ Transpose)."""
    data = c.known(v)
    if data is not None:
        part = np.take(data, d, axis=axis)
        return c.const(np.ascontiguousarray(part.T if transpose else part), hint, data.dtype)
    out = c.op("Gather", [c.m.new(v), c.ints([d], f"{hint}_index")], hint, {"axis": axis})
    out = c.op("Squeeze", [out, c.ints([axis], f"{hint}_axis")], f"{hint}_squeeze")
    return c.op("Transpose", [out], f"{hint}_t", {"perm": [1, 0]}) if transpose else out


def _cols(c: _Ctx, v: Value, start: int, stop: int, hint: str) -> Value:
    """v[..., start:stop]."""
    return c.op(
        "Slice", [v, c.ints([start], f"{hint}_start"), c.ints([stop], f"{hint}_stop"), c.ints([-1], f"{hint}_ax")], hint
    )


def _activation(c: _Ctx, act: Activation, v: Value, hint: str) -> Value:
    a, b = act.alpha, act.beta
    if act.name in ("Relu", "Tanh", "Sigmoid", "Softsign", "Softplus"):
        return c.op(act.name, [v], hint)
    if act.name in ("LeakyRelu", "ThresholdedRelu", "Elu"):
        return c.op(act.name, [v], hint, {"alpha": a})
    if act.name == "HardSigmoid":
        return c.op("HardSigmoid", [v], hint, {"alpha": a, "beta": b})
    if act.name == "Affine":
        return c.op(
            "Add", [c.op("Mul", [v, c.const(a, f"{hint}_alpha")], f"{hint}_mul"), c.const(b, f"{hint}_beta")], hint
        )
    if act.name == "ScaledTanh":
        t = c.op("Tanh", [c.op("Mul", [v, c.const(b, f"{hint}_beta")], f"{hint}_mul")], f"{hint}_tanh")
        return c.op("Mul", [t, c.const(a, f"{hint}_alpha")], hint)
    raise CompileError(f"{c.m.root.op} node '{c.name}': activation {act.name} has no decomposition")


# A step builder: (x projection of this step [B, G*H], h, c, step hint) -> (h, c)
StepBuilder = Callable[[Value, Value, Value | None, str], tuple[Value, Value | None]]


def _lstm_step(c: _Ctx, rt: Value, p: Value | None, acts: list[Activation], clip, input_forget: int, hs: int):
    peep = None
    if p is not None:
        peep = [_cols(c, p, k * hs, (k + 1) * hs, f"p{k}") for k in range(3)]  # i, o, f

    def step(xp: Value, h: Value, cell: Value | None, s: str) -> tuple[Value, Value | None]:
        g = c.op("Add", [xp, c.op("MatMul", [h, rt], f"{s}/rec")], f"{s}/gates")
        return lstm_cell(c, g, cell, hs, peep, acts, clip, input_forget, s)

    return step


def lstm_cell(
    c: _Ctx,
    g: Value,
    cell: Value,
    hs: int,
    peep: list[Value] | None,
    acts: list[Activation],
    clip,
    input_forget,
    s: str,
) -> tuple[Value, Value]:
    """One LSTM step from its gate pre-activations g [B, 4H] (i, o, f, c order) and the cell
    state: (h, c). Shared by the float LSTM here and passes/lower_int_quant.py's
    DynamicQuantizeLSTM, which differ only in how g is computed."""
    f_act, g_act, h_act = acts
    gi, go, gf, gc = (_cols(c, g, k * hs, (k + 1) * hs, f"{s}/g{k}") for k in range(4))
    if peep is not None:
        gi = c.op("Add", [gi, c.op("Mul", [cell, peep[0]], f"{s}/pi")], f"{s}/gi_p")
        gf = c.op("Add", [gf, c.op("Mul", [cell, peep[2]], f"{s}/pf")], f"{s}/gf_p")
    i = _activation(c, f_act, clip(gi, f"{s}/ci"), f"{s}/i")
    if input_forget:
        f = c.op("Sub", [c.const(1.0, f"{s}/one"), i], f"{s}/f")
    else:
        f = _activation(c, f_act, clip(gf, f"{s}/cf"), f"{s}/f")
    cand = _activation(c, g_act, clip(gc, f"{s}/cc"), f"{s}/cand")
    new_c = c.op("Add", [c.op("Mul", [f, cell], f"{s}/keep"), c.op("Mul", [i, cand], f"{s}/write")], f"{s}/c")
    if peep is not None:
        go = c.op("Add", [go, c.op("Mul", [new_c, peep[1]], f"{s}/po")], f"{s}/go_p")
    o = _activation(c, f_act, clip(go, f"{s}/co"), f"{s}/o")
    return c.op("Mul", [o, _activation(c, h_act, new_c, f"{s}/hc")], f"{s}/h"), new_c


def _gru_step(c: _Ctx, rt: Value, rb_h: Value | None, acts: list[Activation], clip, lbr: int, hs: int):
    f_act, g_act = acts
    rt_zr = _cols(c, rt, 0, 2 * hs, "r_zr")  # [H, 2H]
    rt_h = _cols(c, rt, 2 * hs, 3 * hs, "r_h")  # [H, H]

    def step(xp: Value, h: Value, cell: Value | None, s: str) -> tuple[Value, Value | None]:
        x_zr = _cols(c, xp, 0, 2 * hs, f"{s}/x_zr")
        x_h = _cols(c, xp, 2 * hs, 3 * hs, f"{s}/x_h")
        zr = c.op("Add", [x_zr, c.op("MatMul", [h, rt_zr], f"{s}/rec_zr")], f"{s}/zr")
        z = _activation(c, f_act, clip(_cols(c, zr, 0, hs, f"{s}/gz"), f"{s}/cz"), f"{s}/z")
        r = _activation(c, f_act, clip(_cols(c, zr, hs, 2 * hs, f"{s}/gr"), f"{s}/cr"), f"{s}/r")
        if lbr:
            rec_h = c.op("Add", [c.op("MatMul", [h, rt_h], f"{s}/rec_h"), rb_h], f"{s}/rec_hb")
            pre = c.op("Add", [x_h, c.op("Mul", [r, rec_h], f"{s}/reset")], f"{s}/pre")
        else:
            reset_h = c.op("Mul", [r, h], f"{s}/reset")
            pre = c.op("Add", [x_h, c.op("MatMul", [reset_h, rt_h], f"{s}/rec_h")], f"{s}/pre")
        cand = _activation(c, g_act, clip(pre, f"{s}/ch"), f"{s}/cand")
        # (1 - z) * cand + z * h  =  cand + z * (h - cand)
        new_h = c.op("Add", [cand, c.op("Mul", [z, c.op("Sub", [h, cand], f"{s}/dh")], f"{s}/zdh")], f"{s}/h")
        return new_h, None

    return step


def _rnn_step(c: _Ctx, rt: Value, acts: list[Activation], clip):
    (f_act,) = acts

    def step(xp: Value, h: Value, cell: Value | None, s: str) -> tuple[Value, Value | None]:
        pre = c.op("Add", [xp, c.op("MatMul", [h, rt], f"{s}/rec")], f"{s}/pre")
        return _activation(c, f_act, clip(pre, f"{s}/cp"), f"{s}/h"), None

    return step


def _unroll(
    c: _Ctx, step: StepBuilder, proj: Value, h: Value, cell: Value | None, lens: np.ndarray, reverse: bool, dn: str
) -> tuple[Value, Value, Value | None]:
    """The steps of one direction over the projection proj [S*B, G*H] (row t*B + b: time t, entry b);
    returns Y [S, 1, B, H] and the last states. With lengths below S (constants), step k of entry b
    reads time lens[b]-1-k (reverse) or k, a finished entry keeps its state (Where), and Y is
    gathered back into time order with zeros past each entry's length."""
    batch = lens.shape[0]
    seq = static_shape(proj)[0] // batch
    uniform = bool((lens == seq).all())
    n_steps = seq if uniform else max(1, int(lens.max()))
    cols = np.arange(batch)
    outs: list[Value] = []
    for k in range(n_steps):
        valid = k < lens
        t = np.where(valid, lens - 1 - k if reverse else k, 0)
        s = f"{dn}/t{int(t[0])}" if uniform else f"{dn}/k{k}"
        xp = c.op("Gather", [proj, c.const(t * batch + cols, f"{s}/rows", np.int64)], f"{s}/xp", {"axis": 0})
        h_new, c_new = step(xp, h, cell, s)
        if valid.all():
            h, cell = h_new, c_new
        else:
            mask = c.const(valid[:, None], f"{s}/running", np.bool_)
            h = c.op("Where", [mask, h_new, h], f"{s}/h_keep")
            cell = None if cell is None else c.op("Where", [mask, c_new, cell], f"{s}/c_keep")
        outs.append(c.op("Unsqueeze", [h_new, c.ints([0], f"{s}/y_axis")], f"{s}/y"))  # [1, B, H]
    if uniform:  # Y at time t is step t (forward) or step S-1-t (reverse)
        in_time = [outs[seq - 1 - t if reverse else t] for t in range(seq)]
        y = in_time[0] if seq == 1 else c.op("Concat", in_time, f"{dn}/y", {"axis": 0})
    else:
        stacked = outs[0] if n_steps == 1 else c.op("Concat", outs, f"{dn}/steps", {"axis": 0})
        hs = static_shape(h)[1]
        flat = c.op("Reshape", [stacked, c.ints([n_steps * batch, hs], f"{dn}/steps_shape")], f"{dn}/steps2")
        times = np.arange(seq)[:, None]
        present = times < lens[None, :]  # [S, B]
        src = np.where(present, (lens[None, :] - 1 - times) if reverse else times, 0) * batch + cols[None, :]
        y = c.op("Gather", [flat, c.const(src.reshape(-1), f"{dn}/y_rows", np.int64)], f"{dn}/y_flat", {"axis": 0})
        y = c.op("Reshape", [y, c.ints([seq, batch, hs], f"{dn}/y_shape")], f"{dn}/y_time")
        zero = c.const(0.0, f"{dn}/zero")
        y = c.op("Where", [c.const(present[:, :, None], f"{dn}/present", np.bool_), y, zero], f"{dn}/y")
        if (lens == 0).any():  # an empty sequence has zero states (what ONNX Runtime gives)
            ran = c.const((lens > 0)[:, None], f"{dn}/ran", np.bool_)
            h = c.op("Where", [ran, h, zero], f"{dn}/h_empty")
            cell = None if cell is None else c.op("Where", [ran, cell, zero], f"{dn}/c_empty")
    return c.op("Unsqueeze", [y, c.ints([1], f"{dn}/dir_axis")], f"{dn}/y_dir"), h, cell


def _declines(node: Node, lens: np.ndarray | None) -> str | None:
    """Why the node stays as it is, or None when it can be written out; `lens` is the value of
    sequence_lens when it is known at compile time."""
    x = node.inputs[0]
    shapes = [static_shape(v) if v is not None else () for v in node.inputs]
    if any(s is None for s in shapes):
        return "a shape is not static (bind the input shapes)"
    if x.ttype.dtype not in FLOATS:
        return f"dtype {x.ttype.dtype.name}"
    if len(node.inputs) > 4 and node.inputs[4] is not None:
        seq = shapes[0][1] if node.attrs.layout else shapes[0][0]
        if lens is None:
            return "sequence_lens is not known at compile time (lengths given at run time)"
        if ((lens < 0) | (lens > seq)).any():
            return f"sequence_lens {lens.tolist()} are not all within [0, {seq}]"
    return None


def _rewrite(m: Match, b: GraphBuilder) -> list[Value] | None:
    node = m.root
    op, a = node.op, node.attrs
    ins = list(node.inputs) + [None] * (8 - len(node.inputs))
    # A constant, or computed from constants and static shapes (as tf2onnx writes it): the builder
    # knows the value of either.
    known_lens = None if ins[4] is None else b.known_value(m.new(ins[4]))
    known_lens = None if known_lens is None else np.asarray(known_lens, np.int64).reshape(-1)
    why = _declines(node, known_lens)
    if why is not None:
        log.warning("%s node '%s' stays as it is for the CUDA target: %s", op, node.name, why)
        return None
    x_shape = static_shape(ins[0])
    seq, batch, isize = (x_shape[1], x_shape[0], x_shape[2]) if a.layout else x_shape
    if seq > MAX_STEPS:
        raise CompileError(
            f"{op} node '{node.name}': sequence length {seq} is above the {MAX_STEPS} steps the CUDA target unrolls "
            "(passes/decompose_rnn.py); shorten the sequence or compile with --target cpu"
        )
    dt = np.dtype(ins[0].ttype.dtype.numpy)
    c = _Ctx(b, m, node.name, dt)
    gates, dirs, hs = NUM_GATES[op], num_directions(a.direction), static_shape(ins[2])[2]
    # Not silent: the unrolled form launches a few kernels per step, where a persistent kernel would launch one.
    log.info("%s node '%s': unrolled over %d steps x %d direction(s) for the CUDA target", op, node.name, seq, dirs)
    acts = resolve_activations(op, a, dirs)
    if a.clip is None:
        clip = lambda v, hint: v  # noqa: E731
    else:
        lo, hi = c.const(-a.clip, "clip_lo"), c.const(a.clip, "clip_hi")
        clip = lambda v, hint: c.op("Clip", [v, lo, hi], hint)  # noqa: E731

    x = m.new(ins[0])
    if a.layout:
        x = c.op("Transpose", [x], "x_time_major", {"perm": [1, 0, 2]})
    x2 = c.op("Reshape", [x, c.ints([seq * batch, isize], "x2_shape")], "x2")
    bias_data = c.known(ins[3]) if ins[3] is not None else np.zeros((dirs, 2 * gates * hs), dt)
    state_axis = 1 if a.layout else 0
    lens = np.full(batch, seq, np.int64) if known_lens is None else known_lens
    ys, last_h, last_c = [], [], []
    for d in range(dirs):
        dn = f"d{d}"
        wt = _direction_slice(c, ins[1], d, 0, f"{dn}/w_t", transpose=True)  # [I, G*H]
        rt = _direction_slice(c, ins[2], d, 0, f"{dn}/r_t", transpose=True)  # [H, G*H]
        # Bias of the projection: Wb + Rb, but GRU's Rb_h under linear_before_reset stays in the step.
        keep_rbh = op == "GRU" and a.linear_before_reset
        rb_h: Value | None = None
        if bias_data is not None:
            wb, rb = bias_data[d, : gates * hs], bias_data[d, gates * hs :].copy()
            if keep_rbh:
                rb_h = c.const(rb[2 * hs :].copy(), f"{dn}/rb_h", dt)
                rb[2 * hs :] = 0
            proj_bias: Value = c.const((wb + rb).astype(dt), f"{dn}/bias", dt)
        else:  # a bias computed at run time
            bv = _direction_slice(c, ins[3], d, 0, f"{dn}/b")
            wb, rb = _cols(c, bv, 0, gates * hs, f"{dn}/wb"), _cols(c, bv, gates * hs, 2 * gates * hs, f"{dn}/rb")
            if keep_rbh:
                rb_h = _cols(c, rb, 2 * hs, 3 * hs, f"{dn}/rb_h")
                rb_zr = _cols(c, rb, 0, 2 * hs, f"{dn}/rb_zr")
                rb = c.op("Concat", [rb_zr, c.const(np.zeros(hs), f"{dn}/rb_h0")], f"{dn}/rb_nh", {"axis": 0})
            proj_bias = c.op("Add", [wb, rb], f"{dn}/bias")
        proj = c.op("Add", [c.op("MatMul", [x2, wt], f"{dn}/proj"), proj_bias], f"{dn}/proj_b")

        def state(i: int, hint: str, d: int = d) -> Value:
            if ins[i] is None:
                return c.const(np.zeros((batch, hs)), hint)
            return _direction_slice(c, ins[i], d, state_axis, hint)

        h = state(5, f"{dn}/h0")
        cell = state(6, f"{dn}/c0") if op == "LSTM" else None
        if op == "LSTM":
            p = None if ins[7] is None else _direction_slice(c, ins[7], d, 0, f"{dn}/p")
            step = _lstm_step(c, rt, p, acts[d], clip, a.input_forget, hs)
        elif op == "GRU":
            step = _gru_step(c, rt, rb_h, acts[d], clip, a.linear_before_reset, hs)
        else:
            step = _rnn_step(c, rt, acts[d], clip)
        y, h, cell = _unroll(c, step, proj, h, cell, lens, is_reverse(a.direction, d), dn)
        ys.append(y)
        last_h.append(c.op("Unsqueeze", [h, c.ints([0], f"{dn}/h_axis")], f"{dn}/y_h"))
        if cell is not None:
            last_c.append(c.op("Unsqueeze", [cell, c.ints([0], f"{dn}/c_axis")], f"{dn}/y_c"))

    def join(parts: list[Value], axis: int, hint: str) -> Value:
        return parts[0] if len(parts) == 1 else c.op("Concat", parts, hint, {"axis": axis})

    y = join(ys, 1, "Y")  # [S, D, B, H]
    results = [y, join(last_h, 0, "Y_h")] + ([join(last_c, 0, "Y_c")] if op == "LSTM" else [])
    if a.layout:
        results = [c.op("Transpose", [results[0]], "Y_batch_major", {"perm": [2, 0, 1, 3]})] + [
            c.op("Transpose", [v], f"{hint}_batch_major", {"perm": [1, 0, 2]})
            for v, hint in zip(results[1:], ("Y_h", "Y_c"), strict=False)
        ]
    # Each output of the node becomes an Identity of its value, named after the node, so that
    # provenance and dumps point at it.
    return [c.op("Identity", [v], f"out{i}") for i, v in enumerate(results[: len(node.outputs)])]


RULES = [Rule(RULE, Op(("LSTM", "GRU", "RNN"), any_inputs=True), _rewrite)]


def decompose_rnn(graph: Graph, *, fired: list[str] | None = None) -> Graph:
    """Every LSTM, GRU and RNN whose shapes are static, unrolled into MatMul and elementwise ops."""
    return apply_rules_counted(graph, RULES, "recurrent ops unrolled", fired=fired)
