"""The on-disk kernel cache: where it lives, how big it may grow, and clearing it.

NVRTC's cubins are cached by content (graphc.codegen.nvrtc writes them, one `KEY.cubin` per
kernel) in the folder `kernels` of graphc's cache folder: the platform's user cache folder
(platformdirs: ~/.cache/graphc on Linux, honouring XDG_CACHE_HOME) or $GRAPHC_CACHE_DIR. The
tuner keeps its records beside it (tuning.sqlite). The kernels' size is capped ($GRAPHC_CACHE_LIMIT
bytes, default 2 GiB): after new kernels are written the least recently used ones are removed
until the cache fits (a hit refreshes a file's time). `graphc cache --info` / `--clear`.
"""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

ENV_DIR = "GRAPHC_CACHE_DIR"
ENV_LIMIT = "GRAPHC_CACHE_LIMIT"
DEFAULT_LIMIT = 2 * 2**30
SUFFIX = ".cubin"


def root_dir() -> Path:
    """graphc's cache folder: $GRAPHC_CACHE_DIR, else the platform's user cache folder for graphc."""
    env = os.environ.get(ENV_DIR)
    if env:
        return Path(env).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("graphc", appauthor=False))


def cache_dir() -> Path:
    """The kernel cache folder (not created here)."""
    return root_dir() / "kernels"


def size_limit() -> int:
    """The cap in bytes from $GRAPHC_CACHE_LIMIT (a plain integer; 0 turns eviction off)."""
    text = os.environ.get(ENV_LIMIT)
    if not text:
        return DEFAULT_LIMIT
    try:
        limit = int(text)
    except ValueError:
        log.warning("%s=%r is not an integer number of bytes; using %d", ENV_LIMIT, text, DEFAULT_LIMIT)
        return DEFAULT_LIMIT
    return max(limit, 0)


def _is_kernel(name: str, *, partial: bool = False) -> bool:
    """KEY.cubin (KEY: 64 hex digits), or with `partial` also an unfinished write KEY.tmpPID: the
    cache never touches a file it did not write, whatever folder $GRAPHC_CACHE_DIR names."""
    key, dot, ext = name.partition(".")
    if len(key) != 64 or not all(c in "0123456789abcdef" for c in key) or not dot:
        return False
    return "." + ext == SUFFIX or (partial and ext.startswith("tmp") and ext[3:].isdigit())


def _entries(folder: Path) -> list[os.DirEntry]:
    try:
        return [e for e in os.scandir(folder) if e.is_file() and _is_kernel(e.name)]
    except FileNotFoundError:
        return []


def read(path: Path) -> bytes | None:
    """A cached kernel's bytes, or None when it is not there (or was just evicted); a hit counts as a use."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    with contextlib.suppress(OSError):  # a read-only cache still serves hits
        os.utime(path)  # least recently *used* goes first
    return data


def enforce_limit(folder: Path | None = None, limit: int | None = None) -> tuple[int, int]:
    """Remove the least recently used kernels until the cache holds at most `limit` bytes.
    Returns (files removed, bytes freed)."""
    folder = Path(folder) if folder is not None else cache_dir()
    limit = size_limit() if limit is None else limit
    if limit <= 0:
        return 0, 0
    entries = []
    for e in _entries(folder):
        try:
            st = e.stat()
        except FileNotFoundError:
            continue
        entries.append((st.st_mtime, st.st_size, e.path))
    total = sum(size for _, size, _ in entries)
    removed = freed = 0
    for _, size, path in sorted(entries):
        if total <= limit:
            break
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)
        total -= size
        removed += 1
        freed += size
    if removed:
        log.info("kernel cache over its limit of %d bytes: removed %d old kernels (%d bytes)", limit, removed, freed)
    return removed, freed


@dataclass(frozen=True)
class CacheStats:
    path: Path
    entries: int
    bytes: int
    limit: int


def stats(folder: Path | None = None) -> CacheStats:
    folder = Path(folder) if folder is not None else cache_dir()
    sizes = []
    for e in _entries(folder):
        try:
            sizes.append(e.stat().st_size)
        except FileNotFoundError:
            continue
    return CacheStats(folder, len(sizes), sum(sizes), size_limit())


def clear(folder: Path | None = None) -> tuple[int, int]:
    """Delete every cached kernel (only `*.cubin` files and unfinished writes: nothing else in the
    folder is touched). Returns (files removed, bytes freed)."""
    folder = Path(folder) if folder is not None else cache_dir()
    removed = freed = 0
    try:
        entries = list(os.scandir(folder))
    except FileNotFoundError:
        return 0, 0
    for e in entries:
        if not e.is_file() or not _is_kernel(e.name, partial=True):
            continue
        try:
            size = e.stat().st_size
            os.remove(e.path)
        except FileNotFoundError:
            continue
        removed += _is_kernel(e.name)
        freed += size
    return removed, freed
