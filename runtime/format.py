"""The engine file: one zip holding

    manifest.json          format version, graphc version, build info, I/O specs, kernel plan,
                           memory plan, tuning decisions, report, and the SHA-256 of every member
    weights.safetensors    every weight (16-bit floats other than fp16 stored as their bits)
    kernels/<digest>.cu    the CUDA source of every kernel (JIT on a GPU with no matching cubin)
    kernels/<arch>/<digest>.cubin

No pickle, no host code. `load` validates everything before it touches the GPU.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from graphc.runtime.attrs_schema import SCHEMA_VERSION as ATTRS_SCHEMA_VERSION
from graphc.runtime.container import MANIFEST, WEIGHTS, Container, Limits, make_comment
from graphc.runtime.errors import EngineError
from graphc.runtime.plan import (
    WEIGHT,
    KernelPlan,
    MemoryPlan,
    memory_plan_to_json,
)
from graphc.runtime.schema import ManifestDoc, decode_manifest, parse_json
from graphc.runtime.validate import plan_from_doc, validate_kernels, validate_plan

log = logging.getLogger(__name__)

# 2: the manifest's digest in the zip comment, a typed schema, every member listed.
FORMAT_VERSION = 2
# safetensors' numpy API knows these dtypes; others are stored as their raw bits.
_SAFETENSORS_NATIVE = {
    "float16",
    "float32",
    "float64",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "bool",
}


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _numpy_dtype(name: str) -> np.dtype:
    try:
        return np.dtype(name)
    except TypeError:
        import ml_dtypes

        return np.dtype(getattr(ml_dtypes, name))


def _weights_bytes(weights: dict[str, np.ndarray]) -> bytes:
    from safetensors.numpy import save

    out = {}
    for name, w in weights.items():
        a = np.ascontiguousarray(w)
        if a.dtype.name not in _SAFETENSORS_NATIVE:
            a = a.view(np.uint8).reshape(a.shape + (a.dtype.itemsize,)) if a.ndim else a.reshape(1).view(np.uint8)
        out[name] = a
    return save(out) if out else save({"__empty__": np.zeros(1, np.uint8)})


def save_engine(engine: Any, path: str | Path) -> None:
    from graphc._version import __version__

    plan: KernelPlan = engine.plan
    members: dict[str, bytes] = {
        WEIGHTS: _weights_bytes({n: engine.weights[n] for n, t in plan.tensors.items() if t.kind == WEIGHT})
    }
    kernels = getattr(engine, "kernels", None)
    arg_counts: dict[str, int] = {}
    if kernels is not None:
        for digest, src in kernels.sources.items():
            members[f"kernels/{digest}.cu"] = src.encode()
            arg_counts[digest] = _count_params(src, kernels.names[digest])
        for arch, cubins in kernels.cubins.items():
            for digest, cubin in cubins.items():
                members[f"kernels/{arch}/{digest}.cubin"] = cubin
    manifest = {
        "format": "graphc-engine",
        "format_version": FORMAT_VERSION,
        "graphc_version": __version__,
        "target": engine.target,
        "build": engine.build_info,
        "attrs_schema": ATTRS_SCHEMA_VERSION,  # the version of the attrs table the steps' attrs follow
        "inputs": [vars(s) for s in engine.inputs],
        "outputs": [vars(s) for s in engine.outputs],
        "plan": plan.to_json(),
        "memory": memory_plan_to_json(engine.memory),
        "kernels": {
            d: {
                "name": kernels.names[d],
                "family": kernels.families.get(d, ""),
                "args": arg_counts[d],
                "requires_arch": kernels.requires.get(d),
            }
            for d in (kernels.sources if kernels else {})
        },
        "archs": sorted(kernels.cubins) if kernels else [],
        "tuning": engine.report.get("tuning", {}),
        "report": engine.report,
        "members": {name: _sha256(data) for name, data in members.items()},
    }
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    manifest_bytes = json.dumps(manifest, indent=1, default=_json_default).encode()
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.comment = make_comment(_sha256(manifest_bytes))
        z.writestr(MANIFEST, manifest_bytes)
        for name, data in members.items():
            z.writestr(name, data, compress_type=zipfile.ZIP_STORED if name == WEIGHTS else zipfile.ZIP_DEFLATED)
    tmp.replace(path)


def _json_default(o: Any) -> Any:
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"{type(o).__name__} is not JSON-serializable")


def _count_params(source: str, name: str) -> int:
    m = re.search(
        r'extern\s+"C"\s+__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s+)?' + re.escape(name) + r"\s*\(([^)]*)\)",
        source,
    )
    if not m:
        raise EngineError(f'kernel {name} has no extern "C" signature in its source')
    params = m.group(1).strip()
    return 0 if not params else params.count(",") + 1


# ---- loading and validation --------------------------------------------------------------------


class EngineFile:
    """A validated engine file's contents (nothing on a GPU yet)."""

    def __init__(
        self,
        manifest: dict[str, Any],
        plan: KernelPlan,
        memory: MemoryPlan,
        weights: dict[str, np.ndarray],
        sources: dict[str, str],
        cubins: dict[str, dict[str, bytes]],
        manifest_digest: str = "",
        signature: bytes | None = None,
    ):
        self.manifest, self.plan, self.memory = manifest, plan, memory
        self.weights, self.sources, self.cubins = weights, sources, cubins
        self.manifest_digest, self.signature = manifest_digest, signature


