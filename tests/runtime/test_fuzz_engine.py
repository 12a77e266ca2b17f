"""Fuzzing engine files: mutations of the manifest's structure, of the zip container and of raw
bytes, each with a fixed seed. Every mutated engine must either be refused with a graphc error of
one line, or load and compute exactly what the original computes:

- a CPU engine is run, and its outputs must equal the original's bit for bit;
- a CUDA engine (no GPU here) is read and validated, then executed symbolically: every launch
  writes, over the bytes its kernel really covers (the original plan's extents: kernels are
  hashed, so their extents are theirs), a tag derived from its kernel, geometry and the bytes of
  all its arguments; the outputs' tags must equal the original's. A placement that overlaps a
  live tensor, a reordered or dropped step, or a retargeted argument changes the tags.

Manifest edits are mostly "resealed" (the manifest digest in the zip comment recomputed, as a
deliberate editor would), so the plan's own validation is what is tested; the rest are left
unsealed and must all be refused by the digest. Edits of the plan's own values (launch geometry,
attrs, kernel params, a step input or launch argument pointed at another live tensor of the same
type) are made unsealed only: such an edit, made consistently, is another valid plan, which only
a signature (graphc sign / --verify-key) tells from the builder's. Every other class is made
sealed, and the validator must catch each change of meaning it causes.
"""

from __future__ import annotations

import copy
import hashlib
import io
import json
import random
import struct
import warnings
import zipfile
from pathlib import Path

import numpy as np
import pytest

import graphc
import graphc.runtime
import models
from graphc.errors import GraphcError
from graphc.runtime.container import make_comment
from graphc.runtime.format import read_engine
from graphc.runtime.plan import ALIAS, WEIGHT
from graphc.runtime.schema import DTYPES

N_CPU = 2500
N_CUDA = 1500


# ---- the engines under test ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def cpu_engine(tmp_path_factory):
    m = models.build("bert", size="tiny")
    feeds = models.sample_inputs("bert", m)
    eng = graphc.compile(m, target="cpu", shapes={k: v.shape for k, v in feeds.items()})
    path = tmp_path_factory.mktemp("fuzz") / "bert-cpu.engine"
    eng.save(path)
    return path, feeds, eng.run(feeds)


@pytest.fixture(scope="module")
def cuda_engine(tmp_path_factory):
    m = models.build("bert", size="tiny")
    feeds = models.sample_inputs("bert", m)
    # One arch keeps the NVRTC work small; the kernel cache makes later runs cheap.
    eng = graphc.compile(m, target="cuda", arch=["sm_80"], shapes={k: v.shape for k, v in feeds.items()})
    path = tmp_path_factory.mktemp("fuzz") / "bert-cuda.engine"
    eng.save(path)
    return path


# ---- the container as editable data ---------------------------------------------------------------


class Zip:
    """An engine's members (a list: duplicates allowed), compression per member, and comment."""

    def __init__(self, data: bytes):
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            self.members = [(i.filename, z.read(i), i.compress_type) for i in z.infolist()]
            self.comment = z.comment

    def copy(self) -> Zip:
        other = object.__new__(Zip)
        other.members, other.comment = list(self.members), self.comment
        return other

    def get(self, name: str) -> bytes:
        return next(d for n, d, _ in self.members if n == name)

    def put(self, name: str, data: bytes) -> None:
        self.members = [(n, data if n == name else d, c) for n, d, c in self.members]

    def manifest(self) -> dict:
        return json.loads(self.get("manifest.json"))

    def set_manifest(self, m: dict | bytes, reseal: bool) -> None:
        raw = m if isinstance(m, bytes) else json.dumps(m).encode()
        self.put("manifest.json", raw)
        if reseal:
            self.reseal()

    def reseal(self) -> None:
        self.comment = make_comment(hashlib.sha256(self.get("manifest.json")).hexdigest())

    def relist(self, m: dict) -> None:
        """Record the current members' digests in the manifest (a deliberate editor's step)."""
        m["members"] = {n: hashlib.sha256(d).hexdigest() for n, d, _ in self.members if n != "manifest.json"}

    def bytes(self) -> bytes:
        buf = io.BytesIO()
        with warnings.catch_warnings(), zipfile.ZipFile(buf, "w") as z:
            warnings.simplefilter("ignore", UserWarning)  # duplicate names are the point
            z.comment = self.comment
            for n, d, _c in self.members:
                # stored, not deflated: rewriting is the fuzz loop's cost (the reader takes both)
                info = zipfile.ZipInfo(n, date_time=(2026, 1, 1, 0, 0, 0))
                with z.open(info, "w") as f:
                    f.write(d)
        return buf.getvalue()


