"""The CUDA executor: one arena, weights uploaded once, cubins loaded with cupy, and the whole
launch sequence captured into a CUDA graph on the first run and replayed afterwards."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from graphc.runtime.errors import EngineError
from graphc.runtime.output_ring import DEFAULT_SLOTS, OutputRing, OutputSlot, ring_roots, slot_views
from graphc.runtime.pdl import arch_has_pdl, env_max_ctas, env_pdl, programmatic_launches
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


# Above this much dynamic shared memory a kernel's limit is raised (allow_large_shared_memory): the
# default is 48 KB for static + dynamic together, and some kernels hold a few bytes of static flags.
SHARED_OPT_IN_BYTES = 47 * 1024


def allow_large_shared_memory(fn: Any, nbytes: int) -> None:
    """Raise a kernel's dynamic shared memory limit above the default 48 KB (cupy 14's Function has
    no setter for it; the driver call is the portable way)."""
    from cupy.cuda import driver

    attr = getattr(driver, "CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES", 8)
    try:
        driver.funcSetAttribute(fn.ptr, attr, int(nbytes))
    except Exception as e:
        raise EngineError(f"kernel {getattr(fn, 'name', '?')} needs {nbytes} bytes of shared memory: {e}") from None


# Programmatic dependent launch on sm_90+, by default for engines of short kernels: those whose
# launches average at most PDL_DEFAULT_MEAN_WAVES waves (CTAs per launch / SM count). Measured on
# the H200 (docs/launches.md): PDL made batch 1 1-5% faster (BERT-base, GPT-2, ResNet-50; launches
# average under one wave) and batch 32 up to 3.5% slower (averages of 5-10 waves). load(pdl=True)
# or GRAPHC_PDL=1 turns it on for any engine, load(pdl=False), GRAPHC_PDL=0 or an engine compiled
# with --no-pdl off.
DEFAULT_PDL = True
PDL_DEFAULT_MEAN_WAVES = 2.0
# Programmatic only between launches of at most this many CTAs ("sms": the GPU's SM count, one
# wave; None: every PDL-ready launch); GRAPHC_PDL_MAX_CTAS=N sets it (0: no limit). One wave
# alone kept most of the batch-1 gain away (BERT-base 0.98x against 0.95x), so there is no limit.
DEFAULT_PDL_MAX_CTAS: int | str | None = None
# engine.run captures the copies of device inputs and outputs into a graph with the kernels, per
# set of addresses that comes back (a call is then one graph launch: issue 11, host overhead); a
# graph is the whole launch sequence again (its device memory and instantiation time), so a
# context keeps at most this many.
MAX_COPY_GRAPHS = 4


def _cuda_driver() -> Any:
    """cuda.bindings.driver (cuLaunchKernelEx), or None where cuda-bindings is not installed."""
    try:
        from cuda.bindings import driver
    except ImportError:
        return None
    return driver


class ProgrammaticLaunch:
    """One kernel launch through cuLaunchKernelEx with programmatic stream serialization: the
    kernel may start while the one before it on the stream finishes (it waits in GC_PDL_ENTRY()),
    and a captured graph gets a programmatic edge. The configuration and the argument array are
    built once; a launch is one driver call."""

    def __init__(self, driver: Any, fn: Any, grid: tuple, block: tuple, args: tuple, smem: int, stream: Any, name: str):
        cfg = driver.CUlaunchConfig()
        cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = (int(g) for g in grid)
        cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = (int(b) for b in block)
        cfg.sharedMemBytes = int(smem)
        cfg.hStream = driver.CUstream(int(stream.ptr))
        attr = driver.CUlaunchAttribute()
        attr.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        attr.value.programmaticStreamSerializationAllowed = 1
        cfg.attrs = [attr]
        cfg.numAttrs = 1
        # every argument is a device pointer (tensor, workspace, tensor-map slot): an array of the
        # values and an array of pointers to them, kept alive with the launch
        self.values = np.array([int(a.data.ptr) for a in args], dtype=np.uint64)
        base = int(self.values.ctypes.data) if len(args) else 0
        self.params = np.array([base + 8 * i for i in range(len(args))], dtype=np.uint64)
        self.driver, self.cfg, self.name = driver, cfg, name
        self.fn = driver.CUfunction(int(fn.ptr))
        self.params_ptr = int(self.params.ctypes.data) if len(args) else 0
        self.ok = driver.CUresult.CUDA_SUCCESS

    def __call__(self) -> None:
        (err,) = self.driver.cuLaunchKernelEx(self.cfg, self.fn, self.params_ptr, 0)
        if err != self.ok:
            raise EngineError(f"step '{self.name}': cuLaunchKernelEx failed: {err}")


def launch_digests(plan: KernelPlan) -> list[str]:
    """Per entry of a context's launch list, the digest PDL decides on: "" for a vendor call
    (--tactics cublaslt) and for the launch right after one, which are never programmatic (a
    library's kernel does not signal its dependents early)."""
    seq = [d for s in plan.steps for d in ([None] if s.vendor is not None else [ln.digest for ln in s.launches])]
    return ["" if d is None or (i > 0 and seq[i - 1] is None) else d for i, d in enumerate(seq)]


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

    output_ring = DEFAULT_SLOTS  # slots of the output ring (0: none; CUDAExecutor sets it per engine)

    def __init__(
        self,
        plan: KernelPlan,
        memory: MemoryPlan,
        weights: DeviceWeights,
        functions: dict[str, Any],
        device: int,
        pdl_kernels: frozenset[str] = frozenset(),
        pdl_max_ctas: int | str | None = None,
    ):
        # pdl_kernels: the digests launched programmatically (CUDAExecutor.pdl_kernels: PDL-ready
        # kernels, on sm_90+, with PDL on); every other launch is an ordinary cupy launch.
        # pdl_max_ctas: only between launches of at most that many CTAs ("sms": the SM count)
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
            need_sms = pdl_max_ctas == "sms" and bool(pdl_kernels)
            sms = (
                _sm_count(cupy, device)
                if need_sms or any(ln.params.get("persistent") for s in plan.steps for ln in s.launches)
                else 0
            )
            from graphc.runtime.tactics_cublaslt import VendorSteps

            # what an output ring slot (runtime/output_ring.py) rebuilds its launch list from
            self._memory, self._functions, self._sms = memory, functions, sms
            self._pdl = (pdl_kernels, sms if pdl_max_ctas == "sms" else pdl_max_ctas)
            # vendor tactics (--tactics cublaslt): one library call each, in the step's place
            self.vendor = VendorSteps(plan, views, self.stream, cupy)
            self.launches = self._make_launches(views, self.tensormaps, self.vendor)
            self.programmatic = self._programmatic(plan, *self._pdl, self.launches)
        self.graph = None
        self.lock = threading.Lock()
        self.prepare_io()

    def prepare_io(self) -> None:
        """Per-call constants of run(), computed once: each input's and output's view, address,
        bytes, dtype and shape, and the fast path's checks, so that a call allocates no device
        memory and looks nothing up by name twice (engine.run's host overhead, issue 11)."""
        self._inputs = [(n, self.views[n], self._slot(n)) for n in self.plan.inputs]
        self._outputs = [
            (public, self.views[n], self._slot(n))
            for public, n in zip(self.plan.output_names, self.plan.outputs, strict=True)
        ]
        self._d2d = int(getattr(self.cupy.cuda.runtime, "memcpyDeviceToDevice", 3))
        self._slow_logged = False
        self._ndarray = self.cupy.ndarray
        self._get_device = self.cupy.cuda.runtime.getDevice
        # the exact form of a fast call: per input (name, dtype, shape, the slot's address)
        self._exact = tuple((n, dtype, shape, ptr) for n, _v, (ptr, _b, dtype, shape) in self._inputs)
        # what a copy in (source -> slot) and a copy out (output's view -> target) move
        self._in_copies = tuple((ptr, nbytes) for _n, _v, (ptr, nbytes, _d, _s) in self._inputs)
        self._out_copies = tuple((ptr, nbytes) for _p, _v, (ptr, nbytes, _d, _s) in self._outputs)
        self._out_checks = tuple((public, dtype, shape) for public, _v, (_p, _b, dtype, shape) in self._outputs)
        # new output arrays are allocated last output first: a caller that drops a result frees its
        # arrays first to last, and a last-in-first-out pool (cupy's) then hands each output the
        # block it had before, so the addresses, and the graph with their copies, stay the same
        self._out_names = tuple(o[0] for o in self._outputs)
        self._out_allocs = tuple((shape, dtype) for _p, _v, (_ptr, _b, dtype, shape) in reversed(self._outputs))
        # reuse_outputs=True: the outputs' own arena views, no copy; an output the plan keeps in
        # the weights (a constant output) goes to a buffer of the context instead, so that a
        # caller writing into what it got back never changes the engine
        own, targets = {}, []
        for (public, view, (_ptr, _nbytes, dtype, shape)), name in zip(self._outputs, self.plan.outputs, strict=True):
            if self._weight_rooted(name):
                with self.cupy.cuda.Device(self.device):
                    view = self.cupy.empty(shape, dtype=dtype)
                targets.append(int(view.data.ptr))
            else:
                targets.append(0)
            own[public] = view
        self._own_outputs, self._own_targets = own, tuple(targets)
        # graphs with the copies in and out captured inside, per (sources, targets) address set
        self._copy_graphs: dict[tuple, Any] = {}
        self._sightings: dict[tuple, int] = {}
        self._full_logged = False
        # a context whose launch_all is not the plain launch list (host-If: host decisions between
        # captured segments) cannot be captured whole: its copies stay memcpys around the replay
        self._capture_whole = type(self).launch_all is CUDAContext.launch_all
        # the ordinary call's outputs written in place into slots the caller gave back (runtime/output_ring.py)
        self._no_dsts = (0,) * len(self._outputs)
        self.set_output_ring(self.output_ring)

    def set_output_ring(self, size: int) -> None:
        """Write the ordinary call's outputs in place into `size` slots the caller gives back (0:
        copy them out of the arena into new arrays, the behaviour before the ring)."""
        self.output_ring = size
        memory = getattr(self, "_memory", None)  # None: a context made without __init__ (tests' fakes)
        roots = ring_roots(self.plan, memory) if memory is not None and self._capture_whole and size > 0 else None
        self._ring = OutputRing(roots, size) if roots else None

    def _weight_rooted(self, name: str) -> bool:
        seen = set()
        t = self.plan.tensors[name]
        while t.kind == ALIAS and t.alias_of and t.alias_of not in seen:
            seen.add(t.alias_of)
            t = self.plan.tensors[t.alias_of]
        return t.kind == WEIGHT

    def _slot(self, name: str) -> tuple[int, int, Any, tuple[int, ...]]:
        v = self.views[name]
        return int(v.data.ptr), int(v.nbytes), v.dtype, tuple(v.shape)

    def _tensor_maps(self, plan: KernelPlan, views: dict[str, Any]) -> TensorMapTable | None:
        """Every launch's tensor maps, encoded for this context's addresses (arena and weights) in
        one device buffer that lives as long as the context, so a captured graph stays valid."""
        entries = []
        for step in plan.steps:
            for ln in step.launches:
                specs = validate_launch(ln.params, ln.args, plan.tensors, f"step '{step.name}'")
                entries += [(s, int(views[s.tensor].data.ptr)) for s in specs]
        return TensorMapTable(self.cupy, entries) if entries else None

    def _make_launches(self, views: dict[str, Any], tensormaps: TensorMapTable | None, vendor: Any) -> list[tuple]:
        """The launch list over `views`: per launch (function, grid, block, args, shared bytes, step)."""
        launches: list[tuple] = []
        first = 0  # index of the launch's first tensor map in the context's table
        for step in self.plan.steps:
            if step.vendor is not None:
                launches.append((vendor.calls[step.name], (1, 1, 1), (1, 1, 1), (), 0, step.name))
            for ln in step.launches:
                fn = self._functions[ln.digest]
                args = tuple(self._arg(a, views, first, step.name, tensormaps) for a in ln.args)
                first += len(ln.params.get("tmaps", []))
                grid = tuple(ln.grid)
                if ln.params.get("persistent"):  # a CTA per SM at most: the kernel strides by gridDim
                    grid = (min(grid[0], self._sms), *grid[1:])
                launches.append((fn, grid, tuple(ln.block), args, ln.shared_bytes, step.name))
        return launches

    def _arg(self, a: str, views: dict[str, Any], first: int, step: str, tensormaps: TensorMapTable | None) -> Any:
        if a == "@workspace":
            return self.workspace
        if is_tmap_arg(a):
            assert tensormaps is not None  # validate_launch saw the spec
            return tensormaps.arg(first + tmap_index(a, f"step '{step}'"))
        return views[a]

    def _programmatic(
        self, plan: KernelPlan, pdl_kernels: frozenset[str], max_ctas: int | None, launches: list[tuple]
    ) -> list[ProgrammaticLaunch | None]:
        """Per launch of `launches`, its programmatic launcher, or None for an ordinary launch."""
        digests = launch_digests(plan)
        ctas = [int(np.prod(grid)) for _fn, grid, *_ in launches]
        chosen = programmatic_launches(digests, pdl_kernels, ctas, max_ctas)
        if not any(chosen):
            return [None] * len(launches)
        driver = _cuda_driver()
        if driver is None:
            log.warning("programmatic dependent launch off: cuda.bindings is not installed (pip install cuda-bindings)")
            return [None] * len(launches)
        # the driver API launches in the thread's current context: the one cupy made current here
        err, self._driver_ctx = driver.cuCtxGetCurrent()
        if err != driver.CUresult.CUDA_SUCCESS:
            raise EngineError(f"cuCtxGetCurrent failed: {err}")
        self._driver = driver
        return [
            ProgrammaticLaunch(driver, fn, grid, block, args, smem, self.stream, name) if pdl else None
            for (fn, grid, block, args, smem, name), pdl in zip(launches, chosen, strict=True)
        ]

    def _bind_driver_context(self) -> None:
        """Make this context's CUDA context current for the driver API's launches (another thread
        that ran only runtime-API calls may have none current); before a capture begins."""
        if getattr(self, "_driver", None) is not None:
            (err,) = self._driver.cuCtxSetCurrent(self._driver_ctx)
            if err != self._driver.CUresult.CUDA_SUCCESS:
                raise EngineError(f"cuCtxSetCurrent failed: {err}")

    def launch_all(self) -> None:
        self._launch(self.launches, self.programmatic)

    def _launch(self, launches: list[tuple], programmatic: list[Any]) -> None:
        """Each launch on the stream, the ordinary way or by its programmatic launcher."""
        for (fn, grid, block, args, smem, _name), pdl in zip(launches, programmatic, strict=True):
            if pdl is None:
                fn(grid, block, args, shared_mem=smem, stream=self.stream)
            else:
                pdl()

    def exact_sources(self, feeds: Mapping[str, Any]) -> tuple[int, ...] | None:
        """The fast path's check: every input, and nothing else, as a C-contiguous cupy array of
        its slot's dtype and shape on this device. Then per input the address to copy it from (0:
        it is the slot itself, nothing to copy); None for any other form (then run() stages each
        input the general way, and Engine checks the feeds first, with errors that name them)."""
        if len(feeds) != len(self._exact):
            return None
        nd, dev, srcs = self._ndarray, self.device, []
        for name, dtype, shape, slot in self._exact:
            x = feeds.get(name)
            if type(x) is not nd or x.dtype != dtype or x.shape != shape or not x._c_contiguous:
                return None
            data = x.data
            if data.device_id != dev:
                return None
            p = data.ptr
            srcs.append(0 if p == slot else p)
        return tuple(srcs)

    def run_exact(
        self,
        feeds: Mapping[str, Any],
        *,
        use_graph: bool = True,
        to_numpy: bool = False,
        sync: bool = True,
        out: Mapping[str, Any] | None = None,
        reuse_outputs: bool = False,
    ) -> dict[str, Any] | None:
        """run() for feeds of the exact form (exact_sources), else None having done nothing:
        Engine.run's fast path, which then needs no other check of the feeds."""
        srcs = self.exact_sources(feeds)  # one Python call more than inlining it (~0.1 us)
        if srcs is None:
            return None
        with self.lock:
            if self._get_device() == self.device:
                return self._execute(srcs, use_graph, to_numpy, sync, out, reuse_outputs)
            with self.cupy.cuda.Device(self.device):
                return self._execute(srcs, use_graph, to_numpy, sync, out, reuse_outputs)

    def run(
        self,
        feeds: Mapping[str, Any],
        *,
        use_graph: bool = True,
        to_numpy: bool = False,
        sync: bool = True,
        out: Mapping[str, Any] | None = None,
        reuse_outputs: bool = False,
    ) -> dict[str, Any]:
        """One inference (feeds already checked for names, dtypes and shapes: Engine.check_feeds).

        Inputs: a C-contiguous cupy array of the slot's dtype and shape on this device is copied by
        one device-to-device copy (none when it is the slot); numpy is uploaded on the engine's
        stream; a strided or other-device array is copied by a kernel (logged once); any other
        tensor through the CUDA array interface or DLPack.
        Outputs, by output name:
        - default: new cupy arrays, one allocation each (valid after later runs);
        - out=: copied into the caller's cupy arrays (the outputs' dtypes and shapes, C-contiguous,
          this device), which are returned: no allocation;
        - reuse_outputs=True: the engine's own output buffers (views of its arena), no allocation
          and no copy; valid until the next run of this context, which overwrites them (TensorRT's
          bound output buffers; torch.compile's reduce-overhead outputs).
        Copies of device inputs and outputs are captured into the CUDA graph with the kernels once
        the same addresses come back (the second call with them; at most MAX_COPY_GRAPHS address
        sets per context): a call is then one graph launch. Other calls add one cudaMemcpyAsync per
        copy around the plain graph. With sync=False the call returns once the work is queued."""
        srcs = self.exact_sources(feeds)
        with self.lock:
            if self._get_device() == self.device and srcs is not None:
                return self._execute(srcs, use_graph, to_numpy, sync, out, reuse_outputs)
            with self.cupy.cuda.Device(self.device):
                if srcs is None:
                    with self.stream:
                        srcs = self._stage_inputs(feeds)
                return self._execute(srcs, use_graph, to_numpy, sync, out, reuse_outputs)

    def _stage_inputs(self, feeds: Mapping[str, Any]) -> tuple[int, ...]:
        """The general path of the inputs (see run()): numpy uploaded and other forms copied now,
        on the engine's stream; per input the address of a device-to-device copy still to make, or 0."""
        cupy, srcs = self.cupy, []
        for name, view, (ptr, _nbytes, dtype, shape) in self._inputs:
            x = feeds[name]
            src = 0
            if isinstance(x, np.ndarray):
                view.set(x if x.flags.c_contiguous else np.ascontiguousarray(x), stream=self.stream)
            elif isinstance(x, cupy.ndarray):
                src = self._copy_in(x, view, ptr, dtype, shape, name)
            else:
                view[...] = cupy.asarray(x) if hasattr(x, "__cuda_array_interface__") else cupy.from_dlpack(x)
            srcs.append(src)
        return tuple(srcs)

    def _copy_in(self, x: Any, view: Any, ptr: int, dtype: Any, shape: tuple, name: str) -> int:
        """A cupy input: the address to copy it from by memcpy, or 0 (it is the slot, or it was
        copied here by a kernel: strided, or on another device)."""
        src = int(x.data.ptr)
        if src == ptr and x.shape == shape and x.dtype == dtype:
            return 0  # the engine's own slot (a caller writing its input in place): nothing to copy
        if x.dtype == dtype and x.shape == shape and x.flags.c_contiguous and x.device.id == self.device:
            return src
        if not self._slow_logged:  # a strided or other-device array: an elementwise copy kernel instead
            log.info("input '%s': not a C-contiguous array on device %d; copied by a kernel", name, self.device)
            self._slow_logged = True
        view[...] = x
        return 0

    def _out_targets(self, out: Mapping[str, Any]) -> tuple[int, ...]:
        """The addresses of the out= arrays, checked (one error naming the output otherwise)."""
        nd, dev, dsts = self._ndarray, self.device, []
        if len(out) != len(self._out_checks):
            raise EngineError(f"out= names {sorted(out)}; the engine's outputs are {[o[0] for o in self._outputs]}")
        for public, dtype, shape in self._out_checks:
            dst = out.get(public)
            if type(dst) is nd and dst.dtype == dtype and dst.shape == shape and dst._c_contiguous:
                data = dst.data
                if data.device_id == dev:
                    dsts.append(data.ptr)
                    continue
            self._bad_out(public, dst, dtype, shape)
        return tuple(dsts)

    def _bad_out(self, public: str, dst: Any, dtype: Any, shape: tuple) -> None:
        if dst is None:
            raise EngineError(f"out= has no array for output '{public}'")
        if not isinstance(dst, self.cupy.ndarray) or dst.dtype != dtype or dst.shape != shape:
            raise EngineError(f"out['{public}'] must be a cupy array of dtype {dtype} and shape {shape}")
        raise EngineError(f"out['{public}'] must be C-contiguous and on device {self.device}")

    def _execute(
        self, srcs: tuple[int, ...], use_graph: bool, to_numpy: bool, sync: bool, out: Any, reuse_outputs: bool
    ) -> dict[str, Any]:
        """The inputs' copies (from `srcs`), the launches and the outputs' copies, on the stream."""
        if out is not None:
            dsts = self._out_targets(out)
            outs = dict(out)
        elif reuse_outputs:
            dsts, outs = self._own_targets, dict(self._own_outputs)
        elif use_graph and self._ring is not None and (slot := self._ring_slot()) is not None:
            # the graph writes the outputs into a slot the caller gave back: nothing to copy out
            self._launch_replay(slot, srcs)
            outs = slot.arrays(self._ndarray)
            return self._finish(outs, to_numpy, sync)
        else:  # new arrays, allocated on the engine's stream (cupy's pool keeps blocks per stream)
            empty, made, ptrs = self.cupy.empty, [], []
            with self.stream:  # the last output first: see prepare_io
                for shape, dtype in self._out_allocs:
                    a = empty(shape, dtype=dtype)
                    made.append(a)
                    ptrs.append(a.data.ptr)
            made.reverse()
            ptrs.reverse()
            outs = dict(zip(self._out_names, made, strict=True))
            dsts = tuple(ptrs)
        if use_graph:
            self._launch_replay(self, srcs, dsts)
        else:
            self._bind_driver_context()
            self._memcpys(srcs, dsts, None)
        return self._finish(outs, to_numpy, sync)

    def _finish(self, outs: dict[str, Any], to_numpy: bool, sync: bool) -> dict[str, Any]:
        if to_numpy:
            return {k: self.cupy.asnumpy(v, stream=self.stream) for k, v in outs.items()}
        if sync:
            self.stream.synchronize()
        return outs

    def _launch_replay(self, r: Any, srcs: tuple[int, ...], dsts: tuple[int, ...] | None = None) -> None:
        """The graph of launch list `r` (the context itself, or an output slot) with the copies of
        (srcs, dsts; None: no copy out), or its plain graph with the copies as memcpys around it."""
        key = (srcs, self._no_dsts if dsts is None else dsts)
        graph = r._copy_graphs.get(key)
        if graph is None:
            graph = self._graph_for(key, r)
        if graph is not None:
            graph.launch(stream=self.stream)
        else:  # copies by memcpy around the plain graph
            self._memcpys(*key, self._plain_graph(r))

    def replay_graph(self) -> Any:
        """The graph of the launch sequence alone (no copies; outputs in the arena), for timing a
        replay (graphc bench, tools/bench_timing.py): the ordinary call replays a slot's graph of the
        same kernels (runtime/output_ring.py), so this one is captured on first use."""
        if self.graph is None and self._capture_whole:
            with self.cupy.cuda.Device(self.device):
                self._plain_graph()
        return self.graph

    def _ring_slot(self) -> OutputSlot | None:
        """A slot of the output ring the caller holds nothing of (a new one while fewer than the
        ring's size exist), or None: every slot is held, the call copies its outputs out."""
        ring = self._ring
        slot = ring.take()
        if slot is None and len(ring.slots) < ring.size:
            slot = self._new_slot(ring)
            ring.slots.append(slot)
            ring.next = 0 if len(ring.slots) == ring.size else len(ring.slots)
        if slot is None and not ring.held_logged:
            log.info("engine.run: the caller holds the outputs of all %d output slots; outputs are copied "
                     "into new arrays while it does", ring.size)  # fmt: skip
            ring.held_logged = True
        return slot

    def _new_slot(self, ring: OutputRing) -> OutputSlot:
        """Output buffers outside the arena, the launch list with the outputs moved into them
        (tensor maps and vendor calls rebuilt over the moved views), sealed."""
        from graphc.runtime.tactics_cublaslt import VendorSteps

        plan, cupy = self.plan, self.cupy
        buffers = {root: cupy.empty(max(int(plan.tensors[root].nbytes), 1), dtype=cupy.uint8) for root in ring.roots}
        views = slot_views(plan, self._memory, self.views, buffers, cupy, _numpy_dtype)
        tensormaps = self._tensor_maps(plan, views)
        vendor = VendorSteps(plan, views, self.stream, cupy) if self.vendor.calls else self.vendor
        launches = self._make_launches(views, tensormaps, vendor)
        outputs = [  # an output's own shape and dtype (a view's may differ from its root's), at offset 0
            (public, tuple(views[name].shape), views[name].dtype, buffers[root].data)
            for public, name, root in zip(plan.output_names, plan.outputs, ring.roots, strict=True)
        ]
        slot = OutputSlot(
            list(buffers.values()), outputs, launches, self._programmatic(plan, *self._pdl, launches),
            keep=[views, tensormaps, vendor],
        )  # fmt: skip
        slot.seal()
        return slot

    def _run_list(self, r: Any) -> None:
        """Launch list `r`: the context's own (launch_all, which a subclass may override) or a slot's."""
        if r is self:
            self.launch_all()
        else:
            self._launch(r.launches, r.programmatic)

    def _memcpys(self, srcs: tuple[int, ...], dsts: tuple[int, ...], graph: Any, r: Any = None) -> None:
        """The copies in, `graph`'s launch (None: launch list `r`, default the context's), the
        copies out: one cudaMemcpyAsync per copy on the stream."""
        copy, d2d, stream = self.cupy.cuda.runtime.memcpyAsync, self._d2d, self.stream.ptr
        for src, (slot, nbytes) in zip(srcs, self._in_copies, strict=True):
            if src:
                copy(slot, src, nbytes, d2d, stream)
        if graph is not None:
            graph.launch(stream=self.stream)
        else:
            self._run_list(self if r is None else r)
        for dst, (view, nbytes) in zip(dsts, self._out_copies, strict=True):
            if dst:
                copy(dst, view, nbytes, d2d, stream)

    def _plain_graph(self, r: Any = None) -> Any:
        """Launch list `r` (default the context's) alone as a CUDA graph, captured on first use."""
        r = self if r is None else r
        if r.graph is None:
            self._bind_driver_context()
            self.stream.begin_capture()
            try:
                self._run_list(r)
            except BaseException:
                self.stream.end_capture()  # no partial graph kept: it would replay without what failed
                raise
            r.graph = self.stream.end_capture()
        return r.graph

    def _graph_for(self, key: tuple, r: Any = None) -> Any:
        """The graph that runs the copies of `key` (sources, targets) and launch list `r` (default
        the context's), or None (then run() makes the copies by memcpy around the plain graph).
        Nothing to copy: the plain graph. Else a graph with the copies inside, captured the second
        time these addresses come (an address seen once, such as a new output array kept by the
        caller, is not worth a capture), up to MAX_COPY_GRAPHS per launch list."""
        r = self if r is None else r
        srcs, dsts = key
        if not any(srcs) and not any(dsts):
            return self._plain_graph(r)
        if not self._capture_whole:
            return None
        seen = r._sightings.get(key, 0) + 1
        if seen < 2 or len(r._copy_graphs) >= MAX_COPY_GRAPHS:
            if seen >= 2 and not self._full_logged:
                log.info(
                    "engine.run: %d address sets of inputs/outputs captured with their copies already; further "
                    "ones copy by cudaMemcpyAsync around the graph (stable addresses, out= or reuse_outputs=True "
                    "avoid that)", MAX_COPY_GRAPHS,
                )  # fmt: skip
                self._full_logged = True
            if len(r._sightings) >= 64:  # one-off addresses (new arrays every call) do not pile up
                r._sightings.clear()
            r._sightings[key] = seen
            return None
        r._sightings.pop(key, None)
        self._bind_driver_context()
        self.stream.begin_capture()
        try:
            self._memcpys(srcs, dsts, None, r)
            graph = self.stream.end_capture()
        except Exception as e:
            with contextlib.suppress(Exception):  # a partial graph would replay without the work that failed
                self.stream.end_capture()
            # the plain graph captured and ran before: the copies go back to memcpys around it, said once
            log.warning("engine.run: capturing the input/output copies into the graph failed (%s); "
                        "copies by cudaMemcpyAsync around the graph from now on", e)  # fmt: skip
            self._capture_whole = False
            return None
        r._copy_graphs[key] = graph
        return graph


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
        device_weights: DeviceWeights | None = None,
        pdl_ready: Iterable[str] = (),
        pdl: bool | None = None,
        output_ring: int | None = None,
    ):
        # device_weights: weights already on the device (a shape bucket shares the engine's)
        # output_ring: slots of each context's output ring (runtime/output_ring.py; None: the default)
        # pdl_ready: digests of the PDL-ready kernels (runtime/pdl.py); pdl: launch them
        # programmatically (None: GRAPHC_PDL if set, else DEFAULT_PDL); only on sm_90+ cubins
        cupy = self.cupy = import_cupy()
        from graphc.runtime.tactics_cublaslt import import_cublaslt, vendor_steps

        if vendor_steps(plan):  # a missing library is one line naming it, before the GPU holds anything
            import_cublaslt(len(vendor_steps(plan)))
        # `plan` is already one arch's (KernelPlan.for_arch); launch_arch says whose, for tests and reports
        self.plan, self.memory, self.device, self.launch_arch = plan, memory, device, launch_arch
        if plan.launch_archs():  # a plan of several archs would run its default launches here, whatever the GPU
            raise EngineError("the CUDA executor takes one arch's plan (KernelPlan.for_arch), not a plan of several")
        from graphc.runtime.host_if_cuda import sub_plan_digests

        used = {ln.digest for s in plan.steps for ln in s.launches}
        used |= sub_plan_digests(plan, launch_arch)  # a data-dependent If's branch kernels
        missing = sorted(used - set(cubins))
        if missing:
            raise EngineError(f"no cubin for kernel(s) {', '.join(names.get(d, d) for d in missing[:5])} of the plan")
        # Only this plan's kernels are kept (another arch's, or one the plan does not launch, are not).
        self._cubins = {d: c for d, c in cubins.items() if d in used}
        self._names = names
        self.pdl_kernels = self._pdl_kernels(
            set(pdl_ready) & used, pdl, launch_arch or device_arch(device), lambda: self._short_kernels(cupy)
        )
        limit = env_max_ctas()
        self.pdl_max_ctas = DEFAULT_PDL_MAX_CTAS if limit == "default" else limit
        with cupy.cuda.Device(device):
            self.functions, self.modules = self._load_functions()
            self.weights = device_weights if device_weights is not None else DeviceWeights(plan, weights, device)
        self.output_ring = DEFAULT_SLOTS if output_ring is None else max(int(output_ring), 0)
        self.default = self._context(self.functions)

    def _context(self, functions: dict[str, Any]) -> CUDAContext:
        # a plan with data-dependent If steps gets a context that chooses branches on the host
        from graphc.runtime.host_if_cuda import make_context

        ctx = make_context(
            self.plan, self.memory, self.weights, functions, self.device, self.launch_arch,
            self.pdl_kernels, self.pdl_max_ctas,
        )  # fmt: skip
        if ctx.output_ring != self.output_ring:
            ctx.set_output_ring(self.output_ring)
        return ctx

    @staticmethod
    def _pdl_kernels(ready: set[str], pdl: bool | None, arch: str, short_kernels: Any = lambda: True) -> frozenset[str]:
        """The kernels this executor launches programmatically: the PDL-ready ones where the switch
        is on and the cubins are for sm_90+ (griddepcontrol does not exist before). The switch:
        `pdl`, else GRAPHC_PDL, else the default (DEFAULT_PDL and `short_kernels()`)."""
        if not ready or not arch_has_pdl(arch):
            return frozenset()
        on = pdl if pdl is not None else env_pdl()
        if on is None:
            on = DEFAULT_PDL and bool(short_kernels())
        if not on:
            return frozenset()
        log.info("%d kernels launched programmatically (PDL) on %s", len(ready), arch)
        return frozenset(ready)

    def _short_kernels(self, cupy: Any) -> bool:
        """Whether this plan's launches average at most PDL_DEFAULT_MEAN_WAVES waves of CTAs (a
        persistent kernel counted as one CTA per SM): the engines PDL was measured faster on."""
        sms = _sm_count(cupy, self.device)
        ctas = [
            min(int(np.prod(ln.grid)), sms) if ln.params.get("persistent") else int(np.prod(ln.grid))
            for s in self.plan.steps
            for ln in s.launches
        ]
        mean = sum(ctas) / max(len(ctas), 1)
        short = mean <= PDL_DEFAULT_MEAN_WAVES * sms
        log.info(
            "PDL %s by default: %.0f CTAs per launch on average, %d SMs (on up to %.1f waves)",
            "on" if short else "off", mean, sms, PDL_DEFAULT_MEAN_WAVES,
        )  # fmt: skip
        return short

    def _load_functions(self) -> tuple[dict[str, Any], list[Any]]:
        """The plan's kernels, loaded as modules of their own. Some kernels keep state in module
        globals between launches (the arrival counters of one-launch split-K and of row-norm
        epilogues: zero at load, reset by the last block), so two contexts running at once must not
        share a module: each context loads its own."""
        cupy = self.cupy
        functions: dict[str, Any] = {}
        modules = []
        for digest, cubin in self._cubins.items():
            mod = cupy.cuda.function.Module()
            mod.load(cubin)
            modules.append(mod)
            functions[digest] = mod.get_function(self._names[digest])
        from graphc.runtime.host_if_cuda import sub_plan_launches

        for ln in [
            *(ln for step in self.plan.steps for ln in step.launches),
            *sub_plan_launches(self.plan, self.launch_arch),
        ]:
            if ln.shared_bytes > SHARED_OPT_IN_BYTES:
                allow_large_shared_memory(functions[ln.digest], ln.shared_bytes)
        return functions, modules

    def create_context(self) -> CUDAContext:
        with self.cupy.cuda.Device(self.device):
            functions, modules = self._load_functions()
        ctx = self._context(functions)
        ctx.modules = modules  # the context's kernels live as long as it does
        return ctx

    def run(self, feeds: Mapping[str, Any], **kwargs: Any) -> dict[str, Any]:
        return self.default.run(feeds, **kwargs)
