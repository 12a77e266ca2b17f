"""The cuBLASLt vendor tactic: an engine step that runs one GEMM through cublasLtMatmul.

A step with a `vendor` record (`{"library": "cublaslt", ...}`, docs/tactics.md) launches no graphc
kernel: the record describes the GEMM as data, in graphc's row-major terms

    D[b, m, n] = act(alpha * sum_k A[b, m, k] * B[b, k, n] + beta * C[b, m, n] + bias[n])

with A stored [M, K] (a_trans: [K, M]), B stored [K, N] (b_trans: [N, K]), C (optional, the
residual, beta 1.0 in graphc's lowering) and D of D's dtype, and act from a closed set. Nothing in
the record chooses code beyond that set: the library is one name, the activation one of ACTS.

cuBLASLt is column-major. A row-major [R, C] buffer read column-major is its transpose [C, R] with
ld = C, so the row-major product D = A @ B is computed as the column-major D^T = B^T @ A^T:
cuBLASLt's "A" is graphc's B buffer, its "B" is graphc's A buffer, and D^T has N rows and M
columns (ld N). The bias, a vector over graphc's columns n, is then over cuBLASLt's rows, which is
what its BIAS epilogues broadcast along. `lt_call()` derives those layouts; `emulate()` runs them
in numpy exactly as cuBLASLt reads them (tests check it against the row-major product).

At load (`VendorSteps`, one per execution context) the handle, descriptors and layouts are built
and the algorithm is picked with cublasLtMatmulAlgoGetHeuristic (the record's algo_index into the
heuristic's list, 0 by default); each call is then one cublasLtMatmul on the context's stream,
which a CUDA-graph capture records like any kernel. nvmath-python (`nvmath.bindings.cublasLt`) is
imported only here, only when an engine with vendor steps loads.
"""

from __future__ import annotations

import ctypes
import glob
import logging
import math
import os
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np

from graphc.runtime.errors import EngineError

log = logging.getLogger(__name__)

LIBRARY = "cublaslt"
SPEC_VERSION = 1
ACTS = ("none", "relu", "gelu_tanh")
IN_DTYPES = ("float16", "bfloat16")
OUT_DTYPES = ("float16", "bfloat16", "float32")
PIP = "pip install 'nvmath-python>=0.5' nvidia-cublas (or, in a clone of graphc: pip install -e '.[tactics]')"
# How many algorithms the heuristic is asked for; algo_index picks one of them.
ALGO_CANDIDATES = 8
# The workspace a context offers cuBLASLt: 32 MiB, NVIDIA's recommendation for Hopper (the cuBLAS
# documentation, "cublasSetWorkspace": 32 MiB on Hopper, 4 MiB before). It bounds what the
# heuristic may pick (MAX_WORKSPACE_BYTES); the context allocates the most its chosen algorithms
# report, shared by all its vendor steps, which run one after another on its one stream.
MAX_WORKSPACE_BYTES = 32 * 2**20

# cudaDataType values (library_types.h) and cuBLAS enums (cublas_api.h / cublasLt.h): fixed by the
# C headers, so written here rather than looked up by name.
_CUDA_R = {"float32": 0, "float16": 2, "bfloat16": 14}
_COMPUTE_32F = 68  # CUBLAS_COMPUTE_32F: fp32 accumulation, as graphc's own kernels
_OP_N, _OP_T = 0, 1
# cublasLtEpilogue_t: (act, has bias) -> value
_EPILOGUE = {
    ("none", False): 1,  # DEFAULT
    ("relu", False): 2,  # RELU
    ("none", True): 4,  # BIAS
    ("relu", True): 6,  # RELU_BIAS
    ("gelu_tanh", False): 32,  # GELU
    ("gelu_tanh", True): 36,  # GELU_BIAS
}


