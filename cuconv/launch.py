"""The host side of the kernel ABI, shared by every backend.

* C structs as NumPy scalars: CuPy passes a NumPy scalar argument to a kernel as its raw bytes, so a
  struct parameter is a NumPy structured scalar whose dtype mirrors it (``align=True`` reproduces C's
  member alignment and trailing padding): :func:`c_struct`.
* One 3-D view of a problem's geometry (:func:`geometry3d`: a 2-D problem is a 3-D one of depth 1)
  that every parameter-struct builder starts from.
* The fast divisor (``FastDivisor`` of kernels_cu/common/fast_div.cuh): :func:`fast_divisor`.
* The epilogue parameters, the absent-operand stand-in (:func:`operand_or`), grid sizes.
* Constants the host shares with a kernel source, read from the source (:func:`header_constants`).
* :class:`PackedLaunch`: a launch whose arguments are packed once.
"""

from __future__ import annotations

import ctypes
import functools
import re
import struct
import threading
from collections import OrderedDict
from typing import Dict, NamedTuple, Tuple

import numpy as np

from .problem import ConvProblem, Epilogue

__all__ = ["c_struct", "geometry3d", "Geometry3d", "conv_geometry", "epilogue_params", "epilogue_params64",
           "dtype_code", "DTYPE_TAGS", "dtype_tag", "grid_1d",
           "operand_or", "header_constants", "fast_divisor", "divisor_fields", "divisor_values", "PackedLaunch",
           "LaunchRecords", "current_stream",
           "RowKernel"]

#: Value of ``-DCUCONV_DTYPE`` for each dtype name (see kernels_cu/common/types.cuh).
DTYPE_CODES = {"float16": 0, "bfloat16": 1, "float32": 2, "float64": 3}


def dtype_code(dtype_name: str) -> int:
    return DTYPE_CODES[dtype_name]


#: The short tag of each dtype the kernels build for, as compiled variants' names spell it.
DTYPE_TAGS = {"float16": "f16", "bfloat16": "bf16", "float32": "f32"}


def dtype_tag(dtype_name: str) -> str:
    """``"f16"``, ``"bf16"`` or ``"f32"``: ``dtype_name`` in a compiled variant's name."""
    return DTYPE_TAGS[dtype_name]


def c_struct(fields, values) -> np.void:
    """A NumPy scalar with C layout: ``fields`` is ``[(name, numpy type), ...]`` in declaration order."""
    dt = np.dtype(list(fields), align=True)
    arr = np.zeros((), dtype=dt)
    for name, _ in fields:
        arr[name] = values[name]
    return arr[()]


def fast_divisor(d: int) -> Tuple[int, int]:
    """``(mul, shr)`` with ``x // d == (umulhi(x, mul) + x) >> shr`` for every ``0 <= x < 2**31``: the
    ``FastDivisor`` of kernels_cu/common/fast_div.cuh (a rounded-up reciprocal, shr = ceil(log2 d))."""
    if not 1 <= d < 2**31:
        raise ValueError(f"d: a divisor in [1, 2**31) expected, got {d}")
    shr = (d - 1).bit_length()
    return ((1 << 32) * ((1 << shr) - d)) // d + 1, shr


def divisor_fields(*names: str) -> list:
    """``c_struct`` fields of ``FastDivisor`` members ``names`` (each two uint32: mul, shr)."""
    return [(f"{n}_{part}", np.uint32) for n in names for part in ("mul", "shr")]


def divisor_values(**divisors: int) -> dict:
    """``c_struct`` values of ``FastDivisor`` members: ``name=divisor`` -> ``name_mul``, ``name_shr``."""
    out = {}
    for n, d in divisors.items():
        out[f"{n}_mul"], out[f"{n}_shr"] = fast_divisor(int(d))
    return out


class Geometry3d(NamedTuple):
    """A problem's spatial geometry with a depth axis in front (depth 1, no depth padding for conv2d)."""

    D: int
    H: int
    W: int
    O: int          # output depth
    P: int
    Q: int
    T: int          # filter depth
    R: int
    S: int
    stride: Tuple[int, int, int]
    dilation: Tuple[int, int, int]
    pad: Tuple[int, int, int]     # padding at the start of each dim (pad_lo)


def _as3(t, fill) -> tuple:
    return (fill,) * (3 - len(t)) + tuple(t)


