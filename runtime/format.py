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
from graphc.runtime.errors import EngineError
from graphc.runtime.plan import (
    ALIAS,
    ALIGNMENT,
    ARENA,
    INPUT,
    WEIGHT,
    KernelPlan,
    MemoryPlan,
    memory_plan_from_json,
    memory_plan_to_json,
)
from graphc.runtime.tensormap import is_tmap_arg, validate_launch

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
_ARCH = re.compile(r"sm_[0-9]{2,3}")  # a key of Step.arch_launches
MANIFEST = "manifest.json"
WEIGHTS = "weights.safetensors"
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
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr(MANIFEST, json.dumps(manifest, indent=1, default=_json_default))
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
    ):
        self.manifest, self.plan, self.memory = manifest, plan, memory
        self.weights, self.sources, self.cubins = weights, sources, cubins


def read_engine(path: str | Path) -> EngineFile:
    path = Path(path)
    if not path.exists():
        raise EngineError(f"{path}: no such engine file")
    try:
        z = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as e:
        raise EngineError(f"{path}: not a graphc engine (not a valid zip: {e}); truncated or corrupt?") from None
    with z:
        try:
            names = set(z.namelist())
            if MANIFEST not in names:
                raise EngineError(f"{path}: no {MANIFEST}: not a graphc engine")
            raw = {n: z.read(n) for n in names}
        except (zipfile.BadZipFile, OSError, EOFError, zlib_error()) as e:
            raise EngineError(f"{path}: corrupt engine file: {e}") from None
    try:
        manifest = json.loads(raw[MANIFEST])
    except (ValueError, UnicodeDecodeError) as e:
        raise EngineError(f"{path}: manifest.json is not valid JSON: {e}") from None
    _check_manifest(manifest, path)
    members = manifest["members"]
    for name, digest in members.items():
        if name not in raw:
            raise EngineError(f"{path}: member {name} listed in the manifest is missing")
        if _sha256(raw[name]) != digest:
            raise EngineError(f"{path}: member {name} does not match its SHA-256 (corrupt or edited)")
    extra = sorted(names - set(members) - {MANIFEST})
    if extra:
        raise EngineError(f"{path}: unexpected members {extra[:5]}")
    try:
        plan = KernelPlan.from_json(manifest["plan"])
        memory = memory_plan_from_json(manifest["memory"])
    except (KeyError, TypeError, ValueError) as e:
        raise EngineError(f"{path}: malformed kernel or memory plan: {e!r}") from None
    weights = _load_weights(raw[WEIGHTS], plan, path)
    sources = {
        n[len("kernels/") : -3]: raw[n].decode() for n in members if n.startswith("kernels/") and n.endswith(".cu")
    }
    cubins: dict[str, dict[str, bytes]] = {}
    for n in members:
        if n.endswith(".cubin"):
            _, arch, fname = n.split("/")
            cubins.setdefault(arch, {})[fname[:-6]] = raw[n]
    _check_plan(plan, memory, manifest, sources, path)
    return EngineFile(manifest, plan, memory, weights, sources, cubins)


def zlib_error():
    import zlib

    return zlib.error


def _check_manifest(m: Any, path: Path) -> None:
    if not isinstance(m, dict) or m.get("format") != "graphc-engine":
        raise EngineError(f"{path}: not a graphc engine manifest")
    v = m.get("format_version")
    if v != FORMAT_VERSION:
        raise EngineError(
            f"{path}: engine format version {v!r}, this graphc reads version {FORMAT_VERSION}: rebuild the engine "
            "with `graphc compile`"
        )
    for key, typ in (
        ("target", str),
        ("plan", dict),
        ("memory", dict),
        ("members", dict),
        ("inputs", list),
        ("outputs", list),
        ("kernels", dict),
        ("build", dict),
    ):
        if not isinstance(m.get(key), typ):
            raise EngineError(f"{path}: manifest field '{key}' is missing or not a {typ.__name__}")
    if m["target"] not in ("cpu", "cuda"):
        raise EngineError(f"{path}: unknown target {m['target']!r}")


