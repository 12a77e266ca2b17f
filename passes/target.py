"""The target context: what the pipeline compiles for, so that target-specific rewrites are
ordinary passes switched on by it (never code inside `compile()`).

A pass in passes/pipeline.py carries a `when` predicate over this context; the pass manager runs
it only where the predicate holds. The predicates below are the ones the pipeline uses, named so
that the pipeline reads as a list of rules ("for CUDA", "for reduced precision").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from graphc.passes.capabilities import REFERENCE, FusionCapabilities

if TYPE_CHECKING:
    from graphc.ir.graph import Graph

TARGET_NAMES = ("cpu", "cuda")
PRECISIONS = ("fp32", "fp16", "bf16", "int8", "fp8")
# (graph at the int8 pass, names of the float tensors to quantize) -> name -> calibrated amax;
# compile() hands in graphc/calibrate.py's Calibrator (passes never run the interpreter themselves).
Calibrator = Callable[["Graph", Sequence[str]], Mapping[str, float]]


@dataclass(frozen=True)
class Target:
    """name: "cpu" (the numpy reference executor) or "cuda" (generated CUDA kernels).
    precision: the storage type of float tensors inside the engine ("fp32", "fp16", "bf16"), or
    "int8": Conv/MatMul/Gemm in integer arithmetic (passes/quantize_int8.py), the rest fp32;
    "fp8": MatMul/Gemm as FP8 E4M3 GEMMs (passes/quantize_fp8.py), the rest fp16.
    allow_tf32: fp32 GEMMs and convolutions may use TF32 tensor cores (read by codegen; no pass
    changes the graph for it, it is here so that a pass that must know can ask).
    capabilities: what the target's fused kernels can hold (passes/capabilities.py); compile()
    hands in codegen's for CUDA. The default is the reference executor's (the CPU engine).
    """

    name: str = "cpu"
    precision: str = "fp32"
    allow_tf32: bool = False
    capabilities: FusionCapabilities = REFERENCE
    calibrator: Calibrator | None = None  # int8 and fp8: where activation ranges come from
    # int8 only: names of the Conv/MatMul/Gemm nodes the int8 pass leaves in float (the layers
    # graphc/accuracy.py's search keeps out of int8 for an accuracy target).
    keep_float: frozenset[str] = frozenset()
    # GEMM + residual + LayerNorm/RMSNorm as one kernel (passes/fuse_residual_norm.py). Off by
    # default: on an H200 (2026-12-03, docs/results/rownorm_wgmma_cluster_h200_2026-12-03.md) the
    # models at batch 1 are 10-17% slower with it (BERT-base 0.502 ms against 0.455, 65 kernels
    # against 101), on sm_90's wgmma cluster kernel; on mma.sync (older archs) it was 0.82.
    row_norm_epilogues: bool = False
    # "model": float inputs and outputs in the model's declared types; "fp16"/"bf16" (equal to the
    # precision): declared in that type, no Cast at the edges (passes/precision.py)
    io_precision: str = "model"

    def __post_init__(self) -> None:
        if self.name not in TARGET_NAMES:
            raise ValueError(f"target must be one of {TARGET_NAMES}, got {self.name!r}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {self.precision!r}")

    @property
    def is_cuda(self) -> bool:
        return self.name == "cuda"

    @property
    def reduced_precision(self) -> bool:
        """Float tensors stored in 16 bits: fp16, bf16, and fp8 (an fp16 engine with E4M3 GEMMs)."""
        return self.precision in ("fp16", "bf16", "fp8")

    @property
    def storage_precision(self) -> str:
        """The precision float tensors are stored in: fp8 engines store fp16 outside their GEMMs."""
        return "fp16" if self.precision == "fp8" else self.precision

    def __str__(self) -> str:
        return f"{self.name}/{self.precision}" + ("/tf32" if self.allow_tf32 else "")


CPU = Target()


def for_cuda(target: Target) -> bool:
    """CUDA only: the CUDA kernels cover some ops only in another form, or want another layout."""
    return target.is_cuda


def for_cuda_float(target: Target) -> bool:
    """CUDA float engines: fusions whose fused kernels the int8 and fp8 paths have no form of (their
    GEMMs have no row-norm epilogue), and which would move the tensors they calibrate away from the
    CPU engine's (which must compute the same quantized values)."""
    return target.is_cuda and target.precision not in ("int8", "fp8")


def for_cuda_full_precision(target: Target) -> bool:
    """CUDA engines that keep fp32 (fp32 and int8): rewrites whose float form is exact only in fp32,
    such as integer sums carried as floats (passes/lower_int_quant.py: fp16 holds integers exactly
    only up to 2048)."""
    return target.is_cuda and not target.reduced_precision


def for_row_norm_epilogues(target: Target) -> bool:
    """CUDA float engines that asked for row-norm epilogues (Target.row_norm_epilogues)."""
    return for_cuda_float(target) and target.row_norm_epilogues


def for_reduced_precision(target: Target) -> bool:
    """fp16/bf16 engines (CPU too: its numpy references then compute in that precision)."""
    return target.reduced_precision


def for_int8(target: Target) -> bool:
    """int8 engines: Conv/MatMul/Gemm become integer ops with calibrated or QDQ scales."""
    return target.precision == "int8"


def for_fp8(target: Target) -> bool:
    """fp8 engines: MatMul/Gemm become E4M3 GEMMs with calibrated scales."""
    return target.precision == "fp8"
