"""A CUDA engine run without a GPU: tools/fake_cupy.py stands for cupy (host memory, stream capture
recorded and replayed), and each kernel launch runs its step's numpy reference kernel on the
launch's argument arrays. What is real is graphc's own CUDA run path: the executor, contexts,
arena views, copies, captured graphs and the host-side choice of an If's branch. Used by
tests/runtime/test_cuda_host_if.py."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import fake_cupy as F  # noqa: E402

from graphc.runtime.cpu import reference_kernel  # noqa: E402
from graphc.runtime.host_if_cuda import branch_plans, is_host_if  # noqa: E402
from graphc.runtime.plan import KernelPlan, Launch, Step  # noqa: E402


def _steps(plan: KernelPlan, arch: str) -> Iterator[Step]:
    for s in plan.steps:
        if is_host_if(s):
            for _k, sub, _m, _n, _t in branch_plans(s, arch):
                if sub is not None:  # None: a branch refused at run time
                    yield from _steps(sub, arch)
        else:
            yield s


class FakeKernel:
    """A launch of `step`'s kernel: its reference computed from the argument arrays (by position
    in the launch's argument list); inputs that are no argument (baked into the kernel) from the
    engine's weights."""

    def __init__(self, step: Step, launch: Launch, weights: dict[str, np.ndarray]):
        self.name = launch.kernel
        self.ref = reference_kernel(step)
        self.ins = [(launch.args.index(n) if n in launch.args else None, n) for n in step.inputs]
        self.outs = [launch.args.index(n) for n in step.outputs]
        self.weights = weights
        self.calls = 0

    def __call__(self, grid: Any, block: Any, args: tuple, shared_mem: int = 0, stream: Any = None) -> None:
        def op() -> None:
            self.calls += 1
            ins = [None if n is None else (args[i].host() if i is not None else self.weights[n]) for i, n in self.ins]
            for i, val in zip(self.outs, self.ref(ins), strict=True):
                args[i].host()[...] = np.asarray(val).reshape(args[i].shape)

        F.enqueue(op)


def fake_functions(plan: KernelPlan, weights: dict[str, np.ndarray], arch: str) -> dict[str, FakeKernel]:
    """A fake kernel per digest the plan (and its branch sub-plans) launch; one launch per step."""
    out: dict[str, FakeKernel] = {}
    for s in _steps(plan, arch):
        if s.alias or s.vendor is not None:  # a vendor call is no kernel (tests/runtime/fake_cublaslt.py)
            continue
        launches = s.launches_for(arch)
        assert len(launches) == 1, f"the fake runs steps of one launch; {s.name} has {len(launches)}"
        out.setdefault(launches[0].digest, FakeKernel(s, launches[0], weights))
    return out


def fake_executor(monkeypatch: Any, plan: KernelPlan, memory: Any, weights: dict, cubins: dict, names: dict,
                  arch: str = "sm_90") -> Any:  # fmt: skip
    """graphc's CUDAExecutor for `plan` (one arch's), on the fake: cupy is the fake, and its
    kernels are fake kernels instead of loaded cubins."""
    import graphc.runtime.cuda as cuda

    F.MOVE[0] = True
    monkeypatch.setattr(cuda, "import_cupy", lambda: F.cupy)
    functions = fake_functions(plan, weights, arch)
    monkeypatch.setattr(cuda.CUDAExecutor, "_load_functions", lambda self: ({**functions}, []))
    return cuda.CUDAExecutor(plan.for_arch(arch), memory, weights, cubins, names, launch_arch=arch)


def host(outs: dict[str, Any]) -> dict[str, np.ndarray]:
    return {k: v.host().copy() for k, v in outs.items()}
