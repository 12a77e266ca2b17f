"""The `graphc` command line: compile, run, bench, inspect, check, cache.

User errors (bad files, unsupported ops, wrong shapes, corrupt engines, bad flags) print one line
and exit with status 2; `--debug` (before or after the command) shows the traceback instead.
Every file the CLI will write is checked before any work starts, so a compile never fails after
the engine is written.

Each subcommand is one block: an `_add_NAME(sub)` that declares its parser and a `_cmd_NAME(args)`
that runs it; `build_parser` lists the blocks. Flags from trtexec / Polygraphy are accepted where
they mean the same thing (--saveEngine, --fp16, --bf16, --int8, --loadInputs, --atol).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from graphc._version import __version__

EXIT_USER_ERROR = 2
EXIT_MISMATCH = 1


class UsageError(Exception):
    pass


# ---- argument helpers --------------------------------------------------------------------------


def parse_shapes(text: str | None) -> dict[str, Any] | None:
    """'input:1x3x224x224,mask:1x128' or 'batch=8,seq=128' (symbolic dims by name). Every size >= 1."""
    if not text:
        return None
    out: dict[str, Any] = {}
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if "=" in part:
            name, _, val = part.partition("=")
            try:
                size = int(val)
            except ValueError:
                raise UsageError(f"--shapes: '{part}': a dim size must be an integer") from None
            if size < 1:
                raise UsageError(f"--shapes: '{part}': a dim size must be at least 1")
            out[name.strip()] = size
            continue
        name, sep, dims = part.rpartition(":")
        if not sep or not name:
            raise UsageError(f"--shapes: '{part}' is not NAME:1x3x224x224 or DIM=N")
        try:
            shape = tuple(int(d) for d in dims.lower().split("x"))
        except ValueError:
            raise UsageError(f"--shapes: '{part}': dims must be integers separated by x") from None
        if any(d < 1 for d in shape):
            raise UsageError(f"--shapes: '{part}': every dim must be at least 1")
        out[name] = shape
    return out


def parse_arch(text: str | None) -> list[str] | None:
    """'sm_80,sm_90' -> ['sm_80', 'sm_90']; each must be sm_NN (sm_90a for Hopper's wgmma)."""
    if not text:
        return None
    archs = [a.strip() for a in text.split(",") if a.strip()]
    bad = [a for a in archs if not re.fullmatch(r"sm_\d{2,3}a?", a)]
    if bad or not archs:
        raise UsageError(f"--arch {text}: give CUDA archs as sm_NN, e.g. sm_80,sm_90")
    return archs


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not an integer") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {n}")
    return n


def non_negative_int(text: str) -> int:
    """argparse type: an integer >= 0."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not an integer") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"must be at least 0, got {n}")
    return n


def non_negative_float(text: str) -> float:
    try:
        x = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a number") from None
    if not x >= 0:  # also refuses nan
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return x


def check_output_path(path: str | Path, flag: str, *, not_same_as: Sequence[tuple[str, Path]] = ()) -> Path:
    """A file the CLI will write: its folder must exist, it must not be a folder, and it must not be
    one of the files in `not_same_as` (the model, its weights, another output)."""
    p = Path(path)
    if p.is_dir():
        raise UsageError(f"{flag} {path}: is a folder; give a file name")
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir():
        raise UsageError(f"{flag} {path}: the folder {parent} does not exist")
    if not os.access(parent, os.W_OK):
        raise UsageError(f"{flag} {path}: the folder {parent} is not writable")
    for what, other in not_same_as:
        if _same_file(p, other):
            raise UsageError(f"{flag} {path}: is {what}; it would be overwritten, give another name")
    return p


def _same_file(a: Path, b: Path) -> bool:
    try:
        if a.exists() and b.exists():
            return os.path.samefile(a, b)
    except OSError:
        pass
    return a.resolve() == b.resolve()


def _progress_printer(console):
    """Prints one line per finished compile phase; a phase left by an exception gets a cross."""
    import time

    state: dict[str, Any] = {}

    def cb(phase: str, event: str) -> None:
        if event == "start":
            state[phase] = time.perf_counter()
            if console is not None and console.is_terminal:
                console.print(f"[dim]  {phase} ...[/dim]", end="\r")
            return
        ms = (time.perf_counter() - state.get(phase, time.perf_counter())) * 1000
        failed = sys.exc_info()[0] is not None  # called from the phase's `finally` while an error leaves it
        if console:
            mark = "[red]✗[/red]" if failed else "[green]✓[/green]"
            console.print(f"  {mark} {phase:<12} {ms:9.1f} ms{'  failed' if failed else ''}")
        else:
            print(f"  {'FAILED ' if failed else ''}{phase:<12} {ms:9.1f} ms", file=sys.stderr)

    return cb


def _console():
    try:
        from rich.console import Console

        return Console(stderr=True, highlight=False)
    except ImportError:
        return None


# ---- compile -----------------------------------------------------------------------------------


@dataclass
class _ModelInfo:
    """What the CLI reads from an ONNX file before compiling, to check flags against it."""

    inputs: dict[str, list[int | str | None] | None]  # name -> dims (a str: symbolic; None: unknown)
    data_files: list[Path] = field(default_factory=list)  # external weight files

    @property
    def dim_names(self) -> list[str]:
        names: list[str] = []
        for dims in self.inputs.values():
            for d in dims or ():
                if isinstance(d, str) and d not in names:
                    names.append(d)
        return names


def _read_model_info(path: Path) -> _ModelInfo | None:
    """Input names and dims of an ONNX file (its weights are not read). None when the file does not
    parse: the compile then reports why, with the frontend's message."""
    import onnx

    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception:  # protobuf's DecodeError and friends: the frontend names them properly
        return None
    graph = model.graph
    inits = {t.name for t in graph.initializer}
    inputs: dict[str, list[int | str | None] | None] = {}
    for vi in graph.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        if not tt.HasField("shape"):
            inputs[vi.name] = None
            continue
        inputs[vi.name] = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim]
    files = set()
    for t in graph.initializer:
        for kv in t.external_data:
            if kv.key == "location":
                files.add(path.parent / kv.value)
    return _ModelInfo(inputs, sorted(files))


