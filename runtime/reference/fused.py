"""The Fused node's kernel: the anchor's kernel, then the epilogue DAG of elementwise kernels.

It runs the same kernels the unfused nodes ran, so a fused node computes exactly what the nodes
it replaced computed. `attrs` is the IR's FusedAttrs in the interpreter and a decoded record in a
CPU engine; both have anchor_op, anchor_domain, anchor_attrs, anchor_inputs, epilogue (op, attrs,
args) and outputs, where an argument is a ref of kind "acc", "in" or "op" with an index.
"""

from __future__ import annotations

from typing import Any

from graphc.runtime.reference.registry import get_kernel, register_kernel

FUSED_DOMAIN = "graphc"


def resolve(ref: Any, acc: Any, inputs: list[Any], results: list[Any]) -> Any:
    if ref.kind == "acc":
        return acc
    if ref.kind == "in":
        return inputs[ref.index]
    return results[ref.index]


def _fused_compute(inputs: list[Any], a: Any, n: int) -> list[Any]:
    acc = None
    if a.anchor_op is not None:
        acc = get_kernel(a.anchor_op, a.anchor_domain)(list(inputs[: a.anchor_inputs]), a.anchor_attrs, 1)[0]
    results: list = []
    for e in a.epilogue:
        args = [resolve(r, acc, inputs, results) for r in e.args]
        results.append(get_kernel(e.op)(args, e.attrs, 1)[0])
    return [resolve(r, acc, inputs, results) for r in a.outputs]


register_kernel("Fused", _fused_compute, domain=FUSED_DOMAIN)
