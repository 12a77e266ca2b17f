"""Whole models, graphc against PyTorch like for like: one process, one GPU, the same weights and inputs.

    python tools/bench_torch.py --quick --out vs_torch.md --json vs_torch.json   # a 400 s budget
    python tools/bench_torch.py --models bert,llama --exporters torchscript,dynamo --batch 1,8,32 \\
        --precision fp16,bf16 --modes eager,default,reduce-overhead,max-autotune-no-cudagraphs
    python tools/bench_torch.py --dry-run --models resnet50,bert   # CPU, tiny configs: every path but CUDA timing

Models are tools/export_torch.py's (transformers classes, variance-preserving random weights, seed 0):
the zoo's five and five more architectures. Each is exported once per exporter (TorchScript opset 17,
and/or dynamo) with symbolic batch and sequence, and graphc compiles it per (batch, precision) for the
GPU's own arch. PyTorch runs the same module cast to the precision (attention through SDPA unless
--attention eager) in inference mode: eagerly and through torch.compile (mode default,
"reduce-overhead", "max-autotune-no-cudagraphs"; dynamic=False; recompiled per batch).

Both sides are timed the same two ways (tools/bench_timing.py): (a) the ordinary call back to back
(`engine.run(feeds)` with device inputs and outputs left on the device, against the module call): 10
warm-up calls, then 3 x 50 calls with one device sync after each 50, best mean; (b) the GPU time of
one CUDA-graph replay (graphc's captured graph; torch.cuda.CUDAGraph around the eager or compiled
module; for "reduce-overhead", whose own graphs cannot be timed alone, a torch.cuda.CUDAGraph around
the module compiled in mode default, the same inductor kernels: what reduce-overhead captures).
Cosines are each side's worst output against PyTorch fp32 eager (TF32 off); kernel counts come
from the profiler for both sides; setup time is build/compile through the end of the third call.

--budget-s bounds the run: every model first gets its exports, graphc engines and PyTorch eager;
the torch.compile modes come after (reduce-overhead, then default, then reduce-overhead's (b),
which takes default's replay where default ran and compiles mode default for it where not, then
max-autotune, the last time-boxed per model by --autotune-box-s), each compile skipped with a logged reason when its
estimated time (the model's own earlier compiles, else the mean of other models', else a prior) does
not fit in what is left. The Markdown and JSON files are rewritten after every measurement.

--io-precision fp16 (off by default): the fp16 rows' engines take and return fp16 (graphc compile
--io-precision fp16), the like-for-like IO for an fp16 PyTorch module, which takes and returns fp16;
by default graphc takes and returns the ONNX model's fp32 with a cast at each edge.

Needs torch and transformers (and onnxscript for the dynamo exporter); graphc itself never imports them.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import datetime
import gc
import logging
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_report  # noqa: E402
import bench_timing  # noqa: E402
import export_torch  # noqa: E402
import numpy as np  # noqa: E402
from bench_report import TORCH_MODES, Measure, Row  # noqa: E402
from bench_timing import Protocol  # noqa: E402

log = logging.getLogger("bench_torch")

TORCH_DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}
MODE_ALIASES = {"compile": "default", "compile-cudagraphs": "reduce-overhead"}  # the old names
# The budget's priority. RO_GRAPH is reduce-overhead's (b): a capture of mode default's compile (a
# compile of its own only where default is not among the modes), after every model's (a) of both.
RO_GRAPH = "reduce-overhead (b)"
COMPILE_ORDER = ("reduce-overhead", "default", RO_GRAPH, "max-autotune-no-cudagraphs")
# Seconds, before anything was measured: one torch.compile of a full-size model on an H200 host
# (5-60 s were seen for default/reduce-overhead), and one model's exports + engines + eager.
COMPILE_PRIOR_S = {"default": 30.0, "reduce-overhead": 30.0, "max-autotune-no-cudagraphs": 120.0}
RO_PENDING = "pending: a CUDA graph of mode default's compile (the same kernels), after the compile modes"
BASE_PRIOR_S = 15.0
FULL = {"batch": "1,8,32", "precision": "fp16,bf16", "exporters": "torchscript,dynamo", "modes": ",".join(TORCH_MODES)}
QUICK_BUDGET_S = 400.0  # with a minute's margin for a compile under way, one 9-minute GPU call
QUICK = {"batch": "1,32", "precision": "fp16", "exporters": "torchscript", "modes": "eager,reduce-overhead"}


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    """Cosine similarity of two arrays, in float64 (also used by check_quantized and precision_floor)."""
    a = np.asarray(a, dtype=np.float64).ravel()
    b = np.asarray(b, dtype=np.float64).ravel()
    den = np.linalg.norm(a) * np.linalg.norm(b)
    return float(a @ b / den) if den else float(np.array_equal(a, b))


def tensor_cosine(a: Any, b: Any) -> float | None:
    """The same on torch tensors, on their device (large logits stay off the host); None if not finite."""
    a, b = a.detach().double().flatten(), b.detach().double().to(a.device).flatten()
    den = float(a.norm() * b.norm())
    value = float(a @ b) / den if den else float(bool((a == b).all()))
    return round(value, 6) if math.isfinite(value) else None


def worst_cosine(outs: list[Any], refs: list[Any]) -> float | None:
    """The lowest cosine over the outputs, each computed on its reference's device."""
    values = [tensor_cosine(r, o) for o, r in zip(outs, refs, strict=True)]
    return None if any(v is None for v in values) else min(values)  # type: ignore[type-var]


