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
    build: Callable[[bool], Any]  # (tiny) -> torch.nn.Module returning a tuple of tensors
    inputs: list[InputSpec]
    outputs: list[str]
    tiny_inputs: list[InputSpec] | None = None  # the tiny config's inputs, where they differ
    is_tiny: bool = False

    def make_module(self) -> Any:
        return self.build(self.is_tiny)

    def tiny(self) -> ModelCase:
        """The same architecture at a few-layer, narrow config (CPU tests of the tools)."""
        inputs = self.tiny_inputs if self.tiny_inputs is not None else self.inputs
        return dataclasses.replace(self, inputs=inputs, is_tiny=True, description=self.description + ", tiny config")


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

    class Seq2Seq(Base):  # BART (tools/make_arch_corpus.py)
        def forward(self, input_ids: Any, attention_mask: Any, decoder_input_ids: Any) -> tuple:
            return self.run(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids)

    class Audio(Base):  # wav2vec2, HuBERT (tools/make_arch_corpus.py)
        def forward(self, input_values: Any) -> tuple:
            return self.run(input_values=input_values)

    class Mel(Base):  # Whisper's encoder
        def forward(self, input_features: Any) -> tuple:
            return self.run(input_features=input_features)

    for cls in (Image, Text, TextWithTypes, Seq2Seq, Audio, Mel):
        params = list(cls.forward.__code__.co_varnames[1 : cls.forward.__code__.co_argcount])
        if params == input_names:
            return cls()
    raise ValueError(f"no wrapper takes inputs {input_names}")


def _eager(config: Any) -> Any:
    # Eager attention: matmul + softmax written out, not scaled_dot_product_attention.
    config._attn_implementation = "eager"
    return config


# Each builder takes `tiny`: the full config is the named model; the tiny one keeps the architecture
# (every block type, GQA, rotary, windows) at 1-2 layers and widths of 8-64, for CPU tests.
TINY_IMAGE = 32
TINY_VOCAB = 100


def _resnet50(tiny: bool) -> Any:
    from transformers import ResNetConfig, ResNetForImageClassification

    cfg = ResNetConfig(num_labels=1000)  # defaults: ResNet-50, [3, 4, 6, 3], bottleneck
    if tiny:
        cfg = ResNetConfig(embedding_size=8, hidden_sizes=[8, 16, 16, 32], depths=[1, 1, 1, 1], num_labels=10)
    return _wrap(ResNetForImageClassification(cfg), ["pixel_values"], ["logits"])


def _mobilenetv2(tiny: bool) -> Any:
    from transformers import MobileNetV2Config, MobileNetV2ForImageClassification

    # defaults: depth multiplier 1.0, 224x224
    cfg = MobileNetV2Config(num_labels=10, depth_multiplier=0.35, image_size=TINY_IMAGE) if tiny else \
        MobileNetV2Config(num_labels=1000)  # fmt: skip
    return _wrap(MobileNetV2ForImageClassification(cfg), ["pixel_values"], ["logits"])


def _vit(tiny: bool) -> Any:
    from transformers import ViTConfig, ViTModel

    small = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                 image_size=TINY_IMAGE, patch_size=8)  # fmt: skip
    cfg = _eager(ViTConfig(**small) if tiny else ViTConfig())  # defaults: ViT-B/16 at 224
    return _wrap(ViTModel(cfg), ["pixel_values"], ["last_hidden_state", "pooler_output"])


def _bert(tiny: bool) -> Any:
    from transformers import BertConfig, BertModel

    small = dict(vocab_size=TINY_VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                 intermediate_size=64, max_position_embeddings=64)  # fmt: skip
    cfg = _eager(BertConfig(**small) if tiny else BertConfig())  # defaults: BERT-base uncased sizes
    return _wrap(BertModel(cfg), [s.name for s in _text(0, True)], ["last_hidden_state", "pooler_output"])


