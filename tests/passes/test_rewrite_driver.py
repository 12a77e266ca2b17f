"""The one rewrite driver (passes/rewrite.py rewrite_graph): substitution, provenance, undo of a
declining visitor, DROP, near misses, and identity when nothing changed."""

from __future__ import annotations

import numpy as np

import graphc
from graphc.ir.equality import assert_structurally_equal
from graphc.ir.provenance import origins_of
from graphc.ir.text import parse_graph
from graphc.passes.rewrite import DROP, Rewritten, rewrite_graph

BEFORE = """
graph g (opset 17)
  input  %x: f32[4]
  %a: f32[4] = Neg[neg](%x)
  %b: f32[4] = Neg[neg2](%a)
  %y: f32[4] = Relu[relu](%b)
  output %y: f32[4]
"""


def test_replacement_substitutes_and_records_provenance():
    g = parse_graph(BEFORE)

    def visit(node, ctx):
        if node.name != "neg2":
            return None
        # neg(neg(x)) -> x, standing for both Negs.
        return Rewritten([ctx.mapv(g.inputs[0])], (g.node("neg"), node))

    out = rewrite_graph(g, visit)
    expected = """
    graph g (opset 17)
      input  %x: f32[4]
      %y: f32[4] = Relu[relu](%x)
      output %y: f32[4]
    """
    assert_structurally_equal(out, parse_graph(expected))  # the first Neg became dead: DCE took it
    x = np.array([-1, 2, -3, 4], np.float32)
    np.testing.assert_array_equal(graphc.interpret(out, {"x": x})["y"], np.maximum(x, 0))


def test_new_nodes_carry_the_origins_of_what_they_replace():
    g = parse_graph(BEFORE)

    def visit(node, ctx):
        if node.name != "relu":
            return None
        y = ctx.b.op("Max", [ctx.mapv(node.inputs[0]), ctx.b.add_constant(np.zeros((), np.float32), "zero")])
        return Rewritten([y], (g.node("neg2"), node))

    out = rewrite_graph(g, visit)
    (mx,) = [n for n in out.nodes if n.op == "Max"]
    assert origins_of(out, mx.name) == ("neg2", "relu")
    assert origins_of(out, "neg") == ("neg",)  # kept nodes stand for themselves


def test_a_declining_visitor_leaves_nothing_behind():
    g = parse_graph(BEFORE)

    def visit(node, ctx):
        if node.name == "neg":
            # Builds a constant and a node, then declines.
            ctx.b.add_constant(np.ones(4, np.float32), "scratch")
            ctx.b.op("Abs", [ctx.mapv(node.inputs[0])], name="scratch_abs")
            return None
        if node.name == "neg2":
            # Names freed by the undo are free again.
            v = ctx.b.add_constant(np.full(4, 2, np.float32), "scratch", keep_name=True)
            y = ctx.b.add_node("Mul", [ctx.mapv(node.inputs[0]), v], name="scratch_abs", keep_name=True)
            return Rewritten(y.outputs, (node,))
        return None

    assert rewrite_graph(g, lambda n, c: visit(n, c) if n.name == "neg" else None) is g
    out = rewrite_graph(g, visit, dce=False)  # no dead code elimination to hide leftovers
    assert [n.name for n in out.nodes] == ["neg", "scratch_abs", "relu"]
    assert list(out.constants) == ["scratch"] and out.constants["scratch"].data[0] == 2


def test_drop_and_near_misses():
    g = parse_graph(BEFORE.replace("  output", "  %dead: f32[4] = Abs[dead](%x)\n  output"))

    def visit(node, ctx):
        return DROP if node.name == "dead" else None

    out = rewrite_graph(g, visit, near_misses=["a miss"])
    assert [n.name for n in out.nodes] == ["neg", "neg2", "relu"]
    assert list(out.meta["near_misses"]) == ["a miss"]
    # Only a near miss, nothing rewritten: the same nodes, the miss recorded once.
    again = rewrite_graph(out, lambda n, c: None, near_misses=["a miss", "another"])
    assert again.nodes == out.nodes and list(again.meta["near_misses"]) == ["a miss", "another"]
    assert rewrite_graph(again, lambda n, c: None, near_misses=["another"]) is again
