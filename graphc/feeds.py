"""Inputs for `graphc run` / `graphc bench`: reading them from files, drawing random ones, and
checking integer inputs against the index ranges of the ops they feed (a token id beyond the
vocabulary would read past an embedding table: on the GPU, garbage or a crash)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from graphc.errors import InputError

# Ops that pass integer values through unchanged, so the index range of a Gather downstream
# applies to the graph input upstream.
_VALUE_PRESERVING = {"Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Cast", "Expand"}
_INDEX_OPS = {"Gather": 1, "GatherElements": 1}  # op -> position of the indices input


@dataclass(frozen=True)
class IndexRange:
    """Valid values of an integer input: -size <= v < size (ONNX allows negative indices)."""

    size: int
    step: str  # the node it indexes into
    op: str


def index_ranges(plan: Any) -> dict[str, IndexRange]:
    """For each graph input that reaches the indices of a Gather (directly or through views and
    casts), the tightest range among those Gathers."""
    derived: dict[str, str] = {name: name for name in plan.inputs}  # tensor -> the graph input it carries
    ranges: dict[str, IndexRange] = {}
    for step in plan.steps:
        ins = step.inputs
        if (step.alias or step.op in _VALUE_PRESERVING) and ins and ins[0] in derived:
            for out in step.outputs:
                derived[out] = derived[ins[0]]
            continue
        op, domain, attrs = step.op, step.domain, step.attrs or {}
        if op == "Fused" and domain == "graphc":  # a Gather with an epilogue (the positions' add)
            op, domain = attrs.get("anchor_op"), attrs.get("anchor_domain", "")
            attrs = (attrs.get("anchor_attrs") or {}).get("fields", {})
        pos = _INDEX_OPS.get(op)
        if pos is None or domain not in ("", "ai.onnx") or len(ins) <= pos or ins[pos] not in derived:
            continue
        data = plan.tensors.get(ins[0]) if ins[0] else None
        if data is None or not data.shape:
            continue
        axis = int(attrs.get("axis", 0))
        if not -len(data.shape) <= axis < len(data.shape):
            continue
        size = int(data.shape[axis])
        source = derived[ins[pos]]
        if source not in ranges or size < ranges[source].size:
            ranges[source] = IndexRange(size, step.name, op)
    return ranges


def check_index_ranges(engine: Any, feeds: dict[str, Any]) -> None:
    """An InputError naming the input, the value and the op when an index is out of range."""
    for name, rng in index_ranges(engine.plan).items():
        x = feeds.get(name)
        if x is None:
            continue
        a = np.asarray(x)
        if a.size == 0 or a.dtype.kind not in "iu":
            continue
        lo, hi = int(a.min()), int(a.max())
        if lo < -rng.size or hi >= rng.size:
            bad = hi if hi >= rng.size else lo
            where = tuple(int(i) for i in np.argwhere(a == bad)[0])
            raise InputError(
                f"input '{name}' holds {bad} at {list(where)}, out of range for {rng.op} '{rng.step}' "
                f"(valid: {-rng.size}..{rng.size - 1}; the table has {rng.size} rows)"
            )


def random_inputs(engine: Any, seed: int = 0) -> tuple[dict[str, np.ndarray], list[str]]:
    """Random feeds for every input and one line per input saying how it was drawn: floats standard
    normal, integers feeding a Gather uniform over its table, other integers 0 or 1 (masks), bools
    fair coins."""
    from graphc.runtime.cpu import numpy_dtype

    rng = np.random.default_rng(seed)
    ranges = index_ranges(engine.plan)
    feeds: dict[str, np.ndarray] = {}
    notes: list[str] = []
    for spec in engine.inputs:
        dt = numpy_dtype(spec.dtype)
        label = f"{spec.name} {spec.dtype}{list(spec.shape)}"
        if dt.kind == "b":
            feeds[spec.name] = rng.random(spec.shape) < 0.5
            notes.append(f"{label}: True/False, each with probability 0.5")
        elif dt.kind in "iu":
            r = ranges.get(spec.name)
            high = r.size if r else 2
            high = max(1, min(high, int(np.iinfo(dt).max) + 1))  # an empty table still gets valid zeros
            feeds[spec.name] = rng.integers(0, high, size=spec.shape).astype(dt)
            why = f"the rows of {r.op} '{r.step}'" if r else "it feeds no Gather: a mask"
            notes.append(f"{label}: integers uniform in [0, {high}) ({why})")
        else:
            feeds[spec.name] = rng.standard_normal(spec.shape).astype(dt)
            notes.append(f"{label}: standard normal")
    return feeds, notes


def load_inputs(text: str, input_names: list[str]) -> dict[str, np.ndarray]:
    """`--inputs`: an .npz (one array per input name), an .npy (when the engine has one input), or
    trtexec's form NAME:FILE.npy[,NAME:FILE.npy...]. Never unpickled."""
    pairs = _named_files(text, input_names)
    if pairs is not None:
        return {name: _load_npy(path, f"--inputs {name}:{path}") for name, path in pairs}
    path = Path(text)
    if not path.is_file():
        raise InputError(f"--inputs {text}: no such file")
    try:
        loaded = np.load(path, allow_pickle=False)  # never unpickle
    except (OSError, ValueError) as e:
        raise InputError(f"--inputs {text}: not a readable .npz or .npy of arrays ({_first_line(e)})") from None
    if isinstance(loaded, np.ndarray):  # an .npy
        if len(input_names) != 1:
            raise InputError(
                f"--inputs {text}: one array (.npy) for an engine of {len(input_names)} inputs "
                f"({', '.join(input_names)}); give an .npz, or NAME:FILE.npy for each input"
            )
        return {input_names[0]: loaded}
    with loaded as z:
        try:
            return {k: z[k] for k in z.files}
        except (OSError, ValueError) as e:
            raise InputError(f"--inputs {text}: an array could not be read ({_first_line(e)})") from None


def _named_files(text: str, input_names: list[str]) -> list[tuple[str, str]] | None:
    """NAME:FILE pairs, or None when `text` is a single path (which may itself hold a colon)."""
    if Path(text).exists() or ":" not in text:
        return None
    pairs = []
    for part in text.split(","):
        name, sep, path = part.strip().rpartition(":")
        if not sep or not name:
            raise InputError(f"--inputs {text}: '{part}' is not NAME:FILE.npy")
        if name not in input_names:
            raise InputError(f"--inputs: the engine has no input '{name}'; its inputs are {', '.join(input_names)}")
        pairs.append((name, path))
    return pairs


def _load_npy(path: str, what: str) -> np.ndarray:
    if not Path(path).is_file():
        raise InputError(f"{what}: no such file")
    try:
        a = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as e:
        raise InputError(f"{what}: not a readable .npy ({_first_line(e)})") from None
    if not isinstance(a, np.ndarray):
        a.close()
        raise InputError(f"{what}: an .npz; give one .npy per input, or the .npz alone")
    return a


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]
