"""The fused node: an anchor op plus an epilogue DAG of elementwise ops.

One representation for every combination (conv+bias+relu, matmul+bias+gelu+residual, a chain of
elementwise ops...), never one class per combination:

    Fused(inputs)  = outputs
      acc          = anchor_op(inputs[0:anchor_inputs])           (acc = inputs[0] if no anchor)
      e_j          = epilogue[j].op(args...)  where each arg is acc, an input, or an earlier e_k
      outputs      = the refs listed in `outputs`

This module holds the IR form (attrs classes); graphc.ops.fused registers the op, whose inference
and numpy reference run the anchor's and the epilogue ops' own definitions, so a fused node means
exactly what the nodes it replaced meant. Codegen renders the epilogue into a template's store hook.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from graphc.ir.attrs import Attrs
from graphc.ir.text import format_attr

FUSED_DOMAIN = "graphc"


@dataclass(frozen=True)
class Ref:
    """An argument of an epilogue op: the anchor's result, a node input, or an earlier op."""

    kind: str  # "acc" | "in" | "op"
    index: int = 0

    def __str__(self) -> str:
        return "acc" if self.kind == "acc" else f"{self.kind}{self.index}"


ACC = Ref("acc")


def IN(i: int) -> Ref:  # noqa: N802 (reads like the notation above)
    return Ref("in", i)


def OP(j: int) -> Ref:  # noqa: N802
    return Ref("op", j)


@dataclass(frozen=True)
class EpilogueOp:
    op: str
    attrs: Attrs
    args: tuple[Ref, ...]

    def __str__(self) -> str:
        items = self.attrs.non_default_items()
        a = "" if not items else "{" + ", ".join(f"{k}={format_attr(v)}" for k, v in items) + "}"
        return f"{self.op}({', '.join(str(r) for r in self.args)}){a}"


@dataclass(frozen=True, kw_only=True)
class FusedAttrs(Attrs):
    anchor_op: str | None = None
    anchor_domain: str = ""
    anchor_attrs: Attrs | None = None
    anchor_inputs: int = 0
    epilogue: tuple[EpilogueOp, ...] = ()
    outputs: tuple[Ref, ...] = field(default_factory=tuple)

    def kind_name(self) -> str:
        return f"Fused[{self.anchor_op or 'Elementwise'}]"

    def text(self) -> str:
        parts = []
        if self.anchor_op:
            items = self.anchor_attrs.non_default_items() if self.anchor_attrs else []
            a = ", ".join(f"{k}={format_attr(v)}" for k, v in items)
            op = f"{self.anchor_domain}.{self.anchor_op}" if self.anchor_domain else self.anchor_op
            parts.append(f"anchor={op}(in0..in{self.anchor_inputs - 1}){{{a}}}")
        parts += [f"op{j}={e}" for j, e in enumerate(self.epilogue)]
        parts.append("out=" + ",".join(str(r) for r in self.outputs))
        return "; ".join(parts)

    def __post_init__(self) -> None:
        super().__post_init__()
        for j, e in enumerate(self.epilogue):
            for r in e.args:
                if r.kind == "op" and r.index >= j:
                    raise ValueError(f"epilogue op {j} uses op{r.index}, which is not before it")
                if r.kind == "acc" and self.anchor_op is None:
                    raise ValueError("an elementwise-only fused node has no acc")
        if not self.outputs:
            raise ValueError("a fused node needs at least one output")
