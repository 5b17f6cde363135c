"""The caller's layout and the kernels' channels-last layout: moving operands between them.

Every kernel computes channels-last: activations ``(N, *spatial, C)``, weights ``(K, *filter, C/g)``.
A channels-first call (``NCHW`` / ``NCDHW``, weights ``(K, C/g, *filter)`` as torch) is served by
moving its operands, each move one batched 2-D transpose:

=============  ==============================  =====================  ==========================
operand        from                            to                     where
=============  ==============================  =====================  ==========================
x, w           ``(N, C, *spatial)``,           ``(N, *spatial, C)``,  one per-stream scratch buffer
               ``(K, C/g, *filter)``           ``(K, *filter, C/g)``
residual       ``(N, K, *out_spatial)``        ``(N, *out_spatial, K)``  a per-stream scratch buffer
result         ``(N, *out_spatial, K)``        ``(N, K, *out_spatial)``  ``out``, or the returned array
=============  ==============================  =====================  ==========================

The kernel writes the result channels-last into a scratch buffer too, so a channels-first call
allocates only the array it returns. Weights are moved on every call: they may change between
calls, so nothing is cached on their address.

On a CUDA GPU each move is a transpose of ``kernels_cu/layout/transpose.cu`` (tiles through shared
memory, whole 128-byte lines read and written) with its arguments packed once per shape
(:class:`~cuconv.launch.PackedLaunch`); the only requirement is that the spatial axes of the
channels-first array are contiguous among themselves (any batch and channel strides: channel
slices qualify). A call's x and w move together, in one launch into one scratch buffer
(:func:`operands_to_channels_last`), and a contiguous operand of one pixel per row (a 1x1 filter)
is already channels-last and is reshaped. A kernel that reads x channels-first itself
(:attr:`cuconv.plan.Plan.reads_x_channels_first`) gets x as it is and w alone moved
(:func:`kept_x_moved_w`). Other arrays (and NumPy arrays, and ROCm) take the array
library's copy (``moveaxis`` + ``ascontiguousarray``). :func:`describe` gives the line
``cuconv.explain`` prints.
"""

from __future__ import annotations

import functools
import math
from threading import get_ident
from typing import Optional

import numpy as np

from .arrays import contiguous_strides
from . import launch as _launch_module
from .launch import PackedLaunch, c_struct, divisor_fields, divisor_values
from .problem import LAYOUTS
from .scratch import STATE as SCRATCH
from .scratch import scratch

__all__ = ["to_channels_last", "operands_to_channels_last", "operands_mover", "kept_channels_first", "kept_x_moved_w",
           "operands_for",
           "operands_mover_for", "to_channels_first", "flip_taps",
           "flip_filter", "flip_filter_launch", "flipped_shape", "scatter_phase", "scatter_phase_launch",
           "scatter_args", "describe", "SOURCE", "FLIP_SOURCE", "SCATTER_SOURCE", "COMPILE_VARIANTS"]

SOURCE = "layout/transpose.cu"
FLIP_SOURCE = "layout/flip_filter.cu"
SCATTER_SOURCE = "layout/phase_scatter.cu"
#: What CI compiles (tests/test_compile.py): the transposes, the filter flip and the phase scatter on
#: both portable targets.
COMPILE_VARIANTS = [(src, {}, arch) for src in (SOURCE, FLIP_SOURCE, SCATTER_SOURCE) for arch in ("sm_80", "sm_90a")]
_MAX_GRID_YZ = 65535
_THIN = 16  # rows or cols at most this: the thin kernel (no tile)
_ARGS_FIELDS = ([(n, np.int64) for n in ("rows", "cols", "x_batch_stride", "x_row_stride", "y_batch_stride",
                                         "y_row_stride")] + [("word_loads", np.int32), ("word_stores", np.int32)])