def use_sdpa(module: Any) -> str:
    """Switch transformers' attention to scaled_dot_product_attention (export_torch builds the
    models with the written-out "eager" attention, which exports to plain ONNX ops)."""
    inner = module.model
    if not hasattr(inner.config, "_attn_implementation"):
        return ""
    if hasattr(inner, "set_attn_implementation"):
        try:
            inner.set_attn_implementation("sdpa")
        except Exception as e:  # a model without SDPA support keeps eager attention, and says so
            log.warning("%s: sdpa not available (%s); eager attention", type(inner).__name__, e)
    else:
        inner.config._attn_implementation = "sdpa"
    return inner.config._attn_implementation


def short(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:300] if text else ''}"


class Budget:
    """Wall-clock budget of the run, and estimates of what the next step will take."""

    def __init__(self, seconds: float | None):
        self.start = time.monotonic()
        self.seconds = seconds
        self.compiles: dict[str, dict[str, list[float]]] = {m: {} for m in COMPILE_PRIOR_S}
        self.bases: list[float] = []

    def left(self) -> float:
        return math.inf if self.seconds is None else self.seconds - (time.monotonic() - self.start)

    def compile_estimate(self, mode: str, model: str) -> tuple[float, str]:
        seen = self.compiles[mode]
        if seen.get(model):
            return max(seen[model]), f"{model}'s earlier {mode} compile"
        others = [max(v) for v in seen.values() if v]
        if others:
            return sum(others) / len(others), f"mean of {len(others)} other models' {mode} compiles"
        return COMPILE_PRIOR_S[mode], "prior"

    def base_estimate(self) -> float:
        return sum(self.bases) / len(self.bases) if self.bases else BASE_PRIOR_S


@dataclass
class Subject:
    """One model at one (precision, batch) on the PyTorch side: the typed module, inputs, fp32 refs."""

    module: Any
    inputs: dict[str, Any]
    feeds: dict[str, np.ndarray]
    refs: list[Any]


@dataclass
class ModelState:
    name: str
    case: export_torch.ModelCase
    master: Any  # fp32, on the CPU, eager attention: what the exporters see
    exports: dict[str, Path] = field(default_factory=dict)  # exporter -> dynamic-shape file
    static_exports: dict[tuple[str, int], Path] = field(default_factory=dict)
    export_notes: dict[str, str] = field(default_factory=dict)
    export_s: dict[str, float] = field(default_factory=dict)
    typed: dict[str, Any] = field(default_factory=dict)  # precision -> module on the device
    subjects: dict[tuple[str, int], Subject] = field(default_factory=dict)
    refs: dict[int, tuple[dict[str, np.ndarray], list[Any]]] = field(default_factory=dict)  # batch: feeds, fp32 outs
    torch: dict[tuple[str, int], dict[str, Measure]] = field(default_factory=dict)
    attention: str = ""


