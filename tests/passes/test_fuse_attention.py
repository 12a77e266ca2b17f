"""fuse_attention: Softmax(Q @ K^T * scale + mask) @ V becomes one Attention node."""

from __future__ import annotations

import math

import numpy as np
import pytest
from onnx import TensorProto, helper

import graphc
import models
from graphc.ir.builder import GraphBuilder
from graphc.ir.graph import Graph
from graphc.ir.verify import verify_graph
from graphc.ops.internal import INTERNAL_DOMAIN
from graphc.passes import OptimizeOptions, optimize, pipeline
from graphc.passes.fuse_attention import fuse_attention
from tests.helpers import OnnxNet

RNG = np.random.default_rng(2)


def _stages():
    """The default pipeline up to (not including) epilogue and elementwise fusion, which would
    fold the nodes these tests count into Fused nodes."""
    return [s for s in pipeline.stages() if s.name not in ("fuse_epilogues", "fuse_elementwise")]


B, S, H, D = 2, 6, 3, 4  # batch, seq, heads, head_dim
HID = H * D


class _Net(OnnxNet):
    prefix = "attn"

    def model(self, outputs: list[str], out_shape=None):
        elem = TensorProto.FLOAT if out_shape else TensorProto.UNDEFINED
        return self.make([helper.make_tensor_value_info(o, elem, out_shape) for o in outputs], infer=True)


def _heads(net: _Net, x: str, name: str, seq: int = S) -> str:
    """x [B, seq, HID] @ W + b -> Reshape [B, seq, H, D] (not transposed yet)."""
    w = net.c(RNG.normal(0, HID**-0.5, (HID, HID)))
    y = net.op("Add", net.op("MatMul", x, w), net.c(RNG.normal(0, 0.1, HID)))
    return net.op("Reshape", y, net.c([0, 0, H, D], np.int64))


