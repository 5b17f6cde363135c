"""The ``pad_channels`` path: a pre-pass copies x and w with C padded to 4 or 8 (and W-stride pixels
folded), then the per-lane implicit GEMM runs on the copies (kernels_cu/sm80/pad_channels_sm80.cu)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from ...compiler import load_cuda_function
from ...launch import c_struct, divisor_fields, divisor_values
from ...problem import ConvProblem
from ...scratch import scratch
from .variants import PAD_SOURCE, pad_variant

__all__ = ["PadPlan", "pad_plan", "pad_channels", "pad_rows"]


@dataclass(frozen=True)
class PadPlan:
    """How the ``pad_channels`` pre-pass lays out its copies of x and w, and the problem the
    ``per_lane`` kernel then runs on them (:func:`pad_plan`)."""

    cp: int                  # channels after padding (4 or 8)
    fold: int                # W pixels folded into one kernel pixel (1: no folding)
    width: int               # W of the copy of x (padded in W when fold > 1)
    pad_w: int               # zero columns written left of x's first column
    taps_w: int              # filter width of the copy of w (S rounded up to a multiple of fold)
    w_ld: int                # row pitch (elements) of the copy of w
    kernel_problem: ConvProblem


def pad_plan(problem: ConvProblem) -> PadPlan:
    """The ``pad_channels`` layout for ``problem`` (groups 1, odd C < 8).

    Channels are padded to ``CP`` = 4 (C <= 3) or 8 so that a tap's channels move in one 8- or
    16-byte copy. With a W stride ``u`` >= 2 (and no W dilation, ``u*CP <= 32``, ``u <= S``) the copy of
    x is also padded in W (the conv's W padding written as zeros) and ``u`` adjacent pixels are
    *folded* into one pixel of ``u*CP`` channels: output column q reads padded columns ``u*q + s``,
    which is folded pixel ``q + s // u``, element ``s % u``. The kernel then runs a conv with W
    stride 1, no W padding, ``ceil(S/u)`` filter columns and ``u*CP`` channels (the weights are laid
    out to match, zero past S), so the stem (3 -> 4 channels, stride 2) moves 16-byte copies, each
    two taps, instead of 8-byte copies of one (docs/tuning.md T-sm80-stem-fold)."""
    cp_ = 4 if problem.channels <= 3 else 8
    (R, S), (H, W), Q = problem.filter_spatial, problem.in_spatial, problem.out_spatial[1]
    u, dil_w = problem.stride[1], problem.dilation[1]
    if 2 <= u <= S and dil_w == 1 and u * cp_ <= 32:
        taps_w = -(-S // u)                     # folded filter columns
        width = u * (Q + taps_w - 1)            # padded columns the folded conv reads: exactly Q outputs
        kp = dataclasses.replace(
            problem, in_spatial=(H, width // u), channels=u * cp_, filter_spatial=(R, taps_w),
            stride=(problem.stride[0], 1), pad_lo=(problem.pad_lo[0], 0), pad_hi=(problem.pad_hi[0], 0))
        return PadPlan(cp_, u, width, problem.pad_lo[1], taps_w * u, kp.gemm_k, kp)
    kp = dataclasses.replace(problem, channels=cp_)
    return PadPlan(cp_, 1, W, 0, S, -(-kp.gemm_k // 8) * 8, kp)


_PAD_BLOCK_FIELDS = [("src", np.uint64), ("dst", np.uint64), ("outer", np.int64), ("inner_src", np.int32),
                     ("inner_dst", np.int32), ("lo", np.int32)] + divisor_fields("div_inner_dst")


def _pad_block(src, dst, outer: int, inner_src: int, inner_dst: int, lo: int) -> np.void:
    """The ``PadBlock`` struct of kernels_cu/sm80/pad_channels_sm80.cu."""
    return c_struct(_PAD_BLOCK_FIELDS, dict(src=src.data.ptr, dst=dst.data.ptr, outer=outer, inner_src=inner_src,
                                            inner_dst=inner_dst, lo=lo, **divisor_values(div_inner_dst=inner_dst)))


def pad_channels(problem: ConvProblem, plan: PadPlan, x, w, dev):
    """The pad_channels pre-pass (one launch): copies of x ``[N, H, plan.width, CP]`` and of w
    (``[K][R][plan.taps_w][CP]`` folded, else ``[K][R*S*CP]`` rows ``plan.w_ld`` apart) in the
    stream's scratch buffers (:mod:`cuconv.scratch`), every padded element written as zero. The
    caller's arrays are only read."""
    (R, S), (H, W) = problem.filter_spatial, problem.in_spatial
    N, K, cp_ = problem.batch, problem.out_channels, plan.cp
    xp = scratch("sm80.pad_channels.x", (N, H, plan.width, cp_), x.dtype)
    wp = scratch("sm80.pad_channels.w", (K, plan.w_ld), w.dtype)
    tx = _pad_block(x, xp, N * H, W, plan.width, plan.pad_w)
    if plan.fold > 1:   # each filter row (k, r): S taps -> taps_w taps
        tw = _pad_block(w, wp, K * R, S, plan.taps_w, 0)
    else:               # each filter: R*S taps -> w_ld / CP rows
        tw = _pad_block(w, wp, K, R * S, plan.w_ld // cp_, 0)
    rows = xp.size // cp_ + wp.size // cp_
    name, defines = pad_variant(cp_)
    fn = load_cuda_function(PAD_SOURCE, dev, defines, name, 0)
    fn((max(1, min(-(-rows // 256), 65535 * 4)),), (256,), (tx, tw, np.int32(problem.channels)))
    return xp, wp


def pad_rows(src, dst, channels: int, dev) -> None:
    """``dst`` (contiguous rows of 8 two-byte elements) = ``src`` (contiguous rows of ``channels`` < 8
    elements) with zeros after each row's elements: one launch of the pre-pass on the current stream
    (the weight gradient's padded filters, :class:`cuconv.backends.sm90.wgrad.PaddedFilters`)."""
    rows = dst.size // 8
    block = _pad_block(src, dst, rows, 1, 1, 0)
    empty = _pad_block(src, dst, 0, 1, 1, 0)
    name, defines = pad_variant(8)
    fn = load_cuda_function(PAD_SOURCE, dev, defines, name, 0)
    fn((max(1, min(-(-rows // 256), 65535 * 4)),), (256,), (block, empty, np.int32(channels)))
