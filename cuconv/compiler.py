"""Kernel sources: where they live, how they are compiled, how they are loaded.

* Sources live in ``kernels_cu/`` (CUDA) and ``kernels_hip/`` (HIP) at the top of a checkout; an
  installed wheel carries them inside the package as ``cuconv/kernels_cu`` and
  ``cuconv/kernels_hip``. :func:`kernels_dir` finds either.
* CUDA sources are compiled with NVRTC (through ``cuda-bindings``) straight to a cubin for the
  exact target (``sm_90a`` unlocks wgmma/setmaxnreg), with ``-Xptxas -v`` so the register and
  spill report is always at hand (:class:`PtxasReport`). Cubins are cached on disk
  (:mod:`cuconv.kernel_cache`: checked on every hit, rebuilt when damaged), keyed by the hash of the
  whole source tree, the options and the NVRTC version, and loaded through
  ``cupy.RawModule(path=...)``, memoised per (source, defines, device). A cache miss reads the prebuilt
  store (:mod:`cuconv.prebuilt`: cubins compiled before installation) before it compiles. A cached cubin
  the driver refuses to load is compiled again once, with NVRTC. ``$CUCONV_COMPILE_LOG`` names a file that
  gets a JSON line per variant a process uses (:func:`_record_use`).
* Compile-time choices reach a source as ``-D`` defines; a kernel entry file composes the role
  headers of its folder (loader, pipeline, mainloop, epilogue, scheduler).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Tuple

from . import kernel_cache, prebuilt

__all__ = ["kernels_dir", "compile_cuda", "load_cuda_module", "load_cuda_function", "clear_cache", "nvrtc_check", "tree_hash",
           "variant_origin", "line_info", "PtxasReport", "CompileError"]

_PKG = Path(__file__).resolve().parent


class CompileError(RuntimeError):
    """A kernel source failed to compile; the message holds the compiler log."""


def kernels_dir(kind: str = "cu") -> Path:
    """Directory of the ``kernels_cu`` (``kind="cu"``) or ``kernels_hip`` (``kind="hip"``) sources."""
    name = {"cu": "kernels_cu", "hip": "kernels_hip"}[kind]
    for candidate in (_PKG / name, _PKG.parent / name):  # installed wheel, then checkout
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"cuconv: cannot find the {name}/ kernel sources next to {_PKG}")


@functools.lru_cache(maxsize=None)
def tree_hash(kind: str) -> str:
    """Hash of every file of a kernel tree (headers included), so any edit invalidates the cache."""
    root = kernels_dir(kind)
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if p.is_file():
            h.update(str(p.relative_to(root)).encode())
            h.update(p.read_bytes())
    return h.hexdigest()


@dataclass(frozen=True)
class FunctionResources:
    """ptxas's report for one kernel function."""

    name: str
    registers: int
    stack_frame: int
    spill_stores: int
    spill_loads: int
    shared_static: int


@dataclass(frozen=True)
class PtxasReport:
    """Per-function register / stack / spill figures parsed from ``ptxas -v``."""

    functions: Tuple[FunctionResources, ...]
    log: str

    @property
    def spills(self) -> int:
        return sum(f.spill_stores + f.spill_loads for f in self.functions)

    def function(self, name_part: str) -> FunctionResources:
        """The entry named ``name_part``, or else the first whose name contains it (an entry's name may
        be the prefix of another's, such as a debug entry ``<name>_stage_a``)."""
        for f in self.functions:
            if f.name == name_part:
                return f
        for f in self.functions:
            if name_part in f.name:
                return f
        raise KeyError(name_part)