def check_shapes_against_model(shapes: dict[str, Any] | None, info: _ModelInfo) -> None:
    """Every name in --shapes is an input (given a full shape) or a symbolic dim (given a size)."""
    if not shapes:
        return
    described = ", ".join(
        f"{n} [{', '.join('?' if d is None else str(d) for d in dims)}]" if dims is not None else f"{n} [unknown rank]"
        for n, dims in info.inputs.items()
    )
    dim_names = info.dim_names
    for name, value in shapes.items():
        if name in info.inputs:
            if isinstance(value, int):
                dims = info.inputs[name] or []
                example = "x".join(str(d) if isinstance(d, int) else "N" for d in dims) or "N"
                raise UsageError(
                    f"--shapes {name}={value}: '{name}' is an input; give its shape, e.g. {name}:{example}"
                )
            continue
        if isinstance(value, tuple):
            raise UsageError(f"--shapes {name}:...: the model has no input '{name}'; its inputs are {described}")
        if name not in dim_names:
            known = f"its symbolic dims are {', '.join(dim_names)}" if dim_names else "it has no symbolic dims"
            raise UsageError(f"--shapes {name}={value}: no input of the model has a dim named '{name}'; {known}")


def _resolve_precision(args: argparse.Namespace) -> str:
    """--precision, or trtexec's --fp16 / --bf16 / --int8 (one of them)."""
    flags = [f for f in ("fp16", "bf16", "int8") if getattr(args, f, False)]
    if len(flags) > 1:
        raise UsageError(f"give one of {', '.join('--' + f for f in flags)}, not several")
    if flags:
        if args.precision is not None and args.precision != flags[0]:
            raise UsageError(f"--{flags[0]} and --precision {args.precision} disagree")
        return flags[0]
    return args.precision or "fp32"


def _check_target_flags(args: argparse.Namespace) -> None:
    if args.target != "cpu":
        return
    given = [
        flag
        for flag, on in (
            ("--arch", args.arch),
            ("--tune", args.tune not in (None, "off")),
            ("--tune-budget-s", args.tune_budget_s is not None),
            ("--allow-tf32", args.allow_tf32),
            ("--no-pdl", args.no_pdl),
            ("--no-tvm", getattr(args, "no_tvm", False)),
            ("--tactics", bool(getattr(args, "tactics", None))),
        )
        if on
    ]
    if given:
        raise UsageError(f"{', '.join(given)}: only for --target cuda; the cpu target runs numpy references")


