"""Fuse decomposed LayerNorm and RMSNorm into LayerNormalization / RMSNormalization nodes.

TorchScript exporters (and the zoo's layernorm="decomposed") write LayerNorm as

    d = x - ReduceMean(x, axes);  v = ReduceMean(d^2, axes)        (d^2 as Pow(d, 2) or d * d)
    y = d / sqrt(v + eps) * gamma + beta                             (or d * 1/sqrt, d * v^-0.5...)

and RMSNorm (LLaMA, T5) as y = gamma * (x / sqrt(ReduceMean(x^2, axes) + eps)), often between a
Cast to float32 and a Cast back. The pass works in two steps that compose:

1. the core, d / sqrt(v + eps), becomes LayerNormalization(x, ones) (RMSNormalization for the
   mean-free form), axis = -k for the k trailing reduced dims, epsilon from the constant,
   stash_type 1 (statistics in float32, more accurate than the float16 chain it replaces);
2. absorption rules move what follows into the node: `ln(x, s, b) * g -> ln(x, s*g, b*g)`,
   `ln(x, s, b) + c -> ln(x, s, b + c)`, `rms(x, s) * g -> rms(x, s*g)` and
   `cast(rms(x, s), T) -> rms(x, cast(s, T))`, where g and c broadcast over the normalized
   dims only. They emit the arithmetic on constants; constant folding evaluates it.

A leading float up-cast (x16 -> x32) is looked through for RMSNorm, since RMSNormalization takes
x in any float type and computes in float32 itself.
"""

from __future__ import annotations

import numpy as np

from graphc.ir.builder import GraphBuilder
from graphc.ir.graph import Graph, Node, Value
from graphc.ir.types import DType, TensorType
from graphc.ops.normalization import HAS_RMS_NORMALIZATION
from graphc.passes.fuse_util import (
    apply_until_stable,
    is_float,
    is_float_data,
    is_scalar,
    near_misses,
    record_near_misses,
    same_shape,
    scalar,
    with_interior_check,
)
from graphc.passes.rewrite import Const, Match, Op, Pattern, Rule, Var

# ---- pattern pieces ------------------------------------------------------------------------------


def _squares(d: Pattern) -> list[tuple[str, Pattern]]:
    return [
        ("^2", Op("Pow", d, Const(pred=is_scalar(2.0)), name="square")),
        ("*self", Op("Mul", d, d, name="square")),
    ]


def _sqrts(v: Pattern) -> list[tuple[str, Pattern]]:
    return [
        ("sqrt", Op("Sqrt", v, name="sqrt")),
        ("^0.5", Op("Pow", v, Const(pred=is_scalar(0.5)), name="sqrt")),
    ]


def _normalizations(num: Pattern, v: Pattern) -> list[tuple[str, Pattern]]:
    """num / sqrt(v), in the forms exporters write."""
    out: list[tuple[str, Pattern]] = []
    for sname, s in _sqrts(v):
        out.append((f"/ {sname}", Op("Div", num, s, name="norm")))
    for sname, s in _sqrts(v):
        out.append((f"* reciprocal({sname})", Op("Mul", num, Op("Reciprocal", s), name="norm")))
        out.append((f"* (1 / {sname})", Op("Mul", num, Op("Div", Const(pred=is_scalar(1.0)), s), name="norm")))
    out.append(("* ^-0.5", Op("Mul", num, Op("Pow", v, Const(pred=is_scalar(-0.5))), name="norm")))
    return out


def _var_eps(square: Pattern) -> Pattern:
    return Op("Add", Op("ReduceMean", square, Const("axes2"), name="var"), Const("eps"))


# ---- predicates ----------------------------------------------------------------------------------


def _trailing_axes(m: Match, *names: str) -> int | None:
    """k when every named axes constant reduces exactly the last k dims of x, else None."""
    x = m.values["x"]
    if not isinstance(x.type, TensorType) or x.type.shape is None:
        return None
    rank = len(x.type.shape)
    found: set[tuple[int, ...]] = set()
    for name in names:
        data = m.consts[name]
        if data.dtype.kind not in "iu" or data.ndim > 1 or data.size == 0:
            return None
        axes = sorted({int(a) + rank if int(a) < 0 else int(a) for a in data.reshape(-1)})
        if len(axes) != data.size or axes[0] < 0 or axes[-1] >= rank:
            return None
        found.add(tuple(axes))
    if len(found) != 1:
        return None
    axes = found.pop()
    k = len(axes)
    return k if axes == tuple(range(rank - k, rank)) else None


