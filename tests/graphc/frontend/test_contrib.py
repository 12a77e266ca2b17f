"""ONNX Runtime's contrib ops (com.microsoft) against ORT's CPU execution provider.

Each case builds a one-node model of the contrib op, runs it through ONNX Runtime (CPU EP, no
graph optimization) and through graphc (the converters of graphc/frontend/converters/contrib.py
then the interpreter), and compares every output the node asks for at fp32 tolerances. Shapes are
odd on purpose (batch 2 or 3, sequence 5 or 7, head sizes 8 and 12) so a mixed-up axis or head
split shows up.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import graphc
from graphc.errors import GraphcError, UnsupportedOpError
from helpers import INT8_EXACT_HI, INT8_EXACT_LO, assert_close, int8_weights, run_graphc, run_ort

MS = "com.microsoft"
F32 = TensorProto.FLOAT
RTOL, ATOL = 2e-5, 2e-5  # fp32 after one or two matmuls and a softmax


def ms_model(
    op: str,
    inputs: Mapping[str, np.ndarray],
    attrs: Mapping[str, Any] | None = None,
    *,
    initializers: Mapping[str, np.ndarray] | None = None,
    order: Sequence[str] | None = None,
    outputs: Mapping[str, int] | Sequence[tuple[str, int]] | None = None,
    domain: str = MS,
    opset: int = 17,
) -> onnx.ModelProto:
    """One com.microsoft node; `order` lists its inputs ("" for an omitted optional one),
    `outputs` names its outputs with their element types ("" to omit one)."""
    initializers = dict(initializers or {})
    outputs = list((outputs or {"y": F32}).items() if isinstance(outputs or {}, Mapping) else outputs)
    order = list(order) if order is not None else [*inputs, *initializers]
    node = helper.make_node(op, order, [k for k, _ in outputs], domain=domain, **(attrs or {}))
    g_in = [
        helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape) for k, v in inputs.items()
    ]
    # Outputs of the first input's rank with unknown dims (compare() puts in ORT's shapes).
    rank = len(next(iter(inputs.values())).shape)
    g_out = [helper.make_tensor_value_info(k, t, [f"{k}_{i}" for i in range(rank)]) for k, t in outputs if k]
    inits = [numpy_helper.from_array(np.asarray(v), k) for k, v in initializers.items()]
    graph = helper.make_graph([node], f"test_{op}", g_in, g_out, inits)
    opsets = [helper.make_opsetid("", opset), helper.make_opsetid(MS, 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 8
    return model


def compare(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray], *, rtol=RTOL, atol=ATOL, rows=None):
    """graphc's interpreter against ORT on every output; `rows` (a boolean (B, S) array) limits
    the comparison of the first output to the rows ORT defines."""
    expected = run_ort(model, feeds)
    # The outputs' shapes are ORT's (ONNX shape inference does not know com.microsoft ops).
    for vi in model.graph.output:
        vi.type.tensor_type.shape.CopyFrom(
            helper.make_tensor_type_proto(F32, expected[vi.name].shape).tensor_type.shape
        )
    actual = run_graphc(model, feeds)
    assert set(actual) == set(expected)
    for k in expected:
        a, e = actual[k], expected[k]
        if rows is not None and k == model.graph.output[0].name:
            assert a.shape == e.shape
            a, e = a[rows], e[rows]
        assert_close(a, e, rtol=rtol, atol=atol, what=f"{model.graph.node[0].op_type} output {k}")
    return actual


def rnd(shape, seed=0, scale=1.0, dtype=np.float32):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(dtype)


# ---- activations ----------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(3, 5, 7), (4, 9)])
def test_gelu_family(shape):
    x, b = rnd(shape, 1, 2.0), rnd(shape[-1:], 2)
    compare(ms_model("Gelu", {"x": x}), {"x": x})
    compare(ms_model("BiasGelu", {"x": x, "b": b}), {"x": x, "b": b})
    compare(ms_model("FastGelu", {"x": x}), {"x": x})
    compare(ms_model("FastGelu", {"x": x, "b": b}), {"x": x, "b": b})
    for alpha in (1.702, 1.0, -0.5):
        compare(ms_model("QuickGelu", {"x": x}, {"alpha": alpha}), {"x": x})


def test_bias_add_and_bias_split_gelu():
    """ORT has CUDA kernels only for these two: checked against their definitions in numpy."""
    x, b, s = rnd((2, 6, 10), 1), rnd((10,), 2), rnd((2, 6, 10), 3)
    m = ms_model("BiasAdd", {"x": x, "b": b, "s": s}, outputs={"y": F32})
    assert_close(run_graphc(m, {"x": x, "b": b, "s": s})["y"], x + b + s)
    m = ms_model("BiasSplitGelu", {"x": x, "b": b})
    h = x + b
    left, right = h[..., :5], h[..., 5:]
    erf = np.vectorize(math.erf)
    want = (left * 0.5 * right * (1 + erf(right / math.sqrt(2)))).astype(np.float32)
    assert_close(run_graphc(m, {"x": x, "b": b})["y"], want)


def test_gelu_becomes_graphc_gelu():
    """FastGelu with a bias is graphc's Add + Gelu(tanh), which the optimizer fuses."""
    x, b = rnd((2, 3, 8)), rnd((8,))
    g = graphc.load_onnx(ms_model("FastGelu", {"x": x}, initializers={"b": b}))
    assert [(n.domain, n.op) for n in g.nodes] == [("", "Add"), ("", "Gelu")]
    assert g.nodes[1].attrs.approximate == "tanh"


