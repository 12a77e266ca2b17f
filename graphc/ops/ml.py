"""ai.onnx.ml ops graphc computes itself (Binarizer and ArrayFeatureExtractor are converted onto
standard ops: graphc/frontend/converters/ml.py): TreeEnsemble (opset 5), type inference with
one-line errors; the numpy reference is graphc.runtime.reference.ml. No CUDA kernel."""

from __future__ import annotations

from graphc.ir.types import DType, TensorType
from graphc.ops.registry import Category, InferContext, register_op
from graphc.runtime.reference.ml import ML

_FLOATS = (DType.float16, DType.float32, DType.float64)


def _tree_ensemble_infer(ctx: InferContext) -> list[TensorType]:
    x = ctx.type(0)
    a = ctx.attrs
    if x.dtype not in _FLOATS:
        ctx.fail(f"X is {x.dtype.name}; TreeEnsemble takes float16, float or double")
    if x.shape is not None and len(x.shape) != 2:
        ctx.fail(f"X {x} must be [N, features]")
    n = len(a.nodes_featureids)
    lists = {
        "nodes_truenodeids": a.nodes_truenodeids,
        "nodes_falsenodeids": a.nodes_falsenodeids,
        "nodes_trueleafs": a.nodes_trueleafs,
        "nodes_falseleafs": a.nodes_falseleafs,
    }
    sizes = {k: len(v) for k, v in lists.items()}
    sizes["nodes_modes"] = a.nodes_modes.array.size
    sizes["nodes_splits"] = a.nodes_splits.array.size
    bad = {k: s for k, s in sizes.items() if s != n}
    if bad:
        ctx.fail(f"nodes_featureids has {n} entries, but {bad}")
    leaves = len(a.leaf_targetids)
    if a.leaf_weights.array.size != leaves:
        ctx.fail(f"leaf_targetids has {leaves} entries, leaf_weights {a.leaf_weights.array.size}")
    if int(a.post_transform) != 0:
        ctx.fail(f"post_transform {a.post_transform}: graphc computes NONE (0) only, as ONNX's reference does")
    if int(a.aggregate_function) not in (0, 1, 2, 3):
        ctx.fail(f"aggregate_function {a.aggregate_function} is not 0..3")
    n_targets = int(a.n_targets or 0)
    if n_targets < 1 or any(not 0 <= t < n_targets for t in a.leaf_targetids):
        ctx.fail(f"n_targets {n_targets}: leaf_targetids must lie in [0, n_targets)")
    for i in range(n):
        for succ, is_leaf in (
            (a.nodes_truenodeids[i], a.nodes_trueleafs[i]),
            (a.nodes_falsenodeids[i], a.nodes_falseleafs[i]),
        ):
            if not 0 <= succ < (leaves if is_leaf else n):
                ctx.fail(f"node {i}'s successor {succ} is not a {'leaf' if is_leaf else 'node'} index")
    if any(not 0 <= r < n for r in a.tree_roots):
        ctx.fail(f"tree_roots {list(a.tree_roots)} must be node indices below {n}")
    features = x.shape[1] if x.shape is not None else None
    if isinstance(features, int) and any(not 0 <= f < features for f in a.nodes_featureids):
        ctx.fail(f"nodes_featureids must be below X's {features} features")
    return [TensorType(x.dtype, (x.shape[0] if x.shape is not None else None, n_targets))]


register_op("TreeEnsemble", domain=ML, category=Category.OTHER, infer=_tree_ensemble_infer)
