"""cuconv over dask arrays: :func:`conv2d` / :func:`conv3d` (and :func:`conv_transpose2d` /
:func:`conv_transpose3d`) on a chunked input, returning a lazy dask array.

``import cuconv.dask`` needs dask (``pip install 'cuconv[dask]'``); ``import cuconv`` does not.

How the work is split (the same for every spatial axis, independently)::

    input chunk j = rows [b_j, b_j+1)         output chunk j = the output pixels o whose window centre
                                                 c(o) = o*stride - pad_lo + (extent - 1) // 2 is in it
    window of output chunk [o0, o1) = padded rows [o0*stride, (o1 - 1)*stride + extent)
                                    = input rows [o0*stride - pad_lo, (o1 - 1)*stride - pad_lo + extent)

with ``extent = (filter - 1) * dilation + 1``. The part of a window outside the input becomes the block
call's own zero padding, so every output block is one :func:`cuconv.conv2d` / :func:`cuconv.conv3d` call on
exactly the input its pixels read: the halo is ``(extent - 1) // 2`` rows before an input chunk and
``extent // 2`` after it, and output chunk boundaries fall on output pixels for any stride. A window may span
several input chunks (chunks smaller than the halo are fine); output chunks left empty (a stride larger than
an input chunk) merge into their neighbours. The batch axis keeps its chunks; the channel axis is rechunked
to one chunk (a convolution reads every channel of a group); the output's channel axis is one chunk of K.

Each block computes its pixels as the single call computes them (same taps, same padding zeros, same
epilogue), so the result equals the single-array call up to the accumulation order of the matrix product
that the backend uses for a block of that size (see docs/architecture.md, "Dask arrays").

The transposed convolutions split the same way, the other way round: input row ``i`` reaches output
pixels ``i*stride - pad_lo + f*dilation``, so an output chunk starts at ``b*stride - pad_lo`` for each
input chunk boundary ``b``, and reads the input rows whose taps reach it (:func:`transpose_axis_blocks`).
Each block is one transposed convolution of its window (:func:`cuconv.grad` computes it as the input
gradient of the forward convolution of the block's shape), with zero rows appended where the window
needs them to end on a stride step.
"""

from __future__ import annotations

import bisect
import contextlib
import itertools
import math
import operator

import numpy as np

try:
    import dask
    import dask.array as da
    from dask.base import tokenize
    from dask.highlevelgraph import HighLevelGraph
except ImportError as e:  # pragma: no cover - exercised only without dask
    raise ImportError("cuconv.dask needs dask: pip install 'cuconv[dask]' (dask[array], distributed)") from e

from . import api
from .arrays import SUPPORTED_DTYPES, as_array, dtype_name, module_name
from .dispatch import kernels
from .problem import LAYOUTS
from .validate import activation_of, check_ranks, conv_problem, layout_of, strategy_of, user_shape

__all__ = ["conv2d", "conv3d", "conv_transpose2d", "conv_transpose3d", "axis_blocks", "transpose_axis_blocks"]


