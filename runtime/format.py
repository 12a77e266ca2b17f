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
from graphc.runtime.pdl import pdl_ready, waits_first
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
# 3: optimization profiles (`profiles`: shape buckets, each a plan; docs/dynamic_shapes.md).
# An engine without profiles is still written as version 2, so a graphc that reads only version 2
# loads it; this one reads both.
FORMAT_VERSION = 3
STATIC_FORMAT_VERSION = 2
READ_VERSIONS = (2, 3)
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
    pdl_on = bool((engine.build_info or {}).get("pdl", True))  # CompileOptions.pdl (graphc compile --no-pdl)
    dynamic = getattr(engine, "dynamic", None)
    profiles_json = None
    if dynamic is not None:
        profiles_json = _profiles_json(dynamic.profiles, members)
    manifest = {
        "format": "graphc-engine",
        "format_version": FORMAT_VERSION if dynamic is not None else STATIC_FORMAT_VERSION,
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
                # launched programmatically on sm_90+ (runtime/pdl.py); written only where true, so
                # an engine built with --no-pdl stays readable by a graphc from before the field
                **({"pdl": True} if pdl_on and pdl_ready(kernels.sources[d], kernels.names[d]) else {}),
            }
            for d in (kernels.sources if kernels else {})
        },
        "archs": sorted(kernels.cubins) if kernels else [],
        "tuning": engine.report.get("tuning", {}),
        "report": engine.report,
        "members": {name: _sha256(data) for name, data in members.items()},
    }
    if profiles_json is not None:
        manifest["profiles"] = profiles_json
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    manifest_bytes = json.dumps(manifest, indent=1, default=_json_default).encode()
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.comment = make_comment(_sha256(manifest_bytes))
        z.writestr(MANIFEST, manifest_bytes)
        for name, data in members.items():
            z.writestr(name, data, compress_type=zipfile.ZIP_STORED if name == WEIGHTS else zipfile.ZIP_DEFLATED)
    tmp.replace(path)


def _profiles_json(profiles: list[Any], members: dict[str, bytes]) -> list[dict[str, Any]]:
    """The profiles for the manifest; each bucket's own weights become a member of their own."""
    from graphc.runtime.profiles import profiles_to_json

    count = iter(range(1 << 30))

    def plan_json(b: Any) -> dict[str, Any]:
        if b.main:
            return {}
        out: dict[str, Any] = {"plan": b.plan.to_json(), "memory": memory_plan_to_json(b.memory)}
        if b.own_weights:
            member = f"profiles/{next(count)}.safetensors"
            members[member] = _weights_bytes(b.own_weights)
            out["weights"] = sorted(b.own_weights)
            out["member"] = member
        return out

    return profiles_to_json(profiles, plan_json)


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
        profiles: list[Any] | None = None,
    ):
        self.manifest, self.plan, self.memory = manifest, plan, memory
        self.weights, self.sources, self.cubins = weights, sources, cubins
        self.manifest_digest, self.signature = manifest_digest, signature
        self.profiles = profiles  # runtime/profiles.py Profile objects; None: a fixed-shape engine


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
    _check_pdl_records(doc, sources, path)
    weights = _load_weights(raw[WEIGHTS], plan, path)
    profiles = None
    if doc.profiles is not None:
        profiles = _read_profiles(doc, plan, raw, limits, path, sources, cubin_members)
    return EngineFile(obj, plan, memory, weights, sources, cubins, manifest_digest, signature, profiles)


def _check_pdl_records(doc: ManifestDoc, sources: dict[str, str], path: Path) -> None:
    """A kernel recorded as PDL-ready must wait for the grids before it first thing: launched
    programmatically without that wait, it would race with the kernel before it."""
    for digest, k in doc.kernels.items():
        if k.pdl and not waits_first(sources.get(digest, ""), k.name):
            raise EngineError(
                f"{path}: kernel {k.name} is recorded as PDL-ready but its source does not start with "
                "GC_PDL_ENTRY() (edited engine)"
            )


def pdl_kernels(manifest: dict[str, Any]) -> set[str]:
    """The digests of the kernels a (validated) manifest records as PDL-ready."""
    return {d for d, k in manifest["kernels"].items() if k.get("pdl")}


