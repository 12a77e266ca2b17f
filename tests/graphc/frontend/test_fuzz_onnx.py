"""Fuzzing ONNX input: 2,000 fixed-seed mutations of small models (protos, initializers and their
external data, attributes, dims, element types, opsets, node order, raw bytes), each through
`graphc check`, then (if the model checks) a CPU compile and run, and for every fourth a CUDA
compile. Every failure must be a graphc error with a one-line message, never a traceback.

NVRTC is the expensive step of a CUDA compile, and the kernels of a mutated model are mostly the
original's: the CUDA compiles stop after code generation (cubins stubbed) except a fixed sample,
which compiles for real with the kernel cache shared across the test (so repeats are cheap).
"""

from __future__ import annotations

import contextlib
import copy
import io
import random
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, external_data_helper

import graphc
import graphc.codegen.build as codegen_build
import models
from graphc.cli import main
from graphc.errors import GraphcError

N_MUTATIONS = {"mlp": 1000, "mlp_external": 700, "bert": 300}
NVRTC_EVERY = 12  # of the CUDA compiles, this one in N goes through NVRTC
SHAPES = {"batch": 2, "seq": 16}
BIG = [0, -1, 3, 2**31, 2**40, 2**62, 2**63 - 1]


def _pick(rng: random.Random, seq):
    return seq[rng.randrange(len(seq))] if len(seq) else None


