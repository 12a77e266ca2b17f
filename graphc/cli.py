"""The `graphc` command line.

User errors (bad files, unsupported ops, wrong shapes) print one line and exit non-zero; `--debug`
shows the traceback instead.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from graphc._version import __version__

EXIT_USER_ERROR = 2


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
    counts = graph.op_counts()
    print(f"{args.model}: every op is supported ({len(graph.nodes)} nodes, opset {graph.opset})")
    for op, n in counts.items():
        print(f"  {op}: {n}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="graphc",
        description="graphc: compile ONNX models into fast engines for NVIDIA GPUs (and the CPU).",
    )
    p.add_argument("--version", action="version", version=f"graphc {__version__}")
    p.add_argument("--debug", action="store_true", help="show tracebacks and debug logging")
    p.add_argument("-v", "--verbose", action="store_true", help="log progress (INFO)")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    c = sub.add_parser("check", help="list the ops of a model that graphc does not support")
    c.add_argument("model", help="path to an .onnx file")
    c.set_defaults(func=_cmd_check)
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
    except GraphcError as e:
        if args.debug:
            raise
        print(f"graphc: error: {e}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        print("graphc: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