def read_engine(path: str | Path, limits: Limits | None = None, verify_key: str | Path | None = None) -> EngineFile:
    """Read and validate an engine, in this order: the zip's member list and sizes (nothing
    decompressed yet), the manifest against the digest in the zip comment (and the signature, with
    `verify_key`), the manifest's schema, the member hashes, then the plan's meaning."""
    path = Path(path)
    limits = limits or Limits.default()
    with Container(path, limits) as box:
        raw_manifest = box.read_manifest()
        if verify_key is not None:
            from graphc.runtime.signing import verify_digest

            verify_digest(box.manifest_digest, box.signature, verify_key, path)
        obj = parse_json_at(raw_manifest, path)
        doc = _decode(obj, path)
        members = doc.members
        if MANIFEST in members:
            raise EngineError(f"{path}: the manifest lists itself as a member")
        present = set(box.infos) - {MANIFEST}
        missing = sorted(set(members) - present)
        if missing:
            raise EngineError(f"{path}: member {missing[0]} listed in the manifest is missing")
        extra = sorted(present - set(members))
        if extra:
            raise EngineError(f"{path}: unexpected members {extra[:5]} (not listed in the manifest)")
        if WEIGHTS not in members:
            raise EngineError(f"{path}: member {WEIGHTS} listed in the manifest is missing")
        raw: dict[str, bytes] = {}
        for name, digest in members.items():
            data = box.read(name)
            if _sha256(data) != digest:
                raise EngineError(f"{path}: member {name} does not match its SHA-256 (corrupt or edited)")
            raw[name] = data
        manifest_digest, signature = box.manifest_digest, box.signature
    plan, memory = plan_from_doc(doc)
    validate_plan(doc, plan, memory, limits, path)
    sources: dict[str, str] = {}
    cubins: dict[str, dict[str, bytes]] = {}
    cubin_members: list[tuple[str, str]] = []
    for n in members:
        parts = n.split("/")
        if len(parts) == 2 and n.endswith(".cu"):
            try:
                sources[parts[1][:-3]] = raw[n].decode()
            except UnicodeDecodeError:
                raise EngineError(f"{path}: kernel source {n} is not UTF-8 text") from None
        elif len(parts) == 3 and n.endswith(".cubin"):
            cubins.setdefault(parts[1], {})[parts[2][:-6]] = raw[n]
            cubin_members.append((parts[1], parts[2][:-6]))
    validate_kernels(doc, plan, sources, cubin_members, path)
    weights = _load_weights(raw[WEIGHTS], plan, path)
    return EngineFile(obj, plan, memory, weights, sources, cubins, manifest_digest, signature)