def _attention_model(
    *,
    kt="perm0231",
    scale="mul_scores",
    mask=None,
    out="merge",
    prob_output=False,
    kv_seq=S,
    softcap=None,
    safe=None,
):
    """A self- (or cross-) attention block over inputs x [B, S, HID] (and y [B, kv_seq, HID])."""
    net = _Net()
    x = net.input("x", TensorProto.FLOAT, [B, S, HID])
    y = x if kv_seq == S else net.input("y", TensorProto.FLOAT, [B, kv_seq, HID])
    q = _heads(net, x, "q")
    k = _heads(net, y, "k", kv_seq)
    v = _heads(net, y, "v", kv_seq)
    c = 1.0 / math.sqrt(D)
    if scale == "mul_q_reshaped":
        q = net.op("Mul", q, net.c(c))
    q = net.op("Transpose", q, perm=[0, 2, 1, 3])
    if scale == "mul_q":
        q = net.op("Mul", net.c(c), q)
    if scale == "sqrt_q_and_k":
        q = net.op("Mul", q, net.c(math.sqrt(c)))
        k = net.op("Mul", k, net.c(math.sqrt(c)))
    if kt == "perm0231":
        kt_v = net.op("Transpose", k, perm=[0, 2, 3, 1])
    else:  # "two": (0,2,1,3) then a swap of the last two dims
        kt_v = net.op("Transpose", net.op("Transpose", k, perm=[0, 2, 1, 3]), perm=[0, 1, 3, 2])
    s = net.op("MatMul", q, kt_v)
    if scale == "mul_scores":
        s = net.op("Mul", s, net.c(c))
    elif scale == "div_scores":
        s = net.op("Div", s, net.c(math.sqrt(D)))
    if softcap == "before_mask":
        s = net.op("Mul", net.op("Tanh", net.op("Div", s, net.c(5.0))), net.c(5.0))
    if mask in ("additive", "where_add"):
        am = net.input("mask", TensorProto.INT64, [B, kv_seq])
        m = net.op("Unsqueeze", am, net.c([1, 2], np.int64))
        m = net.op("Mul", net.op("Sub", net.c(1.0), net.op("Cast", m, to=TensorProto.FLOAT)), net.c(-10000.0))
        if mask == "where_add":
            cond = net.input("keep", TensorProto.BOOL, [1, 1, S, kv_seq])
            s = net.op("Where", cond, s, net.c(-np.inf))
        s = net.op("Add", s, m)
    elif mask in ("where_inf", "where_min"):
        cond = net.input("keep", TensorProto.BOOL, [1, 1, S, kv_seq])
        fill = -np.inf if mask == "where_inf" else np.finfo(np.float32).min
        s = net.op("Where", cond, s, net.c(fill))
    elif mask == "where_inverted":
        cond = net.input("drop", TensorProto.BOOL, [B, 1, 1, kv_seq])
        s = net.op("Where", cond, net.c(-np.inf), s)
    elif mask == "additive_col":  # [B, 1, S, 1]: broadcast along the keys
        m = net.input("fmask", TensorProto.FLOAT, [B, 1, S, 1])
        s = net.op("Add", m, s)
    elif mask in ("hf_padding", "hf_causal", "hf_causal_const"):
        # transformers' masks: Where(keep, 0, finfo.min) added to the scores, keep = a constant
        # (all True, or causal) & the padding mask made from the int attention_mask input.
        tril = np.tril(np.ones((S, kv_seq), bool))[None, None]
        const = tril if mask != "hf_padding" else np.ones((1, 1, S, 1), bool)
        if mask == "hf_causal_const":
            m = net.c(np.where(tril, 0.0, -np.inf))
        else:
            am = net.input("mask", TensorProto.INT64, [B, kv_seq])
            pad = net.op("Unsqueeze", net.op("Cast", am, to=TensorProto.BOOL), net.c([1, 2], np.int64))
            keep = net.op("And", net.c(const, np.bool_), pad)
            m = net.op("Where", keep, net.c(0.0), net.c(np.finfo(np.float32).min))
        s = net.op("Add", s, m)
    elif mask == "scaled_after":
        m = net.input("fmask", TensorProto.FLOAT, [B, 1, 1, kv_seq])
        s = net.op("Mul", net.op("Add", s, m), net.c(0.5))
    if mask == "shift":  # a constant added to every score: softmax ignores it
        s = net.op("Add", s, net.c(0.5))
    if mask == "float_input":  # ONNX Attention's own float mask, then its "safe softmax" below
        s = net.op("Add", s, net.input("fmask", TensorProto.FLOAT, [S, kv_seq]))
    if softcap == "after_mask":
        s = net.op("Mul", net.op("Tanh", net.op("Mul", s, net.c(0.2))), net.c(5.0))
    p = net.op("Softmax", s, axis=-1)
    if safe == "const":  # Where(dead rows, 0, P) with no dead row
        p = net.op("Where", net.c(np.zeros((S, 1), bool), np.bool_), net.c(0.0), p)
    elif safe == "row_max":  # ONNX's Attention function: dead = ReduceMax(mask, -1) == -inf
        row_max = net.op("ReduceMax", "fmask", net.c([-1], np.int64), keepdims=1)
        dead = net.op("Equal", row_max, net.c(-np.inf))
        p = net.op("Where", dead, net.c(0.0), p)
    o = net.op("MatMul", p, net.op("Transpose", v, perm=[0, 2, 1, 3]))
    if out == "merge":
        o = net.op("Reshape", net.op("Transpose", o, perm=[0, 2, 1, 3]), net.c([0, 0, HID], np.int64))
    elif out == "merge2d":
        o = net.op("Reshape", net.op("Transpose", o, perm=[0, 2, 1, 3]), net.c([-1, HID], np.int64))
    elif out == "relu4d":  # the 4-D result read directly
        o = net.op("Relu", o)
    outputs = [o, p] if prob_output else [o]
    return net.model(outputs)


def _feeds(model, kv_seq=S) -> dict[str, np.ndarray]:
    feeds = {}
    for i in model.graph.input:
        name = i.name
        if name in ("x", "y"):
            feeds[name] = RNG.normal(0, 1, (B, S if name == "x" else kv_seq, HID)).astype(np.float32)
        elif name == "mask":
            m = np.ones((B, kv_seq), np.int64)
            m[1, kv_seq - 2 :] = 0
            feeds[name] = m
        elif name == "keep":  # causal: every row keeps its diagonal
            feeds[name] = np.tril(np.ones((S, kv_seq), bool))[None, None]
        elif name == "drop":
            d = np.zeros((B, 1, 1, kv_seq), bool)
            d[0, ..., -1] = True
            feeds[name] = d
        elif name == "fmask":
            shape = [dim.dim_value for dim in i.type.tensor_type.shape.dim]
            feeds[name] = RNG.normal(0, 1, shape).astype(np.float32)
    return feeds