@dataclass(frozen=True)
class VendorGemm:
    """A step's vendor record (the manifest's `vendor` object), in graphc's row-major terms."""

    m: int
    n: int
    k: int
    a: str
    b: str
    d: str
    batch: int = 1
    a_trans: bool = False
    b_trans: bool = False
    a_stride: int = 0  # elements between batches (0: shared by every batch)
    b_stride: int = 0
    d_stride: int = 0
    c: str | None = None
    c_stride: int = 0
    beta: float = 0.0
    bias: str | None = None
    bias_stride: int = 0  # elements between batches' bias vectors (0: one bias for every batch)
    alpha: float = 1.0
    act: str = "none"
    # the graph's GELU was the erf form, run as cuBLASLt's tanh form (docs/tactics.md says why)
    gelu_from_erf: bool = False
    algo_index: int = 0
    library: str = LIBRARY
    version: int = SPEC_VERSION

    def as_json(self) -> dict[str, Any]:
        return {f: getattr(self, f) for f in self.__dataclass_fields__}

    @staticmethod
    def from_json(d: dict[str, Any]) -> VendorGemm:
        return VendorGemm(**d)

    def tensors(self) -> list[str]:
        return [t for t in (self.a, self.b, self.c, self.bias, self.d) if t is not None]


@dataclass(frozen=True)
class Layout:
    """One cuBLASLt matrix layout (column-major): which buffer, its rows, cols, ld, batch stride."""

    buffer: str
    rows: int
    cols: int
    ld: int
    stride: int


@dataclass(frozen=True)
class LtCall:
    """The cublasLtMatmul call of a VendorGemm: D' = act(alpha op(A') op(B') + beta C' + bias)."""

    a: Layout  # cuBLASLt's A: graphc's B buffer
    b: Layout  # cuBLASLt's B: graphc's A buffer
    d: Layout
    c: Layout | None
    trans_a: int
    trans_b: int
    batch: int
    epilogue: int


def lt_call(g: VendorGemm) -> LtCall:
    """The column-major call computing graphc's row-major D = A @ B as D^T = B^T @ A^T."""
    M, N, K = g.m, g.n, g.k
    # graphc's B: [K, N] row-major is, read column-major, [N, K] (ld N) = B^T: no transpose.
    # [N, K] row-major (b_trans) is [K, N] (ld K): transposed to give B^T.
    a = Layout(g.b, K, N, K, g.b_stride) if g.b_trans else Layout(g.b, N, K, N, g.b_stride)
    # graphc's A: [M, K] row-major is [K, M] (ld K) = A^T; [K, M] (a_trans) is [M, K] (ld M): transposed.
    b = Layout(g.a, M, K, M, g.a_stride) if g.a_trans else Layout(g.a, K, M, K, g.a_stride)
    d = Layout(g.d, N, M, N, g.d_stride)
    c = Layout(g.c, N, M, N, g.c_stride) if g.c is not None else None
    return LtCall(
        a, b, d, c,
        _OP_T if g.b_trans else _OP_N,
        _OP_T if g.a_trans else _OP_N,
        g.batch,
        _EPILOGUE[(g.act, g.bias is not None)],
    )  # fmt: skip


def _span(lay: Layout, batch: int) -> int:
    """Elements a layout reaches: the last batch's last column's last row, plus one."""
    return (batch - 1) * lay.stride + (lay.cols - 1) * lay.ld + lay.rows