def _eps(m: Match) -> float | None:
    e = scalar(m.consts["eps"])
    if e is None or not is_float_data(m.consts["eps"]) or not np.isfinite(e) or e < 0:
        return None
    return e


def _centered_for_layernorm(m: Match) -> bool:
    """x = x0 - ReduceMean(x0), read only by this match, with the mean read only by the Sub: the
    LayerNorm rules take this whole (an RMSNorm rule must not take its tail, even in a later
    node of the same sweep, where it would still see the old graph)."""
    g = m.graph
    x = m.values["x"]
    sub = g.producer(x.name)
    if not _onnx_op(sub, "Sub") or g.is_output(x.name):
        return False
    mean = g.producer(sub.inputs[1].name) if sub.inputs[1] is not None else None
    if not _onnx_op(mean, "ReduceMean") or mean.inputs[0] != sub.inputs[0]:
        return False
    if g.is_output(mean.outputs[0].name) or g.users(mean.outputs[0].name) != [sub]:
        return False
    inside = {id(n) for n in m.matched}
    return all(id(u) in inside for u in g.users(x.name))


def _onnx_op(node: Node | None, op: str) -> bool:
    return node is not None and not node.domain and node.op == op


def _core_pred(reduce_nodes: tuple[str, ...], axes: tuple[str, ...], tails: frozenset[str], ln: bool):
    def pred(m: Match) -> bool:
        x = m.values["x"]
        if not is_float(x) or _eps(m) is None:
            return False
        if not ln and _centered_for_layernorm(m):
            return False
        k = _trailing_axes(m, *axes)
        if k is None or any(m.nodes[n].attrs.keepdims != 1 for n in reduce_nodes):
            return False
        return same_shape(m.nodes["norm"].outputs[0], x) and _tail_ok(m, k, tails, ln)

    return pred


# ---- affine tails: what follows the core and goes into the node ------------------------------------


def const_over_norm(c: np.ndarray, y: Value, k: int) -> bool:
    """The constant broadcasts over the last k (normalized) dims of y only: leading dims 1,
    normalized dims 1 or y's size, same dtype."""
    t = y.type
    if not isinstance(t, TensorType) or t.shape is None or not t.dtype.is_float or c.dtype != t.dtype.numpy:
        return False
    rank = len(t.shape)
    if c.ndim > rank:
        return False
    for i, d in enumerate(c.shape):
        yi = rank - c.ndim + i
        if d != 1 and (yi < rank - k or d != t.shape[yi]):
            return False
    return True


def _affine_user(g: Graph, y: Value, k: int, ops: tuple[str, ...]) -> bool:
    """y's only reader is a Mul/Add (of `ops`) by a constant over the normalized dims that keeps
    y's shape: a longer rule absorbs it, so the shorter one declines."""
    users = g.users(y.name)
    if len(users) != 1 or g.is_output(y.name):
        return False
    u = users[0]
    if u.domain or u.op not in ops or len(u.inputs) != 2:
        return False
    other = u.inputs[1] if u.inputs[0] == y else u.inputs[0]
    c = None if other is None else g.const(other.name)
    return c is not None and const_over_norm(c, y, k) and same_shape(u.outputs[0], y)


def _cast_ok(g: Graph, x: Value, cast: Node, ln: bool) -> bool:
    """A Cast after the core can go into the node: to a float type, and for LayerNorm (whose
    output has x's type) back to the type x was up-cast from."""
    to = DType.from_onnx(cast.attrs.to)
    if not to.is_float:
        return False
    if not ln:
        return True
    src = upcast_source(g, x)
    return src is not x and src.ttype.dtype == to


def _cast_user(g: Graph, y: Value, x: Value, ln: bool) -> bool:
    users = g.users(y.name)
    if len(users) != 1 or g.is_output(y.name):
        return False
    u = users[0]
    return not u.domain and u.op == "Cast" and _cast_ok(g, x, u, ln)


# What may follow each tail and be taken by a longer rule: (op, longer tail).
_EXTENSIONS: dict[str, tuple[tuple[str, str], ...]] = {
    "": (("Mul", "mul"), ("Add", "add"), ("Cast", "cast")),
    "mul": (("Add", "mul_add"),),
    "cast": (("Mul", "cast_mul"), ("Add", "cast_add")),
    "cast_mul": (("Add", "cast_mul_add"),),
}