def _optimize(graph: Graph) -> Graph:
    g = optimize(graph, OptimizeOptions(opt_level=2, verify=True), stages=_stages()).graph
    verify_graph(g)
    return g


def _check_same(g0: Graph, g1: Graph, feeds) -> None:
    a, b = graphc.interpret(g0, feeds), graphc.interpret(g1, feeds)
    for k in a:
        np.testing.assert_allclose(b[k], a[k], rtol=1e-5, atol=1e-5, err_msg=k)


def _attention_node(g: Graph):
    nodes = [n for n in g.nodes if n.op == "Attention"]
    assert len(nodes) == 1, g.op_counts()
    return nodes[0]


@pytest.mark.parametrize("kt", ["perm0231", "two"])
@pytest.mark.parametrize("scale", ["mul_scores", "div_scores", "mul_q", "mul_q_reshaped", "sqrt_q_and_k", "none"])
def test_scale_and_key_transpose_forms(kt, scale):
    model = _attention_model(kt=kt, scale=scale)
    g0 = graphc.load_onnx(model)
    g1 = _optimize(g0)
    node = _attention_node(g1)
    assert node.attrs.scale == pytest.approx(1.0 if scale == "none" else 1.0 / math.sqrt(D), rel=1e-6)
    assert node.attrs.q_num_heads == H and node.attrs.kv_num_heads == H
    assert node.inputs[0].ttype.shape == (B, S, HID)  # the 3-D form: the head split is gone
    counts = g1.op_counts()
    assert "Transpose" not in counts and "Softmax" not in counts
    assert counts.get("Reshape", 0) == 0  # [B, S, H, D] splits and the merge all collapsed
    _check_same(g0, g1, _feeds(model))


@pytest.mark.parametrize("mask", ["additive", "where_inf", "where_min", "where_inverted", "where_add", "additive_col"])
def test_mask_forms(mask):
    model = _attention_model(mask=mask)
    g0 = graphc.load_onnx(model)
    g1 = _optimize(g0)
    node = _attention_node(g1)
    m = node.inputs[3]
    assert m is not None
    if mask in ("where_inf", "where_min", "where_inverted"):
        assert m.ttype.dtype.name == "bool"
    else:
        assert m.ttype.dtype.name == "float32"
    assert m.ttype.shape[-1] == S  # never a broadcast key axis (Attention would pad it)
    assert node.attrs.is_causal == 0
    _check_same(g0, g1, _feeds(model))


@pytest.mark.parametrize(
    ("mask", "causal", "mask_shape"),
    [("hf_padding", 0, (B, 1, 1, S)), ("hf_causal", 1, (B, 1, 1, S)), ("hf_causal_const", 1, None)],
)
def test_masks_that_only_mask_become_boolean(mask, causal, mask_shape):
    # Where(keep, 0, finfo.min) + scores masks exactly where keep is False: the padding term
    # becomes Attention's bool mask, an all-True constant term goes, a causal one is is_causal=1.
    # A row keep leaves no key is the mean of V (finfo.min makes it uniform): Attention's
    # masked_rows="mean", no node more; "zero" for a constant mask that leaves every row a key
    # (tests/passes/test_fuse_attention_padding.py).
    model = _attention_model(mask=mask)
    g0 = graphc.load_onnx(model)
    g1 = _optimize(g0)
    node = _attention_node(g1)
    assert node.attrs.is_causal == causal
    m = node.input(3)
    if mask_shape is None:
        assert m is None
    else:
        assert m.ttype.dtype.name == "bool" and m.ttype.shape == mask_shape
    assert node.attrs.masked_rows == ("zero" if mask_shape is None else "mean")
    assert "Where" not in g1.op_counts() and "And" not in g1.op_counts()
    _check_same(g0, g1, _feeds(model))


def test_no_mask_no_scale_input():
    g1 = _optimize(graphc.load_onnx(_attention_model(scale="none")))
    node = _attention_node(g1)
    assert len(node.inputs) == 3  # no attn_mask


@pytest.mark.parametrize("out", ["merge", "merge2d", "relu4d"])
def test_output_forms(out):
    model = _attention_model(out=out)
    g0 = graphc.load_onnx(model)
    g1 = _optimize(g0)
    _attention_node(g1)
    # A 4-D reader of P @ V keeps one Transpose back to (B, H, S, D); the merges lose theirs.
    assert g1.op_counts().get("Transpose", 0) == (1 if out == "relu4d" else 0)
    _check_same(g0, g1, _feeds(model))