class Bench:
    def __init__(self, args: argparse.Namespace, argv: list[str]):
        import torch

        self.torch = torch
        self.args = args
        self.device = args.device
        self.protocol = Protocol(args.warmup, args.rounds, args.calls)
        self.sync = bench_timing.torch_sync(self.device)
        self.budget = Budget(args.budget_s)
        self.rows: list[Row] = []
        self.skipped: list[str] = []
        self.work = Path(args.export_dir) if args.export_dir else Path(tempfile.mkdtemp(prefix="bench_torch_"))
        self.work.mkdir(parents=True, exist_ok=True)
        self.header = environment(args, argv, self.protocol)
        self.arch = None
        if self.device == "cuda":
            major, minor = torch.cuda.get_device_capability()
            self.arch = [f"sm_{major}{minor}"]
            # The profiler (CUPTI) started once before any CUDA graph exists: kernels of graphs
            # instantiated later are then recorded one by one, for graphc and PyTorch alike.
            x = torch.ones(8, device="cuda")
            try:
                bench_timing.kernel_count(lambda: x + 1)
            except Exception as e:  # the counts will fail the same way, each row saying so
                log.warning("the profiler does not start (%s): kernel counts will be missing", short(e))

    # ---- output
    def save(self) -> None:
        out = Path(self.args.out) if self.args.out else None
        js = Path(self.args.json) if self.args.json else None
        bench_report.write(self.rows, self.header, self.args.modes, self.skipped, out, js)

    def skip(self, what: str, why: str) -> None:
        log.warning("skipped %s: %s", what, why)
        self.skipped.append(f"{what}: {why}")

    # ---- the run
    def run(self) -> list[Row]:
        states: list[ModelState] = []
        for i, name in enumerate(self.args.models):
            need = self.budget.base_estimate()
            if self.budget.left() < need:
                self.skip(
                    f"{name} (every measurement)", f"budget: ~{need:.0f} s needed, {self.budget.left():.0f} s left"
                )
                continue
            t0 = time.monotonic()
            try:
                states.append(self.base(name))
            except Exception as e:  # a model that cannot be built or exported: recorded, the rest go on
                log.exception("%s failed", name)
                self.skip(f"{name} (every measurement)", short(e))
            self.budget.bases.append(time.monotonic() - t0)
            log.info("%s done in %.1f s (%d of %d); %.0f s left", name, time.monotonic() - t0, i + 1,
                     len(self.args.models), self.budget.left())  # fmt: skip
        for mode in COMPILE_ORDER:
            if (mode if mode != RO_GRAPH else "reduce-overhead") in self.args.modes:
                for state in states:
                    try:
                        if mode == RO_GRAPH:
                            self.reduce_overhead_graph(state)
                        else:
                            self.compile_mode(state, mode)
                    except Exception as e:  # each compile records its own errors; this is anything else
                        log.exception("%s %s failed", state.name, mode)
                        self.skip(f"{state.name} {mode} (the rest of it)", short(e))
        for state in states:
            state.typed.clear()
            state.subjects.clear()
            state.refs.clear()
        return self.rows

    def base(self, name: str) -> ModelState:
        """Exports, the fp32 references, graphc's engines and PyTorch eager for one model."""
        case = export_torch.CASES[name].tiny() if self.args.tiny else export_torch.CASES[name]
        dims0 = {"batch": 2, "seq": self.args.seq}
        master = export_torch._module(case, self.args.seed, "scaled", dims0)
        state = ModelState(name, case, master)
        for exporter in self.args.exporters:
            self.export(state, exporter)
        for precision in self.args.precision:
            for batch in self.args.batch:
                key = (precision, batch)
                state.subjects[key] = self.subject(state, precision, batch)
                state.torch[key] = {m: Measure(skipped="not reached") for m in self.args.modes}
                for exporter in self.args.exporters:
                    row = Row(name, exporter, batch, precision, torch=state.torch[key], attention=state.attention)
                    row.graphc = self.graphc(state, exporter, precision, batch)
                    self.free_graphc()  # the engine went with graphc()'s frame
                    self.rows.append(row)
                    self.save()
                if "eager" in self.args.modes:
                    state.torch[key]["eager"] = self.torch_mode(state, "eager", precision, batch)
                    self.save()
        state.master = None  # exported and referenced: only the typed copies are needed from here
        gc.collect()
        return state

    # ---- exports
    def export(self, state: ModelState, exporter: str) -> None:
        """One export with symbolic batch and sequence; with --static-export, none here (per batch)."""
        if self.args.static_export:
            return
        torch = self.torch
        rng = np.random.default_rng(self.args.seed)
        dims = {"batch": 2, "seq": self.args.seq}  # torch.export specializes a dim of size 1
        t_args = tuple(torch.from_numpy(export_torch._example(s, dims, rng)) for s in state.case.inputs)
        path = self.work / f"{state.name}.{exporter}.onnx"
        t0 = time.perf_counter()
        try:
            with torch.no_grad():
                self.export_file(state, exporter, t_args, path, static=False)
            state.exports[exporter] = path
        except Exception as e:
            # Logged, and graphc then gets exports at the static shapes of each batch instead.
            state.export_notes[exporter] = f"dynamic-shape export failed ({short(e)}); static exports per batch"
            log.warning("%s.%s: %s", state.name, exporter, state.export_notes[exporter])
        state.export_s[exporter] = round(time.perf_counter() - t0, 2)

    def export_file(self, state: ModelState, exporter: str, t_args: tuple, path: Path, static: bool) -> None:
        # The exporters' tracer and deprecation warnings (dozens per model) are silenced: each export
        # is checked by what graphc computes from it, the cosine to PyTorch fp32.
        logging.getLogger("torch.onnx._internal.exporter._registration").setLevel(logging.ERROR)  # torchvision
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if exporter == "torchscript":
                export_torch._export_torchscript(state.master, state.case, t_args, path, static, 17)
            else:
                export_torch._export_dynamo(state.master, state.case, t_args, path, static, None, quiet=True)

    def export_path(self, state: ModelState, exporter: str, batch: int) -> Path:
        if exporter in state.exports:
            return state.exports[exporter]
        key = (exporter, batch)
        if key not in state.static_exports:
            feeds = state.subjects[(self.args.precision[0], batch)].feeds
            t_args = tuple(self.torch.from_numpy(feeds[s.name]) for s in state.case.inputs)
            path = self.work / f"{state.name}.{exporter}.b{batch}.onnx"
            with self.torch.no_grad():
                self.export_file(state, exporter, t_args, path, static=True)
            state.static_exports[key] = path
        return state.static_exports[key]

    # ---- PyTorch's side
    def subject(self, state: ModelState, precision: str, batch: int) -> Subject:
        torch = self.torch
        dev = torch.device(self.device)
        if batch not in state.refs:  # the inputs and the fp32 reference depend on the batch alone
            rng = np.random.default_rng(self.args.seed + batch)
            dims = {"batch": batch, "seq": self.args.seq}
            feeds = {s.name: export_torch._example(s, dims, rng) for s in state.case.inputs}
            state.refs[batch] = (feeds, self.reference(state, feeds))
        feeds, refs = state.refs[batch]
        dtype = getattr(torch, TORCH_DTYPES[precision])
        if precision not in state.typed:
            typed = copy.deepcopy(state.master)
            state.attention = self.attention(typed)
            state.typed[precision] = typed.to(dev, dtype).eval()
        inputs = {}
        for k, v in feeds.items():
            t = torch.from_numpy(v).to(dev)
            inputs[k] = t.to(dtype) if t.is_floating_point() else t
        return Subject(state.typed[precision], inputs, feeds, refs)

    def attention(self, module: Any) -> str:
        """PyTorch's attention for a model that has any (SDPA unless --attention eager): its name."""
        if not any("Attention" in type(m).__name__ for m in module.modules()):
            return ""
        return use_sdpa(module) if self.args.attention == "sdpa" else "eager"

    def reference(self, state: ModelState, feeds: dict[str, np.ndarray]) -> list[Any]:
        """PyTorch fp32 eager on the device (TF32 off): what both sides' cosines are measured against."""
        torch = self.torch
        ref = copy.deepcopy(state.master)
        self.attention(ref)
        ref = ref.to(self.device)
        with torch.inference_mode():
            outs = ref(**{k: torch.from_numpy(v).to(self.device) for k, v in feeds.items()})
        del ref
        return [o.float() for o in outs]

    def torch_mode(self, state: ModelState, mode: str, precision: str, batch: int, steady: bool = True) -> Measure:
        """One PyTorch mode at one (precision, batch): (a) unless not `steady`, (b), cosine, kernels."""
        torch = self.torch
        subj = state.subjects[(precision, batch)]
        m = Measure()
        with torch.inference_mode():
            try:
                t0 = time.perf_counter()
                fn = self.compiled(subj.module, mode)
                mark = torch.compiler.cudagraph_mark_step_begin if mode == "reduce-overhead" else None

                def call() -> Any:
                    if mark:
                        mark()  # a new iteration: the previous outputs may be overwritten
                    return fn(**subj.inputs)

                for _ in range(3):
                    outs = call()
                self.sync()
                m.setup_s = round(time.perf_counter() - t0, 2)
                if mode != "eager":
                    self.budget.compiles[mode].setdefault(state.name, []).append(m.setup_s)
                m.cosine = worst_cosine([o.float() for o in outs], subj.refs)
                del outs
                if steady:
                    m.a_ms = round(bench_timing.steady_ms(call, self.sync, self.protocol), 4)
            except Exception as e:
                log.warning("%s %s %s b%d: %s", state.name, mode, precision, batch, short(e))
                m.errors.append(short(e))
                return m
            if self.device != "cuda":
                m.b_skipped = "cpu: no CUDA graphs"
            elif mode == "reduce-overhead":
                m.b_skipped = RO_PENDING  # reduce_overhead_graph() fills it in, or says why not
            else:
                try:
                    graph = bench_timing.torch_capture(call)
                    m.b_ms = round(bench_timing.torch_replay_ms(graph, self.protocol), 4)
                    del graph
                except Exception as e:
                    log.warning("%s %s %s b%d (b): %s", state.name, mode, precision, batch, short(e))
                    m.errors.append(f"(b): {short(e)}")
            if self.device == "cuda" and steady:
                try:
                    m.kernels = bench_timing.kernel_count(call)
                except Exception as e:
                    m.errors.append(f"kernel count: {short(e)}")
        return m

    def compiled(self, module: Any, mode: str) -> Any:
        torch = self.torch
        if mode == "eager":
            return module
        torch._dynamo.reset()  # a fresh compile per (mode, batch): no recompiles with dynamic shapes
        if self.args.compile_backend == "inductor":
            return torch.compile(module, mode=None if mode == "default" else mode, dynamic=False)
        log.info("torch.compile backend %s: mode %s not passed (inductor's)", self.args.compile_backend, mode)
        return torch.compile(module, backend=self.args.compile_backend, dynamic=False)

    def compile_mode(self, state: ModelState, mode: str) -> None:
        box = self.args.autotune_box_s if mode == "max-autotune-no-cudagraphs" else None
        spent = 0.0
        for precision in self.args.precision:
            for batch in self.args.batch:
                key = (precision, batch)
                if key not in state.subjects:
                    continue
                what = f"{state.name} {mode} {precision} batch {batch}"
                est, basis = self.budget.compile_estimate(mode, state.name)
                why = None
                if self.budget.left() < est:
                    why = f"budget: ~{est:.0f} s needed ({basis}), {self.budget.left():.0f} s left"
                elif box is not None and spent + est > box:
                    why = f"over the per-model box of {box:.0f} s (spent {spent:.0f} s, next ~{est:.0f} s, {basis})"
                if why:
                    self.skip(what, why)
                    state.torch[key][mode] = Measure(skipped=why)
                else:
                    t0 = time.monotonic()
                    state.torch[key][mode] = self.torch_mode(state, mode, precision, batch)
                    spent += time.monotonic() - t0
                    self.torch._dynamo.reset()
                self.save()
        if self.device == "cuda":
            self.torch.cuda.empty_cache()

    def reduce_overhead_graph(self, state: ModelState) -> None:
        """(b) for reduce-overhead: its CUDA graphs are cudagraph trees inside the compiled callable,
        which cannot be replayed on their own. What they hold is mode default's inductor kernels, so
        (b) is a torch.cuda.CUDAGraph around the module compiled in mode default, captured after
        warm-up, as reduce-overhead does internally: default's own (b) where that mode ran, else a
        compile of mode default for (b) alone (budgeted like any compile)."""
        for key, measures in state.torch.items():
            ro = measures.get("reduce-overhead")
            if ro is None or ro.b_skipped != RO_PENDING:
                continue  # skipped, failed, or on the CPU: its own reason stands
            precision, batch = key
            default = measures.get("default")
            if default is not None and default.b_ms is not None:
                ro.b_ms, ro.b_skipped = default.b_ms, None
                ro.extra["b_of"] = "mode default's CUDA-graph replay (the same kernels)"
                continue
            what = f"{state.name} reduce-overhead (b) {precision} batch {batch}"
            est, basis = self.budget.compile_estimate("default", state.name)
            if self.budget.left() < est:
                ro.b_skipped = f"budget: ~{est:.0f} s needed for a mode-default compile ({basis}), " \
                    f"{self.budget.left():.0f} s left"  # fmt: skip
                self.skip(what, ro.b_skipped)
                self.save()
                continue
            m = self.torch_mode(state, "default", precision, batch, steady=False)  # records its compile time
            self.torch._dynamo.reset()
            ro.b_skipped = None
            ro.b_ms = m.b_ms
            ro.extra["b_of"] = "torch.cuda.CUDAGraph around torch.compile(mode=default), compiled for (b) alone"
            ro.extra["b_compile_s"] = m.setup_s
            ro.errors += [e if e.startswith("(b)") else f"(b): {e}" for e in m.errors]
            if m.b_ms is None and not m.errors:
                ro.errors.append("(b): no replay time")
            self.save()

    # ---- graphc's side
    def graphc(self, state: ModelState, exporter: str, precision: str, batch: int) -> Measure:
        import onnx

        import graphc

        m = Measure()
        subj = state.subjects[(precision, batch)]
        if exporter in state.export_notes:
            m.extra["export"] = state.export_notes[exporter]
        try:
            path = self.export_path(state, exporter, batch)
            proto = onnx.load(str(path), load_external_data=False)
            names, m.extra["onnx_nodes"] = [i.name for i in proto.graph.input], len(proto.graph.node)
            del proto
            t0 = time.perf_counter()
            io = self.io_precision(precision)
            if io != "model":
                m.extra["io_precision"] = io
            engine = graphc.compile(
                str(path),
                target=self.device,
                precision=precision,
                **({"io_precision": io} if io != "model" else {}),
                arch=self.arch,
                shapes={n: list(subj.feeds[n].shape) for n in names},
                allow_tf32=self.args.allow_tf32,
                **({"tactics": self.args.tactics} if self.args.tactics else {}),
                **self.args.graphc_option,
            )
            if self.args.tactics:
                m.extra["vendor_steps"] = sum(1 for st in engine.plan.steps if st.vendor is not None)
            m.extra["compile_s"] = round(time.perf_counter() - t0, 2)
            feeds = self.graphc_feeds(engine, subj.feeds)
            for _ in range(3):
                engine.run(feeds)
            self.sync()
            m.setup_s = round(time.perf_counter() - t0, 2)
            m.extra["plan_kernels"] = engine.report.get("kernels")
            outs = engine.run(feeds, to_numpy=True) if self.device == "cuda" else engine.run(feeds)
            got = [self.torch.from_numpy(np.asarray(outs[n], dtype=np.float32)) for n in state.case.outputs]
            m.cosine = worst_cosine(got, subj.refs)
            kwargs = self.graphc_run_kwargs(engine, feeds)
            m.extra["call"] = f"engine.run(feeds{''.join(f', {k}={v}' for k, v in kwargs.items())})"
            m.a_ms = round(bench_timing.steady_ms(lambda: engine.run(feeds, **kwargs), self.sync, self.protocol), 4)
        except Exception as e:
            log.warning("graphc %s.%s %s b%d: %s", state.name, exporter, precision, batch, short(e))
            m.errors.append(short(e))
            return m
        if self.device != "cuda":
            m.b_skipped = "cpu: no CUDA graphs"
            m.kernels = m.extra["plan_kernels"]
        else:
            try:
                m.b_ms = round(bench_timing.graphc_replay_ms(engine, self.protocol), 4)
            except Exception as e:
                m.errors.append(f"(b): {short(e)}")
            try:
                m.kernels = bench_timing.kernel_count(lambda: bench_timing.graphc_replay_once(engine))
            except Exception as e:
                m.errors.append(f"kernel count: {short(e)}")
            if m.kernels is None:
                m.kernels = m.extra["plan_kernels"]
                m.extra["kernels_from"] = "plan (the profiler saw none)"
        return m

    def io_precision(self, precision: str) -> str:
        """graphc's io_precision for a row of `precision`: --io-precision where it is the row's own
        (an fp16 engine with fp16 inputs and outputs, as the fp16 torch module takes and returns),
        else the model's declared IO types (fp32 in and out, cast at the engine's edges)."""
        return self.args.io_precision if self.args.io_precision == precision else "model"

    def graphc_feeds(self, engine: Any, feeds: dict[str, np.ndarray]) -> dict[str, Any]:
        """The inputs in the engine's own dtypes, on its device (cupy arrays: no conversion per call)."""
        out = {}
        for spec in engine.inputs:
            x = feeds[spec.name]
            if str(x.dtype) != spec.dtype:
                log.info("input %s: %s -> the engine's %s", spec.name, x.dtype, spec.dtype)
                x = x.astype(spec.dtype)
            out[spec.name] = x
        if self.device == "cuda":
            import cupy

            out = {k: cupy.asarray(v) for k, v in out.items()}
        return out

    def graphc_run_kwargs(self, engine: Any, feeds: dict[str, Any]) -> dict[str, Any]:
        """engine.run waits for its stream by default; the module call of PyTorch does not. Unless
        --graphc-sync, graphc is called without that wait too (sync=False), where the engine takes it."""
        if self.device != "cuda" or self.args.graphc_sync:
            return {}
        try:
            engine.run(feeds, sync=False)
            return {"sync": False}
        except TypeError as e:
            log.warning("engine.run takes no sync=False (%s): timed with its default wait per call", e)
            return {}

    def free_graphc(self) -> None:
        gc.collect()
        if self.device == "cuda":
            import cupy

            cupy.get_default_memory_pool().free_all_blocks()


