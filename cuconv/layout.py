"""The caller's layout and the kernels' channels-last layout: moving operands between them.

Every kernel computes channels-last: activations ``(N, *spatial, C)``, weights ``(K, *filter, C/g)``.
A channels-first call (``NCHW`` / ``NCDHW``, weights ``(K, C/g, *filter)`` as torch) is served by
moving its operands, each move one batched 2-D transpose:

=============  ==============================  =====================  ==========================
operand        from                            to                     where
=============  ==============================  =====================  ==========================
x, residual    ``(N, C, *spatial)``            ``(N, *spatial, C)``   a per-stream scratch buffer
w              ``(K, C/g, *filter)``           ``(K, *filter, C/g)``  a per-stream scratch buffer
result         ``(N, *out_spatial, K)``        ``(N, K, *out_spatial)``  ``out``, or the returned array
=============  ==============================  =====================  ==========================

The kernel writes the result channels-last into a scratch buffer too, so a channels-first call
allocates only the array it returns. Weights are moved on every call: they may change between
calls, so nothing is cached on their address.

On a CUDA GPU each move is one launch of ``kernels_cu/layout/transpose.cu`` (tiles through shared
memory, whole 128-byte lines read and written) with its arguments packed once per shape
(:class:`~cuconv.launch.PackedLaunch`); the only requirement is that the spatial axes of the
channels-first array are contiguous among themselves (any batch and channel strides: channel
slices qualify). Other arrays (and NumPy arrays, and ROCm) take the array library's copy
(``moveaxis`` + ``ascontiguousarray``). :func:`describe` gives the line ``cuconv.explain`` prints.
"""

from __future__ import annotations

import math
from typing import Optional

import numpy as np

from .launch import PackedLaunch, c_struct
from .problem import LAYOUTS
from .scratch import scratch

__all__ = ["to_channels_last", "to_channels_first", "describe", "SOURCE"]

SOURCE = "layout/transpose.cu"
_MAX_GRID_YZ = 65535
_ARGS_FIELDS = [(n, np.int64) for n in ("rows", "cols", "batch", "x_batch_stride", "x_row_stride",
                                        "y_batch_stride", "y_row_stride")]
#: Packed transposes by (device, kernel, geometry): a network's layers repeat the same few.
_LAUNCHES: dict = {}
_LAUNCHES_LIMIT = 1024


def _cuda_cupy(xp) -> bool:
    return xp is not np and not xp.cuda.runtime.is_hip


