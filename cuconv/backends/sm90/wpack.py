"""Few channels on Hopper: ``sm90_wpack`` (conv2d) and ``conv3d_native_wpack`` (conv3d), neighbouring pixels
packed into the channels, then the wgmma kernel.

The Hopper kernel reads each filter tap in 64-channel blocks and writes tiles at least 64 output channels
wide. A layer of ``C = 32`` (or 16) channels fills half (a quarter) of every block, and one of ``K = 32``
outputs half of every tile. Seen as ``g = 64 / C`` pixels of ``C`` channels per pixel of 64 (and ``go``
output pixels per packed output pixel), a contiguous channels-last x, output and residual are the same
bytes; only the filter changes (model and proof: :mod:`cuconv.models.wpack`)::

    x   (N, [D,] H, W, C)      as  x'   (N, [D,] H, W / g, g C)          no copy
    out (N, [D,] P, Q, K)      as  out' (N, [D,] P, Q / go, go K)        no copy
    w   (K, [T,] R, S, C)  --gather-->  w' (go K, [T,] R, S', g C)       one launch per call, a few KiB
    bias (K,)              --gather-->  bias' (go K,)                    (when go > 1)

The filter is gathered on every call (weights may change between calls), with the repeated bias in the same
launch, through a table made once per geometry (kernels_cu/layout/gather_index.cu). The kernel plans every
problem whose W axis packs; the automatic choice passes it over (:meth:`Sm90WPackKernel.passes_over`; a
call with ``kernel="sm90_wpack"`` runs it regardless) except on a problem whose packed form leaves at most
:data:`MAX_WORK_RATIO` of the tensor-core work (:func:`cuconv.models.wpack.work_ratio`), whose unpacked
tiles fill at least :data:`MIN_WAVES` waves of the GPU (a shorter layer runs at the host's pace, and the
gather is one launch more), and whose filter is wider than one column (a 1x1 layer reads each pixel once
and is bound by memory, which packing does not change).
The evidence is docs/tuning.md T-wpack.
"""

from __future__ import annotations

import functools
from typing import Optional

import numpy as np

from ...models.wpack import BLOCK_CHANNELS, WPack, pack_filter_index, w_axis, work_ratio, wpack_or_reason
from ...plan import SIXTEEN_BIT, Declined
from ...problem import ConvProblem
from ...registry import register
from ...scratch import scratch
from ...subpixel import GATHER_SOURCE, gather_launch, gather_pair_launch, repeat_index
from .kernel import RewritingKernel, RewritingPlan, Sm90TmaConv3d, Sm90TmaKernel

__all__ = ["Sm90WPackKernel", "Sm90WPackConv3d", "WPackPlan", "wpack_problem", "MAX_WORK_RATIO", "MIN_WAVES"]

#: The most tensor-core work (packed over direct) the automatic choice accepts (docs/tuning.md T-wpack).
MAX_WORK_RATIO = 0.75
#: The fewest waves of unpacked tiles the automatic choice packs (docs/tuning.md T-wpack).
MIN_WAVES = 8


def wpack_problem(problem: ConvProblem, pack: WPack) -> ConvProblem:
    """The packed convolution of ``problem``: the last spatial axis in groups of ``pack.g`` input and
    ``pack.go`` output pixels, everything else as it is."""
    lead = problem.nd - 1
    return ConvProblem.create(
        nd=problem.nd, batch=problem.batch, in_spatial=(*problem.in_spatial[:lead], pack.in_w),
        channels=pack.g * problem.channels, out_channels=pack.go * problem.out_channels,
        filter_spatial=(*problem.filter_spatial[:lead], pack.taps), stride=(*problem.stride[:lead], pack.stride),
        dilation=(*problem.dilation[:lead], 1),
        padding=tuple(zip(problem.pad_lo[:lead], problem.pad_hi[:lead])) + ((pack.pad_lo, pack.pad_hi),),
        groups=1, dtype=problem.dtype, layout=problem.layout, epilogue=problem.epilogue,
        precision=problem.precision)


class Sm90WPackKernel(RewritingKernel):
    """conv2d of 16-bit data with 8-32 channels on Hopper: pixels packed into 64 channels, then the wgmma kernel."""

    name = "sm90_wpack"
    backend = "cuda"
    priority = 101  # asked before sm90_tma (100), which runs the same problem unpacked
    spatial_dims = (2,)
    precisions = SIXTEEN_BIT

    def __init__(self, inner=None):
        super().__init__(inner or Sm90TmaKernel())

    def rewrite_plan(self, problem, device, overrides):
        if problem.layout not in ("NHWC", "NDHWC"):
            return Declined(f"{problem.layout} output: a packed output pixel is several columns of the "
                            f"channels-last output, which {self.inner.name} writes channels-first directly")
        W, Q, S, sw, dw, pl = w_axis(problem)
        pack = wpack_or_reason(W, Q, S, sw, dw, pl, problem.channels)
        if isinstance(pack, str):
            return Declined(pack)
        inner_problem = wpack_problem(problem, pack)
        inner = self.inner.make_plan(inner_problem, device, overrides)
        if not inner:
            return Declined(f"the packed convolution ({inner_problem.describe()}): {inner.reason}")
        direct = self.inner.make_plan(problem, device, overrides)
        ratio = work_ratio(pack, problem.channels, problem.out_channels, S)
        return WPackPlan(self, problem, device, inner, pack, ratio,
                         f"C={problem.channels}: {pack.g} neighbouring pixels packed into one of "
                         f"{pack.g * problem.channels} channels fill the Hopper kernel's {BLOCK_CHANNELS}-channel "
                         f"blocks ({ratio:.2f} of the unpacked tensor-core work)",
                         direct if direct else None)

    def passes_over(self, plan):
        """The automatic choice packs only where it pays (module docstring): a filter wider than one column,
        at most :data:`MAX_WORK_RATIO` of the tensor-core work, at least :data:`MIN_WAVES` waves of tiles."""
        if plan.problem.filter_spatial[-1] == 1:
            return ("a one-column filter reads each pixel once: the layer is bound by memory, which packing "
                    "does not change")
        if plan.ratio > MAX_WORK_RATIO:
            return (f"packing {plan.pack.g} pixels leaves {plan.ratio:.2f} of the tensor-core work (the zero taps "
                    f"of the packed filter), more than {MAX_WORK_RATIO}")
        sms = plan.device.sm_count or 132
        if plan.direct_units is not None and plan.direct_units < MIN_WAVES * sms:
            return (f"unpacked, its {plan.direct_units} tiles are fewer than {MIN_WAVES} waves of {sms} SMs: a "
                    f"layer this short runs at about the host's pace, to which packing adds a launch")
        return None


