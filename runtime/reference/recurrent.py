"""Recurrent ops: LSTM, GRU, RNN (ONNX opset 14/22 forms: `layout`, every attribute).

Shapes (layout 0; layout 1 swaps the sequence and batch axes of X, Y and the states):
X [S, B, I], W [D, G*H, I], R [D, G*H, H], B [D, 2*G*H] (Wb then Rb), sequence_lens [B],
initial_h / initial_c [D, B, H], P [D, 3*H] (LSTM peepholes i, o, f); outputs Y [S, D, B, H],
Y_h (and LSTM's Y_c) [D, B, H]. G is 4 (LSTM gates i, o, f, c), 3 (GRU z, r, h) or 1 (RNN); D is 2
for direction=bidirectional (direction 0 runs forward, 1 in reverse), else 1.

- Activations are resolved once per direction (`resolve_activations`): names are case-insensitive
  (ONNX Runtime reads them so), alpha/beta are consumed in the order of the functions that take
  them, and an absent value is the default of the ONNX operator of that name, as the spec says
  (LeakyRelu 0.01, ThresholdedRelu 1.0, HardSigmoid 0.2/0.5, Elu 1.0; Affine 1.0/0.0 and ScaledTanh
  1.0/1.0, the experimental ops' identity and plain tanh). ONNX Runtime agrees when the values
  are given; its own defaults differ (0 for ThresholdedRelu, Affine and ScaledTanh in RNN, and
  others again in LSTM), so tests against it pass them explicitly.
- `clip` bounds every gate's pre-activation (the argument of f and g) to [-clip, clip].
- `sequence_lens`: batch entry b runs lens[b] steps (the reverse direction from lens[b]-1 down to
  0); Y is zero past its length and Y_h/Y_c hold the state after its last step. A length of 0
  gives zero states (ONNX Runtime's answer; the spec is silent).
- float16/bfloat16 inputs are computed in float32 and cast once at the end; float64 in float64.

The time loop is a Python loop over steps (a recurrence); each step is vectorized over the batch.
Type inference is in graphc.ops.recurrent; passes/decompose_rnn.py writes the same math out as
MatMul and elementwise ops for the CUDA target, using the tables below.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from graphc.runtime.reference.registry import register_kernel

# Gates per op and activations per direction.
NUM_GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
NUM_ACTIVATIONS = {"LSTM": 3, "GRU": 2, "RNN": 1}
DEFAULT_ACTIVATIONS = {"LSTM": ("Sigmoid", "Tanh", "Tanh"), "GRU": ("Sigmoid", "Tanh"), "RNN": ("Tanh",)}

# lower-case name -> (canonical name, default alpha or None if unused, default beta or None if unused);
# defaults are those of the ONNX operators of the same name (Affine and ScaledTanh: the
# experimental ops' 1.0/0.0 and 1.0/1.0).
ACTIVATIONS: dict[str, tuple[str, float | None, float | None]] = {
    "relu": ("Relu", None, None),
    "tanh": ("Tanh", None, None),
    "sigmoid": ("Sigmoid", None, None),
    "affine": ("Affine", 1.0, 0.0),
    "leakyrelu": ("LeakyRelu", 0.01, None),
    "thresholdedrelu": ("ThresholdedRelu", 1.0, None),
    "scaledtanh": ("ScaledTanh", 1.0, 1.0),
    "hardsigmoid": ("HardSigmoid", 0.2, 0.5),
    "elu": ("Elu", 1.0, None),
    "softsign": ("Softsign", None, None),
    "softplus": ("Softplus", None, None),
}


class RecurrentAttrError(ValueError):
    """An attribute combination of a recurrent op that has no meaning (the message says which)."""


@dataclass(frozen=True)
class Activation:
    name: str  # canonical spelling, a key of ACTIVATIONS' values
    alpha: float = 0.0
    beta: float = 0.0


def num_directions(direction: str) -> int:
    if direction not in ("forward", "reverse", "bidirectional"):
        raise RecurrentAttrError(f"direction must be forward, reverse or bidirectional, got {direction!r}")
    return 2 if direction == "bidirectional" else 1


def is_reverse(direction: str, d: int) -> bool:
    """Whether direction index d of a node with this `direction` attribute runs backwards in time."""
    return direction == "reverse" or (direction == "bidirectional" and d == 1)


def resolve_activations(op: str, attrs, num_dirs: int) -> list[list[Activation]]:
    """The activation functions of each direction, with their alpha and beta.

    `activations` may name NUM_ACTIVATIONS[op] functions per direction (all directions listed),
    or one direction's worth for a bidirectional node (used for both; ONNX Runtime accepts it), or
    two directions' worth for a one-direction node (RNN's schema default is ("Tanh", "Tanh")).
    """
    per = NUM_ACTIVATIONS[op]
    names = tuple(attrs.activations) if attrs.activations else DEFAULT_ACTIVATIONS[op] * num_dirs
    alphas = list(attrs.activation_alpha or ())
    betas = list(attrs.activation_beta or ())
    resolved: list[Activation] = []
    for raw in names:
        key = str(raw).lower()
        if key not in ACTIVATIONS:
            known = ", ".join(v[0] for v in ACTIVATIONS.values())
            raise RecurrentAttrError(f"unknown activation {raw!r} (known: {known})")
        canon, da, db = ACTIVATIONS[key]
        alpha = (alphas.pop(0) if alphas else da) if da is not None else 0.0
        beta = (betas.pop(0) if betas else db) if db is not None else 0.0
        resolved.append(Activation(canon, float(alpha), float(beta)))
    if len(resolved) == per * num_dirs:
        pass
    elif len(resolved) == per and num_dirs == 2:
        resolved = resolved * 2
    elif len(resolved) == 2 * per and num_dirs == 1:
        resolved = resolved[:per]
    else:
        raise RecurrentAttrError(
            f"{len(resolved)} activations given; {op} with {num_dirs} direction(s) takes {per * num_dirs}"
        )
    return [resolved[d * per : (d + 1) * per] for d in range(num_dirs)]


def _apply(act: Activation, x: np.ndarray) -> np.ndarray:
    one = x.dtype.type(1)
    a, b = x.dtype.type(act.alpha), x.dtype.type(act.beta)
    with np.errstate(over="ignore", under="ignore"):
        if act.name == "Relu":
            return np.maximum(x, 0)
        if act.name == "Tanh":
            return np.tanh(x)
        if act.name == "Sigmoid":
            # exp of a non-positive argument only: no overflow for large |x|
            e = np.exp(-np.abs(x))
            return np.where(x >= 0, one / (one + e), e / (one + e))
        if act.name == "Affine":
            return a * x + b
        if act.name == "LeakyRelu":
            return np.where(x >= 0, x, a * x)
        if act.name == "ThresholdedRelu":
            return np.where(x > a, x, x.dtype.type(0))
        if act.name == "ScaledTanh":
            return a * np.tanh(b * x)
        if act.name == "HardSigmoid":
            return np.clip(a * x + b, 0, 1)
        if act.name == "Elu":
            return np.where(x >= 0, x, a * np.expm1(np.minimum(x, 0)))
        if act.name == "Softsign":
            return x / (one + np.abs(x))
        if act.name == "Softplus":
            return np.logaddexp(x.dtype.type(0), x)
    raise RecurrentAttrError(f"unknown activation {act.name!r}")


# A step: (x projection of this step [B, G*H] incl. Wb, h [B, H], c [B, H] or None) -> (h, c)
StepFn = Callable[[np.ndarray, np.ndarray, np.ndarray | None], tuple[np.ndarray, np.ndarray | None]]


def _clipper(clip: float | None) -> Callable[[np.ndarray], np.ndarray]:
    if clip is None:
        return lambda v: v
    return lambda v: np.clip(v, -clip, clip)


def _lstm_step(r, rb, p, acts, clip, input_forget, quantize_h=None) -> StepFn:
    """quantize_h: DynamicQuantizeLSTM's per-step quantization of h before its product with R."""
    f_act, g_act, h_act = acts
    hs = r.shape[1]
    pi, po, pf = (p[:hs], p[hs : 2 * hs], p[2 * hs :]) if p is not None else (None, None, None)

    def step(xp, h, c):
        g = xp + (h if quantize_h is None else quantize_h(h)) @ r.T + rb
        gi, go, gf, gc = (g[:, k * hs : (k + 1) * hs] for k in range(4))
        if pi is not None:
            gi, gf = gi + pi * c, gf + pf * c
        i = _apply(f_act, clip(gi))
        f = (1 - i) if input_forget else _apply(f_act, clip(gf))
        c_new = f * c + i * _apply(g_act, clip(gc))
        if po is not None:
            go = go + po * c_new
        o = _apply(f_act, clip(go))
        return o * _apply(h_act, c_new), c_new

    return step


