"""Make the exporter corpus of tests/corpus/: tiny transformers exported by both torch exporters.

    python tools/make_corpus.py [--out tests/corpus] [--models bert,gpt2,...] [--exporters torchscript,dynamo]
        [--tag torch2.13]

For every model (BERT, GPT-2, ViT, DistilBERT, a LLaMA-style decoder with grouped-query attention
and rotary embeddings, Qwen2 (the same with biased Q/K/V projections), CLIP's vision tower (quick
GELU), Swin (windowed attention with a relative-position bias and shifted windows' masks)), every
attention implementation of transformers the model has (eager: matmul + softmax written out;
sdpa: torch's scaled_dot_product_attention, which each exporter spells its own way) and every
exporter (torch.onnx.export dynamo=False at opset 17, dynamo=True at its default), it writes
``MODEL.IMPL.EXPORTER[.TAG].onnx`` (self-contained, < 200 KB: 2 layers, hidden 32) and
``manifest.json``: for each file the torch and transformers versions, the number of layers, the
input shapes the tests feed, and the largest difference between ONNX Runtime and PyTorch. --tag
names a second set from another torch version beside the first (the corpus holds the untagged
set from torch 2.14 and a ``torch2.13`` set).

The files are committed so the tests (tests/passes/test_corpus.py) need no torch. The torch-2.11
spelling of SDPA (split sqrt scales, a bool-mask Where, an IsNaN -> Where guard), which the local
torch no longer writes, is hand-built in the tests with onnx.helper.

Needs torch, transformers and onnxscript; graphc's tests never import this file.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger("make_corpus")

LAYERS = 2
HIDDEN = 32
HEADS = 4
KV_HEADS = 2  # the LLaMA-style decoder's grouped-query attention: 2 query heads per kv head
FFN = 64
VOCAB = 64
BATCH, SEQ = 2, 8
IMAGE, PATCH = 16, 4
MAX_BYTES = int(__import__("os").environ.get("CORPUS_MAX_BYTES", 200_000))


@dataclass
class Case:
    name: str
    build: Callable[[str], Any]  # attn implementation -> transformers model
    inputs: Callable[[np.random.Generator], dict[str, np.ndarray]]
    outputs: list[str]
    impls: tuple[str, ...] = ("eager", "sdpa")  # the attention implementations transformers has for it
    layers: int = LAYERS  # attention blocks in the export


def _text_inputs(token_types: bool) -> Callable[[np.random.Generator], dict[str, np.ndarray]]:
    def make(rng: np.random.Generator) -> dict[str, np.ndarray]:
        ids = rng.integers(0, VOCAB, size=(BATCH, SEQ)).astype(np.int64)
        mask = np.ones((BATCH, SEQ), np.int64)
        mask[1, SEQ - 3 :] = 0  # padding at the end of the second row, so the mask matters
        feeds = {"input_ids": ids, "attention_mask": mask}
        if token_types:
            feeds["token_type_ids"] = rng.integers(0, 2, size=(BATCH, SEQ)).astype(np.int64)
        return feeds

    return make


def _image_inputs(rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {"pixel_values": rng.standard_normal((BATCH, 3, IMAGE, IMAGE)).astype(np.float32)}


def _bert(impl: str) -> Any:
    from transformers import BertConfig, BertModel

    cfg = BertConfig(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                     intermediate_size=FFN, max_position_embeddings=32, attn_implementation=impl)  # fmt: skip
    return BertModel(cfg, add_pooling_layer=False)


def _distilbert(impl: str) -> Any:
    from transformers import DistilBertConfig, DistilBertModel

    cfg = DistilBertConfig(vocab_size=VOCAB, dim=HIDDEN, n_layers=LAYERS, n_heads=HEADS, hidden_dim=FFN,
                           max_position_embeddings=32, attn_implementation=impl)  # fmt: skip
    return DistilBertModel(cfg)


def _gpt2(impl: str) -> Any:
    from transformers import GPT2Config, GPT2Model

    cfg = GPT2Config(vocab_size=VOCAB, n_embd=HIDDEN, n_layer=LAYERS, n_head=HEADS, n_inner=FFN, n_positions=32,
                     use_cache=False, attn_implementation=impl)  # fmt: skip
    return GPT2Model(cfg)


def _vit(impl: str) -> Any:
    from transformers import ViTConfig, ViTModel

    cfg = ViTConfig(hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=HEADS, intermediate_size=FFN,
                    image_size=IMAGE, patch_size=PATCH, attn_implementation=impl)  # fmt: skip
    return ViTModel(cfg, add_pooling_layer=False)


def _llama(impl: str) -> Any:
    from transformers import LlamaConfig, LlamaModel

    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                      num_key_value_heads=KV_HEADS, intermediate_size=FFN, max_position_embeddings=32,
                      use_cache=False, attn_implementation=impl)  # fmt: skip
    return LlamaModel(cfg)


def _qwen2(impl: str) -> Any:
    from transformers import Qwen2Config, Qwen2Model

    cfg = Qwen2Config(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                      num_key_value_heads=KV_HEADS, intermediate_size=FFN, max_position_embeddings=32,
                      use_cache=False, attn_implementation=impl)  # fmt: skip
    return Qwen2Model(cfg)


def _clip_vision(impl: str) -> Any:
    from transformers import CLIPVisionConfig, CLIPVisionModel

    cfg = CLIPVisionConfig(hidden_size=HIDDEN, intermediate_size=FFN, num_hidden_layers=LAYERS,
                           num_attention_heads=HEADS, image_size=IMAGE, patch_size=PATCH,
                           attn_implementation=impl)  # fmt: skip
    return CLIPVisionModel(cfg)


def _swin(impl: str) -> Any:
    from transformers import SwinConfig, SwinModel

    # Two blocks in one stage at 16x16 patches of 2: 8x8 tokens in 4x4 windows, the second block
    # shifted (its attention carries the shifted windows' mask besides the position bias). Half
    # the others' width: the TorchScript export spells the window and shift indexing out at length.
    cfg = SwinConfig(image_size=IMAGE, patch_size=2, embed_dim=HIDDEN // 2, depths=[LAYERS], num_heads=[HEADS // 2],
                     window_size=4, attn_implementation=impl)  # fmt: skip
    return SwinModel(cfg, add_pooling_layer=False)


CASES = {
    c.name: c
    for c in [
        Case("bert", _bert, _text_inputs(True), ["last_hidden_state"]),
        Case("distilbert", _distilbert, _text_inputs(False), ["last_hidden_state"]),
        Case("gpt2", _gpt2, _text_inputs(False), ["last_hidden_state"]),
        Case("vit", _vit, _image_inputs, ["last_hidden_state"]),
        Case("llama", _llama, _text_inputs(False), ["last_hidden_state"]),
        Case("qwen2", _qwen2, _text_inputs(False), ["last_hidden_state"]),
        Case("clip_vision", _clip_vision, _image_inputs, ["last_hidden_state"]),
        Case("swin", _swin, _image_inputs, ["last_hidden_state"], impls=("eager",)),
    ]
}
IMPLS = ("eager", "sdpa")
EXPORTERS = ("torchscript", "dynamo")


def _wrapped(model: Any, names: list[str], outputs: list[str]) -> Any:
    """A module whose forward takes the inputs positionally, in `names` order, and returns a tuple."""
    import torch

    class Wrapped(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, *args: Any) -> tuple:
            out = self.model(**dict(zip(names, args, strict=True)), return_dict=True)
            return tuple(out[k] for k in outputs)

    return Wrapped().eval()


def _rescale(model: Any) -> None:
    """Variance-preserving weights (N(0, 1/fan_in)) so that attention is far from uniform and the
    outputs are O(1): the configs' std-0.02 init makes every softmax row nearly flat, where a
    wrong mask or scale would hardly show."""
    import torch

    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 2 and "embed" not in name and "wte" not in name and "wpe" not in name:
                conv1d = any(k in name for k in ("c_attn", "c_fc", "c_proj"))  # GPT-2's Conv1D: (in, out)
                fan_in = p.shape[0] if conv1d else p.shape[1]
                p.normal_(0.0, fan_in**-0.5)
            elif p.ndim == 2:
                p.normal_(0.0, 1.0)


def _strip(path: Path) -> None:
    """Drop what the dynamo exporter adds for debugging (per-node stack traces and source
    locations in metadata_props and doc strings): it is most of a tiny model's file and no part
    of the graph's meaning."""
    import onnx

    m = onnx.load(str(path))
    for g in [m.graph, *(f for f in m.functions)]:
        for n in g.node:
            del n.metadata_props[:]
            n.doc_string = ""
    del m.graph.value_info[:]
    onnx.save(m, str(path))