def _tail_ok(m: Match, k: int, tails: frozenset[str], ln: bool) -> bool:
    """The tail's constants broadcast over the normalized dims only and keep the shape, and no
    longer tail (of this family's `tails`) waits below the root to take it whole."""
    g = m.graph
    x = m.values["x"]
    ref = m.nodes["norm"].outputs[0]
    if "cast" in m.nodes:
        if not _cast_ok(g, x, m.nodes["cast"], ln):
            return False
        ref = m.nodes["cast"].outputs[0]
    for node, const in (("mul", "g"), ("add", "c")):
        if node in m.nodes:
            out = m.nodes[node].outputs[0]
            if not (const_over_norm(m.consts[const], ref, k) and same_shape(out, ref)):
                return False
            ref = out
    kind = "_".join(n for n in ("cast", "mul", "add") if n in m.nodes)
    for op, longer in _EXTENSIONS.get(kind, ()):
        if longer not in tails:
            continue
        if op == "Cast" and _cast_user(g, ref, x, ln):
            return False
        if op != "Cast" and _affine_user(g, ref, k, (op,)):
            return False
    return True


# ---- builders ------------------------------------------------------------------------------------


def _prefix(m: Match) -> str:
    """A node-name hint from the core's last node: 'enc.0.LayerNorm/Div' -> 'enc.0.LayerNorm'."""
    name = m.nodes["norm"].name
    return name.rsplit("/", 1)[0] if "/" in name else name


def _norm_shape(y: Value, k: int) -> tuple[int, ...] | None:
    dims = y.ttype.shape[len(y.ttype.shape) - k :]
    return tuple(dims) if all(isinstance(d, int) for d in dims) else None


def _param(b: GraphBuilder, m: Match, name: str | None, y: Value, k: int, hint: str) -> Value | None:
    """The node's scale or bias of the normalized shape: the tail's constant, else ones."""
    shape = _norm_shape(y, k)
    if shape is None:
        return None  # LayerNormalization's scale must be a constant of the normalized shape
    dtype = y.ttype.dtype.numpy
    if name is None:
        return b.add_constant(np.ones(shape, dtype=dtype), f"{hint}/ones")
    data = m.consts[name]
    if data.shape == shape:
        return m.value(name)
    # A broadcast constant (a scalar, or [1, 1, D]): emit its expansion for constant folding.
    ones = b.add_constant(np.ones(shape, dtype=dtype), f"{hint}/ones")
    full = b.op("Mul", [ones, m.value(name)], name=f"{hint}/{name}")
    return _trailing(b, full, k, f"{hint}/{name}")


def _stash(dtype: DType) -> int:
    return DType.float64.value if dtype is DType.float64 else DType.float32.value


def _build_ln(m: Match, b: GraphBuilder) -> Value | None:
    x_old = m.values["x"]
    # With a Cast tail, x was up-cast from the type the Cast goes back to: the node reads the
    # narrow x and computes in float32 itself (stash_type), one rounding instead of two.
    x = m.new(upcast_source(m.graph, x_old) if "cast" in m.nodes else x_old)
    k = _trailing_axes(m, "axes1", "axes2")
    hint = _prefix(m)
    y = m.root.outputs[0]
    scale = _param(b, m, "g" if "mul" in m.nodes else None, y, k, hint)
    bias = _param(b, m, "c", y, k, hint) if "add" in m.nodes else None
    if scale is None or ("add" in m.nodes and bias is None):
        return None
    attrs = {"axis": -k, "epsilon": _eps(m), "stash_type": _stash(x_old.ttype.dtype)}
    return b.op("LayerNormalization", [x, scale, bias], attrs, name=f"{hint}/LayerNormalization")


def upcast_source(g: Graph, x: Value) -> Value:
    """x's source when x = Cast(x0) is an exact float up-cast (f16/bf16 -> f32, f32 -> f64)."""
    node = g.producer(x.name)
    if node is None or node.op != "Cast" or node.domain:
        return x
    src = node.inputs[0]
    if src is None or not is_float(src):
        return x
    narrow = {DType.float16: 1, DType.bfloat16: 1, DType.float32: 2, DType.float64: 3}
    a, b = narrow.get(src.ttype.dtype), narrow.get(x.ttype.dtype)
    return src if a is not None and b is not None and a < b else x


def _build_rms(m: Match, b: GraphBuilder) -> Value | None:
    x_old = m.values["x"]
    src = m.new(upcast_source(m.graph, x_old))
    k = _trailing_axes(m, "axes2")
    hint = _prefix(m)
    y = m.root.outputs[0]
    scale = _param(b, m, "g" if "mul" in m.nodes else None, y, k, hint)
    if scale is None:
        return None
    attrs = {"axis": -k, "epsilon": _eps(m), "stash_type": _stash(x_old.ttype.dtype)}
    return b.op("RMSNormalization", [src, scale], attrs, name=f"{hint}/RMSNormalization")