def mutate(model: onnx.ModelProto, rng: random.Random) -> tuple[bytes, str]:
    m = copy.deepcopy(model)
    g = m.graph
    kind = rng.randrange(18)
    node = _pick(rng, g.node)
    init = _pick(rng, g.initializer)
    if kind == 0:
        node.op_type = rng.choice(["Foo", "Conv", "MatMul", "Relu", "Gemm", "Reshape", "Softmax", "Gather", ""])
    elif kind == 1 and node.input:
        node.input[rng.randrange(len(node.input))] = rng.choice(["nope", "", g.input[0].name, g.node[-1].output[0]])
    elif kind == 2:
        if node.input and rng.random() < 0.5:
            del node.input[rng.randrange(len(node.input))]
        else:
            node.input.append(rng.choice([g.input[0].name, "", init.name if init else "x"]))
    elif kind == 3 and init is not None:
        if init.raw_data:
            init.raw_data = init.raw_data[: rng.randrange(len(init.raw_data))]
        else:
            init.data_type = rng.choice([0, 7, 99])
    elif kind == 4 and init is not None:
        if init.dims and rng.random() < 0.7:
            init.dims[rng.randrange(len(init.dims))] = rng.choice(BIG)
        else:
            del init.dims[:]
            init.dims.extend(rng.choice([[2**32, 2**32, 4], [2**62, 4], [2**40], [-3, -3]]))
    elif kind == 5 and init is not None:
        init.data_type = rng.choice([0, 2, 6, 7, 8, 9, 10, 16, 99])
    elif kind == 6 and init is not None and init.data_location == TensorProto.EXTERNAL:
        entry = _pick(rng, init.external_data)
        entry.value = rng.choice(
            ["-4096", "1.5", "abc", "", str(2**70), "99999999", "0", " 12", "1e3", "../w.bin", "/etc/passwd", "w.bin\0"]
        )
    elif kind == 6 and init is not None:
        init.data_location = TensorProto.EXTERNAL
        init.external_data.add(key="location", value=rng.choice(["../x.bin", "/etc/passwd", "missing.bin"]))
    elif kind in (7, 8) and any(n.attribute for n in g.node):
        node = rng.choice([n for n in g.node if n.attribute])
        a = _pick(rng, node.attribute)
        r = rng.randrange(5)
        if r == 0:
            node.attribute.remove(a)
        elif r == 1:
            a.type = rng.choice([TensorProto.UNDEFINED, 2, 3, 5, 6, 7, 8])
        elif r == 2:
            node.attribute.append(copy.deepcopy(a))
        elif a.ints:
            a.ints[rng.randrange(len(a.ints))] = rng.choice([-5, 0, 1000, 2**40, -(2**62)])
        elif a.type == onnx.AttributeProto.INT:
            a.i = rng.choice([-5, 0, 1000, 2**40, -(2**62), 2**63 - 1])
        elif a.type == onnx.AttributeProto.FLOAT:
            a.f = rng.choice([float("nan"), float("inf"), -1.0, 1e30, 0.0])
        else:
            a.s = rng.choice([b"", b"nope", b"\xff\xfe"])
    elif kind == 9:
        rng.choice(list(g.input)).type.tensor_type.elem_type = rng.choice([0, 2, 7, 9, 10, 16, 99])
    elif kind in (10, 11):
        dims = rng.choice(list(g.input)).type.tensor_type.shape.dim
        if dims:
            d = dims[rng.randrange(len(dims))]
            v = rng.choice([*BIG, None])
            if v is None:
                d.dim_param = rng.choice(["weird", "batch", ""])
            else:
                d.dim_value = v
    elif kind == 12:
        out = rng.choice(list(g.output))
        r = rng.randrange(3)
        if r == 0:
            out.name = rng.choice(["nope", g.input[0].name, ""])
        elif r == 1:
            g.output.append(copy.deepcopy(out))
        else:
            out.type.tensor_type.elem_type = rng.choice([0, 7, 99])
    elif kind == 13:
        if rng.random() < 0.6:
            m.opset_import[0].version = rng.choice([0, 1, 5, 9, 30, 10**6])
        else:
            m.opset_import.add(domain=rng.choice(["com.evil", "ai.onnx.ml", ""]), version=rng.choice([1, 99]))
    elif kind == 14 and len(g.node) > 1:
        r = rng.randrange(3)
        if r == 0:
            g.node.remove(node)
        elif r == 1:
            g.node.append(copy.deepcopy(node))
        else:
            i, j = rng.randrange(len(g.node)), rng.randrange(len(g.node))
            a, b = copy.deepcopy(g.node[i]), copy.deepcopy(g.node[j])
            g.node[i].CopyFrom(b)
            g.node[j].CopyFrom(a)
    elif kind == 15 and node.output:
        vi = g.value_info.add()
        vi.name = node.output[0]
        vi.type.tensor_type.elem_type = rng.choice([1, 7, 10])
        for d in rng.choice([[2**40], [-1, 3], [0], [2**62, 2**62]]):
            vi.type.tensor_type.shape.dim.add().dim_value = d
    data = m.SerializeToString()
    if kind in (16, 17):
        b = bytearray(data)
        if kind == 16:
            for _ in range(rng.randrange(1, 8)):
                b[rng.randrange(len(b))] = rng.randrange(256)
        else:
            b = b[: rng.randrange(len(b))]
        data = bytes(b)
    return data, f"mutation {kind}"


def _one_line(e: BaseException, what: str) -> None:
    assert isinstance(e, GraphcError), f"{what}: {type(e).__name__} escaped: {e}"
    assert str(e).strip() and "\n" not in str(e).strip(), f"{what}: a message of several lines: {e}"


def _feeds(engine, rng: np.random.Generator) -> dict[str, np.ndarray]:
    out = {}
    for s in engine.inputs:
        dt = np.dtype(s.dtype)
        out[s.name] = rng.standard_normal(s.shape).astype(dt) if dt.kind == "f" else np.zeros(s.shape, dt)
    return out


@pytest.fixture(scope="module")
def bases(tmp_path_factory):
    d = tmp_path_factory.mktemp("onnxfuzz")
    ext = d / "ext"
    ext.mkdir()
    mlp = models.build("mlp", size="tiny")
    m = copy.deepcopy(mlp)
    external_data_helper.convert_model_to_external_data(m, location="w.bin", size_threshold=0)
    onnx.save_model(m, ext / "base.onnx")
    mlp_external = onnx.load(ext / "base.onnx", load_external_data=False)
    return d, {"mlp": (mlp, d), "mlp_external": (mlp_external, ext), "bert": (models.build("bert", size="tiny"), d)}


