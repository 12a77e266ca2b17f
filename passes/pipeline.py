"""The ordered list of passes: every rewrite of the graph between the frontend and lowering.

`compile()` runs this list through the pass manager for its opt level and target; nothing else
rewrites the graph, so `--dump-ir DIR` shows each step as `NN-passname.txt`, the verifier checks
each, and the compile report times each. Target-specific passes carry `when=for_cuda` (or another
predicate of passes/target.py); `min_level=0` marks passes that run at every opt level because
the target cannot do without them.

Ordering rules (why the list is in this order; each is repeated beside the passes it orders):
 1. CUDA forms first, at every opt level: ConvTranspose, Einsum, LRN/LpPool and Quantize/
    DequantizeLinear become convolutions, matmuls, pools and elementwise arithmetic, which the CUDA
    kernels cover; done before the optimizer so that what they become folds and fuses like any
    other conv or matmul.
 2. `cleanup` first and again after each rewriting stage: constant folding turns the exporters'
    shape arithmetic (Shape -> Gather -> Concat -> Reshape) into constants once shapes are static,
    simplify removes what became a no-op, CSE merges the duplicates exporters emit, DCE drops the
    rest. These enable each other, so they run as a group to a fixed point.
 3. Quantize/DequantizeLinear decomposition (all targets) after the first cleanup (constant
    folding turns the weights' DequantizeLinear into float constants with the op's own reference
    first) and before the fusions, which then take the activations' quantize-dequantize
    arithmetic into epilogues.
 4. Pattern fusion (LayerNorm, RMSNorm, GELU) before BatchNorm folding and epilogue fusion: their
    patterns contain Add/Mul/Div by constants that affine folding would otherwise fold into a
    preceding MatMul and break up.
 4a. Canonicalization (passes/canonicalize.py) first in the pattern stage: exporters' spellings
    of one computation (dynamo's reshape-transpose-reshape for a swap of two axes, split sqrt
    scales on Q and K) become the one form the matchers and transpose elimination know; written-
    out rotary embeddings become RotaryEmbedding (on the 3-D projection where they can), so
    attention fusion finds the head split after them. A Gather by constant indices that reads
    its data whole and in order (the mask's broadcast, spelled as index arithmetic) becomes a
    Reshape (passes/canonicalize_gathers.py). Attention on 3-D (batch * heads) bmm scores
    (DeBERTa-v2, BLOOM) becomes 4-D throughout (passes/canonicalize_bmm_attention.py).
 5. Transpose elimination after cleanup (perms are constants by then) and before attention
    fusion, which expects the Q, K, V layouts in canonical form.
 6. BatchNorm and affine folding before epilogue fusion: the scale goes into the conv weights,
    leaving a bias that the epilogue absorbs. Folding emits arithmetic on constants, so cleanup
    (constant folding) runs right after.
 7. Attention fusion before epilogue fusion: the QK^T and PV MatMuls must not be taken as anchors
    first.
 7a. Horizontal GEMM fusion (CUDA) after attention fusion, which matches the Q, K, V projections
    one by one, and before epilogue fusion, which takes the stacked bias into the fused GEMM.
 8. Epilogue fusion (anchor + elementwise) before plain elementwise fusion, so that activations
    join their conv/matmul rather than a standalone elementwise kernel.
 8a. Row-norm epilogues (CUDA) after epilogue fusion: the GEMM's epilogue must hold its bias and
    residual before the normalization of its rows joins it.
 9. Channels-last layout (CUDA) after fusion: epilogue fusion anchors on the ONNX Conv, not on
    graphc.ConvNHWC, so the Fused[Conv] nodes must exist before they are converted.
10. Precision after layout and before the GEMM weight layout: it retypes everything layout made
    (the NHWC weights, the edge transposes) in one sweep, and the weight layout's choice depends
    on the final dtype (16-byte chunks hold 8 fp16 or 4 fp32 elements).
11. K-major GEMM weights (CUDA) after precision: a pure re-layout of constant weights for the
    kernels' loads; nothing after it matches GEMM weights.
12. Cast folding last: the precision pass makes the boundary Casts (after fusion, so that fusion
    sees the model's own graph), and the Casts go into the epilogue of the kernel before them or
    the load of the kernels after; it wraps whatever GEMM form rule 11 left. Then a Transpose,
    Gather or Concat takes the Cast before it or the elementwise kernel after it
    (passes/fuse_data_epilogues.py), which Cast folding may have just made.
"""

from __future__ import annotations

from collections.abc import Callable