def parse_ptxas(log: str) -> PtxasReport:
    funcs: List[FunctionResources] = []
    current: Optional[Dict] = None
    for line in log.splitlines():
        m = re.search(r"Compiling entry function '([^']+)'", line)
        if m:
            current = {"name": m.group(1), "registers": 0, "stack_frame": 0, "spill_stores": 0,
                       "spill_loads": 0, "shared_static": 0}
            funcs.append(current)  # filled in below; dicts are frozen into records at the end
            continue
        if current is None:
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m:
            current["stack_frame"], current["spill_stores"], current["spill_loads"] = map(int, m.groups())
        m = re.search(r"Used (\d+) registers", line)
        if m:
            current["registers"] = int(m.group(1))
        m = re.search(r"(\d+) bytes smem", line)
        if m:
            current["shared_static"] = int(m.group(1))
    return PtxasReport(functions=tuple(FunctionResources(**f) for f in funcs), log=log)


def _nvrtc():
    try:
        from cuda.bindings import nvrtc
    except ImportError as e:  # pragma: no cover - depends on the install
        raise ImportError("cuconv needs cuda-bindings to compile its CUDA kernels: "
                          "pip install 'cuconv[cuda13]' (or [cuda12])") from e
    return nvrtc


def nvrtc_check(result, what: str):
    """The values of an NVRTC call's result tuple, or :class:`CompileError` naming ``what`` on failure."""
    err = result[0]
    if int(err) != 0:
        raise CompileError(f"NVRTC {what} failed: {err}")
    return result[1:] if len(result) > 2 else (result[1] if len(result) == 2 else None)


def line_info() -> bool:
    """Whether cubins carry source line tables (``$CUCONV_LINEINFO`` set and not ``0``), for a profiler's
    source view (``ncu --import-source``). They leave the machine code as it is and make a cubin about
    three times larger (a bigger cache, slower module loads), so they are off unless asked for."""
    return os.environ.get("CUCONV_LINEINFO", "").strip() not in ("", "0")


def _options(arch: str, defines: Mapping[str, object], extra: Tuple[str, ...],
             lines: Optional[bool] = None) -> List[str]:
    """NVRTC's options for a variant; ``lines``: with line tables (default :func:`line_info`)."""
    opts = [f"--gpu-architecture={arch}", "--std=c++17", f"-I{kernels_dir('cu')}", "-Xptxas=-v",
            "--device-as-default-execution-space"]
    opts += ["-lineinfo"] if (line_info() if lines is None else lines) else []
    opts += [f"-D{k}={v}" for k, v in sorted(defines.items())]
    opts += list(extra)
    return opts


def _nvrtc_compile(source_rel: str, arch: str, opts: List[str]) -> Tuple[bytes, str]:
    """(cubin, log) of one NVRTC compile; :class:`CompileError` with the log when it fails."""
    nvrtc = _nvrtc()
    src_path = kernels_dir("cu") / source_rel
    prog = nvrtc_check(nvrtc.nvrtcCreateProgram(src_path.read_bytes(), str(src_path).encode(), 0, [], []),
                       f"program creation for {source_rel}")
    try:
        bopts = [o.encode() for o in opts]
        (cerr,) = nvrtc.nvrtcCompileProgram(prog, len(bopts), bopts)
        size = nvrtc_check(nvrtc.nvrtcGetProgramLogSize(prog), "log size")
        # NVRTC writes into the buffer. A bytes object of length 0 or 1 is one of CPython's shared
        # singletons (an empty log is 1 byte: its NUL), and writing into it would change that byte
        # for the whole process; two bytes or more is always a fresh object.
        buf = b" " * max(size, 2)
        nvrtc.nvrtcGetProgramLog(prog, buf)
        log = buf.decode(errors="replace").rstrip("\x00 ")
        if int(cerr):
            raise CompileError(f"compiling {source_rel} for {arch} with {opts} failed:\n{log}")
        size = nvrtc_check(nvrtc.nvrtcGetCUBINSize(prog), "cubin size")
        cubin = b" " * max(size, 2)  # a fresh object, as for the log
        nvrtc.nvrtcGetCUBIN(prog, cubin)
        cubin = cubin[:size]
    finally:
        nvrtc.nvrtcDestroyProgram(prog)
    return cubin, log