def check_spec(g: VendorGemm, tensors: dict[str, Any], inputs: list[str | None], outputs: list[str]) -> None:
    """What a vendor record means against its step: raises ValueError with the reason (the
    engine validator adds where). `tensors`: name -> TensorSpec."""
    if g.library != LIBRARY or g.version != SPEC_VERSION:
        raise ValueError(f"vendor library {g.library!r} version {g.version}; runs {LIBRARY} v{SPEC_VERSION}")
    if g.act not in ACTS:
        raise ValueError(f"activation {g.act!r} is not one of {ACTS}")
    if min(g.m, g.n, g.k, g.batch) < 1 or not 0 <= g.algo_index < ALGO_CANDIDATES:
        raise ValueError(f"M={g.m} N={g.n} K={g.k} batch={g.batch} algo_index={g.algo_index}")
    if g.gelu_from_erf and g.act != "gelu_tanh":
        raise ValueError("gelu_from_erf without a GELU")
    if outputs != [g.d]:
        raise ValueError(f"writes {g.d!r}; the step's outputs are {outputs}")
    ins = set(n for n in inputs if n is not None)
    for what, name in (("A", g.a), ("B", g.b), ("C", g.c), ("bias", g.bias)):
        if name is not None and name not in ins:
            raise ValueError(f"its {what} '{name}' is not an input of the step")
    if g.c is None and g.beta != 0.0:
        raise ValueError(f"beta {g.beta} without C")
    if not all(math.isfinite(x) for x in (g.alpha, g.beta)):
        raise ValueError("alpha or beta is not finite")
    dt = {n: tensors[n].dtype for n in g.tensors()}
    if dt[g.a] not in IN_DTYPES or dt[g.b] != dt[g.a]:
        raise ValueError(f"A and B of {dt[g.a]} and {dt[g.b]} (cuBLASLt runs {' or '.join(IN_DTYPES)}, both alike)")
    if dt[g.d] not in OUT_DTYPES or (dt[g.d] != "float32" and dt[g.d] != dt[g.a]):
        raise ValueError(f"D of {dt[g.d]} from {dt[g.a]} operands")
    for what, name in (("C", g.c), ("bias", g.bias)):
        if name is not None and dt[name] != dt[g.d]:
            raise ValueError(f"its {what} is {dt[name]}, D is {dt[g.d]} (cuBLASLt takes them alike)")
    call = lt_call(g)
    for lay in (call.a, call.b, call.d, *([call.c] if call.c else [])):
        size = math.prod(tensors[lay.buffer].shape)
        if lay.stride < 0 or _span(lay, g.batch) > size:
            raise ValueError(f"'{lay.buffer}' has {size} elements; the GEMM reads {_span(lay, g.batch)}")
    d_size = math.prod(tensors[g.d].shape)
    if g.batch * g.m * g.n != d_size or (g.batch > 1 and g.d_stride != g.m * g.n):
        raise ValueError(f"D '{g.d}' of {d_size} elements is not {g.batch} x {g.m} x {g.n} packed")
    if g.bias is not None:
        want = g.n if g.bias_stride == 0 else g.batch * g.n
        if math.prod(tensors[g.bias].shape) != want or g.bias_stride not in (0, g.n):
            raise ValueError(
                f"bias '{g.bias}' is not {'a vector' if g.bias_stride == 0 else 'a vector per batch'} of N={g.n}"
            )


def emulate(call: LtCall, buffers: dict[str, np.ndarray], alpha: float, beta: float, bias: np.ndarray | None,
            act: str, d_dtype: Any, bias_stride: int = 0) -> np.ndarray:  # fmt: skip
    """What cublasLtMatmul computes for `call`, in numpy, reading each flat buffer column-major
    exactly as the layouts say (the tests' model of the real call): D' as a flat array."""

    def mat(lay: Layout, i: int) -> np.ndarray:
        flat = buffers[lay.buffer].reshape(-1)
        idx = i * lay.stride + np.arange(lay.rows)[:, None] + np.arange(lay.cols)[None, :] * lay.ld
        return flat[idx].astype(np.float32)

    d = call.d
    out = np.zeros(_span(d, call.batch), dtype=np.float32)
    for i in range(call.batch):
        a = mat(call.a, i)
        b = mat(call.b, i)
        a = a.T if call.trans_a == _OP_T else a
        b = b.T if call.trans_b == _OP_T else b
        acc = alpha * (a @ b)
        if call.c is not None:
            acc = acc + beta * mat(call.c, i)
        if bias is not None:
            v = bias.reshape(-1)[i * bias_stride :][: d.rows].astype(np.float32)
            acc = acc + v[:, None]  # over D's rows: graphc's columns
        if act == "relu":
            acc = np.maximum(acc, 0)
        elif act == "gelu_tanh":
            acc = gelu_tanh(acc)
        idx = i * d.stride + np.arange(d.rows)[:, None] + np.arange(d.cols)[None, :] * d.ld
        out[idx] = acc
    return out.astype(d_dtype)


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1 + np.tanh(np.float32(math.sqrt(2 / math.pi)) * (x + np.float32(0.044715) * x**3)))


