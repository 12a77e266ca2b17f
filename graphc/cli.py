"""The `graphc` command line: compile, run, bench, inspect, check.

User errors (bad files, unsupported ops, wrong shapes, corrupt engines) print one line and exit
with status 2; `--debug` shows the traceback instead.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from graphc._version import __version__

EXIT_USER_ERROR = 2
EXIT_MISMATCH = 1


class UsageError(Exception):
    pass


# ---- argument parsing helpers ------------------------------------------------------------------


def parse_shapes(text: str | None) -> dict[str, Any] | None:
    """'input:1x3x224x224,mask:1x128' or 'batch=8,seq=128' (symbolic dims by name)."""
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
                out[name.strip()] = int(val)
            except ValueError:
                raise UsageError(f"--shapes: '{part}': a dim size must be an integer") from None
            continue
        name, sep, dims = part.rpartition(":")
        if not sep or not name:
            raise UsageError(f"--shapes: '{part}' is not NAME:1x3x224x224 or DIM=N")
        try:
            out[name] = tuple(int(d) for d in dims.lower().split("x"))
        except ValueError:
            raise UsageError(f"--shapes: '{part}': dims must be integers separated by x") from None
    return out


def _progress_printer(console):
    state: dict[str, Any] = {}

    def cb(phase: str, event: str) -> None:
        import time

        if event == "start":
            state[phase] = time.perf_counter()
            if console is not None and console.is_terminal:
                console.print(f"[dim]  {phase} ...[/dim]", end="\r")
        else:
            dt = time.perf_counter() - state.get(phase, time.perf_counter())
            if console:
                console.print(f"  [green]✓[/green] {phase:<12} {dt:7.2f} s")
            else:
                print(f"  {phase:<12} {dt:7.2f} s", file=sys.stderr)

    return cb


def _console():
    try:
        from rich.console import Console

        return Console(stderr=True, highlight=False)
    except ImportError:
        return None


# ---- commands ----------------------------------------------------------------------------------


def _cmd_compile(args: argparse.Namespace) -> int:
    import graphc
    from graphc.passes.report import summarize

    console = _console()
    opts = dict(
        target=args.target,
        precision=args.precision,
        shapes=parse_shapes(args.shapes),
        opt_level=args.opt_level,
        dump_ir=args.dump_ir,
        arch=[a.strip() for a in args.arch.split(",")] if args.arch else None,
        tune=args.tune,
        allow_tf32=args.allow_tf32,
        progress=_progress_printer(console) if not args.quiet else None,
    )
    print(f"compiling {args.model} for {args.target} ({args.precision}, opt level {args.opt_level})", file=sys.stderr)
    engine = graphc.compile(args.model, **opts)
    engine.save(args.output)
    report = engine.report
    if args.report:
        Path(args.report).write_text(json.dumps(report, indent=1, default=str))
    if not args.quiet:
        print(summarize(report, max_lines=6), file=sys.stderr)
        mem = report["memory"]
        print(
            f"memory: arena {mem['arena_bytes'] / 2**20:.2f} MiB ({mem['arena_over_lower_bound']:.3f}x the lower "
            f"bound; {mem['naive_bytes'] / 2**20:.2f} MiB without reuse), workspace {mem['workspace_bytes']} B",
            file=sys.stderr,
        )
    print(f"wrote {args.output} ({Path(args.output).stat().st_size / 2**20:.1f} MiB, {report['kernels']} kernels)")
    return 0


def _random_inputs(engine, seed: int = 0) -> dict[str, Any]:
    import numpy as np

    from graphc.runtime.cpu import numpy_dtype

    rng = np.random.default_rng(seed)
    feeds = {}
    for spec in engine.inputs:
        dt = numpy_dtype(spec.dtype)
        if dt.kind == "b":
            feeds[spec.name] = rng.random(spec.shape) < 0.5
        elif dt.kind in "iu":
            # small non-negative ids: valid token ids and masks for the models we know
            feeds[spec.name] = rng.integers(0, 2, size=spec.shape).astype(dt)
        else:
            feeds[spec.name] = rng.standard_normal(spec.shape).astype(dt)
    return feeds


def _load_inputs(path: str) -> dict[str, Any]:
    import numpy as np

    try:
        with np.load(path, allow_pickle=False) as z:  # never unpickle
            return {k: z[k] for k in z.files}
    except (OSError, ValueError) as e:
        raise UsageError(f"--inputs {path}: not a readable .npz of arrays: {e}") from None


def _cmd_run(args: argparse.Namespace) -> int:
    import numpy as np

    import graphc.runtime

    engine = graphc.runtime.load(args.engine, device=args.device, verify_key=args.verify_key)
    feeds = _load_inputs(args.inputs) if args.inputs else _random_inputs(engine, args.seed)
    outs = engine.run(feeds, to_numpy=True) if engine.target == "cuda" else engine.run(feeds)
    outs = {k: np.asarray(v) for k, v in outs.items()}
    for k, v in outs.items():
        print(
            f"{k}: {v.dtype}{list(v.shape)}  mean {float(np.mean(v.astype(np.float64))):.6g}  "
            f"max |x| {float(np.max(np.abs(v.astype(np.float64)))) if v.size else 0:.6g}"
        )
    if args.outputs:
        np.savez(args.outputs, **outs)
        print(f"wrote {args.outputs}")
    if args.compare:
        return _compare(args, engine, feeds, outs)
    return 0


def compare_outputs(
    outs: dict[str, Any], ref: dict[str, Any], precision: str, rtol: float | None = None
) -> tuple[bool, list[str]]:
    """graphc's outputs against a reference: per output the max abs error, the max error relative to the
    output's scale, and the cosine similarity. fp32 passes within `rtol` (default 1e-3) of the scale;
    fp16/bf16 pass with cosine >= 0.999 and no inf/NaN where the reference is finite."""
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
        if precision == "fp32":
            passed = rel <= (rtol if rtol is not None else 1e-3) and not bad_values
        else:
            passed = cos >= 0.999 and not bad_values and (rtol is None or rel <= rtol)
        ok &= passed
        lines.append(
            f"{k}: max abs err {err:.3e}, max rel err {rel:.3e} (scale {scale:.3g}), cosine {cos:.6f}"
            f"{', non-finite values' if bad_values else ''}  {'OK' if passed else 'MISMATCH'}"
        )
    return ok, lines


def _compare(args: argparse.Namespace, engine, feeds, outs) -> int:
    try:
        import onnxruntime as ort
    except ImportError:
        raise UsageError("--compare needs onnxruntime (pip install onnxruntime)") from None
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    sess = ort.InferenceSession(str(args.compare), opts, providers=["CPUExecutionProvider"])
    ref_names = [o.name for o in sess.get_outputs()]
    ref = dict(zip(ref_names, sess.run(ref_names, feeds), strict=True))
    precision = engine.build_info.get("precision", "fp32")
    ok, lines = compare_outputs(outs, ref, precision, args.rtol)
    print(f"compared with ONNX Runtime on {args.compare} ({precision}):")
    for line in lines:
        print("  " + line)
    return 0 if ok else EXIT_MISMATCH


def _cmd_bench(args: argparse.Namespace) -> int:
    import graphc.runtime
    from graphc.bench import benchmark, format_bench

    engine = graphc.runtime.load(args.engine, device=args.device, verify_key=args.verify_key)
    feeds = _random_inputs(engine)
    result = benchmark(engine, feeds, iterations=args.iterations, warmup=args.warmup, per_kernel=args.per_kernel)
    print(format_bench(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


def _cmd_inspect(args: argparse.Namespace) -> int:
    from graphc.runtime.format import read_engine

    ef = read_engine(args.engine, verify_key=args.verify_key)
    m = ef.manifest
    print(f"{args.engine}: graphc engine v{m['format_version']} ({m['target']}), built by graphc {m['graphc_version']}")
    for k, v in sorted(m["build"].items()):
        if k != "options":
            print(f"  {k}: {v}")
    print("inputs:  " + ", ".join(f"{i['name']} {i['dtype']}{i['shape']}" for i in m["inputs"]))
    print("outputs: " + ", ".join(f"{o['name']} {o['dtype']}{o['shape']}" for o in m["outputs"]))
    mem = ef.memory
    print(
        f"memory: arena {mem.arena_bytes} B ({mem.algorithm}; lower bound {mem.lower_bound_bytes} B, "
        f"no reuse {mem.naive_bytes} B), workspace {mem.workspace_bytes} B, "
        f"weights {sum(w.nbytes for w in ef.weights.values())} B"
    )
    launches = [ln for s in ef.plan.steps for ln in s.launches]
    print(
        f"steps: {len(ef.plan.steps)} ({sum(1 for s in ef.plan.steps if s.alias)} views), "
        f"{len(launches)} launches of {len({ln.digest for ln in launches})} distinct kernels"
    )
    for s in ef.plan.steps:
        tag = "view" if s.alias else s.kind
        fused = f" <- {', '.join(s.origins)}" if len(s.origins) > 1 or (s.origins and s.origins[0] != s.name) else ""
        print(f"  [{s.index:3d}] {tag:<22} {s.name}{fused}")
        for ln in s.launches:
            print(
                f"        {ln.family}:{ln.kernel} grid {ln.grid} block {ln.block} smem {ln.shared_bytes} "
                f"{json.dumps(ln.params) if ln.params else ''}"
            )
    if args.memory:
        from graphc.inspect import draw_memory

        draw_memory(ef.plan, ef.memory, args.memory, title=str(args.engine))
        print(f"wrote {args.memory}")
    return 0


def _cmd_check(args: argparse.Namespace) -> int:
    from graphc.errors import UnsupportedOpError
    from graphc.frontend import find_unsupported, load_onnx, read_model

    model, _ = read_model(args.model)
    unsupported = find_unsupported(model)
    if unsupported:
        print(f"{args.model}: {len(unsupported)} unsupported op type(s):")
        for op, dom, opset, names in unsupported:
            shown = ", ".join(names[:5]) + (f" (+{len(names) - 5} more)" if len(names) > 5 else "")
            print(f"  {dom + '.' if dom else ''}{op} (opset {opset}): {len(names)} node(s): {shown}")
        return 1
    try:
        graph = load_onnx(args.model)
    except UnsupportedOpError as e:  # an attribute form graphc does not support
        print(f"{args.model}: {e}")
        return 1
    print(f"{args.model}: every op is supported ({len(graph.nodes)} nodes, opset {graph.opset})")
    for op, n in graph.op_counts().items():
        print(f"  {op}: {n}")
    return 0


# ---- engine signatures (graphc.runtime.signing): `graphc sign`, and --verify-key on run/bench/inspect


def _cmd_sign(args: argparse.Namespace) -> int:
    from graphc.runtime.signing import sign_engine

    digest = sign_engine(args.engine, args.key)
    print(f"signed {args.engine} (manifest sha256 {digest[:16]}...) with {args.key}")
    return 0


def _add_signing(sub: Any, *engine_parsers: argparse.ArgumentParser) -> None:
    s = sub.add_parser("sign", help="sign an engine file with an ed25519 private key (needs cryptography)")
    s.add_argument("engine")
    s.add_argument("--key", required=True, help="PEM ed25519 private key (openssl genpkey -algorithm ed25519)")
    s.set_defaults(func=_cmd_sign)
    for e in engine_parsers:
        e.add_argument("--verify-key", help="PEM ed25519 public key: refuse the engine unless it signed it")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="graphc",
        description="graphc: compile ONNX models into fast engines for NVIDIA GPUs (and the CPU).",
        epilog="Example: graphc compile model.onnx -o model.engine --precision fp16 --shapes input:1x3x224x224",
    )
    p.add_argument("--version", action="version", version=f"graphc {__version__}")
    p.add_argument("--debug", action="store_true", help="show tracebacks and debug logging")
    p.add_argument("-v", "--verbose", action="store_true", help="log progress (INFO)")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    c = sub.add_parser("compile", help="compile an ONNX model into an engine file")
    c.add_argument("model", help="path to an .onnx file")
    c.add_argument("-o", "--output", required=True, help="engine file to write")
    c.add_argument("--target", choices=["cuda", "cpu"], default="cuda", help="cuda (default) or cpu (reference)")
    c.add_argument(
        "--arch", help="comma-separated CUDA archs for cubin (default: the local GPU, else sm_80,sm_86,sm_89,sm_90)"
    )
    c.add_argument("--precision", choices=["fp32", "fp16", "bf16"], default="fp32")
    c.add_argument("--shapes", help="input shapes, e.g. input:1x3x224x224,mask:1x128, or dims by name: batch=8")
    c.add_argument("--opt-level", type=int, default=2, choices=[0, 1, 2, 3])
    c.add_argument("--tune", choices=["off", "fast", "full"], default="off", help="auto-tune kernels on this GPU")
    c.add_argument("--allow-tf32", action="store_true", help="let fp32 GEMMs/convolutions use TF32 tensor cores")
    c.add_argument("--report", help="write the compile report (JSON) here")
    c.add_argument("--dump-ir", help="write the IR after every pass into this folder")
    c.add_argument("-q", "--quiet", action="store_true", help="print only the result line")
    c.set_defaults(func=_cmd_compile)

    r = sub.add_parser("run", help="run an engine on inputs (random ones by default)")
    r.add_argument("engine")
    r.add_argument("--inputs", help=".npz with one array per input (never unpickled)")
    r.add_argument("--outputs", help="write the outputs to this .npz")
    r.add_argument("--compare", help="the .onnx model: run ONNX Runtime on the same inputs and compare")
    r.add_argument("--rtol", type=float, help="max error relative to each output's scale (default 1e-3 for fp32)")
    r.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    r.add_argument("--device", type=int, default=0)
    r.set_defaults(func=_cmd_run)

    b = sub.add_parser("bench", help="measure an engine's latency and throughput")
    b.add_argument("engine")
    b.add_argument("--iterations", type=int, default=200)
    b.add_argument("--warmup", type=int, default=20)
    b.add_argument("--per-kernel", action="store_true", help="also time every kernel")
    b.add_argument("--json", help="write the numbers here")
    b.add_argument("--device", type=int, default=0)
    b.set_defaults(func=_cmd_bench)

    i = sub.add_parser("inspect", help="kernels, fusions, memory plan and build info of an engine")
    i.add_argument("engine")
    i.add_argument("--memory", help="draw the memory timeline to this PNG (needs matplotlib)")
    i.set_defaults(func=_cmd_inspect)

    k = sub.add_parser("check", help="list the ops of a model that graphc does not support")
    k.add_argument("model", help="path to an .onnx file")
    k.set_defaults(func=_cmd_check)
    _add_signing(sub, r, b, i)
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