def patch_declared_size(data: bytes, name: str, size: int) -> bytes:
    """Set a member's uncompressed size in the zip's central directory (the number a reader
    trusts before it decompresses anything)."""
    buf = bytearray(data)
    pos = 0
    while True:
        pos = buf.find(b"PK\x01\x02", pos)
        if pos < 0:
            return bytes(buf)
        n = struct.unpack_from("<H", buf, pos + 28)[0]
        if buf[pos + 46 : pos + 46 + n] == name.encode():
            struct.pack_into("<I", buf, pos + 24, size)
        pos += 4


# ---- manifest mutations (each edits the parsed manifest; returns a label) ---------------------------


def _rand_tensor(rng: random.Random, m: dict) -> str:
    return rng.choice(sorted(m["plan"]["tensors"]))


def _rand_value(rng: random.Random, like: object) -> object:
    """A value of another JSON type than `like` (type confusion), or a boundary value."""
    choices: list[object] = [
        None,
        True,
        0,
        -1,
        2**40,
        2**63,
        1.5,
        float("nan"),
        "",
        "x",
        "7",
        [],
        [1, 2],
        {},
        {"a": 1},
    ]
    if isinstance(like, dict) and like:
        choices.append(list(like.values()))
    if isinstance(like, list):
        choices.append({str(i): v for i, v in enumerate(like)})
    return rng.choice(choices)