def axis_blocks(in_chunks, filt: int, stride: int, dilation: int, pad_lo: int, out_size: int):
    """How one spatial axis splits: ``[(o0, o1, first, last), ...]``, one entry per output chunk.

    ``in_chunks`` are the input's chunk lengths on the axis; output chunk ``[o0, o1)`` holds the pixels
    whose window centre lies in one input chunk (empty ones dropped), and reads input rows
    ``[first, last)`` (``first`` may be negative and ``last`` past the input: that part is padding).
    """
    extent = (filt - 1) * dilation + 1
    centre = (extent - 1) // 2
    bounds = [0]
    b = 0
    for length in in_chunks[:-1]:
        b += length
        # first output pixel whose centre o*stride - pad_lo + centre is at or past row b
        o = min(max(-(-(b + pad_lo - centre) // stride), 0), out_size)
        if o > bounds[-1]:
            bounds.append(o)
    if bounds[-1] < out_size:
        bounds.append(out_size)
    return [(o0, o1, o0 * stride - pad_lo, (o1 - 1) * stride - pad_lo + extent)
            for o0, o1 in zip(bounds[:-1], bounds[1:])]


def _clip(first: int, last: int, size: int):
    """Rows ``[first, last)`` of an axis of ``size`` rows: (the input rows the block receives, its padding).

    The padding is ``(zeros before, zeros after, empty)``. A window entirely in the padding (``empty``)
    still receives one input row, which the block ignores: dask handles chunks of length zero poorly."""
    lo = min(max(first, 0), size)
    hi = min(max(last, lo), size)
    if hi == lo:
        row = min(lo, size - 1)
        return (row, row + 1), (last - first, 0, True)
    before = max(0, lo - first)
    return (lo, hi), (before, (last - first) - (hi - lo) - before, False)


def _gather(x, axis: int, rows):
    """``x`` with the row ranges ``rows`` (a list of (lo, hi)) laid end to end along ``axis``, one chunk each:
    chunk ``j`` is then the window of output chunk ``j``.

    Window ``j`` is one task: it depends on the input chunks it covers whole and on a slice task of each
    chunk it covers in part (a halo: a few edge rows of a neighbour), and joins them with one
    concatenation (:func:`_join`). A distributed scheduler runs it where most of its input bytes are, the
    worker that holds its own chunk, so only the halo slices travel between workers."""
    bounds = [0, *itertools.accumulate(x.chunks[axis])]
    if [tuple(r) for r in rows] == list(zip(bounds[:-1], bounds[1:])):
        return x  # the windows are the chunks (no halo, no padding)
    token = tokenize(x, axis, tuple(rows))
    name, part = "cuconv-window-" + token, "cuconv-halo-" + token
    others = [range(len(c)) for i, c in enumerate(x.chunks) if i != axis]
    lead = (slice(None),) * axis
    dsk = {}
    for j, (lo, hi) in enumerate(rows):
        first = bisect.bisect_right(bounds, lo) - 1
        last = bisect.bisect_left(bounds, hi) - 1
        pieces = []  # (chunk along axis, its rows in the window: None for all of them)
        for c in range(first, last + 1):
            a, b = max(lo, bounds[c]), min(hi, bounds[c + 1])
            pieces.append((c, None if (a, b) == (bounds[c], bounds[c + 1]) else slice(a - bounds[c], b - bounds[c])))
        for idx in itertools.product(*others):
            def at(i, idx=idx):
                return idx[:axis] + (i,) + idx[axis:]
            keys = []
            for c, rows_of_c in pieces:
                if rows_of_c is None:
                    keys.append((x.name, *at(c)))
                else:
                    keys.append((part, *at(j), c))
                    dsk[keys[-1]] = (operator.getitem, (x.name, *at(c)), lead + (rows_of_c,))
            dsk[(name, *at(j))] = (_join, keys, axis)
    chunks = list(x.chunks)
    chunks[axis] = tuple(hi - lo for lo, hi in rows)
    graph = HighLevelGraph.from_collections(name, dsk, dependencies=[x])
    return da.Array(graph, name, tuple(chunks), meta=x._meta)


def _join(pieces, axis: int):
    """The pieces of a window laid end to end along ``axis``, in the memory of the largest piece (its
    GPU for CuPy pieces: the other pieces are the halo rows, copied over when they are elsewhere)."""
    if len(pieces) == 1:
        return pieces[0]
    own = max(pieces, key=lambda p: p.nbytes)
    if isinstance(own, np.ndarray):
        return np.concatenate(pieces, axis=axis)
    import cupy
    with own.device:
        return cupy.concatenate([_on_device_of(p, own) for p in pieces], axis=axis)


def _library(a) -> str:
    """``"numpy"`` or ``"cupy"`` for a NumPy / CuPy array or a dask array of such chunks."""
    if isinstance(a, da.Array):
        a = a._meta
    if isinstance(a, np.ndarray):
        return "numpy"
    if type(a).__module__.split(".")[0] == "cupy":
        return "cupy"
    return type(a).__module__.split(".")[0]


def _whole(a, name: str, shape, dtype: str, lib: str):
    """An operand every block reads whole (w, bias): a NumPy / CuPy array of the library of x's chunks."""
    if isinstance(a, da.Array):
        raise TypeError(f"{name}: expected a NumPy or CuPy array (every block reads it whole), got a dask array; "
                        f"pass {name}.compute()")
    a = as_array(a, name)
    if module_name(a) != lib:
        raise TypeError(f"{name}: expected a {lib} array like x's chunks, got a {module_name(a)} array")
    if shape is not None and tuple(a.shape) != tuple(shape):
        raise ValueError(f"{name}: expected shape {tuple(shape)}, got {tuple(a.shape)}")
    got = dtype_name(a, name)
    if got != dtype:
        raise TypeError(f"{name}: expected dtype {dtype} like x, got {got}")
    return a


def _residual(residual, shape, dtype: str, lib: str, out_chunks):
    """The residual as a dask array chunked like the output (a dask array is rechunked, an array wrapped)."""
    if not isinstance(residual, da.Array):
        residual = _whole(residual, "residual", shape, dtype, lib)
        if _moves_as_bits(lib, dtype):
            residual = residual.view(np.uint16)  # travels as its bits, like x (see _as_bits)
        return da.from_array(residual, chunks=out_chunks, asarray=False)
    if any(math.isnan(v) for v in residual.shape):
        raise ValueError("residual: its chunk sizes are unknown; call residual.compute_chunk_sizes() first")
    if _library(residual) != lib:
        raise TypeError(f"residual: expected a dask array of {lib} chunks like x, got {_library(residual)} chunks")
    if tuple(residual.shape) != tuple(shape):
        raise ValueError(f"residual: expected shape {tuple(shape)}, got {tuple(residual.shape)}")
    got = dtype_name(residual, "residual")
    if got != dtype:
        raise TypeError(f"residual: expected dtype {dtype} like x, got {got}")
    return _as_bits(residual, lib, dtype).rechunk(out_chunks)


def _on_device_of(a, x):
    """``a`` on the GPU of the CuPy block ``x`` (a copy when it is elsewhere), or ``a`` itself."""
    if a is None or isinstance(x, np.ndarray) or a.device.id == x.device.id:
        return a
    with x.device:
        return a.copy()  # CuPy copies onto the current device


_DTYPES_BY_NAME = {name: dt for dt, name in SUPPORTED_DTYPES.items()}


def _typed(a, dtype: str):
    """``a`` as the graph's ``dtype``: bfloat16 CuPy chunks travel as their uint16 bits (:func:`_as_bits`),
    and a bfloat16 CuPy ``w`` or ``bias`` arrives on a distributed worker as a raw void type, since
    distributed's CuPy serializer sends a dtype by its type string (bfloat16's is ``<V2``). The bits are
    intact either way, so a view restores the dtype."""
    if a is None or a.dtype.kind not in "Vu":
        return a
    want = _DTYPES_BY_NAME[dtype]
    return a.view(want) if a.dtype.itemsize == want.itemsize and a.dtype != want else a


def _moves_as_bits(lib: str, dtype: str) -> bool:
    """Whether arrays of the graph travel between workers as uint16 bits: bfloat16 CuPy data, whose dtype
    distributed's CuPy serializer does not carry (:func:`_typed`)."""
    return lib == "cupy" and dtype == "bfloat16"


def _as_bits(a, lib: str, dtype: str):
    """A dask array of bfloat16 CuPy chunks as their uint16 bits (a view per chunk, on its own worker), so
    that what dask moves between workers for halos and rechunks keeps its type; the blocks view it back
    (:func:`_typed`). Any other array is returned as it is."""
    if not _moves_as_bits(lib, dtype):
        return a
    return a.map_blocks(_bits_view, dtype=np.uint16, meta=da.utils.meta_from_array(a, dtype=np.uint16))


def _bits_view(block):
    return block.view(np.uint16)


def _block(x, residual=None, *, nd, w, bias, pads, spatial_axes, kwargs, dtype_of, block_id=None):
    """One output block: the cuconv call on the block's input window ``x`` with its own zero padding."""
    x, residual, w, bias = (_typed(a, dtype_of) for a in (x, residual, w, bias))
    pad = [per_axis[block_id[axis]] for per_axis, axis in zip(pads, spatial_axes)]
    if any(empty for _, _, empty in pad):
        # every row of the window is padding: the call reads zeros, so hand it the zeros themselves
        shape = list(x.shape)
        for (before, after, empty), axis in zip(pad, spatial_axes):
            shape[axis] = before + after + (0 if empty else shape[axis])
        if isinstance(x, np.ndarray):
            x = np.zeros(shape, x.dtype)
        else:
            import cupy
            with x.device:
                x = cupy.zeros(shape, x.dtype)
        pad = [(0, 0, False)] * nd
    conv = api.conv2d if nd == 2 else api.conv3d
    return conv(x, _on_device_of(w, x), _on_device_of(bias, x), padding=tuple((b, a) for b, a, _ in pad),
                residual=_on_device_of(residual, x), **kwargs)


def _checked_input(nd, x, w, layout, out, single: str):
    """The checks every lazy convolution starts with: ``out`` absent, ``x`` a dask array of NumPy or CuPy
    chunks of known sizes, ``w`` a whole array of that library and dtype, the ranks of ``layout``.
    Returns ``(layout, chunk library, dtype, w)``; ``single`` names the array function for the errors."""
    if out is not None:
        raise TypeError("out: not supported by cuconv.dask (the result is a lazy dask array); write it into an "
                        "array with dask.array.store(result, out), or take result.compute()")
    if not isinstance(x, da.Array):
        raise TypeError(f"x: expected a dask array (dask.array.Array), got {type(x).__module__}."
                        f"{type(x).__name__}; call cuconv.{single} for a NumPy or CuPy array, or wrap it with "
                        f"dask.array.from_array")
    layout = layout_of(layout, nd)
    if any(math.isnan(v) for v in x.shape):
        raise ValueError("x: its chunk sizes are unknown; call x.compute_chunk_sizes() first")
    lib = _library(x)
    if lib not in ("numpy", "cupy"):
        raise TypeError(f"x: expected a dask array of NumPy or CuPy chunks, got {lib} chunks")
    dtype = dtype_name(x, "x")
    if isinstance(w, da.Array):
        _whole(w, "w", None, dtype, lib)  # raises: the filters must be a whole array
    w = as_array(w, "w")
    check_ranks(nd, layout, x, w)
    return layout, lib, dtype, _whole(w, "w", None, dtype, lib)


def _lazy_conv(nd, x, w, bias, stride, padding, dilation, groups, layout, residual, alpha, beta, activation, out,
               kernel, strategy):
    layout, lib, dtype, w = _checked_input(nd, x, w, layout, out, f"conv{nd}d")
    channels_last = LAYOUTS[layout][1]
    act = activation_of(activation)
    strategy = strategy_of(strategy, nd)
    problem = conv_problem(nd, tuple(x.shape), tuple(w.shape), dtype, layout, stride, padding, dilation, groups,
                           alpha, beta, bias is not None, residual is not None, act)
    if kernel is not None and kernel not in [k.name for k in kernels()]:
        raise ValueError(f"kernel: expected one of {[k.name for k in kernels()]}, got {kernel!r}")
    if bias is not None:
        bias = _whole(bias, "bias", (problem.out_channels,), dtype, lib)

    spatial_axes = tuple(range(1, nd + 1)) if channels_last else tuple(range(2, nd + 2))
    channel_axis = nd + 1 if channels_last else 1
    x = _as_bits(x.rechunk({channel_axis: -1}), lib, dtype)
    out_chunks = [None] * (nd + 2)
    out_chunks[0] = x.chunks[0]
    out_chunks[channel_axis] = (problem.out_channels,)
    pads = []
    for i, axis in enumerate(spatial_axes):
        blocks = axis_blocks(x.chunks[axis], problem.filter_spatial[i], problem.stride[i], problem.dilation[i],
                             problem.pad_lo[i], problem.out_spatial[i])
        clipped = [_clip(first, last, x.shape[axis]) for _, _, first, last in blocks]
        x = _gather(x, axis, [rows for rows, _ in clipped])
        pads.append([pad for _, pad in clipped])
        out_chunks[axis] = tuple(o1 - o0 for o0, o1, _, _ in blocks)
    out_chunks = tuple(out_chunks)

    arrays = [x]
    if residual is not None:
        shape = user_shape((x.shape[0], *problem.out_shape[1:]), layout)
        arrays.append(_residual(residual, shape, dtype, lib, out_chunks))
    kwargs = dict(stride=problem.stride, dilation=problem.dilation, groups=problem.groups, layout=layout,
                  alpha=alpha, beta=beta, activation=act, kernel=kernel)
    if nd == 3:
        kwargs["strategy"] = strategy or "auto"
    out_dtype = _DTYPES_BY_NAME[dtype]
    meta = da.utils.meta_from_array(x, ndim=nd + 2, dtype=out_dtype)
    return da.map_blocks(_block, *arrays, chunks=out_chunks, dtype=out_dtype, meta=meta,
                         token=f"cuconv-conv{nd}d", nd=nd, w=dask.delayed(w),
                         bias=None if bias is None else dask.delayed(bias),
                         pads=tuple(tuple(p) for p in pads), spatial_axes=spatial_axes, kwargs=kwargs, dtype_of=dtype)


_DOC = """{nd}-D convolution of a dask array, lazily: :func:`cuconv.conv{nd}d` block by block.

    Takes exactly the arguments of :func:`cuconv.conv{nd}d`, validated by the same step with the same
    errors, and returns a dask array of the result (``act(alpha * conv(x, w) + bias + beta * residual)``)
    that equals the single-array call. Each output block is one cuconv call on the input window its pixels
    read (the exact halo of the filter, dilation, padding and stride; see :mod:`cuconv.dask`).

    x : dask.array.Array
        NumPy chunks run on the CPU, CuPy chunks on the GPU of each chunk (a window that joins chunks of
        several GPUs of one process for its halo is joined on the GPU of its largest piece;
        dask-cuda, one worker per GPU, keeps each worker on its own GPU). Chunked along the batch and
        spatial axes as the caller likes (chunks of any size, even smaller than the halo); the channel
        axis is rechunked to one chunk. Output chunks follow the input's: the batch chunks as they are,
        the spatial chunks at the output pixels whose window centre falls in each input chunk.
    w, bias : NumPy or CuPy arrays (the library of x's chunks)
        Handed whole to every block (copied to a block's GPU when it is on another one).
    residual : dask array or NumPy / CuPy array, optional
        The output's shape, any chunking: rechunked like the output.
    out : must be None
        Not supported (TypeError); store the result with ``dask.array.store(result, out)``.
    kernel{strategy} : as for :func:`cuconv.conv{nd}d`
        Passed to every block's call; a forced kernel that declines a block raises when that block runs.

    Every other argument is as for :func:`cuconv.conv{nd}d`.
"""


def conv2d(x, w, bias=None, *, stride=1, padding=0, dilation=1, groups=1, layout="NHWC", residual=None,
           alpha=1.0, beta=1.0, activation=None, out=None, kernel=None):
    return _lazy_conv(2, x, w, bias, stride, padding, dilation, groups, layout, residual, alpha, beta, activation,
                      out, kernel, None)


def conv3d(x, w, bias=None, *, stride=1, padding=0, dilation=1, groups=1, layout="NDHWC", residual=None,
           alpha=1.0, beta=1.0, activation=None, out=None, strategy="auto", kernel=None):
    return _lazy_conv(3, x, w, bias, stride, padding, dilation, groups, layout, residual, alpha, beta, activation,
                      out, kernel, strategy)


conv2d.__doc__ = _DOC.format(nd=2, strategy="")
conv3d.__doc__ = _DOC.format(nd=3, strategy=", strategy")


# ------------------------------------------------------------------------------------ transposed convolution
def transpose_axis_blocks(in_chunks, filt: int, stride: int, dilation: int, pad_lo: int, out_size: int):
    """How one spatial axis of a transposed convolution splits: ``[(y0, y1, i0, i1, lo, extra), ...]``.

    Output chunk ``[y0, y1)`` starts at ``b * stride - pad_lo`` for each input chunk boundary ``b`` (empty
    chunks merged). It reads input rows ``[i0, i1)`` (every row whose taps reach it; possibly none) and
    ``extra`` zero rows behind them: together the output of the forward convolution of ``y1 - y0`` rows
    with padding ``lo`` in front (and ``(n - 1) stride + (filt - 1) dilation + 1 - (y1 - y0) - lo >= 0``
    behind, ``n = i1 - i0 + extra``), whose input gradient the block is.
    """
    size = sum(in_chunks)
    extent = (filt - 1) * dilation
    bounds, b = [0], 0
    for length in in_chunks[:-1]:
        b += length
        y = min(max(b * stride - pad_lo, 0), out_size)
        if y > bounds[-1]:
            bounds.append(y)
    if bounds[-1] < out_size:
        bounds.append(out_size)
    blocks = []
    for y0, y1 in zip(bounds[:-1], bounds[1:]):
        # the first row whose last tap reaches y0, or the row whose first tap is at or before y0 when no
        # tap of that row reaches (a stride longer than the filter): lo below is then >= 0
        i0 = max(0, min(-(-(y0 + pad_lo - extent) // stride), (y0 + pad_lo) // stride))
        i1 = max(i0, min(size, (y1 - 1 + pad_lo) // stride + 1))
        lo = y0 + pad_lo - i0 * stride
        least = max(1, -(-(y1 - y0 + lo - extent - 1) // stride) + 1)  # fewest outputs with padding >= 0 behind
        blocks.append((y0, y1, i0, i1, lo, max(0, least - (i1 - i0))))
    return blocks


def _transpose_block(x, residual=None, *, nd, w, bias, plans, spatial_axes, kwargs, dtype_of, block_id=None):
    """One output block of a transposed convolution: the input gradient (:func:`cuconv.grad`) of the
    block's forward convolution, on the block's window with its ``extra`` zero rows (all zeros when no
    input row reaches the block)."""
    x, residual, w, bias = (_typed(a, dtype_of) for a in (x, residual, w, bias))
    from . import grad
    plan = [per_axis[block_id[axis]] for per_axis, axis in zip(plans, spatial_axes)]
    if isinstance(x, np.ndarray):
        xp, ctx = np, contextlib.nullcontext()
    else:
        import cupy as xp
        ctx = x.device
    with ctx:
        if any(rows == 0 for _, _, rows, _, _ in plan):  # no input row reaches the block
            shape = list(x.shape)
            for (_, _, rows, extra, _), axis in zip(plan, spatial_axes):
                shape[axis] = rows + extra
            x = xp.zeros(shape, x.dtype)
        elif any(extra for _, _, _, extra, _ in plan):
            widths = [(0, 0)] * x.ndim
            for (_, _, _, extra, _), axis in zip(plan, spatial_axes):
                widths[axis] = (0, extra)
            x = xp.pad(x, widths)
        channels_last = LAYOUTS[kwargs["layout"]][1]
        out_shape = list(x.shape)
        out_shape[x.ndim - 1 if channels_last else 1] = kwargs["out_channels"]
        for (size, _, _, _, _), axis in zip(plan, spatial_axes):
            out_shape[axis] = size
        ep = dict(bias=_on_device_of(bias, x), residual=_on_device_of(residual, x), alpha=kwargs["alpha"],
                  beta=kwargs["beta"], activation=kwargs["activation"])
        return grad._input_grad(nd, x, _on_device_of(w, x), tuple(out_shape), kwargs["stride"],
                                tuple((lo, hi) for _, lo, _, _, hi in plan), kwargs["dilation"], kwargs["groups"],
                                kwargs["layout"], kwargs["kernel"], kwargs["precision"], ep)


def _lazy_transpose(nd, x, w, bias, stride, padding, output_padding, dilation, groups, layout, residual, alpha,
                    beta, activation, out, kernel, precision):
    from . import grad
    from .problem import normalize_spatial
    layout, lib, dtype, w = _checked_input(nd, x, w, layout, out, f"conv_transpose{nd}d")
    channels_last = LAYOUTS[layout][1]
    y_shape = grad.conv_transpose_output_shape(tuple(x.shape), tuple(w.shape), stride=stride, padding=padding,
                                               output_padding=output_padding, dilation=dilation, groups=groups,
                                               layout=layout)
    act = activation_of(activation)
    if kernel is not None and kernel not in [k.name for k in kernels()]:
        raise ValueError(f"kernel: expected one of {[k.name for k in kernels()]}, got {kernel!r}")
    pads = grad._pairs(padding, nd)
    stride_t = normalize_spatial(stride, nd, "stride")
    dilation_t = normalize_spatial(dilation, nd, "dilation")
    spatial_axes = tuple(range(1, nd + 1)) if channels_last else tuple(range(2, nd + 2))
    channel_axis = nd + 1 if channels_last else 1
    filt = [w.shape[a] for a in spatial_axes]
    c_out = y_shape[channel_axis]
    if bias is not None:
        bias = _whole(bias, "bias", (c_out,), dtype, lib)
    x = _as_bits(x.rechunk({channel_axis: -1}), lib, dtype)
    out_chunks = [None] * (nd + 2)
    out_chunks[0] = x.chunks[0]
    out_chunks[channel_axis] = (c_out,)
    plans = []
    for i, axis in enumerate(spatial_axes):
        blocks = transpose_axis_blocks(x.chunks[axis], filt[i], stride_t[i], dilation_t[i], pads[i][0],
                                       y_shape[axis])
        rows = [(i0, i1) if i1 > i0 else (min(i0, x.shape[axis] - 1), min(i0, x.shape[axis] - 1) + 1)
                for _, _, i0, i1, _, _ in blocks]
        x = _gather(x, axis, rows)
        plan = []  # per block: (output rows, padding in front, input rows, zero rows, padding behind)
        for y0, y1, i0, i1, lo, extra in blocks:
            hi = (i1 - i0 + extra - 1) * stride_t[i] + (filt[i] - 1) * dilation_t[i] + 1 - (y1 - y0) - lo
            plan.append((y1 - y0, lo, i1 - i0, extra, hi))
        plans.append(plan)
        out_chunks[axis] = tuple(y1 - y0 for y0, y1, _, _, _, _ in blocks)
    out_chunks = tuple(out_chunks)
    arrays = [x]
    if residual is not None:
        arrays.append(_residual(residual, y_shape, dtype, lib, out_chunks))
    kwargs = dict(stride=stride_t, dilation=dilation_t, groups=groups, layout=layout, alpha=alpha, beta=beta,
                  activation=act, kernel=kernel, precision=precision, out_channels=c_out)
    out_dtype = _DTYPES_BY_NAME[dtype]
    meta = da.utils.meta_from_array(x, ndim=nd + 2, dtype=out_dtype)
    return da.map_blocks(_transpose_block, *arrays, chunks=out_chunks, dtype=out_dtype, meta=meta,
                         token=f"cuconv-conv-transpose{nd}d", nd=nd, w=dask.delayed(w),
                         bias=None if bias is None else dask.delayed(bias),
                         plans=tuple(tuple(p) for p in plans), spatial_axes=spatial_axes, kwargs=kwargs,
                         dtype_of=dtype)


_TRANSPOSE_DOC = """{nd}-D transposed convolution of a dask array, lazily: :func:`cuconv.conv_transpose{nd}d` block by block.

    Takes the arguments of :func:`cuconv.conv_transpose{nd}d` and returns a dask array of its result.
    Output chunks start at ``b * stride - padding_lo`` for the input chunk boundaries ``b``; each block
    reads the input rows whose taps reach it (see :func:`transpose_axis_blocks`). ``x`` is a dask array
    of NumPy or CuPy chunks (the channel axis rechunked to one chunk); ``w`` and ``bias`` are whole
    arrays of that library; ``residual`` may be a dask array of the output's shape or a whole array;
    ``out`` must be None.
"""


def conv_transpose2d(x, w, bias=None, *, stride=1, padding=0, output_padding=0, dilation=1, groups=1,
                     layout="NHWC", residual=None, alpha=1.0, beta=1.0, activation=None, out=None, kernel=None,
                     precision=None):
    return _lazy_transpose(2, x, w, bias, stride, padding, output_padding, dilation, groups, layout, residual,
                           alpha, beta, activation, out, kernel, precision)


def conv_transpose3d(x, w, bias=None, *, stride=1, padding=0, output_padding=0, dilation=1, groups=1,
                     layout="NDHWC", residual=None, alpha=1.0, beta=1.0, activation=None, out=None, kernel=None,
                     precision=None):
    return _lazy_transpose(3, x, w, bias, stride, padding, output_padding, dilation, groups, layout, residual,
                           alpha, beta, activation, out, kernel, precision)


conv_transpose2d.__doc__ = _TRANSPOSE_DOC.format(nd=2)
conv_transpose3d.__doc__ = _TRANSPOSE_DOC.format(nd=3)
