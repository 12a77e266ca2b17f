"""TfIdfVectorizer (opset 9): counts of the pool's n-grams in each row of an integer input, as ONNX
defines it (its reference's trie walk, written as a lookup of each candidate n-gram).

The pool lists n-grams by length: ngram_counts[i] is where the (i + 1)-grams start, each taking
i + 1 consecutive pool entries; the j-th n-gram of the whole pool has id j + 1 and lands in output
column ngram_indexes[j] (a later duplicate wins). Only lengths in [min_gram_length,
max_gram_length] are looked for. For each skip distance d in 1 .. max_skip_count + 1 and each start
position, the n-grams x[s], x[s + d], ..., of every length from the smallest looked for up to
max_gram_length are counted where they are in the pool (unigrams once, at d = 1). Then TF: the
counts; IDF: weights[col] (1 without weights) where the count is positive; TFIDF: weights[col] *
count (the count without weights). float32 [C] -> [size] or [B, C] -> [B, size].
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from graphc.runtime.reference.registry import register_kernel


def tfidf_output_size(attrs: Any) -> int:
    return int(max(attrs.ngram_indexes)) + 1


def _pool_grams(attrs: Any) -> dict[tuple[int, ...], int]:
    """n-gram (of a length looked for) -> its output column (built once per distinct attribute set:
    a reference engine runs the same node on every call; callers only read it)."""
    return _grams(
        tuple(int(v) for v in attrs.pool_int64s),
        tuple(int(v) for v in attrs.ngram_counts),
        tuple(int(v) for v in attrs.ngram_indexes),
        int(attrs.min_gram_length),
        int(attrs.max_gram_length),
    )


@functools.lru_cache(maxsize=64)
def _grams(
    pool: tuple[int, ...], counts: tuple[int, ...], idx: tuple[int, ...], lo: int, hi: int
) -> dict[tuple[int, ...], int]:
    grams: dict[tuple[int, ...], int] = {}
    gid = 0
    for i, start in enumerate(counts):
        n = i + 1
        end = counts[i + 1] if i + 1 < len(counts) else len(pool)
        for k in range((end - start) // n):
            if lo <= n <= hi:
                grams[pool[start + k * n : start + (k + 1) * n]] = idx[gid]
            gid += 1
    return grams


def tfidf_vectorizer(ins: list, attrs: Any, n_out: int) -> list[np.ndarray]:
    x = ins[0]
    size = tfidf_output_size(attrs)
    rows = x.reshape(1, -1) if x.ndim < 2 else x
    counts = np.zeros((rows.shape[0], size), np.int64)
    grams = _pool_grams(attrs)
    lo, hi, max_skip = int(attrs.min_gram_length), int(attrs.max_gram_length), int(attrs.max_skip_count)
    if grams:
        for r, row in enumerate(rows.tolist()):
            c = len(row)
            first = lo
            for d in range(1, max_skip + 2):
                for s in range(c):
                    if s + d * (first - 1) >= c:
                        break
                    for n in range(first, hi + 1):
                        if s + d * (n - 1) >= c:
                            break
                        col = grams.get(tuple(row[s : s + d * (n - 1) + 1 : d]))
                        if col is not None:
                            counts[r, col] += 1
                if first == 1:  # unigrams are counted once, not again for each skip distance
                    first = 2
                    if first > hi:
                        break
    w = np.asarray(attrs.weights, np.float32) if attrs.weights else None
    if attrs.mode == "TF":
        y = counts.astype(np.float32)
    elif attrs.mode == "IDF":
        y = np.where(counts > 0, w if w is not None else np.float32(1), np.float32(0)).astype(np.float32)
    else:  # TFIDF
        y = (counts * w).astype(np.float32) if w is not None else counts.astype(np.float32)
    return [y.reshape(size) if x.ndim < 2 else y]


register_kernel("TfIdfVectorizer", tfidf_vectorizer)