def _load_weights(data: bytes, plan: KernelPlan, path: Path) -> dict[str, np.ndarray]:
    from safetensors import SafetensorError
    from safetensors.numpy import load

    try:
        stored = load(data)
    except (SafetensorError, ValueError, OSError) as e:
        raise EngineError(f"{path}: weights.safetensors is corrupt: {e}") from None
    out = {}
    for name, t in plan.tensors.items():
        if t.kind != WEIGHT:
            continue
        if name not in stored:
            raise EngineError(f"{path}: weight '{name}' is missing from weights.safetensors")
        a = stored[name]
        dt = _numpy_dtype(t.dtype)
        if a.dtype != dt:
            a = a.reshape(-1).view(dt)
        if a.size * a.dtype.itemsize != t.nbytes or int(np.prod(t.shape, dtype=np.int64)) != a.size:
            raise EngineError(f"{path}: weight '{name}' has {a.nbytes} bytes; the plan says {t.dtype}{t.shape}")
        out[name] = a.reshape(t.shape)
    return out


def _check_plan(plan: KernelPlan, memory: MemoryPlan, manifest: dict, sources: dict[str, str], path: Path) -> None:
    def bad(msg: str) -> EngineError:
        return EngineError(f"{path}: {msg}")

    tensors = plan.tensors
    for name, t in tensors.items():
        if t.kind not in (INPUT, ARENA, WEIGHT, ALIAS):
            raise bad(f"tensor '{name}' has unknown kind {t.kind!r}")
        try:
            dt = _numpy_dtype(t.dtype)
        except (TypeError, AttributeError):
            raise bad(f"tensor '{name}' has unknown dtype {t.dtype!r}") from None
        if any((not isinstance(d, int)) or d < 0 for d in t.shape):
            raise bad(f"tensor '{name}' has a bad shape {t.shape}")
        if int(np.prod(t.shape, dtype=np.int64)) * dt.itemsize != t.nbytes:
            raise bad(f"tensor '{name}': {t.nbytes} bytes do not match {t.dtype}{t.shape}")
        if t.kind in (INPUT, ARENA):
            p = memory.placements.get(name)
            if p is None:
                raise bad(f"tensor '{name}' has no place in the arena")
            if p.offset < 0 or p.offset % ALIGNMENT or p.offset + t.nbytes > memory.arena_bytes or p.nbytes != t.nbytes:
                raise bad(
                    f"tensor '{name}' at offset {p.offset} (+{t.nbytes} bytes) is outside the arena of "
                    f"{memory.arena_bytes} bytes or misaligned"
                )
        if t.kind == ALIAS:
            root = memory.aliases.get(name)
            if root is None or root not in tensors or tensors[root].kind == ALIAS:
                raise bad(f"alias '{name}' points to nothing valid ({root!r})")
            if tensors[root].nbytes < t.nbytes:
                raise bad(f"alias '{name}' is larger than its source '{root}'")
    for name in (*plan.inputs, *plan.outputs):
        if name not in tensors:
            raise bad(f"I/O tensor '{name}' is not in the plan")
    if len(plan.outputs) != len(plan.output_names):
        raise bad("output names and outputs differ in length")
    kernels = manifest["kernels"]
    for step in plan.steps:
        for n in (*step.inputs, *step.outputs):
            if n is not None and n not in tensors:
                raise bad(f"step '{step.name}' uses unknown tensor '{n}'")
        for arch, own in step.arch_launches.items():  # an arch's launches of its own: checked as the default ones
            if not isinstance(arch, str) or not _ARCH.fullmatch(arch):
                raise bad(f"step '{step.name}' has launches for {arch!r}, not a GPU arch")
            if not own:
                raise bad(f"step '{step.name}' has no kernel on {arch}")
        for ln in (*step.launches, *(x for own in step.arch_launches.values() for x in own)):
            if ln.digest not in sources or ln.digest not in kernels:
                raise bad(f"step '{step.name}' launches kernel {ln.digest[:12]} that the engine does not hold")
            expected = kernels[ln.digest]["args"]
            if len(ln.args) != expected or _count_params(sources[ln.digest], ln.kernel) != expected:
                raise bad(
                    f"step '{step.name}': kernel {ln.kernel} takes {expected} arguments, the launch passes "
                    f"{len(ln.args)}"
                )
            for a in ln.args:
                if a != "@workspace" and not is_tmap_arg(a) and a not in tensors:
                    raise bad(f"step '{step.name}': kernel argument '{a}' is not a tensor of the plan")
            try:  # "@tmap:I" arguments: typed tensor-map specs over tensors of the plan
                validate_launch(ln.params, ln.args, tensors, f"step '{step.name}'")
            except EngineError as e:
                raise bad(str(e)) from None
            if len(ln.grid) != 3 or len(ln.block) != 3 or any(int(x) < 1 for x in (*ln.grid, *ln.block)):
                raise bad(f"step '{step.name}': bad launch geometry {ln.grid} x {ln.block}")
            if ln.block[0] * ln.block[1] * ln.block[2] > 1024 or ln.shared_bytes < 0 or ln.shared_bytes > 232448:
                raise bad(f"step '{step.name}': launch exceeds device limits")
    if manifest["target"] == "cuda" and any(not s.alias and not s.launches for s in plan.steps):
        raise bad("a step of a cuda engine has no kernel")


