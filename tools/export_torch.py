"""Export real PyTorch models (random weights) to ONNX with both of PyTorch's exporters.

    python tools/export_torch.py --out DIR [--models resnet50,bert,...]
        [--exporter torchscript|dynamo|both] [--batch 1 --seq 128] [--static]

For every model it writes ``NAME.torchscript.onnx`` (``torch.onnx.export(..., dynamo=False,
opset_version=17)``) and/or ``NAME.dynamo.onnx`` (``dynamo=True`` at the exporter's default opset,
or ``--dynamo-opset``), plus ``NAME.json``: the input and output specs (names, dtypes, shapes with
symbolic dims, example shapes, value ranges) and, per exporter, whether it worked, the file size,
opset, op counts, and the largest difference between ONNX Runtime and PyTorch on the same inputs.
``--summary-md FILE`` writes those op counts as a Markdown table.

The models are built from `transformers` classes with random init from their configs (no download),
with eager attention so the exported graphs hold plain ops. By default (--init scaled) the weights are
then redrawn variance-preserving and BatchNorm statistics measured on a random batch, so outputs are
O(1) and comparisons mean something (the configs' std-0.02 init gives MobileNetV2 logits of ~1e-28).
Each file is checked with onnx.checker (full_check) and against PyTorch in ONNX Runtime, at the
example dims and, unless --static, at a second batch size and sequence length. This tool needs torch, transformers
and onnxscript; graphc itself and its tests never import it.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

TORCHSCRIPT_OPSET = 17
EXPORTERS = ("torchscript", "dynamo")
# Above this the model's weights go to an external data file (NAME.EXPORTER.onnx.data); below it
# the .onnx file is self-contained.
EXTERNAL_DATA_BYTES = 2**31 - 2**26


@dataclasses.dataclass
class InputSpec:
    name: str
    dtype: str  # numpy dtype name
    shape: list[int | str]  # symbolic dims by name
    low: float = 0.0  # values are drawn from [low, high)
    high: float = 1.0
    kind: str = "normal"  # normal | int | mask


@dataclasses.dataclass
class ModelCase:
    name: str
    description: str
    make_module: Callable[[], Any]  # -> torch.nn.Module returning a tuple of tensors
    inputs: list[InputSpec]
    outputs: list[str]


def _example(spec: InputSpec, dims: dict[str, int], rng: np.random.Generator) -> np.ndarray:
    shape = [dims[d] if isinstance(d, str) else d for d in spec.shape]
    if spec.kind == "int":
        return rng.integers(int(spec.low), int(spec.high), size=shape).astype(spec.dtype)
    if spec.kind == "mask":
        # Ones with some padding at the end of every row after the first, so masking matters.
        mask = np.ones(shape, dtype=spec.dtype)
        for row in range(1, shape[0]):
            mask[row, max(1, shape[1] - 3 * row) :] = 0
        return mask
    return rng.standard_normal(shape).astype(spec.dtype)


def _wrap(model: Any, input_names: list[str], output_keys: list[str]) -> Any:
    """A module whose forward takes the named inputs and returns a plain tuple of tensors.

    forward has one named parameter per input (no *args): torch.export matches dynamic_shapes
    to the signature, and the exporters name the graph inputs after it."""
    import torch

    class Base(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def run(self, **inputs: Any) -> tuple:
            out = self.model(**inputs, return_dict=True)
            return tuple(out[k] for k in output_keys)

    class Image(Base):
        def forward(self, pixel_values: Any) -> tuple:
            return self.run(pixel_values=pixel_values)

    class Text(Base):
        def forward(self, input_ids: Any, attention_mask: Any) -> tuple:
            return self.run(input_ids=input_ids, attention_mask=attention_mask)

    class TextWithTypes(Base):
        def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any) -> tuple:
            return self.run(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)

    for cls in (Image, Text, TextWithTypes):
        params = list(cls.forward.__code__.co_varnames[1 : cls.forward.__code__.co_argcount])
        if params == input_names:
            return cls()
    raise ValueError(f"no wrapper takes inputs {input_names}")


def _eager(config: Any) -> Any:
    # Eager attention: matmul + softmax written out, not scaled_dot_product_attention.
    config._attn_implementation = "eager"
    return config


def _resnet50() -> Any:
    from transformers import ResNetConfig, ResNetForImageClassification

    cfg = ResNetConfig(num_labels=1000)  # defaults: ResNet-50, [3, 4, 6, 3], bottleneck
    return _wrap(ResNetForImageClassification(cfg), ["pixel_values"], ["logits"])


def _mobilenetv2() -> Any:
    from transformers import MobileNetV2Config, MobileNetV2ForImageClassification

    cfg = MobileNetV2Config(num_labels=1000)  # defaults: depth multiplier 1.0, 224x224
    return _wrap(MobileNetV2ForImageClassification(cfg), ["pixel_values"], ["logits"])


def _vit() -> Any:
    from transformers import ViTConfig, ViTModel

    cfg = _eager(ViTConfig())  # defaults: ViT-B/16 at 224
    return _wrap(ViTModel(cfg), ["pixel_values"], ["last_hidden_state", "pooler_output"])


def _bert() -> Any:
    from transformers import BertConfig, BertModel

    cfg = _eager(BertConfig())  # defaults: BERT-base uncased sizes
    return _wrap(BertModel(cfg), [s.name for s in _text(0, True)], ["last_hidden_state", "pooler_output"])


def _gpt2() -> Any:
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = _eager(GPT2Config(use_cache=False))  # defaults: GPT-2 small (124M)
    return _wrap(GPT2LMHeadModel(cfg), [s.name for s in _text(0, False)], ["logits"])


def _image(name: str = "pixel_values") -> list[InputSpec]:
    return [InputSpec(name, "float32", ["batch", 3, 224, 224])]


def _text(vocab: int, token_types: bool) -> list[InputSpec]:
    specs = [
        InputSpec("input_ids", "int64", ["batch", "seq"], 0, vocab, "int"),
        InputSpec("attention_mask", "int64", ["batch", "seq"], 0, 2, "mask"),
    ]
    if token_types:
        specs.append(InputSpec("token_type_ids", "int64", ["batch", "seq"], 0, 2, "int"))
    return specs


CASES: dict[str, ModelCase] = {
    c.name: c
    for c in [
        ModelCase("resnet50", "ResNet-50 (transformers ResNetForImageClassification)", _resnet50,
                  _image(), ["logits"]),
        ModelCase("mobilenetv2", "MobileNetV2 1.0 224 (MobileNetV2ForImageClassification)", _mobilenetv2,
                  _image(), ["logits"]),
        ModelCase("vit", "ViT-B/16 224 (ViTModel)", _vit, _image(), ["last_hidden_state", "pooler_output"]),
        ModelCase("bert", "BERT-base (BertModel)", _bert, _text(30522, True),
                  ["last_hidden_state", "pooler_output"]),
        ModelCase("gpt2", "GPT-2 small (GPT2LMHeadModel, use_cache=False)", _gpt2, _text(50257, False),
                  ["logits"]),
    ]
}  # fmt: skip


def _module(case: ModelCase, seed: int, init: str, dims: dict[str, int]) -> Any:
    import torch

    torch.manual_seed(seed)
    module = case.make_module()
    if init == "scaled":
        _rescale(module, case, dims, seed)
    return module.eval()


def _rescale(module: Any, case: ModelCase, dims: dict[str, int], seed: int) -> None:
    """Variance-preserving weights, so outputs are O(1) and comparisons of them mean something.

    The configs' own init (normal, std 0.02) leaves MobileNetV2's logits near 1e-28 and the
    transformers' attention nearly uniform. Here every Conv/Linear weight is N(0, gain/fan_in)
    (gain 2 for convs, which feed ReLUs), embeddings N(0, 1/hidden), norms' affine parameters
    near (1, 0), and BatchNorm running statistics are measured on a random batch (as after
    training), so each BN really normalizes and Conv+BN folding has non-trivial work."""
    import torch
    from transformers.pytorch_utils import Conv1D

    gen = torch.Generator().manual_seed(seed + 1)

    def normal_(t: Any, std: float) -> None:
        t.copy_(torch.randn(t.shape, generator=gen) * std)

    norms = (torch.nn.BatchNorm2d, torch.nn.LayerNorm, torch.nn.GroupNorm)
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear, Conv1D)):
                conv = isinstance(m, torch.nn.Conv2d)
                fan_in = m.weight.shape[0] if isinstance(m, Conv1D) else m.weight[0].numel()
                normal_(m.weight, ((2.0 if conv else 1.0) / fan_in) ** 0.5)
                if m.bias is not None:
                    normal_(m.bias, 0.02)
            elif isinstance(m, torch.nn.Embedding):
                normal_(m.weight, m.weight.shape[1] ** -0.5)
            elif isinstance(m, norms) and m.weight is not None:
                m.weight.copy_(0.8 + 0.4 * torch.rand(m.weight.shape, generator=gen))
                normal_(m.bias, 0.05)
        bns = [m for m in module.modules() if isinstance(m, torch.nn.BatchNorm2d)]
        if bns:
            for bn in bns:
                bn.reset_running_stats()
                bn.momentum = None  # a cumulative average: one batch sets the statistics exactly
                bn.train()
            rng = np.random.default_rng(seed + 2)
            calib = {**dims, "batch": 4}
            module(*(torch.from_numpy(_example(s, calib, rng)) for s in case.inputs))
            for bn in bns:
                bn.eval()


def _dynamic_axes(case: ModelCase) -> dict[str, dict[int, str]]:
    axes: dict[str, dict[int, str]] = {}
    for spec in case.inputs:
        named = {i: d for i, d in enumerate(spec.shape) if isinstance(d, str)}
        if named:
            axes[spec.name] = named
    # Outputs keep the batch (and seq) dims of the inputs, in the same leading positions.
    lead = case.inputs[0].shape
    for out in case.outputs:
        axes[out] = {i: d for i, d in enumerate(lead) if isinstance(d, str) and i < 2}
        if out == "pooler_output":
            axes[out] = {0: "batch"}
        if out == "logits" and "seq" not in lead:
            axes[out] = {0: "batch"}
    return axes


def _dynamic_shapes(case: ModelCase) -> tuple:
    from torch.export import Dim

    dims = {"batch": Dim("batch", min=1, max=1024), "seq": Dim("seq", min=1, max=512)}
    return tuple({i: dims[d] for i, d in enumerate(s.shape) if isinstance(d, str)} or None for s in case.inputs)


def _export_torchscript(module: Any, case: ModelCase, args: tuple, path: Path, static: bool, opset: int) -> None:
    import torch

    torch.onnx.export(
        module,
        args,
        str(path),
        dynamo=False,
        opset_version=opset,
        input_names=[s.name for s in case.inputs],
        output_names=case.outputs,
        dynamic_axes=None if static else _dynamic_axes(case),
        do_constant_folding=True,
    )


def _export_dynamo(module: Any, case: ModelCase, args: tuple, path: Path, static: bool, opset: int | None) -> None:
    import torch

    program = torch.onnx.export(
        module,
        args,
        dynamo=True,
        opset_version=opset,
        input_names=[s.name for s in case.inputs],
        output_names=case.outputs,
        dynamic_shapes=None if static else _dynamic_shapes(case),
        optimize=True,
    )
    program.save(str(path), external_data=program.model_proto.ByteSize() > EXTERNAL_DATA_BYTES)


def _trace_args(case: ModelCase, args: tuple) -> tuple:
    """Example inputs for torch.export: it specializes a dynamic dim whose example size is 1
    (a size-1 dim broadcasts), so such dims are repeated to 2 for tracing."""
    out = []
    for spec, t in zip(case.inputs, args, strict=True):
        for axis, d in enumerate(spec.shape):
            if isinstance(d, str) and t.shape[axis] == 1:
                t = t.repeat_interleave(2, dim=axis)
        out.append(t)
    return tuple(out)


def _op_counts(model: Any) -> dict[str, int]:
    """Op types of the main graph and every subgraph and function, sorted by name."""
    counts: collections.Counter[str] = collections.Counter()

    def walk(graph: Any) -> None:
        for node in graph.node:
            key = node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}::{node.op_type}"
            counts[key] += 1
            for attr in node.attribute:
                if attr.g.node:
                    walk(attr.g)
                for g in attr.graphs:
                    walk(g)

    walk(model.graph)
    for fn in model.functions:
        walk(fn)
    return dict(sorted(counts.items()))


def _reference(module: Any, case: ModelCase, feeds: dict[str, np.ndarray]) -> tuple[dict, list[np.ndarray]]:
    import torch

    with torch.no_grad():
        outs = module(*(torch.from_numpy(feeds[s.name]) for s in case.inputs))
    return feeds, [t.detach().numpy().astype(np.float64) for t in outs]


def _check(path: Path, case: ModelCase, runs: list[tuple[dict, list[np.ndarray]]]) -> dict:
    """The full checker, then ONNX Runtime against PyTorch on every (inputs, outputs) run."""
    import onnx
    import onnxruntime as ort

    onnx.checker.check_model(str(path), full_check=True)
    model = onnx.load(str(path), load_external_data=False)
    opsets = {imp.domain or "ai.onnx": imp.version for imp in model.opset_import}
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    diffs: dict[str, float] = {}
    for feeds, expected in runs:
        got = sess.run(None, {i.name: feeds[i.name] for i in sess.get_inputs()})
        for name, g, e in zip(case.outputs, got, expected, strict=True):
            dims = {k: v.shape for k, v in feeds.items()}
            if g.shape != e.shape:
                raise AssertionError(f"{name} has shape {g.shape}, PyTorch gives {e.shape} (inputs {dims})")
            if not np.isfinite(g).all():
                raise AssertionError(f"{name} is not finite (inputs {dims})")
            diff = float(np.max(np.abs(g.astype(np.float64) - e))) if g.size else 0.0
            # Relative to the output's scale: random-weight outputs are O(1) with --init scaled.
            if diff > 1e-3 * max(1.0, float(np.abs(e).max())):
                raise AssertionError(f"{name} differs from PyTorch by {diff:.3g} (inputs {dims})")
            diffs[name] = max(diffs.get(name, 0.0), diff)
    size = path.stat().st_size
    data = Path(str(path) + ".data")
    return {
        "ok": True,
        "file": path.name,
        "bytes": size + (data.stat().st_size if data.exists() else 0),
        "external_data": data.exists(),
        "opset_import": opsets,
        "ir_version": model.ir_version,
        "nodes": sum(_op_counts(model).values()),
        "ops": _op_counts(model),
        "ort_inputs": [i.name for i in sess.get_inputs()],
        "checked_shapes": [{k: list(v.shape) for k, v in feeds.items()} for feeds, _ in runs],
        "max_abs_diff_vs_torch": diffs,
    }


def export_case(case: ModelCase, out: Path, exporters: list[str], dims: dict[str, int], static: bool,
                seed: int, opsets: tuple[int, int | None], init: str) -> dict:  # fmt: skip
    import torch

    rng = np.random.default_rng(seed)
    module = _module(case, seed, init, dims)
    feeds = {s.name: _example(s, dims, rng) for s in case.inputs}
    args = tuple(torch.from_numpy(feeds[s.name]) for s in case.inputs)
    runs = [_reference(module, case, feeds)]
    if not static:
        # A second shape checks that the symbolic dims really are symbolic in the file.
        other = {"batch": dims["batch"] + 2, "seq": max(2, dims["seq"] // 2 + 3)}
        runs.append(_reference(module, case, {s.name: _example(s, other, rng) for s in case.inputs}))
    expected = runs[0][1]
    record: dict[str, Any] = {
        "model": case.name,
        "description": case.description,
        "torch": torch.__version__,
        "seed": seed,
        "static": static,
        "init": init,
        "example_dims": dims,
        "inputs": [dataclasses.asdict(s) for s in case.inputs],
        "outputs": [
            {"name": n, "example_shape": list(e.shape), "std": float(e.std())}
            for n, e in zip(case.outputs, expected, strict=True)
        ],
        "exports": {},
    }
    for exporter in exporters:
        path = out / f"{case.name}.{exporter}.onnx"
        for stale in (path, Path(str(path) + ".data")):
            stale.unlink(missing_ok=True)
        t0 = time.perf_counter()
        try:
            with torch.no_grad():
                if exporter == "torchscript":
                    _export_torchscript(module, case, args, path, static, opsets[0])
                else:
                    trace = args if static else _trace_args(case, args)
                    _export_dynamo(module, case, trace, path, static, opsets[1])
            result = _check(path, case, runs)
        except Exception as e:  # record and go on with the next export
            traceback.print_exc()
            result = {"ok": False, "error": f"{type(e).__name__}: {e}"[:2000]}
        result["seconds"] = round(time.perf_counter() - t0, 1)
        record["exports"][exporter] = result
        status = "ok" if result["ok"] else "FAILED: " + result["error"].splitlines()[0][:200]
        print(f"{case.name}.{exporter}: {status} ({result['seconds']} s)", flush=True)
    (out / f"{case.name}.json").write_text(json.dumps(record, indent=2) + "\n")
    return record


def summary_markdown(records: list[dict]) -> str:
    lines = ["# Op types in the PyTorch exports", ""]
    if records:
        r0 = records[0]
        shapes = ("static" if r0["static"] else "dynamic") + f" shapes, init {r0.get('init', 'config')}"
        lines += [
            f"torch {r0['torch']}, random weights (seed {r0['seed']}), example dims {r0['example_dims']}, "
            f"{shapes}. Written by tools/export_torch.py.",
            "",
        ]
    lines += [
        "| file | ok | size (MB) | opset | nodes | output std | max abs diff ORT vs torch |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for rec in records:
        std = ", ".join(f"{o['name']} {o['std']:.2f}" for o in rec["outputs"] if "std" in o)
        for exporter, res in rec["exports"].items():
            name = f"{rec['model']}.{exporter}.onnx"
            if res["ok"]:
                diff = ", ".join(f"{k} {v:.2e}" for k, v in res["max_abs_diff_vs_torch"].items())
                opset = res["opset_import"].get("ai.onnx")
                row = f"| {name} | yes | {res['bytes'] / 1e6:.1f} | {opset} | {res['nodes']} | {std} | {diff} |"
            else:
                row = f"| {name} | NO: {res['error'].splitlines()[0][:120]} | | | | | |"
            lines.append(row)
    two_shapes = all(len(res.get("checked_shapes", [])) > 1 for r in records for res in r["exports"].values())
    if two_shapes:
        lines += ["", "ONNX Runtime ran each file at two input shapes (the example dims, then batch + 2 and a",
                  "shorter sequence) and was compared with PyTorch at both."]  # fmt: skip
    for rec in records:
        for exporter, res in rec["exports"].items():
            if not res["ok"]:
                continue
            lines += ["", f"## {rec['model']}.{exporter}.onnx", ""]
            lines += [f"opset_import {res['opset_import']}, {res['nodes']} nodes; ops by count:", ""]
            ranked = sorted(res["ops"].items(), key=lambda kv: (-kv[1], kv[0]))
            lines.append(", ".join(f"{op} {n}" for op, n in ranked))
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, type=Path, help="output folder")
    p.add_argument("--models", default=",".join(CASES), help=f"comma-separated, from {','.join(CASES)}")
    p.add_argument("--exporter", choices=[*EXPORTERS, "both"], default="both")
    p.add_argument("--batch", type=int, default=1, help="example batch size (dims stay symbolic)")
    p.add_argument("--seq", type=int, default=128, help="example sequence length for text models")
    p.add_argument("--static", action="store_true", help="fix every dim to the example sizes")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--init",
        choices=["scaled", "config"],
        default="scaled",
        help="scaled: variance-preserving weights, calibrated BN (default); config: the configs' init",
    )
    p.add_argument(
        "--torchscript-opset",
        type=int,
        default=TORCHSCRIPT_OPSET,
        help=f"default {TORCHSCRIPT_OPSET}; below 17 LayerNorm comes out decomposed",
    )
    p.add_argument("--dynamo-opset", type=int, default=None, help="default: the exporter's own")
    p.add_argument("--summary-md", type=Path, default=None, help="also write op counts as Markdown here")
    p.add_argument("--summarize-only", action="store_true", help="rebuild --summary-md from existing JSON")
    a = p.parse_args(argv)

    names = [n.strip() for n in a.models.split(",") if n.strip()]
    unknown = [n for n in names if n not in CASES]
    if unknown:
        p.error(f"unknown model(s) {unknown}; known: {list(CASES)}")
    a.out.mkdir(parents=True, exist_ok=True)
    if a.summarize_only:
        records = [json.loads((a.out / f"{n}.json").read_text()) for n in names if (a.out / f"{n}.json").exists()]
    else:
        import torch

        torch.set_num_threads(max(1, os.cpu_count() or 1))
        exporters = list(EXPORTERS) if a.exporter == "both" else [a.exporter]
        dims = {"batch": a.batch, "seq": a.seq}
        records = [
            export_case(
                CASES[n], a.out, exporters, dims, a.static, a.seed, (a.torchscript_opset, a.dynamo_opset), a.init
            )
            for n in names
        ]
    if a.summary_md:
        a.summary_md.write_text(summary_markdown(records))
    failed = [f"{r['model']}.{e}" for r in records for e, res in r["exports"].items() if not res["ok"]]
    if failed:
        print("failed:", ", ".join(failed), file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