@pytest.mark.parametrize("name", sorted(N_MUTATIONS))
def test_fuzz_onnx(name, bases, tmp_path, monkeypatch):
    root, table = bases
    base, folder = table[name]
    rng = random.Random(f"onnx-fuzz-{name}")
    nprng = np.random.default_rng(0)
    real_compile_all = codegen_build.compile_all
    cache = root / "kernel-cache"
    counts = {"refused_at_check": 0, "cpu_engines": 0, "cuda_compiles": 0, "nvrtc": 0}
    for i in range(N_MUTATIONS[name]):
        data, label = mutate(base, rng)
        path = folder / f"fuzz-{name}.onnx"  # beside the external data file, for its model
        path.write_bytes(data)
        what = f"{name} #{i} ({label})"
        err, out = io.StringIO(), io.StringIO()
        shapes = ",".join(f"{k}={v}" for k, v in SHAPES.items())
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            rc = main(["check", str(path), "--shapes", shapes])
        text = err.getvalue()
        assert "Traceback" not in text + out.getvalue(), f"{what}: {text}{out.getvalue()}"
        if rc == 1:  # check read the model and lists what would stop its compile (graphc/support.py)
            assert "does not compile" in out.getvalue(), f"{what}: {out.getvalue()!r}"
            counts["refused_at_check"] += 1
            continue
        if rc != 0:
            assert rc == 2 and text.startswith("graphc: error: ") and text.count("\n") == 1, f"{what}: {text!r}"
            counts["refused_at_check"] += 1
            continue
        try:
            engine = graphc.compile(str(path), target="cpu", shapes=SHAPES)
            engine.run(_feeds(engine, nprng))
            counts["cpu_engines"] += 1
        except Exception as e:
            _one_line(e, f"{what}, cpu")
        if i % 4:
            continue
        real = counts["cuda_compiles"] % NVRTC_EVERY == 0
        counts["cuda_compiles"] += 1
        counts["nvrtc"] += real
        fake = lambda jobs, **kw: [b"\x7fELF" for _ in jobs]  # noqa: E731
        monkeypatch.setattr(codegen_build, "compile_all", real_compile_all if real else fake)
        try:
            graphc.compile(str(path), target="cuda", arch=["sm_80"], shapes=SHAPES, cache_dir=cache)
        except Exception as e:
            _one_line(e, f"{what}, cuda")
    # the mutations mostly break the model, some leave a model that compiles: both paths ran
    assert counts["refused_at_check"] > N_MUTATIONS[name] * 0.3, counts
    assert counts["cpu_engines"] > 10 and counts["nvrtc"] >= 2, counts


def test_external_data_fields_are_byte_counts(bases, tmp_path):
    _, table = bases
    base, folder = table["mlp_external"]
    for value, match in (("-4096", "not a byte count"), ("1.5", "not a byte count"), (str(2**70), "too large")):
        m = copy.deepcopy(base)
        t = m.graph.initializer[0]
        entry = next((e for e in t.external_data if e.key == "offset"), None) or t.external_data.add(key="offset")
        entry.value = value
        p = Path(folder) / "edited.onnx"
        onnx.save_model(m, p)
        with pytest.raises(GraphcError, match=match):
            graphc.compile(str(p), target="cpu", shapes=SHAPES)


def test_huge_dims_are_refused_before_any_allocation():
    m = models.build("mlp", size="tiny")
    m.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 2**40
    with pytest.raises(GraphcError, match="GRAPHC_MAX_TENSOR_BYTES"):
        graphc.compile(m, target="cpu")
    with pytest.raises(GraphcError, match="GRAPHC_MAX_TENSOR_BYTES"):
        graphc.load_onnx(m)
