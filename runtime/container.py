"""The engine's zip container: its member list and sizes checked before anything is decompressed,
and the manifest's own digest, which lives in the zip's archive comment.

Why the comment: a zip has exactly one end-of-central-directory record that readers use, so one
comment; a second `manifest.json` member could otherwise carry a second, different manifest (and
duplicate member names are refused as well). The comment reads

    graphc-engine manifest-sha256=<64 hex> [ed25519=<128 hex>]

where the optional signature (graphc.runtime.signing) signs the manifest digest, which in turn
holds the SHA-256 of every other member.
"""

from __future__ import annotations

import hashlib
import os
import re
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

from graphc.runtime.errors import EngineError

MANIFEST = "manifest.json"
WEIGHTS = "weights.safetensors"
_MEMBER = re.compile(
    r"manifest\.json|weights\.safetensors|kernels/[0-9a-f]{64}\.cu|kernels/sm_[0-9]{2,3}a?/[0-9a-f]{64}\.cubin"
    # a shape bucket's own weights (engines with optimization profiles)
    r"|profiles/[0-9]{1,6}\.safetensors"
)
_COMMENT = re.compile(rb"graphc-engine manifest-sha256=([0-9a-f]{64})(?: ed25519=([0-9a-f]{128}))?")
MAX_MANIFEST_BYTES = 256 * 2**20
# Deflate of real engine members (JSON, CUDA C, cubin) stays far below this; a zip bomb does not.
MAX_RATIO = 200.0
_RATIO_FREE_BYTES = 2**20  # members this small may compress as well as they like


def _physical_memory() -> int:
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 64 * 2**30


@dataclass(frozen=True)
class Limits:
    """Caps on what an engine may ask of this machine, checked before anything is read or
    allocated. `max_bytes` bounds every member, their sum, the arena, the workspace and the
    weights; by default this machine's physical memory, or GRAPHC_ENGINE_MAX_BYTES."""

    max_bytes: int

    @staticmethod
    def default() -> Limits:
        env = os.environ.get("GRAPHC_ENGINE_MAX_BYTES")
        if env:
            try:
                value = int(env)
            except ValueError:
                raise EngineError(f"GRAPHC_ENGINE_MAX_BYTES={env!r} is not a number of bytes") from None
            if value <= 0:
                raise EngineError(f"GRAPHC_ENGINE_MAX_BYTES={env!r} must be positive")
            return Limits(value)
        return Limits(_physical_memory())


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def make_comment(manifest_digest: str, signature: bytes | None = None) -> bytes:
    c = f"graphc-engine manifest-sha256={manifest_digest}"
    if signature is not None:
        c += f" ed25519={signature.hex()}"
    return c.encode()


def parse_comment(comment: bytes, path: Path) -> tuple[str, bytes | None]:
    m = _COMMENT.fullmatch(comment)
    if m is None:
        raise EngineError(
            f"{path}: no manifest digest in the engine (written by an older graphc, or not by graphc): "
            "rebuild it with `graphc compile`"
        )
    return m.group(1).decode(), (bytes.fromhex(m.group(2).decode()) if m.group(2) else None)


class Container:
    """An open engine zip whose member list and sizes have been checked; nothing decompressed yet."""

    def __init__(self, path: Path, limits: Limits):
        self.path, self.limits = path, limits
        if not path.exists():
            raise EngineError(f"{path}: no such engine file")
        if path.is_dir():
            raise EngineError(f"{path}: is a folder, not an engine file")
        try:
            self.zip = zipfile.ZipFile(path)
        except (zipfile.BadZipFile, OSError, ValueError, EOFError, NotImplementedError) as e:
            raise EngineError(f"{path}: not a graphc engine (not a valid zip: {e}); truncated or corrupt?") from None
        try:
            self.infos = self._check_members()
            self.manifest_digest, self.signature = parse_comment(self.zip.comment, path)
        except BaseException:
            self.zip.close()
            raise

    def _check_members(self) -> dict[str, zipfile.ZipInfo]:
        path, cap = self.path, self.limits.max_bytes
        infos: dict[str, zipfile.ZipInfo] = {}
        total = 0
        for info in self.zip.infolist():
            name = info.filename
            if name in infos:
                raise EngineError(
                    f"{path}: the member {name!r} appears twice (a second copy must not override the first)"
                )
            if not _MEMBER.fullmatch(name):
                raise EngineError(f"{path}: unexpected member {name[:200]!r}: not a graphc engine member path")
            if info.flag_bits & 0x1:
                raise EngineError(f"{path}: member {name} is encrypted")
            if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
                raise EngineError(f"{path}: member {name} uses an unsupported compression ({info.compress_type})")
            if info.file_size > cap or (name == MANIFEST and info.file_size > MAX_MANIFEST_BYTES):
                raise EngineError(
                    f"{path}: member {name} would decompress to {info.file_size} bytes, over the limit of "
                    f"{MAX_MANIFEST_BYTES if name == MANIFEST else cap} (GRAPHC_ENGINE_MAX_BYTES)"
                )
            if info.file_size > _RATIO_FREE_BYTES and info.file_size > MAX_RATIO * max(info.compress_size, 1):
                raise EngineError(
                    f"{path}: member {name} compresses {info.file_size / max(info.compress_size, 1):.0f}:1, "
                    "more than any real engine member (a zip bomb?)"
                )
            total += info.file_size
            infos[name] = info
        if total > cap:
            raise EngineError(
                f"{path}: members add up to {total} bytes, over the limit of {cap} (GRAPHC_ENGINE_MAX_BYTES)"
            )
        if MANIFEST not in infos:
            raise EngineError(f"{path}: no {MANIFEST}: not a graphc engine")
        return infos

    def read(self, name: str) -> bytes:
        """One member's bytes; never more than its checked size."""
        info = self.infos[name]
        try:
            with self.zip.open(info) as f:
                data = f.read(info.file_size + 1)
        except (zipfile.BadZipFile, OSError, EOFError, zlib.error, ValueError, NotImplementedError) as e:
            raise EngineError(f"{self.path}: corrupt engine file ({name}): {e}") from None
        if len(data) != info.file_size:
            raise EngineError(f"{self.path}: member {name} is not the size its zip entry says (corrupt)")
        return data

    def read_manifest(self) -> bytes:
        raw = self.read(MANIFEST)
        if sha256(raw) != self.manifest_digest:
            raise EngineError(
                f"{self.path}: manifest.json does not match the manifest digest recorded in the engine "
                "(corrupt or edited)"
            )
        return raw

    def close(self) -> None:
        self.zip.close()

    def __enter__(self) -> Container:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["MANIFEST", "WEIGHTS", "Container", "Limits", "make_comment", "parse_comment", "sha256"]
