"""CUDA source from apache-tvm (the optional extra `graphc[tvm]`), for ops with a numpy reference
but no graphc template (codegen/families/tvm_kernels.py says which, and builds their te compute).

TVM is used as a source generator only, with no GPU: a te/topi compute becomes a PrimFunc, the
default GPU schedules (dlight: Reduction, GeneralReduction, Fallback) bind it to threads, TVM's own
pipeline lowers it, and each device kernel is printed as CUDA C. graphc then compiles that source
with its own NVRTC, like every template's, and launches it with the grid and block TVM's lowered
host code passes to the kernel (`call_ffi_kernel`). An engine holds the source and cubin as it
does for any kernel: nothing of TVM is needed to load or run it.

What is refused (a CompileError that names the node): kernels that would need TVM's run-time
(workspace allocations, scalar arguments, dynamic shared memory) and half or bfloat16 tensors
(TVM's fp16 code includes cuda_fp16.h, which NVRTC from pip does not ship).

TVM's CUDA preamble includes <cuda/std/cstdint> and <cuda/std/type_traits> under NVRTC (CCCL
headers NVRTC lacks); that block is replaced with plain typedefs. Each kernel gets the same
GC_PDL_ENTRY() definition as graphc's templates, so it can be launched programmatically on sm_90+.
"""

from __future__ import annotations

import functools
import importlib
import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from graphc.errors import CompileError

log = logging.getLogger(__name__)

# The pins of the extra (pyproject.toml): apache-tvm-ffi 0.1.15.post2 segfaults in ToJSONGraph.
TVM_VERSION = "0.27.0.post1"
INSTALL_HINT = (
    "pip install apache-tvm==0.27.0.post1 apache-tvm-ffi==0.1.14.post0 "
    "(in a clone of graphc: pip install -e '.[tvm]')"
)
# The oldest arch graphc builds for (codegen/nvrtc.py's DEFAULT_ARCHS): TVM's code for it is valid
# on every newer one, so one source serves every arch of the engine (the cubin is per arch).
SOURCE_ARCH = "sm_80"

_PREAMBLE_START = "#ifdef __CUDACC_RTC__"
_PREAMBLE_END_MARK = "#include <cuda.h>"
_TYPEDEFS = """\
// graphc: TVM's NVRTC branch includes CCCL headers NVRTC does not ship; plain typedefs instead.
typedef unsigned char uint8_t;
typedef unsigned short uint16_t;
typedef unsigned int uint32_t;
typedef unsigned long long uint64_t;
typedef signed char int8_t;
typedef short int16_t;
typedef int int32_t;
typedef long long int64_t;
"""
# As codegen/templates/common.cuh defines it (runtime/pdl.py checks for this exact definition).
_PDL = """\
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define GC_PDL_ENTRY() asm volatile("griddepcontrol.wait;\\n\\tgriddepcontrol.launch_dependents;" ::: "memory")
#else
#define GC_PDL_ENTRY() ((void)0)
#endif
"""
_DIMS = ("blockIdx.x", "blockIdx.y", "blockIdx.z", "threadIdx.x", "threadIdx.y", "threadIdx.z")


@dataclass(frozen=True)
class TensorArg:
    """One tensor of the step as the te compute sees it."""

    name: str  # graphc's tensor name (a kernel argument)
    shape: tuple[int, ...]
    dtype: str  # numpy name


@dataclass
class TvmKernel:
    name: str
    source: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    args: list[str]  # graphc tensor names, in the kernel's parameter order


@functools.cache
def available() -> bool:
    """Whether apache-tvm imports here (its version is logged when it is not the pinned one)."""
    try:
        import tvm
    except Exception as e:  # noqa: BLE001 - a broken install is reported as "not available"
        log.debug("apache-tvm not available: %s", e)
        return False
    if not str(tvm.__version__).startswith(TVM_VERSION.split(".post")[0]):
        log.warning("apache-tvm %s is installed; graphc[tvm] is tested with %s", tvm.__version__, TVM_VERSION)
    return True


def version() -> str:
    import tvm

    return str(tvm.__version__)


def _target():
    import tvm

    # A string like "cuda -arch=sm_90" is refused by 0.27's Target parser; the JSON form works.
    return tvm.target.Target({"kind": "cuda", "arch": SOURCE_ARCH})