def _gpt2(tiny: bool) -> Any:
    from transformers import GPT2Config, GPT2LMHeadModel

    small = dict(vocab_size=TINY_VOCAB, n_positions=64, n_embd=32, n_layer=2, n_head=2) if tiny else {}
    cfg = _eager(GPT2Config(use_cache=False, **small))  # defaults: GPT-2 small (124M)
    return _wrap(GPT2LMHeadModel(cfg), [s.name for s in _text(0, False)], ["logits"])


def _convnext(tiny: bool) -> Any:
    from transformers import ConvNextConfig, ConvNextForImageClassification

    # defaults: ConvNeXt-T (depths 3, 3, 9, 3; widths 96..768), 224x224
    cfg = ConvNextConfig(hidden_sizes=[8, 16, 32, 64], depths=[1, 1, 1, 1], num_labels=10) if tiny else \
        ConvNextConfig(num_labels=1000)  # fmt: skip
    return _wrap(ConvNextForImageClassification(cfg), ["pixel_values"], ["logits"])


def _swin(tiny: bool) -> Any:
    from transformers import SwinConfig, SwinForImageClassification

    # defaults: Swin-T (patch 4, window 7, embed 96, depths 2, 2, 6, 2, heads 3, 6, 12, 24), 224x224
    small = dict(image_size=TINY_IMAGE, patch_size=2, embed_dim=16, depths=[2, 1], num_heads=[2, 2],
                 window_size=4, num_labels=10)  # fmt: skip
    cfg = _eager(SwinConfig(**small) if tiny else SwinConfig(num_labels=1000))
    return _wrap(SwinForImageClassification(cfg), ["pixel_values"], ["logits"])


def _distilbert(tiny: bool) -> Any:
    from transformers import DistilBertConfig, DistilBertModel

    small = dict(vocab_size=TINY_VOCAB, dim=32, n_layers=2, n_heads=2, hidden_dim=64, max_position_embeddings=64)
    cfg = _eager(DistilBertConfig(**small) if tiny else DistilBertConfig())  # defaults: distilbert-base
    return _wrap(DistilBertModel(cfg), [s.name for s in _text(0, False)], ["last_hidden_state"])


def _llama(tiny: bool) -> Any:
    """A LLaMA-style decoder at a small config: RMSNorm, rotary embeddings, SwiGLU, grouped-query
    attention (16 query heads over 4 key/value heads), causal and padding masks, untied LM head."""
    from transformers import LlamaConfig, LlamaForCausalLM

    size = dict(vocab_size=TINY_VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64) if tiny else \
        dict(vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=8,
             num_attention_heads=16, num_key_value_heads=4, max_position_embeddings=2048)  # fmt: skip
    cfg = _eager(LlamaConfig(use_cache=False, tie_word_embeddings=False, **size))
    return _wrap(LlamaForCausalLM(cfg), [s.name for s in _text(0, False)], ["logits"])


def _clip_vision(tiny: bool) -> Any:
    from transformers import CLIPVisionConfig, CLIPVisionModel

    # defaults: CLIP ViT-B/32 image encoder (pre-LayerNorm, quick GELU), 224x224
    small = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                 image_size=TINY_IMAGE, patch_size=8)  # fmt: skip
    cfg = _eager(CLIPVisionConfig(**small) if tiny else CLIPVisionConfig())
    return _wrap(CLIPVisionModel(cfg), ["pixel_values"], ["last_hidden_state", "pooler_output"])


def _image(size: int = 224, name: str = "pixel_values") -> list[InputSpec]:
    return [InputSpec(name, "float32", ["batch", 3, size, size])]


def _text(vocab: int, token_types: bool) -> list[InputSpec]:
    specs = [
        InputSpec("input_ids", "int64", ["batch", "seq"], 0, vocab, "int"),
        InputSpec("attention_mask", "int64", ["batch", "seq"], 0, 2, "mask"),
    ]
    if token_types:
        specs.append(InputSpec("token_type_ids", "int64", ["batch", "seq"], 0, 2, "int"))
    return specs


def _image_case(name: str, description: str, build: Callable[[bool], Any], outputs: list[str]) -> ModelCase:
    return ModelCase(name, description, build, _image(), outputs, _image(TINY_IMAGE))