def export(case: Case, impl: str, exporter: str, out: Path, rng_seed: int = 0, tag: str = "") -> dict[str, Any]:
    import onnxruntime as ort
    import torch

    torch.manual_seed(rng_seed)
    model = case.build(impl).eval()
    _rescale(model)
    feeds = case.inputs(np.random.default_rng(rng_seed))
    names = list(feeds)
    module = _wrapped(model, names, case.outputs)
    args = tuple(torch.from_numpy(feeds[n]) for n in names)
    path = out / f"{case.name}.{impl}.{exporter}{'.' + tag if tag else ''}.onnx"
    if exporter == "torchscript":
        torch.onnx.export(module, args, str(path), dynamo=False, opset_version=17, input_names=names,
                          output_names=case.outputs, do_constant_folding=True)  # fmt: skip
    else:
        prog = torch.onnx.export(module, args, dynamo=True, input_names=names, output_names=case.outputs)
        prog.optimize()
        prog.save(str(path), external_data=False)
        _strip(path)
    size = path.stat().st_size
    if size > MAX_BYTES:
        path.unlink()
        raise RuntimeError(f"{path.name} is {size} bytes, over {MAX_BYTES}")
    with torch.no_grad():
        want = [t.numpy() for t in module(*args)]
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = sess.run(None, {i.name: feeds[i.name] for i in sess.get_inputs()})
    diff = max(float(np.abs(g - w).max()) for g, w in zip(got, want, strict=True))
    import onnx
    import transformers

    ops: dict[str, int] = {}
    for n in onnx.load(str(path)).graph.node:
        ops[n.op_type] = ops.get(n.op_type, 0) + 1
    return {
        "file": path.name,
        "model": case.name,
        "attn_implementation": impl,
        "exporter": exporter,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "layers": case.layers,
        "inputs": {k: list(v.shape) for k, v in feeds.items()},
        "bytes": size,
        "ort_vs_torch_max_abs": diff,
        "ops": dict(sorted(ops.items())),
    }