class _WeightsOf:
    """The part of a plan whose weights one safetensors member holds (for _load_weights)."""

    def __init__(self, plan: KernelPlan, names: list[str]):
        self.tensors = {n: plan.tensors[n] for n in names}


def _read_profiles(doc: ManifestDoc, plan: KernelPlan, raw: dict[str, bytes], limits, path: Path, sources, cubins):
    """The profiles, every bucket's plan validated as a plan (and its kernels), its own weights loaded."""
    from graphc.runtime.profiles import Bucket, DimGroup, Profile, bucket_shapes
    from graphc.runtime.validate import validate_profiles

    plans = validate_profiles(doc, plan, limits, path)
    used_members = set()
    profiles = []
    assert doc.profiles is not None
    for pdoc, pplans in zip(doc.profiles, plans, strict=True):
        dims = [
            DimGroup(
                g.name,
                [(n, int(a)) for n, a in g.positions],
                g.min,
                g.opt,
                g.max,
                g.padded,
                g.reason,
                {k: (int(a), int(mu)) for k, (a, mu) in g.outputs.items()},
            )
            for g in pdoc.dims
        ]
        opt = {k: list(v) for k, v in pdoc.opt.items()}
        buckets = []
        for bdoc, pm in zip(pdoc.buckets, pplans, strict=True):
            b = Bucket(dict(bdoc.sizes), bucket_shapes(opt, dims, bdoc.sizes))
            if pm is not None:
                b.plan, b.memory = pm
                validate_kernels(doc, b.plan, sources, cubins, path)
                if bdoc.member is not None:
                    if bdoc.member not in raw or bdoc.member == WEIGHTS or bdoc.member in used_members:
                        raise EngineError(f"{path}: bucket weights member {bdoc.member} is missing or shared")
                    used_members.add(bdoc.member)
                    b.member = bdoc.member
                    b.own_weights = _load_weights(raw[bdoc.member], _WeightsOf(b.plan, list(bdoc.weights)), path)
            buckets.append(b)
        profiles.append(
            Profile(
                {k: list(v) for k, v in pdoc.min.items()}, opt, {k: list(v) for k, v in pdoc.max.items()}, dims, buckets
            )
        )
    stray = sorted(n for n in raw if n.startswith("profiles/") and n not in used_members)
    if stray:
        raise EngineError(f"{path}: member {stray[0]} is no bucket's weights")
    return profiles


def parse_json_at(raw: bytes, path: Path) -> Any:
    try:
        return parse_json(raw)
    except EngineError as e:
        raise EngineError(f"{path}: {e}") from None


def _decode(obj: Any, path: Path) -> ManifestDoc:
    try:
        return decode_manifest(obj, READ_VERSIONS)
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


def load(
    path: str | Path,
    device: int = 0,
    *,
    verify_key: str | Path | None = None,
    limits: Limits | None = None,
    pdl: bool | None = None,
    output_ring: int | None = None,
):
    """Load an engine file: validated first, then weights uploaded and kernels loaded.
    `verify_key`: a PEM ed25519 public key the engine's signature must verify against.
    `pdl`: launch the PDL-ready kernels programmatically on sm_90+ (None: GRAPHC_PDL if set, else
    runtime/cuda.py DEFAULT_PDL; docs/launches.md).
    `output_ring`: output slots per CUDA context that engine.run's kernels write in place
    (runtime/output_ring.py; None: 2; 0: outputs copied out of the arena into new arrays)."""
    from graphc.runtime.engine import Engine

    ef = read_engine(path, limits, verify_key)
    m = ef.manifest
    report = m.get("report", {})
    if m["target"] == "cpu":
        from graphc.runtime.cpu import check_attrs_schema

        check_attrs_schema(m.get("attrs_schema"), path)
    else:
        from graphc.runtime.cuda import device_arch

        device_arch(device)  # no GPU (or no cupy) is said first, as before the memory check
        _check_device_memory(ef, device, Path(path))
    engine = Engine(m["target"], ef.plan, ef.memory, ef.weights, None, report, m["build"])
    ring = {"output_ring": output_ring} if output_ring is not None else {}
    engine.executor = _executor(ef, ef.plan, ef.memory, ef.weights, device, Path(path), pdl=pdl, **ring)
    if ef.profiles is not None:
        from graphc.runtime.profiles import DynamicShapes

        def make_engine(bucket: Any) -> Engine:
            # a bucket's weights: its own, else the engine plan's of the same name (validated so)
            weights = {
                n: bucket.own_weights.get(n, ef.weights.get(n))
                for n, t in bucket.plan.tensors.items()
                if t.kind == WEIGHT
            }
            shared = None
            if m["target"] == "cuda":
                shared = _bucket_device_weights(engine.executor.weights, bucket, device)
            ex = _executor(ef, bucket.plan, bucket.memory, weights, device, Path(path), shared, pdl=pdl, **ring)
            return Engine(m["target"], bucket.plan, bucket.memory, weights, ex, report, m["build"])

        engine.dynamic = DynamicShapes(ef.profiles, make_engine)
    return engine


