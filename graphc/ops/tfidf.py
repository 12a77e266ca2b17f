"""TfIdfVectorizer (opset 9) on integer inputs: type inference with one-line errors; the numpy
reference is graphc.runtime.reference.tfidf. String pools and inputs are not supported (graphc has
no string tensors); there is no CUDA kernel (`graphc check --target cuda` says so)."""

from __future__ import annotations

from graphc.ir.types import DType, TensorType
from graphc.ops.registry import Category, InferContext, register_op
from graphc.runtime.reference.tfidf import tfidf_output_size


def _tfidf_infer(ctx: InferContext) -> list[TensorType]:
    x = ctx.type(0)
    a = ctx.attrs
    if x.dtype not in (DType.int32, DType.int64):
        ctx.fail(f"X is {x.dtype.name}: graphc's TfIdfVectorizer takes int32 or int64 (no string tensors)")
    if a.pool_strings:
        ctx.fail("pool_strings: graphc has no string tensors (pool_int64s only)")
    if a.mode not in ("TF", "IDF", "TFIDF"):
        ctx.fail(f"mode {a.mode!r} is not TF, IDF or TFIDF")
    lo, hi = int(a.min_gram_length), int(a.max_gram_length)
    if not 1 <= lo <= hi or a.max_skip_count < 0:
        ctx.fail(f"gram lengths {lo}..{hi} and max_skip_count {a.max_skip_count} must be 1 <= min <= max, skip >= 0")
    if not a.ngram_indexes or min(a.ngram_indexes) < 0:
        ctx.fail(f"ngram_indexes {list(a.ngram_indexes or ())} must be non-empty and >= 0")
    counts, pool = list(a.ngram_counts or ()), list(a.pool_int64s or ())
    if (
        not counts
        or counts[0] != 0
        or any(b < c for c, b in zip(counts, counts[1:], strict=False))
        or counts[-1] > len(pool)
    ):
        ctx.fail(f"ngram_counts {counts} must start at 0 and rise within the pool's {len(pool)} entries")
    grams = sum((((counts[i + 1] if i + 1 < len(counts) else len(pool)) - c) // (i + 1)) for i, c in enumerate(counts))
    if grams != len(a.ngram_indexes):
        ctx.fail(f"the pool holds {grams} n-grams, ngram_indexes has {len(a.ngram_indexes)} entries")
    size = tfidf_output_size(a)
    if a.weights and len(a.weights) != size:
        ctx.fail(f"weights has {len(a.weights)} entries, the output has {size} columns")
    if x.shape is not None and len(x.shape) > 2:
        ctx.fail(f"X {x} must be [C] or [B, C]")
    if x.shape is not None and len(x.shape) == 2:
        return [TensorType(DType.float32, (x.shape[0], size))]
    return [TensorType(DType.float32, (size,))]


register_op("TfIdfVectorizer", category=Category.OTHER, infer=_tfidf_infer)