def build(
    base: str,
    inputs: Sequence[TensorArg],
    outputs: Sequence[TensorArg],
    compute: Callable[..., Any],
    where: str,
) -> list[TvmKernel]:
    """The CUDA kernels TVM writes for `compute(*placeholders)` (te tensors: one per output, or a
    list), in launch order. `base` names the kernels (base_kernel, base_kernel_1, ...); `where`
    heads every error ("<Op> node '<name>': ")."""
    import tvm
    from tvm import te

    build_mod = importlib.import_module("tvm.tirx.build")  # tvm.tirx.build is also a function's name
    for t in (*inputs, *outputs):
        if t.dtype in ("float16", "bfloat16"):
            raise CompileError(
                f"{where}TVM's kernels for {t.dtype} need cuda_fp16.h, which NVRTC here lacks; "
                "this op takes float32/float64/integer tensors on the cuda target"
            )
    target = _target()
    holders = [te.placeholder(t.shape, t.dtype, name=f"arg{i}") for i, t in enumerate(inputs)]
    try:
        with target:
            made = compute(*holders)
    except CompileError:
        raise
    except Exception as e:  # noqa: BLE001 - te/topi raise plain Python and TVM errors
        raise CompileError(f"{where}TVM could not build its compute: {_last_line(e)}") from e
    outs = list(made) if isinstance(made, (list, tuple)) else [made]
    if len(outs) != len(outputs):
        raise CompileError(f"{where}the TVM compute made {len(outs)} outputs, the node has {len(outputs)}")
    for o, t in zip(outs, outputs, strict=True):
        if tuple(int(d) for d in o.shape) != tuple(t.shape) or str(o.dtype) != t.dtype:
            raise CompileError(
                f"{where}the TVM compute's output is {o.dtype}{list(o.shape)}, the node's is {t.dtype}{list(t.shape)}"
            )
    func = te.create_prim_func([*holders, *outs])
    # Buffers topi declares with offset_factor=1 get a symbolic elem_offset, which would become a
    # scalar kernel argument: graphc passes each tensor at its own address, so every offset is 0.
    tensors = (*inputs, *outputs)
    spec = {p: tvm.tirx.decl_buffer(p.shape, p.dtype, p.name) for p in func.params}
    # the host code names each buffer after its parameter (te.extern's outputs have names of their own)
    arg_names = {str(p.name): t.name for p, t in zip(func.params, tensors, strict=True)}
    if len(arg_names) != len(tensors):
        raise CompileError(f"{where}the TVM compute's parameters have clashing names {list(arg_names)}")
    func = func.specialize(spec).with_attr("global_symbol", base)
    mod = tvm.IRModule({base: func})
    mod = _schedule(mod, target, where)
    mod = tvm.tirx.transform.BindTarget(target.with_host("llvm"))(mod)
    pipeline, _finalize_host, finalize_device = tvm.tirx.get_default_tir_pipeline(target)
    try:
        lowered = pipeline(mod)
    except Exception as e:  # TVM's own errors (unbound loops, verification)
        raise CompileError(f"{where}TVM could not lower its kernel: {_last_line(e)}") from e
    host, devices = build_mod.split_host_device_mods(lowered)
    calls = _kernel_calls(host, where)
    if len(devices) != 1:
        raise CompileError(f"{where}TVM made device code for {len(devices)} targets, expected one (cuda)")
    ((dev_target, dev_mod),) = devices.items()
    dev_mod = finalize_device()(dev_mod)
    funcs = {gv.name_hint: (gv, f) for gv, f in dev_mod.functions.items()}
    kernels = []
    for kname, args, dims in calls:
        if kname not in funcs:
            raise CompileError(f"{where}TVM's host code launches '{kname}', which has no device code")
        gv, f = funcs[kname]
        unknown = [a for a in args if a not in arg_names]
        if unknown:
            raise CompileError(f"{where}TVM's kernel {kname} takes {unknown}, which are no tensors of the step")
        src = build_mod.codegen_build(tvm.IRModule({gv: f}), dev_target).inspect_source()
        grid = (dims["blockIdx.x"], dims["blockIdx.y"], dims["blockIdx.z"])
        block = (dims["threadIdx.x"], dims["threadIdx.y"], dims["threadIdx.z"])
        names = [arg_names[a] for a in args]
        read_only = [n in {t.name for t in inputs} and n not in {t.name for t in outputs} for n in names]
        src = const_inputs(fix_source(src, kname, where), kname, read_only, where)
        kernels.append(TvmKernel(kname, src, grid, block, names))
    if not kernels:
        raise CompileError(f"{where}TVM's lowered code launches no kernel")
    return kernels


_CALL = re.compile(r'T\.call_ffi_kernel\("(?P<name>\w+)", (?P<args>[^\[\]]*?), launch_params=\[(?P<params>[^\]]*)\]')
_BUFFER = re.compile(r"^(?P<arg>\w+?)(?:_\d+)?\.data$")


# dlight's rules, most specific first; a rule that cannot analyse a block may raise instead of
# declining (Reduction asserts on some index patterns), so each shorter list is tried in turn.
_RULE_SETS = (("Reduction", "GeneralReduction", "Fallback"), ("GeneralReduction", "Fallback"), ("Fallback",))


def _schedule(mod, target, where: str):
    from tvm.s_tir import dlight as dl

    last: Exception | None = None
    for names in _RULE_SETS:
        try:
            with target:
                return dl.ApplyDefaultSchedule(*(getattr(dl.gpu, n)() for n in names))(mod)
        except Exception as e:  # noqa: BLE001 - TVM raises its own error types; the next set is tried
            log.debug("dlight rules %s failed: %s", names, e)
            last = e
    raise CompileError(f"{where}TVM's default GPU schedules do not apply: {_last_line(last)}")