@functools.lru_cache(maxsize=1024)
def geometry3d(p: ConvProblem) -> Geometry3d:
    """The 3-D geometry of ``p``: every struct builder reads its extents from here."""
    D, H, W = _as3(p.in_spatial, 1)
    O, P, Q = _as3(p.out_spatial, 1)
    T, R, S = _as3(p.filter_spatial, 1)
    return Geometry3d(D, H, W, O, P, Q, T, R, S, _as3(p.stride, 1), _as3(p.dilation, 1), _as3(p.pad_lo, 0))


_GEOMETRY_FIELDS = [(n, np.int64) for n in ("N", "D", "H", "W", "C", "Z", "P", "Q", "T", "R", "S", "Cg", "G", "Kg")] + \
    [(n, np.int32) for n in ("stride_d", "stride_h", "stride_w", "dil_d", "dil_h", "dil_w", "pad_d", "pad_h", "pad_w")]


def conv_geometry(p: ConvProblem) -> np.void:
    """The ``ConvGeometry`` struct of kernels_cu/generic/im2col_gemm.cu."""
    g = geometry3d(p)
    vals = dict(N=p.batch, D=g.D, H=g.H, W=g.W, C=p.channels, Z=g.O, P=g.P, Q=g.Q, T=g.T, R=g.R, S=g.S,
                Cg=p.channels_per_group, G=p.groups, Kg=p.out_channels_per_group)
    vals.update(zip(("stride_d", "stride_h", "stride_w"), g.stride))
    vals.update(zip(("dil_d", "dil_h", "dil_w"), g.dilation))
    vals.update(zip(("pad_d", "pad_h", "pad_w"), g.pad))
    return c_struct(_GEOMETRY_FIELDS, vals)


def operand_or(operand, stand_in):
    """``operand``, or ``stand_in`` when it is absent (None): kernels take every operand by pointer and
    read an optional one only when the epilogue flags say so, so an absent one is passed as any valid
    array of the call (the output)."""
    return stand_in if operand is None else operand


_CONSTANT = re.compile(r"^\s*#define\s+([A-Z][A-Z0-9_]*)\s+\(?\s*(-?\d+)\s*(?:\*\s*(\d+))?\s*\)?\s*(?://.*)?$")


@functools.lru_cache(maxsize=None)
def header_constants(source_rel: str) -> Dict[str, int]:
    """The integer ``#define NAME value`` (or ``value * factor``) lines of a kernel header
    (``source_rel`` relative to kernels_cu/): the one place a budget the host also needs is written."""
    from .compiler import kernels_dir
    out = {}
    for line in (kernels_dir("cu") / source_rel).read_text().splitlines():
        m = _CONSTANT.match(line)
        if m:
            out[m.group(1)] = int(m.group(2)) * (int(m.group(3)) if m.group(3) else 1)
    return out


_EPILOGUE_FIELDS = [("alpha", np.float32), ("beta", np.float32), ("activation", np.int32),
                    ("has_bias", np.int32), ("has_residual", np.int32)]


def epilogue_params(e: Epilogue) -> np.void:
    """The ``cuconv::EpilogueParams`` struct of kernels_cu/common/epilogue_math.cuh."""
    return c_struct(_EPILOGUE_FIELDS, dict(alpha=e.alpha, beta=e.beta, activation=e.activation_code,
                                           has_bias=int(e.has_bias), has_residual=int(e.loads_residual)))


_EPILOGUE64_FIELDS = [("alpha", np.float64), ("beta", np.float64), ("activation", np.int32),
                      ("has_bias", np.int32), ("has_residual", np.int32)]


def epilogue_params64(e: Epilogue) -> np.void:
    """The ``cuconv::EpilogueParams64`` struct (alpha and beta as doubles) of kernels_cu/common/epilogue_math.cuh,
    for the generic path's float64 accumulator."""
    return c_struct(_EPILOGUE64_FIELDS, dict(alpha=e.alpha, beta=e.beta, activation=e.activation_code,
                                             has_bias=int(e.has_bias), has_residual=int(e.loads_residual)))


def resident_blocks(fn, block: int, shared_mem: int) -> int:
    """CTAs of the loaded ``cupy.RawKernel`` ``fn`` that one SM runs at once with ``block`` threads and
    ``shared_mem`` bytes of dynamic shared memory (the driver's occupancy calculator, which counts the
    kernel's registers too): the CTAs per SM of a persistent grid."""
    from cuda.bindings import driver
    err, blocks = driver.cuOccupancyMaxActiveBlocksPerMultiprocessor(driver.CUfunction(fn.kernel.ptr), int(block),
                                                                     int(shared_mem))
    if int(err) != 0:
        raise RuntimeError(f"cuOccupancyMaxActiveBlocksPerMultiprocessor failed: {err}")
    return max(1, int(blocks))


