"""Property test: random small graphs, optimized (opt_level 2, verify=True), compute what the
unoptimized graph computes (through the interpreter).

The generator strings together elementwise unary/binary ops (with every broadcasting form a
constant or another value can take: scalar, per-channel, last-dim, full, growing), MatMul, Gemm
and Conv with constant weights, BatchNormalization, Reshape, Transpose, reductions, Softmax,
Concat and Slice, on random shapes, and sometimes exposes an intermediate as a second output (so
that fusions meet values with other readers).
"""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import graphc
from graphc.ir.builder import GraphBuilder
from graphc.ir.graph import Value
from graphc.ir.types import DType, TensorType
from graphc.ir.verify import verify_graph
from graphc.passes import OptimizeOptions, optimize

F32 = DType.float32
MAX_OPS = 8
UNARY = ["Relu", "Sigmoid", "Tanh", "Neg", "Abs", "LeakyRelu", "HardSwish", "Gelu", "Erf", "Sin", "Clip", "Cast"]
BINARY = ["Add", "Sub", "Mul", "Div", "Max", "Min"]
KINDS = [
    "block",
    "block",
    "block",
    "unary",
    "binary_const",
    "binary_const",
    "binary_value",
    "affine",
    "affine",
    "matmul",
    "gemm",
    "conv",
    "conv",
    "bn",
    "reshape",
    "transpose",
    "reduce",
    "softmax",
    "concat",
    "slice",
]


