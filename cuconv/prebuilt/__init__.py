"""The prebuilt kernel store: cubins compiled before installation, read instead of compiling with NVRTC.

A fresh environment compiles each kernel variant on its first use (about a second each), so a network's
first forward pass would wait for every variant it meets. A wheel built after
``python -m cuconv.prebuilt build`` carries the common variants (every conv layer of the networks suite,
:mod:`cuconv.prebuilt.build`) in ``cuconv/prebuilt/cubins/``; the compiler (:mod:`cuconv.compiler`) asks
this store on a kernel-cache miss, before NVRTC, and copies what it finds into the kernel cache.

The store is a folder holding ``index.json`` and one ``<key>.cubin.xz`` (LZMA) per variant. A key is the
SHA-256 of the kernel tree's hash, the source, the architecture and the compile options other than the
include path (which names the folder the sources were compiled in), so an edited kernel tree, another
option or another define never finds a cubin that was not compiled from exactly it. The NVRTC version is
not part of the key: a cubin loads on any driver of its CUDA version or newer, and one that the driver
refuses is compiled again (:func:`cuconv.compiler.load_cuda_module`). Each entry carries its cubin's
SHA-256 and ptxas log; a damaged entry reads as a miss, with a warning.

Which store: ``$CUCONV_PREBUILT`` names a folder (a store built once on shared disk for a cluster), or
``0`` / ``off`` turns the store off; unset, the package's own ``cuconv/prebuilt/cubins/`` (absent from a
source checkout until built). ``python -m cuconv.prebuilt show`` says what a store holds.
"""

from __future__ import annotations

import functools
import hashlib
import json
import lzma
import os
import warnings
from pathlib import Path
from typing import Dict, Optional, Sequence, Tuple

__all__ = ["store_dir", "entry_key", "holds", "find", "Store", "open_store", "INDEX", "FORMAT"]

#: The file that lists a store's entries.
INDEX = "index.json"
#: The index format this code reads and writes.
FORMAT = 1

_PACKAGE_STORE = Path(__file__).resolve().parent / "cubins"
_OFF = ("0", "off", "no", "false")


def store_dir() -> Optional[Path]:
    """The store in use: ``$CUCONV_PREBUILT`` (a folder, or ``0`` / ``off`` for none), else the package's."""
    raw = os.environ.get("CUCONV_PREBUILT")
    if raw is None:
        return _PACKAGE_STORE
    raw = raw.strip()
    if not raw or raw.lower() in _OFF:
        return None
    return Path(raw).expanduser()


def entry_key(tree_hash: str, source_rel: str, arch: str, options: Sequence[str]) -> str:
    """The key of a variant: its kernel tree, source, architecture and compile options, less the include
    path (``-I...``), which depends on where the sources lie and not on what they compile to."""
    opts = tuple(o for o in options if not o.startswith("-I"))
    digest = hashlib.sha256(repr((tree_hash, source_rel, arch, opts)).encode()).hexdigest()[:40]
    return f"{Path(source_rel).stem}-{arch}-{digest}"


class Store:
    """A store's index, read once: ``entries`` maps a key to its record (source, arch, defines, file,
    cubin SHA-256, ptxas log); ``tree_hash`` and ``nvrtc`` say what it was compiled from and with."""

    def __init__(self, folder: Path, index: dict):
        self.folder = folder
        self.tree_hash: str = index.get("tree_hash", "")
        self.nvrtc: Tuple[int, ...] = tuple(index.get("nvrtc", ()))
        self.entries: Dict[str, dict] = index.get("entries", {})

    def read(self, key: str) -> Optional[Tuple[bytes, str]]:
        """``(cubin, ptxas log)`` of an entry, else None; a damaged entry warns and reads as None."""
        record = self.entries.get(key)
        if record is None:
            return None
        path = self.folder / record["file"]
        try:
            cubin = lzma.decompress(path.read_bytes())
            sound = hashlib.sha256(cubin).hexdigest() == record["sha256"]
        except (OSError, lzma.LZMAError, KeyError):
            sound = False
        if not sound:
            warnings.warn(f"cuconv: the prebuilt kernel {path} is damaged or missing; it is compiled instead",
                          RuntimeWarning, stacklevel=4)
            return None
        return cubin, record.get("log", "")

    def describe(self, tree_hash: Optional[str] = None) -> str:
        """One line: where, how many variants for which architectures, and whether they match the
        kernel tree ``tree_hash`` (a store of another tree serves nothing)."""
        archs: Dict[str, int] = {}
        for record in self.entries.values():
            archs[record["arch"]] = archs.get(record["arch"], 0) + 1
        held = ", ".join(f"{n} for {a}" for a, n in sorted(archs.items())) or "no variants"
        nvrtc = ".".join(map(str, self.nvrtc)) or "an unknown NVRTC"
        line = f"prebuilt store {self.folder}: {held} (NVRTC {nvrtc})"
        if tree_hash is not None and self.tree_hash != tree_hash:
            line += "; compiled from other kernel sources than these, so it serves none of them"
        return line


@functools.lru_cache(maxsize=8)
def _load(folder: str, stamp: Tuple[int, int]) -> Optional[Store]:
    path = Path(folder) / INDEX
    try:
        index = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        warnings.warn(f"cuconv: the prebuilt store index {path} cannot be read ({e}); kernels are compiled "
                      f"instead", RuntimeWarning, stacklevel=4)
        return None
    if not isinstance(index, dict) or index.get("format") != FORMAT:
        warnings.warn(f"cuconv: the prebuilt store index {path} is not of format {FORMAT}; kernels are compiled "
                      f"instead", RuntimeWarning, stacklevel=4)
        return None
    return Store(Path(folder), index)


def open_store(folder: Optional[Path] = None) -> Optional[Store]:
    """The store in ``folder`` (default :func:`store_dir`), read once per version of its index; None when
    there is none (no folder, no index, or an index that cannot be read, with a warning)."""
    folder = store_dir() if folder is None else folder
    if folder is None:
        return None
    try:
        st = (folder / INDEX).stat()
    except OSError:
        return None
    return _load(str(folder), (st.st_mtime_ns, st.st_size))


def _lookup(tree_hash: str, source_rel: str, arch: str, options: Sequence[str]):
    """``(store, key)`` of a variant in the store in use, or None (no store, or one of another kernel tree)."""
    store = open_store()
    if store is None or store.tree_hash != tree_hash:
        return None
    return store, entry_key(tree_hash, source_rel, arch, options)


def holds(tree_hash: str, source_rel: str, arch: str, options: Sequence[str]) -> bool:
    """Whether the store in use lists the variant (its entry is checked when :func:`find` reads it)."""
    found = _lookup(tree_hash, source_rel, arch, options)
    return found is not None and found[1] in found[0].entries


def find(tree_hash: str, source_rel: str, arch: str, options: Sequence[str]) -> Optional[Tuple[bytes, str]]:
    """``(cubin, ptxas log)`` of a variant from the store in use, or None (no store, another kernel tree,
    a variant it does not hold, or a damaged entry)."""
    found = _lookup(tree_hash, source_rel, arch, options)
    return None if found is None else found[0].read(found[1])