def environment(args: argparse.Namespace, argv: list[str], p: Protocol) -> dict[str, Any]:
    import torch
    import transformers

    import graphc

    env: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__,
                           "transformers": transformers.__version__, "graphc": graphc.__version__}  # fmt: skip
    with contextlib.suppress(Exception):  # the commit measured, where the tree is a git checkout
        env["commit"] = subprocess.run(
            ["git", "-C", str(Path(__file__).resolve().parents[1]), "rev-parse", "--short", "HEAD"],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout.strip()  # fmt: skip
    for mod in ("onnx", "onnxscript", "cupy"):
        with contextlib.suppress(ImportError):
            env[mod] = __import__(mod).__version__
    try:
        from cuda.bindings import nvrtc

        env["nvrtc"] = ".".join(map(str, nvrtc.nvrtcVersion()[1:]))
    except Exception:
        pass
    if args.device == "cuda":
        env["gpu"] = torch.cuda.get_device_name()
        env["sm"] = "".join(map(str, torch.cuda.get_device_capability()))
        env["cuda (torch)"] = torch.version.cuda
        env["cudnn"] = torch.backends.cudnn.version()
        try:
            env["driver"] = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True, text=True, timeout=20, check=True,
            ).stdout.strip().splitlines()[0]  # fmt: skip
        except Exception as e:
            env["driver"] = f"unknown ({short(e)})"
    else:
        env["cpu"] = f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores"
    method = (
        f"(a) ordinary call back to back: {p.warmup} warm-up calls, then {p.rounds} x {p.calls} calls with one "
        f"device sync after each {p.calls}, best mean (ms). (b) one CUDA-graph replay: CUDA events around "
        f"{p.calls} replays, best of {p.rounds} (ms). graphc / best = graphc over the fastest PyTorch mode under "
        f"the same method. Cosines: worst output against PyTorch fp32 eager, TF32 off. Setup: build or compile "
        f"through the end of the third call. PyTorch attention: {args.attention}; torch.compile dynamic=False, "
        f"backend {args.compile_backend}, a fresh compile per row (inductor's on-disk caches as found)."
    )
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": "python tools/bench_torch.py " + " ".join(argv),
        "environment": env,
        "method": method,
        "protocol": {"warmup": p.warmup, "rounds": p.rounds, "calls": p.calls},
        "models": {n: export_torch.CASES[n].description for n in args.models},
        "seq": args.seq,
        "tiny": args.tiny,
        "budget_s": args.budget_s,
        "io_precision": args.io_precision,
        "tactics": args.tactics,
        "graphc_options": args.graphc_option,
    }


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default=",".join(export_torch.CASES), help=f"from {','.join(export_torch.CASES)}")
    p.add_argument("--exporters", help="comma-separated: torchscript,dynamo (default both)")
    p.add_argument("--batch", help="comma-separated batch sizes (default 1,8,32)")
    p.add_argument("--precision", help="comma-separated: fp16,bf16,fp32 (default fp16,bf16)")
    p.add_argument("--modes", help=f"PyTorch's, comma-separated (default all): {','.join(TORCH_MODES)}")
    p.add_argument("--seq", type=int, default=None, help="sequence length of the text models (default 128)")
    p.add_argument(
        "--quick",
        action="store_true",
        help=f"batch 1,32; fp16; torchscript; eager,reduce-overhead; --budget-s {QUICK_BUDGET_S:.0f} "
        "(the flags given override these)",
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="tiny configs on the CPU, 1 warm-up and 2 x 2 calls: every code path but CUDA timing",
    )
    p.add_argument("--tiny", action="store_true", help="the tiny configs of export_torch (implied by --dry-run)")
    p.add_argument("--device", choices=["cuda", "cpu"], default=None, help="default cuda (cpu with --dry-run)")
    p.add_argument("--budget-s", type=float, default=None, help="wall-clock budget of the whole run (seconds)")
    p.add_argument(
        "--autotune-box-s",
        type=float,
        default=120.0,
        help="max-autotune-no-cudagraphs: at most this many seconds of compiling per model",
    )
    p.add_argument("--warmup", type=int, default=None, help="default 10 (1 with --dry-run)")
    p.add_argument("--rounds", type=int, default=None, help="default 3 (2 with --dry-run)")
    p.add_argument("--calls", type=int, default=None, help="calls (replays) per round; default 50 (2 with --dry-run)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--attention", choices=["sdpa", "eager"], default="sdpa", help="PyTorch's attention")
    p.add_argument(
        "--compile-backend",
        default=None,
        help="torch.compile backend: inductor (default), or eager, the default with --dry-run (Inductor's C++ "
        "compiles of the CPU take minutes; eager still goes through dynamo, guards and every mode's code path)",
    )
    p.add_argument("--static-export", action="store_true", help="export at each batch's static shapes")
    p.add_argument("--graphc-sync", action="store_true", help="time engine.run with its default wait per call")
    p.add_argument(
        "--io-precision",
        choices=["model", "fp16", "bf16"],
        default="model",
        help="graphc's engine IO types: model (default: the ONNX model's fp32 inputs and outputs, cast at the "
        "engine's edges), or fp16/bf16: the rows of that --precision compile with io_precision of it, so the "
        "engine takes and returns fp16/bf16 tensors, like for like with the PyTorch module cast to fp16/bf16, "
        "which takes and returns them too (GPT-2 at batch 32 then writes 412 MB of logits instead of 823)",
    )
    p.add_argument(
        "--tactics",
        default="",
        help="graphc's vendor tactics, comma-separated (graphc compile --tactics): cublaslt runs the GEMMs its "
        "rule picks through cuBLASLt, as torch.compile's GEMMs run through cuBLAS (default: none)",
    )
    p.add_argument(
        "--graphc-option",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="a graphc CompileOptions field for every engine (repeatable; true/false, integers, else a "
        "string), e.g. row_norm_epilogues=true for an A/B run of an option that is off by default",
    )
    p.add_argument("--allow-tf32", action="store_true", help="TF32 for fp32 matmuls/convs, in graphc and PyTorch")
    p.add_argument("--export-dir", help="keep the ONNX exports here (default: a temporary folder)")
    p.add_argument("--out", help="Markdown table")
    p.add_argument("--json", help="JSON file")
    p.add_argument("-v", "--verbose", action="store_true")
    a = p.parse_args(argv)
    for k, full in FULL.items():  # a flag given wins over --quick, which wins over the full set
        if getattr(a, k) is None:
            setattr(a, k, QUICK[k] if a.quick else full)
    if a.quick and a.budget_s is None:
        a.budget_s = QUICK_BUDGET_S
    if a.dry_run:
        a.tiny = True
        a.device = a.device or "cpu"
        a.compile_backend = a.compile_backend or "eager"
    a.compile_backend = a.compile_backend or "inductor"
    a.device = a.device or "cuda"
    a.seq = a.seq or (16 if a.tiny else 128)
    a.warmup = a.warmup if a.warmup is not None else (1 if a.dry_run else 10)
    a.rounds = a.rounds or (2 if a.dry_run else 3)
    a.calls = a.calls or (2 if a.dry_run else 50)
    a.models = [m.strip() for m in a.models.split(",") if m.strip()]
    a.tactics = [t.strip() for t in a.tactics.split(",") if t.strip()]
    a.graphc_option = dict(_compile_option(p, o) for o in a.graphc_option)
    a.exporters = [e.strip() for e in a.exporters.split(",") if e.strip()]
    a.precision = [x.strip() for x in a.precision.split(",") if x.strip()]
    a.modes = [MODE_ALIASES.get(m.strip(), m.strip()) for m in a.modes.split(",") if m.strip()]
    try:
        a.batch = [int(b) for b in a.batch.split(",") if b.strip()]
    except ValueError:
        p.error(f"--batch takes integers, got {a.batch!r}")
    bad = [m for m in a.models if m not in export_torch.CASES]
    bad += [e for e in a.exporters if e not in export_torch.EXPORTERS]
    bad += [x for x in a.precision if x not in TORCH_DTYPES]
    bad += [m for m in a.modes if m not in TORCH_MODES]
    if bad or not (a.models and a.exporters and a.precision and a.modes and a.batch):
        p.error(f"unknown or empty: {', '.join(bad) or 'a list'} (models {','.join(export_torch.CASES)}; "
                f"exporters {','.join(export_torch.EXPORTERS)}; precisions {','.join(TORCH_DTYPES)}; "
                f"modes {','.join(TORCH_MODES)})")  # fmt: skip
    a.modes = [m for m in TORCH_MODES if m in a.modes]  # the table's order
    return a


