"""The input gradient of a strided convolution (and so a transposed convolution) as one forward convolution
over the stacked output phases.

Along an axis of stride ``s``, dilation ``d`` and padding ``lo``, the input-gradient positions
``i = phi + s t`` (phase ``phi < s``) are reached by the taps ``f`` with ``s | phi + lo - f d``, each reading
``dy`` at ``t + delta`` with ``delta = (phi + lo - f d) / s`` (:func:`cuconv.grad._phases`). A phase's
offsets start at ``delta_min(phi)``; counted from there (the phase's rows shifted by
``shift(phi) = delta_min(phi) - base``, ``base`` the least of them), every phase reads a window of at
most ``J`` rows, ``J - 1`` the widest span of one phase's offsets. So all phases are one stride-1
forward convolution of ``dy`` with a ``J``-tap filter and ``P = prod(s)`` times the channels (groups 1)::

    z[n, t', ph * C + c] = sum over j < J, k of  dy[n, t' + base + j, k] * W'[ph * C + c, j, k]
    W'[ph * C + c, j, k] = w[k, f, c]  for the tap f of phase ph with delta = delta_min(phi) + j, else 0
    dx[n, phi + s t, c]  = z[n, t + shift(phi), ph(phi) * C + c]        (phase ph(phi): phi row-major)

``W'`` is one tiled transpose of ``w``'s taps (kernels_cu/layout/stacked_filter.cu, a table of the filter tap
of each phase and window tap built once per geometry); the convolution has padding ``-base`` in front (``base <= 0`` is required) and enough
behind for every phase's rows; its epilogue takes the bias repeated ``P`` times and the
residual stacked the same way (kernels_cu/layout/phase_stack.cu), so ``act(alpha * . + bias +
beta * residual)`` is computed once per value, in fp32, as the forward kernel computes it; then
phase_stack.cu puts the phases into place. A phase no tap reaches has a zero filter: its positions get
the epilogue of zero. Four launches or fewer, where the phase split (:mod:`cuconv.grad`) makes ``P``
convolutions, each with a filter flip and a scatter; the cost is the zero taps of ``W'``: ``P prod(J)``
against ``prod(F)`` filter taps (a 3x3 filter of stride 2: 16 against 9; 4x4: 16 against 16), except on the
Hopper kernel's im2col tiles within one phase, which skip the window taps their phase has none at
(docs/tuning.md T-dead-taps).
Where the phases' offsets start apart (a 4x4 filter of stride 2 and padding 1), the shifts push rows past
a phase's own; ``geometry(p, aligned=True)`` is the form with no shift, a wider window and as many rows as a
phase has, which pays where the dead window taps are skipped (:func:`cuconv.grad._aligned_direct`).
:func:`geometry` declines (None) where that ratio passes :data:`MAX_WASTE`, for groups, strides past
:data:`MAX_STRIDE` and ``base > 0``. :mod:`cuconv.grad` runs it where it applies on a GPU (one call with fewer
launches beats the phase split there: docs/tuning.md T-stacked-phases) unless
``cuconv.overrides(stacked_phases=False)`` says otherwise, and on the CPU only where
``cuconv.overrides(stacked_phases=True)`` asks for it (the zero taps cost more there than the calls they save).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Optional, Tuple

import numpy as np

from .launch import PackedLaunch, c_struct, divisor_fields, divisor_values
from .problem import cached_fields_hash, fields_state
from .scratch import scratch

__all__ = ["Subpixel", "geometry", "stacked_filter", "stacked_filter_shape", "stacked_filter_launch", "stacked_bias",
           "unstack_launch", "stack", "unstack", "gather_launch", "gather_pair_launch", "repeat_index", "stack_args",
           "MAX_WASTE", "MAX_STRIDE",
           "scatter_offsets", "filter_is_w", "phase_taps", "STACK_SOURCE", "GATHER_SOURCE", "FILTER_SOURCE", "COMPILE_VARIANTS"]

STACK_SOURCE = "layout/phase_stack.cu"
GATHER_SOURCE = "layout/gather_index.cu"
FILTER_SOURCE = "layout/stacked_filter.cu"
COMPILE_VARIANTS = [(src, {}, arch) for src in (STACK_SOURCE, GATHER_SOURCE, FILTER_SOURCE)
                    for arch in ("sm_80", "sm_90a")]
#: The most filter taps (zeros included) the stacked convolution may multiply per tap of the filter: a
#: 3x3 filter of stride 2 (16 / 9) passes, a 1x1 of stride 2 (one real phase of four) does not.
MAX_WASTE = 2.0
#: The largest stride per axis (phase_stack.cu holds each axis's phase shifts in that many slots).
MAX_STRIDE = 8

_STACK_FIELDS = [("words", np.int64)] + [(n, np.int32) for n in (
    "row_words", "L0", "L1", "L2", "I0", "I1", "I2", "s0", "s1", "s2")] + [
    (f"sh{a}_{k}", np.int32) for a in range(3) for k in range(MAX_STRIDE)] + divisor_fields(
    "div_row_words", "div_phases", "div_l0", "div_l1", "div_l2", "div_s1", "div_s2")


@dataclass(frozen=True)
class Subpixel:
    """One geometry's stacked-phase convolution: per axis the stride, ``window`` (J), padding ``pad``
    ((lo, hi)) of the convolution of ``dy``, its output extent ``length`` (L: every phase's rows after
    its shift), and the input-gradient extent ``extent`` (I); ``tap_of[a][phi][j]``: the filter tap of
    phase ``phi`` at window row ``j`` along axis ``a``, or -1; ``shift[a][phi]``: where phase ``phi``'s
    first row is in the convolution's output."""

    stride: Tuple[int, ...]
    window: Tuple[int, ...]
    pad: Tuple[Tuple[int, int], ...]
    length: Tuple[int, ...]
    extent: Tuple[int, ...]
    tap_of: Tuple[Tuple[Tuple[int, ...], ...], ...]
    shift: Tuple[Tuple[int, ...], ...]

    __hash__ = cached_fields_hash  # a key of several caches on every call: hashed once
    __getstate__ = fields_state

    @property
    def phases(self) -> int:
        return math.prod(self.stride)

    def describe(self, by_epilogue: bool = False, from_w: bool = False) -> str:
        """One line: the stacked convolution and how its phases reach dx (``by_epilogue``: stored into place
        by the convolution's epilogue; ``from_w``: its filter read straight from w:
        :mod:`cuconv.backends.sm90.phase_scatter`)."""
        places = ("the phases stored into place by the convolution's epilogue" if by_epilogue
                  else "the phases put into place by kernels_cu/layout/phase_stack.cu")
        source = ("read from w as it is (a tap of w per phase and window tap)" if from_w
                  else "gathered from w (kernels_cu/layout/stacked_filter.cu)")
        return (f"the {self.phases} output phases of stride {self.stride} stacked along the channels: one "
                f"stride-1 convolution of dy with a {'x'.join(map(str, self.window))} filter {source}, {places}")


