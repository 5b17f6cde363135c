"""Gradient calls on a GPU replayed as their launches.

A gradient call of a signature seen before (the call memos of :mod:`cuconv.grad`: operands by shape,
strides, dtype and device, every other argument by value) needs no validation and no planning. Where
its operands are CuPy arrays, channels-last and contiguous, what is left is a fixed sequence of
launches; the first call of the signature packs them into a replay, kept with the memo, and later
calls run only that:

* :class:`WholeInput`: the input gradient of a stride-1 convolution: the filter flipped
  (kernels_cu/layout/flip_filter.cu), one forward convolution into dx.
* :class:`StackedInput`: a strided input gradient as one convolution over the stacked phases
  (:mod:`cuconv.subpixel`): the filter (and the bias) gathered, the convolution, the phases put into
  place (by the convolution's epilogue on Hopper, :mod:`cuconv.backends.sm90.phase_scatter`).
* :class:`OnePhaseInput`: a strided input gradient of which one phase is reached by a filter tap and
  the others are zeros (a 1x1 filter of stride 2): the filter flipped, one convolution of that phase,
  dx written whole (the phase and the zeros, ``phase_scatter_fill`` in kernels_cu/layout/phase_scatter.cu);
  on Hopper, dx zeroed and the phase stored into place by the convolution's epilogue.
* :class:`DirectInput`: an input gradient on Hopper (stride 1, one phase of a stride, or the stacked
  phases) whose convolution reads its filter straight from ``w``: one launch.
* :class:`WeightReplay`: the 2-D weight gradient on its GEMM kernel (``sm90_wgrad`` / ``sm80_wgrad``).

Temporaries (the flipped or gathered filter, the stacked phases) live in :mod:`cuconv.scratch`
buffers: each is consumed by a later launch on the same stream. The kernels are the ones the full path
runs, so :func:`cuconv.explain_input_grad` and :func:`cuconv.explain_weight_grad` describe a replayed
call too. A replay answers None where a call's addresses are aligned unlike any it can launch, and
the full path then runs.

CuPy is imported only inside functions.
"""

from __future__ import annotations

from typing import Callable, Optional, Tuple

from .api import execute
from .scratch import scratch
from .subpixel import stacked_bias

__all__ = ["WholeInput", "StackedInput", "OnePhaseInput", "DirectInput", "WeightReplay"]


class _Input:
    """What every input-gradient replay shares: dx's shape and dtype, the GPU, and the forward plan."""

    def __init__(self, y_shape: Tuple[int, ...], dtype, device_id: int, fplan):
        import cupy as cp
        self._empty = cp.empty
        self._cp = cp
        self.y_shape, self.dtype, self.device_id, self.fplan = y_shape, dtype, device_id, fplan

    def _result(self, out):
        return out if out is not None else self._empty(self.y_shape, dtype=self.dtype)


class WholeInput(_Input):
    """Stride 1: ``flip(w) -> wt`` (scratch), then the forward convolution of ``dy`` with ``wt`` into dx,
    with the call's bias and epilogue."""

    def __init__(self, y_shape, dtype, device_id, fplan, flip, wt_shape):
        super().__init__(y_shape, dtype, device_id, fplan)
        self._flip, self._wt_shape = flip, wt_shape

    def __call__(self, dy, w, bias, out):
        y = self._result(out)
        wt = scratch("input-gradient filter", self._wt_shape, self.dtype)
        self._flip(w.data.ptr, wt.data.ptr)
        execute(self.fplan, self._cp, self.device_id, dy, wt, bias, None, y)
        return y


class StackedInput(_Input):
    """The stacked-phase convolution: ``W'`` gathered from ``w`` (and the bias repeated per phase,
    :func:`cuconv.subpixel.stacked_bias`) into scratch, the convolution into the stacked phases (scratch),
    the phases put into dx; or, where ``unstack_of`` is None, ``fplan`` is the plan whose epilogue stores
    the phases into dx itself (:mod:`cuconv.backends.sm90.phase_scatter`)."""

    def __init__(self, y_shape, dtype, device_id, fplan, sp, gather, wt_shape, z_shape, unstack_of: Callable):
        super().__init__(y_shape, dtype, device_id, fplan)
        self._sp, self._gather, self._wt_shape = sp, gather, wt_shape
        self._z_shape = z_shape
        self._unstack_of = unstack_of     # (z, y) -> the packed unstack launch for their alignment
        self._unstack = {}

    def __call__(self, dy, w, bias, out):
        y = self._result(out)
        wt = scratch("stacked-phase filter", self._wt_shape, self.dtype)
        gather, taps = self._gather
        gather(w.data.ptr, taps.data.ptr, wt.data.ptr)
        b = None if bias is None else stacked_bias(self._sp, bias, self._cp, "stacked-phase bias")
        if self._unstack_of is None:  # the convolution's epilogue stores the phases into dx
            execute(self.fplan, self._cp, self.device_id, dy, wt, b, None, y)
            return y
        launch = self._unstack.get(y.data.ptr & 15)
        z = scratch("stacked phases", self._z_shape, self.dtype)
        if launch is None:
            launch = self._unstack[y.data.ptr & 15] = self._unstack_of(z, y)
        execute(self.fplan, self._cp, self.device_id, dy, wt, b, None, z)
        launch(z.data.ptr, y.data.ptr)
        return y