from graphc.ir.graph import Graph
from graphc.passes.canonicalize import canonicalize
from graphc.passes.canonicalize_bmm_attention import bmm_attention_to_4d
from graphc.passes.canonicalize_gathers import gathers_to_views
from graphc.passes.canonicalize_rotary import fuse_rotary
from graphc.passes.canonicalize_views import cancel_view_chains
from graphc.passes.capabilities import FusionCapabilities
from graphc.passes.constant_folding import fold_constants
from graphc.passes.cse import eliminate_common_subexpressions
from graphc.passes.dce import eliminate_dead_code
from graphc.passes.decompose_conv_transpose import decompose_conv_transpose
from graphc.passes.decompose_einsum import decompose_einsum
from graphc.passes.decompose_qdq import decompose_qdq
from graphc.passes.decompose_rnn import decompose_rnn
from graphc.passes.decompose_tensor_scatter import decompose_tensor_scatter
from graphc.passes.decompose_window_ops import decompose_window_ops
from graphc.passes.fold_affine import fold_affine
from graphc.passes.fold_batchnorm import fold_batchnorm
from graphc.passes.fold_control_flow import fold_control_flow
from graphc.passes.fuse_attention import fuse_attention
from graphc.passes.fuse_casts import fuse_casts
from graphc.passes.fuse_data_epilogues import fuse_data_epilogues
from graphc.passes.fuse_elementwise import fuse_elementwise
from graphc.passes.fuse_epilogue import fuse_epilogues
from graphc.passes.fuse_gelu import fuse_gelu
from graphc.passes.fuse_horizontal import fuse_horizontal
from graphc.passes.fuse_layernorm import fuse_layernorm
from graphc.passes.fuse_residual_norm import fuse_residual_norm
from graphc.passes.gemm_weight_layout import k_major_gemm_weights
from graphc.passes.layout import to_channels_last
from graphc.passes.lower_int_quant import lower_int_quant
from graphc.passes.lower_optionals import lower_optionals
from graphc.passes.lower_sequences import lower_sequences
from graphc.passes.manager import FixedPoint, Pass, Stage
from graphc.passes.precision import precision_pass
from graphc.passes.quantize_fp8 import quantize_fp8
from graphc.passes.quantize_int8 import quantize_int8, quantize_qdq_int8
from graphc.passes.simplify import simplify
from graphc.passes.target import (
    Target,
    for_cuda,
    for_cuda_float,
    for_cuda_full_precision,
    for_fp8,
    for_int8,
    for_reduced_precision,
    for_row_norm_epilogues,
)
from graphc.passes.transpose import eliminate_transposes


def _with_capabilities(fn: Callable[[Graph, FusionCapabilities], Graph]) -> Callable[[Graph, Target], Graph]:
    def run(graph: Graph, target: Target) -> Graph:
        return fn(graph, target.capabilities)

    run.__name__ = fn.__name__
    return run


def cleanup() -> FixedPoint:
    return FixedPoint(
        "cleanup",
        (
            Pass("constant_folding", fold_constants),
            Pass("simplify", simplify),
            Pass("cse", eliminate_common_subexpressions),
            Pass("dce", eliminate_dead_code),
        ),
    )


def cuda_forms() -> tuple[Pass, ...]:
    """Rule 1: the ops the CUDA kernels cover only in another form, rewritten at every opt level
    (lowering would otherwise find no kernel for them)."""
    return (
        Pass("decompose_conv_transpose", decompose_conv_transpose, min_level=0, when=for_cuda),
        Pass("decompose_einsum", decompose_einsum, min_level=0, when=for_cuda),
        Pass("decompose_window_ops", decompose_window_ops, min_level=0, when=for_cuda),
        Pass("decompose_tensor_scatter", decompose_tensor_scatter, min_level=0, when=for_cuda),
        # For CUDA also at opt level 0, where rule 3's pass does not run (the CUDA target has no
        # Quantize/DequantizeLinear kernel); at level 1+ the later run then finds nothing.
        Pass("decompose_qdq", decompose_qdq, min_level=0, when=for_cuda),
        # Dynamic quantization (run-time QuantizeLinear scales, Conv/MatMulInteger with zero
        # points, DynamicQuantizeLSTM) in float ops of integer values: no kernel takes them as they are.
        Pass("lower_int_quant", lower_int_quant, min_level=0, when=for_cuda_full_precision),
        # LSTM/GRU/RNN with static shapes unrolled into GEMMs and gate arithmetic (no recurrent kernel).
        Pass("decompose_rnn", decompose_rnn, min_level=0, when=for_cuda),
    )