def _compile_option(p: argparse.ArgumentParser, text: str) -> tuple[str, Any]:
    """FIELD=VALUE of --graphc-option, checked against CompileOptions' fields."""
    import dataclasses

    from graphc.compiler import CompileOptions

    field, sep, value = text.partition("=")
    names = {f.name for f in dataclasses.fields(CompileOptions)}
    if not sep or field not in names:
        p.error(f"--graphc-option {text!r}: expected FIELD=VALUE with FIELD one of {', '.join(sorted(names))}")
    if value.lower() in ("true", "false"):
        return field, value.lower() == "true"
    return field, int(value) if value.lstrip("-").isdigit() else value


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")  # fmt: skip
    log.setLevel(logging.INFO)
    try:
        import torch
        import transformers  # noqa: F401
    except ImportError as e:
        print(f"bench_torch: needs torch and transformers ({e}): pip install torch transformers", file=sys.stderr)
        return 2
    if args.device == "cuda" and not torch.cuda.is_available():
        print("bench_torch: no CUDA device here (--device cpu --dry-run runs without one)", file=sys.stderr)
        return 2
    # Both sides compute fp32 without TF32 unless asked: the fp32 reference must be fp32.
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = bool(args.allow_tf32)
    bench = Bench(args, argv)
    rows = bench.run()
    bench.save()
    failed = [r for r in rows if r.graphc.errors or any(t.errors for t in r.torch.values())]
    print(f"{len(rows)} rows, {len(rows) - len(failed)} without errors, {len(bench.skipped)} skips; "
          f"{time.monotonic() - bench.budget.start:.0f} s")  # fmt: skip
    for g in bench_report.geomeans(rows):
        a, b = g["a"], g["b"]
        print(f"geomean graphc/best {g['exporter']} {g['precision']} b{g['batch']}: "
              f"(a) {a['geomean']} ({a['n']}/{a['of']})  (b) {b['geomean']} ({b['n']}/{b['of']})")  # fmt: skip
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
