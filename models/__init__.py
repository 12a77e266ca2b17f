"""The graphc model zoo: ONNX models built with onnx.helper and seeded random weights.

    import models
    model = models.build("bert", size="tiny", layernorm="decomposed")
    feeds = models.sample_inputs("bert", model, seed=0)

Each family (mlp, resnet, mobilenetv2, bert, vit) has named size presets: `tiny` (CI: under
1 MB, interpretable in well under a second) and `full` (the real architecture's sizes, for
benchmarks). Options given to `build` override the preset; every family takes `opset`
(default 17, 11 and up), `seed` and `batch` (a symbolic name or a fixed size).
Command line: `python -m models --list`, `python -m models NAME --size full -o FILE.onnx`.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import numpy as np
import onnx

from models import bert, mlp, mobilenetv2, resnet, vit
from models._graph import CONFIG_KEY, DEFAULT_OPSET, MIN_OPSET

FAMILIES: dict[str, ModuleType] = {
    "mlp": mlp,
    "resnet": resnet,
    "mobilenetv2": mobilenetv2,
    "bert": bert,
    "vit": vit,
}
SIZES = ("tiny", "full")
EXTERNAL_DATA_THRESHOLD = 100 * 2**20  # bytes; larger models keep their weights in FILE.onnx.data
DEFAULT_BATCH = 2

__all__ = [
    "DEFAULT_OPSET",
    "FAMILIES",
    "MIN_OPSET",
    "SIZES",
    "build",
    "config_of",
    "list_models",
    "sample_inputs",
    "save",
]


def list_models() -> list[str]:
    return list(FAMILIES)


def _family(name: str) -> ModuleType:
    try:
        return FAMILIES[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; the zoo has {', '.join(FAMILIES)}") from None


def preset(name: str, size: str = "tiny") -> dict:
    """The builder arguments of a named size (a copy)."""
    presets = _family(name).PRESETS
    if size not in presets:
        raise ValueError(f"unknown size {size!r} for {name}; sizes are {', '.join(presets)}")
    return json.loads(json.dumps(presets[size]))


def build(name: str, size: str = "tiny", **options: object) -> onnx.ModelProto:
    """Build model `name` at preset `size`, with `options` overriding the preset's arguments
    (see each family's `build` for what it takes)."""
    family = _family(name)
    kwargs = {**preset(name, size), **options}
    try:
        model = family.build(**kwargs)
    except TypeError as e:
        if "unexpected keyword" in str(e):
            raise ValueError(f"{name}: {e}; see help(models.{name}.build)") from None
        raise
    config = config_of(model)
    config["size"] = size
    onnx.helper.set_model_props(model, {CONFIG_KEY: json.dumps(config, sort_keys=True)})
    return model


def config_of(model: onnx.ModelProto) -> dict:
    """The builder arguments recorded in a zoo model's metadata."""
    for prop in model.metadata_props:
        if prop.key == CONFIG_KEY:
            return json.loads(prop.value)
    raise ValueError("the model carries no graphc.models config: it was not built by models.build")


def sample_inputs(
    name: str, model: onnx.ModelProto, seed: int = 0, *, batch: int = DEFAULT_BATCH, seq: int | None = None
) -> dict[str, np.ndarray]:
    """Valid inputs for `model` (built by `build(name, ...)`): symbolic batch dims become `batch`,
    symbolic sequence dims `seq` (default: a quarter of the position table, at most 128)."""
    config = config_of(model)
    if config.get("model") != name:
        raise ValueError(f"the model was built as {config.get('model')!r}, not {name!r}")
    if seq is None:
        seq = min(128, max(1, config.get("max_positions", 64) // 4))
    dims = {"batch": batch, "seq": seq}
    shapes: dict[str, list[int]] = {}
    for inp in model.graph.input:
        shape = []
        for d in inp.type.tensor_type.shape.dim:
            if d.HasField("dim_value"):
                shape.append(d.dim_value)
            elif d.dim_param in dims:
                shape.append(dims[d.dim_param])
            else:
                raise ValueError(f"input {inp.name} has a dim {d.dim_param!r} with no sample size")
        shapes[inp.name] = shape
    return _family(name).sample_inputs(config, shapes, np.random.default_rng(seed))


def save(model: onnx.ModelProto, path: str | Path) -> list[Path]:
    """Write `model` to `path`; over EXTERNAL_DATA_THRESHOLD the weights go to PATH.data beside it.
    Returns the files written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = path.with_name(path.name + ".data")
    data.unlink(missing_ok=True)  # save_model appends to an existing data file
    if model.ByteSize() > EXTERNAL_DATA_THRESHOLD:
        model = onnx.ModelProto.FromString(model.SerializeToString())  # leave the caller's copy inline
        onnx.save_model(
            model,
            str(path),
            save_as_external_data=True,
            all_tensors_to_one_file=True,
            location=data.name,
            size_threshold=1024,
        )
        return [path, data]
    onnx.save_model(model, str(path))
    return [path]