#: (source, arch, defines, extra options, line tables) -> (cache key, cubin path, report): what this process
#: compiled or read.
_COMPILED: Dict[tuple, Tuple[str, str, PtxasReport]] = {}
_COMPILE_LOCK = threading.Lock()


def _memo_key(source_rel: str, arch: str, defines_items: tuple, extra: tuple) -> tuple:
    """A variant's key in :data:`_COMPILED`, as this process compiles it now (with line tables or not)."""
    return source_rel, arch, defines_items, extra, line_info()


def _compile(source_rel: str, arch: str, defines_items: tuple, extra: tuple, fresh: bool = False):
    memo_key = _memo_key(source_rel, arch, defines_items, extra)
    hit = None if fresh else _COMPILED.get(memo_key)
    if hit is not None:
        return hit
    opts = _options(arch, dict(defines_items), extra, memo_key[-1])
    key = _cache_key(source_rel, arch, opts)
    if fresh:
        kernel_cache.discard(key)
    start = time.perf_counter()
    entry, via = kernel_cache.read(key), "cache"
    if entry is None:
        # the prebuilt store first (not when the driver refused what the cache held: that compiles afresh)
        found = None if fresh else prebuilt.find(tree_hash("cu"), source_rel, arch, opts)
        via = "nvrtc" if found is None else "store"
        cubin, log = found if found is not None else _nvrtc_compile(source_rel, arch, opts)
        entry = (kernel_cache.write(key, cubin, log), log)
    _record_use(source_rel, arch, defines_items, extra, via, time.perf_counter() - start)
    result = (key, entry[0], parse_ptxas(entry[1]))
    with _COMPILE_LOCK:
        _COMPILED[memo_key] = result
    return result


def _cache_key(source_rel: str, arch: str, opts: List[str]) -> str:
    """The kernel-cache key of a variant: the kernel tree, the source, the options and the NVRTC version."""
    version = nvrtc_check(_nvrtc().nvrtcVersion(), "version")
    return (f"{Path(source_rel).stem}-{arch}-"
            + hashlib.sha256(repr((tree_hash("cu"), source_rel, opts, version)).encode()).hexdigest()[:32])


def variant_origin(source_rel: str, arch: str, defines: Optional[Mapping[str, object]] = None,
                   extra_options: Tuple[str, ...] = ()) -> str:
    """Where the cubin of a variant comes from if it is needed now: ``"process"`` (this process has it),
    ``"cache"`` (the kernel cache), ``"store"`` (the prebuilt store) or ``"nvrtc"`` (compiled on first use).
    Reads no cubin and compiles nothing."""
    items, extra = tuple(sorted((defines or {}).items())), tuple(extra_options)
    memo_key = _memo_key(source_rel, arch, items, extra)
    if memo_key in _COMPILED:
        return "process"
    opts = _options(arch, dict(items), extra, memo_key[-1])
    if kernel_cache.holds(_cache_key(source_rel, arch, opts)):
        return "cache"
    return "store" if prebuilt.holds(tree_hash("cu"), source_rel, arch, opts) else "nvrtc"


_LOG_LOCK = threading.Lock()


def _record_use(source_rel: str, arch: str, defines_items: tuple, extra: tuple, via: str, seconds: float) -> None:
    """With ``$CUCONV_COMPILE_LOG`` set, append a JSON line for a variant this process uses for the first
    time: its source, arch, defines and extra options, where it came from (``cache``, ``store`` or
    ``nvrtc``) and the seconds that took. ``python -m cuconv.prebuilt build --jobs-from LOG`` builds a store
    of the variants a workload used (gradients, conv3d, shapes of its own)."""
    path = os.environ.get("CUCONV_COMPILE_LOG")
    if not path:
        return
    line = json.dumps({"source": source_rel, "arch": arch, "defines": dict(defines_items), "extra": list(extra),
                       "via": via, "seconds": round(seconds, 4)}, sort_keys=True)
    with _LOG_LOCK, open(path, "a") as f:
        f.write(line + "\n")