def grid_1d(total: int, block: int = 256, max_blocks: int = 65535 * 8) -> tuple:
    """Blocks for a grid-stride loop over ``total`` elements."""
    return (max(1, min(-(-total // block), max_blocks)),)


def _current_stream_first_use():
    """CuPy's current stream (``cupy.cuda.get_current_stream()``); binds :func:`current_stream` to CuPy's
    function, so that later calls (through this module's name) go straight to CuPy."""
    global current_stream
    from cupy.cuda import get_current_stream
    current_stream = get_current_stream
    return get_current_stream()


#: CuPy's current stream: ``current_stream()`` (CuPy looked up on the first call only).
current_stream = _current_stream_first_use


class PackedLaunch:
    """A kernel launch whose arguments are packed once, for calls that repeat it many times.

    ``RawKernel.__call__`` converts every argument on every launch (several microseconds for the
    Hopper kernel's seven, three of them 128-byte TMA descriptors); this keeps each argument's bytes
    in host memory (the pointer slots side by side, each other argument 64-byte aligned, as a
    ``CUtensorMap`` wants) with a ``void*`` table pointing at them, and launches through
    ``cuLaunchKernel`` (``cupy.cuda.driver.launchKernel``, a fraction of that cost). Arguments that
    change between launches (``slots``: the increasing indices of 64-bit pointers, such as the operands'
    addresses) are rewritten in place by :meth:`__call__`, all with one write.

    A record may be launched from several host threads at once (dask's threaded scheduler calls one
    layer's plan from each of its threads): a launch holds the record's lock from writing its slots
    until the driver has read them.

    ``args`` are NumPy scalars (``np.void`` structs, ``np.uint64`` pointers...) in the kernel's
    parameter order. ``grid`` is an int (x; y and z are 1) or an (x[, y[, z]]) tuple; a kernel's
    compile-time cluster dimensions apply as usual.
    """

    _ALIGN = 64

    def __init__(self, fn, grid, block: int, shared_mem: int, args, slots: Tuple[int, ...] = ()):
        self._function = fn.kernel.ptr   # RawKernel -> loaded cupy Function -> CUfunction
        dims = tuple(int(g) for g in (grid if isinstance(grid, tuple) else (grid,)))
        self._grid = dims + (1,) * (3 - len(dims))
        self._block, self._smem = int(block), int(shared_mem)
        blobs = [np.asarray(a).tobytes() for a in args]
        if list(slots) != sorted(set(slots)) or any(not 0 <= i < len(blobs) for i in slots):
            raise ValueError(f"slots: expected increasing argument indices below {len(blobs)}, got {tuple(slots)}")
        for slot in slots:
            if len(blobs[slot]) != 8:
                raise ValueError(f"slots: argument {slot} is {len(blobs[slot])} bytes, not a 64-bit pointer")
        # The slots lie side by side at the start (8 bytes each), so one struct.pack_into writes them all;
        # every other argument follows at a 64-byte boundary.
        offsets, total = [0] * len(blobs), 8 * len(slots)
        for i, slot in enumerate(slots):
            offsets[slot] = 8 * i
        for i, b in enumerate(blobs):
            if i not in slots:
                total = -(-total // self._ALIGN) * self._ALIGN
                offsets[i] = total
                total += max(len(b), 8)
        self._storage = ctypes.create_string_buffer(total + self._ALIGN)
        shift = -ctypes.addressof(self._storage) % self._ALIGN
        base = ctypes.addressof(self._storage) + shift
        for off, b in zip(offsets, blobs):
            ctypes.memmove(base + off, b, len(b))
        self._table = (ctypes.c_void_p * len(blobs))(*[base + off for off in offsets])
        self._table_ptr = ctypes.addressof(self._table)
        from cupy.cuda import driver, get_current_stream  # looked up once, not per launch
        self._current_stream = get_current_stream
        # driver.launchKernel with everything but the stream bound: (stream, parameter table, extra) per call
        self._launch_kernel = functools.partial(driver.launchKernel, self._function, *self._grid, self._block, 1, 1,
                                                self._smem)
        self._write_slots = functools.partial(struct.Struct(f"<{len(slots)}Q").pack_into, self._storage, shift)
        # The slots are shared by every thread that launches this record, and the driver reads them while
        # CuPy's launchKernel has released the GIL: a launch holds the lock from its writes to its return.
        # (acquire / release in try-finally: a third of the cost of a ``with`` block, per launch.)
        self._lock = threading.Lock()
        self._acquire, self._release = self._lock.acquire, self._lock.release

    def __call__(self, *pointers: int) -> None:
        """Launch on the current CuPy stream, with ``pointers`` (one per slot, in order) in the slots."""
        self.on_stream(self._current_stream().ptr, *pointers)

    def on_stream(self, stream_ptr: int, *pointers: int) -> None:
        """:meth:`__call__` on the stream ``stream_ptr`` (a caller that has looked the current stream up
        already)."""
        self._acquire()
        try:
            self._write_slots(*pointers)
            self._launch_kernel(stream_ptr, self._table_ptr, 0)
        except Exception as e:
            if getattr(e, "status", None) != CUDA_ERROR_INVALID_CONTEXT:
                raise
            # A thread's first launch: no context is current in it yet (CuPy binds one lazily, and a
            # pooled allocation need not): bind the current device's and launch again.
            bind_current_context()
            self._launch_kernel(stream_ptr, self._table_ptr, 0)
        finally:
            self._release()


#: The driver's status for a launch from a thread with no current context.
CUDA_ERROR_INVALID_CONTEXT = 201


def bind_current_context() -> None:
    """Make the current device's primary context current in the calling thread (``cudaSetDevice`` binds it,
    CUDA 12 and newer): what a launch through the driver API needs in a thread that has made none."""
    from cupy.cuda import runtime
    runtime.setDevice(runtime.getDevice())


class LaunchRecords:
    """Launch records (:class:`PackedLaunch`) by key, the least recently used dropped beyond ``limit``.

    Shared by the host threads that call one plan: a record another thread drops between a lookup and
    its use stays valid (it is only no longer kept), and one two threads build at once is kept once."""

    def __init__(self, limit: int):
        self._limit = limit
        self._records: "OrderedDict" = OrderedDict()
        # (key, record) of the latest get or put: already the most recently used, so a layer called again
        # (the usual case) is answered without the LRU's bookkeeping
        self._last = (None, None)

    def get(self, key):
        """The record of ``key`` (now the most recently used), or None."""
        last = self._last
        if last[0] == key:
            return last[1]
        record = self._records.get(key)
        if record is not None:
            self._last = (key, record)
            try:
                self._records.move_to_end(key)
            except KeyError:  # dropped by another thread meanwhile
                pass
        return record

    def put(self, key, record) -> None:
        self._records[key] = record
        self._last = (key, record)
        while len(self._records) > self._limit:
            try:
                self._records.popitem(last=False)
            except KeyError:  # emptied by another thread meanwhile
                break

    def __len__(self) -> int:
        return len(self._records)


class RowKernel:
    """A ``(src, dst, args)`` kernel over rows of one geometry on one GPU (a pre-pass such as the float32
    split or the width fold), its argument struct packed once per load width, on first use: 16-byte
    loads (``vec_loads = 1``) where ``vec_ok`` and the source is 16-byte aligned. Subclasses name the
    ``source`` (under kernels_cu/), the ``function`` and the struct's ``fields``."""

    source: str = ""
    function: str = ""
    fields: list = []

    def __init__(self, device_index: int, geometry: dict, threads: int, vec_ok: bool):
        self.device_index = device_index
        self.geometry = geometry
        self.grid = grid_1d(threads, 256, max_blocks=132 * 16)
        self._vec_ok = vec_ok
        self._launches: dict = {}

    def __call__(self, src, dst) -> None:
        """Run on ``src`` into ``dst`` (C-contiguous arrays of the geometry's sizes), on the current stream."""
        vec = self._vec_ok and src.data.ptr % 16 == 0
        launch = self._launches.get(vec)
        if launch is None:
            from .compiler import load_cuda_function
            from .device import gpu_info
            fn = load_cuda_function(self.source, gpu_info(self.device_index), {}, self.function)
            launch = self._launches[vec] = PackedLaunch(fn, self.grid, 256, 0,
                                                        (np.uint64(0), np.uint64(0), self.args(vec)), slots=(0, 1))
        launch(src.data.ptr, dst.data.ptr)

    def args(self, vec: bool) -> np.void:
        """The kernel's argument struct for this geometry (``vec``: 16-byte loads)."""
        return c_struct(self.fields, dict(self.geometry, vec_loads=int(vec)))