def _axis(I: int, F: int, O: int, s: int, d: int, lo: int, aligned: bool = False):
    """``(window, (pad_lo, pad_hi), length, tap_of, shift, shifted)`` of one axis, or None where ``base > 0``
    or no tap reaches any phase; ``shifted``: whether the shifted form moves a phase on this axis.
    ``aligned``: no phase shifted; each phase's taps at their offsets from ``base`` in a window wide enough
    for all (:func:`geometry`)."""
    offsets = {phi: {(phi + lo - f * d) // s: f for f in range(F) if (phi + lo - f * d) % s == 0} for phi in range(s)}
    reached = {phi: taps for phi, taps in offsets.items() if taps and phi < I}
    if not reached:
        return None
    first = {phi: min(taps) for phi, taps in reached.items()}
    base = min(first.values())
    if base > 0:
        return None
    start = first if not aligned else {phi: base for phi in reached}  # each phase's window row 0
    J = max(max(taps) - start[phi] + 1 for phi, taps in reached.items())
    shift = tuple(start[phi] - base if phi in reached else 0 for phi in range(s))
    rows = max(shift[phi] + -(-(I - phi) // s) for phi in range(min(s, I)))  # every phase's rows, shifted
    pad_lo = -base
    pad_hi = max(0, rows - O - pad_lo + J - 1)
    length = O + pad_lo + pad_hi - J + 1
    tap_of = tuple(tuple(reached[phi].get(start[phi] + j, -1) if phi in reached else -1 for j in range(J))
                   for phi in range(s))
    return J, (pad_lo, pad_hi), length, tap_of, shift, any(first[phi] != base for phi in reached)


def geometry(p, aligned: bool = False) -> Optional[Subpixel]:
    """The stacked-phase convolution of the input gradient of forward problem ``p``, or None where it does
    not apply (stride 1, groups, ``delta_min > 0``) or multiplies more than :data:`MAX_WASTE` times the
    filter's taps.

    ``aligned``: the form with no phase shifted (every phase's rows start at the same output row, its taps
    at their own window offsets), or None where it is the shifted form itself. Its window is wider (a 4x4
    filter of stride 2 and padding 1: 3x3 window taps, 4 of them a phase's) and its output shorter (no
    phase's rows pushed past the others': 16 rows per phase against 17), so it pays only where the window
    taps a phase has no filter tap at are skipped (the Hopper kernel's im2col tiles within one phase,
    docs/tuning.md T-dead-taps), and the zero-tap limit does not apply to it."""
    if p.groups != 1 or all(s == 1 for s in p.stride) or max(p.stride) > MAX_STRIDE:
        return None
    axes = [_axis(i, f, o, s, d, lo, aligned) for i, f, o, s, d, lo in
            zip(p.in_spatial, p.filter_spatial, p.out_spatial, p.stride, p.dilation, p.pad_lo)]
    if any(a is None for a in axes):
        return None
    if aligned and not any(a[5] for a in axes):
        return None  # no phase is shifted: the aligned form is the shifted one
    window = tuple(a[0] for a in axes)
    if not aligned and math.prod(p.stride) * math.prod(window) > MAX_WASTE * math.prod(p.filter_spatial):
        return None
    return Subpixel(stride=tuple(p.stride), window=window, pad=tuple(a[1] for a in axes),
                    length=tuple(a[2] for a in axes), extent=tuple(p.in_spatial), tap_of=tuple(a[3] for a in axes),
                    shift=tuple(a[4] for a in axes))


@functools.lru_cache(maxsize=64)
def phase_taps(sp: Subpixel, filter_spatial: Tuple[int, ...]) -> np.ndarray:
    """The filter tap (flattened, row-major over ``filter_spatial``) of each (phase, window tap) of ``W'``,
    ``(P, prod(J))`` int32, -1 where the phase has no tap at that window position."""
    nd = len(sp.stride)
    # per axis: the filter tap at (phase phi, window row j), as a (s, J) table
    taps = [np.array(t, dtype=np.int64) for t in sp.tap_of]
    # phases row-major over the axes, window rows per axis: tap index per axis broadcast to (s..., J...)
    grids = np.meshgrid(*[np.arange(s) for s in sp.stride], *[np.arange(j) for j in sp.window], indexing="ij")
    phis, js = grids[:nd], grids[nd:]
    per_axis = [taps[a][phis[a], js[a]] for a in range(nd)]                   # each (s0.., J0..)
    missing = np.zeros(per_axis[0].shape, dtype=bool)
    flat_tap = np.zeros(per_axis[0].shape, dtype=np.int64)
    for a in range(nd):
        missing |= per_axis[a] < 0
        flat_tap = flat_tap * filter_spatial[a] + np.maximum(per_axis[a], 0)
    flat_tap = np.where(missing, -1, flat_tap)
    return np.ascontiguousarray(flat_tap.reshape(sp.phases, math.prod(sp.window)), dtype=np.int32)


@functools.lru_cache(maxsize=64)
def _index(sp: Subpixel, K: int, C: int, filter_spatial: Tuple[int, ...]) -> np.ndarray:
    """The gather index of ``W'`` (``(P C, *J, K)``, int32) into the flattened channels-last filter ``w``
    (``(K, *F, C)``), -1 for a zero tap: what kernels_cu/layout/stacked_filter.cu computes on a GPU."""
    taps = phase_taps(sp, filter_spatial).astype(np.int64)
    P, J = taps.shape
    F = math.prod(filter_spatial)
    k = np.arange(K).reshape(1, 1, 1, K)
    c = np.arange(C).reshape(1, C, 1, 1)
    t = taps.reshape(P, 1, J, 1)
    idx = np.where(t < 0, -1, (k * F + t) * C + c)                          # (P, C, J, K)
    if idx.size and idx.max() >= 2 ** 31:
        raise ValueError("w: too large for the stacked-phase gather (2^31 elements)")
    return np.ascontiguousarray(idx.reshape(P * C, *sp.window, K), dtype=np.int32)


@functools.lru_cache(maxsize=256)
def filter_is_w(sp: Subpixel, filter_spatial: Tuple[int, ...]) -> bool:
    """Whether ``W'`` is the channels-last filter ``w`` itself with its axes exchanged: a one-tap window, and
    phase ``ph``'s tap is filter tap ``ph`` (every tap once, in order: a filter the size of the stride with
    no padding, the 2x2 stride-2 upsampling layer), so ``W'[ph C + c, k] = w[k, ph, c]``, ``w`` read as
    ``(K, P C)`` (:func:`cuconv.backends.sm90.phase_scatter.stacked_view`)."""
    if any(j != 1 for j in sp.window) or math.prod(filter_spatial) != sp.phases:
        return False
    return bool((phase_taps(sp, tuple(filter_spatial)).reshape(-1) == np.arange(sp.phases)).all())


def stacked_filter(sp: Subpixel, w_n, xp, purpose: Optional[str] = None):
    """``W'`` (``(P C, *J, K)``, w's dtype) of the channels-last forward filter ``w_n`` (``(K, *F, C)``): a new
    array, or on a GPU the :mod:`cuconv.scratch` buffer ``purpose`` where one is named (the caller uses
    it before its next call on the stream)."""
    K, F, C = w_n.shape[0], tuple(w_n.shape[1:-1]), w_n.shape[-1]
    w_flat = w_n.reshape(-1) if w_n.flags.c_contiguous else xp.ascontiguousarray(w_n).reshape(-1)
    if xp is np:
        index = _index(sp, K, C, F)
        return np.where(index >= 0, w_flat[np.maximum(index, 0)], w_flat.dtype.type(0))
    shape = stacked_filter_shape(sp, w_n.shape)
    out = scratch(purpose, shape, w_n.dtype) if purpose else xp.empty(shape, dtype=w_n.dtype)
    if out.size:
        launch, taps = stacked_filter_launch(sp, w_flat, K, F, C)
        launch(w_flat.data.ptr, taps.data.ptr, out.data.ptr)
    return out


def stacked_filter_shape(sp: Subpixel, w_shape) -> tuple:
    """The shape of ``W'`` for a forward filter of shape ``w_shape`` (``(K, *F, C)``): ``(P C, *J, K)``."""
    return (sp.phases * w_shape[-1], *sp.window, w_shape[0])


def stacked_filter_launch(sp: Subpixel, w, K: int, F: Tuple[int, ...], C: int):
    """``(launch, taps)``: the packed launch of kernels_cu/layout/stacked_filter.cu that writes ``W'`` from a
    contiguous CuPy filter like ``w`` (its device and dtype; ``(K, *F, C)``), run as
    ``launch(w_ptr, taps.data.ptr, W'_ptr)`` (``W'`` non-empty); ``taps``: the (phase, window tap) ->
    filter tap table on the GPU."""
    taps = _device_taps(w.data.device_id, sp, tuple(F))
    return _filter_launch(w.data.device_id, w.itemsize, K, C, math.prod(F), sp.phases, math.prod(sp.window)), taps


def stacked_bias(sp: Subpixel, bias, xp, purpose: Optional[str] = None):
    """The bias of the stacked convolution, ``bias`` (``(C,)``, contiguous) repeated once per phase: on a GPU
    one gather into the :mod:`cuconv.scratch` buffer ``purpose`` (or a new array)."""
    if xp is np:
        return np.tile(bias, sp.phases)
    n = sp.phases * bias.shape[0]
    out = scratch(purpose, (n,), bias.dtype) if purpose else xp.empty((n,), dtype=bias.dtype)
    index = repeat_index(bias.data.device_id, bias.shape[0], sp.phases)
    gather_launch(bias.data.device_id, bias.itemsize, n)(bias.data.ptr, index.data.ptr, out.data.ptr)
    return out


@functools.lru_cache(maxsize=64)
def repeat_index(device_id: int, C: int, P: int):
    """``0 .. C-1`` repeated ``P`` times, int32, on the GPU (once per size and device)."""
    import cupy as cp
    with cp.cuda.Device(device_id):
        return cp.asarray(np.tile(np.arange(C, dtype=np.int32), P))


@functools.lru_cache(maxsize=64)
def _device_taps(device_id: int, sp: Subpixel, filter_spatial: Tuple[int, ...]):
    """The tap table of :func:`_taps` on the GPU (copied once per geometry and device)."""
    import cupy as cp
    with cp.cuda.Device(device_id):
        return cp.asarray(phase_taps(sp, filter_spatial).reshape(-1))


_FILTER_FIELDS = [(n, np.int32) for n in ("K", "C", "F", "J")]


@functools.lru_cache(maxsize=64)
def _filter_launch(device_id: int, itemsize: int, K: int, C: int, F: int, P: int, J: int) -> PackedLaunch:
    from .compiler import load_cuda_function
    from .device import gpu_info
    fn = load_cuda_function(FILTER_SOURCE, gpu_info(device_id), {}, f"stacked_filter_b{itemsize}")
    args = c_struct(_FILTER_FIELDS, dict(K=K, C=C, F=F, J=J))
    return PackedLaunch(fn, (-(-C // 64), -(-K // 64), P * J), 256, 0,
                        (np.uint64(0), np.uint64(0), np.uint64(0), args), slots=(0, 1, 2))


@functools.lru_cache(maxsize=64)
def gather_launch(device_id: int, itemsize: int, count: int) -> PackedLaunch:
    """The packed launch of kernels_cu/layout/gather_index.cu moving ``count`` elements of ``itemsize`` bytes,
    run as ``launch(src_ptr, index_ptr, dst_ptr)`` (``dst[i] = src[index[i]]``, zero where ``index[i] < 0``)."""
    from .compiler import load_cuda_function
    from .device import gpu_info
    fn = load_cuda_function(GATHER_SOURCE, gpu_info(device_id), {}, f"gather_index_b{itemsize}")
    blocks = max(1, min(-(-count // 256), 65535))
    return PackedLaunch(fn, blocks, 256, 0, (np.uint64(0), np.uint64(0), np.uint64(0), np.int64(count)),
                        slots=(0, 1, 2))


@functools.lru_cache(maxsize=64)
def gather_pair_launch(device_id: int, count0: int, count1: int) -> PackedLaunch:
    """Two gathers of 2-byte elements in one launch (``gather_index_pair_b2``), run as
    ``launch(src0, index0, dst0, src1, index1, dst1)``: ``count0`` elements of the first, ``count1`` of the second."""
    from .compiler import load_cuda_function
    from .device import gpu_info
    fn = load_cuda_function(GATHER_SOURCE, gpu_info(device_id), {}, "gather_index_pair_b2")
    blocks = max(1, min(-(-(count0 + count1) // 256), 65535))
    ptr = np.uint64(0)
    return PackedLaunch(fn, blocks, 256, 0, (ptr, ptr, ptr, np.int64(count0), ptr, ptr, ptr, np.int64(count1)),
                        slots=(0, 1, 2, 4, 5, 6))


def scatter_offsets(sp: Subpixel) -> Tuple[Tuple[int, ...], ...]:
    """Per phase (row-major), where its first stacked row lands in dx along each axis: ``d = phi - s shift(phi)``,
    so stacked row ``u`` of the phase is dx row ``s u + d`` (where that is inside dx). The table of the
    Hopper kernel's phase-scattering epilogue (:mod:`cuconv.backends.sm90.phase_scatter`)."""
    return tuple(tuple(phi - s * sh[phi] for phi, s, sh in zip(phis, sp.stride, sp.shift))
                 for phis in np.ndindex(*sp.stride))


def _phase_slices(sp: Subpixel):
    """Per phase (row-major): (its index, the slice of dx it fills, the slice of the convolution's output
    rows that holds it, per axis)."""
    out = []
    for ph, phis in enumerate(np.ndindex(*sp.stride)):
        ext = [-(-(I - phi) // s) if I > phi else 0 for I, phi, s in zip(sp.extent, phis, sp.stride)]
        if all(ext):
            rows = tuple(slice(sh[phi], sh[phi] + e) for sh, phi, e in zip(sp.shift, phis, ext))
            out.append((ph, tuple(slice(phi, None, s) for phi, s in zip(phis, sp.stride)), rows))
    return out


def unstack(sp: Subpixel, z, y, xp) -> None:
    """Put the stacked phases ``z`` (``(N, *L, P C)``) into place in ``y`` (``(N, *I, C)``): one launch of
    kernels_cu/layout/phase_stack.cu for contiguous CuPy arrays, a strided copy per phase otherwise."""
    C = y.shape[-1]
    if xp is not np and y.size and y.flags.c_contiguous and z.flags.c_contiguous:
        _stack_launch("unstack", sp, z, y)(z.data.ptr, y.data.ptr)
        return
    for ph, where, rows in _phase_slices(sp):
        y[(slice(None), *where, slice(None))] = z[(slice(None), *rows, slice(ph * C, (ph + 1) * C))]


def stack(sp: Subpixel, y, z, xp) -> None:
    """The phases of ``y`` (``(N, *I, C)``) stacked into ``z`` (``(N, *L, P C)``), zeros where a stacked
    position is outside ``y`` (as :func:`unstack`: one launch, or a strided copy per phase)."""
    C = y.shape[-1]
    if xp is not np and z.size and y.flags.c_contiguous and z.flags.c_contiguous:
        _stack_launch("stack", sp, z, y)(y.data.ptr, z.data.ptr)
        return
    z[...] = 0
    for ph, where, rows in _phase_slices(sp):
        z[(slice(None), *rows, slice(ph * C, (ph + 1) * C))] = y[(slice(None), *where, slice(None))]


def unstack_launch(sp: Subpixel, z, y) -> PackedLaunch:
    """The packed launch of :func:`unstack` for contiguous CuPy ``z`` and ``y`` (``y`` non-empty):
    ``launch(z_ptr, y_ptr)``, for addresses with the same alignment modulo 16 as these."""
    return _stack_launch("unstack", sp, z, y)


def _stack_launch(direction: str, sp: Subpixel, z, y) -> PackedLaunch:
    row = y.shape[-1] * y.itemsize
    word = next(w for w in (16, 4, 2) if row % w == 0 and z.data.ptr % w == 0 and y.data.ptr % w == 0)
    return _stack_launch_cached(direction, z.data.device_id, word, row, z.shape[0], sp)


def stack_args(sp: Subpixel, word: int, row_bytes: int, N: int):
    """``(args, blocks)``: phase_stack.cu's argument struct and grid for ``N`` images of ``row_bytes`` rows
    moved in ``word``-byte words."""
    pad = 3 - len(sp.stride)
    L3, I3, s3 = ((1,) * pad + sp.length, (1,) * pad + sp.extent, (1,) * pad + sp.stride)
    shifts = ((0,),) * pad + sp.shift
    row_words = row_bytes // word
    words = N * math.prod(L3) * sp.phases * row_words
    values = dict(words=words, row_words=row_words, L0=L3[0], L1=L3[1], L2=L3[2], I0=I3[0], I1=I3[1], I2=I3[2],
                  s0=s3[0], s1=s3[1], s2=s3[2])
    values.update({f"sh{a}_{k}": (shifts[a][k] if k < len(shifts[a]) else 0) for a in range(3)
                   for k in range(MAX_STRIDE)})
    values.update(divisor_values(div_row_words=row_words, div_phases=sp.phases, div_l0=L3[0], div_l1=L3[1],
                                 div_l2=L3[2], div_s1=s3[1], div_s2=s3[2]))
    return c_struct(_STACK_FIELDS, values), max(1, min(-(-words // 256), 65535 * 8))


@functools.lru_cache(maxsize=256)
def _stack_launch_cached(direction: str, device_id: int, word: int, row_bytes: int, N: int,
                         sp: Subpixel) -> PackedLaunch:
    from .compiler import load_cuda_function
    from .device import gpu_info
    args, blocks = stack_args(sp, word, row_bytes, N)
    fn = load_cuda_function(STACK_SOURCE, gpu_info(device_id), {}, f"phase_{direction}_w{word}")
    return PackedLaunch(fn, blocks, 256, 0, (np.uint64(0), np.uint64(0), args), slots=(0, 1))