def parse_json_at(raw: bytes, path: Path) -> Any:
    try:
        return parse_json(raw)
    except EngineError as e:
        raise EngineError(f"{path}: {e}") from None


def _decode(obj: Any, path: Path) -> ManifestDoc:
    try:
        return decode_manifest(obj, FORMAT_VERSION)
    except EngineError as e:
        raise EngineError(f"{path}: {e}") from None


def _load_weights(data: bytes, plan: KernelPlan, path: Path) -> dict[str, np.ndarray]:
    from safetensors import SafetensorError
    from safetensors.numpy import load

    try:
        stored = load(data)
    except (SafetensorError, ValueError, OSError, TypeError, KeyError, OverflowError, MemoryError) as e:
        first = str(e).splitlines()[0] if str(e) else repr(e)
        raise EngineError(f"{path}: weights.safetensors is corrupt: {first}") from None
    names = {n for n, t in plan.tensors.items() if t.kind == WEIGHT}
    extra = sorted(set(stored) - names - {"__empty__"})
    if extra:
        raise EngineError(f"{path}: weights.safetensors holds '{extra[0]}', which is not a weight of the plan")
    out = {}
    for name in names:
        t = plan.tensors[name]
        if name not in stored:
            raise EngineError(f"{path}: weight '{name}' is missing from weights.safetensors")
        a = stored[name]
        dt = _numpy_dtype(t.dtype)
        if t.dtype in _SAFETENSORS_NATIVE:
            # Stored in its own dtype and shape: any other reading of its bytes is a changed plan.
            # (safetensors stores a scalar as one element of shape [1])
            if a.dtype != dt or (list(a.shape) != list(t.shape) and not (t.shape == [] and list(a.shape) == [1])):
                raise EngineError(
                    f"{path}: weight '{name}' is stored as {a.dtype}{list(a.shape)}; the plan says {t.dtype}{t.shape}"
                )
        else:
            # 16-bit floats other than fp16 (and fp8) are stored as their bits: uint8, one trailing
            # axis of the item size.
            # (a scalar's bits may be stored as [itemsize] or [1, itemsize])
            wants = [[*t.shape, dt.itemsize]] if t.shape else [[dt.itemsize], [1, dt.itemsize]]
            if a.dtype != np.uint8 or list(a.shape) not in wants:
                raise EngineError(
                    f"{path}: weight '{name}' is stored as {a.dtype}{list(a.shape)}; the plan says {t.dtype}{t.shape}"
                )
            a = a.reshape(-1).view(dt)
        out[name] = a.reshape(t.shape)
    return out


def load(path: str | Path, device: int = 0, *, verify_key: str | Path | None = None, limits: Limits | None = None):
    """Load an engine file: validated first, then weights uploaded and kernels loaded.
    `verify_key`: a PEM ed25519 public key the engine's signature must verify against."""
    from graphc.runtime.engine import Engine

    ef = read_engine(path, limits, verify_key)
    m = ef.manifest
    report = m.get("report", {})
    if m["target"] == "cpu":
        from graphc.runtime.cpu import CPUExecutor, check_attrs_schema, reference_kernel

        check_attrs_schema(m.get("attrs_schema"), path)
        executor = CPUExecutor(ef.plan, ef.memory, ef.weights, checked_kernels(ef.plan, reference_kernel, Path(path)))
        return Engine("cpu", ef.plan, ef.memory, ef.weights, executor, report, m["build"])
    from graphc.runtime.cuda import CUDAExecutor, choose_launches, device_arch

    device_kind = device_arch(device)
    _check_device_memory(ef, device, Path(path))
    names = {d: k["name"] for d, k in m["kernels"].items()}
    # The launches of this GPU's arch, else of the newest older arch of its major version with cubins
    # (a plan per arch, one memory plan); with none, its own or the default launches, JIT-compiled.
    arch, plan = choose_launches(ef.plan, ef.cubins, device_kind)
    cubins = ef.cubins.get(arch)
    if cubins is None or not _digests(plan) <= set(cubins):
        from graphc.runtime.jit import jit_kernels

        arch, plan = device_kind, ef.plan.for_arch(device_kind)
        digests = _digests(plan)
        needs = {d: k.get("requires_arch") for d, k in m["kernels"].items()}
        sources = {d: ef.sources[d] for d in sorted(digests)}
        cubins = jit_kernels(sources, names, needs, arch, sorted(ef.cubins), Path(path))
    executor = CUDAExecutor(plan, ef.memory, ef.weights, cubins, names, device=device, launch_arch=arch)
    engine = Engine("cuda", ef.plan, ef.memory, ef.weights, executor, report, m["build"])
    return engine


