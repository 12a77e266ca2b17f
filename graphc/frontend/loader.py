"""Reading an ONNX file: parse, validate, inline local functions, and map initializers.

Initializers are not copied: raw data is viewed in place (`np.frombuffer`) and external data is
memory-mapped, so loading a large model costs little more than reading its protobuf.
"""

from __future__ import annotations

import logging
import math
import os
from pathlib import Path

import numpy as np
import onnx
from google.protobuf.message import DecodeError
from onnx import numpy_helper

from graphc.errors import ModelLoadError
from graphc.ir.types import DType

log = logging.getLogger(__name__)

ModelSource = str | os.PathLike | bytes | onnx.ModelProto


def read_model(source: ModelSource) -> tuple[onnx.ModelProto, Path | None]:
    """Parse and check a model. Returns the proto and the folder its external data is under."""
    base: Path | None = None
    path: Path | None = None
    if isinstance(source, onnx.ModelProto):
        model = source
    elif isinstance(source, bytes):
        model = _parse(source, "<bytes>")
    else:
        path = Path(source)
        if not path.exists():
            raise ModelLoadError(f"{path}: no such file")
        if path.is_dir():
            raise ModelLoadError(f"{path}: is a folder, not an ONNX file")
        base = path.parent
        model = _parse(path.read_bytes(), str(path))
    if not model.graph.node and not model.graph.output:
        raise ModelLoadError("the model has an empty graph (is this an ONNX file?)")
    try:
        # full_check=False: graphc does its own type inference; the checker catches malformed
        # protos, unknown ops of the standard domain, and broken references.
        if path is not None:
            # From the path, the checker reads the file in C++ (no Python re-serialization of a
            # large model) and resolves external data files relative to it.
            onnx.checker.check_model(str(path), full_check=False)
        else:
            onnx.checker.check_model(model, full_check=False)
    except onnx.checker.ValidationError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else "validation failed"
        if "is deprecated in domain_version" not in first:
            raise ModelLoadError(f"the ONNX checker rejects the model: {first}") from None
        # A deprecated op version (e.g. GroupNormalization-18) is still a valid model that
        # runtimes accept; graphc converts such versions where it has a converter.
        log.warning("ONNX checker: %s", first)
    except Exception as e:  # the checker raises other errors on some corrupt protos
        raise ModelLoadError(f"the ONNX checker fails on the model: {e}") from None
    if model.functions:
        from onnx import inliner

        model = inliner.inline_local_functions(model)
    return model, base


def _parse(data: bytes, where: str) -> onnx.ModelProto:
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError) as e:
        raise ModelLoadError(f"{where}: not a valid ONNX file (truncated or corrupt?): {e}") from None
    if not model.HasField("graph"):
        raise ModelLoadError(f"{where}: not an ONNX model (no graph)")
    return model


def tensor_to_array(t: onnx.TensorProto, base: Path | None) -> np.ndarray:
    """An initializer as a read-only array, without copying where the bytes allow it."""
    try:
        dtype = DType.from_onnx(t.data_type)
    except ValueError as e:
        raise ModelLoadError(f"initializer '{t.name}': {e}") from None
    shape = tuple(int(d) for d in t.dims)
    if t.data_location == onnx.TensorProto.EXTERNAL:
        return _external(t, dtype, shape, base)
    simple = (
        dtype.numpy.kind in "fiub"
        and dtype.itemsize * 8 >= 8
        and dtype
        not in (
            DType.uint4,
            DType.int4,
            DType.float4e2m1,
        )
    )
    if any(d < 0 for d in shape):
        raise ModelLoadError(f"initializer '{t.name}' has a negative dim: {list(shape)}")
    if t.HasField("raw_data") and simple:
        count = math.prod(shape)
        need = count * dtype.itemsize
        if len(t.raw_data) != need:
            raise ModelLoadError(
                f"initializer '{t.name}': {len(t.raw_data)} bytes of data for shape {list(shape)} "
                f"of {dtype.name} (needs {need})"
            )
        arr = np.frombuffer(t.raw_data, dtype=dtype.numpy.newbyteorder("<")).reshape(shape)
        return arr.astype(dtype.numpy, copy=False)
    try:
        arr = numpy_helper.to_array(t)
    except Exception as e:
        raise ModelLoadError(f"initializer '{t.name}' cannot be read: {e}") from None
    arr = np.asarray(arr)
    if arr.dtype != dtype.numpy and dtype is not DType.string:
        arr = arr.astype(dtype.numpy)
    arr.setflags(write=False)
    return arr


def _byte_count(info: dict[str, str], key: str, default: int, name: str) -> int:
    """An external-data offset or length: a decimal count of bytes, nothing else."""
    if key not in info:
        return default
    text = info[key].strip()
    if not text.isdigit() or not text.isascii():
        raise ModelLoadError(f"initializer '{name}': external data {key} {info[key][:40]!r} is not a byte count")
    if len(text) > 19:  # past int64, and far past any file
        raise ModelLoadError(f"initializer '{name}': external data {key} {text[:40]} is too large")
    return int(text)


def _external(t: onnx.TensorProto, dtype: DType, shape: tuple[int, ...], base: Path | None) -> np.ndarray:
    info = {e.key: e.value for e in t.external_data}
    if "location" not in info:
        raise ModelLoadError(f"initializer '{t.name}': external data without a location")
    if base is None:
        raise ModelLoadError(
            f"initializer '{t.name}' lives in external file '{info['location']}': load the model "
            "from its path (not from bytes or a proto) so that the file can be found"
        )
    where = f"initializer '{t.name}': external data location {info['location'][:80]!r}"
    if "\0" in info["location"] or not info["location"].strip():
        raise ModelLoadError(f"{where} is not a file name")
    try:
        loc = (base / info["location"]).resolve()
        is_file = loc.is_file()
    except (OSError, ValueError, RuntimeError) as e:
        raise ModelLoadError(f"{where}: {e}") from None
    if base.resolve() not in loc.parents and loc.parent != base.resolve():
        raise ModelLoadError(
            f"initializer '{t.name}': external path '{info['location']}' leaves the model's folder"
        )
    if not is_file:
        raise ModelLoadError(f"initializer '{t.name}': external data file {loc} is missing (or not a file)")
    count = math.prod(shape)  # exact: an int64 product of large dims wraps
    need = count * dtype.itemsize
    offset = _byte_count(info, "offset", 0, t.name)
    length = _byte_count(info, "length", need, t.name)
    if length != need:
        raise ModelLoadError(f"initializer '{t.name}': external length {length} != {need} bytes needed")
    size = loc.stat().st_size
    if offset + need > size:
        raise ModelLoadError(
            f"initializer '{t.name}': external data {loc.name}[{offset}:{offset + need}] is past the "
            f"end of the file ({size} bytes): truncated?"
        )
    if count == 0:
        return np.zeros(shape, dtype=dtype.numpy)
    try:
        arr = np.memmap(loc, dtype=dtype.numpy, mode="r", offset=offset, shape=shape)
    except (OSError, ValueError, OverflowError) as e:
        raise ModelLoadError(f"initializer '{t.name}': cannot map external data {loc.name}: {e}") from None
    return arr