class Sm90WPackConv3d(Sm90WPackKernel):
    """conv3d's "native" strategy with pixels packed along W (see :class:`Sm90WPackKernel`)."""

    name = "conv3d_native_wpack"
    priority = 96  # asked before conv3d_native (95)
    spatial_dims = (3,)
    strategy = "native"

    def __init__(self):
        super().__init__(Sm90TmaConv3d())


class WPackPlan(RewritingPlan):
    """Gather the packed filter (and bias), then the Hopper plan of the packed problem on x and out as they are."""

    extra_jobs = ((GATHER_SOURCE, {}),)

    def __init__(self, kernel, problem, device, inner, pack: WPack, ratio: float, reason: str, direct=None):
        super().__init__(kernel, problem, device, inner, reason)
        self.pack, self.ratio = pack, ratio
        #: The inner kernel's plan of the problem unpacked, None where that kernel declines it.
        self.direct = direct
        self._gathers = None  # (with a bias, (launch, tables)): made on the first run (:meth:`_gathers_for`)
        if inner.problem.out_shape[1:-1] != (*problem.out_shape[1:-2], pack.out_w):
            raise AssertionError(f"packed output {inner.problem.out_shape} is not {problem.out_shape} seen in groups "
                                 f"of {pack.go}")  # pragma: no cover - wpack_or_reason guarantees it

    def describe(self) -> str:
        p, pk = self.problem, self.pack
        outputs = (f", {pk.go} output pixels of {p.out_channels} channels as one of {pk.go * p.out_channels}"
                   if pk.go > 1 else "")
        return (f"width pack: {pk.g} pixels of {p.channels} channels as one of {pk.g * p.channels}{outputs} "
                f"(filter gathered to {pk.taps} taps along W, stride {pk.stride}; {self.ratio:.2f} of the unpacked "
                f"tensor-core work), then {self.inner.describe()}")

    @property
    def direct_units(self) -> Optional[int]:
        """Tiles (units) of the unpacked plan, None where the inner kernel declines the problem unpacked."""
        return None if self.direct is None else self.direct.cfg.num_units

    def unpacked(self):
        """The plan of the same convolution on the inner kernel, unpacked (for the input-gradient variants,
        which store and read the convolution's own columns; they copy it before changing it); this plan
        where the inner kernel declines."""
        return self if self.direct is None else self.direct

    def _gathers_for(self, with_bias: bool):
        """``(launch, filter table, bias table)`` on the plan's GPU: the filter gather, or the filter and the
        repeated bias in one launch (``bias table`` None without), made on the first run of each kind."""
        if self._gathers is None or self._gathers[0] != with_bias:
            p, dev, pk = self.problem, self.device.index, self.pack
            K, (_, _, S, sw, dw, pl) = p.out_channels, w_axis(p)
            w_count = int(np.prod(self.inner.problem.w_shape))
            launch = gather_pair_launch(dev, w_count, pk.go * K) if with_bias else gather_launch(dev, 2, w_count)
            table = _filter_table(dev, pk, K, int(np.prod(p.filter_spatial[:-1])), S, p.channels, sw, dw, pl)
            self._gathers = (with_bias, (launch, table,
                                         repeat_index(dev, K, pk.go) if with_bias else None))
        return self._gathers[1]

    def run(self, x, w, bias, residual, out):
        if not w.flags.c_contiguous:
            import cupy as cp
            w = cp.ascontiguousarray(w)
        repeat = bias is not None and self.pack.go > 1
        launch, w_table, b_table = self._gathers_for(repeat)
        wp = scratch("wpack w", self.inner.problem.w_shape, w.dtype)
        if repeat:
            bp = scratch("wpack bias", (self.pack.go * self.problem.out_channels,), bias.dtype)
            launch(w.data.ptr, w_table.data.ptr, wp.data.ptr, bias.data.ptr, b_table.data.ptr, bp.data.ptr)
            bias = bp
        else:
            launch(w.data.ptr, w_table.data.ptr, wp.data.ptr)
        self.inner.run(x, wp, bias, residual, out)


@functools.lru_cache(maxsize=64)
def _filter_table(device_id: int, pack: WPack, K: int, lead: int, S: int, C: int, sw: int, dw: int, pl: int):
    """The packed filter's gather table (:func:`cuconv.models.wpack.pack_filter_index`, the leading filter axes
    (T, R) as one of ``lead`` taps) on the GPU, once per geometry and device."""
    import cupy as cp
    index = pack_filter_index(pack, K, lead, S, C, sw, dw, pl)
    with cp.cuda.Device(device_id):
        return cp.asarray(index.reshape(-1))


register(Sm90WPackKernel())
register(Sm90WPackConv3d())
