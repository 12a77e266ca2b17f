"""python -m models NAME [--size tiny|full] [-o FILE.onnx] [--opset N] [--seed N] [--set KEY=VALUE ...]
python -m models --list"""

from __future__ import annotations

import argparse
import ast
import collections
import sys

import numpy as np
import onnx

import models


def _value(text: str) -> object:
    """A Python literal (3, 1.5, [1, 2], True, 'x'), else the text itself."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def _list() -> None:
    for name, family in models.FAMILIES.items():
        print(f"{name:12s} {family.DESCRIPTION}")
        for size, args in family.PRESETS.items():
            print(f"{'':12s}   {size}: {args}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m models", description="Build a model of the graphc zoo as ONNX.")
    p.add_argument("name", nargs="?", help=f"one of {', '.join(models.FAMILIES)}")
    p.add_argument("--list", action="store_true", help="list the models and their size presets")
    p.add_argument("--size", choices=models.SIZES, default="tiny")
    p.add_argument("-o", "--output", help="file to write (default NAME-SIZE.onnx)")
    p.add_argument("--opset", type=int, default=None, help=f"ONNX opset (default {models.DEFAULT_OPSET})")
    p.add_argument("--seed", type=int, default=None, help="weight seed (default 0)")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a builder option, e.g. --set layernorm=decomposed --set batch=8",
    )
    a = p.parse_args(argv)
    if a.list:
        _list()
        return 0
    if not a.name:
        p.error("give a model name, or --list")
    options: dict[str, object] = {}
    for item in a.set:
        key, sep, value = item.partition("=")
        if not sep:
            p.error(f"--set wants KEY=VALUE, not {item!r}")
        options[key.strip()] = _value(value)
    if a.opset is not None:
        options["opset"] = a.opset
    if a.seed is not None:
        options["seed"] = a.seed
    try:
        model = models.build(a.name, a.size, **options)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    out = a.output or f"{a.name}-{a.size}.onnx"
    files = models.save(model, out)
    ops = collections.Counter(n.op_type for n in model.graph.node)
    params = sum(int(np.prod(t.dims)) for t in model.graph.initializer if t.data_type == onnx.TensorProto.FLOAT)
    print(
        f"wrote {', '.join(map(str, files))}: {len(model.graph.node)} nodes, {params:,} float weights, "
        f"opset {model.opset_import[0].version}"
    )
    print("ops: " + ", ".join(f"{k} {v}" for k, v in sorted(ops.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