def compile_cuda(source_rel: str, arch: str, defines: Optional[Mapping[str, object]] = None,
                 extra_options: Tuple[str, ...] = ()) -> Tuple[str, PtxasReport]:
    """Compile ``kernels_cu/<source_rel>`` for ``arch`` (e.g. ``"sm_90a"``); return (cubin path, report).

    Works without a GPU (CI uses it to check every kernel compiles without spills). Memoised in the
    process and cached on disk.
    """
    _, path, report = _compile(source_rel, arch, tuple(sorted((defines or {}).items())), tuple(extra_options))
    return path, report


@functools.lru_cache(maxsize=256)
def _module(cubin_path: str, device_id: int, key: str):
    import cupy as cp
    with cp.cuda.Device(device_id):
        mod = cp.RawModule(path=cubin_path)
        mod.module  # load now: a cubin the driver refuses fails here, where the cache can heal it
        return mod


def load_cuda_module(source_rel: str, device, defines: Optional[Mapping[str, object]] = None,
                     extra_options: Tuple[str, ...] = ()):
    """Compile (or take from the cache) and load a CUDA source as a ``cupy.RawModule`` on ``device``.

    A cached cubin that the driver refuses (damaged in a way its checksum cannot see, or written for
    another driver) is compiled again once, with a warning; a second refusal raises, naming the file.
    """
    items, extra = tuple(sorted((defines or {}).items())), tuple(extra_options)
    key, path, _ = _compile(source_rel, device.arch, items, extra)
    try:
        return _module(path, device.index, key)
    except Exception as first:  # CUDADriverError and friends: the message says what the driver saw
        import warnings
        warnings.warn(f"cuconv: the driver refused the cached kernel {path} ({first}); compiling it again",
                      RuntimeWarning, stacklevel=2)
        key, path, _ = _compile(source_rel, device.arch, items, extra, fresh=True)
        _module.cache_clear()
        try:
            return _module(path, device.index, key)
        except Exception as second:
            raise RuntimeError(f"cuconv: the driver cannot load the kernel {path} even after compiling it "
                               f"again: {second}. Removing {kernel_cache.cache_dir()} (or cuconv.clear_cache()) "
                               f"resets the kernel cache.") from second


@functools.lru_cache(maxsize=None)
def _function(source_rel: str, device, defines_items: tuple, name: str):
    return load_cuda_module(source_rel, device, dict(defines_items)).get_function(name)


#: The dynamic shared-memory limit raised so far, per loaded function. The limit is an attribute of the
#: CUfunction, shared by every launch of it; it only ever grows, so no launch finds it below its need.
_SMEM_LIMITS: Dict[int, int] = {}


def load_cuda_function(source_rel: str, device, defines: Mapping[str, object], name: str, smem: int = 0):
    """The entry ``name`` of a compiled source on ``device`` (looked up once), its dynamic shared-memory
    limit at least ``smem`` bytes."""
    fn = _function(source_rel, device, tuple(sorted(defines.items())), name)
    if _SMEM_LIMITS.get(id(fn), 0) < smem:
        with _COMPILE_LOCK:  # two threads raising it at once must not leave the smaller of their limits
            if _SMEM_LIMITS.get(id(fn), 0) < smem:
                fn.max_dynamic_shared_size_bytes = smem
                _SMEM_LIMITS[id(fn)] = smem
    return fn


def clear_cache() -> int:
    """Remove every compiled kernel from the on-disk cache (:mod:`cuconv.kernel_cache`) and forget what
    this process compiled; return how many entries were removed. Modules already loaded stay loaded."""
    with _COMPILE_LOCK:
        _COMPILED.clear()
    return kernel_cache.clear_entries()