# ---- absorption of scale, bias and casts ------------------------------------------------------------


def _norm_node(m: Match):
    return m.nodes["ln"]


def _norm_rank(node) -> int:
    rank = len(node.outputs[0].ttype.shape)
    axis = node.attrs.axis + rank if node.attrs.axis < 0 else node.attrs.axis
    return rank - axis


def _over_normalized_dims(m: Match, cname: str) -> bool:
    """The constant broadcasts over the node's normalized dims only, without growing the output."""
    y = _norm_node(m).outputs[0]
    if not isinstance(y.type, TensorType) or y.type.shape is None:
        return False
    return const_over_norm(m.consts[cname], y, _norm_rank(_norm_node(m))) and same_shape(m.root.outputs[0], y)


def _trailing(b: GraphBuilder, v: Value, k: int, hint: str) -> Value:
    """v reshaped to its last k dims when it has more (the leading ones are 1 here)."""
    shape = v.ttype.shape
    if shape is None or len(shape) <= k or not all(isinstance(d, int) for d in shape[-k:]):
        return v
    target = b.add_constant(np.array(shape[-k:], dtype=np.int64), f"{hint}/shape")
    return b.op("Reshape", [v, target], name=f"{hint}/Reshape")


def _absorb_scale(m: Match, b: GraphBuilder) -> Value:
    node = _norm_node(m)
    k = _norm_rank(node)
    g = m.value("g")
    hint = node.name
    ins = [m.new(v) for v in node.inputs]
    ins[1] = _trailing(b, b.op("Mul", [ins[1], g], name=f"{hint}/scale"), k, f"{hint}/scale")
    if len(ins) > 2 and ins[2] is not None:
        ins[2] = _trailing(b, b.op("Mul", [ins[2], g], name=f"{hint}/bias"), k, f"{hint}/bias")
    return b.add_node(node.op, ins, node.attrs, name=node.name).outputs[0]


def _absorb_bias(m: Match, b: GraphBuilder) -> Value:
    node = _norm_node(m)
    k = _norm_rank(node)
    c = m.value("c")
    hint = node.name
    ins = [m.new(v) for v in node.inputs]
    bias = c if len(ins) < 3 or ins[2] is None else b.op("Add", [ins[2], c], name=f"{hint}/bias")
    ins = [ins[0], ins[1], _trailing(b, bias, k, f"{hint}/bias")]
    return b.add_node(node.op, ins, node.attrs, name=node.name).outputs[0]


def _cast_exact(m: Match) -> bool:
    """cast(rms(x, s), T): T is a float type and s is a constant that T holds exactly."""
    to = DType.from_onnx(m.root.attrs.to)
    s = m.consts["s"]
    if not to.is_float or not is_float_data(s):
        return False
    with np.errstate(all="ignore"):
        back = s.astype(to.numpy).astype(s.dtype)
    return bool(np.array_equal(back, s))


def _absorb_cast(m: Match, b: GraphBuilder) -> Value:
    node = _norm_node(m)
    s = b.op("Cast", [m.value("s")], {"to": m.root.attrs.to}, name=f"{node.name}/scale")
    return b.add_node(node.op, [m.value("x"), s], node.attrs, name=node.name).outputs[0]


# ---- rules ---------------------------------------------------------------------------------------

LN_TAILS = frozenset({"", "mul", "add", "mul_add", "cast", "cast_mul", "cast_add", "cast_mul_add"})
RMS_TAILS = frozenset({"", "mul", "cast", "cast_mul"})
_TAIL_TEXT = {
    "": "",
    "mul": " * g",
    "add": " + c",
    "mul_add": " * g + c",
    "cast": " as T",
    "cast_mul": " as T * g",
    "cast_add": " as T + c",
    "cast_mul_add": " as T * g + c",
}
_TAIL_ARGS = {
    "": "",
    "mul": ", g",
    "add": ", 1, c",
    "mul_add": ", g, c",
    "cast": ", 1: T",
    "cast_mul": ", g: T",
    "cast_add": ", 1, c: T",
    "cast_mul_add": ", g, c: T",
}


def _with_tail(core: Pattern, tail: str) -> Pattern:
    p = core
    if "cast" in tail:
        p = Op("Cast", p, name="cast")
    if "mul" in tail:
        p = Op("Mul", p, Const("g"), name="mul")
    if "add" in tail:
        p = Op("Add", p, Const("c"), name="add")
    return p