def _last_line(e: Exception | None) -> str:
    lines = str(e).strip().splitlines() if e is not None else []
    return (lines[-1] if lines else type(e).__name__)[:300]


def _kernel_calls(host, where: str) -> list[tuple[str, list[str], dict[str, int]]]:
    """(kernel name, its buffer arguments, launch dims) of every kernel launch in TVM's lowered host
    code, in order. Read from its TVMScript text (0.27 has no Python TIR visitor): each launch is
    one `T.call_ffi_kernel("name", buffers..., dims..., launch_params=[...])`."""
    text = host.script()
    if "AllocWorkspace" in text:
        raise CompileError(f"{where}TVM's kernels need a workspace allocated at run time; not supported")
    out = []
    for m in _CALL.finditer(text):
        kname = m["name"]
        params = [p.strip().strip('"') for p in m["params"].split(",") if p.strip()]
        if "tirx.use_dyn_shared_memory" in params:
            raise CompileError(f"{where}TVM's kernel {kname} uses dynamic shared memory; not supported")
        args = [a.strip() for a in m["args"].split(",")]
        if len(args) < len(params):
            raise CompileError(f"{where}TVM's launch of {kname} is not one graphc can read: {m[0][:200]}")
        buffers, dim_vals = args[: len(args) - len(params)], args[len(args) - len(params) :]
        names = []
        for b in buffers:
            bm = _BUFFER.match(b)
            if bm is None:
                raise CompileError(f"{where}TVM's kernel {kname} takes '{b}', not a tensor of the step (a scalar?)")
            names.append(bm["arg"])
        dims = {d: 1 for d in _DIMS}
        for p, v in zip(params, dim_vals, strict=True):
            if p not in dims or not v.isdigit():
                raise CompileError(f"{where}TVM's kernel {kname} has launch dimension {p} = {v}, not a constant")
            dims[p] = int(v)
        out.append((kname, names, dims))
    return out


def const_inputs(src: str, kname: str, read_only: Sequence[bool], where: str = "") -> str:
    """The kernel's pointer parameters that are inputs of the step declared const (TVM declares
    every buffer mutable): the engine loader checks that a kernel writes only its step's outputs
    from the constness of its parameters (runtime/validate.py)."""
    sig = re.compile(rf"\b{re.escape(kname)}\(([^)]*)\)")

    def fix(m: re.Match) -> str:
        params = [p.strip() for p in m.group(1).split(",")]
        if len(params) != len(read_only):
            raise CompileError(f"{where}TVM's kernel {kname} has {len(params)} parameters, its launch {len(read_only)}")
        pairs = zip(params, read_only, strict=True)
        out = [f"const {p}" if ro and not p.startswith("const ") else p for p, ro in pairs]
        return f"{kname}({', '.join(out)})"

    fixed, n = sig.subn(fix, src)
    if n == 0:
        raise CompileError(f"{where}TVM's source has no signature of kernel {kname}")
    return fixed


def fix_source(src: str, kname: str, where: str = "") -> str:
    """TVM's CUDA text made a self-contained NVRTC translation unit, PDL-ready."""
    from graphc.runtime.pdl import add_pdl_entries

    start = src.find(_PREAMBLE_START)
    mark = src.find(_PREAMBLE_END_MARK, start)
    end = src.find("#endif", mark)
    if start < 0 or mark < 0 or end < 0:
        raise CompileError(f"{where}TVM's CUDA preamble for {kname} is not the one graphc knows how to adapt")
    src = src[:start] + _TYPEDEFS + src[end + len("#endif") :]
    if "cuda_fp16.h" in src or "cuda_bf16.h" in src or "#include <cuda" in src:
        raise CompileError(f"{where}TVM's kernel {kname} includes CUDA headers NVRTC here lacks")
    return "// CUDA source written by apache-tvm (graphc/tvm_source.py)\n" + _PDL + add_pdl_entries(src)


def run_on_cpu(inputs: Sequence[Any], compute: Callable[..., Any]) -> list[Any]:
    """TVM's CPU (llvm) build of the same te compute, run on numpy arrays `inputs`: a check of the
    compute's definition against graphc's reference without a GPU (tests). Computes with thread
    bindings of their own (topi.gpu's scatter) have no CPU build."""
    import numpy as np
    import tvm
    from tvm import te

    holders = [te.placeholder(a.shape, str(a.dtype), name=f"arg{i}") for i, a in enumerate(inputs)]
    with tvm.target.Target("llvm"):
        made = compute(*holders)
    outs = list(made) if isinstance(made, (list, tuple)) else [made]
    fn = tvm.compile(te.create_prim_func([*holders, *outs]), target="llvm")
    dev = tvm.cpu()
    args = [tvm.runtime.tensor(np.ascontiguousarray(a), dev) for a in inputs]
    res = [tvm.runtime.tensor(np.zeros([int(d) for d in o.shape], str(o.dtype)), dev) for o in outs]
    fn(*args, *res)
    return [r.numpy() for r in res]
