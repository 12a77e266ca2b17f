"""`graphc.compile()`: ONNX model -> optimized graph -> kernel plan -> memory plan -> engine."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from graphc.errors import CompileError

log = logging.getLogger(__name__)

TARGETS = ("cpu", "cuda")
PRECISIONS = ("fp32", "fp16", "bf16", "int8", "fp8")
# The calibration method each quantized precision takes when none is named: int8's levels are
# uniform, so TensorRT's entropy threshold (clip outliers for resolution) suits it; E4M3's relative
# precision is the same across its range, so clipping buys little there and fp8 takes the max.
DEFAULT_CALIBRATION = {"int8": "entropy", "fp8": "minmax"}
QUANTIZED = tuple(DEFAULT_CALIBRATION)


@dataclass
class CompileOptions:
    """Every knob of a compile, in one place.

    target: "cpu" runs the plan with numpy (a reference); "cuda" generates CUDA kernels.
    precision: "fp32" | "fp16" | "bf16" (reduced precisions are the CUDA target's) | "int8" |
        "fp8" (MatMul/Gemm as FP8 E4M3 GEMMs with calibrated scales, the rest fp16: sm_90 only on
        CUDA; passes/quantize_fp8.py).
    io_precision: "model" (default: float inputs and outputs keep the model's types, cast at the
        edges) or the precision itself ("fp16", "bf16"): the engine takes and returns that type.
    shapes: input name (or symbolic dim name) -> concrete shape (or size).
    opt_level: 0 (no optimization) .. 3.
    dump_ir: a folder to write the graph after every pass (NN-passname.txt).
    verify: verify the IR after every pass (tests always do).
    arch: CUDA architectures to build cubin for (default sm_80, sm_86, sm_89, sm_90).
    tune: "off" | "fast" | "full" auto-tuning of kernel parameters (CUDA target).
    tune_budget_s: the tuner's wall-clock budget in seconds (default 60 for fast, 600 for full).
    allow_tf32: let fp32 GEMMs and convolutions use TF32 tensor cores.
    row_norm_epilogues: CUDA: a GEMM, its residual and the LayerNorm/RMSNorm after it as one kernel
        (fewer launches; off by default until it is measured faster: passes/target.py).
    pdl: CUDA: record the kernels as PDL-ready, launched programmatically on sm_90+ (docs/launches.md);
        False: every kernel is launched the ordinary way.
    tactics: CUDA: vendor tactics to use where measured faster, e.g. ("cublaslt",): GEMM steps through
        cuBLASLt (codegen/families/gemm_tactics.py, docs/tactics.md); () (default): graphc's kernels only.
    calibration_*: precision "int8" or "fp8" (graphc/calibrate.py): the samples (CALIB.npz of
    [N, *shape] per input, a folder of .npz feeds, or an iterable of feed dicts), "minmax" |
    "entropy" | "percentile" (of |x|; default entropy for int8, minmax for fp8), the percentile, a
    JSON cache of the thresholds, a (done, total) callback.
    accuracy: int8: "cosine:0.999" | "max-rel:1e-2": keep the most sensitive layers float until the
    target holds on validation_data (default: the calibration data); graphc/accuracy.py.
    """

    target: str = "cpu"
    precision: str = "fp32"
    io_precision: str = "model"
    shapes: Mapping[str, Sequence[int] | int] | None = None
    opt_level: int = 2
    dump_ir: str | Path | None = None
    verify: bool = False
    arch: Sequence[str] | None = None
    tune: str = "off"
    tune_budget_s: float | None = None
    allow_tf32: bool = False
    row_norm_epilogues: bool = False
    pdl: bool = True
    # CUDA: ops with no graphc template get kernels written by apache-tvm where graphc[tvm] is
    # installed (codegen/families/tvm_kernels.py); False refuses them (--no-tvm)
    tvm: bool = True
    tactics: Sequence[str] = ()
    cache_dir: str | Path | None = None
    progress: Callable[[str, str], None] | None = None  # (phase, "start" | "done"), for progress bars
    extra: dict[str, Any] = field(default_factory=dict)
    # ---- int8 calibration (issue 13) ----
    calibration_data: Any = None
    calibration_method: str | None = None  # None: DEFAULT_CALIBRATION of the precision
    percentile: float = 99.99
    calibration_cache: str | Path | None = None
    calibration_progress: Callable[[int, int], None] | None = None
    accuracy: str | None = None
    validation_data: Any = None
    accuracy_progress: Callable[[str], None] | None = None  # one line per point tried
    # ---- optimization profiles (issue 14; graphc/profiles.py, docs/dynamic_shapes.md) ----
    # input name -> shape, one mapping per profile (or a list of mappings: several profiles); the
    # engine then runs any shape between min and max, with its own plan built at opt.
    min_shapes: Mapping[str, Sequence[int]] | Sequence[Mapping[str, Sequence[int]]] | None = None
    opt_shapes: Mapping[str, Sequence[int]] | Sequence[Mapping[str, Sequence[int]]] | None = None
    max_shapes: Mapping[str, Sequence[int]] | Sequence[Mapping[str, Sequence[int]]] | None = None

    @property
    def has_profiles(self) -> bool:
        return any(x is not None for x in (self.min_shapes, self.opt_shapes, self.max_shapes))

    def validate(self) -> None:
        if self.target not in TARGETS:
            raise CompileError(f"target must be one of {TARGETS}, got {self.target!r}")
        if self.precision not in PRECISIONS:
            raise CompileError(f"precision must be one of {PRECISIONS}, got {self.precision!r}")
        from graphc.passes.precision import check_io_precision

        check_io_precision(self.precision, self.io_precision)
        if not 0 <= int(self.opt_level) <= 3:
            raise CompileError(f"opt_level must be 0..3, got {self.opt_level}")
        if self.tune not in ("off", "fast", "full"):
            raise CompileError(f"tune must be off, fast or full, got {self.tune!r}")
        if self.tactics:
            from graphc.codegen.families.gemm_tactics import check_tactics

            check_tactics(self.tactics)
            if self.target != "cuda":
                raise CompileError("tactics are for the cuda target")
        if self.precision == "fp8" and self.target == "cuda" and self.arch:
            from graphc.codegen.families.gemm_fp8 import check_fp8_archs

            check_fp8_archs(list(self.arch))  # before calibrating: a one-line error naming the arch
        if self.tune_budget_s is not None and not (0 < float(self.tune_budget_s) < float("inf")):
            raise CompileError(f"tune_budget_s must be a positive number of seconds, got {self.tune_budget_s!r}")
        if self.has_profiles:
            missing = [n for n in ("min_shapes", "opt_shapes", "max_shapes") if getattr(self, n) is None]
            if missing:
                raise CompileError(f"a profile needs min_shapes, opt_shapes and max_shapes; {missing[0]} is missing")
            if self.precision in QUANTIZED:
                raise CompileError(
                    f"precision {self.precision} with optimization profiles is not supported (calibrate one shape)"
                )
        if self.accuracy is not None or self.validation_data is not None:
            from graphc.accuracy import parse_accuracy

            if self.precision != "int8":
                raise CompileError("accuracy / validation_data: only with precision int8")
            if self.accuracy is None:
                raise CompileError("validation_data: only with accuracy (e.g. accuracy='cosine:0.999')")
            parse_accuracy(self.accuracy)


class _Phases:
    """Times the phases of a compile and tells the progress callback about each."""

    def __init__(self, progress: Callable[[str, str], None] | None):
        self.timings: dict[str, float] = {}
        self.progress = progress

    @contextlib.contextmanager
    def __call__(self, name: str):
        if self.progress:
            self.progress(name, "start")
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.timings[name] = round(time.perf_counter() - t0, 6)
            if self.progress:
                self.progress(name, "done")


def compile(model: Any, options: CompileOptions | None = None, **kwargs: Any):  # noqa: A001
    """Compile an ONNX model (a path, bytes, or ModelProto) into an Engine.

    Keyword arguments are CompileOptions fields: `graphc.compile("m.onnx", target="cpu",
    shapes={"input": (1, 3, 224, 224)})`.
    """
    from graphc.frontend import load_onnx

    opts = dataclasses.replace(options or CompileOptions(), **kwargs)
    opts.validate()
    if opts.target == "cpu" and opts.precision != "fp32":
        log.info(
            "cpu target in %s: the numpy references compute in that precision (a reference, not fast)", opts.precision
        )
    if opts.has_profiles:
        from graphc.profiles import compile_with_profiles

        return compile_with_profiles(model, opts)
    phase = _Phases(opts.progress)
    with phase("load"):
        graph = load_onnx(model)
    return compile_loaded(graph, model, opts, phase)


def compile_loaded(graph: Any, model: Any, opts: CompileOptions, phase: _Phases):
    """compile() from the loaded graph on: one static plan for `opts.shapes`."""
    from graphc.codegen.lower import lower_to_plan
    from graphc.codegen.memory import memory_report, plan_memory
    from graphc.ir.shapes import bind_shapes
    from graphc.passes.manager import OptimizeOptions, optimize
    from graphc.passes.report import optimizer_report

    with phase("bind_shapes"):
        graph = bind_shapes(graph, opts.shapes)
    from graphc.frontend.limits import check_value_sizes

    check_value_sizes(graph)  # a bound dim of 2**40 is one error here, not a huge allocation later
    target = pass_target(opts)
    calibrator = None
    if opts.precision in QUANTIZED:
        calibrator = _int8_calibrator(graph, opts)
        target = dataclasses.replace(target, calibrator=calibrator)
    accuracy = None
    if opts.precision == "int8" and opts.accuracy is not None:
        from graphc.accuracy import search_keep_float

        with phase("accuracy"):  # which layers stay float (graphc/accuracy.py)
            keep, accuracy = search_keep_float(graph, opts, target)
        target = dataclasses.replace(target, keep_float=keep)
    with phase("optimize"):
        result = optimize(
            graph,
            OptimizeOptions(opt_level=opts.opt_level, verify=opts.verify, dump_ir=opts.dump_ir, target=target),
        )
        optimized = result.graph
    host_ifs = None
    if any(n.op in ("If", "Loop", "Scan") and n.domain == "" for n in optimized.nodes):  # + graphc/host_loop.py
        from graphc.host_if import plan_host_ifs

        # data-dependent Ifs: both branches planned as sub-plans, chosen on the host (graphc/host_if.py)
        with phase("host_if"):
            host_ifs = plan_host_ifs(optimized, opts.opt_level, target if opts.target == "cuda" else None)
    with phase("lower"):
        plan = lower_to_plan(optimized, host_ifs=host_ifs.attrs if host_ifs else None)
        if host_ifs:
            from graphc.runtime.plan import WEIGHT, TensorSpec

            for name, a in host_ifs.weights.items():  # stored and loaded with the engine's weights
                plan.tensors[name] = TensorSpec(name, a.dtype.name, list(a.shape), int(a.nbytes), WEIGHT)
    memory = None
    if opts.target == "cpu":  # a CUDA plan's memory is planned once its kernels (workspace) are known
        with phase("memory_plan"):
            memory = plan_memory(plan)

    report = optimizer_report(graph, optimized, result.records)
    if memory is not None:
        report["memory"] = memory_report(memory)
    report["target"] = opts.target
    report["precision"] = opts.precision
    if opts.precision == "int8":
        from graphc.calibrate import Calibrator
        from graphc.passes.quantize_int8 import integer_ops

        # A QDQ model alone has no calibrator: its scales are its own (constants of the engine).
        calibrated = (calibrator or Calibrator(None, calibration_method(opts), opts.percentile)).report()
        report["quantization"] = {**calibrated, "integer_ops": integer_ops(optimized)}
        if accuracy is not None:
            report["quantization"]["accuracy"] = accuracy
    if opts.precision == "fp8":
        from graphc.passes.quantize_fp8 import fp8_report

        assert calibrator is not None  # _int8_calibrator refuses an fp8 compile without samples or a cache
        report["quantization"] = {**calibrator.report(), **fp8_report(optimized, calibrator.thresholds)}
    # what a report read on its own needs to say what it is about
    report["graphc_version"] = _graphc_version()
    report["model"] = str(model) if isinstance(model, (str, Path)) else f"<{type(model).__name__}>"
    report["input_shapes"] = {v.name: list(v.type.shape) for v in graph.inputs}
    report["steps"] = len(plan.steps)
    report["kernels"] = sum(1 for s in plan.steps if not s.alias)
    report["timings"] = phase.timings
    weights = {name: c.data for name, c in optimized.constants.items()}
    if host_ifs and host_ifs.lines:
        weights.update(host_ifs.weights)
        report["control_flow"] = host_ifs.lines
    # Not dataclasses.asdict(opts): it deep-copies every field, and calibration_data may be a generator.
    options_json = {
        f.name: _jsonable(getattr(opts, f.name))
        for f in dataclasses.fields(opts)
        if f.name
        not in ("progress", "extra", "calibration_data", "calibration_progress", "validation_data", "accuracy_progress")
        and not (f.name.endswith("_shapes") and getattr(opts, f.name) is None)
    }
    if isinstance(opts.calibration_data, (str, Path)):
        options_json["calibration_data"] = str(opts.calibration_data)
    if isinstance(opts.validation_data, (str, Path)):
        options_json["validation_data"] = str(opts.validation_data)

    if opts.target == "cpu":
        from graphc.cpu_kernels import cpu_kernel
        from graphc.runtime.cpu import CPUExecutor
        from graphc.runtime.engine import Engine

        executor = CPUExecutor(plan, memory, weights, cpu_kernel)
        return Engine("cpu", plan, memory, weights, executor, report, _build_info(opts, options_json))

    from graphc.codegen.build import build_cuda_engine

    engine = build_cuda_engine(optimized, plan, weights, opts, report, phase, host_ifs)
    engine.build_info.update(_build_info(opts, options_json))
    return engine


def pass_target(opts: CompileOptions) -> Any:
    """The target context the passes run under for `opts` (int8's calibrator aside)."""
    from graphc.passes.target import Target

    # Every rewrite, target-specific ones included, is a pass of passes/pipeline.py, switched on
    # by the target context: --dump-ir, verification and the report's per-pass times cover all.
    target = Target(
        opts.target, opts.precision, bool(opts.allow_tf32), row_norm_epilogues=bool(opts.row_norm_epilogues),
        io_precision=opts.io_precision,
    )  # fmt: skip
    if opts.target == "cuda":
        from graphc.codegen.capabilities import CUDA

        # Fusion asks the target what its kernels can hold; passes never import codegen.
        target = dataclasses.replace(target, capabilities=CUDA)
    return target


def _jsonable(v: Any) -> Any:
    if isinstance(v, Path):
        return str(v)
    if isinstance(v, Mapping):
        return {k: _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    return v


def calibration_method(opts: CompileOptions) -> str:
    """The calibration method named, else the precision's default (DEFAULT_CALIBRATION)."""
    return opts.calibration_method or DEFAULT_CALIBRATION.get(opts.precision, "entropy")


def _int8_calibrator(graph: Any, opts: CompileOptions):
    """The calibrator handed to the int8/fp8 pass; a model with no QDQ nodes needs samples or a cache
    (an fp8 compile always does: its pass has no QDQ form)."""
    from graphc.calibrate import make_calibrator

    has_qdq = opts.precision == "int8" and any(n.op == "DequantizeLinear" for n in graph.nodes)
    if opts.calibration_data is None and opts.calibration_cache is None and not has_qdq:
        raise CompileError(
            f"precision {opts.precision} needs calibration_data (--calibration-data CALIB.npz), a calibration cache"
            + (", or a model in QDQ form" if opts.precision == "int8" else "")
        )
    if opts.calibration_data is None and opts.calibration_cache is None:
        return None  # a QDQ model alone: its own scales, nothing to calibrate
    names = [v.name for v in graph.inputs]
    return make_calibrator(
        opts.calibration_data,
        names,
        calibration_method(opts),
        opts.percentile,
        opts.calibration_cache,
        opts.calibration_progress,
    )


def _graphc_version() -> str:
    from graphc._version import __version__

    return __version__


def _build_info(opts: CompileOptions, options_json: dict[str, Any]) -> dict[str, Any]:
    import platform

    import numpy

    from graphc._version import __version__

    info: dict[str, Any] = {
        "graphc": __version__,
        "target": opts.target,
        "precision": opts.precision,
        "options": options_json,
        "python": platform.python_version(),
        "numpy": numpy.__version__,
        "host": platform.node(),
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    try:
        import onnx

        info["onnx"] = onnx.__version__
    except ImportError:
        pass
    return info