F16 = TensorProto.FLOAT16


@pytest.mark.parametrize(
    "op,extra",
    [
        ("SkipLayerNormalization", ["g", "b"]),
        ("SkipSimplifiedLayerNormalization", ["g"]),
        ("FastGelu", ["b"]),
        ("BiasGelu", ["b"]),
        ("Gelu", []),
        ("QuickGelu", []),
    ],
)
def test_float16_forms(op, extra):
    """float16 models (ORT's optimizer converts them so): within one float16 step of ORT."""
    x, s = rnd((2, 5, 12), 1, 2.0, np.float16), rnd((2, 5, 12), 2, 1.0, np.float16)
    params = {"g": rnd((12,), 3, 1.0, np.float16), "b": rnd((12,), 4, 1.0, np.float16)}
    feeds = {"x": x, "s": s} if op.startswith("Skip") else {"x": x}
    m = ms_model(op, feeds, initializers={k: params[k] for k in extra}, outputs={"y": F16})
    compare(m, feeds, rtol=2e-3, atol=4e-3)  # a float16 step at |y| ~ 4 is 4e-3


# ---- FusedConv, FusedGemm, FusedMatMul ------------------------------------------------------------

CONV_ACTIVATIONS = [
    ("", []),
    ("Relu", []),
    ("Tanh", []),
    ("Sigmoid", []),
    ("LeakyRelu", [0.13]),
    ("Clip", [-0.4, 0.7]),
    ("HardSigmoid", [0.3, 0.45]),
]


@pytest.mark.parametrize("activation,params", CONV_ACTIVATIONS)
@pytest.mark.parametrize("with_z", [False, True])
def test_fused_conv(activation, params, with_z):
    x, w, b = rnd((2, 3, 7, 6), 1), rnd((4, 3, 3, 2), 2, 0.5), rnd((4,), 3)
    attrs: dict[str, Any] = {"pads": [1, 0, 1, 1], "strides": [2, 1], "dilations": [1, 2]}
    if activation:
        attrs |= {"activation": activation, "activation_params": params} if params else {"activation": activation}
    inits = {"w": w, "b": b}
    feeds = {"x": x}
    order = ["x", "w", "b"]
    if with_z:
        z = rnd((2, 4, 4, 5), 4)
        feeds["z"] = z
        order.append("z")
    compare(ms_model("FusedConv", feeds, attrs, initializers=inits, order=order), feeds)


@pytest.mark.parametrize("activation,params", [("Relu", []), ("LeakyRelu", [0.2]), ("Sigmoid", [])])
def test_fused_gemm(activation, params):
    a, b, c = rnd((5, 7), 1), rnd((3, 7), 2), rnd((3,), 3)
    attrs = {"transB": 1, "alpha": 0.7, "beta": 1.3, "activation": activation}
    if params:
        attrs["activation_alpha"] = params[0]
    compare(ms_model("FusedGemm", {"a": a}, attrs, initializers={"b": b, "c": c}), {"a": a})


@pytest.mark.parametrize(
    "sa,sb,attrs",
    [
        ((2, 5, 7), (2, 7, 3), {}),
        ((2, 7, 5), (2, 7, 3), {"transA": 1, "alpha": 0.5}),
        ((2, 5, 7), (3, 7), {"transB": 1}),
        ((3, 2, 5, 7), (1, 2, 4, 7), {"transA": 0, "transB": 1, "alpha": 2.0}),
        ((5, 2, 7), (2, 7, 3), {"transBatchA": 1}),
        ((5, 2, 7), (7, 2, 3), {"transBatchA": 1, "transBatchB": 1, "alpha": -1.5}),
        ((7, 2, 5), (3, 2, 7), {"transBatchA": 1, "transA": 1, "transBatchB": 1, "transB": 1}),
        ((4, 3, 2, 5), (3, 2, 5, 6), {"transBatchA": 1}),
    ],
)
def test_fused_matmul(sa, sb, attrs):
    a, b = rnd(sa, 1), rnd(sb, 2)
    compare(ms_model("FusedMatMul", {"a": a, "b": b}, attrs), {"a": a, "b": b})


def test_fused_matmul_is_graphc_matmul():
    a, b = rnd((2, 5, 7)), rnd((2, 3, 7))
    g = graphc.load_onnx(ms_model("FusedMatMul", {"a": a, "b": b}, {"transB": 1, "alpha": 0.25}))
    (node,) = g.nodes
    assert (node.domain, node.op, node.attrs.trans_b, node.attrs.alpha) == ("graphc", "MatMul", 1, 0.25)


# ---- layer norms ----------------------------------------------------------------------------------


@pytest.mark.parametrize("beta,bias", [(False, False), (True, False), (True, True), (False, True)])
@pytest.mark.parametrize(
    "outs", [("y",), ("y", "mean", "inv_std", "sum"), ("y", "", "", "sum"), ("y", "mean", "inv_std")]
)
def test_skip_layer_norm(beta, bias, outs):
    x, s = rnd((2, 5, 12), 1, 2.0), rnd((2, 5, 12), 2)
    inits = {"gamma": rnd((12,), 3)}
    order = ["x", "s", "gamma", "beta" if beta else "", "bias" if bias else ""]
    if beta:
        inits["beta"] = rnd((12,), 4)
    if bias:
        inits["bias"] = rnd((12,), 5)
    while not order[-1]:
        order.pop()
    m = ms_model(
        "SkipLayerNormalization",
        {"x": x, "s": s},
        {"epsilon": 1e-5},
        initializers=inits,
        order=order,
        outputs=[(o, F32) for o in outs],
    )
    compare(m, {"x": x, "s": s})