# ONNX Runtime's transformer optimizer's model type per model (the rest it has none for).
ORT_TYPES = {"bert": "bert", "distilbert": "bert", "gpt2": "gpt2", "vit": "vit", "clip_vision": "clip"}


def ort_optimize(key: str, rec: dict[str, Any], out: Path) -> tuple[str, dict[str, Any]]:
    """ONNX Runtime's transformer optimizer (its own fusions only, opt_level 0, with the heads and
    width given: it finds no attention without them) on a corpus file: com.microsoft Attention,
    SkipLayerNormalization, EmbedLayerNormalization, BiasGelu, FastGelu or QuickGelu in place
    of the plain ops. Needs onnxruntime only (no torch)."""
    import onnx
    import onnxruntime as ort
    from onnxruntime.transformers.optimizer import optimize_model

    src = out / rec["file"]
    dst = out / (src.name[: -len(".onnx")] + ".ort.onnx")
    opt = optimize_model(str(src), model_type=ORT_TYPES[rec["model"]], num_heads=HEADS, hidden_size=HIDDEN,
                         opt_level=0)  # fmt: skip
    opt.save_model_to_file(str(dst))
    model = onnx.load(str(dst))
    feeds = CASES[rec["model"]].inputs(np.random.default_rng(0))
    runs = []
    for path in (src, dst):
        sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        runs.append(sess.run(None, {i.name: feeds[i.name] for i in sess.get_inputs()}))
    diff = max(float(np.abs(g - w).max()) for g, w in zip(runs[1], runs[0], strict=True))
    ops: dict[str, int] = {}
    for n in model.graph.node:
        op = n.op_type if not n.domain or n.domain == "ai.onnx" else f"{n.domain}.{n.op_type}"
        ops[op] = ops.get(op, 0) + 1
    size = dst.stat().st_size
    if size > MAX_BYTES:
        dst.unlink()
        raise RuntimeError(f"{dst.name} is {size} bytes, over {MAX_BYTES}")
    import onnxruntime

    return f"{key}.ort", {
        **rec,
        "file": dst.name,
        "source": key,
        "ort_optimizer": {
            "model_type": ORT_TYPES[rec["model"]],
            "num_heads": HEADS,
            "hidden_size": HIDDEN,
            "opt_level": 0,
            "onnxruntime": onnxruntime.__version__,
        },  # fmt: skip
        "bytes": size,
        "ort_vs_source_max_abs": diff,
        "ops": dict(sorted(ops.items())),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("tests/corpus"))
    ap.add_argument("--models", default=",".join(CASES))
    ap.add_argument("--impls", default=",".join(IMPLS))
    ap.add_argument("--exporters", default=",".join(EXPORTERS))
    ap.add_argument("--tag", default="", help="a name for this set (e.g. torch2.13), in file names and keys")
    ap.add_argument("--ort-optimize", action="store_true",
                    help="instead of exporting: ORT's transformer optimizer on the manifest's eager exports "
                         "of the models it knows (MODEL.eager.EXPORTER[.TAG].ort.onnx)")  # fmt: skip
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    a.out.mkdir(parents=True, exist_ok=True)
    manifest_path = a.out / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    failed = 0
    if a.ort_optimize:
        for key, rec in sorted(manifest.items()):
            if "source" in rec or rec["model"] not in ORT_TYPES or rec["attn_implementation"] != "eager":
                continue
            if rec["model"] not in a.models.split(","):
                continue
            try:
                new_key, new = ort_optimize(key, rec, a.out)
            except Exception as e:  # ORT's optimizer fails on some exports; reported, the rest go on
                failed += 1
                log.error("%s: ORT's optimizer failed: %s: %s", key, type(e).__name__, str(e).splitlines()[0][:200])
                continue
            same = [k for k, r in manifest.items() if "source" in r and k != new_key
                    and (a.out / r["file"]).read_bytes() == (a.out / new["file"]).read_bytes()]  # fmt: skip
            if same:  # another torch version's export optimized to the very same file: keep one
                (a.out / new["file"]).unlink()
                log.info("%s: the same file as %s, not kept", new_key, same[0])
                continue
            manifest[new_key] = new
            contrib = {k: v for k, v in new["ops"].items() if k.startswith("com.microsoft.")}
            log.info("%s: %d bytes, vs source %.2e, %s", new_key, new["bytes"], new["ort_vs_source_max_abs"], contrib)
        manifest_path.write_text(json.dumps(dict(sorted(manifest.items())), indent=1) + "\n")
        return 1 if failed else 0
    for name in a.models.split(","):
        if name not in CASES:
            print(f"error: unknown model {name!r} (have {', '.join(CASES)})", file=sys.stderr)
            return 2
        for impl in a.impls.split(","):
            if impl not in CASES[name].impls:
                continue  # transformers has no such attention path for this model
            for exporter in a.exporters.split(","):
                key = f"{name}.{impl}.{exporter}{'.' + a.tag if a.tag else ''}"
                try:
                    rec = export(CASES[name], impl, exporter, a.out, tag=a.tag)
                except Exception as e:  # one failed export must not stop the others; it is reported
                    failed += 1
                    log.error("%s: export failed: %s: %s", key, type(e).__name__, str(e).splitlines()[0][:200])
                    continue
                manifest[key] = rec
                log.info("%s: %d bytes, ORT vs torch %.2e", key, rec["bytes"], rec["ort_vs_torch_max_abs"])
    manifest_path.write_text(json.dumps(dict(sorted(manifest.items())), indent=1) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