def test_cross_attention():
    model = _attention_model(kv_seq=9, mask="additive")
    g0 = graphc.load_onnx(model)
    g1 = _optimize(g0)
    node = _attention_node(g1)
    assert node.inputs[1].ttype.shape == (B, 9, HID)
    _check_same(g0, g1, _feeds(model, kv_seq=9))


def _to_internal_matmul(graph: Graph, *, alpha_from_mul: bool = False) -> Graph:
    """What transpose elimination (and affine folding) do: MatMul(a, Transpose(t, swap last two))
    -> graphc.MatMul(a, t, trans_b=1); with alpha_from_mul a following Mul by a scalar goes into
    alpha."""
    b = GraphBuilder.like(graph)
    sub: dict[str, object] = {}

    def mv(v):
        return None if v is None else sub.get(v.name, b.values.get(v.name))

    skip = set()
    for node in graph.nodes:
        if node.name in skip:
            continue
        if node.op == "MatMul" and not node.domain:
            t = graph.producer(node.inputs[1].name)
            if t is not None and t.op == "Transpose" and tuple(t.attrs.perm) == (0, 1, 3, 2):
                alpha = 1.0
                out = node.outputs[0]
                users = graph.users(out.name)
                if alpha_from_mul and len(users) == 1 and users[0].op == "Mul":
                    c = graph.const(users[0].inputs[1].name)
                    if c is not None and c.size == 1:
                        alpha = float(c)
                        skip.add(users[0].name)
                        out = users[0].outputs[0]
                y = b.op(
                    "MatMul",
                    [mv(node.inputs[0]), mv(t.inputs[0])],
                    {"trans_b": 1, "alpha": alpha},
                    domain=INTERNAL_DOMAIN,
                )
                sub[out.name] = y
                continue
        new = b.copy_node(node, [mv(v) for v in node.inputs])
        for o, n in zip(node.outputs, new.outputs, strict=True):
            sub[o.name] = n
    b.set_outputs([mv(v) for v in graph.outputs], graph.output_names)
    from graphc.passes.dce import eliminate_dead_code

    return eliminate_dead_code(b.build())


@pytest.mark.parametrize("alpha", [False, True])
def test_internal_matmul_with_trans_b_and_alpha(alpha):
    model = _attention_model(kt="two", scale="mul_scores", mask="additive")
    g0 = graphc.load_onnx(model)
    gi = _to_internal_matmul(g0, alpha_from_mul=alpha)
    assert any(n.domain == INTERNAL_DOMAIN for n in gi.nodes)
    g1 = fuse_attention(gi)
    verify_graph(g1)
    node = _attention_node(g1)
    assert node.attrs.scale == pytest.approx(1.0 / math.sqrt(D), rel=1e-6)
    assert not any(n.domain == INTERNAL_DOMAIN for n in g1.nodes)
    _check_same(g0, g1, _feeds(model))


def test_four_d_inputs_use_the_4d_form():
    # Q, K, V arrive already as [B, H, S, D] (e.g. after a rotary embedding or a KV cache): 4-D
    # Attention, K given as K (its transpose is read through), GQA-style single KV head.
    net = _Net()
    q = net.input("q", TensorProto.FLOAT, [B, H, S, D])
    k = net.input("k", TensorProto.FLOAT, [B, 1, S, D])
    v = net.input("v", TensorProto.FLOAT, [B, 1, S, D])
    s = net.op("Div", net.op("MatMul", q, net.op("Transpose", k, perm=[0, 1, 3, 2])), net.c(2.0))
    o = net.op("MatMul", net.op("Softmax", s, axis=-1), v)
    g0 = graphc.load_onnx(net.model([o]))
    g1 = _optimize(g0)
    node = _attention_node(g1)
    assert g1.op_counts() == {"Attention": 1}
    assert [i.name for i in node.inputs] == ["q", "k", "v"]
    assert node.attrs.scale == 0.5 and node.attrs.q_num_heads is None
    feeds = {n: RNG.normal(0, 1, (B, H if n == "q" else 1, S, D)).astype(np.float32) for n in "qkv"}
    _check_same(g0, g1, feeds)


@pytest.mark.parametrize("safe", ["const", "row_max"])
def test_safe_softmax_where_goes(safe):
    # Zeroing the rows that attend nothing is what Attention does itself.
    model = _attention_model(mask="float_input", safe=safe)
    g0 = graphc.load_onnx(model)
    g1 = _optimize(g0)
    _attention_node(g1)
    assert "Where" not in g1.op_counts()
    feeds = _feeds(model)
    if safe == "row_max":
        feeds["fmask"][1, :] = -np.inf  # a dead row: zeros either way
    _check_same(g0, g1, feeds)


