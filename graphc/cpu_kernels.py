"""Kernels of the CPU target: the ops' numpy references, rebuilt from a plan step."""

from __future__ import annotations

from graphc.ir.attrs import attrs_from_json
from graphc.ops.registry import get_op
from graphc.runtime.plan import Step


def cpu_kernel(step: Step):
    opdef = get_op(step.op, step.domain)
    attrs = attrs_from_json(opdef.attrs, step.attrs)
    n_out = len(step.outputs)

    def run(inputs):
        return opdef.compute(inputs, attrs, n_out)

    return run