class _Move:
    """One transpose geometry ``y[b][c][r] = x[b][r][c]`` on one GPU, ready to launch: the kernel and
    grid for it, and a :class:`~cuconv.launch.PackedLaunch` per access width, made on first use (16-bit
    elements move as 32-bit words where both pointers allow it)."""

    def __init__(self, device_id, itemsize, batch, rows, cols, xbs, xrs, ybs, yrs):
        self.device_id = device_id
        if min(rows, cols) <= _THIN:
            self.name = f"transpose_thin_b{8 * itemsize}"
            self.grid = (-(-max(rows, cols) // 256), 1, batch)
        else:
            tile = 64 if itemsize == 2 else 32
            self.name = f"transpose_b{8 * itemsize}"
            self.grid = (-(-cols // tile), -(-rows // tile), batch)
        self.geometry = dict(rows=rows, cols=cols, x_batch_stride=xbs, x_row_stride=xrs, y_batch_stride=ybs,
                             y_row_stride=yrs)
        self._word_loads = itemsize == 2 and cols % 2 == 0 and xbs % 2 == 0 and xrs % 2 == 0
        self._word_stores = itemsize == 2 and rows % 2 == 0 and ybs % 2 == 0 and yrs % 2 == 0
        self._launches: dict = {}

    def _launch(self, words):
        from .compiler import load_cuda_function
        from .device import gpu_info
        fn = load_cuda_function(SOURCE, gpu_info(self.device_id), {}, self.name)
        args = c_struct(_ARGS_FIELDS, dict(self.geometry, word_loads=int(words[0]), word_stores=int(words[1])))
        launch = self._launches[words] = PackedLaunch(fn, self.grid, 256, 0, (np.uint64(0), np.uint64(0), args),
                                                      slots=(0, 1))
        return launch

    def __call__(self, src, dst) -> None:
        """Launch on ``src``'s GPU (the current CuPy stream of that device)."""
        sp, dp = src.data.ptr, dst.data.ptr
        words = (self._word_loads and sp % 4 == 0, self._word_stores and dp % 4 == 0)
        launch = self._launches.get(words) or self._launch(words)
        if _RUNTIME.getDevice() == self.device_id:
            launch(sp, dp)
        else:
            import cupy
            with cupy.cuda.Device(self.device_id):
                launch(sp, dp)


def _matrix_view(a):
    """``(batch, rows, cols, batch stride, row stride)`` in elements when ``a`` (``(B, R, *rest)``)
    reads as a batch of row-major ``R x prod(rest)`` matrices: the ``rest`` axes contiguous among
    themselves, any batch and row strides. None when its strides do not allow one transpose."""
    return _matrix_view_of(tuple(a.shape), tuple(a.strides), a.itemsize)


@functools.lru_cache(maxsize=1024)
def _matrix_view_of(shape, strides, item):
    if any(s % item or s < 0 for s in strides):
        return None
    st = [s // item for s in strides]
    step = 1
    for n, s in zip(reversed(shape[2:]), reversed(st[2:])):
        if n > 1 and s != step:
            return None
        step *= n
    return shape[0], shape[1], math.prod(shape[2:]), st[0], st[1]


@functools.lru_cache(maxsize=1024)
def _move_to_last(shape, strides, item, device_id) -> Optional[_Move]:
    """The move of a channels-first array ``(B, R, *rest)`` to a contiguous ``(B, *rest, R)``, or None
    when no kernel takes it."""
    view = _matrix_view_of(shape, strides, item)
    if view is None or not _fits(item, *view[:3]):
        return None
    batch, rows, cols, xbs, xrs = view
    return _Move(device_id, item, batch, rows, cols, xbs, xrs, rows * cols, rows)


@functools.lru_cache(maxsize=1024)
def _move_to_first(shape, item, dest_strides, device_id) -> Optional[_Move]:
    """The move of a contiguous channels-last ``(B, *rest, K)`` into a channels-first array of strides
    ``dest_strides`` (shape ``(B, K, *rest)``), or None when no kernel takes it."""
    dest_shape = (shape[0], shape[-1], *shape[1:-1])
    view = _matrix_view_of(dest_shape, dest_strides, item)
    if view is None or not _fits(item, *view[:3]):
        return None
    batch, k, pixels, ybs, yrs = view
    return _Move(device_id, item, batch, pixels, k, pixels * k, k, ybs, yrs)


def _fits(item, batch, rows, cols) -> bool:
    return item in (2, 4) and batch * rows * cols > 0 and batch <= _MAX_GRID_YZ and -(-rows // 32) <= _MAX_GRID_YZ


def _on_cuda(xp) -> bool:
    return xp is not np and not _is_hip()


@functools.lru_cache(maxsize=None)
def _is_hip() -> bool:
    import cupy
    global _RUNTIME
    _RUNTIME = cupy.cuda.runtime
    return bool(cupy.cuda.runtime.is_hip)


_RUNTIME = None  # cupy.cuda.runtime, bound on the first GPU call


def to_channels_last(a, channels_first: bool, xp, purpose: Optional[str] = None):
    """``a`` channels-last and C-contiguous: itself when it already is; a channels-first ``a``
    (``(N, C, *spatial)`` or weights ``(K, C/g, *filter)``) moved to ``(N, *spatial, C)``. On a CUDA GPU
    the move lands in the scratch buffer ``purpose`` when one is named (the caller uses the result
    before its next call on the stream), else in a new array."""
    if not channels_first:
        return a if a.flags.c_contiguous else xp.ascontiguousarray(a)
    if _on_cuda(xp) and a.ndim >= 3:
        move = _move_to_last(a.shape, a.strides, a.itemsize, a.data.device_id)
        if move is not None:
            shape = (a.shape[0], *a.shape[2:], a.shape[1])
            dst = scratch(_PURPOSES[purpose], shape, a.dtype) if purpose else xp.empty(shape, a.dtype)
            move(a, dst)
            return dst
    return xp.ascontiguousarray(xp.moveaxis(a, 1, -1))


_PURPOSES = {name: f"channels-last {name}" for name in ("x", "w", "residual")}

_PAIR_FIELDS = [f"m{i}_{name}" for i in (0, 1) for name in ("rows", "cols", "x_batch_stride", "x_row_stride",
                                                             "y_batch_stride", "y_row_stride", "word_loads",
                                                             "word_stores", "first_block", "tiles_x", "tiles_y",
                                                             "thin")]
_PAIR_FIELDS = [(n, np.int64 if i % 12 < 6 else np.int32) for i, n in enumerate(_PAIR_FIELDS)]
_PAIR_ALIGN = 256  # each moved operand's copy starts on this boundary of the shared scratch buffer


class _Operands:
    """How a channels-first call's ``x`` and ``w`` (arrays of fixed shapes, strides and device) become
    channels-last, decided once: each operand is either moved (a :class:`_Move` geometry) or, when it
    is one contiguous pixel per row (a 1x1 filter, a 1x1 image), reshaped. The moves run as one launch
    of ``transpose_pair_b16`` / ``_b32`` (the two geometries on one linear grid; a single move leaves
    the second empty) into one scratch buffer whose views are made once per buffer; the argument
    struct is packed once per pair of load widths. A call then costs at most one launch and one
    scratch lookup."""

    def __init__(self, device_id, dtype, moves, shapes):
        self.device_id = device_id
        self.dtype = dtype
        self.moves = moves      # per operand: a _Move, or None (reshaped)
        self.shapes = shapes    # per operand: its channels-last shape
        item = np.dtype(dtype).itemsize
        self.name = f"transpose_pair_b{8 * item}"
        self.offsets, self.sizes, end = [], [], 0
        for move, shape in zip(moves, shapes):
            size = math.prod(shape) * item if move is not None else 0
            self.offsets.append(end)
            self.sizes.append(size)
            end += -(-size // _PAIR_ALIGN) * _PAIR_ALIGN
        self.nbytes = end
        self.launched = [i for i, m in enumerate(moves) if m is not None]
        blocks = [math.prod(moves[i].grid) for i in self.launched]
        self.first_blocks = (0, blocks[0]) if blocks else ()
        self.grid = sum(blocks)
        self._launches: dict = {}
        self._made = (None, None, None, None, None)  # the views of the last scratch buffer used (see __call__)
        self._x_moved, self._both = moves[0] is not None, len(self.launched) == 2
        # per launched move (in order): whether its source may be read in 32-bit words, given the address
        self._loads = tuple(bool(moves[i]._word_loads) for i in self.launched) + (False,) * (2 - len(self.launched))

    def _launch(self, words):
        from .compiler import load_cuda_function
        from .device import gpu_info
        values = {}
        for slot in (0, 1):
            if slot < len(self.launched):
                move = self.moves[self.launched[slot]]
                fields = dict(move.geometry, word_loads=int(words[slot]), word_stores=int(move._word_stores),
                              first_block=self.first_blocks[slot], tiles_x=move.grid[0], tiles_y=move.grid[1],
                              thin=int(move.name.startswith("transpose_thin")))
            else:  # no second move: its first block is past the grid
                fields = {name[3:]: 0 for name, _ in _PAIR_FIELDS[:12]}
                fields.update(first_block=self.grid, tiles_x=1, tiles_y=1)
            values.update({f"m{slot}_{k}": v for k, v in fields.items()})
        fn = load_cuda_function(SOURCE, gpu_info(self.device_id), {}, self.name)
        launch = self._launches[words] = PackedLaunch(fn, self.grid, 256, 0, (np.uint64(0),) * 4 +
                                                      (c_struct(_PAIR_FIELDS, values),), slots=(0, 1, 2, 3))
        return launch

    def __call__(self, x, w):
        """``(x, w)`` channels-last: moved ones as views of the current stream's scratch buffer (one
        launch fills them), reshaped ones as views of the caller's arrays."""
        if not self.launched:
            return x.reshape(self.shapes[0]), w.reshape(self.shapes[1])
        if _RUNTIME.getDevice() != self.device_id:
            import cupy
            with cupy.cuda.Device(self.device_id):
                return self(x, w)
        stream, thread = _launch_module.current_stream().ptr, get_ident()
        # (stream, thread, scratch generation, views, destination addresses) of the buffer used last, read
        # once (other threads may replace it): while no scratch buffer was made or dropped since, the views
        # are still of this stream and thread's buffer, and its lookup is skipped
        made = self._made
        if made[0] != stream or made[1] != thread or made[2] != SCRATCH.generation:
            flat = scratch("channels-last x and w", (self.nbytes,), np.uint8)
            views = tuple(flat[off:off + size].view(self.dtype).reshape(shape) if move is not None else None
                          for move, off, size, shape in zip(self.moves, self.offsets, self.sizes, self.shapes))
            made = self._made = (stream, thread, SCRATCH.generation, views,
                                 [v.data.ptr for v in views if v is not None] + [0])
        vx, vw = made[3]
        dst = made[4]
        if self._both:
            src0, src1 = x.data.ptr, w.data.ptr
        elif self._x_moved:
            src0, src1 = x.data.ptr, 0
        else:
            src0, src1 = w.data.ptr, 0
        words = (self._loads[0] and src0 % 4 == 0, self._loads[1] and src1 % 4 == 0)
        launch = self._launches.get(words) or self._launch(words)
        launch(src0, dst[0], src1, dst[1])
        return (vx if vx is not None else x.reshape(self.shapes[0]),
                vw if vw is not None else w.reshape(self.shapes[1]))


@functools.lru_cache(maxsize=1024)
def _operands_of(x_shape, x_strides, w_shape, w_strides, dtype, device_id) -> Optional[_Operands]:
    """The :class:`_Operands` of a channels-first call's x and w, or None when an operand neither
    reshapes nor takes one transpose (the array library's copy then moves it)."""
    item = np.dtype(dtype).itemsize
    moves = []
    for shape, strides in ((x_shape, x_strides), (w_shape, w_strides)):
        if math.prod(shape[2:]) == 1 and strides == contiguous_strides(shape, item):
            moves.append(None)
            continue
        move = _move_to_last(shape, strides, item, device_id)
        if move is None:
            return None
        moves.append(move)
    if sum(math.prod(m.grid) for m in moves if m is not None) >= 2**31:
        return None
    shapes = tuple((s[0], *s[2:], s[1]) for s in (x_shape, w_shape))
    return _Operands(device_id, dtype, tuple(moves), shapes)


def operands_to_channels_last(x, w, xp):
    """``(x, w)`` of a channels-first call (``(N, C, *spatial)``, ``(K, C/g, *filter)``), channels-last
    and contiguous, to be read (never written) by the call's kernels. On a CUDA GPU at most one launch
    moves them (:class:`_Operands`; a contiguous array of one pixel per row, such as a 1x1 filter, is
    reshaped instead); otherwise each as :func:`to_channels_last` moves it into its scratch buffer."""
    if _on_cuda(xp) and x.ndim >= 3:
        ops = _operands_of(x.shape, x.strides, w.shape, w.strides, x.dtype, x.data.device_id)
        if ops is not None:
            return ops(x, w)
    return to_channels_last(x, True, xp, "x"), to_channels_last(w, True, xp, "w")


def operands_mover(x, w, xp):
    """What :func:`operands_to_channels_last` does for arrays of the shapes, strides and device of ``x``
    and ``w``, as a callable ``(x, w) -> (x, w)`` to keep and call again: the :class:`_Operands` itself
    where there is one (no lookup per call)."""
    if _on_cuda(xp) and x.ndim >= 3:
        ops = _operands_of(x.shape, x.strides, w.shape, w.strides, x.dtype, x.data.device_id)
        if ops is not None:
            return ops
    return functools.partial(operands_to_channels_last, xp=xp)


def kept_channels_first(x, w, xp):
    """``x`` and ``w`` of a channels-first call whose kernel reads that layout itself
    (:attr:`cuconv.plan.Plan.reads_channels_first`): C-contiguous, themselves when they already are
    (a view, a channel slice say, is copied): :func:`to_channels_last` of operands in their own layout."""
    return to_channels_last(x, False, xp), to_channels_last(w, False, xp)


def kept_x_moved_w(x, w, xp):
    """``x`` and ``w`` of a channels-first call whose kernel reads x in that layout against a channels-last
    filter (:attr:`cuconv.plan.Plan.reads_x_channels_first`): x C-contiguous (itself when it already is), w
    moved to ``(K, *filter, C/g)`` (one transpose launch into its scratch buffer; a contiguous 1x1 filter
    is reshaped). A signature's repeated calls keep the :class:`_KeptXMovedW` that decides this once."""
    return _KeptXMovedW(x, w, xp)(x, w)


def _operands_fn(plan):
    """The function that lays out ``(x, w)`` of a channels-first call for ``plan``'s kernel, or None where both
    move (:func:`operands_to_channels_last`)."""
    if plan.reads_channels_first:
        return kept_channels_first
    if plan.reads_x_channels_first:
        return kept_x_moved_w
    return None


def operands_for(plan, x, w, xp):
    """``(x, w)`` of a channels-first call as ``plan`` takes them: kept channels-first
    (:func:`kept_channels_first`) when its kernel reads that layout, x kept and w moved
    (:func:`kept_x_moved_w`) when it reads x alone so, else both moved to channels-last
    (:func:`operands_to_channels_last`)."""
    fn = _operands_fn(plan)
    return (fn or operands_to_channels_last)(x, w, xp)


def operands_mover_for(plan, x, w, xp):
    """:func:`operands_for` as a callable ``(x, w) -> (x, w)`` to keep for further calls of the same
    signature (:func:`operands_mover` where the operands move, :class:`_KeptXMovedW` where x is kept)."""
    fn = _operands_fn(plan)
    if fn is kept_x_moved_w:
        return _KeptXMovedW(x, w, xp)
    return functools.partial(fn, xp=xp) if fn is not None else operands_mover(x, w, xp)


class _KeptXMovedW:
    """:func:`kept_x_moved_w` for arrays of the shapes, strides and device of ``x`` and ``w``, decided
    once: x passed as it is (C-contiguous) or copied; w reshaped (a contiguous 1x1 filter) or, on a
    CUDA GPU, moved by its one transpose launch into its scratch buffer with no lookup of the move."""

    def __init__(self, x, w, xp):
        self._xp = xp
        self._x_as_is = bool(x.flags.c_contiguous)
        self._w_shape = (w.shape[0], *w.shape[2:], w.shape[1])
        self._reshape_w = math.prod(w.shape[2:]) == 1 and bool(w.flags.c_contiguous)
        self._move = None
        if not self._reshape_w and _on_cuda(xp) and w.ndim >= 3:
            self._move = _move_to_last(w.shape, w.strides, w.itemsize, w.data.device_id)

    def __call__(self, x, w):
        x_n = x if self._x_as_is else self._xp.ascontiguousarray(x)
        if self._reshape_w:
            return x_n, w.reshape(self._w_shape)
        if self._move is None:
            return x_n, to_channels_last(w, True, self._xp, "w")
        dst = scratch(_PURPOSES["w"], self._w_shape, w.dtype)
        self._move(w, dst)
        return x_n, dst


def native_result(xp, shape, dtype, channels_first: bool):
    """Where a kernel writes a result that goes back channels-first: a scratch buffer on a CUDA GPU
    (:func:`to_channels_first` then moves it into the returned array or ``out``), else a new array."""
    if channels_first and _on_cuda(xp):
        return scratch("channels-last result", shape, dtype)
    return xp.empty(shape, dtype=dtype)


def to_channels_first(native, xp, dest=None):
    """The channels-last result ``native`` (``(N, *spatial, K)``, contiguous) as ``(N, K, *spatial)``:
    written into ``dest`` (the caller's ``out``) when given, else into a new array; returns it."""
    if _on_cuda(xp) and native.ndim >= 3:
        target = dest if dest is not None else xp.empty((native.shape[0], native.shape[-1], *native.shape[1:-1]),
                                                        dtype=native.dtype)
        move = _move_to_first(native.shape, native.itemsize, target.strides, native.data.device_id)
        if move is not None:
            move(native, target)
            return target
        target[...] = xp.moveaxis(native, -1, 1)
        return target
    moved = xp.moveaxis(native, -1, 1)
    if dest is not None:
        dest[...] = moved
        return dest
    return xp.ascontiguousarray(moved)


_FLIP_FIELDS = [(n, np.int32) for n in ("Kg", "Cg", "groups", "T0", "T1", "T2", "F1", "F2", "F", "start0", "start1",
                                         "start2", "step0", "step1", "step2")]


@functools.lru_cache(maxsize=1024)
def _flip_launch(device_id, item, K, F, Cg, groups, flips) -> PackedLaunch:
    from .compiler import load_cuda_function
    from .device import gpu_info
    pad = 3 - len(F)
    F3 = (1,) * pad + tuple(F)
    fl = ((0, 1, 1),) * pad + tuple(flips)
    Kg, T = K // groups, math.prod(n for _, _, n in fl)
    args = c_struct(_FLIP_FIELDS, dict(Kg=Kg, Cg=Cg, groups=groups, T0=fl[0][2], T1=fl[1][2], T2=fl[2][2], F1=F3[1],
                                       F2=F3[2], F=math.prod(F3), start0=fl[0][0], start1=fl[1][0], start2=fl[2][0],
                                       step0=fl[0][1], step1=fl[1][1], step2=fl[2][1]))
    fn = load_cuda_function(FLIP_SOURCE, gpu_info(device_id), {}, f"flip_filter_b{8 * item}")
    return PackedLaunch(fn, (-(-Cg // 32), -(-Kg // 32), groups * T), 256, 0, (np.uint64(0), np.uint64(0), args),
                        slots=(0, 1))


def flip_taps(F, taps) -> tuple:
    """``taps`` (per spatial dim a ``slice`` of a filter axis of size ``F``) as ``(start, step, count)``
    per dim, tap ``t`` of the result reading filter position ``start - t * step``: what
    :func:`flip_filter` takes precomputed."""
    ranges = [range(f)[t] for f, t in zip(F, taps)]
    return tuple((r.start, -r.step, len(r)) for r in ranges)


def flipped_shape(w_shape, groups: int, flips) -> tuple:
    """The shape :func:`flip_filter` gives a filter of shape ``w_shape``: ``(C, *T, K/g)``."""
    return (w_shape[-1] * groups, *(n for _, _, n in flips), w_shape[0] // groups)


def flip_filter_launch(w, groups: int, flips) -> PackedLaunch:
    """The packed launch of :func:`flip_filter` for a C-contiguous CuPy filter of ``w``'s shape and dtype
    (2-, 4- or 8-byte elements, every ``flips`` count non-zero): ``launch(w_ptr, wt_ptr)``."""
    return _flip_launch(w.data.device_id, w.itemsize, w.shape[0], tuple(w.shape[1:-1]), w.shape[-1], groups,
                        tuple(flips))


def flip_filter(w, taps, groups: int, xp, flips=None):
    """The filter of an input gradient: ``w`` (``(K, *F, C/g)``, C-contiguous) with the taps ``taps``
    (per spatial dim a ``slice`` of that axis, e.g. ``slice(None, None, -1)`` to reverse it; ``flips``:
    the same as :func:`flip_taps` gives it, when the caller has it) and its K and C axes exchanged
    within each group: ``(C, *T, K/g)``, contiguous. One launch of ``kernels_cu/layout/flip_filter.cu``
    on a CUDA GPU; the array library's copy elsewhere."""
    K, F, Cg = w.shape[0], tuple(w.shape[1:-1]), w.shape[-1]
    if flips is None:
        flips = flip_taps(F, taps)
    if _on_cuda(xp) and w.itemsize in (2, 4, 8) and all(n for _, _, n in flips) and w.flags.c_contiguous:
        wt = xp.empty(flipped_shape(w.shape, groups, flips), dtype=w.dtype)
        flip_filter_launch(w, groups, flips)(w.data.ptr, wt.data.ptr)
        return wt
    nd = len(F)
    taps = tuple(slice(a, a - b * n if a - b * n >= 0 else None, -b) for a, b, n in flips)
    sub = w[(slice(None),) + taps + (slice(None),)]
    T = sub.shape[1:-1]
    moved = xp.moveaxis(sub.reshape(groups, K // groups, *T, Cg), (1, nd + 2), (nd + 2, 1))
    return xp.ascontiguousarray(moved).reshape(Cg * groups, *T, K // groups)


_SCATTER_FIELDS = [("words", np.int64)] + [(n, np.int32) for n in (
    "row_words", "T0", "T1", "T2", "I0", "I1", "I2", "s0", "s1", "s2", "p0", "p1", "p2")] + divisor_fields(
    "div_row_words", "div_t0", "div_t1", "div_t2", "div_i0", "div_i1", "div_i2", "div_s0", "div_s1", "div_s2")


def scatter_args(word: int, row_bytes: int, N: int, T, I, s, p, fill: bool = False):
    """``(args, blocks)``: phase_scatter.cu's argument struct and grid for ``N`` images of ``row_bytes`` rows
    moved in ``word``-byte words, phase extent ``T``, result extent ``I``, stride ``s``, phase ``p`` (one
    entry per spatial dim); ``fill``: the ``phase_scatter_fill`` kernels' (every word of the result)."""
    pad = 3 - len(T)
    T3, I3, s3, p3 = ((1,) * pad + tuple(T), (1,) * pad + tuple(I), (1,) * pad + tuple(s), (0,) * pad + tuple(p))
    row_words = row_bytes // word
    words = N * math.prod(I3 if fill else T3) * row_words
    args = c_struct(_SCATTER_FIELDS, dict(
        words=words, row_words=row_words, T0=T3[0], T1=T3[1], T2=T3[2], I0=I3[0], I1=I3[1], I2=I3[2], s0=s3[0],
        s1=s3[1], s2=s3[2], p0=p3[0], p1=p3[1], p2=p3[2],
        **divisor_values(div_row_words=row_words, div_t0=T3[0], div_t1=T3[1], div_t2=T3[2], div_i0=I3[0],
                         div_i1=I3[1], div_i2=I3[2], div_s0=s3[0], div_s1=s3[1], div_s2=s3[2])))
    return args, max(1, min(-(-words // 256), 65535))


@functools.lru_cache(maxsize=1024)
def _scatter_launch(device_id, word, row_bytes, N, T, I, s, p, fill: bool = False) -> PackedLaunch:
    from .compiler import load_cuda_function
    from .device import gpu_info
    args, blocks = scatter_args(word, row_bytes, N, T, I, s, p, fill)
    fn = load_cuda_function(SCATTER_SOURCE, gpu_info(device_id), {}, f"phase_scatter_{'fill_' if fill else ''}w{word}")
    return PackedLaunch(fn, blocks, 256, 0, (np.uint64(0), np.uint64(0), args), slots=(0, 1))


def scatter_phase_launch(z, y, stride, phase, fill: bool = False) -> Optional[PackedLaunch]:
    """The packed launch of :func:`scatter_phase` for contiguous CuPy ``z`` and ``y``, moving the widest word
    (16, 4 or 2 bytes) that divides a row of ``z`` and both addresses; None where none does. ``fill``:
    write all of ``y``, zeros where the phase is not."""
    row = z.shape[-1] * z.itemsize
    word = next((w for w in (16, 4, 2) if row % w == 0 and z.data.ptr % w == 0 and y.data.ptr % w == 0), None)
    if word is None:
        return None
    return _scatter_launch(z.data.device_id, word, row, z.shape[0], tuple(z.shape[1:-1]), tuple(y.shape[1:-1]),
                           tuple(stride), tuple(phase), fill)


def scatter_phase(z, y, stride, phase, xp) -> None:
    """``y[:, phase_0::stride_0, phase_1::stride_1, ..., :] = z``: ``z`` (``(N, *T, C)``, contiguous) is one
    output phase of ``y`` (``(N, *I, C)``, contiguous). One launch of
    ``kernels_cu/layout/phase_scatter.cu`` on a CUDA GPU; the array library's strided copy elsewhere."""
    launch = (scatter_phase_launch(z, y, stride, phase)
              if _on_cuda(xp) and z.flags.c_contiguous and y.flags.c_contiguous and z.size else None)
    if launch is not None:
        launch(z.data.ptr, y.data.ptr)
        return
    y[(slice(None),) + tuple(slice(q, None, s) for q, s in zip(phase, stride)) + (slice(None),)] = z


def describe(problem, device, plan=None) -> str:
    """How a problem's layout is handled, and the bytes each move reads and writes: the line of
    :func:`cuconv.explain` (``plan``: the plan that runs; one that writes channels-first moves only
    ``x`` and ``w``)."""
    if LAYOUTS[problem.layout][1]:
        return f"layout: {problem.layout} is the kernels' own (channels-last): no operand is moved"
    if plan is not None and plan.reads_channels_first:
        res = " and reads the residual" if problem.epilogue.loads_residual else ""
        return (f"layout: {problem.layout} read and written by the kernel itself (x and w read, the result written"
                f"{res} channels-first): no operand is moved")
    item = problem.itemsize
    x = math.prod(problem.x_shape) * item
    w = math.prod(problem.w_shape) * item
    y = math.prod(problem.out_shape) * item
    how = ("cuconv's transpose kernel (kernels_cu/layout/transpose.cu)" if device.kind == "cuda"
           else "the array library's copy")
    if plan is not None and plan.reads_x_channels_first:
        res = " and reads the residual" if problem.epilogue.loads_residual else ""
        if math.prod(problem.filter_spatial) == 1:
            w_line = "w (a 1x1 filter) reshaped: no operand is moved"
        else:
            w_line = (f"w moved to channels-last by {how}: w {_size(w)}; {_size(2 * w)} read + written beyond the "
                      f"convolution")
        return (f"layout: {problem.layout} x read and the result written{res} channels-first by the kernel itself; "
                f"{w_line}")
    moved = {"x": x, "w": w}
    direct = plan is not None and plan.writes_channels_first
    if not direct:
        moved["result"] = y
        if problem.epilogue.loads_residual:
            moved["residual"] = y
    parts = ", ".join(f"{k} {_size(v)}" for k, v in moved.items())
    epilogue = (f"; the epilogue writes the result{' and reads the residual' if problem.epilogue.loads_residual else ''}"
                f" in {problem.layout} itself" if direct else "")
    return (f"layout: {problem.layout} operands moved to channels-last by {how}: {parts}{epilogue}; "
            f"{_size(2 * sum(moved.values()))} read + written beyond the convolution")


def _size(nbytes: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if nbytes >= scale:
            return f"{nbytes / scale:.3g} {unit}"
    return f"{nbytes} B"
