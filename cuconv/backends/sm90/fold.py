"""Inputs with few channels on Hopper: ``sm90_fold``, the filter's width folded into the channels, then the
wgmma kernel.

The Hopper kernel needs 16-byte pixel rows (C a multiple of 8) and walks the reduction in 64-channel
blocks, one filter tap at a time. An RGB stem (C = 3) or a latent (C = 4) fits neither. A pre-pass
(kernels_cu/layout/fold_width.cu; model and proof: :mod:`cuconv.models.fold`) writes, for each output
column, the ``S`` input columns its filter row reads side by side::

    x (N, H, W, C)  --fold-->  x' (N, H, Q, S * Cp)      w (K, R, S, C)  --fold-->  w' (K, R, 1, S * Cp)
    x' (*) w' with an R x 1 filter, stride (sh, 1), dilation (dh, 1), padding (ph, 0): the same output

``Cp`` is ``C`` rounded up to 8. The folded problem runs on the Hopper kernel (im2col boxes or halo
tiles) with every epilogue term and either output layout. The kernel takes problems whose folded
channels fill at most one 64-channel block (``S * Cp <= 64``) and that need the fold: C not a multiple
of 8, or a filter wider than one column. Its priority (40) is below ``sm80_igemm``'s (50), so the
automatic choice does not pick it: it runs when ``kernel="sm90_fold"`` asks for it.
``python -m cuconv.bench.layer_ab --kernel sm90_fold`` compares it with the automatic choice; on an
H200 (bf16) the automatic choice is faster on every layer of the networks suite that the fold takes:
ResNet-50's 7x7 stem 111 against 168 us, the SD VAE's and UNet's conv_in 12 against 16-18 us, YOLOv8s'
stem 164 against 442 us.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from ...launch import RowKernel
from ...models.fold import padded_channels
from ...plan import SIXTEEN_BIT, Declined
from ...registry import register
from ...scratch import scratch
from .kernel import RewritingKernel, RewritingPlan, Sm90TmaKernel

__all__ = ["Sm90FoldKernel", "FoldPlan", "FoldWidth", "DenseFoldWidth", "UnfoldChannels", "fold_width_problem", "FOLD_SOURCE"]

FOLD_SOURCE = "layout/fold_width.cu"
_ARGS_FIELDS = [("rows", np.int64), ("src_row_stride", np.int64)] + [(n, np.int32) for n in (
    "C", "Cp", "taps", "stride", "dil", "pad", "src_w", "dst_w", "vec_loads")]
#: The Hopper kernel's channel block: the folded channels must fit one.
_BLOCK = 64

#: What CI compiles (tests/test_compile.py).
COMPILE_VARIANTS = [(FOLD_SOURCE, {}, arch) for arch in ("sm_80", "sm_90a")]


def fold_width_problem(problem, tap_channels: int, dtype: str, layout: str, channels: Optional[int] = None):
    """The problem after the width fold: x ``(N, H, Q, S * tap_channels)`` (or ``channels`` in all: the dense
    fold's ``Cf``) under an ``R x 1`` filter, stride and dilation along H only, no padding along W (the fold
    applied it), the same output, in ``layout`` (the output's and the residual's; x and w reach a plan
    channels-last whatever it is)."""
    from ...problem import ConvProblem
    (R, S), (H, _) = problem.filter_spatial, problem.in_spatial
    return ConvProblem.create(nd=2, batch=problem.batch, in_spatial=(H, problem.out_spatial[1]),
                              channels=channels or S * tap_channels, out_channels=problem.out_channels,
                              filter_spatial=(R, 1),
                              stride=(problem.stride[0], 1), dilation=(problem.dilation[0], 1),
                              padding=((problem.pad_lo[0], problem.pad_hi[0]), (0, 0)), groups=1, dtype=dtype,
                              layout=layout, epilogue=problem.epilogue)


class FoldWidth(RowKernel):
    """One fold geometry on one GPU: ``rows`` destination rows of ``taps`` x ``Cp`` 16-bit values."""

    source, function, fields = FOLD_SOURCE, "fold_width", _ARGS_FIELDS

    def __init__(self, device_index: int, rows: int, c: int, taps: int, stride: int, dil: int, pad: int,
                 src_w: int, dst_w: int):
        super().__init__(device_index, dict(rows=rows, src_row_stride=c, C=c, Cp=padded_channels(c), taps=taps,
                                            stride=stride, dil=dil, pad=pad, src_w=src_w, dst_w=dst_w),
                         rows * taps * (padded_channels(c) // 8), c % 8 == 0)


class DenseFoldWidth(RowKernel):
    """One dense fold geometry on one GPU (``fold_width_dense``): ``rows`` destination rows of ``Cf`` 16-bit
    values, the ``taps`` x ``C`` channels side by side, then zeros."""

    source, function = FOLD_SOURCE, "fold_width_dense"
    fields = [("rows", np.int64), ("src_row_stride", np.int64)] + [(n, np.int32) for n in (
        "C", "Cf", "taps", "stride", "dil", "pad", "src_w", "dst_w")]

    def __init__(self, device_index: int, rows: int, c: int, taps: int, stride: int, dil: int, pad: int,
                 src_w: int, dst_w: int):
        cf = padded_channels(taps * c)
        super().__init__(device_index, dict(rows=rows, src_row_stride=c, C=c, Cf=cf, taps=taps, stride=stride,
                                            dil=dil, pad=pad, src_w=src_w, dst_w=dst_w), rows * (cf // 8), False)


class UnfoldChannels(RowKernel):
    """``rows`` rows of ``Cp`` 16-bit values -> their first ``C`` each (a densely folded weight's row padding
    dropped: ``unfold_w_dense`` of :mod:`cuconv.models.fold` as one launch)."""

    source, function = FOLD_SOURCE, "unfold_channels"
    fields = [("rows", np.int64), ("C", np.int32), ("Cp", np.int32)]

    def __init__(self, device_index: int, rows: int, c: int, cp: int):
        super().__init__(device_index, dict(rows=rows, C=c, Cp=cp), rows * c, False)


class Sm90FoldKernel(RewritingKernel):
    """conv2d of 16-bit data with few input channels on Hopper: the width fold, then the wgmma kernel."""

    name = "sm90_fold"
    backend = "cuda"
    priority = 40
    spatial_dims = (2,)
    precisions = SIXTEEN_BIT

    def rewrite_plan(self, problem, device, overrides):
        S, cp_ = problem.filter_spatial[-1], padded_channels(problem.channels)
        if S * cp_ > _BLOCK:
            return Declined(f"the filter's {S} columns of {cp_} channels fill more than one {_BLOCK}-channel block "
                            f"({S * cp_}): nothing to gain from folding them")
        if S == 1 and problem.channels % 8 == 0:
            return Declined("nothing to fold: a one-column filter over a multiple of 8 channels runs on sm90_tma")
        inner_problem = fold_width_problem(problem, cp_, problem.dtype, problem.layout)
        inner = self.inner.make_plan(inner_problem, device, overrides)
        if not inner:
            return Declined(f"the folded convolution ({inner_problem.channels} channels under a "
                            f"{problem.filter_spatial[0]}x1 filter): {inner.reason}")
        return FoldPlan(self, problem, device, inner,
                        f"the filter's {S} columns folded into the channels ({S} x {cp_}), then the Hopper kernel")


class FoldPlan(RewritingPlan):
    """Fold x and w into scratch buffers, then the Hopper plan of the folded problem."""

    extra_jobs = ((FOLD_SOURCE, {}),)

    def __init__(self, kernel, problem, device, inner, reason: str):
        super().__init__(kernel, problem, device, inner, reason)
        self.writes_channels_first = inner.writes_channels_first
        c, n, k = problem.channels, problem.batch, problem.out_channels
        (H, W), (R, S), Q = problem.in_spatial, problem.filter_spatial, problem.out_spatial[1]
        self._x_fold = FoldWidth(device.index, n * H * Q, c, S, problem.stride[1], problem.dilation[1],
                                 problem.pad_lo[1], W, Q)
        self._w_fold = FoldWidth(device.index, k * R, c, S, 0, 1, 0, S, 1)

    def describe(self) -> str:
        p = self.problem
        S, cp_ = p.filter_spatial[-1], padded_channels(p.channels)
        return (f"fold_width: x as {S} columns x {cp_} channels per output column, w as {S} x {cp_} under a "
                f"{p.filter_spatial[0]}x1 filter, then {self.inner.describe()}")

    def run(self, x, w, bias, residual, out):
        import cupy as cp
        ip = self.inner.problem
        x, w = (a if a.flags.c_contiguous else cp.ascontiguousarray(a) for a in (x, w))
        xs = scratch("fold x", ip.x_shape, "uint16")  # the kernels' own channels-last shapes
        ws = scratch("fold w", ip.w_shape, "uint16")
        self._x_fold(x, xs)
        self._w_fold(w, ws)
        self.inner.run(xs, ws, bias, residual, out)


register(Sm90FoldKernel(Sm90TmaKernel()))