def _add_compile(sub) -> None:
    c = sub.add_parser("compile", help="compile an ONNX model into an engine file", parents=[_common()])
    c.add_argument("model", help="path to an .onnx file")
    c.add_argument("-o", "--output", "--saveEngine", dest="output", required=True, help="engine file to write")
    c.add_argument("--target", choices=["cuda", "cpu"], default="cuda", help="cuda (default) or cpu (reference)")
    c.add_argument(
        "--arch", help="comma-separated CUDA archs for cubin (default: the local GPU, else sm_80,sm_86,sm_89,sm_90)"
    )
    c.add_argument(
        "--precision", choices=["fp32", "fp16", "bf16", "int8", "fp8"], default=None,
        help="default fp32; fp8: MatMul/Gemm as FP8 E4M3 GEMMs, the rest fp16 (CUDA: sm_90 only; "
        "needs --calibration-data)",
    )  # fmt: skip
    c.add_argument("--fp16", action="store_true", help="same as --precision fp16 (trtexec)")
    c.add_argument("--bf16", action="store_true", help="same as --precision bf16 (trtexec)")
    c.add_argument("--int8", action="store_true", help="same as --precision int8 (trtexec)")
    c.add_argument(
        "--io-precision", choices=["model", "fp16", "bf16"], default="model",
        help="float inputs/outputs: the model's types (default, cast at the edges), or the --precision itself: "
        "the engine takes and returns fp16/bf16 (trtexec --inputIOFormats/--outputIOFormats=fp16)",
    )  # fmt: skip
    # ---- int8 calibration (issue 13; graphc/calibrate.py) ----
    c.add_argument("--calibration-data", help="int8/fp8: CALIB.npz (per input [N, *shape]) or a folder of .npz feeds")
    c.add_argument(
        "--calibration-method", choices=["minmax", "entropy", "percentile"], default=None,
        help="default entropy for int8, minmax for fp8",
    )  # fmt: skip
    c.add_argument("--percentile", type=float, default=99.99, help="for --calibration-method percentile")
    c.add_argument("--calibration-cache", help="int8/fp8: JSON file of calibrated ranges, reused when it matches")
    c.add_argument(
        "--accuracy", help="int8: keep the most sensitive layers float until e.g. cosine:0.999 or max-rel:1e-2 holds"
    )
    c.add_argument("--validation-data", help="--accuracy: V.npz (per input [N, *shape]); default the calibration data")
    c.add_argument("--shapes", help="input shapes, e.g. input:1x3x224x224,mask:1x128, or dims by name: batch=8")
    for flag, what in (("min", "smallest"), ("opt", "tuned-for"), ("max", "largest")):
        c.add_argument(
            f"--{flag}-shapes",
            action="append",
            help=f"optimization profile: the {what} input shapes, e.g. input:1x3x224x224,mask:1x128 "
            "(with the other two; repeat the three for several profiles)",
        )
    c.add_argument("--opt-level", type=int, default=2, choices=[0, 1, 2, 3])
    c.add_argument("--tune", choices=["off", "fast", "full"], default=None, help="auto-tune kernels on this GPU")
    c.add_argument(
        "--tune-budget-s", type=float, default=None, help="the tuner's wall-clock budget (default fast 60, full 600)"
    )
    c.add_argument("--allow-tf32", action="store_true", help="let fp32 GEMMs/convolutions use TF32 tensor cores")
    c.add_argument(
        "--no-pdl", action="store_true", help="no programmatic dependent launch (sm_90+): every kernel launched plainly"
    )
    c.add_argument(
        "--no-tvm", action="store_true", help="refuse kernels apache-tvm would write (graphc[tvm]) for untemplated ops"
    )
    c.add_argument(
        "--tactics",
        default=None,
        help="vendor tactics, comma-separated: cublaslt (GEMMs through cuBLASLt where measured faster; "
        "needs nvmath-python where the engine runs; docs/tactics.md)",
    )
    c.add_argument("--report", help="write the compile report (JSON) here")
    c.add_argument("--dump-ir", help="write the IR after every pass into this folder")
    c.add_argument("-q", "--quiet", action="store_true", help="print only the result line")
    c.set_defaults(func=_cmd_compile)


def _profile_flags(args: argparse.Namespace) -> dict[str, Any]:
    """--min-shapes/--opt-shapes/--max-shapes -> compile() keywords ({} without them)."""
    from graphc.profiles import parse_profile_flags

    def parse(text: str, flag: str) -> dict[str, Any]:
        try:
            return parse_shapes(text) or {}
        except UsageError as e:
            raise UsageError(str(e).replace("--shapes", flag, 1)) from None

    try:
        return parse_profile_flags(args.min_shapes, args.opt_shapes, args.max_shapes, parse)
    except ValueError as e:
        raise UsageError(str(e)) from None


def _calibration_printer(done: int, total: int) -> None:
    print(f"\rcalibrating: sample {done}/{total}", end="\n" if done == total else "", file=sys.stderr, flush=True)