# ---- loading the library ---------------------------------------------------------------------------


def missing_library_error(n_steps: int, why: str) -> EngineError:
    return EngineError(
        f"this engine runs {n_steps} GEMM step(s) through cuBLASLt (compiled with --tactics cublaslt), "
        f"which needs nvmath-python and libcublasLt ({why}): {PIP}"
    )


_PRELOADED: list[str] = []


def _so_version(path: str) -> tuple[int, ...]:
    tail = path.rsplit(".so", 1)[-1].strip(".")
    return tuple(int(x) for x in tail.split(".") if x.isdigit())


def _preload_cublaslt() -> list[str]:
    """Load the newest libcublasLt beside the Python packages (the nvidia-cublas wheel: nvidia/cu13/lib
    for CUDA 13, nvidia/cublas/lib for CUDA 12) with RTLD_GLOBAL, once, before nvmath's first call.
    Why: nvmath-python 0.5 dlopens libcublasLt.so.12 / .so.11 / .so only, while a CUDA 13 image has
    libcublasLt.so.13; but before it dlopens anything it looks each function up in the process's
    global scope (dlsym(RTLD_DEFAULT)), where this load puts them (checked with a stub library
    exporting the 55 functions it looks up). Returns the path loaded ([] for none)."""
    if _PRELOADED:
        return _PRELOADED
    found = set()
    for base in sys.path:
        for pat in ("nvidia/cu1*/lib/libcublasLt.so*", "nvidia/cublas/lib/libcublasLt.so*"):
            found.update(glob.glob(os.path.join(base, pat)))
    for path in sorted(found, key=_so_version, reverse=True):
        try:
            ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        except OSError:
            continue
        _PRELOADED.append(path)
        break
    return _PRELOADED


def _bindings_alone() -> Any:
    """nvmath.bindings.cublasLt without nvmath's package __init__, or None where nvmath is not
    installed. `import nvmath` imports its high-level modules too (linalg needs cuda-core < 0.4,
    which an image with nvmath installed --no-deps may lack); the bindings need none of that. The
    two parent packages are made as bare package modules over nvmath's own folders."""
    import importlib
    import importlib.util
    import types

    spec = importlib.util.find_spec("nvmath") if "nvmath" not in sys.modules else None
    if spec is None or not spec.submodule_search_locations:
        return None
    root = list(spec.submodule_search_locations)[0]
    for name, path in (("nvmath", root), ("nvmath.bindings", os.path.join(root, "bindings"))):
        mod = types.ModuleType(name)
        mod.__path__ = [path]
        sys.modules[name] = mod
    try:
        return importlib.import_module("nvmath.bindings.cublasLt")
    except ImportError:
        for name in ("nvmath", "nvmath.bindings"):
            sys.modules.pop(name, None)
        return None


def import_cublaslt(n_steps: int) -> Any:
    """nvmath.bindings.cublasLt with its library loaded, or the one-line error naming it."""
    try:
        from nvmath.bindings import cublasLt as lt
    except ImportError as e:
        lt = _bindings_alone()
        if lt is None:
            raise missing_library_error(n_steps, f"nvmath-python is not installed: {e}") from None
        log.info("nvmath's package import failed (%s); its cublasLt bindings loaded alone", e)
    loaded = _preload_cublaslt()
    try:
        lt.get_version()
    except Exception as e:
        where = f" (loaded {loaded[0]})" if loaded else " (no nvidia-cublas wheel found)"
        raise missing_library_error(n_steps, f"libcublasLt did not load{where}: {e}") from None
    return lt


def _set(setter: Any, obj: int, attr: Any, value: Any, dtype: Any) -> None:
    buf = np.array([value], dtype=dtype)
    setter(obj, int(attr), buf.ctypes.data, buf.itemsize)