def test_softcap():
    model = _attention_model(softcap="before_mask", mask="additive")
    g0 = graphc.load_onnx(model)
    g1 = _optimize(g0)
    node = _attention_node(g1)
    assert node.attrs.softcap == pytest.approx(5.0)
    assert "Tanh" not in g1.op_counts()
    _check_same(g0, g1, _feeds(model))


def test_constant_shift_of_the_scores_goes():
    g1 = _optimize(graphc.load_onnx(_attention_model(mask="shift")))
    node = _attention_node(g1)
    assert len(node.inputs) == 3  # no mask left


@pytest.mark.parametrize(
    ("kwargs", "why"),
    [
        ({"prob_output": True}, "probabilities are also used"),
        ({"mask": "scaled_after"}, "comes after the mask"),
        ({"mask": "additive", "softcap": "after_mask"}, "softcap"),
    ],
)
def test_near_misses(kwargs, why):
    model = _attention_model(**kwargs)
    g0 = graphc.load_onnx(model)
    g1 = _optimize(g0)
    assert "Attention" not in g1.op_counts()
    misses = g1.meta.get("near_misses", [])
    assert any(why in m and "Softmax 'attn/Softmax" in m for m in misses), misses
    _check_same(g0, g1, _feeds(model))


def test_softmax_over_another_axis_is_left_alone():
    net = _Net()
    q = net.input("q", TensorProto.FLOAT, [B, H, S, D])
    k = net.input("k", TensorProto.FLOAT, [B, H, S, D])
    s = net.op("MatMul", q, net.op("Transpose", k, perm=[0, 1, 3, 2]))
    o = net.op("MatMul", net.op("Softmax", s, axis=2), k)
    g0 = graphc.load_onnx(net.model([o]))
    g1 = fuse_attention(g0)
    assert g1 is g0


def test_existing_attention_node_is_kept():
    net = _Net()
    ins = [net.input(n, TensorProto.FLOAT, [B, S, HID]) for n in "qkv"]
    o = net.op("Attention", *ins, q_num_heads=H, kv_num_heads=H)
    model = net.model([o], out_shape=[B, S, HID])
    model.opset_import[0].version = 23
    g0 = graphc.load_onnx(model)
    g1 = _optimize(g0)
    assert g1.op_counts() == {"Attention": 1}
    assert g1.nodes[0].attrs == g0.nodes[0].attrs


@pytest.mark.parametrize(
    ("name", "options"),
    [("bert", {}), ("bert", {"layernorm": "decomposed"}), ("vit", {}), ("vit", {"qkv": "fused"})],
)
def test_zoo_models(name, options):
    model = models.build(name, size="tiny", **options)
    feeds = models.sample_inputs(name, model, batch=2)
    dims = {"batch": 2, "seq": feeds["input_ids"].shape[1]} if name == "bert" else {"batch": 2}
    g0 = graphc.bind_shapes(graphc.load_onnx(model), dims)
    g1 = _optimize(g0)
    counts = g1.op_counts()
    assert counts.get("Attention") == 2 and "Softmax" not in counts
    assert counts.get("LayerNormalization") == 5 and counts.get("Gelu") == 2
    # vit keeps the patch embedding's flatten-transpose, which is not attention's.
    assert counts.get("Transpose", 0) == (1 if name == "vit" else 0), counts
    a, b = graphc.interpret(g0, feeds), graphc.interpret(g1, feeds)
    for k in a:
        np.testing.assert_allclose(b[k], a[k], rtol=1e-4, atol=1e-4 * float(np.abs(a[k]).max()))


def test_zoo_bert_symbolic_shapes():
    # Unbound batch and seq: the 3-D form still applies (reshapes use 0 = copy the dim).
    model = models.build("bert", size="tiny")
    g0 = graphc.load_onnx(model)
    g1 = _optimize(g0)
    assert g1.op_counts().get("Attention") == 2
    feeds = models.sample_inputs("bert", model, batch=2)
    a, b = graphc.interpret(g0, feeds), graphc.interpret(g1, feeds)
    for k in a:
        np.testing.assert_allclose(b[k], a[k], rtol=1e-4, atol=1e-4)