def _matrix_view(a):
    """``(batch, rows, cols, batch stride, row stride)`` in elements when ``a`` (``(B, R, *rest)``)
    reads as a batch of row-major ``R x prod(rest)`` matrices: the ``rest`` axes contiguous among
    themselves, any batch and row strides. None when its strides do not allow one transpose."""
    item = a.itemsize
    if any(s % item or s < 0 for s in a.strides):
        return None
    st = [s // item for s in a.strides]
    step = 1
    for n, s in zip(reversed(a.shape[2:]), reversed(st[2:])):
        if n > 1 and s != step:
            return None
        step *= n
    return a.shape[0], a.shape[1], math.prod(a.shape[2:]), st[0], st[1]


def _transpose(xp, src, dst, batch, rows, cols, xbs, xrs, ybs, yrs) -> None:
    """dst[b][c][r] = src[b][r][c] with one launch of the transpose kernel (caller checked the view)."""
    from .compiler import load_cuda_function
    from .device import device_of
    pair = (src.itemsize == 2 and rows % 2 == 0 and cols % 2 == 0 and xbs % 2 == 0 and xrs % 2 == 0
            and ybs % 2 == 0 and yrs % 2 == 0 and src.data.ptr % 4 == 0 and dst.data.ptr % 4 == 0)
    name = "transpose_b16x2" if pair else ("transpose_b16" if src.itemsize == 2 else "transpose_b32")
    tile = 64 if pair else 32
    dev = src.data.device_id
    key = (dev, name, batch, rows, cols, xbs, xrs, ybs, yrs)
    launch = _LAUNCHES.get(key)
    if launch is None:
        fn = load_cuda_function(SOURCE, device_of(src), {}, name)
        args = c_struct(_ARGS_FIELDS, dict(rows=rows, cols=cols, batch=batch, x_batch_stride=xbs, x_row_stride=xrs,
                                           y_batch_stride=ybs, y_row_stride=yrs))
        launch = PackedLaunch(fn, (-(-cols // tile), -(-rows // tile), batch), 256, 0,
                              (np.uint64(0), np.uint64(0), args), slots=(0, 1))
        if len(_LAUNCHES) >= _LAUNCHES_LIMIT:
            _LAUNCHES.clear()
        _LAUNCHES[key] = launch
    if dev == xp.cuda.runtime.getDevice():
        launch(src.data.ptr, dst.data.ptr)
    else:
        with xp.cuda.Device(dev):
            launch(src.data.ptr, dst.data.ptr)


def _kernel_fits(a, batch, rows, cols) -> bool:
    return (a.itemsize in (2, 4) and a.size > 0 and batch <= _MAX_GRID_YZ and -(-rows // 32) <= _MAX_GRID_YZ)


def to_channels_last(a, channels_first: bool, xp, purpose: Optional[str] = None):
    """``a`` channels-last and C-contiguous: itself when it already is; a channels-first ``a``
    (``(N, C, *spatial)`` or weights ``(K, C/g, *filter)``) moved to ``(N, *spatial, C)``. On a CUDA GPU
    the move lands in the scratch buffer ``purpose`` when one is named (the caller uses the result
    before its next call on the stream), else in a new array."""
    if not channels_first:
        return a if a.flags.c_contiguous else xp.ascontiguousarray(a)
    if _cuda_cupy(xp) and a.ndim >= 3:
        view = _matrix_view(a)
        if view is not None and _kernel_fits(a, view[0], view[1], view[2]):
            batch, rows, cols, xbs, xrs = view
            shape = (a.shape[0], *a.shape[2:], a.shape[1])
            dst = (scratch(f"channels-last {purpose}", shape, a.dtype) if purpose else xp.empty(shape, a.dtype))
            _transpose(xp, a, dst, batch, rows, cols, xbs, xrs, cols * rows, rows)
            return dst
    return xp.ascontiguousarray(xp.moveaxis(a, 1, -1))


def native_result(xp, shape, dtype, channels_first: bool):
    """Where a kernel writes a result that goes back channels-first: a scratch buffer on a CUDA GPU
    (:func:`to_channels_first` then moves it into the returned array or ``out``), else a new array."""
    if channels_first and _cuda_cupy(xp):
        return scratch("channels-last result", shape, dtype)
    return xp.empty(shape, dtype=dtype)


def to_channels_first(native, xp, dest=None):
    """The channels-last result ``native`` (``(N, *spatial, K)``, contiguous) as ``(N, K, *spatial)``:
    written into ``dest`` (the caller's ``out``) when given, else into a new array; returns it."""
    shape = (native.shape[0], native.shape[-1], *native.shape[1:-1])
    if _cuda_cupy(xp) and native.ndim >= 3 and _kernel_fits(native, native.shape[0], math.prod(native.shape[1:-1]),
                                                            native.shape[-1]):
        target = dest if dest is not None else xp.empty(shape, dtype=native.dtype)
        view = _matrix_view(target)
        if view is not None:
            batch, k, pixels, ybs, yrs = view
            _transpose(xp, native, target, batch, pixels, k, pixels * k, k, ybs, yrs)
            return target
    moved = xp.moveaxis(native, -1, 1)
    if dest is not None:
        dest[...] = moved
        return dest
    return xp.ascontiguousarray(moved)


def describe(problem, device) -> str:
    """How a problem's layout is handled, and the bytes each move reads and writes: the line of
    :func:`cuconv.explain`."""
    if LAYOUTS[problem.layout][1]:
        return f"layout: {problem.layout} is the kernels' own (channels-last): no operand is moved"
    item = problem.itemsize
    x = math.prod(problem.x_shape) * item
    w = math.prod(problem.w_shape) * item
    y = math.prod(problem.out_shape) * item
    moved = {"x": x, "w": w, "result": y}
    if problem.epilogue.loads_residual:
        moved["residual"] = y
    how = ("cuconv's transpose kernel (kernels_cu/layout/transpose.cu)" if device.kind == "cuda"
           else "the array library's copy")
    parts = ", ".join(f"{k} {_size(v)}" for k, v in moved.items())
    return (f"layout: {problem.layout} operands moved to and from channels-last by {how}: {parts}; "
            f"{_size(2 * sum(moved.values()))} read + written beyond the convolution")


def _size(nbytes: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if nbytes >= scale:
            return f"{nbytes / scale:.3g} {unit}"
    return f"{nbytes} B"
