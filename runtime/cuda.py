"""The CUDA executor: one arena, weights uploaded once, cubins loaded with cupy, and the whole
launch sequence captured into a CUDA graph on the first run and replayed afterwards."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from graphc.runtime.errors import EngineError
from graphc.runtime.plan import ALIAS, ARENA, INPUT, WEIGHT, KernelPlan, MemoryPlan, alias_byte_offset
from graphc.runtime.tensormap import TensorMapTable, is_tmap_arg, tmap_index, validate_launch

log = logging.getLogger(__name__)


def import_cupy():
    try:
        import cupy
    except ImportError as e:
        # graphc is not on the package index: name the packages, and the extra of a clone
        raise EngineError(
            "running a cuda engine needs cupy: pip install cupy-cuda13x (cupy-cuda12x for a CUDA 12 driver), "
            "or in a clone of graphc: pip install -e '.[cuda]'"
        ) from e
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # no driver
        raise EngineError(f"no usable CUDA device here: {e}") from None
    if n == 0:
        raise EngineError("no CUDA device here")
    return cupy


def device_arch(device: int = 0) -> str:
    cupy = import_cupy()
    return "sm_" + cupy.cuda.Device(device).compute_capability


def _arch_number(arch: str) -> tuple[int, int]:
    digits = arch[3:].rstrip("a")  # "sm_86" -> (8, 6); "sm_90a" -> (9, 0)
    return int(digits[:-1]), int(digits[-1])


def cubin_arch_for(device: str, built: Iterable[str]) -> str | None:
    """The arch whose cubins a GPU of arch `device` runs: its own, else the newest older one of the
    same major version (a cubin runs on its own arch and on later minor versions of the same major
    one, never across majors: sm_80 cubins run on an sm_86 and sm_89, not on an sm_90), else None
    (the engine's kept source is compiled for `device`)."""
    built = set(built)
    if device in built:
        return device
    major, minor = _arch_number(device)
    older = [a for a in built if not a.endswith("a") and _arch_number(a)[0] == major and _arch_number(a)[1] < minor]
    return max(older, key=_arch_number) if older else None


def choose_launches(plan: KernelPlan, built: Iterable[str], device: str) -> tuple[str, KernelPlan]:
    """(the arch whose launches and cubins a GPU of arch `device` takes, the plan as it runs there).
    With no cubin it can run, `device` itself: its own launches if the plan has them, else the
    default ones, compiled from source by the caller."""
    arch = cubin_arch_for(device, built) or device
    chosen = plan.for_arch(arch)
    if arch != device:
        log.info("GPU %s runs the engine's %s cubins and launches", device, arch)
    return arch, chosen


def allow_large_shared_memory(fn: Any, nbytes: int) -> None:
    """Raise a kernel's dynamic shared memory limit above the default 48 KB (cupy 14's Function has
    no setter for it; the driver call is the portable way)."""
    from cupy.cuda import driver

    attr = getattr(driver, "CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES", 8)
    try:
        driver.funcSetAttribute(fn.ptr, attr, int(nbytes))
    except Exception as e:
        raise EngineError(f"kernel {getattr(fn, 'name', '?')} needs {nbytes} bytes of shared memory: {e}") from None


def _sm_count(cupy: Any, device: int) -> int:
    return int(cupy.cuda.runtime.getDeviceProperties(device)["multiProcessorCount"])


def _numpy_dtype(name: str):
    try:
        return np.dtype(name)
    except TypeError:
        import ml_dtypes

        return np.dtype(getattr(ml_dtypes, name))


class DeviceWeights:
    """Weights on one device, uploaded once and shared by every execution context."""

    def __init__(self, plan: KernelPlan, weights: Mapping[str, np.ndarray], device: int):
        cupy = import_cupy()
        self.arrays: dict[str, Any] = {}
        with cupy.cuda.Device(device):
            total = sum(int(np.asarray(weights[n]).nbytes) for n, t in plan.tensors.items() if t.kind == WEIGHT)
            # One allocation for all weights, 256-byte aligned slots.
            offsets, off = {}, 0
            for n, t in plan.tensors.items():
                if t.kind == WEIGHT:
                    offsets[n] = off
                    off += (int(t.nbytes) + 255) // 256 * 256
            self.buffer = cupy.empty(max(off, 1), dtype=cupy.uint8)
            for n, o in offsets.items():
                w = np.ascontiguousarray(weights[n])
                t = plan.tensors[n]
                view = cupy.ndarray(tuple(t.shape), dtype=_numpy_dtype(t.dtype), memptr=self.buffer.data + o)
                view.set(w.reshape(tuple(t.shape)))
                self.arrays[n] = view
            del total


class CUDAContext:
    """An execution context: its own arena, workspace, stream and CUDA graph; weights shared."""

    def __init__(
        self, plan: KernelPlan, memory: MemoryPlan, weights: DeviceWeights, functions: dict[str, Any], device: int
    ):
        cupy = import_cupy()
        self.cupy = cupy
        self.plan = plan
        self.device = device
        with cupy.cuda.Device(device):
            # A blocking stream: it orders itself after work the caller queued on the legacy default
            # stream (inputs produced there by cupy or torch), so input copies never race it.
            self.stream = cupy.cuda.Stream(non_blocking=False)
            self.arena = cupy.empty(max(memory.arena_bytes, 1), dtype=cupy.uint8)
            self.workspace = cupy.empty(max(memory.workspace_bytes, 1), dtype=cupy.uint8)
            views: dict[str, Any] = dict(weights.arrays)
            for name, t in plan.tensors.items():
                if t.kind in (ARENA, INPUT):
                    off = memory.placements[name].offset
                    views[name] = cupy.ndarray(
                        tuple(t.shape), dtype=_numpy_dtype(t.dtype), memptr=self.arena.data + off
                    )
            for name, t in plan.tensors.items():
                if t.kind == ALIAS:
                    root = memory.aliases[name]
                    src = views[root]
                    skip = alias_byte_offset(plan.tensors, name)  # a slab view starts inside its root
                    views[name] = cupy.ndarray(tuple(t.shape), dtype=_numpy_dtype(t.dtype), memptr=src.data + skip)
            self.views = views
            self.tensormaps = self._tensor_maps(plan, views)
            self.launches = []
            sms = (
                _sm_count(cupy, device)
                if any(ln.params.get("persistent") for s in plan.steps for ln in s.launches)
                else 0
            )
            first = 0  # index of the launch's first tensor map in the context's table
            for step in plan.steps:
                for ln in step.launches:
                    fn = functions[ln.digest]
                    args = tuple(self._arg(a, views, first, step.name) for a in ln.args)
                    first += len(ln.params.get("tmaps", []))
                    grid = tuple(ln.grid)
                    if ln.params.get("persistent"):  # a CTA per SM at most: the kernel strides by gridDim
                        grid = (min(grid[0], sms), *grid[1:])
                    self.launches.append((fn, grid, tuple(ln.block), args, ln.shared_bytes, step.name))
        self.graph = None
        self.lock = threading.Lock()

    def _tensor_maps(self, plan: KernelPlan, views: dict[str, Any]) -> TensorMapTable | None:
        """Every launch's tensor maps, encoded for this context's addresses (arena and weights) in
        one device buffer that lives as long as the context, so a captured graph stays valid."""
        entries = []
        for step in plan.steps:
            for ln in step.launches:
                specs = validate_launch(ln.params, ln.args, plan.tensors, f"step '{step.name}'")
                entries += [(s, int(views[s.tensor].data.ptr)) for s in specs]
        return TensorMapTable(self.cupy, entries) if entries else None

    def _arg(self, a: str, views: dict[str, Any], first: int, step: str) -> Any:
        if a == "@workspace":
            return self.workspace
        if is_tmap_arg(a):
            assert self.tensormaps is not None  # validate_launch saw the spec
            return self.tensormaps.arg(first + tmap_index(a, f"step '{step}'"))
        return views[a]

    def launch_all(self) -> None:
        for fn, grid, block, args, smem, _name in self.launches:
            fn(grid, block, args, shared_mem=smem, stream=self.stream)

    def run(
        self, feeds: Mapping[str, Any], *, use_graph: bool = True, to_numpy: bool = False, sync: bool = True
    ) -> dict[str, Any]:
        cupy = self.cupy
        with self.lock, cupy.cuda.Device(self.device), self.stream:
            for name in self.plan.inputs:
                x = feeds[name]
                view = self.views[name]
                if isinstance(x, np.ndarray):
                    view.set(np.ascontiguousarray(x), stream=self.stream)
                else:
                    view[...] = cupy.asarray(x) if hasattr(x, "__cuda_array_interface__") else cupy.from_dlpack(x)
            if use_graph:
                if self.graph is None:
                    self.stream.begin_capture()
                    try:
                        self.launch_all()
                    finally:
                        self.graph = self.stream.end_capture()
                self.graph.launch(stream=self.stream)
            else:
                self.launch_all()
            outs = {
                public: self.views[name].copy()
                for public, name in zip(self.plan.output_names, self.plan.outputs, strict=True)
            }
            if to_numpy:
                return {k: cupy.asnumpy(v, stream=self.stream) for k, v in outs.items()}
            if sync:
                self.stream.synchronize()
            return outs


class CUDAExecutor:
    """Loads the kernels for this GPU and runs through a default context."""

    def __init__(
        self,
        plan: KernelPlan,
        memory: MemoryPlan,
        weights: Mapping[str, np.ndarray],
        cubins: Mapping[str, bytes],
        names: Mapping[str, str],
        device: int = 0,
        launch_arch: str | None = None,
    ):
        cupy = import_cupy()
        # `plan` is already one arch's (KernelPlan.for_arch); launch_arch says whose, for tests and reports
        self.plan, self.memory, self.device, self.launch_arch = plan, memory, device, launch_arch
        if plan.launch_archs():  # a plan of several archs would run its default launches here, whatever the GPU
            raise EngineError("the CUDA executor takes one arch's plan (KernelPlan.for_arch), not a plan of several")
        used = {ln.digest for s in plan.steps for ln in s.launches}
        missing = sorted(used - set(cubins))
        if missing:
            raise EngineError(f"no cubin for kernel(s) {', '.join(names.get(d, d) for d in missing[:5])} of the plan")
        with cupy.cuda.Device(device):
            self.functions: dict[str, Any] = {}
            self.modules = []
            for digest, cubin in cubins.items():
                if digest not in used:  # another arch's kernel, or one the plan does not launch here
                    continue
                mod = cupy.cuda.function.Module()
                mod.load(cubin)
                self.modules.append(mod)
                fn = mod.get_function(names[digest])
                self.functions[digest] = fn
            for step in plan.steps:
                for ln in step.launches:
                    if ln.shared_bytes > 48 * 1024:
                        allow_large_shared_memory(self.functions[ln.digest], ln.shared_bytes)
            self.weights = DeviceWeights(plan, weights, device)
        self.default = CUDAContext(plan, memory, self.weights, self.functions, device)

    def create_context(self) -> CUDAContext:
        return CUDAContext(self.plan, self.memory, self.weights, self.functions, self.device)

    def run(self, feeds: Mapping[str, Any], **kwargs: Any) -> dict[str, Any]:
        return self.default.run(feeds, **kwargs)