def checked_kernels(plan: KernelPlan, factory: Any, path: Path) -> Any:
    """Wrap a CPU kernel factory so that a step whose results are not the dtype and shape its
    plan declares is refused (the CPU executor would otherwise cast or broadcast them into the
    declared views), and a step the kernel table cannot build is an EngineError."""

    def make(step: Any) -> Any:
        try:
            fn = factory(step)
        except EngineError:
            raise
        except Exception as e:  # the kernel table refusing a step's op or attrs
            msg = str(e).splitlines()[0] if str(e) else type(e).__name__
            where = f"{path}: step {step.index} ('{step.name}')"
            raise EngineError(f"{where}: cannot build its {step.op} kernel: {msg}") from None
        specs = [plan.tensors[n] for n in step.outputs]

        def run(inputs: list[Any]) -> list[Any]:
            try:
                outs = list(fn(inputs))
            except Exception as e:
                # the reference refusing its operands (an omitted required input, mismatched
                # shapes): an edited plan gets here, a built one ran when it was compiled
                msg = str(e).splitlines()[0] if str(e) else type(e).__name__
                raise EngineError(f"{path}: step '{step.name}' ({step.op}) failed: {msg}") from None
            if len(outs) < len(specs):
                raise EngineError(f"{path}: step '{step.name}' gave {len(outs)} results, the plan has {len(specs)}")
            for spec, val in zip(specs, outs, strict=False):
                a = np.asarray(val)
                if str(a.dtype) != spec.dtype or list(a.shape) != list(spec.shape):
                    raise EngineError(
                        f"{path}: step '{step.name}' computes {a.dtype}{list(a.shape)} for '{spec.name}', "
                        f"the plan says {spec.dtype}{spec.shape} (the engine was edited)"
                    )
            return outs

        return run

    # an If step's branch sub-plans (runtime/cpu.py host_if_kernel) are checked against their own plans
    make.for_plan = lambda sub_plan: checked_kernels(sub_plan, factory, path)  # type: ignore[attr-defined]
    return make


def _check_device_memory(ef: EngineFile, device: int, path: Path) -> None:
    """Refuse an engine whose arena, workspace and weights cannot fit the GPU before allocating."""
    from graphc.runtime.cuda import import_cupy

    cupy = import_cupy()
    need = ef.memory.arena_bytes + ef.memory.workspace_bytes + sum(int(w.nbytes) for w in ef.weights.values())
    with cupy.cuda.Device(device):
        _free, total = cupy.cuda.runtime.memGetInfo()
    if need > total:
        raise EngineError(f"{path}: the engine needs {need} bytes of GPU memory, device {device} has {total}")


def _digests(plan: KernelPlan) -> set[str]:
    return {ln.digest for s in plan.steps for ln in s.launches}


def engine_bytes_summary(path: str | Path) -> dict[str, int]:
    with zipfile.ZipFile(path) as z:
        return {i.filename: i.file_size for i in z.infolist()}


__all__ = ["FORMAT_VERSION", "EngineFile", "Limits", "load", "read_engine", "save_engine"]
