"""ai.onnx.ml TreeEnsemble (opset 5): every row of X through every tree at once, as ONNX defines it.

Interior node i tests X[row, nodes_featureids[i]] against nodes_splits[i] by nodes_modes[i] (LEQ,
LT, GTE, GT, EQ, NEQ, or MEMBER: in the node's set, the NaN-separated runs of membership_values in
node index order, as the spec says; ONNX's reference takes them in its build order, the same for
trees numbered depth-first); a NaN feature goes the true way where nodes_missing_value_tracks_true[i]. The true /
false successor is nodes_truenodeids / nodes_falsenodeids, a leaf index where nodes_trueleafs /
nodes_falseleafs say so (a root whose both successors are the same leaf is that leaf). A leaf adds
leaf_weights to output column leaf_targetids (ONNX's reference reads a leaf root's weight at the
root's node index; graphc at the leaf both successors name); the trees' values are aggregated per column (SUM,
AVERAGE: each tree's value / number of trees summed in tree order, MIN, MAX) in X's dtype.
ONNX's reference ignores post_transform; graphc computes NONE only and refuses the others.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from graphc.runtime.reference.registry import register_kernel

ML = "ai.onnx.ml"
LEQ, LT, GTE, GT, EQ, NEQ, MEMBER = range(7)
SUM, AVERAGE, MIN, MAX = 1, 0, 2, 3


def _arr(v: Any) -> np.ndarray | None:
    return None if v is None else np.asarray(getattr(v, "array", v))


def member_sets(modes: np.ndarray, values: np.ndarray | None) -> dict[int, np.ndarray]:
    """Node index -> its MEMBER set (runs of membership_values ended by NaN, in node order)."""
    members = [i for i, m in enumerate(modes.tolist()) if m == MEMBER]
    if not members:
        return {}
    if values is None:
        raise ValueError("set-membership nodes without membership_values")
    runs, cur = [], []
    for v in values.tolist():
        if np.isnan(v):
            runs.append(np.asarray(cur))
            cur = []
        else:
            cur.append(v)
    if len(runs) != len(members):
        raise ValueError(f"{len(members)} set-membership node(s), membership_values holds {len(runs)} set(s)")
    return dict(zip(members, runs, strict=True))


def tree_ensemble(ins: list, attrs: Any, n_out: int) -> list[np.ndarray]:
    x = ins[0]
    rows = x.shape[0]
    modes = _arr(attrs.nodes_modes).astype(np.int64).reshape(-1)
    splits = _arr(attrs.nodes_splits).astype(np.float64).reshape(-1)
    feat = np.asarray(attrs.nodes_featureids, np.int64)
    t_ids, f_ids = np.asarray(attrs.nodes_truenodeids, np.int64), np.asarray(attrs.nodes_falsenodeids, np.int64)
    t_leaf, f_leaf = np.asarray(attrs.nodes_trueleafs, bool), np.asarray(attrs.nodes_falseleafs, bool)
    mtt = np.asarray(attrs.nodes_missing_value_tracks_true or [0] * len(modes), bool)
    weights = _arr(attrs.leaf_weights).reshape(-1)
    targets = np.asarray(attrs.leaf_targetids, np.int64)
    sets = member_sets(modes, _arr(attrs.membership_values))
    if int(attrs.post_transform) != 0:
        raise ValueError(f"post_transform {attrs.post_transform} (graphc computes NONE only, as ONNX's reference)")
    n_targets, agg = int(attrs.n_targets), int(attrs.aggregate_function)
    roots = [int(r) for r in attrs.tree_roots]
    xf = x.astype(np.float64)
    if agg in (SUM, AVERAGE):
        out = np.zeros((rows, n_targets), x.dtype)
    elif agg == MIN:
        out = np.full((rows, n_targets), np.finfo(x.dtype).max, x.dtype)
    elif agg == MAX:
        out = np.full((rows, n_targets), np.finfo(x.dtype).min, x.dtype)
    else:
        raise ValueError(f"aggregate_function {agg} is not AVERAGE (0), SUM (1), MIN (2) or MAX (3)")
    every = np.arange(rows)
    for root in roots:
        if t_leaf[root] and f_leaf[root] and t_ids[root] == f_ids[root]:
            leaf = np.full(rows, t_ids[root], np.int64)  # the root is that leaf
        else:
            node = np.full(rows, root, np.int64)
            leaf = np.full(rows, -1, np.int64)
            active = every
            for _ in range(len(modes) + 1):  # a path visits each node at most once
                if active.size == 0:
                    break
                nd = node[active]
                v = xf[active, feat[nd]]
                s, m = splits[nd], modes[nd]
                go = np.select(
                    [m == LEQ, m == LT, m == GTE, m == GT, m == EQ, m == NEQ],
                    [v <= s, v < s, v >= s, v > s, v == s, v != s],
                    default=False,
                )
                for i in np.unique(nd[m == MEMBER]).tolist():
                    hit = nd == i
                    go[hit] = np.isin(v[hit], sets[i])
                go |= np.isnan(v) & mtt[nd]
                nxt = np.where(go, t_ids[nd], f_ids[nd])
                done = np.where(go, t_leaf[nd], f_leaf[nd])
                leaf[active[done]] = nxt[done]
                node[active] = nxt
                active = active[~done]
            else:
                raise ValueError(f"tree {root} has a cycle")
        w = weights[leaf].astype(x.dtype)
        col = targets[leaf]
        if agg == SUM:
            np.add.at(out, (every, col), w)
        elif agg == AVERAGE:
            np.add.at(out, (every, col), (w / x.dtype.type(len(roots))).astype(x.dtype))
        elif agg == MIN:
            np.minimum.at(out, (every, col), w)
        else:
            np.maximum.at(out, (every, col), w)
    return [out]


register_kernel("TreeEnsemble", tree_ensemble, domain=ML)