def load(path: str | Path, device: int = 0):
    """Load an engine file: validated first, then weights uploaded and kernels loaded."""
    from graphc.runtime.engine import Engine

    ef = read_engine(path)
    m = ef.manifest
    report = m.get("report", {})
    if m["target"] == "cpu":
        from graphc.runtime.cpu import CPUExecutor, check_attrs_schema, reference_kernel

        check_attrs_schema(m.get("attrs_schema"), path)
        executor = CPUExecutor(ef.plan, ef.memory, ef.weights, reference_kernel)
        return Engine("cpu", ef.plan, ef.memory, ef.weights, executor, report, m["build"])
    from graphc.runtime.cuda import CUDAExecutor, choose_launches, device_arch

    device_kind = device_arch(device)
    names = {d: k["name"] for d, k in m["kernels"].items()}
    # The launches of this GPU's arch, else of the newest older arch of its major version with cubins
    # (a plan per arch, one memory plan); with none, its own or the default launches, JIT-compiled.
    arch, plan = choose_launches(ef.plan, ef.cubins, device_kind)
    cubins = ef.cubins.get(arch)
    if cubins is None or not _digests(plan) <= set(cubins):
        arch, plan = device_kind, ef.plan.for_arch(device_kind)
        cubins = _jit(ef, arch, names, path, sorted(_digests(plan)))
    executor = CUDAExecutor(plan, ef.memory, ef.weights, cubins, names, device=device, launch_arch=arch)
    engine = Engine("cuda", ef.plan, ef.memory, ef.weights, executor, report, m["build"])
    return engine


def _digests(plan: KernelPlan) -> set[str]:
    return {ln.digest for s in plan.steps for ln in s.launches}


def _jit(ef: EngineFile, arch: str, names: dict[str, str], path: Path, digests: list[str]) -> dict[str, bytes]:
    """Cubins for `arch` of the kernels `digests` (those its launches use) from the kept source."""
    built = sorted(ef.cubins)
    try:
        from graphc.codegen.nvrtc import CompileJob, compile_all
    except ImportError:
        raise EngineError(
            f"{path} has no cubin for this GPU ({arch}; it has {built}) and NVRTC is not available to compile "
            f"the kept source: rebuild with `graphc compile MODEL.onnx -o {path} --arch {arch}`"
        ) from None
    log.warning(
        "%s has no cubin for %s (it has %s): compiling the kept CUDA source with the local NVRTC", path, arch, built
    )
    needs = {d: k.get("requires_arch") for d, k in ef.manifest["kernels"].items()}
    for d in digests:
        if needs.get(d) and needs[d].rstrip("a") != arch:
            raise EngineError(
                f"{path}: kernel {names[d]} needs {needs[d]}, this GPU is {arch}: rebuild with "
                f"`graphc compile MODEL.onnx -o {path} --arch {arch}`"
            )
    try:
        out = compile_all([CompileJob(names[d], ef.sources[d], needs.get(d) or arch) for d in digests])
    except Exception as e:
        raise EngineError(
            f"{path}: compiling the kept source for {arch} failed ({e}); rebuild with "
            f"`graphc compile MODEL.onnx -o {path} --arch {arch}`"
        ) from None
    return dict(zip(digests, out, strict=True))


def engine_bytes_summary(path: str | Path) -> dict[str, int]:
    with zipfile.ZipFile(path) as z:
        return {i.filename: i.file_size for i in z.infolist()}


__all__ = ["FORMAT_VERSION", "EngineFile", "load", "read_engine", "save_engine"]