def _alignment(ptr: int) -> int:
    return min(256, ptr & -ptr) if ptr else 256


class CublasLtStep:
    """One vendor step in one context: descriptors, layouts and the chosen algorithm, built once;
    a call is one cublasLtMatmul on the context's stream."""

    def __init__(self, lt: Any, handle: int, g: VendorGemm, views: dict[str, Any], dtypes: dict[str, str], name: str):
        self.lt, self.handle, self.name, self.g = lt, handle, name, g
        call = self.call = lt_call(g)
        A = lt.MatmulDescAttribute
        L = lt.MatrixLayoutAttribute
        P = lt.MatmulPreferenceAttribute
        self.ptrs = {n: int(views[n].data.ptr) for n in g.tensors()}
        self.desc = lt.matmul_desc_create(_COMPUTE_32F, _CUDA_R["float32"])
        _set(lt.matmul_desc_set_attribute, self.desc, A.TRANSA, call.trans_a, np.int32)
        _set(lt.matmul_desc_set_attribute, self.desc, A.TRANSB, call.trans_b, np.int32)
        _set(lt.matmul_desc_set_attribute, self.desc, A.EPILOGUE, call.epilogue, np.uint32)
        if g.bias is not None:
            _set(lt.matmul_desc_set_attribute, self.desc, A.BIAS_POINTER, self.ptrs[g.bias], np.int64)
            if g.bias_stride:
                _set(lt.matmul_desc_set_attribute, self.desc, A.BIAS_BATCH_STRIDE, g.bias_stride, np.int64)

        def layout(lay: Layout) -> int:
            h = lt.matrix_layout_create(_CUDA_R[dtypes[lay.buffer]], lay.rows, lay.cols, lay.ld)
            if g.batch > 1:
                _set(lt.matrix_layout_set_attribute, h, L.BATCH_COUNT, g.batch, np.int32)
                _set(lt.matrix_layout_set_attribute, h, L.STRIDED_BATCH_OFFSET, lay.stride, np.int64)
            return h

        self.la, self.lb, self.ld = layout(call.a), layout(call.b), layout(call.d)
        self.lc = layout(call.c) if call.c is not None else self.ld
        pref = lt.matmul_preference_create()
        try:
            _set(lt.matmul_preference_set_attribute, pref, P.MAX_WORKSPACE_BYTES, MAX_WORKSPACE_BYTES, np.uint64)
            for attr, buf in (
                (P.MIN_ALIGNMENT_A_BYTES, g.b), (P.MIN_ALIGNMENT_B_BYTES, g.a),
                (P.MIN_ALIGNMENT_C_BYTES, g.c or g.d), (P.MIN_ALIGNMENT_D_BYTES, g.d),
            ):  # fmt: skip
                _set(lt.matmul_preference_set_attribute, pref, attr, _alignment(self.ptrs[buf]), np.uint32)
            self.results = lt.MatmulHeuristicResult(ALGO_CANDIDATES)
            count = np.zeros(1, dtype=np.int32)
            lt.matmul_algo_get_heuristic(
                handle, self.desc, self.la, self.lb, self.lc, self.ld, pref, ALGO_CANDIDATES,
                self.results.ptr, count.ctypes.data,
            )  # fmt: skip
        except Exception as e:
            raise EngineError(f"step '{name}': cuBLASLt has no algorithm for this GEMM: {e}") from None
        finally:
            lt.matmul_preference_destroy(pref)
        n = int(count[0])
        if n == 0:
            raise EngineError(f"step '{name}': cuBLASLt's heuristic returned no algorithm for this GEMM")
        index = g.algo_index
        if index >= n:
            log.info("step '%s': algorithm %d recorded, the heuristic has %d here; its first taken", name, index, n)
            index = 0
        self.index = index
        data = self.results._data
        self.algo_ptr = int(self.results.ptr) + index * data.dtype.itemsize  # the algo struct leads each result
        self.workspace_bytes = int(data["workspace_size"][index])
        if self.workspace_bytes and call.epilogue != _EPILOGUE[("none", False)]:
            self.workspace_bytes += 16  # as nvmath's own matmul does with an epilogue ("library issue")
        self.alpha = np.array([g.alpha], dtype=np.float32)
        self.beta = np.array([g.beta if g.c is not None else 0.0], dtype=np.float32)
        self.workspace_ptr = 0
        self.stream_ptr = 0

    def bind(self, workspace_ptr: int, stream_ptr: int) -> None:
        self.workspace_ptr, self.stream_ptr = workspace_ptr, stream_ptr

    def __call__(self, *_launch: Any, shared_mem: int = 0, stream: Any = None) -> None:
        # called as a cupy kernel launch is (CUDAContext.launch_all); only the stream matters: the
        # context's, which a host-If context may have changed since load (host_if_cuda.set_stream)
        g, p = self.g, self.ptrs
        stream_ptr = int(stream.ptr) if stream is not None else self.stream_ptr
        c_ptr = p[g.c] if g.c is not None else p[g.d]
        self.lt.matmul(
            self.handle, self.desc, self.alpha.ctypes.data, p[g.b], self.la, p[g.a], self.lb,
            self.beta.ctypes.data, c_ptr, self.lc, p[g.d], self.ld, self.algo_ptr,
            self.workspace_ptr, self.workspace_bytes, stream_ptr,
        )  # fmt: skip

    def destroy(self) -> None:
        lt = self.lt
        for h in {self.la, self.lb, self.lc, self.ld}:
            lt.matrix_layout_destroy(h)
        lt.matmul_desc_destroy(self.desc)