def stages() -> list[Stage]:
    return [
        # Control flow decided at compile time (If on constants or static shapes, small static
        # Loop/Scan) becomes tensor ops, first and at every opt level: both targets need it, and
        # what a branch or body holds then meets the CUDA forms and the optimizer like any node.
        Pass("fold_control_flow", fold_control_flow, min_level=0),
        # ---- int8 (issue 13, passes/quantize_int8.py), part 1 of 2: a QDQ model's Conv/MatMul/Gemm
        # on its own integers and scales, before constant folding turns the weights'
        # DequantizeLinear into float weights (at every opt level: the precision is the user's).
        Pass("quantize_qdq_int8", quantize_qdq_int8, min_level=0, when=for_int8, takes_target=True),
        *cuda_forms(),  # rule 1
        cleanup(),  # rule 2
        # Static-length sequences become tensor ops, once cleanup has made their splits constant.
        Pass("lower_sequences", lower_sequences),
        # Optional ops whose input's presence is known (a tensor, a sequence, no input at all).
        Pass("lower_optionals", lower_optionals),
        # Rule 3: after constant folding has turned DequantizeLinear of constant weights into float
        # weights; the activations' Quantize/DequantizeLinear become elementwise ops, which fuse.
        Pass("decompose_qdq", decompose_qdq),
        # Level 2: the algebraic rewrites and fusions, each stage followed by cleanup (rule 2).
        FixedPoint(
            "patterns",
            (
                Pass("canonicalize", canonicalize, min_level=2),  # rule 4a
                Pass("bmm_attention_to_4d", bmm_attention_to_4d, min_level=2),  # rule 4a
                Pass("gathers_to_views", gathers_to_views, min_level=2),  # rule 4a
                Pass("fuse_rotary", fuse_rotary, min_level=2),  # rule 4a
                Pass("fuse_layernorm", fuse_layernorm, min_level=2),  # rule 4
                Pass("fuse_gelu", fuse_gelu, min_level=2),  # rule 4
                Pass("eliminate_transposes", eliminate_transposes, min_level=2),  # rule 5
                *cleanup().passes,
            ),
        ),
        FixedPoint(
            "folding",
            (
                Pass("fold_batchnorm", fold_batchnorm, min_level=2),  # rule 6
                Pass("fold_affine", fold_affine, min_level=2),  # rule 6
                *cleanup().passes,
            ),
        ),
        Pass("fuse_attention", fuse_attention, min_level=2),  # rule 7
        cleanup(),
        # Rule 7a (CUDA): MatMuls sharing an input (Q, K, V) as one batched GEMM whose slabs are views,
        # after attention fusion (its matcher reads the separate projections) and before epilogue
        # fusion (which takes the stacked bias Add into that GEMM).
        Pass("fuse_horizontal", fuse_horizontal, min_level=2, when=for_cuda_float),
        # ---- int8 (issue 13), part 2 of 2: the remaining float Conv/MatMul/Gemm with constant
        # weights, calibrated on this graph (target.calibrator): after folding (final weights) and
        # attention fusion (its activation x activation MatMuls stay float), before epilogue
        # fusion (whose anchors are the float ops).
        Pass("quantize_int8", quantize_int8, min_level=0, when=for_int8, takes_target=True),
        # fp8 (issue 13): the same candidates and calibration at the same place, as E4M3 GEMMs
        # (passes/quantize_fp8.py); the precision pass (rule 10) then stores the rest in fp16.
        Pass("quantize_fp8", quantize_fp8, min_level=0, when=for_fp8, takes_target=True),
        # Both ask the target what its fused kernels can hold (target.capabilities).
        Pass("fuse_epilogues", _with_capabilities(fuse_epilogues), min_level=2, takes_target=True),  # rule 8
        Pass("fuse_elementwise", _with_capabilities(fuse_elementwise), min_level=2, takes_target=True),  # rule 8
        # Rule 8a (CUDA): a fused GEMM and the LayerNorm/RMSNorm of its rows as one kernel, once the
        # GEMM's epilogue (bias, residual) is complete.
        Pass("fuse_residual_norm", fuse_residual_norm, min_level=2, when=for_row_norm_epilogues),
        # Fusion can leave Reshape(Reshape(x)) where it looked through a reshape: collapse them.
        Pass("simplify", simplify),
        Pass("dce", eliminate_dead_code),
        # Rule 9: NHWC convolutions and pools; the pass cancels the transposes it creates itself
        # (cleanup and transpose elimination to a fixed point) when it converted anything.
        Pass("to_channels_last", to_channels_last, when=for_cuda),
        # Its NCHW restore, a flatten and a transpose after a conv are one reshape together.
        Pass("cancel_view_chains", cancel_view_chains, when=for_cuda),
        # Rule 10: at every opt level (the precision is the user's choice, not an optimization).
        Pass("convert_precision", precision_pass, min_level=0, when=for_reduced_precision, takes_target=True),
        Pass("k_major_gemm_weights", k_major_gemm_weights, when=for_cuda),  # rule 11
        Pass("fuse_casts", _with_capabilities(fuse_casts), min_level=2, takes_target=True),  # rule 12
        Pass("fuse_data_epilogues", _with_capabilities(fuse_data_epilogues), min_level=2, takes_target=True),  # rule 12
    ]
