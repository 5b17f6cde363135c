"""The on-disk kernel cache: compiled cubins that survive the process, and heal when damaged.

An entry is three files named by its key: ``<key>.cubin`` (the code), ``<key>.log`` (ptxas's report)
and ``<key>.json`` (the size and SHA-256 of the other two, written last). A hit needs all three to
agree, so a truncated, overwritten or half-written entry is never used: :func:`read` reports it as a
miss (with a warning), deletes it, and the caller compiles it again. Every file is written to a
temporary name unique to the process and thread, then renamed into place (atomic on POSIX and
Windows); a failed write leaves no temporary behind.

Where: ``$CUCONV_CACHE_DIR``, else ``$XDG_CACHE_HOME/cuconv``, else ``~/.cache/cuconv``. A folder
that cannot be created or written is replaced, with one warning, by a temporary folder of the
process (compiles then last as long as the process). Size: at most ``$CUCONV_CACHE_MAX_MB``
megabytes (default 1024); after a write the least recently used entries are removed until the
cache is under 90% of that. ``cuconv.clear_cache()`` removes every entry.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import tempfile
import threading
import uuid
import warnings
from pathlib import Path
from typing import Optional, Tuple

__all__ = ["cache_dir", "holds", "read", "write", "discard", "clear_entries", "max_bytes"]

_SUFFIXES = (".cubin", ".log", ".json")
_DEFAULT_MAX_MB = 1024


def _configured_dir() -> Path:
    base = os.environ.get("CUCONV_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "cuconv")
    return Path(base)


@functools.lru_cache(maxsize=None)
def _usable_dir(configured: str) -> Path:
    """``configured`` when it can be created and written, else a temporary folder (one warning)."""
    path = Path(configured)
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".probe-{os.getpid()}-{threading.get_ident()}-{uuid.uuid4().hex}"
        probe.write_bytes(b"")
        probe.unlink()
        return path
    except OSError as e:
        fallback = Path(tempfile.mkdtemp(prefix="cuconv-cache-"))
        warnings.warn(f"cuconv: the kernel cache folder {path} is not usable ({e}); compiled kernels go to "
                      f"{fallback} for this process. Set CUCONV_CACHE_DIR to a writable folder to keep them.",
                      RuntimeWarning, stacklevel=3)
        return fallback


def cache_dir() -> Path:
    """The cache folder in use (see the module docstring)."""
    return _usable_dir(str(_configured_dir()))


def max_bytes() -> int:
    """The size bound of the cache, from ``CUCONV_CACHE_MAX_MB`` (default 1024 MB)."""
    raw = os.environ.get("CUCONV_CACHE_MAX_MB", "").strip()
    if not raw:
        return _DEFAULT_MAX_MB << 20
    try:
        mb = float(raw)
    except ValueError:
        raise ValueError(f"CUCONV_CACHE_MAX_MB: expected a number of megabytes, got {raw!r}") from None
    if mb <= 0:
        raise ValueError(f"CUCONV_CACHE_MAX_MB: expected a positive number of megabytes, got {raw!r}")
    return int(mb * (1 << 20))


def _paths(key: str) -> Tuple[Path, Path, Path]:
    d = cache_dir()
    return d / f"{key}.cubin", d / f"{key}.log", d / f"{key}.json"


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file unique to this process and thread."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.{uuid.uuid4().hex}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise


def discard(key: str) -> None:
    """Remove an entry's files (missing ones are fine)."""
    for p in _paths(key):
        try:
            p.unlink()
        except OSError:
            pass


def holds(key: str) -> bool:
    """Whether the cache has an entry for ``key`` (its metadata written; :func:`read` checks the rest)."""
    return _paths(key)[2].exists()


def read(key: str) -> Optional[Tuple[str, str]]:
    """``(cubin path, ptxas log)`` of a sound entry, else None. A damaged entry (a file missing,
    truncated or changed since it was written) is removed with a warning and reads as a miss."""
    cubin_path, log_path, meta_path = _paths(key)
    if not meta_path.exists():
        return None
    try:
        meta = json.loads(meta_path.read_text())
        cubin, log = cubin_path.read_bytes(), log_path.read_bytes()
        sound = (meta.get("cubin_size") == len(cubin) and meta.get("log_size") == len(log)
                 and meta.get("cubin_sha256") == _digest(cubin) and meta.get("log_sha256") == _digest(log))
    except (OSError, ValueError, AttributeError):
        sound = False
    if not sound:
        warnings.warn(f"cuconv: the cached kernel {cubin_path.name} in {cubin_path.parent} is damaged; "
                      f"it is removed and compiled again", RuntimeWarning, stacklevel=3)
        discard(key)
        return None
    try:
        os.utime(meta_path)  # least recently used order for pruning
    except OSError:
        pass
    return str(cubin_path), log.decode(errors="replace")


def write(key: str, cubin: bytes, log: str) -> str:
    """Store an entry (cubin and log first, the metadata that vouches for them last); prune the cache
    to its size bound; return the cubin's path."""
    cubin_path, log_path, meta_path = _paths(key)
    log_bytes = log.encode()
    _atomic_write(cubin_path, cubin)
    _atomic_write(log_path, log_bytes)
    meta = {"cubin_size": len(cubin), "cubin_sha256": _digest(cubin), "log_size": len(log_bytes),
            "log_sha256": _digest(log_bytes)}
    _atomic_write(meta_path, json.dumps(meta).encode())
    _prune(keep=key)
    return str(cubin_path)


def _entries():
    """{key: (last use, total bytes)} of the entries in the cache folder (last use: the metadata's
    modification time, which :func:`read` touches)."""
    used, sizes = {}, {}
    for entry in os.scandir(cache_dir()):
        stem, _, suffix = entry.name.rpartition(".")
        if entry.name.startswith(".") or "." + suffix not in _SUFFIXES:
            continue
        try:
            st = entry.stat()
        except OSError:
            continue
        sizes[stem] = sizes.get(stem, 0) + st.st_size
        if suffix == "json" or stem not in used:
            used[stem] = st.st_mtime
    return {k: (used[k], sizes[k]) for k in sizes}


def _prune(keep: str) -> None:
    """Remove the least recently used entries until the cache is under 90% of :func:`max_bytes`."""
    limit = max_bytes()
    entries = _entries()
    total = sum(size for _, size in entries.values())
    if total <= limit:
        return
    for key, (_, size) in sorted(entries.items(), key=lambda kv: kv[1][0]):
        if total <= 0.9 * limit:
            break
        if key == keep:
            continue
        discard(key)
        total -= size


def clear_entries() -> int:
    """Remove every entry (and temporaries a killed process left behind); return how many entries."""
    entries = _entries()
    for key in entries:
        discard(key)
    for entry in os.scandir(cache_dir()):
        if entry.name.startswith(".") and entry.name.endswith(".tmp"):
            try:
                os.unlink(entry.path)
            except OSError:
                pass
    return len(entries)