def test_skip_layer_norm_is_graphc_layer_norm():
    x = rnd((2, 5, 12))
    m = ms_model("SkipLayerNormalization", {"x": x, "s": x}, initializers={"gamma": rnd((12,)), "beta": rnd((12,))})
    g = graphc.load_onnx(m)
    assert [n.op for n in g.nodes] == ["Add", "LayerNormalization"]


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("outs", [("y",), ("y", "", "inv_std", "sum"), ("y", "", "", "sum")])
def test_skip_simplified_layer_norm(bias, outs):
    x, s = rnd((3, 7, 8), 1, 2.0), rnd((3, 7, 8), 2)
    inits = {"gamma": rnd((8,), 3)} | ({"bias": rnd((8,), 5)} if bias else {})
    m = ms_model(
        "SkipSimplifiedLayerNormalization",
        {"x": x, "s": s},
        {"epsilon": 1e-6},
        initializers=inits,
        outputs=[(o, F32) for o in outs],
    )
    compare(m, {"x": x, "s": s})


@pytest.mark.parametrize("segments", [False, True])
@pytest.mark.parametrize("pos_ids", [False, True])
@pytest.mark.parametrize("with_mask", [True, False])
def test_embed_layer_norm(segments, pos_ids, with_mask):
    b, s, h, vocab = 3, 7, 12, 20
    rng = np.random.default_rng(0)
    feeds = {"ids": rng.integers(0, vocab, (b, s)).astype(np.int32)}
    mask = np.ones((b, s), np.int32)
    mask[1, 4:] = 0
    mask[2, 2:4] = 0  # a hole: ORT's mask_index counts the ones
    feeds["mask"] = mask
    inits = {"word": rnd((vocab, h), 1), "pos": rnd((16, h), 2), "gamma": rnd((h,), 4), "beta": rnd((h,), 5)}
    order = ["ids", "", "word", "pos", "", "gamma", "beta", "mask"]
    if segments:
        feeds["seg"] = rng.integers(0, 2, (b, s)).astype(np.int32)
        inits["segemb"] = rnd((2, h), 3)
        order[1], order[4] = "seg", "segemb"
    if pos_ids:
        feeds["pos_ids"] = rng.integers(0, 16, (b, s)).astype(np.int32)
        order.append("pos_ids")
    if not with_mask:  # mask_index is then all zeros
        del feeds["mask"]
        order[7] = ""
    m = ms_model(
        "EmbedLayerNormalization", feeds, {"epsilon": 1e-12}, initializers=inits, order=order,
        outputs={"y": F32, "mask_index": TensorProto.INT32, "sum": F32},
    )  # fmt: skip
    compare(m, feeds)


# ---- Attention ------------------------------------------------------------------------------------


def _mask(kind: str, b: int, s: int, t: int, rng) -> np.ndarray | None:
    lengths = np.array([t, max(1, t - 2), max(1, t - 4)][:b], np.int32)
    if kind == "none":
        return None
    if kind == "index":
        return lengths
    if kind == "index2":
        starts = np.array([0, 1, 2][:b], np.int32)
        return np.concatenate([lengths, starts]).astype(np.int32)
    raw = (np.arange(t)[None] < lengths[:, None]).astype(np.int32)
    if kind == "raw2":
        return raw
    if kind in ("raw3", "raw4"):
        m = (rng.random((b, s, t)) < 0.7).astype(np.int32) | np.eye(s, t, dtype=np.int32)[None]
        return m if kind == "raw3" else m[:, None]
    raise ValueError(kind)


@pytest.mark.parametrize("mask_kind", ["none", "index", "index2", "raw2", "raw3"])
@pytest.mark.parametrize("unidirectional", [0, 1])
@pytest.mark.parametrize("scale", [None, 0.3])
def test_attention(mask_kind, unidirectional, scale):
    b, s, hin, heads, hidden = 3, 5, 10, 2, 16
    rng = np.random.default_rng(1)
    feeds = {"x": rnd((b, s, hin), 1)}
    inits = {"w": rnd((hin, 3 * hidden), 2, 0.4), "bias": rnd((3 * hidden,), 3)}
    order = ["x", "w", "bias"]
    mask = _mask(mask_kind, b, s, s, rng)
    if mask is not None:
        feeds["mask"] = mask
        order.append("mask")
    attrs: dict[str, Any] = {"num_heads": heads, "unidirectional": unidirectional}
    if scale is not None:
        attrs["scale"] = scale
    compare(ms_model("Attention", feeds, attrs, initializers=inits, order=order), feeds)


def test_attention_qkv_sizes_bias_and_present():
    b, s, hin, heads = 2, 7, 9, 3
    sizes = [12, 12, 6]  # head 4 for Q/K, 2 for V
    feeds = {"x": rnd((b, s, hin), 1), "ab": rnd((b, heads, s, s), 4)}
    inits = {"w": rnd((hin, sum(sizes)), 2, 0.4), "bias": rnd((sum(sizes),), 3)}
    m = ms_model(
        "Attention", feeds, {"num_heads": heads, "qkv_hidden_sizes": sizes}, initializers=inits,
        order=["x", "w", "bias", "", "", "ab"],
    )  # fmt: skip
    compare(m, feeds)
    # present (2, B, N, T, H) with a past, and a raw mask over the total length
    sizes = [12, 12, 12]
    inits = {"w": rnd((hin, 36), 2, 0.4), "bias": rnd((36,), 3)}
    past = rnd((2, b, heads, 4, 4), 5)
    mask = np.ones((b, 4 + s), np.int32)
    mask[1, :2] = 0
    feeds = {"x": rnd((b, s, hin), 1), "mask": mask, "past": past}
    for uni in (0, 1):
        m = ms_model(
            "Attention", feeds, {"num_heads": heads, "unidirectional": uni}, initializers=inits,
            order=["x", "w", "bias", "mask", "past"], outputs={"y": F32, "present": F32},
        )  # fmt: skip
        compare(m, feeds)