def _bucket_device_weights(main: Any, bucket: Any, device: int) -> Any:
    """A bucket's weights on the GPU: the engine's uploaded arrays for every weight it shares
    with the engine's plan (same name, dtype and shape, validated), and one upload of its own."""
    from graphc.runtime.cuda import DeviceWeights

    own = DeviceWeights(_WeightsOf(bucket.plan, sorted(bucket.own_weights)), bucket.own_weights, device)
    shared = {n: main.arrays[n] for n, t in bucket.plan.tensors.items() if t.kind == WEIGHT and n not in own.arrays}
    own.arrays = {**shared, **own.arrays}
    own.shared_from = main  # keeps the engine's weight buffer alive as long as this bucket
    return own


def _executor(
    ef: EngineFile,
    plan: KernelPlan,
    memory: MemoryPlan,
    weights: dict[str, Any],
    device: int,
    path: Path,
    device_weights: Any = None,
    pdl: bool | None = None,
    output_ring: int | None = None,
):
    """The executor of one (validated) plan of the engine: the CPU reference kernels, or this GPU's
    cubins (JIT-compiled from the sources where the engine has none for its arch)."""
    m = ef.manifest
    if m["target"] == "cpu":
        from graphc.runtime.cpu import CPUExecutor, reference_kernel

        return CPUExecutor(plan, memory, weights, checked_kernels(plan, reference_kernel, path))
    from graphc.runtime.cuda import CUDAExecutor, choose_launches, device_arch

    device_kind = device_arch(device)
    names = {d: k["name"] for d, k in m["kernels"].items()}
    # The launches of this GPU's arch, else of the newest older arch of its major version with cubins
    # (a plan per arch, one memory plan); with none, its own or the default launches, JIT-compiled.
    arch, arch_plan = choose_launches(plan, ef.cubins, device_kind)
    cubins = ef.cubins.get(arch, None if _digests(arch_plan, arch) else {})  # {}: vendor calls alone
    if cubins is None or not _digests(arch_plan, arch) <= set(cubins):
        from graphc.runtime.jit import jit_kernels

        arch, arch_plan = device_kind, plan.for_arch(device_kind)
        digests = _digests(arch_plan, arch)
        needs = {d: k.get("requires_arch") for d, k in m["kernels"].items()}
        sources = {d: ef.sources[d] for d in sorted(digests)}
        cubins = jit_kernels(sources, names, needs, arch, sorted(ef.cubins), path)
    return CUDAExecutor(
        arch_plan,
        memory,
        weights,
        cubins,
        names,
        device=device,
        launch_arch=arch,
        device_weights=device_weights,
        # an engine from before cluster kernels were kept plain records them too: runtime/pdl.py
        pdl_ready={d for d in pdl_kernels(m) if pdl_ready(ef.sources.get(d, ""), names.get(d, ""))},
        pdl=pdl,
        output_ring=output_ring,
    )


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


def _digests(plan: KernelPlan, arch: str | None = None) -> set[str]:
    from graphc.runtime.host_if_cuda import sub_plan_digests

    # a data-dependent If's branch sub-plans launch kernels of their own
    return {ln.digest for s in plan.steps for ln in s.launches} | sub_plan_digests(plan, arch)


def engine_bytes_summary(path: str | Path) -> dict[str, int]:
    with zipfile.ZipFile(path) as z:
        return {i.filename: i.file_size for i in z.infolist()}


__all__ = ["FORMAT_VERSION", "EngineFile", "Limits", "load", "read_engine", "save_engine"]
