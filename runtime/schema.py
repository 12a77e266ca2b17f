"""The typed schema of an engine's manifest.json, checked with msgspec before anything reads it.

Every field has a type (ints are ints, not bools or strings; lists are lists; names are strings),
unknown fields are refused, dtypes, tensor kinds and the target come from closed sets, and every
size is bounded. A manifest that fails becomes one EngineError line naming the field
(`$.plan.steps[3].inputs[0]`). What the fields *mean* together (order, liveness, bounds against
each other) is checked afterwards by graphc.runtime.validate.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

import msgspec

from graphc.runtime.errors import EngineError

# A size no engine field may exceed, whatever the configured memory caps: keeps every later
# product and sum far from overflow in numpy's int64 and far from any real allocation.
MAX_SIZE = 2**50
MAX_RANK = 16
MAX_ARGS = 256

# The dtypes an engine tensor may have (numpy / ml_dtypes names; sub-byte types take a byte each,
# as ml_dtypes stores them). Closed: a name from a manifest never reaches getattr() on a module.
DTYPES = (
    "float32",
    "float16",
    "bfloat16",
    "float64",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "bool",
    "float8_e4m3fn",
    "float8_e4m3fnuz",
    "float8_e5m2",
    "float8_e5m2fnuz",
    "float8_e8m0fnu",
    "float4_e2m1fn",
    "int4",
    "uint4",
    "int2",
    "uint2",
    "complex64",
    "complex128",
)
DType = Literal[DTYPES]  # the same closed set, as the type msgspec checks

Size = Annotated[int, msgspec.Meta(ge=0, le=MAX_SIZE)]
Dim = Annotated[int, msgspec.Meta(ge=0, le=MAX_SIZE)]
Shape = Annotated[list[Dim], msgspec.Meta(max_length=MAX_RANK)]
Name = Annotated[str, msgspec.Meta(min_length=1, max_length=4096)]
Digest = Annotated[str, msgspec.Meta(pattern="^[0-9a-f]{64}$")]
Arch = Annotated[str, msgspec.Meta(pattern="^sm_[0-9]{2,3}a?$")]
Geometry = Annotated[list[Annotated[int, msgspec.Meta(ge=1, le=2**31 - 1)]], msgspec.Meta(min_length=3, max_length=3)]


class _Strict(msgspec.Struct, forbid_unknown_fields=True):
    pass


class TensorDoc(_Strict):
    name: Name
    dtype: DType
    shape: Shape
    nbytes: Size
    kind: Literal["input", "arena", "weight", "alias"] = "arena"
    alias_of: Name | None = None
    alias_offset: Size = 0


class LaunchDoc(_Strict):
    kernel: Annotated[str, msgspec.Meta(pattern="^[A-Za-z_][A-Za-z0-9_]{0,255}$")]
    digest: Digest
    grid: Geometry
    block: Geometry
    args: Annotated[list[Name], msgspec.Meta(max_length=MAX_ARGS)]
    shared_bytes: Annotated[int, msgspec.Meta(ge=0, le=2**20)] = 0
    family: str = ""
    params: dict[str, Any] = {}


class VendorDoc(_Strict):
    """A vendor tactic's GEMM (runtime/tactics_cublaslt.py VendorGemm): a closed library name, the
    problem as data; what it means against the step is checked by runtime/validate.py."""

    library: Literal["cublaslt"]
    version: Annotated[int, msgspec.Meta(ge=1, le=1)]
    m: Annotated[int, msgspec.Meta(ge=1, le=2**31 - 1)]
    n: Annotated[int, msgspec.Meta(ge=1, le=2**31 - 1)]
    k: Annotated[int, msgspec.Meta(ge=1, le=2**31 - 1)]
    a: Name
    b: Name
    d: Name
    batch: Annotated[int, msgspec.Meta(ge=1, le=2**31 - 1)] = 1
    a_trans: bool = False
    b_trans: bool = False
    a_stride: Size = 0
    b_stride: Size = 0
    d_stride: Size = 0
    c: Name | None = None
    c_stride: Size = 0
    beta: float = 0.0
    bias: Name | None = None
    bias_stride: Size = 0
    alpha: float = 1.0
    act: Literal["none", "relu", "gelu_tanh"] = "none"
    gelu_from_erf: bool = False
    algo_index: Annotated[int, msgspec.Meta(ge=0, lt=8)] = 0


class StepDoc(_Strict):
    index: Annotated[int, msgspec.Meta(ge=0)]
    name: str
    kind: str
    op: Annotated[str, msgspec.Meta(min_length=1, max_length=256)]
    domain: str
    # The node's attrs as JSON objects of plain values; decoded through the runtime's closed table.
    attrs: dict[str, Any]
    inputs: Annotated[list[Name | None], msgspec.Meta(max_length=MAX_ARGS)]
    outputs: Annotated[list[Name], msgspec.Meta(max_length=MAX_ARGS)]
    alias: bool = False
    origins: list[str] = []
    inplace: list[Annotated[int, msgspec.Meta(ge=0, lt=MAX_ARGS)]] = []
    workspace_bytes: Size = 0
    launches: Annotated[list[LaunchDoc], msgspec.Meta(max_length=64)] = []
    # the launches of an arch whose kernels differ from the default ones (sm_90a kernels for sm_90)
    arch_launches: dict[Arch, Annotated[list[LaunchDoc], msgspec.Meta(min_length=1, max_length=64)]] = {}
    # a vendor library call instead of launches (docs/tactics.md); engines before it have none
    vendor: VendorDoc | None = None


class PlanDoc(_Strict):
    tensors: dict[Name, TensorDoc]
    steps: list[StepDoc]
    inputs: list[Name]
    outputs: Annotated[list[Name], msgspec.Meta(min_length=1)]
    output_names: Annotated[list[Name], msgspec.Meta(min_length=1)]


class PlacementDoc(_Strict):
    name: Name
    offset: Size
    nbytes: Size
    first: Annotated[int, msgspec.Meta(ge=-1)]
    last: Annotated[int, msgspec.Meta(ge=-1)]


class MemoryDoc(_Strict):
    arena_bytes: Size
    workspace_bytes: Size
    placements: dict[Name, PlacementDoc]
    aliases: dict[Name, Name]
    algorithm: str = ""
    lower_bound_bytes: Size = 0
    naive_bytes: Size = 0
    candidates: dict[str, Size] = {}


class KernelDoc(_Strict):
    name: Annotated[str, msgspec.Meta(pattern="^[A-Za-z_][A-Za-z0-9_]{0,255}$")]
    family: str
    args: Annotated[int, msgspec.Meta(ge=0, le=MAX_ARGS)]
    requires_arch: Arch | None = None
    pdl: bool = False  # PDL-ready (runtime/pdl.py); engines before it have no such field


class IODoc(_Strict):
    name: Name
    dtype: DType
    shape: Shape


Pos = Annotated[int, msgspec.Meta(ge=1, le=MAX_SIZE)]
# a profile's buckets: each a full plan (runtime/profiles.py MAX_BUCKETS)
MAX_BUCKETS = 64


class DimGroupDoc(_Strict):
    """One dynamic dim of a profile: the input axes it is on, its range, and (padded) the output
    axes the runtime slices back to mult * n."""

    name: Name
    positions: Annotated[list[tuple[Name, Annotated[int, msgspec.Meta(ge=0, lt=MAX_RANK)]]], msgspec.Meta(min_length=1)]
    min: Pos
    opt: Pos
    max: Pos
    padded: bool
    reason: str = ""
    outputs: dict[Name, tuple[Annotated[int, msgspec.Meta(ge=0, lt=MAX_RANK)], Pos]] = {}


class BucketDoc(_Strict):
    """A bucket: the dims' sizes, and its static plan (none: the engine's own plan); `weights`
    are the plan's weights held in `member`, the others are the engine plan's of the same name."""

    sizes: dict[Name, Pos]
    plan: PlanDoc | None = None
    memory: MemoryDoc | None = None
    weights: list[Name] = []
    member: Annotated[str, msgspec.Meta(pattern="^profiles/[0-9]{1,6}[.]safetensors$")] | None = None


class ProfileDoc(_Strict):
    min: dict[Name, Shape]
    opt: dict[Name, Shape]
    max: dict[Name, Shape]
    dims: list[DimGroupDoc]
    buckets: Annotated[list[BucketDoc], msgspec.Meta(min_length=1, max_length=MAX_BUCKETS)]


class ManifestDoc(_Strict):
    format: Literal["graphc-engine"]
    format_version: int
    graphc_version: str
    target: Literal["cpu", "cuda"]
    build: dict[str, Any]
    inputs: list[IODoc]
    outputs: list[IODoc]
    plan: PlanDoc
    memory: MemoryDoc
    kernels: dict[Digest, KernelDoc]
    archs: list[Arch]
    tuning: dict[str, Any]
    report: dict[str, Any]
    members: dict[Name, Digest]
    # the version of the runtime's closed attrs table (runtime/attrs_schema.py) the steps' attrs follow;
    # the CPU loader refuses any other (runtime/cpu.py check_attrs_schema)
    attrs_schema: int | None = None
    # optimization profiles (format version 3; runtime/profiles.py); none: a fixed-shape engine
    profiles: Annotated[list[ProfileDoc], msgspec.Meta(min_length=1, max_length=16)] | None = None


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    d: dict[str, Any] = {}
    for k, v in pairs:
        if k in d:
            # json.loads keeps the last of two equal keys; a second copy must not silently win.
            raise EngineError(f"manifest.json has the key {k!r} twice in one object")
        d[k] = v
    return d


def parse_json(raw: bytes) -> Any:
    """JSON text to plain values, refusing duplicate keys and nesting deep enough to exhaust the stack."""
    try:
        return json.loads(raw, object_pairs_hook=_no_duplicate_keys)
    except (ValueError, UnicodeDecodeError) as e:
        raise EngineError(f"manifest.json is not valid JSON: {e}") from None
    except RecursionError:
        raise EngineError("manifest.json is nested too deeply") from None


def decode_manifest(obj: Any, format_version: int | tuple[int, ...]) -> ManifestDoc:
    """Plain JSON values to a typed ManifestDoc, or one EngineError line naming the bad field.
    `format_version`: the version, or the versions, this reader takes."""
    if not isinstance(obj, dict) or obj.get("format") != "graphc-engine":
        raise EngineError("not a graphc engine manifest")
    versions = (format_version,) if isinstance(format_version, int) else tuple(format_version)
    v = obj.get("format_version")
    if type(v) is not int or v not in versions:
        shown = str(versions[0]) if len(versions) == 1 else f"{', '.join(map(str, versions[:-1]))} or {versions[-1]}"
        raise EngineError(
            f"engine format version {v!r}, this graphc reads version {shown}: rebuild the engine "
            "with `graphc compile`"
        )
    try:
        doc = msgspec.convert(obj, ManifestDoc, strict=True)
    except msgspec.ValidationError as e:
        raise EngineError(f"manifest does not fit the engine schema: {e}") from None
    except RecursionError:
        raise EngineError("manifest.json is nested too deeply") from None
    # Profiles came with version 3: a version-2 manifest never has them, a version-3 one always.
    if (doc.profiles is not None) != (v >= 3):
        raise EngineError(f"engine format version {v} {'without' if v >= 3 else 'with'} optimization profiles")
    return doc


__all__ = ["DTYPES", "MAX_SIZE", "ManifestDoc", "decode_manifest", "parse_json"]
