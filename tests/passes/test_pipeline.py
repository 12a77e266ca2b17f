"""The pipeline as the one place that rewrites: the target-specific passes run inside it (dumped,
verified, timed), gated by the target context and the opt level; and the pass instruments."""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import graphc
from graphc.errors import VerificationError
from graphc.ir.graph import Graph
from graphc.passes import OptimizeOptions, optimize, pipeline
from graphc.passes.instruments import DumpIR, PassInstrument, PassTiming
from graphc.passes.manager import FixedPoint, Pass
from graphc.passes.target import Target

# The rewrites compile() used to run outside the pipeline, by the name of their pass.
MOVED = (
    "decompose_conv_transpose",
    "decompose_einsum",
    "decompose_window_ops",
    "decompose_qdq",
    "to_channels_last",
    "convert_precision",
    "k_major_gemm_weights",
)


def _every_cuda_form() -> onnx.ModelProto:
    """One model that each moved rewrite changes: a Q/DQ pair on the input, Conv (NHWC), a
    ConvTranspose, LRN, a MatMul whose weight N=10 breaks 16-byte loads (K-major) and an Einsum."""
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(np.asarray(a), name)
        for name, a in {
            "s": np.float32(0.05),
            "zp": np.uint8(128),
            "W": rng.standard_normal((8, 4, 3, 3)).astype(np.float32) * 0.2,
            "Wt": rng.standard_normal((8, 8, 2, 2)).astype(np.float32) * 0.2,
            "Wm": rng.standard_normal((8, 10)).astype(np.float32),
            "We": rng.standard_normal((10, 6)).astype(np.float32),
        }.items()
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "zp"], ["xq"]),
        helper.make_node("DequantizeLinear", ["xq", "s", "zp"], ["xd"]),
        helper.make_node("Conv", ["xd", "W"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("ConvTranspose", ["r", "Wt"], ["t"], strides=[2, 2]),
        helper.make_node("LRN", ["t"], ["l"], size=3),
        helper.make_node("GlobalAveragePool", ["l"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"]),
        helper.make_node("MatMul", ["f", "Wm"], ["m"]),
        helper.make_node("Einsum", ["m", "We"], ["y"], equation="bi,ij->bj"),
    ]
    g = helper.make_graph(
        nodes,
        "moved",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 6])],
        inits,
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def _dumped(folder) -> list[str]:
    """Pass names of the dump files, checking that they are numbered 00, 01, ... without gaps."""
    files = sorted(p.name for p in folder.iterdir())
    assert [f[:3] for f in files] == [f"{i:02d}-" for i in range(len(files))]
    return [f[3:-4] for f in files]


def test_cuda_compile_dumps_every_rewrite_as_a_numbered_pass(tmp_path):
    eng = graphc.compile(
        _every_cuda_form(), target="cuda", precision="fp16", arch=["sm_90"], dump_ir=tmp_path, verify=True
    )
    names = _dumped(tmp_path)
    assert names[0] == "input"
    for name in MOVED:
        assert name in names, f"{name} wrote no dump: {names}"
    # In the pipeline's order (rules 1, 9, 10, 11 of passes/pipeline.py).
    order = [names.index(n) for n in MOVED]
    assert order[:4] == sorted(order[:4]) and order[3] < names.index("fuse_epilogues") < order[4] < order[5] < order[6]
    # The report times them like every other pass; compile() has no phases of its own for them.
    reported = [p["name"] for p in eng.report["passes"]]
    assert set(MOVED) <= set(reported)
    assert not {"cuda_forms", "layout", "precision", "gemm_layout"} & set(eng.report["timings"])
    # The last dump is the graph that was lowered: its ops are the plan's.
    last = sorted(tmp_path.iterdir())[-1].read_text()
    assert "graphc.ConvNHWC" in last and "k_major" in last and "Einsum" not in last.split("const")[0]
    assert not any(s.op in ("ConvTranspose", "Einsum", "LRN", "QuantizeLinear") for s in eng.plan.steps)


def test_cuda_opt_level_zero_runs_only_what_the_target_needs(tmp_path):
    eng = graphc.compile(
        _every_cuda_form(), target="cuda", precision="fp16", arch=["sm_90"], opt_level=0, dump_ir=tmp_path
    )
    names = _dumped(tmp_path)
    # Today's opt-level-0 semantics: the CUDA forms and the precision, no optimization or layout.
    assert names == ["input", *MOVED[:4], "convert_precision"]  # decompose_rnn found nothing
    # fold_control_flow (first, every level) found no control flow: in the report, not dumped;
    # lower_int_quant runs for fp32 (and int8) CUDA engines only, not in this fp16 one.
    # decompose_tensor_scatter ran and found none (so it was not dumped either)
    expected = ["fold_control_flow", *MOVED[:3], "decompose_tensor_scatter", MOVED[3], "decompose_rnn"]
    expected.append("convert_precision")
    assert [p["name"] for p in eng.report["passes"]] == expected


def test_cpu_target_runs_none_of_the_cuda_passes(tmp_path):
    eng = graphc.compile(_every_cuda_form(), target="cpu", dump_ir=tmp_path)
    names = set(_dumped(tmp_path))
    assert not names & {"decompose_conv_transpose", "decompose_einsum", "decompose_window_ops", "to_channels_last"}
    assert "decompose_tensor_scatter" not in [p["name"] for p in eng.report["passes"]]
    assert not names & {"convert_precision", "k_major_gemm_weights", "fuse_horizontal", "fuse_residual_norm"}
    # The CPU engine keeps the reference ops the CUDA target decomposes.
    assert {"ConvTranspose", "Einsum", "LRN"} <= {s.op for s in eng.plan.steps}


def test_pass_gating_by_target_and_level():
    cuda_fp16 = Target("cuda", "fp16")
    by_name = {}
    for stage in pipeline.stages():
        for p in stage.passes if isinstance(stage, FixedPoint) else (stage,):
            by_name.setdefault(p.name, p)
    assert by_name["decompose_einsum"].active(0, cuda_fp16) and not by_name["decompose_einsum"].active(2, Target())
    assert by_name["to_channels_last"].active(1, cuda_fp16) and not by_name["to_channels_last"].active(0, cuda_fp16)
    assert by_name["convert_precision"].active(0, Target("cpu", "bf16")) and not by_name["convert_precision"].active(
        2, Target("cuda")
    )
    # horizontal GEMM fusion: CUDA only (its slab views are a CUDA-plan layout choice), level 2
    assert by_name["fuse_horizontal"].active(2, cuda_fp16) and not by_name["fuse_horizontal"].active(1, cuda_fp16)
    assert not by_name["fuse_horizontal"].active(2, Target())
    # row-norm epilogues: CUDA float engines that ask for them (off by default), never int8
    rownorm = dataclasses.replace(cuda_fp16, row_norm_epilogues=True)
    assert by_name["fuse_residual_norm"].active(2, rownorm) and not by_name["fuse_residual_norm"].active(2, cuda_fp16)
    assert not by_name["fuse_residual_norm"].active(2, Target(row_norm_epilogues=True))
    assert not by_name["fuse_residual_norm"].active(2, dataclasses.replace(rownorm, precision="int8"))
    assert not by_name["fuse_horizontal"].active(2, dataclasses.replace(cuda_fp16, precision="int8"))
    names = list(by_name)
    assert names.index("fuse_attention") < names.index("fuse_horizontal") < names.index("fuse_epilogues")
    assert names.index("fuse_elementwise") < names.index("fuse_residual_norm") < names.index("to_channels_last")
    with pytest.raises(ValueError, match="target must be"):
        Target("tpu")


# ---- instruments --------------------------------------------------------------------------------


def _small_graph() -> Graph:
    from graphc.ir.builder import GraphBuilder
    from graphc.ir.types import DType, TensorType

    b = GraphBuilder("small", 17)
    x = b.add_input("x", TensorType(DType.float32, (2, 3)))
    one = b.add_constant(np.ones((), np.float32), "one")
    zero = b.add_constant(np.zeros((), np.float32), "zero")
    y = b.op("Add", [b.op("Mul", [x, one]), zero])
    b.set_outputs([b.op("Relu", [y])], ["y"])
    return b.build()


class _Log(PassInstrument):
    def __init__(self, tag: str, events: list):
        self.tag, self.events = tag, events

    def enter_pipeline(self, graph):
        self.events.append((self.tag, "enter"))

    def before_pass(self, p, graph):
        self.events.append((self.tag, "before", p.name))

    def after_pass(self, p, before, after):
        self.events.append((self.tag, "after", p.name, after is not before))

    def exit_pipeline(self, graph):
        self.events.append((self.tag, "exit"))


def test_instruments_nest_around_every_pass_that_runs():
    events: list = []
    stages = [Pass("identity", lambda g: g), Pass("skipped", lambda g: g, min_level=3), pipeline.cleanup()]
    res = optimize(
        _small_graph(), OptimizeOptions(opt_level=1, instruments=[_Log("a", events), _Log("b", events)]), stages
    )
    assert events[:2] == [("a", "enter"), ("b", "enter")] and events[-2:] == [("a", "exit"), ("b", "exit")]
    # Before hooks in reverse order, after hooks in order: b's hooks enclose a's.
    assert events[2:6] == [
        ("b", "before", "identity"),
        ("a", "before", "identity"),
        ("a", "after", "identity", False),
        ("b", "after", "identity", False),
    ]
    ran = [e[2] for e in events if e[0] == "a" and e[1] == "before"]
    assert "skipped" not in ran and ran[1:5] == ["constant_folding", "simplify", "cse", "dce"]
    # The timing instrument's records are the result's, one per pass run, in order.
    assert [r.name for r in res.records] == ran
    assert any(e[-1] for e in events if e[1] == "after")  # simplify removed x*1 + 0
    assert [n.op for n in res.graph.nodes] == ["Relu"]


def test_verify_instrument_names_the_pass_that_broke_the_ir():
    def drop_first_node(g: Graph) -> Graph:
        return g.with_nodes(g.nodes[1:])

    stages = [Pass("breaks_ssa", drop_first_node)]
    with pytest.raises(VerificationError, match="after pass breaks_ssa"):
        optimize(_small_graph(), OptimizeOptions(opt_level=1, verify=True), stages)
    # Without the instrument nothing checks it.
    optimize(_small_graph(), OptimizeOptions(opt_level=1), stages)


def test_dump_instrument_writes_only_changed_graphs(tmp_path):
    stages = [Pass("identity", lambda g: g), pipeline.cleanup()]
    res = optimize(_small_graph(), OptimizeOptions(opt_level=1, dump_ir=tmp_path), stages)
    names = _dumped(tmp_path)
    assert names[0] == "input" and "identity" not in names and "simplify" in names
    assert (tmp_path / f"{len(names) - 1:02d}-{names[-1]}.txt").read_text() == str(res.graph)
    # A DumpIR given directly is the same instrument.
    d2 = tmp_path / "direct"
    optimize(_small_graph(), OptimizeOptions(opt_level=1, instruments=[DumpIR(d2)]), stages)
    assert _dumped(d2) == names


def test_timing_instrument_counts_nodes():
    t = PassTiming()
    optimize(_small_graph(), OptimizeOptions(opt_level=1, instruments=[t]), [pipeline.cleanup()])
    simplify = next(r for r in t.records if r.name == "simplify")
    assert simplify.changed and simplify.nodes_before == 3 and simplify.nodes_after < 3 and simplify.seconds >= 0