def _paths(obj: object, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(obj, dict):
        for k, v in obj.items():
            out.extend(_paths(v, (*prefix, k)))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out.extend(_paths(v, (*prefix, i)))
    return out


def _set(obj: object, path: tuple, value: object) -> None:
    for k in path[:-1]:
        obj = obj[k]  # type: ignore[index]
    obj[path[-1]] = value  # type: ignore[index]


def _get(obj: object, path: tuple) -> object:
    for k in path:
        obj = obj[k]  # type: ignore[index]
    return obj


def _is_value_of_plan(p: tuple) -> bool:
    """Paths whose values are the plan's own choices (attrs, kernel params, launch geometry and
    shared memory): a new value of the right type there is another plan, which only a signature
    can tell apart."""
    return any(k in p for k in ("attrs", "params", "grid", "block", "shared_bytes"))


def mut_type_confusion(rng, m, values: bool = False):
    # Mostly inside the plan and memory plan, where the meaning lives.
    root = rng.choice(["plan", "memory", "plan", "kernels", "inputs", "outputs", None])
    paths = [p for p in _paths(m) if p and (root is None or p[0] == root) and (values or not _is_value_of_plan(p))]
    p = rng.choice(paths)
    _set(m, p, _rand_value(rng, _get(m, p)))
    return f"type {'.'.join(map(str, p))[:60]}"


def mut_drop_step(rng, m):
    steps = m["plan"]["steps"]
    del steps[rng.randrange(len(steps))]
    if rng.random() < 0.5:
        for i, s in enumerate(steps):
            s["index"] = i
    return "drop step"


def mut_duplicate_step(rng, m):
    steps = m["plan"]["steps"]
    i = rng.randrange(len(steps))
    steps.insert(rng.randrange(len(steps) + 1), copy.deepcopy(steps[i]))
    for j, s in enumerate(steps):
        s["index"] = j
    return "duplicate step"


def mut_reorder_steps(rng, m):
    steps = m["plan"]["steps"]
    i = rng.randrange(len(steps))
    j = min(len(steps) - 1, i + 1) if rng.random() < 0.6 else rng.randrange(len(steps))
    steps[i], steps[j] = steps[j], steps[i]
    for k, s in enumerate(steps):
        s["index"] = k
    return "reorder steps"


def mut_retarget_output(rng, m):
    p = m["plan"]
    k = rng.random()
    if k < 0.15:
        p["outputs"], p["output_names"] = [], []
        m["outputs"] = []
        return "empty outputs"
    i = rng.randrange(len(p["outputs"]))
    t = _rand_tensor(rng, m)
    p["outputs"][i] = t
    if rng.random() < 0.7:  # keep the I/O specs consistent with the retargeted tensor
        spec = p["tensors"][t]
        m["outputs"][i] = {"name": p["output_names"][i], "dtype": spec["dtype"], "shape": spec["shape"]}
    return "retarget output"


def mut_step_io(rng, m):
    s = rng.choice(m["plan"]["steps"])
    key = rng.choice(["inputs", "outputs"])
    if not s[key]:
        return "noop"
    i = rng.randrange(len(s[key]))
    s[key][i] = rng.choice([None, _rand_tensor(rng, m), _rand_tensor(rng, m)])
    return f"step {key}"


def mut_dtype(rng, m):
    name = _rand_tensor(rng, m)
    t = m["plan"]["tensors"][name]
    t["dtype"] = rng.choice([*DTYPES, "int", "float", "object", "str", 3])
    if rng.random() < 0.3 and isinstance(t["dtype"], str):
        for s in m["inputs"] + m["outputs"]:
            if s["name"] == name:
                s["dtype"] = t["dtype"]
    return "dtype"


def mut_offset(rng, m):
    mem = m["memory"]
    pl = mem["placements"]
    name = rng.choice(sorted(pl))
    other = pl[rng.choice(sorted(pl))]
    pl[name]["offset"] = rng.choice(
        [
            other["offset"],
            pl[name]["offset"] + 256,
            pl[name]["offset"] - 256,
            rng.randrange(0, max(mem["arena_bytes"], 1), 256),
            pl[name]["offset"] + 4,
            mem["arena_bytes"],
            -256,
            2**40,
        ]
    )
    return "offset"


def mut_sizes(rng, m):
    k = rng.randrange(6)
    mem, tensors = m["memory"], m["plan"]["tensors"]
    if k == 0:
        mem["arena_bytes"] = rng.choice([2**40, 2**62, 0, mem["arena_bytes"] // 2, mem["arena_bytes"] + 256])
    elif k == 1:
        mem["workspace_bytes"] = rng.choice([2**40, 0, mem["workspace_bytes"] + 256])
    elif k == 2:
        t = tensors[_rand_tensor(rng, m)]
        t["nbytes"] = rng.choice([0, t["nbytes"] * 2, t["nbytes"] // 2, 2**40])
    elif k == 3:
        t = tensors[_rand_tensor(rng, m)]
        if t["shape"]:
            i = rng.randrange(len(t["shape"]))
            t["shape"][i] = rng.choice([0, 1, t["shape"][i] * 2, 2**40, -1])
        else:
            t["shape"] = [rng.choice([0, 2, 2**31])]
    elif k == 4:
        # a reshaped tensor with its byte count kept consistent
        t = tensors[_rand_tensor(rng, m)]
        n = int(np.prod(t["shape"])) if t["shape"] else 1
        t["shape"] = rng.choice([[n], [1, n], [n, 1], [2, n // 2] if n % 2 == 0 else [n, 1, 1]])
    else:
        p = mem["placements"][rng.choice(sorted(mem["placements"]))]
        p["nbytes"] = rng.choice([0, p["nbytes"] + 1, 2**40])
    return "sizes"


def mut_op(rng, m):
    s = rng.choice(m["plan"]["steps"])
    s["op"] = rng.choice([None, "", "NoSuchOp", "dataclass", "register_op", "get_op", "Relu", "MatMul", 3])
    return "step op"


def mut_attrs(rng, m):
    s = rng.choice(m["plan"]["steps"])
    s["attrs"] = rng.choice(
        [[], "x", None, 1, {"__dataclass__": "dataclass", "fields": {}}, {"x": object.__name__}, [{"a": 1}]]
    )
    return "attrs"


def mut_alias(rng, m):
    tensors = m["plan"]["tensors"]
    aliases = [n for n, t in tensors.items() if t["kind"] == ALIAS]
    k = rng.randrange(4)
    if k == 0 and aliases:
        tensors[rng.choice(aliases)]["alias_of"] = _rand_tensor(rng, m)
    elif k == 1 and aliases:
        m["memory"]["aliases"][rng.choice(aliases)] = _rand_tensor(rng, m)
    elif k == 2:
        t = tensors[_rand_tensor(rng, m)]
        t["kind"] = rng.choice(["input", "arena", "weight", "alias", "host"])
    else:
        s = rng.choice(m["plan"]["steps"])
        s["alias"] = not s["alias"]
    return "alias/kind"


def mut_inplace(rng, m):
    s = rng.choice(m["plan"]["steps"])
    s["inplace"] = rng.choice([[0], [1], [0, 1], [7], []])
    return "inplace"


def mut_launch(rng, m):
    """Launch edits that a consistent plan must not allow: args, digests, kernel names, counts."""
    steps = [s for s in m["plan"]["steps"] if s["launches"]]
    if not steps:
        return mut_inplace(rng, m)
    ln = rng.choice(rng.choice(steps)["launches"])
    k = rng.randrange(1, 5)
    if k == 1:
        ln["digest"] = rng.choice(sorted(m["kernels"]))
    elif k == 2:
        ln["kernel"] = rng.choice([m["kernels"][d]["name"] for d in m["kernels"]] + ["x", "__import__"])
    elif k == 3:
        ln["args"] = ln["args"][:-1] if rng.random() < 0.5 else [*ln["args"], ln["args"][0]]
    else:
        d = rng.choice(sorted(m["kernels"]))
        m["kernels"][d]["args"] = m["kernels"][d]["args"] + rng.choice([-1, 1])
    return "launch"


def mut_plan_values(rng, m):
    """What only a signature protects, so only ever unsealed (see the module docstring): launch
    geometry, a launch argument or step input pointed at another tensor of the same type, attrs."""
    steps = [s for s in m["plan"]["steps"] if s["launches"]]
    k = rng.randrange(4)
    if k == 0 and steps:
        ln = rng.choice(rng.choice(steps)["launches"])
        ln[rng.choice(["grid", "block"])][0] += 1
    elif k == 1 and steps:
        ln = rng.choice(rng.choice(steps)["launches"])
        if ln["args"]:
            ln["args"][rng.randrange(len(ln["args"]))] = rng.choice([_rand_tensor(rng, m), "@workspace", "nope"])
    elif k == 2:
        mut_step_io(rng, m)
    else:
        mut_type_confusion(rng, m, values=True)
    return "plan values"


SEALED = [
    mut_type_confusion,
    mut_type_confusion,
    mut_drop_step,
    mut_duplicate_step,
    mut_reorder_steps,
    mut_reorder_steps,
    mut_retarget_output,
    mut_dtype,
    mut_dtype,
    mut_offset,
    mut_offset,
    mut_sizes,
    mut_sizes,
    mut_op,
    mut_attrs,
    mut_alias,
    mut_inplace,
    mut_launch,
    mut_launch,
]


# ---- zip and byte mutations ---------------------------------------------------------------------


def zip_mutation(rng: random.Random, z: Zip) -> tuple[bytes, str]:
    k = rng.randrange(9)
    names = [n for n, _, _ in z.members]
    if k == 0:  # a second manifest.json (written first or last), resealed to the original
        m = z.manifest()
        m["plan"]["outputs"] = [_rand_tensor(rng, m)]
        evil = (json.dumps(m).encode(), zipfile.ZIP_DEFLATED)
        z.members.insert(rng.choice([0, len(z.members)]), ("manifest.json", *evil))
        return z.bytes(), "duplicate manifest"
    if k == 1:  # a duplicate of another member with other bytes
        n = rng.choice(names)
        z.members.append((n, b"\0" * 64, zipfile.ZIP_STORED))
        return z.bytes(), "duplicate member"
    if k == 2:  # an unlisted member (optionally listed, with its digest, and resealed)
        name = rng.choice(
            [
                "extra.bin",
                "../evil",
                "/abs/path",
                "kernels/../x.cu",
                "kernels/sm_80/x.cubin",
                "kernels/" + "a" * 64 + ".cu",
            ]
        )
        z.members.append((name, b"payload", zipfile.ZIP_DEFLATED))
        if rng.random() < 0.5:
            m = z.manifest()
            z.relist(m)
            z.set_manifest(m, reseal=True)
        return z.bytes(), "unlisted member"
    if k == 3:  # a member whose declared size is huge (a zip bomb's header)
        n = rng.choice(names)
        return patch_declared_size(z.bytes(), n, rng.choice([2**32 - 1, 2**31, 10**9])), "huge declared size"
    if k == 4:  # a cubin moved to an odd path, listed and resealed
        cubins = [n for n in names if n.endswith(".cubin")]
        if not cubins:
            return z.bytes(), "noop"
        src = rng.choice(cubins)
        dst = rng.choice(["kernels/sm_999/" + src[-70:], "kernels/sm_75/" + src.split("/")[-1], "kernels/x/y/z.cubin"])
        z.members = [(dst if n == src else n, d, c) for n, d, c in z.members]
        m = z.manifest()
        z.relist(m)
        z.set_manifest(m, reseal=True)
        return z.bytes(), "cubin path"
    if k == 5:  # a member dropped, or dropped and unlisted
        n = rng.choice([x for x in names if x != "manifest.json"])
        z.members = [x for x in z.members if x[0] != n]
        if rng.random() < 0.5:
            m = z.manifest()
            z.relist(m)
            z.set_manifest(m, reseal=True)
        return z.bytes(), "dropped member"
    if k == 6:  # the comment removed or garbled
        z.comment = rng.choice([b"", b"graphc-engine manifest-sha256=" + b"0" * 64, z.comment[:-3], z.comment + b" x"])
        return z.bytes(), "comment"
    if k == 7:  # manifest JSON text edits, resealed: duplicate keys, deep nesting, truncation
        raw = z.get("manifest.json")
        edit = rng.randrange(4)
        if edit == 0:
            raw = raw.replace(b'"format": "graphc-engine"', b'"format": "graphc-engine", "plan": {}', 1)
        elif edit == 1:
            raw = b'{"format": "graphc-engine", "format_version": 2, "build": ' + b"[" * 100000 + b"]" * 100000 + b"}"
        elif edit == 2:
            raw = raw[: rng.randrange(len(raw))]
        else:
            raw = raw.replace(b"1", b"1e400", 1)
        z.set_manifest(raw, reseal=True)
        return z.bytes(), "manifest text"
    # a member's bytes replaced (listed digest kept): refused by the member hash
    n = rng.choice([x for x in names if x != "manifest.json"])
    d = bytearray(z.get(n))
    if d:
        d[rng.randrange(len(d))] ^= 0xFF
    z.put(n, bytes(d))
    return z.bytes(), "member bytes"


def byte_mutation(rng: random.Random, data: bytes) -> tuple[bytes, str]:
    buf = bytearray(data)
    k = rng.randrange(3)
    if k == 0:
        return bytes(buf[: rng.randrange(len(buf))]), "truncate"
    if k == 1:
        for _ in range(rng.randint(1, 4)):
            buf[rng.randrange(len(buf))] ^= 1 << rng.randrange(8)
        return bytes(buf), "bit flips"
    pos = rng.randrange(len(buf))
    buf[pos : pos + 8] = bytes(rng.randrange(256) for _ in range(8))
    return bytes(buf), "overwrite"


def mutate(rng: random.Random, data: bytes, base: Zip) -> tuple[bytes, str]:
    """One mutation of the engine `data` (whose parsed form is `base`)."""
    r = rng.random()
    if r < 0.12:
        return byte_mutation(rng, data)
    z = base.copy()
    if r < 0.27:
        return zip_mutation(rng, z)
    m = z.manifest()
    if r < 0.37:
        label = rng.choice([*SEALED, mut_plan_values, mut_plan_values])(rng, m)
        z.set_manifest(m, reseal=False)
        return z.bytes(), label + " (unsealed)"
    label = rng.choice(SEALED)(rng, m)
    z.set_manifest(m, reseal=True)
    return z.bytes(), label


# ---- oracles ------------------------------------------------------------------------------------


def _one_line_graphc_error(e: BaseException, label: str) -> None:
    assert isinstance(e, GraphcError), f"{label}: {type(e).__name__} escaped: {e}"
    assert "\n" not in str(e), f"{label}: a message of several lines: {e}"


def symbolic_outputs(ef, extents: dict | None = None) -> tuple[dict, dict]:
    """Run a CUDA engine's launch sequence over tags instead of numbers (see the module
    docstring). Returns ({public output: (dtype, shape, digest)}, the launch extents used)."""
    plan, mem = ef.plan, ef.memory
    arena = np.zeros(max(mem.arena_bytes, 1), np.uint64)
    ws = np.zeros(max(mem.workspace_bytes, 1), np.uint64)
    learn = extents is None
    extents = {} if extents is None else extents
    weights = {n: hashlib.sha256(np.ascontiguousarray(w).tobytes()).digest() for n, w in ef.weights.items()}

    def region(name: str):
        root = mem.aliases.get(name, name)
        if plan.tensors[root].kind == WEIGHT:
            return None, root
        return mem.placements[root].offset, root

    for name in plan.inputs:
        off, _ = region(name)
        n = plan.tensors[name].nbytes
        seed = int.from_bytes(hashlib.sha256(name.encode()).digest()[:7], "little")
        arena[off : off + n] = seed + np.arange(n, dtype=np.uint64)
    for s in plan.steps:
        for ln in s.launches:
            # params are the builder's notes (the executor passes only pointers): not part of a launch
            key = (ln.digest, tuple(ln.grid), tuple(ln.block), ln.shared_bytes)
            if learn:
                extents[key] = [s.workspace_bytes if a == "@workspace" else plan.tensors[a].nbytes for a in ln.args]
            if key not in extents:
                raise AssertionError(f"launch {ln.kernel} {ln.grid}x{ln.block} is none of the original's")
            h = hashlib.sha256(repr(key).encode())
            spans = []
            for a, n in zip(ln.args, extents[key], strict=True):
                if a == "@workspace":
                    buf, off = ws, 0
                else:
                    off, root = region(a)
                    if off is None:
                        h.update(weights[root])
                        continue
                    buf = arena
                if n and off + n > len(buf):
                    raise AssertionError(f"launch {ln.kernel} touches bytes past its buffer")
                if a == "@workspace" or a in s.inputs:
                    # what the kernel reads (an output's earlier bytes are not: kernels overwrite)
                    h.update(buf[off : off + n].tobytes())
                spans.append((a, buf, off, n))
            seed = int.from_bytes(h.digest()[:7], "little")
            # what the kernel writes: its output tensors and the workspace (the validator holds
            # every non-const pointer to those)
            for a, buf, off, n in spans:
                if a == "@workspace" or a in s.outputs:
                    buf[off : off + n] = seed + np.arange(n, dtype=np.uint64)
    out = {}
    for public, name in zip(plan.output_names, plan.outputs, strict=True):
        off, _ = region(name)
        t = plan.tensors[name]
        out[public] = (t.dtype, tuple(t.shape), hashlib.sha256(arena[off : off + t.nbytes].tobytes()).hexdigest())
    return out, extents


# ---- the tests ----------------------------------------------------------------------------------


def _campaign(n: int, seed: int, data: bytes, path: Path, check) -> dict[str, int]:
    rng = random.Random(seed)
    counts = {"refused": 0, "loaded": 0}
    base = Zip(data)
    for _ in range(n):
        mutated, label = mutate(rng, data, base)
        path.write_bytes(mutated)
        try:
            check(path, label)
        except GraphcError as e:
            _one_line_graphc_error(e, label)
            counts["refused"] += 1
            continue
        counts["loaded"] += 1
    return counts


def test_fuzz_cpu_engine(cpu_engine, tmp_path):
    path, feeds, expected = cpu_engine
    data = path.read_bytes()

    def check(p: Path, label: str) -> None:
        try:
            out = graphc.runtime.load(p).run(feeds)
        except GraphcError:
            raise
        except BaseException as e:
            raise AssertionError(f"{label}: {type(e).__name__} escaped: {e}") from e
        assert out.keys() == expected.keys(), label
        for k in expected:
            assert out[k].dtype == expected[k].dtype and out[k].shape == expected[k].shape, label
            assert out[k].tobytes() == expected[k].tobytes(), f"{label}: output {k} changed silently"

    counts = _campaign(N_CPU, 20261201, data, tmp_path / "m.engine", check)
    # most mutations change meaning and are refused; some (a harmless reorder or relocation, a
    # zip timestamp byte) load and give the same bits
    assert counts["refused"] > N_CPU * 0.8, counts


def test_fuzz_cuda_engine(cuda_engine, tmp_path):
    data = cuda_engine.read_bytes()
    expected, extents = symbolic_outputs(read_engine(cuda_engine))

    def check(p: Path, label: str) -> None:
        try:
            ef = read_engine(p)
        except GraphcError:
            raise
        except BaseException as e:
            raise AssertionError(f"{label}: {type(e).__name__} escaped: {e}") from e
        got, _ = symbolic_outputs(ef, extents)
        assert got == expected, f"{label}: a validated engine computes something else"

    counts = _campaign(N_CUDA, 20261202, data, tmp_path / "m.engine", check)
    assert counts["refused"] > N_CUDA * 0.8, counts