def _ln_rules() -> list[Rule]:
    x = Var("x")
    mean = Op("ReduceMean", x, Const("axes1"), name="mean")
    d = Op("Sub", x, mean, name="d", shared=True)  # read by the square and by the division
    pred = with_interior_check(_core_pred(("mean", "var"), ("axes1", "axes2"), LN_TAILS, ln=True))
    rules = []
    for tail in ("cast_mul_add", "cast_mul", "cast_add", "cast", "mul_add", "mul", "add", ""):
        for sq_name, sq in _squares(d):
            for n_name, norm in _normalizations(d, _var_eps(sq)):
                rules.append(
                    Rule(
                        f"d = x - mean(x); d {n_name}(mean(d{sq_name}) + eps){_TAIL_TEXT[tail]}"
                        f" -> layernorm(x{_TAIL_ARGS[tail]})",
                        _with_tail(norm, tail),
                        _build_ln,
                        predicate=pred,
                    )
                )
    return rules


def _rms_rules() -> list[Rule]:
    if not HAS_RMS_NORMALIZATION:
        return []
    x = Var("x")
    pred = with_interior_check(_core_pred(("var",), ("axes2",), RMS_TAILS, ln=False))
    rules = []
    for tail in ("cast_mul", "mul", "cast", ""):
        for sq_name, sq in _squares(x):
            for n_name, norm in _normalizations(x, _var_eps(sq)):
                rules.append(
                    Rule(
                        f"x {n_name}(mean(x{sq_name}) + eps){_TAIL_TEXT[tail]} -> rmsnorm(x{_TAIL_ARGS[tail]})",
                        _with_tail(norm, tail),
                        _build_rms,
                        predicate=pred,
                    )
                )
    return rules


def _absorb_rules() -> list[Rule]:
    rules = []
    for op, n_in in (("LayerNormalization", 2), ("LayerNormalization", 3), ("RMSNormalization", 2)):
        if op == "RMSNormalization" and not HAS_RMS_NORMALIZATION:
            continue
        short = "ln" if op == "LayerNormalization" else "rms"
        args = (Var("x"), Var("s"), Var("b"))[:n_in]
        sig = f"{short}({', '.join(a.name for a in args)})"
        norm = Op(op, *args, name="ln")
        rules.append(
            Rule(
                f"{sig} * g -> {short}(x, s*g{', b*g' if n_in == 3 else ''}) (g over the normalized dims)",
                Op("Mul", norm, Const("g")),
                _absorb_scale,
                predicate=lambda m: _over_normalized_dims(m, "g"),
            )
        )
        if op == "LayerNormalization":
            rules.append(
                Rule(
                    f"{sig} + c -> ln(x, s, {'b + c' if n_in == 3 else 'c'}) (c over the normalized dims)",
                    Op("Add", norm, Const("c")),
                    _absorb_bias,
                    predicate=lambda m: _over_normalized_dims(m, "c"),
                )
            )
    if HAS_RMS_NORMALIZATION:
        rules.append(
            Rule(
                "cast(rms(x, s), T) -> rms(x, cast(s, T)) (s exact in T)",
                Op("Cast", Op("RMSNormalization", Var("x"), Const("s"), name="ln")),
                _absorb_cast,
                predicate=_cast_exact,
            )
        )
    return rules


LN_RULES: list[Rule] = _ln_rules()
RMS_RULES: list[Rule] = _rms_rules()
ABSORB_RULES: list[Rule] = _absorb_rules()
# LayerNorm first: its core also has the RMSNorm shape (of d = x - mean), and one node is better.
RULES: list[Rule] = LN_RULES + RMS_RULES + ABSORB_RULES


def fuse_layernorm(graph: Graph) -> Graph:
    ops = {n.op for n in graph.nodes if not n.domain}
    if not ops & {"ReduceMean", "LayerNormalization", "RMSNormalization"}:
        return graph  # no decomposed norm without a ReduceMean, nothing to absorb without a norm
    # LayerNorm near misses are looked for before rewriting: an RMSNorm rule may still fuse the
    # tail of a blocked LayerNorm (as rmsnorm(x - mean)), and the user should hear why not more.
    misses = near_misses(graph, LN_RULES, "decomposed LayerNorm")
    g = apply_until_stable(graph, RULES)
    misses += near_misses(g, RMS_RULES, "decomposed RMSNorm")
    return record_near_misses(g, misses)