def _accuracy_printer(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _cmd_compile(args: argparse.Namespace) -> int:
    import graphc
    from graphc.inspect import compile_summary, format_bytes, kernel_counts

    precision = _resolve_precision(args)
    _check_target_flags(args)
    if args.tune_budget_s is not None and args.tune in (None, "off"):
        raise UsageError("--tune-budget-s: only with --tune fast or --tune full")
    shapes = parse_shapes(args.shapes)
    profile_opts = _profile_flags(args)
    model = Path(args.model)
    if not model.is_file():
        raise UsageError(f"{args.model}: no such file" if not model.exists() else f"{args.model}: is not a file")
    info = _read_model_info(model)
    if info is not None:
        check_shapes_against_model(shapes, info)
    protected = [("the input model", model)] + [
        ("the model's weight file", f) for f in (info.data_files if info else [])
    ]
    output = check_output_path(args.output, "-o", not_same_as=protected)
    report_path = (
        check_output_path(args.report, "--report", not_same_as=[*protected, ("the engine file (-o)", output)])
        if args.report
        else None
    )
    if args.dump_ir and Path(args.dump_ir).exists() and not Path(args.dump_ir).is_dir():
        raise UsageError(f"--dump-ir {args.dump_ir}: is a file; give a folder")

    console = _console()
    opts = dict(
        target=args.target,
        precision=precision,
        io_precision=args.io_precision,
        shapes=shapes,
        opt_level=args.opt_level,
        dump_ir=args.dump_ir,
        arch=parse_arch(args.arch),
        tune=args.tune or "off",
        tune_budget_s=args.tune_budget_s,
        allow_tf32=args.allow_tf32,
        pdl=not args.no_pdl,
        tvm=not getattr(args, "no_tvm", False),
        tactics=tuple(t for t in (args.tactics or "").split(",") if t.strip()),
        progress=_progress_printer(console) if not args.quiet else None,
        **profile_opts,
    )
    if precision in ("int8", "fp8"):  # calibrated precisions
        if precision == "fp8" and (args.accuracy or args.validation_data):
            raise UsageError("--accuracy/--validation-data: only with --precision int8")
        opts.update(
            calibration_data=args.calibration_data,
            calibration_method=args.calibration_method,
            percentile=args.percentile,
            calibration_cache=args.calibration_cache,
            calibration_progress=None if args.quiet else _calibration_printer,
        )
        if precision == "int8":
            opts.update(
                accuracy=args.accuracy,
                validation_data=args.validation_data,
                accuracy_progress=None if args.quiet else _accuracy_printer,
            )
            if args.validation_data and not args.accuracy:
                raise UsageError("--validation-data: only with --accuracy")
    elif args.calibration_data or args.calibration_cache or args.accuracy or args.validation_data:
        raise UsageError(
            "--calibration-data/--calibration-cache/--accuracy/--validation-data: only with --precision int8 (or fp8)"
        )
    print(f"compiling {args.model} for {args.target} ({precision}, opt level {args.opt_level})", file=sys.stderr)
    engine = graphc.compile(str(model), **opts)
    engine.save(output)
    report = engine.report
    if report_path is not None:
        report_path.write_text(json.dumps(report, indent=1, default=str))
    if not args.quiet:
        print(compile_summary(report, max_lines=6), file=sys.stderr)
        if args.accuracy:
            from graphc.accuracy import summary_lines

            print("\n".join(summary_lines(report)), file=sys.stderr)
        if engine.dynamic is not None:
            from graphc.runtime.profiles import describe_profiles

            print("\n".join(describe_profiles(engine.profiles)), file=sys.stderr)
    print(f"wrote {output} ({format_bytes(output.stat().st_size)}; {kernel_counts(engine.plan)})")
    return 0


# ---- run ---------------------------------------------------------------------------------------


def _cuda_device_count() -> int | None:
    try:
        import cupy

        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception:  # no cupy, no driver: the load itself says what is missing
        return None


def _load_engine(path: str, device: int | None, verify_key: str | None = None):
    """Load an engine for run/bench; --device checked against the engine's target and the GPUs here."""
    import graphc.runtime

    if device is not None and device < 0:
        raise UsageError(f"--device {device}: a GPU index is 0 or more")
    if device:
        count = _cuda_device_count()
        if count is not None and device >= count:
            raise UsageError(f"--device {device}: this machine has {count} GPU(s) (0..{count - 1})")
    engine = graphc.runtime.load(path, device=device or 0, verify_key=verify_key)
    if device and engine.target != "cuda":
        raise UsageError(f"--device {device}: {path} is a {engine.target} engine; --device picks a GPU")
    return engine


def _feeds(args: argparse.Namespace, engine) -> dict[str, Any]:
    from graphc.feeds import check_index_ranges, load_inputs, random_inputs

    if args.inputs:
        feeds = load_inputs(args.inputs, [s.name for s in engine.inputs])
    else:
        feeds, notes = random_inputs(engine, args.seed)
        print(f"no --inputs: random inputs (seed {args.seed})", file=sys.stderr)
        for line in notes:
            print("  " + line, file=sys.stderr)
    check_index_ranges(engine, feeds)
    return feeds


def _shapes_text(feeds: dict[str, Any]) -> str:
    return ",".join(f"{k}:{'x'.join(str(d) for d in v.shape)}" for k, v in feeds.items())


def _feeds_at(args: argparse.Namespace, engine, shapes: dict[str, Any]) -> dict[str, Any]:
    """bench --shapes: random inputs of the given shapes (each checked against the profiles)."""
    from types import SimpleNamespace

    from graphc.feeds import random_inputs
    from graphc.runtime.engine import IOSpec

    if engine.dynamic is None:
        raise UsageError(f"--shapes: {args.engine} was built for one shape (no optimization profile)")
    specs = {s.name: s for s in engine.inputs}
    for name, shape in shapes.items():
        if isinstance(shape, int):
            raise UsageError(f"--shapes: '{name}={shape}': give input shapes (NAME:4x3x224x224)")
        if name not in specs:
            raise UsageError(f"--shapes: the engine has no input '{name}'; its inputs are {sorted(specs)}")
    given = [IOSpec(s.name, s.dtype, list(shapes.get(s.name, s.shape))) for s in engine.inputs]
    feeds, _notes = random_inputs(SimpleNamespace(plan=engine.plan, inputs=given), args.seed)
    engine.dynamic.resolve(engine, engine.check_feeds(feeds))  # outside every profile: one line, here
    print(f"random inputs (seed {args.seed}) of shapes {_shapes_text(feeds)}", file=sys.stderr)
    return feeds


def _add_run(sub) -> None:
    r = sub.add_parser("run", help="run an engine on inputs (random ones by default)", parents=[_common()])
    r.add_argument("engine")
    r.add_argument(
        "--inputs",
        "--loadInputs",
        dest="inputs",
        help=".npz with one array per input, an .npy for a one-input engine, or NAME:FILE.npy,... (never unpickled)",
    )
    r.add_argument("--outputs", help="write the outputs to this .npz")
    r.add_argument("--compare", help="the .onnx model: run ONNX Runtime on the same inputs and compare")
    r.add_argument(
        "--rtol",
        type=non_negative_float,
        help="max error relative to each output's scale (max |reference|); default 1e-3 for fp32",
    )
    r.add_argument("--atol", type=non_negative_float, help="max absolute error allowed besides --rtol (default 0)")
    r.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    r.add_argument("--device", type=int, default=None, help="GPU index of a CUDA engine (default 0)")
    _add_verify_key(r)
    r.set_defaults(func=_cmd_run)


def _cmd_run(args: argparse.Namespace) -> int:
    import numpy as np

    out_path = check_output_path(args.outputs, "--outputs") if args.outputs else None
    if args.compare and not Path(args.compare).is_file():
        raise UsageError(f"--compare {args.compare}: no such file")
    engine = _load_engine(args.engine, args.device, args.verify_key)
    feeds = _feeds(args, engine)
    session = _reference_session(args.compare, engine, feeds) if args.compare else None
    outs = engine.run(feeds, to_numpy=True) if engine.target == "cuda" else engine.run(feeds)
    outs = {k: np.asarray(v) for k, v in outs.items()}
    for k, v in outs.items():
        print(
            f"{k}: {v.dtype}{list(v.shape)}  mean {float(np.mean(v.astype(np.float64))) if v.size else 0:.6g}  "
            f"max |x| {float(np.max(np.abs(v.astype(np.float64)))) if v.size else 0:.6g}"
        )
    if out_path is not None:
        np.savez(out_path, **outs)
        print(f"wrote {out_path}")
    if session is not None:
        return _compare(args, engine, session, feeds, outs)
    return 0


def compare_outputs(
    outs: dict[str, Any], ref: dict[str, Any], precision: str, rtol: float | None = None, atol: float | None = None
) -> tuple[bool, list[str]]:
    """graphc's outputs against a reference: per output the max abs error, the max error relative to the
    output's scale (max |reference|), and the cosine similarity. fp32 passes when the max error is within
    atol + rtol * scale (defaults: rtol 1e-3, atol 0); fp16/bf16 pass with cosine >= 0.999 and no inf/NaN
    where the reference is finite, and also within atol + rtol * scale when either is given."""
    import numpy as np

    ok = True
    lines = []
    for k, r in ref.items():
        if k not in outs:
            lines.append(f"{k}: missing from graphc's outputs")
            ok = False
            continue
        a = np.asarray(outs[k]).astype(np.float64)
        r = np.asarray(r).astype(np.float64)
        if a.shape != r.shape:
            lines.append(f"{k}: shape {a.shape} != reference {r.shape}")
            ok = False
            continue
        scale = float(np.max(np.abs(r))) if r.size else 0.0
        err = float(np.max(np.abs(a - r))) if r.size else 0.0
        rel = err / scale if scale > 0 else err
        denom = float(np.linalg.norm(a) * np.linalg.norm(r))
        cos = float(np.sum(a * r) / denom) if denom > 0 else (1.0 if err == 0 else 0.0)
        bad_values = bool(np.any(~np.isfinite(a) & np.isfinite(r)))
        within = err <= (atol or 0.0) + (rtol if rtol is not None else 1e-3) * scale
        if precision == "fp32":
            passed = within and not bad_values
        else:
            passed = cos >= 0.999 and not bad_values and (within if rtol is not None or atol is not None else True)
        ok &= passed
        lines.append(
            f"{k}: max abs err {err:.3e}, max rel err {rel:.3e} (scale {scale:.3g}), cosine {cos:.6f}"
            f"{', non-finite values' if bad_values else ''}  {'OK' if passed else 'MISMATCH'}"
        )
    return ok, lines


def _reference_session(path: str, engine, feeds: dict[str, Any]):
    """An ONNX Runtime session of --compare's model, checked to take the engine's inputs."""
    try:
        import onnxruntime as ort
    except ImportError:
        raise UsageError("--compare needs onnxruntime: pip install onnxruntime") from None
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    try:
        sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    except Exception as e:  # ORT raises its own pybind exception types for unreadable models
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise UsageError(f"--compare {path}: ONNX Runtime cannot load it: {first}") from None
    theirs = sorted(i.name for i in sess.get_inputs())
    ours = sorted(feeds)
    if theirs != ours:
        raise UsageError(
            f"--compare {path}: its inputs are {theirs}, the engine's are {ours}: "
            "is it the model the engine was built from?"
        )
    out_names = sorted(o.name for o in sess.get_outputs())
    engine_outs = sorted(s.name for s in engine.outputs)
    if out_names != engine_outs:
        raise UsageError(
            f"--compare {path}: its outputs are {out_names}, the engine's are {engine_outs}: "
            "is it the model the engine was built from?"
        )
    return sess


_ORT_FLOAT_TYPES = {"tensor(float)": "float32", "tensor(double)": "float64", "tensor(float16)": "float16"}


def _compare(args: argparse.Namespace, engine, sess, feeds, outs) -> int:
    import numpy as np

    ref_names = [o.name for o in sess.get_outputs()]
    # An engine built with --io-precision fp16/bf16 takes reduced-precision feeds where the model
    # declares float32: ONNX Runtime gets the same values in the model's own input types.
    ort_types = {i.name: _ORT_FLOAT_TYPES.get(i.type) for i in sess.get_inputs()}
    feeds = {
        k: v.astype(ort_types[k]) if ort_types.get(k) is not None and np.asarray(v).dtype != ort_types[k] else v
        for k, v in feeds.items()
    }
    try:
        ref = dict(zip(ref_names, sess.run(ref_names, feeds), strict=True))
    except Exception as e:  # ORT's own exception types: a shape or type the model does not take
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise UsageError(f"--compare {args.compare}: ONNX Runtime failed on these inputs: {first}") from None
    precision = engine.build_info.get("precision", "fp32")
    ok, lines = compare_outputs(outs, ref, precision, args.rtol, args.atol)
    print(f"compared with ONNX Runtime on {args.compare} ({precision}):")
    for line in lines:
        print("  " + line)
    built_from = (engine.report or {}).get("model")
    if not ok and built_from and Path(built_from).name != Path(args.compare).name:
        print(f"note: the engine was built from {built_from}, compared with {args.compare}")
    return 0 if ok else EXIT_MISMATCH


# ---- bench -------------------------------------------------------------------------------------


def _add_bench(sub) -> None:
    b = sub.add_parser("bench", help="measure an engine's latency and throughput", parents=[_common()])
    b.add_argument("engine")
    b.add_argument("--iterations", type=positive_int, default=None, help="timed runs (default 200 on CUDA, 20 on CPU)")
    b.add_argument("--warmup", type=non_negative_int, default=None, help="untimed runs first (default 20 / 2)")
    b.add_argument("--per-kernel", action="store_true", help="also time every kernel (CUDA engines)")
    b.add_argument("--inputs", "--loadInputs", dest="inputs", help="as for run (default: random inputs)")
    b.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    b.add_argument("--json", help="write the numbers here")
    b.add_argument(
        "--shapes", help="engines with profiles: the input shapes to time (random inputs), e.g. input:4x3x224x224"
    )
    b.add_argument("--device", type=int, default=None, help="GPU index of a CUDA engine (default 0)")
    # concurrent load through graphc.runtime.Batcher, next to the same load unbatched
    b.add_argument("--batcher", action="store_true", help="batch-1 requests from client threads, with and without it")
    b.add_argument("--concurrency", type=positive_int, default=None, help="client threads (with --batcher; default 32)")
    b.add_argument(
        "--requests", type=positive_int, default=None, help="requests in all (default max(200, 20 x threads))"
    )
    b.add_argument(
        "--max-batch", type=positive_int, default=None, help="Batcher max_batch (default the engine's batch)"
    )
    b.add_argument("--max-wait-ms", type=non_negative_float, default=None, help="Batcher max_wait_ms (default 2)")
    b.add_argument(
        "--hold",
        action="store_true",
        default=None,
        help="Batcher(eager=False): hold a partial batch for max_wait even when none is running (the default"
        " closes one as soon as none runs, max_wait the bound while one does)",
    )
    _add_verify_key(b)
    b.set_defaults(func=_cmd_bench)


def _cmd_bench_batcher(args: argparse.Namespace, engine, feeds: dict[str, Any]) -> dict[str, Any]:
    from graphc.bench import benchmark_batcher, default_requests, format_batcher_bench
    from graphc.runtime.batcher import accepted_batch_sizes

    top = max(accepted_batch_sizes(engine))
    if args.max_batch is not None and args.max_batch > top:
        raise UsageError(f"--max-batch {args.max_batch}: {args.engine} runs at most batch {top}")
    concurrency = args.concurrency or 32
    result = benchmark_batcher(
        engine,
        feeds,
        concurrency=concurrency,
        requests=args.requests or default_requests(concurrency),
        max_batch=args.max_batch,
        max_wait_ms=2.0 if args.max_wait_ms is None else args.max_wait_ms,
        eager=not args.hold,
    )
    print(format_batcher_bench(result))
    return result


def _cmd_bench(args: argparse.Namespace) -> int:
    from graphc.bench import benchmark, default_counts, format_bench

    json_path = check_output_path(args.json, "--json") if args.json else None
    engine = _load_engine(args.engine, args.device, args.verify_key)
    if args.per_kernel and engine.target != "cuda":
        raise UsageError(f"--per-kernel times CUDA kernels; {args.engine} is a {engine.target} engine")
    load = {"--concurrency": args.concurrency, "--requests": args.requests, "--max-batch": args.max_batch}
    load["--max-wait-ms"] = args.max_wait_ms
    load["--hold"] = args.hold
    given = [flag for flag, v in load.items() if v is not None]
    if given and not args.batcher:
        raise UsageError(f"{given[0]} sets the load of --batcher; add --batcher")
    if args.batcher and args.per_kernel:
        raise UsageError("--per-kernel and --batcher are separate benchmarks; give one")
    if args.shapes:
        if args.inputs:
            raise UsageError("--shapes draws random inputs of those shapes; --inputs gives the inputs: give one")
        if args.batcher:
            raise UsageError("--shapes and --batcher: the batcher makes its own batches; give one")
        feeds = _feeds_at(args, engine, parse_shapes(args.shapes) or {})
    else:
        feeds = _feeds(args, engine)
    if args.batcher:
        result = _cmd_bench_batcher(args, engine, feeds)
        if json_path is not None:
            json_path.write_text(json.dumps(result, indent=1))
        return 0
    iterations, warmup = default_counts(engine.target)
    bench_engine, bucket, requested = engine, None, dict(feeds)
    if engine.dynamic is not None and engine.target == "cuda":
        # graph replays time one plan: the bucket these shapes run on (the inputs padded to it)
        from graphc.runtime.profiles import pad_feeds

        profile, b, _sizes = engine.dynamic.resolve(engine, engine.check_feeds(feeds))
        bench_engine, bucket = engine.dynamic.bucket_engine(engine, b), b
        feeds = pad_feeds(profile, b, feeds)
    if bucket is not None:
        print(f"shapes {_shapes_text(feeds)} run on the bucket {bucket.sizes}", file=sys.stderr)
    result = benchmark(
        bench_engine,
        feeds,
        iterations=args.iterations or iterations,
        warmup=warmup if args.warmup is None else args.warmup,
        per_kernel=args.per_kernel,
    )
    if args.shapes:
        # the request's rows, not the bucket's: padding rows are not throughput
        first = next(iter(requested.values()))
        result["shapes"] = {k: list(v.shape) for k, v in requested.items()}
        result["batch"] = int(first.shape[0]) if first.ndim else 1
        result["throughput_per_s"] = result["batch"] * 1000 / result["latency"]["median_ms"]
        if bucket is not None:
            result["bucket"] = dict(bucket.sizes)
    print(format_bench(result))
    if json_path is not None:
        json_path.write_text(json.dumps(result, indent=1))
    return 0


# ---- inspect -----------------------------------------------------------------------------------


def _add_inspect(sub) -> None:
    i = sub.add_parser("inspect", help="kernels, fusions, memory plan and build info of an engine", parents=[_common()])
    i.add_argument("engine")
    i.add_argument("--memory", help="draw the memory timeline to this PNG (needs matplotlib)")
    _add_verify_key(i)
    i.set_defaults(func=_cmd_inspect)


def _cmd_inspect(args: argparse.Namespace) -> int:
    from graphc.inspect import describe_engine

    memory_png = check_output_path(args.memory, "--memory") if args.memory else None
    if memory_png is not None:
        from graphc.inspect import require_matplotlib

        require_matplotlib()
    from graphc.runtime.format import read_engine

    ef = read_engine(args.engine, verify_key=args.verify_key)
    print(describe_engine(ef, str(args.engine)))
    if ef.profiles is not None:
        from graphc.runtime.profiles import describe_profiles

        print("\n".join(describe_profiles(ef.profiles)))
        from graphc.profiles import describe_ladders

        print("\n".join(describe_ladders(ef.manifest.get("report") or {})))
    if memory_png is not None:
        from graphc.inspect import describe_peak, draw_memory

        peak = draw_memory(ef.plan, ef.memory, memory_png, title=str(args.engine))
        print(describe_peak(ef.plan, ef.memory, peak))
        print(f"wrote {memory_png}")
    return 0


# ---- check -------------------------------------------------------------------------------------


def _add_check(sub) -> None:
    k = sub.add_parser(
        "check", help="whether a model compiles for a target, and every op that stops it", parents=[_common()]
    )
    k.add_argument("model", help="path to an .onnx file")
    k.add_argument("--target", choices=["cpu", "cuda"], default="cpu", help="the target to check (default cpu)")
    k.add_argument("--shapes", help="input shapes as for compile, e.g. input:1x3x224x224 or batch=8")
    k.add_argument("--no-tvm", action="store_true", help="as compile --no-tvm: ops only apache-tvm would serve stop it")
    k.set_defaults(func=_cmd_check)


def _cmd_check(args: argparse.Namespace) -> int:
    from graphc.support import check_lines  # the logic: graphc/support.py

    lines, ok = check_lines(args.model, args.target, parse_shapes(args.shapes), tvm=not args.no_tvm)
    print("\n".join(lines))
    return 0 if ok else 1


# ---- cache -------------------------------------------------------------------------------------


def _add_cache(sub) -> None:
    k = sub.add_parser("cache", help="the kernel cache: where it is, its size, clearing it", parents=[_common()])
    g = k.add_mutually_exclusive_group()
    g.add_argument("--info", action="store_true", help="location, entries, size and limit (the default)")
    g.add_argument("--clear", action="store_true", help="delete every cached kernel")
    k.set_defaults(func=_cmd_cache)


def _cmd_cache(args: argparse.Namespace) -> int:
    from graphc import cache
    from graphc.inspect import format_bytes

    if args.clear:
        n, nbytes = cache.clear()
        print(f"removed {n} cached kernel(s), {format_bytes(nbytes)}, from {cache.cache_dir()}")
        return 0
    st = cache.stats()
    print(f"kernel cache: {st.path}")
    print(f"  {st.entries} kernel(s), {format_bytes(st.bytes)} of a {format_bytes(st.limit)} limit")
    print(f"  tuning records: {cache.root_dir() / 'tuning.sqlite'} (kept by --clear)")
    print(f"  set graphc's cache folder with {cache.ENV_DIR}, the kernels' limit (bytes) with {cache.ENV_LIMIT}")
    return 0


# ---- sign: engine signatures (graphc.runtime.signing); --verify-key on run/bench/inspect -------------


def _add_sign(sub) -> None:
    s = sub.add_parser(
        "sign", help="sign an engine file with an ed25519 private key (needs cryptography)", parents=[_common()]
    )
    s.add_argument("engine")
    s.add_argument("--key", required=True, help="PEM ed25519 private key (openssl genpkey -algorithm ed25519)")
    s.set_defaults(func=_cmd_sign)


def _cmd_sign(args: argparse.Namespace) -> int:
    from graphc.runtime.signing import sign_engine

    digest = sign_engine(args.engine, args.key)
    print(f"signed {args.engine} (manifest sha256 {digest[:16]}...) with {args.key}")
    return 0


def _add_verify_key(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--verify-key", help="PEM ed25519 public key: refuse the engine unless it signed it")


# ---- the parser --------------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    """argparse with a one-line error (argparse prints the whole usage block first)."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(EXIT_USER_ERROR, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _common() -> argparse.ArgumentParser:
    """Flags every command takes, before or after the command name. SUPPRESS as default: a
    subcommand that is not given the flag leaves the main parser's value alone."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show tracebacks and debug logging")
    p.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help="log progress (INFO)")
    return p


# One entry per subcommand; a new one is an _add_NAME function listed here.
COMMANDS = [_add_compile, _add_run, _add_bench, _add_inspect, _add_check, _add_cache, _add_sign]


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="graphc",
        description="graphc: compile ONNX models into fast engines for NVIDIA GPUs (and the CPU).",
        epilog="Example: graphc compile model.onnx -o model.engine --precision fp16 --shapes input:1x3x224x224",
    )
    p.add_argument("--version", action="version", version=f"graphc {__version__}")
    p.add_argument("--debug", action="store_true", help="show tracebacks and debug logging")
    p.add_argument("-v", "--verbose", action="store_true", help="log progress (INFO)")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for add in COMMANDS:
        add(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    level = logging.DEBUG if args.debug else (logging.INFO if args.verbose else logging.WARNING)
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    from graphc.errors import GraphcError

    try:
        return int(args.func(args) or 0)
    except (GraphcError, UsageError) as e:
        if args.debug:
            raise
        msg = str(e).strip()
        first, _, rest = msg.partition("\n")
        print(f"graphc: error: {first}", file=sys.stderr)
        if rest:
            print(rest, file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        print("graphc: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