def vendor_steps(plan: Any) -> list[Any]:
    return [s for s in plan.steps if getattr(s, "vendor", None)]


class VendorSteps:
    """The vendor steps of one execution context: one cuBLASLt handle, one workspace (the most
    any chosen algorithm needs), a callable per step name."""

    def __init__(self, plan: Any, views: dict[str, Any], stream: Any, cupy: Any):
        steps = vendor_steps(plan)
        self.calls: dict[str, CublasLtStep] = {}
        self.handle = 0
        if not steps:
            return
        lt = self.lt = import_cublaslt(len(steps))
        self.handle = lt.create()  # on the current device (the context's)
        dtypes = {n: t.dtype for n, t in plan.tensors.items()}
        for s in steps:
            self.calls[s.name] = CublasLtStep(lt, self.handle, VendorGemm.from_json(s.vendor), views, dtypes, s.name)
        need = max(c.workspace_bytes for c in self.calls.values())
        self.workspace = cupy.empty(max(need, 1), dtype=cupy.uint8)
        for c in self.calls.values():
            c.bind(int(self.workspace.data.ptr), int(stream.ptr))
        # One call of each before any capture: cuBLASLt loads its kernels on first use, which is
        # then not inside a stream capture, and a call the library refuses fails here, at load.
        # It writes only the steps' outputs, arena bytes that every run writes before reading.
        for name, c in self.calls.items():
            try:
                c(stream=stream)
            except Exception as e:
                raise EngineError(f"step '{name}': cublasLtMatmul failed: {e}") from None
        stream.synchronize()
        log.info("%d GEMM step(s) through cuBLASLt %s, %d bytes of workspace", len(steps), lt.get_version(), need)

    def describe(self) -> list[dict[str, Any]]:
        return [{"step": n, "algo_index": c.index, "workspace_bytes": c.workspace_bytes} for n, c in self.calls.items()]

    def __del__(self) -> None:
        try:
            for c in self.calls.values():
                c.destroy()
            if self.handle:
                self.lt.destroy(self.handle)
        except Exception:  # interpreter shutdown: the library may be gone already
            pass


__all__ = [
    "ACTS",
    "LIBRARY",
    "VendorGemm",
    "VendorSteps",
    "check_spec",
    "emulate",
    "import_cublaslt",
    "lt_call",
]