class _Gen:
    def __init__(self, data, rng: np.random.Generator):
        self.data = data
        self.rng = rng
        self.b = GraphBuilder("prop", opset=21)

    def draw(self, strategy):
        return self.data.draw(strategy)

    def const(self, shape, low=-1.0, high=1.0) -> Value:
        return self.b.add_constant(self.rng.uniform(low, high, shape).astype(np.float32), "c")

    def ints(self, values) -> Value:
        return self.b.add_constant(np.array(values, dtype=np.int64), "i")

    def op(self, op: str, inputs, attrs=None) -> Value:
        return self.b.op(op, inputs, attrs)

    # ---- one random op on value v -------------------------------------------------------------

    def apply(self, kind: str, v: Value, pool: list[Value]) -> Value | None:
        shape = v.ttype.static_shape
        rank = len(shape)
        return getattr(self, f"_{kind}")(v, shape, rank, pool)

    def _unary(self, v, shape, rank, pool):
        op = self.draw(st.sampled_from(UNARY))
        if op == "LeakyRelu":
            return self.op(op, [v], {"alpha": 0.1})
        if op == "Clip":
            return self.op(op, [v, self.b.add_constant(np.float32(-0.5)), self.b.add_constant(np.float32(6.0))])
        if op == "Cast":  # a round trip through float64 is exact
            return self.op("Cast", [self.op("Cast", [v], {"to": DType.float64.value})], {"to": F32.value})
        return self.op(op, [v])

    def _const_shape(self, shape, rank) -> tuple[int, ...]:
        forms = ["scalar", "one", "last", "full"]
        if rank >= 2:
            forms += ["channel", "channel_keep"]
        forms.append("grow")
        form = self.draw(st.sampled_from(forms))
        if form == "scalar":
            return ()
        if form == "one":
            return (1,)
        if form == "last":
            return (shape[-1],)
        if form == "channel":
            return (shape[1],) + (1,) * (rank - 2)
        if form == "channel_keep":
            return (1, shape[1]) + (1,) * (rank - 2)
        if form == "grow":
            return (2,) + tuple(shape)
        return tuple(shape)

    def _binary_const(self, v, shape, rank, pool):
        op = self.draw(st.sampled_from(BINARY))
        c = (
            self.const(self._const_shape(shape, rank), 0.5, 2.0)
            if op == "Div"
            else self.const(self._const_shape(shape, rank))
        )
        if op != "Div" and self.draw(st.booleans()):
            return self.op(op, [c, v])
        return self.op(op, [v, c])

    def _block(self, v, shape, rank, pool):
        """An anchor and a tail of what folding and fusion look for after one."""
        anchor = "conv" if rank == 4 else self.draw(st.sampled_from(["matmul", "gemm"] if rank == 2 else ["matmul"]))
        y = self.apply(anchor, v, pool)
        if y is None:
            return None
        for _ in range(self.draw(st.integers(0, 3))):
            kind = self.draw(
                st.sampled_from(["affine", "affine", "bn", "unary", "binary_value", "binary_const", "reshape"])
            )
            pool.append(y)
            y = self.apply(kind, y, pool) or y
        return y

    def _affine(self, v, shape, rank, pool):
        """A scale or shift along one axis (the channel axis of a conv, the last of a matmul)."""
        op = self.draw(st.sampled_from(["Mul", "Div", "Add", "Sub"]))
        axis = self.draw(st.sampled_from(sorted({1 % rank, rank - 1})))
        cshape = [1] * (rank - axis) if self.draw(st.booleans()) else [1] * rank
        cshape[-(rank - axis)] = shape[axis]
        c = self.const(tuple(cshape), 0.5, 2.0) if op == "Div" else self.const(tuple(cshape))
        return self.op(op, [v, c])

    def _binary_value(self, v, shape, rank, pool):
        others = [w for w in pool if _broadcastable(w.ttype.static_shape, shape)]
        w = self.draw(st.sampled_from(others))
        op = self.draw(st.sampled_from(["Add", "Sub", "Mul", "Max"]))
        return self.op(op, [v, w])

    def _matmul(self, v, shape, rank, pool):
        n = self.draw(st.integers(1, 5))
        w = self.const((shape[-1], n))
        y = self.op("MatMul", [v, w])
        if self.draw(st.booleans()):
            y = self.op("Add", [y, self.const((n,))])
        return y

    def _gemm(self, v, shape, rank, pool):
        if rank != 2:
            return None
        m, k = shape
        n = self.draw(st.integers(1, 5))
        trans_b = self.draw(st.sampled_from([0, 1]))
        ins = [v, self.const((n, k) if trans_b else (k, n))]
        c = self.draw(st.sampled_from([None, (n,), (1, n), (m, n), ()]))
        if c is not None:
            ins.append(self.const(c))
        alpha, beta = self.draw(st.sampled_from([(1.0, 1.0), (0.5, 2.0), (1.0, 0.0)]))
        return self.op("Gemm", ins, {"transB": trans_b, "alpha": alpha, "beta": beta})

    def _conv(self, v, shape, rank, pool):
        if rank != 4:
            return None
        cin = shape[1]
        cout = self.draw(st.integers(1, 4))
        group = 1
        if self.draw(st.booleans()):
            group, cout = cin, cin  # depthwise
        k = self.draw(st.sampled_from([1, 3]))
        ins = [v, self.const((cout, cin // group, k, k))]
        if self.draw(st.booleans()):
            ins.append(self.const((cout,)))
        p = k // 2
        return self.op("Conv", ins, {"pads": [p, p, p, p], "group": group})

    def _bn(self, v, shape, rank, pool):
        if rank < 2:
            return None
        c = shape[1]
        params = [self.const((c,), 0.5, 1.5), self.const((c,)), self.const((c,), -0.2, 0.2), self.const((c,), 0.5, 2.0)]
        return self.op("BatchNormalization", [v, *params], {"epsilon": 1e-3})

    def _reshape(self, v, shape, rank, pool):
        form = self.draw(st.sampled_from(["merge_last", "merge_first", "lead"]))
        if rank < 2 or form == "lead":
            return self.op("Reshape", [v, self.ints([1, *shape])])
        if form == "merge_first":
            return self.op("Reshape", [v, self.ints([shape[0] * shape[1], *shape[2:]])])
        return self.op("Reshape", [v, self.ints([*shape[:-2], shape[-2] * shape[-1]])])

    def _transpose(self, v, shape, rank, pool):
        perm = self.draw(st.permutations(list(range(rank))))
        return self.op("Transpose", [v], {"perm": list(perm)})

    def _reduce(self, v, shape, rank, pool):
        op = self.draw(st.sampled_from(["ReduceSum", "ReduceMean", "ReduceMax"]))
        axis = self.draw(st.integers(0, rank - 1))
        keep = self.draw(st.sampled_from([0, 1])) if rank > 1 else 1
        return self.op(op, [v, self.ints([axis])], {"keepdims": keep})

    def _softmax(self, v, shape, rank, pool):
        return self.op("Softmax", [v], {"axis": self.draw(st.integers(-rank, rank - 1))})

    def _concat(self, v, shape, rank, pool):
        same = [w for w in pool if w.ttype.static_shape == shape]
        w = self.draw(st.sampled_from(same))
        return self.op("Concat", [v, w], {"axis": self.draw(st.integers(0, rank - 1))})

    def _slice(self, v, shape, rank, pool):
        axis = self.draw(st.integers(0, rank - 1))
        end = max(1, shape[axis] // 2)
        return self.op("Slice", [v, self.ints([0]), self.ints([end]), self.ints([axis])])


def _broadcastable(a, b) -> bool:
    try:
        np.broadcast_shapes(a, b)
    except ValueError:
        return False
    return True


def _build(data):
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    gen = _Gen(data, rng)
    rank = data.draw(st.sampled_from([2, 3, 4, 4]))
    shape = tuple(data.draw(st.integers(1, 5)) for _ in range(rank))
    x = gen.b.add_input("x", TensorType(F32, shape))
    pool = [x]
    for _ in range(data.draw(st.integers(1, MAX_OPS))):
        # Mostly the newest value: chains (conv -> bn -> relu -> add) are what the passes look for.
        v = pool[-1] if data.draw(st.integers(0, 3)) else data.draw(st.sampled_from(pool))
        if v.ttype.numel > 2000:
            continue
        out = gen.apply(data.draw(st.sampled_from(KINDS)), v, pool)
        if out is not None:
            pool.append(out)
    outputs = [pool[-1]]
    if len(pool) > 2 and data.draw(st.booleans()):
        extra = data.draw(st.sampled_from(pool[1:-1]))
        outputs.append(extra)
    gen.b.set_outputs(outputs)
    return gen.b.build(), {"x": rng.standard_normal(shape).astype(np.float32)}


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.data())
def test_optimized_graph_computes_the_same(data) -> None:
    graph, feeds = _build(data)
    optimized = optimize(graph, OptimizeOptions(opt_level=2, verify=True)).graph
    verify_graph(optimized)
    want = graphc.interpret(graph, feeds)
    got = graphc.interpret(optimized, feeds)
    assert list(got) == list(want)
    for k, w in want.items():
        g = got[k]
        assert g.dtype == w.dtype and g.shape == w.shape, k
        scale = max(1.0, float(np.abs(w).max()) if w.size else 1.0)
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5 * scale, err_msg=f"{k}\n{graph}\n{optimized}")
