"""Reduced precision (fp16, bf16) for the CUDA target.

Float32 weights become the target type at compile time (saturating: a constant beyond fp16's range,
like the -3.4e38 of an attention mask, becomes -65504, not -inf, so that 0 * mask stays 0; an
infinite constant stays infinite);
float32 values inside the graph follow. Graph inputs and outputs keep the model's dtypes, a Cast
at each edge, unless the IO precision is the target type too (`io_precision="fp16"`, TensorRT's
`--inputIOFormats/--outputIOFormats=fp16`, ONNX Runtime's float16 converter with
keep_io_types=False): then float32 inputs and outputs are declared in the target type and the
edge Casts are gone (the caller passes and gets fp16; GPT-2's logits at batch 32 are written in
412 MB instead of 823). Reductions, LayerNorm, Softmax and variances still accumulate in fp32 (the ops'
references and the kernels do that for 16-bit storage). Inputs that must stay exact (static
inputs such as Resize scales) are left in fp32.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from graphc.errors import CompileError
from graphc.ir.attrs import TensorAttr
from graphc.ir.builder import GraphBuilder
from graphc.ir.graph import Graph, Value
from graphc.ir.types import DType, TensorType
from graphc.ops.fused import EpilogueOp, FusedAttrs
from graphc.ops.registry import Category, get_op
from graphc.passes.target import Target

TARGETS = {"fp16": DType.float16, "bf16": DType.bfloat16}
MODEL_IO = "model"  # io_precision: the model's declared input and output types (the default)
IO_PRECISIONS = (MODEL_IO, *TARGETS)


def _convert_array(data: np.ndarray, dt: DType) -> np.ndarray:
    if dt is DType.float16:
        # finite values beyond the range saturate; +-inf (a -inf mask fill the fused attention
        # relies on to find rows with no key) and NaN pass through
        lim = float(np.finfo(np.float16).max)
        data = np.where(np.isinf(data), data, np.clip(data, -lim, lim))
    return data.astype(dt.numpy)


def _retype_attrs(op: str, attrs, target: DType):
    # A Cast to float32 and graphc.MatMulFp8's float32 output (passes/quantize_fp8.py) follow the
    # engine's storage type.
    if op in ("Cast", "MatMulFp8") and attrs.to == DType.float32.value:
        return attrs.replace(to=target.value)
    if op == "ConstantOfShape" and attrs.value is not None and attrs.value.array.dtype == np.float32:
        return attrs.replace(value=TensorAttr(_convert_array(attrs.value.array, target)))
    if isinstance(attrs, FusedAttrs):
        epi = tuple(EpilogueOp(e.op, _retype_attrs(e.op, e.attrs, target), e.args) for e in attrs.epilogue)
        anchor = attrs.anchor_attrs
        if anchor is not None and attrs.anchor_op is not None:
            anchor = _retype_attrs(attrs.anchor_op, anchor, target)
        return dataclasses.replace(attrs, epilogue=epi, anchor_attrs=anchor)
    return attrs


def _keep_fp32(b: GraphBuilder, node, subst: dict[str, Value], target: DType, precision: str) -> None:
    """An If/Loop/Scan left here (data-dependent), or an op the target computes in fp32 only, keeps
    its fp32 boundary: its float inputs cast back to fp32 and its float outputs to the target type.
    Each branch is then converted inside as a graph of its own (graphc/host_if.py optimizes it for
    the same target), with the same Casts at its edges as any graph."""
    ins = []
    for v in node.inputs:
        nv = None if v is None else subst[v.name]
        if nv is not None and isinstance(v.type, TensorType) and v.type.dtype is DType.float32 and nv.type != v.type:
            nv = b.op("Cast", [nv], {"to": DType.float32.value}, name=f"{node.name}/{v.name}/to_fp32")
        ins.append(nv)
    new = b.add_node(
        node.op, ins, node.attrs, name=node.name, outputs=list(node.output_names), domain=node.domain, keep_name=True
    )
    for old, nv in zip(node.outputs, new.outputs, strict=True):
        if isinstance(nv.type, TensorType) and nv.type.dtype is DType.float32:
            nv = b.op("Cast", [nv], {"to": target.value}, name=f"{node.name}/{old.name}/to_{precision}")
        subst[old.name] = nv


def precision_pass(graph: Graph, target: Target) -> Graph:
    """The pipeline's form: the target's precision and IO precision."""
    # ops the target computes only in float32 (the CUDA target's apache-tvm kernels) keep an fp32 boundary
    fp32_ops = getattr(target.capabilities, "fp32_ops", frozenset())
    # an fp8 engine stores its float tensors in fp16 (its GEMMs read e4m3: passes/quantize_fp8.py)
    precision = getattr(target, "storage_precision", target.precision)
    return convert_precision(graph, precision, getattr(target, "io_precision", MODEL_IO), fp32_ops)


def check_io_precision(precision: str, io_precision: str) -> None:
    """io_precision is "model" or the engine's own reduced precision (fp16 IO of an fp32 or bf16
    engine would be a cast at the edge again, the thing the option removes)."""
    if io_precision not in IO_PRECISIONS:
        raise CompileError(f"io_precision must be one of {IO_PRECISIONS}, got {io_precision!r}")
    if io_precision != MODEL_IO and io_precision != precision:
        raise CompileError(
            f"io_precision {io_precision} needs precision {io_precision} (got {precision}): the engine's float "
            "inputs and outputs are then its own storage type"
        )


def convert_precision(
    graph: Graph, precision: str, io_precision: str = MODEL_IO, fp32_ops: frozenset[str] = frozenset()
) -> Graph:
    """`graph` with float32 storage in `precision`; float32 inputs and outputs kept (a Cast at each
    edge) or, with io_precision == precision, declared in that type with no Cast."""
    if precision == "fp32":
        check_io_precision(precision, io_precision)
        return graph
    try:
        target = TARGETS[precision]
    except KeyError:
        raise CompileError(f"precision must be fp32, fp16 or bf16, got {precision!r}") from None
    check_io_precision(precision, io_precision)
    io_target = io_precision != MODEL_IO
    b = GraphBuilder(graph.name, graph.opset, graph.meta)
    b._reserved_values = set(graph.values)
    static_uses: set[str] = set()
    for node in graph.nodes:
        opdef = get_op(node.op, node.domain)
        for i in opdef.static_inputs:
            v = node.input(i)
            if v is not None:
                static_uses.add(v.name)
    subst: dict[str, Value] = {}
    for v in graph.inputs:
        is_float = isinstance(v.type, TensorType) and v.type.dtype is DType.float32
        if is_float and io_target and v.name not in static_uses:
            # declared in the target type: the caller's fp16 array is the engine's input as it is
            subst[v.name] = b.add_input(v.name, TensorType(target, v.type.shape))
            continue
        nv = b.add_input(v.name, v.type)
        if is_float:
            subst[v.name] = b.op("Cast", [nv], {"to": target.value}, name=f"{v.name}/to_{precision}")
        else:
            subst[v.name] = nv
    converted: dict[str, Value] = {}
    for name, c in graph.constants.items():
        kept = b.add_constant(c.data, name, keep_name=True)
        subst[name] = kept
        if c.data.dtype == np.float32:
            converted[name] = b.add_constant(_convert_array(c.data, target), f"{name}/{precision}")
    for node in graph.nodes:
        opdef = get_op(node.op, node.domain)
        if opdef.category is Category.CONTROL_FLOW or (node.domain == "" and node.op in fp32_ops):
            _keep_fp32(b, node, subst, target, precision)
            continue
        ins = []
        for i, v in enumerate(node.inputs):
            if v is None:
                ins.append(None)
            elif v.name in converted and i not in opdef.static_inputs:
                ins.append(converted[v.name])
            else:
                ins.append(subst[v.name])
        attrs = _retype_attrs(node.op, node.attrs, target)
        new = b.add_node(
            node.op, ins, attrs, name=node.name, outputs=list(node.output_names), domain=node.domain, keep_name=True
        )
        for old, nv in zip(node.outputs, new.outputs, strict=True):
            subst[old.name] = nv
    outs = []
    for v in graph.outputs:
        nv = subst[v.name]
        if isinstance(v.type, TensorType) and v.type.dtype is DType.float32:
            # the declared output type: float32, or the target type with io_precision
            want = target if io_target else DType.float32
            if nv.type.dtype is not want:
                nv = b.op("Cast", [nv], {"to": want.value}, name=f"{v.name}/to_{precision if io_target else 'fp32'}")
        outs.append(nv)
    b.set_outputs(outs, graph.output_names)
    from graphc.passes.cse import eliminate_common_subexpressions
    from graphc.passes.dce import eliminate_dead_code
    from graphc.passes.simplify import simplify

    return eliminate_dead_code(eliminate_common_subexpressions(simplify(b.build())))
