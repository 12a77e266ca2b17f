"""BERT encoder (post-LN), as BertModel exports: embeddings, attention with an additive mask
made from the int64 attention_mask input, GELU (erf form) feed-forward layers."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto

from models._graph import DEFAULT_OPSET, Dim, GraphWriter, layernorm_form
from models._transformer import attention, mlp

DESCRIPTION = "BERT encoder (embeddings, masked attention, GELU FFN); full = BERT-base"
PRESETS: dict[str, dict] = {
    "tiny": {
        "vocab_size": 128,
        "hidden_size": 32,
        "num_layers": 2,
        "num_heads": 4,
        "intermediate_size": 64,
        "max_positions": 64,
    },
    "full": {
        "vocab_size": 30522,
        "hidden_size": 768,
        "num_layers": 12,
        "num_heads": 12,
        "intermediate_size": 3072,
        "max_positions": 512,
    },
}
LN_EPS = 1e-12
MASK_VALUE = -10000.0  # added to the scores of padded keys; finite, so float16 engines keep it too


def embeddings(w: GraphWriter, input_ids: str, token_type_ids: str | None, cfg: dict, ln: str) -> str:
    hidden, max_pos = cfg["hidden_size"], cfg["max_positions"]
    word = w.normal("embeddings.word_embeddings.weight", (cfg["vocab_size"], hidden), 1.0)
    pos = w.normal("embeddings.position_embeddings.weight", (max_pos, hidden), 0.5)
    types = w.normal("embeddings.token_type_embeddings.weight", (cfg["type_vocab_size"], hidden), 0.5)
    x = w.op("Gather", [word, input_ids], "embeddings.word_embeddings/Gather", axis=0)
    # Position ids: a [1, max_positions] buffer sliced to the sequence length, as BertModel does.
    shape = w.op("Shape", [input_ids], "embeddings/Shape")
    seq = w.slice(shape, w.i64([1]), w.i64([2]), [0], "embeddings/Slice")  # [seq] as a 1-D tensor
    pos_ids = w.initializer(np.arange(max_pos, dtype=np.int64)[None], "embeddings.position_ids")
    pos_ids = w.slice(pos_ids, w.i64([0]), seq, [1], "embeddings/Slice_1")
    if token_type_ids is None:
        # No token_type_ids input: BertModel's all-zeros buffer, sliced the same way.
        zeros = w.initializer(np.zeros((1, max_pos), dtype=np.int64), "embeddings.token_type_ids")
        token_type_ids = w.slice(zeros, w.i64([0]), seq, [1], "embeddings/Slice_2")
    t = w.op("Gather", [types, token_type_ids], "embeddings.token_type_embeddings/Gather", axis=0)
    x = w.op("Add", [x, t], "embeddings/Add")
    p = w.op("Gather", [pos, pos_ids], "embeddings.position_embeddings/Gather", axis=0)
    x = w.op("Add", [x, p], "embeddings/Add_1")
    return w.layer_norm(x, hidden, "embeddings.LayerNorm", ln, LN_EPS)


def additive_mask(w: GraphWriter, attention_mask: str) -> str:
    """int64 [batch, seq] of 1 (attend) / 0 (padding) -> float [batch, 1, 1, seq] of 0 / MASK_VALUE."""
    m = w.unsqueeze(attention_mask, [1, 2], "extended_mask/Unsqueeze")
    m = w.op("Cast", [m], "extended_mask/Cast", to=TensorProto.FLOAT)
    m = w.op("Sub", [w.const(1.0), m], "extended_mask/Sub")
    return w.op("Mul", [m, w.const(MASK_VALUE)], "extended_mask/Mul")


def encoder_layer(w: GraphWriter, x: str, mask: str, cfg: dict, i: int, ln: str) -> str:
    hidden, p = cfg["hidden_size"], f"encoder.layer.{i}"
    a = attention(w, x, hidden, cfg["num_heads"], f"{p}.attention.self", f"{p}.attention.output.dense", mask)
    x = w.op("Add", [a, x], f"{p}.attention.output/Add")
    x = w.layer_norm(x, hidden, f"{p}.attention.output.LayerNorm", ln, LN_EPS)
    f = mlp(w, x, hidden, cfg["intermediate_size"], f"{p}.intermediate.dense", f"{p}.output.dense")
    x = w.op("Add", [f, x], f"{p}.output/Add")
    return w.layer_norm(x, hidden, f"{p}.output.LayerNorm", ln, LN_EPS)


def build(
    *,
    vocab_size: int = 30522,
    hidden_size: int = 768,
    num_layers: int = 12,
    num_heads: int = 12,
    intermediate_size: int = 3072,
    max_positions: int = 512,
    type_vocab_size: int = 2,
    layernorm: str | None = None,
    token_type_input: bool = False,
    pooler: bool = False,
    batch: Dim = "batch",
    seq: Dim = "seq",
    opset: int = DEFAULT_OPSET,
    seed: int = 0,
) -> onnx.ModelProto:
    """Inputs input_ids, attention_mask (int64 [batch, seq]; with token_type_input also
    token_type_ids) -> last_hidden_state [batch, seq, hidden] (and pooler_output [batch, hidden]
    with pooler=True).

    layernorm: "fused" (LayerNormalization, opset >= 17), "decomposed" (the ReduceMean/.../Add
    chain of the TorchScript exporter), or None: fused where the opset has it."""
    ln = layernorm_form(layernorm, opset)
    cfg = {
        "model": "bert",
        "vocab_size": vocab_size,
        "hidden_size": hidden_size,
        "num_layers": num_layers,
        "num_heads": num_heads,
        "intermediate_size": intermediate_size,
        "max_positions": max_positions,
        "type_vocab_size": type_vocab_size,
        "layernorm": ln,
        "token_type_input": token_type_input,
        "pooler": pooler,
        "batch": batch,
        "seq": seq,
        "opset": opset,
        "seed": seed,
    }
    if isinstance(seq, int) and seq > max_positions:
        raise ValueError(f"seq {seq} is longer than max_positions {max_positions}")
    w = GraphWriter("bert", opset, seed)
    input_ids = w.input("input_ids", TensorProto.INT64, [batch, seq])
    attention_mask = w.input("attention_mask", TensorProto.INT64, [batch, seq])
    token_types = w.input("token_type_ids", TensorProto.INT64, [batch, seq]) if token_type_input else None
    x = embeddings(w, input_ids, token_types, cfg, ln)
    mask = additive_mask(w, attention_mask)
    for i in range(num_layers):
        x = encoder_layer(w, x, mask, cfg, i, ln)
    x = w.output(x, "last_hidden_state", TensorProto.FLOAT, [batch, seq, hidden_size])
    if pooler:
        first = w.op("Gather", [x, w.i64(0)], "pooler/Gather", axis=1)  # [batch, hidden]
        pooled = w.gemm(first, hidden_size, hidden_size, "pooler.dense")
        pooled = w.op("Tanh", [pooled], "pooler/Tanh")
        w.output(pooled, "pooler_output", TensorProto.FLOAT, [batch, hidden_size])
    return w.model(cfg, f"BERT {num_layers} layers, hidden {hidden_size}, {num_heads} heads, layernorm {ln}")


def sample_inputs(config: dict, shapes: dict[str, list[int]], rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Token ids within the vocabulary; masks where every row after the first has padding."""
    b, s = shapes["input_ids"]
    ids = rng.integers(0, config["vocab_size"], size=(b, s), dtype=np.int64)
    mask = np.ones((b, s), dtype=np.int64)
    for row in range(1, b):
        mask[row, max(1, s - (s * row) // (2 * b) - 1) :] = 0  # each row keeps its first token
    out = {"input_ids": ids, "attention_mask": mask}
    if "token_type_ids" in shapes:
        types = np.zeros((b, s), dtype=np.int64)
        types[:, s // 2 :] = 1  # a second segment, as in sentence-pair inputs
        out["token_type_ids"] = types % config["type_vocab_size"]
    return out