def test_attention_runtime_weights_and_refusals():
    b, s, hin, heads = 2, 5, 8, 2
    feeds = {"x": rnd((b, s, hin), 1), "w": rnd((hin, 24), 2, 0.4)}
    compare(ms_model("Attention", feeds, {"num_heads": heads}), feeds)
    with pytest.raises(UnsupportedOpError, match="do_rotary"):
        graphc.load_onnx(ms_model("Attention", feeds, {"num_heads": heads, "do_rotary": 1}))
    bad = ms_model("Attention", feeds, {"num_heads": heads, "qkv_hidden_sizes": [8, 8, 9]})
    with pytest.raises(UnsupportedOpError, match="hidden sizes"):
        graphc.load_onnx(bad)


# ---- MultiHeadAttention ---------------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["separate", "packed_qkv", "packed_kv", "bnsh_kv"])
@pytest.mark.parametrize("mask_kind", ["none", "index", "raw2"])
def test_multi_head_attention(layout, mask_kind):
    """Every layout against ORT on the same Q, K, V; ORT's CPU EP has no packed forms, so those
    are compared with ORT's result on the unpacked tensors."""
    b, s, kv_len, heads, head = 2, 5, 7, 3, 4
    d = heads * head
    rng = np.random.default_rng(2)
    kv_len = s if layout == "packed_qkv" else kv_len
    q, k, v = rnd((b, s, d), 1), rnd((b, kv_len, d), 2), rnd((b, kv_len, d), 3)
    bias = rnd((3 * d,), 4) if layout == "separate" else None
    ref_feeds = {"q": q, "k": k, "v": v} | ({"bias": bias} if bias is not None else {})
    mask = _mask(mask_kind, b, s, kv_len, rng)
    extra = {"mask": mask} if mask is not None else {}
    ref_order = ["q", "k", "v", "bias" if bias is not None else ""] + (["mask"] if mask is not None else [])
    while not ref_order[-1]:
        ref_order.pop()
    ref = ms_model("MultiHeadAttention", ref_feeds | extra, {"num_heads": heads}, order=ref_order)
    expected = compare(ref, ref_feeds | extra)["y"]
    if layout == "separate":
        return
    split = lambda t: t.reshape(b, -1, heads, head)  # noqa: E731
    if layout == "packed_qkv":
        feeds, order = {"q": np.stack([split(q), split(k), split(v)], axis=3)}, ["q", "", "", ""]
    elif layout == "packed_kv":
        feeds, order = {"q": q, "k": np.stack([split(k), split(v)], axis=3)}, ["q", "k", "", ""]
    else:
        bnsh = lambda t: np.ascontiguousarray(split(t).transpose(0, 2, 1, 3))  # noqa: E731
        feeds, order = {"q": q, "k": bnsh(k), "v": bnsh(v)}, ["q", "k", "v", ""]
    order += ["mask"] if mask is not None else []
    while not order[-1]:
        order.pop()
    m = ms_model("MultiHeadAttention", feeds | extra, {"num_heads": heads}, order=order)
    m.graph.output[0].type.tensor_type.shape.CopyFrom(
        helper.make_tensor_type_proto(F32, expected.shape).tensor_type.shape
    )
    assert_close(run_graphc(m, feeds | extra)["y"], expected, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("unidirectional", [0, 1])
def test_multi_head_attention_past_bias_and_present(unidirectional):
    b, s, p, heads, head = 2, 3, 4, 2, 8
    d = heads * head
    feeds = {
        "q": rnd((b, s, d), 1),
        "k": rnd((b, s, d), 2),
        "v": rnd((b, s, d), 3),
        "ab": rnd((1, heads, s, p + s), 4),
        "pk": rnd((b, heads, p, head), 5),
        "pv": rnd((b, heads, p, head), 6),
    }
    m = ms_model(
        "MultiHeadAttention", feeds, {"num_heads": heads, "unidirectional": unidirectional, "scale": 0.2},
        order=["q", "k", "v", "", "", "ab", "pk", "pv"], outputs={"y": F32, "present_k": F32, "present_v": F32},
    )  # fmt: skip
    compare(m, feeds)


# ---- RotaryEmbedding, GroupQueryAttention ---------------------------------------------------------


def _caches(max_pos: int, half: int) -> tuple[np.ndarray, np.ndarray]:
    inv = 1.0 / (10000 ** (np.arange(half) / half))
    ang = np.arange(max_pos)[:, None] * inv[None]
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize("rank,rot", [(3, 0), (3, 4), (4, 0)])
@pytest.mark.parametrize("offset", [False, True])
def test_rotary_embedding(interleaved, rank, rot, offset):
    b, s, heads, head = 2, 5, 3, 8
    half = (rot or head) // 2
    cos, sin = _caches(16, half)
    x = rnd((b, s, heads * head), 1) if rank == 3 else rnd((b, heads, s, head), 1)
    pos = np.array([3], np.int64) if offset else np.random.default_rng(0).integers(0, 16, (b, s)).astype(np.int64)
    attrs = {"interleaved": interleaved}
    if rot:
        attrs |= {"rotary_embedding_dim": rot, "num_heads": heads}
    feeds = {"x": x, "pos": pos}
    compare(ms_model("RotaryEmbedding", feeds, attrs, initializers={"cos": cos, "sin": sin}), feeds)


def _gqa_feeds(b, s, heads, kv_heads, head, packed, lengths):
    feeds = {}
    if packed:
        feeds["q"] = rnd((b, s, (heads + 2 * kv_heads) * head), 1)
    else:
        feeds |= {"q": rnd((b, s, heads * head), 1), "k": rnd((b, s, kv_heads * head), 2)}
        feeds["v"] = rnd((b, s, kv_heads * head), 3)
    feeds["seqlens"] = (np.asarray(lengths, np.int32) - 1).astype(np.int32)
    feeds["total"] = np.array(s, np.int32)
    return feeds


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("kv_heads", [1, 2, 4])
@pytest.mark.parametrize("padded", [False, True])
def test_group_query_attention_prompt(packed, kv_heads, padded):
    b, s, heads, head = 2, 6, 4, 8
    lengths = [s, s - 2] if padded else [s, s]
    feeds = _gqa_feeds(b, s, heads, kv_heads, head, packed, lengths)
    order = ["q", "" if packed else "k", "" if packed else "v", "", "", "seqlens", "total"]
    m = ms_model(
        "GroupQueryAttention", feeds, {"num_heads": heads, "kv_num_heads": kv_heads}, order=order,
        outputs={"y": F32, "pk": F32, "pv": F32},
    )  # fmt: skip
    rows = np.arange(s)[None] < np.asarray(lengths)[:, None]  # ORT leaves padded query rows unspecified
    compare(m, feeds, rows=rows if padded else None)


@pytest.mark.parametrize(
    "attrs",
    [
        {"local_window_size": 1},
        {"local_window_size": 3},
        {"softcap": 1.5},
        {"scale": 0.1},
        {"do_rotary": 1},
        {"do_rotary": 1, "rotary_interleaved": 1},
    ],
)
def test_group_query_attention_options(attrs):
    b, s, heads, kv_heads, head = 2, 7, 4, 2, 16  # ORT's rotary wants a head size multiple of 16
    feeds = _gqa_feeds(b, s, heads, kv_heads, head, False, [s, s])
    order = ["q", "k", "v", "", "", "seqlens", "total"]
    inits = {}
    if attrs.get("do_rotary"):
        inits = dict(zip(("cos", "sin"), _caches(16, head // 2), strict=True))
        order += ["cos", "sin"]
    m = ms_model(
        "GroupQueryAttention", feeds, {"num_heads": heads, "kv_num_heads": kv_heads, **attrs}, order=order,
        initializers=inits,
    )  # fmt: skip
    compare(m, feeds)


def test_group_query_attention_refuses_a_kv_cache():
    b, s, heads, kv_heads, head = 1, 1, 2, 1, 4
    feeds = _gqa_feeds(b, s, heads, kv_heads, head, False, [4])
    feeds |= {"pk": rnd((b, kv_heads, 3, head)), "pv": rnd((b, kv_heads, 3, head))}
    m = ms_model(
        "GroupQueryAttention", feeds, {"num_heads": heads, "kv_num_heads": kv_heads},
        order=["q", "k", "v", "pk", "pv", "seqlens", "total"],
    )  # fmt: skip
    with pytest.raises(UnsupportedOpError, match="prompt phase"):
        graphc.load_onnx(m)


# ---- quantized matmuls ----------------------------------------------------------------------------


def _pack(q: np.ndarray, bits: int) -> np.ndarray:
    """Fields along the last axis into bytes, low bits first (MatMulNBits' layout)."""
    per = 8 // bits
    q = q.reshape(*q.shape[:-1], -1, per).astype(np.uint8)
    return np.bitwise_or.reduce(q << (np.arange(per, dtype=np.uint8) * bits), axis=-1).astype(np.uint8)


@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("zp_kind", ["none", "packed", "float"])
@pytest.mark.parametrize("k_dim", [32, 40])
def test_matmul_nbits(bits, zp_kind, k_dim):
    n, block = 6, 16
    k_blocks = -(-k_dim // block)
    rng = np.random.default_rng(bits)
    q = rng.integers(0, 1 << bits, (n, k_blocks, block))
    feeds = {"a": rnd((3, 5, k_dim), 1)}
    inits = {"b": _pack(q, bits), "scales": rnd((n * k_blocks,), 2, 0.1)}
    order = ["a", "b", "scales"]
    if zp_kind == "packed":
        zp = rng.integers(0, 1 << bits, (n, k_blocks))
        pad = (-k_blocks) % (8 // bits)
        inits["zp"] = _pack(np.pad(zp, ((0, 0), (0, pad))), bits)
        order.append("zp")
    elif zp_kind == "float":
        if bits == 8:
            pytest.skip("ORT's CPU MatMulNBits refuses 8-bit weights with float zero points")
        inits["zp"] = rnd((n * k_blocks,), 3, 2.0) + (1 << (bits - 1))
        order.append("zp")
    inits["bias"] = rnd((n,), 4)
    order += ["", "bias"] if len(order) == 4 else ["", "", "bias"]
    attrs = {"K": k_dim, "N": n, "bits": bits, "block_size": block}
    compare(ms_model("MatMulNBits", feeds, attrs, initializers=inits, order=order), feeds, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("b_dtype", [np.int8, np.uint8])
@pytest.mark.parametrize("per_column", [False, True])
@pytest.mark.parametrize("with_zp", [False, True])
def test_dynamic_quantize_matmul(b_dtype, per_column, with_zp):
    k, n = 9, 5
    rng = np.random.default_rng(3)
    info = np.iinfo(b_dtype)
    feeds = {"a": rnd((2, 3, k), 1, 2.0) + 0.5}
    inits = {
        # int8: 7-bit values, which ORT's u8 x s8 kernel sums exactly on every x86 CPU (helpers.py)
        "b": (
            rng.integers(INT8_EXACT_LO, INT8_EXACT_HI, (k, n))
            if b_dtype == np.int8
            else rng.integers(info.min, info.max + 1, (k, n))
        ).astype(b_dtype),
        "scale": (rnd((n,), 2, 0.01) ** 2 + 0.01) if per_column else np.array(0.02, np.float32),
    }
    order = ["a", "b", "scale"]
    if with_zp:
        inits["zp"] = rng.integers(info.min // 2, info.max // 2, (n,) if per_column else ()).astype(b_dtype)
        order.append("zp")
    inits["bias"] = rnd((n,), 4)
    order += ["bias"] if with_zp else ["", "bias"]
    m = ms_model("DynamicQuantizeMatMul", feeds, initializers=inits, order=order)
    compare(m, feeds, rtol=1e-4, atol=1e-4)


def test_matmul_integer_to_float():
    k, n = 7, 4
    rng = np.random.default_rng(4)
    feeds = {"a": rng.integers(0, 256, (3, k)).astype(np.uint8)}
    inits = {
        "b": int8_weights(rng, (k, n)),  # exact in ORT on every x86 CPU (helpers.py)
        "sa": np.array(0.05, np.float32),
        "sb": rnd((n,), 1, 0.01) ** 2 + 0.01,
        "za": np.array(120, np.uint8),
        "zb": rng.integers(-3, 3, (n,)).astype(np.int8),
        "bias": rnd((n,), 2),
    }
    m = ms_model("MatMulIntegerToFloat", feeds, initializers=inits, order=["a", "b", "sa", "sb", "za", "zb", "bias"])
    compare(m, feeds, rtol=1e-4, atol=1e-4)


# ---- the headline: a BERT optimized by ONNX Runtime's transformer optimizer -----------------------


def _nvrtc_ok() -> bool:
    try:
        from graphc.codegen.nvrtc import nvrtc_version

        nvrtc_version()
        return True
    except Exception:
        return False


def _torch_style_mask(model: onnx.ModelProto) -> onnx.ModelProto:
    """The zoo writes the mask's Unsqueeze as one node with axes [1, 2]; torch.onnx writes two
    single-axis Unsqueezes, which is the form ORT's attention fusion matches. Same values."""
    g = model.graph
    nodes = []
    for n in g.node:
        if n.op_type == "Unsqueeze" and n.name == "extended_mask/Unsqueeze":
            g.initializer.extend([numpy_helper.from_array(np.array([a], np.int64), f"mask_axis{a}") for a in (1, 2)])
            nodes.append(helper.make_node("Unsqueeze", [n.input[0], "mask_axis1"], ["mask_u1"], name="mask_u1"))
            nodes.append(helper.make_node("Unsqueeze", ["mask_u1", "mask_axis2"], list(n.output), name="mask_u2"))
        else:
            nodes.append(n)
    del g.node[:]
    g.node.extend(nodes)
    return model


def _ort_optimized_bert(tmp_path, variant: str, **build) -> onnx.ModelProto:
    pytest.importorskip("sympy", reason="ORT's transformer optimizer needs sympy for shape inference")
    from onnxruntime.transformers.fusion_options import FusionOptions
    from onnxruntime.transformers.optimizer import optimize_model

    from models import bert

    cfg = {**bert.PRESETS["tiny"], **build}
    src, dst = tmp_path / "bert.onnx", tmp_path / "bert.opt.onnx"
    onnx.save(_torch_style_mask(bert.build(**cfg)), src)
    options = FusionOptions("bert")
    if variant == "raw_mask_fast_gelu":
        options.use_raw_attention_mask(True)
        options.enable_gelu_approximation = True
    # opt_level=0: the optimizer's own fusions only (its ORT pass would import torch)
    opt = optimize_model(
        str(src), model_type="bert", num_heads=cfg["num_heads"], hidden_size=cfg["hidden_size"], opt_level=0,
        optimization_options=options,
    )  # fmt: skip
    opt.save_model_to_file(str(dst))  # save adds the com.microsoft opset import
    return onnx.load(dst)


@pytest.mark.parametrize(
    "variant,build,contrib_ops",
    [
        ("default", {}, {"Attention", "SkipLayerNormalization", "BiasGelu"}),
        ("raw_mask_fast_gelu", {"token_type_input": True}, {"Attention", "SkipLayerNormalization", "FastGelu"}),
    ],
)
def test_ort_optimized_bert(tmp_path, variant, build, contrib_ops):
    import models

    model = _ort_optimized_bert(tmp_path, variant, **build)
    ops = {n.op_type for n in model.graph.node if n.domain == MS}
    assert contrib_ops <= ops, f"ORT's optimizer wrote {sorted(ops)}"
    feeds = models.sample_inputs("bert", model, seed=3)
    assert feeds["attention_mask"].min() == 0  # some keys are padding, so the mask matters
    expected = run_ort(model, feeds)
    shapes = {"batch": feeds["input_ids"].shape[0], "seq": feeds["input_ids"].shape[1]}
    engine = graphc.compile(model, target="cpu", shapes=shapes)
    got = engine.run(feeds)
    for name, want in expected.items():
        err = np.abs(got[name] - want).max() / np.abs(want).max()
        assert err < 1e-4, f"{name}: max error {err:.2e} of the output scale"

    # The attention stays graphc's one Attention node per layer through the optimizer.
    from graphc.ir.shapes import bind_shapes
    from graphc.passes.manager import OptimizeOptions, optimize

    optimized = optimize(bind_shapes(graphc.load_onnx(model), shapes), OptimizeOptions()).graph
    n_attention = sum(1 for n in model.graph.node if n.op_type == "Attention")
    assert sum(1 for n in optimized.nodes if (n.domain, n.op) == ("", "Attention")) == n_attention
    assert not any(n.op in ("Softmax", "Split") for n in optimized.nodes)

    if _nvrtc_ok():
        cuda = graphc.compile(model, target="cuda", shapes=shapes, arch=["sm_90"], cache_dir=tmp_path / "cache")
        assert cuda.report["cuda"]["families"].get("attention", 0) >= 1


# ---- every converted form compiles for the CUDA target --------------------------------------------


def _cuda_cases() -> list[tuple[str, onnx.ModelProto, dict[str, np.ndarray]]]:
    x, b = rnd((2, 5, 8), 1), rnd((8,), 2)
    cos, sin = _caches(16, 8)
    rng = np.random.default_rng(0)
    gqa = _gqa_feeds(2, 6, 4, 2, 16, False, [6, 4])
    gqa_packed = _gqa_feeds(2, 6, 4, 2, 16, True, [6, 6])
    mha = {"q": rnd((2, 5, 12), 1), "k": rnd((2, 7, 12), 2), "v": rnd((2, 7, 12), 3)}
    att = {"x": rnd((2, 5, 16), 1), "m": np.array([[1] * 5, [1] * 3 + [0] * 2], np.int32)}
    ids = {"ids": rng.integers(0, 20, (2, 7)).astype(np.int32), "mask": np.ones((2, 7), np.int32)}
    q4 = rng.integers(0, 16, (6, 2, 16))
    return [
        ("BiasGelu", ms_model("BiasGelu", {"x": x}, initializers={"b": b}), {"x": x}),
        ("QuickGelu", ms_model("QuickGelu", {"x": x}), {"x": x}),
        (
            "SkipLayerNormalization",
            ms_model(
                "SkipLayerNormalization", {"x": x, "s": x}, initializers={"g": b, "be": b, "bi": b},
                outputs={"y": F32, "mean": F32, "inv_std": F32, "sum": F32},
            ),
            {"x": x, "s": x},
        ),
        (
            "SkipSimplifiedLayerNormalization",
            ms_model("SkipSimplifiedLayerNormalization", {"x": x, "s": x}, initializers={"g": b}),
            {"x": x, "s": x},
        ),
        (
            "FusedConv",
            ms_model(
                "FusedConv", {"x": rnd((2, 3, 7, 6))}, {"activation": "LeakyRelu", "activation_params": [0.1]},
                initializers={"w": rnd((4, 3, 3, 3)), "b": rnd((4,))},
            ),
            {"x": rnd((2, 3, 7, 6))},
        ),
        ("FusedMatMul", ms_model("FusedMatMul", {"a": rnd((2, 5, 7))}, {"transB": 1, "alpha": 0.5},
                                 initializers={"b": rnd((2, 3, 7))}), {"a": rnd((2, 5, 7))}),
        (
            "Attention",
            ms_model(
                "Attention", att, {"num_heads": 2, "unidirectional": 1},
                initializers={"w": rnd((16, 48)), "bias": rnd((48,))}, order=["x", "w", "bias", "m"],
                outputs={"y": F32, "present": F32},
            ),
            att,
        ),
        ("MultiHeadAttention", ms_model("MultiHeadAttention", mha, {"num_heads": 3},
                                        initializers={"bias": rnd((36,))}), mha),
        (
            "GroupQueryAttention",
            ms_model(
                "GroupQueryAttention", gqa, {"num_heads": 4, "kv_num_heads": 2},
                order=["q", "k", "v", "", "", "seqlens", "total"], outputs={"y": F32, "pk": F32, "pv": F32},
            ),
            gqa,
        ),
        (
            "GroupQueryAttention rotary packed",
            ms_model(
                "GroupQueryAttention", gqa_packed,
                {"num_heads": 4, "kv_num_heads": 2, "do_rotary": 1, "local_window_size": 3},
                order=["q", "", "", "", "", "seqlens", "total", "cos", "sin"], initializers={"cos": cos, "sin": sin},
            ),
            gqa_packed,
        ),
        (
            "MatMulNBits",
            ms_model("MatMulNBits", {"a": rnd((3, 32))}, {"K": 32, "N": 6, "bits": 4, "block_size": 16},
                     initializers={"b": _pack(q4, 4), "s": rnd((12,))}),
            {"a": rnd((3, 32))},
        ),
        (
            "DynamicQuantizeMatMul",
            ms_model("DynamicQuantizeMatMul", {"a": rnd((3, 9))},
                     initializers={"b": rng.integers(-128, 127, (9, 5)).astype(np.int8),
                                   "s": np.array(0.02, np.float32)}),
            {"a": rnd((3, 9))},
        ),
        (
            "EmbedLayerNormalization",
            ms_model(
                "EmbedLayerNormalization", ids, initializers={"w": rnd((20, 8)), "p": rnd((16, 8)), "g": b, "be": b},
                order=["ids", "", "w", "p", "", "g", "be", "mask"], outputs={"y": F32, "mi": TensorProto.INT32},
            ),
            ids,
        ),
    ]  # fmt: skip


@pytest.mark.skipif(not _nvrtc_ok(), reason="NVRTC (cuda-bindings) is not installed")
def test_contrib_forms_compile_for_cuda(tmp_path):
    failures = []
    for name, model, feeds in _cuda_cases():
        expected = run_ort(model, feeds)
        for vi in model.graph.output:
            want = expected[vi.name]
            elem = helper.np_dtype_to_tensor_dtype(want.dtype)
            vi.type.CopyFrom(helper.make_tensor_type_proto(elem, want.shape))
        try:
            graphc.compile(model, target="cuda", arch=["sm_90"], cache_dir=tmp_path)
        except GraphcError as e:
            failures.append(f"{name}: {e}")
    assert not failures, "\n".join(failures)


# ---- what is refused says so, naming the node ----------------------------------------------------


def _refusal_cases() -> list[tuple[onnx.ModelProto, str]]:
    x = rnd((2, 5, 16))
    gqa = _gqa_feeds(2, 5, 4, 2, 4, False, [5, 5])
    mha = {"q": rnd((2, 5, 12)), "k": rnd((2, 5, 12)), "v": rnd((2, 5, 12))}
    cos, sin = _caches(16, 2)
    return [
        (ms_model("FusedConv", {"x": rnd((1, 2, 5, 5))}, {"activation": "Swish"},
                  initializers={"w": rnd((3, 2, 3, 3))}), "activation 'Swish' is not supported"),
        (ms_model("MatMulNBits", {"a": rnd((3, 32)), "b": np.zeros((6, 2, 8), np.uint8)},
                  {"K": 32, "N": 6, "bits": 4, "block_size": 16}, initializers={"s": rnd((12,))}),
         "must be a constant"),
        (ms_model("MatMulNBits", {"a": rnd((3, 32))}, {"K": 32, "N": 6, "bits": 3, "block_size": 16},
                  initializers={"b": np.zeros((6, 2, 6), np.uint8), "s": rnd((12,))}), "bits=3"),
        (ms_model("MultiHeadAttention", mha, {"num_heads": 3}, outputs=[("y", F32), ("", F32), ("", F32), ("qk", F32)]),
         "output 3 \\(qk\\)"),
        (ms_model("GroupQueryAttention", gqa | {"sink": rnd((4,))}, {"num_heads": 4, "kv_num_heads": 2},
                  order=["q", "k", "v", "", "", "seqlens", "total", "", "", "", "", "sink"]), "head_sink"),
        (ms_model("GroupQueryAttention", gqa, {"num_heads": 4, "kv_num_heads": 3},
                  order=["q", "k", "v", "", "", "seqlens", "total"]), "multiple of kv_num_heads"),
        (ms_model("RotaryEmbedding", {"x": x, "p": np.zeros((2, 5), np.int64)}, {"scale": 0.5},
                  initializers={"c": cos, "s": sin}), "scale=0.5"),
        (ms_model("Attention", {"x": x, "m": np.ones((2, 1, 5, 5), np.int32)}, {"num_heads": 2},
                  initializers={"w": rnd((16, 48))}, order=["x", "w", "", "m"]), "4-D mask"),
        (ms_model("Attention", {"x": x}, {"num_heads": 2, "past_present_share_buffer": 1},
                  initializers={"w": rnd((16, 48))}), "past_present_share_buffer"),
    ]  # fmt: skip


@pytest.mark.parametrize("case", range(len(_refusal_cases())))
def test_refusals_name_the_node(case):
    model, message = _refusal_cases()[case]
    op = model.graph.node[0].op_type
    with pytest.raises(UnsupportedOpError, match=f"{op} node .*{message}"):
        graphc.load_onnx(model)


def test_ort_optimized_vit(tmp_path):
    """The zoo ViT (pre-LN blocks, a Conv patch embedding) through ORT's optimizer for model_type
    "vit": Attention, SkipLayerNormalization, BiasGelu; the CPU engine matches ORT."""
    pytest.importorskip("sympy", reason="ORT's transformer optimizer needs sympy for shape inference")
    from onnxruntime.transformers.optimizer import optimize_model

    import models

    src, dst = tmp_path / "vit.onnx", tmp_path / "vit.opt.onnx"
    base = models.build("vit", size="tiny")
    onnx.save(base, src)
    optimize_model(str(src), model_type="vit", num_heads=4, hidden_size=32, opt_level=0).save_model_to_file(str(dst))
    model = onnx.load(dst)
    ops = {n.op_type for n in model.graph.node if n.domain == MS}
    assert {"Attention", "SkipLayerNormalization", "BiasGelu"} <= ops, f"ORT's optimizer wrote {sorted(ops)}"
    feeds = models.sample_inputs("vit", base, seed=1)
    expected = run_ort(model, feeds)
    got = graphc.compile(model, target="cpu", shapes={k: v.shape for k, v in feeds.items()}).run(feeds)
    for name, want in expected.items():
        err = np.abs(got[name] - want).max() / np.abs(want).max()
        assert err < 1e-4, f"{name}: max error {err:.2e} of the output scale"