class DirectInput(_Input):
    """An input gradient (stride 1, one phase of a stride, or the stacked phases) whose convolution reads its
    filter straight from ``w`` and writes dx
    (:func:`cuconv.backends.sm90.phase_scatter.direct_filter`): one launch, after a zero fill of dx where
    ``zero_first`` (the phases no tap reaches), the bias repeated per phase where ``sp`` is given."""

    def __init__(self, y_shape, dtype, device_id, fplan, zero_first: bool, sp=None):
        super().__init__(y_shape, dtype, device_id, fplan)
        self._zero_first, self._sp = zero_first, sp

    def __call__(self, dy, w, bias, out):
        y = self._result(out)
        if self._zero_first:
            y.data.memset_async(0, y.nbytes)
        if bias is not None and self._sp is not None:
            bias = stacked_bias(self._sp, bias, self._cp, "stacked-phase bias")
        execute(self.fplan, self._cp, self.device_id, dy, w, bias, None, y)
        return y


class OnePhaseInput(_Input):
    """One phase reached by a tap, zeros elsewhere, no epilogue: ``flip(w) -> wt``, the phase's
    convolution into scratch, then dx written whole from it (zeros between its rows); or, where
    ``fill_of`` is None, dx zeroed and ``fplan`` the plan whose epilogue stores the phase into it
    (:mod:`cuconv.backends.sm90.phase_scatter`)."""

    def __init__(self, y_shape, dtype, device_id, fplan, flip, wt_shape, part_shape, fill_of: Callable):
        super().__init__(y_shape, dtype, device_id, fplan)
        self._flip, self._wt_shape, self._part_shape = flip, wt_shape, part_shape
        self._fill_of = fill_of           # (part, y) -> the packed fill launch, or None (no word fits)
        self._fill = {}

    def __call__(self, dy, w, bias, out):
        y = self._result(out)
        if self._fill_of is None:
            y.data.memset_async(0, y.nbytes)
            wt = scratch("input-gradient filter", self._wt_shape, self.dtype)
            self._flip(w.data.ptr, wt.data.ptr)
            execute(self.fplan, self._cp, self.device_id, dy, wt, None, None, y)
            return y
        part = scratch("input-gradient phase", self._part_shape, self.dtype)
        align = y.data.ptr & 15
        launch = self._fill.get(align)
        if launch is None:
            launch = self._fill[align] = self._fill_of(part, y)
            if launch is None:
                return None
        wt = scratch("input-gradient filter", self._wt_shape, self.dtype)
        self._flip(w.data.ptr, wt.data.ptr)
        execute(self.fplan, self._cp, self.device_id, dy, wt, None, None, part)
        launch(part.data.ptr, y.data.ptr)
        return y


class WeightReplay:
    """The weight gradient on its GEMM kernel, on GPU ``device_id`` (made current for the call where another
    is): ``run_of(x_align, dy_align)`` gives the packed launch pair
    (:class:`~cuconv.backends.sm80.wgrad.WgradLaunch`) for operands at those addresses modulo 16, or
    None (the full path runs); ``bias_of``: also the bias gradient, ``bias_of(dy)`` (the full path's
    function), or None."""

    def __init__(self, dw_shape: Tuple[int, ...], dtype, device_id: int, run_of: Callable,
                 bias_of: Optional[Callable]):
        import cupy as cp
        self._new, self._current_device, self._device = cp.ndarray, cp.cuda.runtime.getDevice, cp.cuda.Device
        self.dw_shape, self.dtype, self.device_id, self._bias_of = dw_shape, dtype, device_id, bias_of
        self._run_of = run_of
        self._runs = {}

    def __call__(self, x, dy) -> Optional[object]:
        if self._current_device() != self.device_id:
            with self._device(self.device_id):
                return self(x, dy)
        align = (x.data.ptr & 15, dy.data.ptr & 15)
        run = self._runs.get(align)
        if run is None:
            run = self._runs[align] = self._run_of(*align) or False
        if run is False:
            return None
        dw = self._new(self.dw_shape, self.dtype)
        run(x, dy, dw)
        return dw if self._bias_of is None else (dw, self._bias_of(dy))
