"""Malformed models through the CLI: a fixed-seed stream of mutations of zoo models (wrong op types,
dangling or missing inputs, truncated or retyped initializers, bad attributes, element types and
dims, duplicate outputs, other opsets, dropped nodes, flipped bytes) must each end in a compiled
engine or a one-line error with exit code 2, never an exception."""

from __future__ import annotations

import contextlib
import copy
import io
import random

import onnx
import pytest

import models
from graphc.cli import main

MUTATIONS = (
    "op_type",
    "input_name",
    "drop_input",
    "init_truncate",
    "init_dims",
    "init_dtype",
    "attr_value",
    "attr_type",
    "attr_drop",
    "elem_type",
    "input_dim",
    "dup_output",
    "output_name",
    "opset",
    "drop_node",
    "bytes",
)


def mutate(model: onnx.ModelProto, kind: str, rng: random.Random) -> bytes:
    m = copy.deepcopy(model)
    g = m.graph
    node = rng.choice(g.node)
    init = rng.choice(g.initializer) if g.initializer else None
    if kind == "op_type":
        node.op_type = rng.choice(["Foo", "Conv", "MatMul", "Relu", "Gemm", "Reshape", "Add", ""])
    elif kind == "input_name" and node.input:
        node.input[rng.randrange(len(node.input))] = rng.choice(["nope", "", g.input[0].name, g.node[-1].output[0]])
    elif kind == "drop_input" and node.input:
        del node.input[rng.randrange(len(node.input))]
    elif kind == "init_truncate" and init is not None and init.raw_data:
        init.raw_data = init.raw_data[: rng.randrange(len(init.raw_data))]
    elif kind == "init_dims" and init is not None and init.dims:
        init.dims[rng.randrange(len(init.dims))] = rng.choice([0, -1, 3, 10**6])
    elif kind == "init_dtype" and init is not None:
        init.data_type = rng.choice([0, 7, 8, 9, 10, 99])
    elif kind.startswith("attr") and any(n.attribute for n in g.node):
        node = rng.choice([n for n in g.node if n.attribute])
        a = rng.choice(node.attribute)
        if kind == "attr_drop":
            node.attribute.remove(a)
        elif kind == "attr_type":
            a.type = rng.choice([onnx.AttributeProto.STRING, onnx.AttributeProto.FLOATS, onnx.AttributeProto.GRAPH, 0])
        elif a.ints:
            a.ints[rng.randrange(len(a.ints))] = rng.choice([-5, 0, 1000, 3])
        elif a.type == onnx.AttributeProto.INT:
            a.i = rng.choice([-5, 0, 1000, 3])
        elif a.type == onnx.AttributeProto.FLOAT:
            a.f = rng.choice([float("nan"), -1.0, 1e30])
    elif kind == "elem_type":
        rng.choice(list(g.input)).type.tensor_type.elem_type = rng.choice([0, 7, 8, 9, 10, 16, 99])
    elif kind == "input_dim":
        dims = rng.choice(list(g.input)).type.tensor_type.shape.dim
        if dims:
            d = dims[rng.randrange(len(dims))]
            v = rng.choice([0, -1, 7, None])
            if v is None:
                d.dim_param = "weird"
            else:
                d.dim_value = v
    elif kind == "dup_output":
        other = rng.choice(g.node)
        if node.output and other.output:
            node.output[0] = other.output[0]
    elif kind == "output_name":
        g.output[0].name = rng.choice(["nope", g.input[0].name])
    elif kind == "opset":
        m.opset_import[0].version = rng.choice([0, 1, 5, 9, 30])
    elif kind == "drop_node":
        g.node.remove(node)
    data = m.SerializeToString()
    if kind == "bytes":
        b = bytearray(data)
        for _ in range(rng.randrange(1, 8)):
            b[rng.randrange(len(b))] = rng.randrange(256)
        data = bytes(b)
    return data


def _cli(args: list[str]) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = main(args)
    return rc, err.getvalue()


@pytest.mark.parametrize("name", ["mlp", "resnet", "bert"])
def test_mutated_models_compile_or_fail_cleanly(name, tmp_path):
    rng = random.Random(f"graphc-{name}")
    base = models.build(name, size="tiny")
    outcomes = {0: 0, 2: 0}
    for i in range(60):
        kind = MUTATIONS[i % len(MUTATIONS)]
        path = tmp_path / f"m{i}.onnx"
        path.write_bytes(mutate(base, kind, rng))
        engine = tmp_path / f"m{i}.engine"
        # Every other case compiles for CUDA (kernel generation and NVRTC need no GPU).
        target = ["--target", "cpu"] if i % 2 else ["--target", "cuda", "--arch", "sm_90"]
        rc, err = _cli(["compile", str(path), "-o", str(engine), *target, "--shapes", "batch=2", "-q"])
        assert rc in outcomes, f"{kind}: exit {rc}\n{err}"
        assert "Traceback" not in err
        if rc == 2:
            assert "graphc: error: " in err, f"{kind}: {err!r}"
        outcomes[rc] += 1
        if rc == 0 and target[1] == "cpu":
            rc, err = _cli(["run", str(engine)])
            assert rc in (0, 2) and "Traceback" not in err, f"{kind}: run exit {rc}\n{err}"
    assert outcomes[2] > 20  # the mutations mostly break the model, and each break is reported
