"""The ordered list of passes (see passes/manager.py for the ordering rules)."""

from __future__ import annotations

from graphc.passes.constant_folding import fold_constants
from graphc.passes.cse import eliminate_common_subexpressions
from graphc.passes.dce import eliminate_dead_code
from graphc.passes.decompose_qdq import decompose_qdq
from graphc.passes.fold_affine import fold_affine
from graphc.passes.fold_batchnorm import fold_batchnorm
from graphc.passes.fuse_attention import fuse_attention
from graphc.passes.fuse_elementwise import fuse_elementwise
from graphc.passes.fuse_epilogue import fuse_epilogues
from graphc.passes.fuse_gelu import fuse_gelu
from graphc.passes.fuse_layernorm import fuse_layernorm
from graphc.passes.lower_sequences import lower_sequences
from graphc.passes.manager import FixedPoint, Pass, Stage
from graphc.passes.simplify import simplify
from graphc.passes.transpose import eliminate_transposes


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


def stages() -> list[Stage]:
    return [
        cleanup(),
        # Static-length sequences become tensor ops, once cleanup has made their splits constant.
        Pass("lower_sequences", lower_sequences),
        # After constant folding has turned DequantizeLinear of constant weights into float weights:
        # the activations' Quantize/DequantizeLinear become elementwise ops, which later fuse.
        Pass("decompose_qdq", decompose_qdq),
        # Level 2: the algebraic rewrites and fusions, each stage followed by cleanup.
        FixedPoint(
            "patterns",
            (
                Pass("fuse_layernorm", fuse_layernorm, min_level=2),
                Pass("fuse_gelu", fuse_gelu, min_level=2),
                Pass("eliminate_transposes", eliminate_transposes, min_level=2),
                *cleanup().passes,
            ),
        ),
        FixedPoint(
            "folding",
            (
                Pass("fold_batchnorm", fold_batchnorm, min_level=2),
                Pass("fold_affine", fold_affine, min_level=2),
                *cleanup().passes,
            ),
        ),
        Pass("fuse_attention", fuse_attention, min_level=2),
        cleanup(),
        Pass("fuse_epilogues", fuse_epilogues, min_level=2),
        Pass("fuse_elementwise", fuse_elementwise, min_level=2),
        # Fusion can leave Reshape(Reshape(x)) where it looked through a reshape: collapse them.
        Pass("simplify", simplify),
        Pass("dce", eliminate_dead_code),
    ]