def _text_case(name: str, description: str, build: Callable[[bool], Any], outputs: list[str], vocab: int,
               token_types: bool = False) -> ModelCase:  # fmt: skip
    return ModelCase(name, description, build, _text(vocab, token_types), outputs, _text(TINY_VOCAB, token_types))


HIDDEN = ["last_hidden_state", "pooler_output"]
CASES: dict[str, ModelCase] = {
    c.name: c
    for c in [
        # the zoo's five
        _image_case("resnet50", "ResNet-50 (transformers ResNetForImageClassification)", _resnet50, ["logits"]),
        _image_case("mobilenetv2", "MobileNetV2 1.0 224 (MobileNetV2ForImageClassification)", _mobilenetv2,
                    ["logits"]),
        _image_case("vit", "ViT-B/16 224 (ViTModel)", _vit, HIDDEN),
        _text_case("bert", "BERT-base (BertModel)", _bert, HIDDEN, 30522, token_types=True),
        _text_case("gpt2", "GPT-2 small (GPT2LMHeadModel, use_cache=False)", _gpt2, ["logits"], 50257),
        # five more architectures
        _image_case("convnext", "ConvNeXt-T 224 (ConvNextForImageClassification)", _convnext, ["logits"]),
        _image_case("swin", "Swin-T 224, window 7 (SwinForImageClassification)", _swin, ["logits"]),
        _text_case("distilbert", "DistilBERT-base (DistilBertModel)", _distilbert, ["last_hidden_state"], 30522),
        _text_case("llama", "LLaMA-style decoder, 8 layers, 1024 wide, GQA 16/4 heads, rotary, SwiGLU "
                   "(LlamaForCausalLM, use_cache=False)", _llama, ["logits"], 32000),
        _image_case("clip_vision", "CLIP ViT-B/32 image encoder 224 (CLIPVisionModel)", _clip_vision, HIDDEN),
    ]
}  # fmt: skip
ZOO = ("resnet50", "mobilenetv2", "bert", "vit", "gpt2")


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

    def is_norm(m: Any) -> bool:
        # Also the models' own norm classes that are no torch norm subclass in every transformers
        # version (LlamaRMSNorm; ConvNextLayerNorm in older releases): a 1-D weight, "Norm" in the name.
        w = getattr(m, "weight", None)
        return isinstance(m, norms) or (
            type(m).__name__.endswith("Norm") and isinstance(w, torch.nn.Parameter) and w.dim() == 1
        )

    blocks = sum(1 for m in module.modules() if getattr(m, "layer_scale_parameter", None) is not None)
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
            elif is_norm(m) and m.weight is not None:
                m.weight.copy_(0.8 + 0.4 * torch.rand(m.weight.shape, generator=gen))
                if getattr(m, "bias", None) is not None:
                    normal_(m.bias, 0.05)
            # ConvNeXt's layer scale starts at 1e-6 (a block is then nearly the identity): scale each
            # residual branch by about 1/sqrt(blocks) instead, so that every block contributes.
            if getattr(m, "layer_scale_parameter", None) is not None:
                scale = (0.8 + 0.4 * torch.rand(m.layer_scale_parameter.shape, generator=gen)) / blocks**0.5
                m.layer_scale_parameter.copy_(scale)
            # Swin's relative position bias: O(1), so that the attention depends on it.
            if isinstance(getattr(m, "relative_position_bias_table", None), torch.nn.Parameter):
                normal_(m.relative_position_bias_table, 0.5)
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


def _export_dynamo(module: Any, case: ModelCase, args: tuple, path: Path, static: bool, opset: int | None,
                   quiet: bool = False) -> None:  # fmt: skip
    import torch

    program = torch.onnx.export(
        module,
        args,
        dynamo=True,
        verbose=False if quiet else None,  # None: the exporter's progress lines
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
    p.add_argument("--tiny", action="store_true", help="the tiny configs (1-2 layers, widths 8-64, 32x32 images)")
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
                CASES[n].tiny() if a.tiny else CASES[n],
                a.out,
                exporters,
                dims,
                a.static,
                a.seed,
                (a.torchscript_opset, a.dynamo_opset),
                a.init,
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