def _gru_step(r, rb, acts, clip, linear_before_reset) -> StepFn:
    f_act, g_act = acts
    hs = r.shape[1]
    rz, rr, rh = (r[k * hs : (k + 1) * hs] for k in range(3))
    rbz, rbr, rbh = (rb[k * hs : (k + 1) * hs] for k in range(3))

    def step(xp, h, c):
        xz, xr, xh = (xp[:, k * hs : (k + 1) * hs] for k in range(3))
        z = _apply(f_act, clip(xz + h @ rz.T + rbz))
        rg = _apply(f_act, clip(xr + h @ rr.T + rbr))
        # linear_before_reset: the reset gate scales R's product (with its bias), not h before it
        pre = xh + rg * (h @ rh.T + rbh) if linear_before_reset else xh + (rg * h) @ rh.T + rbh
        hh = _apply(g_act, clip(pre))
        return (1 - z) * hh + z * h, None

    return step


def _rnn_step(r, rb, acts, clip) -> StepFn:
    (f_act,) = acts

    def step(xp, h, c):
        return _apply(f_act, clip(xp + h @ r.T + rb)), None

    return step


def _run_direction(
    step: StepFn, xp: np.ndarray, h: np.ndarray, c: np.ndarray | None, lens: np.ndarray, reverse: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Runs one direction over xp [S, B, G*H]; returns Y [S, B, H], the last h and c."""
    seq, batch = xp.shape[:2]
    y = np.zeros((seq, batch, h.shape[1]), dtype=h.dtype)
    cols = np.arange(batch)
    for k in range(seq):
        valid = k < lens
        if not valid.any():
            break
        # Forward: time k. Reverse: each entry runs from its own last step (lens[b]-1) down to 0.
        t = np.where(valid, lens - 1 - k, 0) if reverse else np.full(batch, k)
        h_new, c_new = step(xp[t, cols], h, c)
        h = np.where(valid[:, None], h_new, h)
        if c is not None:
            c = np.where(valid[:, None], c_new, c)
        y[t[valid], cols[valid]] = h_new[valid]
    empty = (lens == 0)[:, None]
    if empty.any():
        h = np.where(empty, 0, h)
        c = None if c is None else np.where(empty, 0, c)
    return y, h, c


def dynamic_fake_quantize(a: np.ndarray) -> np.ndarray:
    """`a` quantized to uint8 per tensor and back, as ONNX Runtime quantizes a GEMM's float operand
    against quantized weights (DynamicQuantizeLinear's rule: the range widened to include 0,
    scale = range / 255, zero point and values rounded half to even): the integer GEMM equals the
    float product of this with the dequantized weights, up to float rounding of the sum."""
    lo, hi = min(float(a.min()), 0.0), max(float(a.max()), 0.0)
    scale = np.float32((hi - lo) / 255.0) if hi > lo else np.float32(1.0)
    zp = np.clip(np.round(np.float32(-lo) / scale), 0, 255)
    q = np.clip(np.round(a.astype(np.float32) / scale) + zp, 0, 255)
    return ((q - zp) * scale).astype(a.dtype)


def _compute(op: str, dynamic_quant: bool = False) -> Callable[[list, object, int], list[np.ndarray]]:
    """dynamic_quant: DynamicQuantizeLSTM (ins already in LSTM's layout, float weights dequantized):
    X and each step's h are quantized per tensor before their products, as ONNX Runtime does."""
    gates = NUM_GATES[op]

    def compute(ins: list, attrs, n: int) -> list[np.ndarray]:
        def opt(i: int) -> np.ndarray | None:
            return ins[i] if i < len(ins) else None

        x, w, r = ins[0], ins[1], ins[2]
        cd = np.dtype(np.float64) if x.dtype == np.float64 else np.dtype(np.float32)
        if attrs.layout:
            x = np.swapaxes(x, 0, 1)
        x, w, r = x.astype(cd), w.astype(cd), r.astype(cd)
        seq, batch, _ = x.shape
        dirs, hs = w.shape[0], r.shape[-1]
        acts = resolve_activations(op, attrs, dirs)
        bias = opt(3)
        bias = np.zeros((dirs, 2 * gates * hs), cd) if bias is None else bias.astype(cd)
        lens = opt(4)
        lens = np.full(batch, seq, np.int64) if lens is None else np.asarray(lens, np.int64).reshape(batch)
        if (lens < 0).any() or (lens > seq).any():
            raise RecurrentAttrError(f"sequence_lens {lens.tolist()} must lie in [0, {seq}]")

        def state(i: int) -> np.ndarray:
            v = opt(i)
            if v is None:
                return np.zeros((dirs, batch, hs), cd)
            return (np.swapaxes(v, 0, 1) if attrs.layout else v).astype(cd)

        h0 = state(5)
        c0 = state(6) if op == "LSTM" else None
        peep = opt(7) if op == "LSTM" else None
        clip = _clipper(None if attrs.clip is None else cd.type(attrs.clip))
        ys, hs_out, cs_out = [], [], []
        for d in range(dirs):
            wb, rb = bias[d, : gates * hs], bias[d, gates * hs :]
            if op == "LSTM":
                p = None if peep is None else peep[d].astype(cd)
                hq = dynamic_fake_quantize if dynamic_quant else None
                step = _lstm_step(r[d], rb, p, acts[d], clip, attrs.input_forget, hq)
            elif op == "GRU":
                step = _gru_step(r[d], rb, acts[d], clip, attrs.linear_before_reset)
            else:
                step = _rnn_step(r[d], rb, acts[d], clip)
            # The input projection of every step at once: one [S*B, I] x [I, G*H] product.
            x2 = x.reshape(seq * batch, -1)
            x2 = dynamic_fake_quantize(x2) if dynamic_quant else x2
            xp = (x2 @ w[d].T + wb).reshape(seq, batch, gates * hs)
            c_init = None if c0 is None else c0[d]
            y, h, c = _run_direction(step, xp, h0[d], c_init, lens, is_reverse(attrs.direction, d))
            ys.append(y)
            hs_out.append(h)
            cs_out.append(c)
        out_y = np.stack(ys, axis=1)  # [S, D, B, H]
        out_h = np.stack(hs_out)  # [D, B, H]
        outs = [out_y, out_h]
        if op == "LSTM":
            outs.append(np.stack(cs_out))
        if attrs.layout:
            outs = [np.moveaxis(outs[0], 2, 0)] + [np.swapaxes(v, 0, 1) for v in outs[1:]]  # [B, S, D, H], [B, D, H]
        return [v.astype(ins[0].dtype) for v in outs[: max(n, 1)]]

    return compute


for _op in ("LSTM", "GRU", "RNN"):
    register_kernel(_op, _compute(_op))


@dataclass(frozen=True)
class _LSTMView:
    """DynamicQuantizeLSTM's attrs as the LSTM computation reads them."""

    activations: tuple[str, ...]
    activation_alpha: tuple[float, ...]
    activation_beta: tuple[float, ...]
    clip: float | None
    direction: str
    input_forget: int
    layout: int = 0


def _dequantize_weights(q: np.ndarray, scale: np.ndarray, zp: np.ndarray | None) -> np.ndarray:
    """[D, K, G*H] quantized (per direction, or per direction and column) -> [D, G*H, K] float32."""
    d, _, cols = q.shape
    scale = np.asarray(scale, np.float32).reshape(d, 1, -1)
    zp = np.zeros_like(scale, dtype=np.int32) if zp is None else np.asarray(zp).astype(np.int32).reshape(d, 1, -1)
    if scale.shape[2] not in (1, cols) or zp.shape[2] not in (1, cols):
        raise RecurrentAttrError(f"weight scales/zero points must be [{d}] or [{d}, {cols}]")
    return np.swapaxes((q.astype(np.int32) - zp).astype(np.float32) * scale, 1, 2)


_LSTM_COMPUTE_DQ = _compute("LSTM", dynamic_quant=True)


def dynamic_quantize_lstm(ins: list, attrs, n: int) -> list[np.ndarray]:
    """com.microsoft.DynamicQuantizeLSTM: inputs X, W [D, I, 4H] and R [D, H, 4H] (8-bit, transposed
    against LSTM's), B, sequence_lens, initial_h, initial_c, P, W_scale, W_zero_point, R_scale,
    R_zero_point; LSTM's outputs and math, with ONNX Runtime's dynamic quantization of X and h."""
    ins = list(ins) + [None] * (12 - len(ins))
    w = _dequantize_weights(ins[1], ins[8], ins[9])
    r = _dequantize_weights(ins[2], ins[10], ins[11])
    view = _LSTMView(
        tuple(a for a in attrs.activations.split(",") if a),
        (),  # activation_alpha/beta: the converter refuses them (graphc/frontend/converters/contrib.py)
        (),
        attrs.clip if attrs.clip > 0 else None,
        attrs.direction,
        attrs.input_forget,
    )
    lstm_ins = [ins[0], w, r, *ins[3:8]]
    while lstm_ins and lstm_ins[-1] is None:
        lstm_ins.pop()
    return _LSTM_COMPUTE_DQ(lstm_ins, view, n)


register_kernel("DynamicQuantizeLSTM", dynamic_quantize_lstm, domain="com.microsoft")
