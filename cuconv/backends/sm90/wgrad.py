"""``sm90_wgrad``: the conv2d weight gradient on Hopper with wgmma (fp16 / bf16, NHWC).

The same GEMM as :mod:`cuconv.backends.sm80.wgrad` (``dw = dy^T @ im2col(x)``, the reduction over
the output pixels, split across CTAs and added in a fixed order), with the tiles staged in wgmma's
MN-major layout and multiplied by ``wgmma`` with both operands transposed
(kernels_cu/sm90/conv_wgrad_sm90.cu). It takes 16-byte copies only: channel counts (per group) that
are multiples of 8 and 16-byte aligned operands; :func:`declines` says otherwise, and the sm80
kernel serves the rest.

Where the channels per group are a multiple of 64 (and the TMA descriptors' limits hold,
:func:`tma_declines`), the TMA form runs instead (kernels_cu/sm90/conv_wgrad_tma_sm90.cu): one producer
warp brings dy in tiled boxes and x in im2col boxes (64 output pixels x 64 channels of one tap, the
boxes of the forward kernel's loader turned on their side), and the consumer warpgroups only multiply.
Its descriptors depend on the operands' addresses: :class:`TmaWgradLaunch` encodes them once per
address pair and keeps the last few. Its split grid needs no reduce launch where all of its CTAs are
resident at once: each adds its share of its tile's partial sums into dw once the tile's splits have
stored theirs (:data:`END_FUSED`).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Optional

import numpy as np

from ...launch import LaunchRecords, dtype_code, dtype_tag
from ...problem import ConvProblem
from ...scratch import scratch
from ..sm80.wgrad import WgradLaunch, WgradVariant, choose_splits
from ..sm80.wgrad import declines as sm80_declines
from ..sm80.wgrad import launch_for as sm80_launch_for

__all__ = ["SOURCE", "TMA_SOURCE", "STAGES", "declines", "variant", "tile_for", "tma_tile_for", "tile_time",
           "TMA_TILES", "tma_declines", "TmaWgradLaunch", "launch_for", "END_PARTIALS", "END_DIRECT", "END_FUSED",
           "padded_filters", "PaddedFilters", "folded_width", "fold_declined", "folded_tile", "FoldedWidth",
           "exchanged_roles", "ExchangedRoles", "COMPILE_VARIANTS"]

SOURCE = "sm90/conv_wgrad_sm90.cu"
TMA_SOURCE = "sm90/conv_wgrad_tma_sm90.cu"
#: Ring depth (tiles of 64 pixels); copies run STAGES - 2 tiles ahead of the wgmmas.
STAGES = 4
_BK = 64


def declines(p: ConvProblem, device, x_ptr: Optional[int] = None, dy_ptr: Optional[int] = None) -> Optional[str]:
    """Why the Hopper kernel cannot compute ``p``'s weight gradient (None: it can)."""
    why = sm80_declines(p, device)
    if why is not None:
        return why
    if device.cc != (9, 0):
        return f"needs sm_90a (wgmma), the GPU is sm_{device.cc[0]}{device.cc[1]}"
    if p.channels_per_group % 8 or p.gemm_n % 8:
        return (f"channels per group {p.channels_per_group} / filters per group {p.gemm_n}: 16-byte copies need "
                f"multiples of 8")
    if any(ptr is not None and ptr % 16 for ptr in (x_ptr, dy_ptr)):
        return "x or dy is not 16-byte aligned"
    return None


def tma_declines(p: ConvProblem) -> Optional[str]:
    """Why the TMA form of the kernel (:data:`TMA_SOURCE`) cannot load ``p``'s tiles (None: it can): its
    im2col boxes take 64 channels of one filter tap, and the descriptors' limits hold."""
    from .tensormap import tma_limits_violation
    if p.channels_per_group % 64:
        return f"channels per group {p.channels_per_group}: a TMA im2col box takes 64 channels of one tap"
    return tma_limits_violation(p)


#: Dynamic shared memory one SM gives its CTAs (228 KiB, less 1 KiB the system reserves per CTA).
_SM_SMEM = 227 * 1024


def variant(p: ConvProblem, bn: Optional[int] = None, bm: Optional[int] = None,
            tma: Optional[bool] = None, stages: Optional[int] = None, sm_count: int = 132) -> WgradVariant:
    """The kernel for ``p``: ``bm`` filters x ``bn`` columns x 64 pixels per CTA, ``bm / 64``
    warpgroups (see :func:`tile_for`, and :func:`tma_tile_for` for the TMA form, which adds a producer
    warp); ``tma``: the TMA form (None: wherever :func:`tma_declines` allows); a ring ``stages`` deep
    (None: the automatic tile's where neither side is given, else :data:`STAGES`); ``sm_count``: the GPU's
    SMs, which the TMA form's tile choice weighs. CTAs per SM: as many of its shared-memory footprint as fit,
    at most two."""
    if tma is None:
        tma = tma_declines(p) is None
    if not (bm and bn):
        auto_bm, auto_bn, auto_stages = tma_tile_for(p, sm_count) if tma else (*tile_for(p), STAGES)
        if not (bm or bn):  # the ring depth goes with the automatic tile, not with a forced side of it
            stages = stages or auto_stages
        bm, bn = bm or auto_bm, bn or auto_bn
    stages = stages or STAGES
    name = f"conv2d_wgrad_{'tma_' if tma else ''}sm90_{dtype_tag(p.dtype)}_{bm}x{bn}x{_BK}_s{stages}"
    defines = dict(CUCONV_DTYPE=dtype_code(p.dtype), CUCONV_BM=bm, CUCONV_BN=bn, CUCONV_BK=_BK,
                   CUCONV_STAGES=stages, CUCONV_KERNEL_NAME=name)
    smem = stages * (bm + bn) * _BK * 2 + 1024  # the kernel aligns the ring to 1024 bytes
    per_sm = max(1, min(2, _SM_SMEM // (smem + 2048)))  # + the TMA form's static 1 KiB (barriers), the reserve
    return WgradVariant("sm90_wgrad", TMA_SOURCE if tma else SOURCE, name, tuple(sorted(defines.items())), bm, bn,
                        _BK, 128 * (bm // 64) + (32 if tma else 0), smem, per_sm, tma=tma)


#: Launch records (descriptors packed) kept per TmaWgradLaunch, by (x, dy) address.
_RECORDS = 8


#: How a CTA of the TMA form ends (``WgradEnd`` of kernels_cu/sm90/wgrad_fused_end.cuh): partial sums for the
#: reduce launch, one split's sums rounded into dw, or the reduce done inside the grid.
END_PARTIALS, END_DIRECT, END_FUSED = 0, 1, 2

#: Tile counters at the start of the split grid's scratch buffer (uint32 each, zero when the buffer is
#: allocated and after every fused launch); the partial sums follow them, so one scratch lookup serves both
#: and no problem's partial sums ever overlap another's counters. A grid of more output tiles (never one
#: whose CTAs are all resident) ends by the reduce launch.
TILE_COUNTERS = 4096


class TmaWgradLaunch(WgradLaunch):
    """The launches of the TMA form: the main kernel's arguments are x's im2col descriptor (boxes of 64
    output pixels x 64 channels) and dy's tiled one (boxes of 64 filters x 64 pixels), encoded for the
    operands' addresses and kept for the last few address pairs (a training loop reuses its buffers).

    How the splits meet (:attr:`end`): with one split the epilogue rounds the sums into dw
    (:data:`END_DIRECT`: no workspace, no reduce launch); where every CTA of the split grid is resident at
    once (the driver's occupancy times the SMs), each CTA stores its partial sums, waits at its tile's
    counter for the tile's other splits and adds its share of the tile into dw in the reduce launch's order
    (:data:`END_FUSED`: the same bits, one launch); otherwise the reduce launch follows
    (:data:`END_PARTIALS`)."""

    def __init__(self, p: ConvProblem, device, v: WgradVariant):
        from ...launch import resident_blocks
        self._records = LaunchRecords(_RECORDS)
        super().__init__(p, device, v)
        ctas = self._grid[0] * self._grid[1] * self._grid[2]
        if self.splits.count == 1:
            self.end = END_DIRECT
        elif (ctas <= resident_blocks(self._fn, v.threads, v.smem) * max(device.sm_count, 1)
              and self.splits.tiles <= TILE_COUNTERS):
            self.end = END_FUSED
        else:
            self.end = END_PARTIALS
        self.ctas = ctas
        self._ws_words = self.splits.count * self.count  # fp32 partial sums

    def describe(self) -> str:
        v, sp = self.variant, self.splits
        head = f"{v.name}: tile {v.bm}x{v.bn}x{v.bk}, TMA boxes from a producer warp, "
        if self.end == END_DIRECT:
            return head + (f"{sp.tiles} output tile(s) in one split, the sums rounded into dw by the epilogue "
                           f"(no partial sums, no reduce)")
        if self.end == END_FUSED:
            return head + (f"{sp.tiles} output tile(s) x {sp.count} split(s) of {sp.length} pixels, fp32 partial sums "
                           f"({4 * sp.count * self.count} bytes) added in a fixed order by the grid itself (its "
                           f"{self.ctas} CTAs resident at once meet at their tiles' counters; no reduce launch)")
        return super().describe() + f" (a second launch: the grid's {self.ctas} CTAs are not all resident at once)"

    def __call__(self, x, dy, dw) -> None:
        if self.end == END_DIRECT:
            return self._launch_main(x, dy, 0, dw.data.ptr, 0)  # no workspace, no counters
        buf = scratch("weight-gradient tile counters and partial sums", (TILE_COUNTERS + self._ws_words,), np.uint32,
                      zeroed=True)
        counters = buf.data.ptr
        ws = counters + 4 * TILE_COUNTERS
        if self.end == END_FUSED:
            return self._launch_main(x, dy, ws, dw.data.ptr, counters)
        self._launch_main(x, dy, ws, dw.data.ptr, 0)
        self._reduce(ws, dw.data.ptr)

    def _pack(self, args, slots):
        return None  # packed per address pair, in _launch_main

    def _launch_main(self, x, dy, ws: int, dw: int, counters: int) -> None:
        """The main kernel on ``x`` and ``dy`` with the workspace, dw and counters at those addresses."""
        from .tensormap import encode_im2col_x, encode_tiled_c, tma_box_params
        key = (x.data.ptr, dy.data.ptr)
        launch = self._records.get(key)
        if launch is None:
            p = self.problem
            null = np.uint64(0)
            args = (encode_im2col_x(p, x.data.ptr, tma_box_params(p, _BK, 64)),
                    encode_tiled_c(p, dy.data.ptr, block_m=_BK, chunk_n=64), null, null, null, self._geometry,
                    np.int32(self.end))
            launch = super()._pack(args, slots=(2, 3, 4))
            self._records.put(key, launch)
        launch(ws, dw, counters)


def padded_filters(p: ConvProblem) -> Optional[ConvProblem]:
    """``p`` with 8 filters where it has fewer and that is all that keeps this kernel from it (groups 1,
    channels a multiple of 8: a decoder's RGB output, whose 3-channel dy sm80_wgrad copies 2 bytes at a
    time), else None."""
    if p.groups != 1 or p.out_channels >= 8 or p.channels % 8:
        return None
    return dataclasses.replace(p, out_channels=8)


class PaddedFilters:
    """The weight gradient of ``K`` < 8 filters computed as that of ``K8`` = 8 (:func:`padded_filters`): dy
    copied into a scratch buffer with its channels zero-padded (the sm80 pad pre-pass,
    :func:`cuconv.backends.sm80.pad.pad_rows`), the kernel's 8 filters into another, the first ``K`` rows
    of those copied into dw."""

    def __init__(self, inner: WgradLaunch, K: int, K8: int, device):
        self.inner, self.K, self.K8, self.device = inner, K, K8, device
        self.variant, self.splits = inner.variant, inner.splits

    @property
    def name(self) -> str:
        return self.inner.name

    def describe(self) -> str:
        return (f"filters padded from {self.K} to {self.K8} (dy copied with zero channels, the first {self.K} rows "
                f"kept): {self.inner.describe()}")

    def __call__(self, x, dy, dw) -> None:
        from ..sm80.pad import pad_rows
        dy8 = scratch("weight-gradient padded dy", (*dy.shape[:-1], self.K8), dy.dtype)
        pad_rows(dy, dy8, self.K, self.device)
        dw8 = scratch("weight-gradient padded dw", (self.K8, *dw.shape[1:]), dw.dtype)
        self.inner(x, dy8, dw8)
        dw[...] = dw8[:self.K]


#: The largest folded copy of x (bytes) :func:`folded_width` makes: about Cf / C = S times x's size (at W
#: stride 1).
FOLD_MAX_BYTES = 1 << 30
#: The fewest output pixels (the GEMM's reduction, N * P * Q) :func:`folded_width` folds: below them the
#: fold's two extra launches cost more than sm80_wgrad's 2-byte copies (docs/tuning.md#T-wgrad-fold).
FOLD_MIN_PIXELS = 1 << 16


def fold_declined(p: ConvProblem) -> Optional[str]:
    """Why :func:`folded_width` does not fold ``p``, or None where it does."""
    from ...models.fold import padded_channels
    if p.nd != 2 or p.groups != 1 or p.channels % 8 == 0:
        return "the width fold is for conv2d with groups 1 and channels not a multiple of 8"
    S = p.filter_spatial[1]
    cf = padded_channels(S * p.channels)
    if cf > 64:
        return f"the width fold's {S} columns x {p.channels} channels fill more than one 64-channel block"
    if p.gemm_m < FOLD_MIN_PIXELS:
        return (f"the width fold pays from {FOLD_MIN_PIXELS} output pixels (this gradient sums over "
                f"{p.gemm_m})")
    fold_bytes = p.batch * p.in_spatial[0] * p.out_spatial[1] * cf * p.itemsize
    if fold_bytes > FOLD_MAX_BYTES:
        return f"the width-folded x would take {fold_bytes} bytes, over {FOLD_MAX_BYTES}"
    return None


def folded_width(p: ConvProblem) -> Optional[ConvProblem]:
    """The problem :class:`FoldedWidth` computes in place of ``p``, or None (:func:`fold_declined` says
    why). Where only ``p``'s channel count (not a multiple of 8: an RGB stem, a 4-channel latent) keeps
    this kernel from it, the dense width fold (``fold_width_dense``: each output column's ``S`` input
    columns side by side, ``Cf = S * C`` rounded up to 8 channels) makes it a convolution under an
    ``R x 1`` filter with the same output, so the same dy. Groups 1, conv2d, at least
    :data:`FOLD_MIN_PIXELS` output pixels, ``Cf <= 64`` and the folded x at most :data:`FOLD_MAX_BYTES`."""
    from ...models.fold import padded_channels
    from .fold import fold_width_problem
    if fold_declined(p) is not None:
        return None
    cf = padded_channels(p.filter_spatial[1] * p.channels)
    return fold_width_problem(p, p.channels, p.dtype, p.layout, channels=cf)


class FoldedWidth:
    """The weight gradient of a few-channel ``p`` computed as that of its width-folded problem
    (:func:`folded_width`): x folded into a scratch buffer (``fold_width_dense`` of
    ``kernels_cu/layout/fold_width.cu``), the kernel's ``(K, R, 1, Cf)`` gradient into another, whose
    ``K * R`` rows give their first ``S * C`` values to dw (``dw[k, r, s, c] = dw'[k, r, 0, s * C + c]``,
    ``unfold_channels``)."""

    def __init__(self, inner: WgradLaunch, p: ConvProblem, folded: ConvProblem, device):
        from .fold import DenseFoldWidth, UnfoldChannels
        self.inner, self.p, self.folded = inner, p, folded
        self.variant, self.splits = inner.variant, inner.splits
        (H, W), (R, S), Q, C = p.in_spatial, p.filter_spatial, p.out_spatial[1], p.channels
        self.cf = folded.channels
        self._fold = DenseFoldWidth(device.index, p.batch * H * Q, C, S, p.stride[1], p.dilation[1], p.pad_lo[1],
                                    W, Q)
        self._unfold = UnfoldChannels(device.index, p.out_channels * R, S * C, self.cf)
        self._dwf_shape = (p.out_channels, R, 1, self.cf)

    @property
    def name(self) -> str:
        return self.inner.name

    def describe(self) -> str:
        (R, S), C = self.p.filter_spatial, self.p.channels
        return (f"x width-folded ({S} columns x {C} channels side by side, {self.cf} per output column, under a "
                f"{R}x1 filter): {self.inner.describe()}")

    def __call__(self, x, dy, dw) -> None:
        xf = scratch("weight-gradient folded x", self.folded.x_shape, x.dtype)
        self._fold(x, xf)
        dwf = scratch("weight-gradient folded dw", self._dwf_shape, dw.dtype)
        self.inner(xf, dy, dwf)
        self._unfold(dwf, dw)


def exchanged_roles(p: ConvProblem) -> Optional[ConvProblem]:
    """The problem :class:`ExchangedRoles` computes in place of ``p``, or None: where ``p`` has stride 1,
    groups 1, channels a multiple of 8 and a filter count that is not (a decoder's RGB or latent output), the
    weight gradient of the convolution that takes dy as its input and gives x's shape, under the same
    filter flipped (dilation d, padding ``(F - 1) d - pad`` per side), holds ``p``'s with the two channel
    axes exchanged: ``dw[k, r, s, c] = dw'[c, R-1-r, S-1-s, k]``. Its reduction reads x once as its
    output gradient, where ``p``'s reads x through the im2col once per filter tap; its few input channels
    (``p``'s filters) take the width fold. None where a padding would be negative."""
    if (p.nd != 2 or p.groups != 1 or p.out_channels % 8 == 0 or p.channels % 8
            or any(st != 1 for st in p.stride)):
        return None
    lo = [(f - 1) * d - a for f, d, a in zip(p.filter_spatial, p.dilation, p.pad_lo)]
    hi = [(f - 1) * d - b for f, d, b in zip(p.filter_spatial, p.dilation, p.pad_hi)]
    if min(lo + hi) < 0:
        return None
    q = ConvProblem.create(nd=2, batch=p.batch, in_spatial=p.out_spatial, channels=p.out_channels,
                           out_channels=p.channels, filter_spatial=p.filter_spatial, stride=1, dilation=p.dilation,
                           padding=tuple(zip(lo, hi)), groups=1, dtype=p.dtype, layout=p.layout)
    return q if q.out_spatial == p.in_spatial else None


class ExchangedRoles:
    """The weight gradient of ``p`` computed as that of :func:`exchanged_roles`'s problem: ``inner(dy, x,
    dw')`` into a scratch ``(C, R, S, K)``, then dw = dw' flipped with its channel axes exchanged (one
    launch of ``kernels_cu/layout/flip_filter.cu``, the input gradient's filter flip)."""

    def __init__(self, inner, p: ConvProblem, exchanged: ConvProblem):
        from ...layout import flip_taps
        self.inner, self.p, self.exchanged = inner, p, exchanged
        self.variant, self.splits = inner.variant, inner.splits
        self._flips = flip_taps(p.filter_spatial, (slice(None, None, -1),) * p.nd)

    @property
    def name(self) -> str:
        return self.inner.name

    def describe(self) -> str:
        q = self.exchanged
        return (f"roles exchanged (dy as the input, x as the output gradient, the result flipped and its "
                f"channel axes exchanged); the exchanged problem, {q.channels} channels -> {q.out_channels} "
                f"filters: {self.inner.describe()}")

    def __call__(self, x, dy, dw) -> None:
        from ...layout import flip_filter_launch
        dwx = scratch("weight-gradient exchanged dw", self.exchanged.w_shape, dw.dtype)
        self.inner(dy, x, dwx)
        flip_filter_launch(dwx, 1, self._flips)(dwx.data.ptr, dw.data.ptr)


@functools.lru_cache(maxsize=256)
def launch_for(p: ConvProblem, device, v: WgradVariant) -> WgradLaunch:
    """The packed launch of ``p`` with ``v``: :class:`TmaWgradLaunch` for the TMA form (memoised)."""
    return TmaWgradLaunch(p, device, v) if v.tma else sm80_launch_for(p, device, v)


#: The tiles the TMA form's automatic choice weighs (:func:`tma_tile_for`), ``(bm, bn, stages)``, the default
#: first. The 64 x 128 tile runs a ring of 6 stages, whose shared memory leaves one CTA per SM: it serves the
#: layers of few rows per tile (few filters, or few columns over many pixels), where the 128-row tile's split
#: grid needs twice the splits and its fused end twice the partial sums.
TMA_TILES = ((128, 128, STAGES), (64, 128, 6), (128, 192, STAGES), (128, 256, STAGES))
#: Modelled microseconds of one 64-pixel step per row of a TMA-form tile's operands (``bm + bn``): the kernel
#: is bound by the bytes its boxes bring from L2 (128 per row and step), not by its multiply-adds (H100, bf16:
#: a 128 x 128 step takes about 0.5 us where wgmma needs 0.28; 128 x 256 about 0.75). docs/tuning.md#T-wgrad-tile.
STEP_US_PER_ROW = 0.504 / 256
#: Bytes per microsecond the tile model gives DRAM: the floor of reading x and dy once, and the partial sums'
#: round trip through the reduce (the H100's measured copy rate).
DRAM_BYTES_PER_US = 2.9e6


def tile_time(p: ConvProblem, bm: int, bn: int, sm_count: int, stages: int = STAGES) -> float:
    """Modelled microseconds of ``p``'s weight gradient on the TMA form's ``bm x bn`` tile (ring ``stages``
    deep) in the split grid (:func:`~cuconv.backends.sm80.wgrad.choose_splits`' own choice and step count):
    its steps at :data:`STEP_US_PER_ROW` per operand row, at least the time x and dy take to come from DRAM,
    plus the partial sums written and read back by the reduce (none with one split: the epilogue rounds its
    sums into dw)."""
    v = variant(p, bm=bm, bn=bn, tma=True, stages=stages)
    sp = choose_splits(p, v, sm_count)
    operands = p.itemsize * (p.batch * p.channels * int(np.prod(p.in_spatial)) + p.gemm_m * p.out_channels)
    partials = 4 * sp.count * p.out_channels * p.gemm_k if sp.count > 1 else 0
    return max(sp.steps * STEP_US_PER_ROW * (bm + bn), operands / DRAM_BYTES_PER_US) + 2 * partials / DRAM_BYTES_PER_US


def _empty_area(p: ConvProblem, bm: int, bn: int) -> int:
    """Elements of a ``bm x bn`` tile past ``p``'s filters per group and columns (rounded up to the 64 of a
    box), in one tile: the tile model's tie-break."""
    rows, cols = 64 * -(-p.gemm_n // 64), 64 * -(-p.gemm_k // 64)
    return bm * bn - min(bm, rows) * min(bn, cols)


def tma_tile_for(p: ConvProblem, sm_count: int = 132):
    """``(bm, bn, stages)`` of the TMA form: 64 x 128 with :data:`STAGES` stages (two CTAs per SM) for few
    filters over many columns (a 128-row tile would be half empty); else the tile of :data:`TMA_TILES` with
    the shortest :func:`tile_time` on ``sm_count`` SMs (ties, which the DRAM floor makes on memory-bound
    1x1 layers: the tile with the fewest empty rows and columns, then the first). The wider tiles bring
    fewer bytes from L2 per multiply-add and win where their splits stay long and their last column tile
    full; 192 columns fit a 3x3 filter's ``9 C`` whenever C is a multiple of 64 (H100, bf16, us, 128 x 128 /
    192 / 256: VAE 3x3 512 -> 512 at 64x64 58.3 / 42.7 / 53.3, 256 -> 256 at 256x256 143.4 / 132.8 / 117.6,
    128 -> 128 at 512x512 143.8 / 118.5 / 126.0); 128 columns where more splits would be short or the
    reduce long (ResNet-50's 3x3 128 -> 128 at 28x28, N=32); 64 x 128 at 6 stages where the 128-row tile
    needs twice the splits for the same grid (1x1 layers of 512 or fewer columns or filters: ResNet-50's
    128 -> 512 at 28x28, 512 -> 2048 at 7x7). Evidence: docs/tuning.md#T-wgrad-tile."""
    if p.gemm_n <= 64 and p.gemm_k >= 512:
        return 64, 128, STAGES
    times = {t: tile_time(p, t[0], t[1], sm_count, t[2]) for t in TMA_TILES}
    return min(TMA_TILES, key=lambda t: (times[t], _empty_area(p, t[0], t[1])))


def tile_for(p: ConvProblem):
    """``(bm, bn)``: 256 x 128 where there are 256+ filters per group (each tile's copies feed twice the
    multiply-adds of a 128 x 128 tile); 64 x 128 (one warpgroup, two CTAs per SM) for 64 or fewer
    filters over 512+ columns (a 128-row tile would be half empty: ResNet-50's 3x3 64 -> 64 at 56x56,
    N=32, 39.8 us against 46.6 on an H200); else 128 x 128 (with few columns the 64-row tile's twice as
    many splits cost more than its empty rows: the 1x1 64 -> 64 layer 29.2 us against 23.9). A
    width-folded problem takes its own (:func:`folded_tile`)."""
    if p.gemm_n >= 256:
        return 256, 128
    return (64, 128) if p.gemm_n <= 64 and p.gemm_k >= 512 else (128, 128)


def folded_tile(folded: ConvProblem) -> Optional[int]:
    """The tile height of a width-folded problem (:func:`folded_width`): 64 rows for 64 or fewer filters,
    else :func:`tile_for`'s. Its columns are few (``R * Cf``) and its pixels many, and the 64-row tile
    beats the half-empty 128-row one there (H200, bf16, fold + kernel + reduce: ResNet-50's 7x7 stem,
    N=32, 111-113 us against 120-122; YOLOv8s' 3x3 stem, N=16 at 640x640, 195 against 217;
    docs/tuning.md#T-wgrad-fold)."""
    return 64 if folded.gemm_n <= 64 else None


def _compile_variants():
    def problem(c, k, dtype):
        return ConvProblem.create(nd=2, batch=2, in_spatial=(16, 16), channels=c, out_channels=k, filter_spatial=(3, 3),
                                  stride=1, dilation=1, padding=1, groups=1, dtype=dtype, layout="NHWC")
    probs = (problem(64, 64, "bfloat16"), problem(64, 128, "bfloat16"), problem(256, 256, "bfloat16"),
             problem(64, 256, "float16"))
    vs = [v for q in probs for v in (variant(q, tma=False), variant(q, tma=True))]
    vs += [variant(probs[2], bm=bm, bn=bn, tma=True, stages=st) for bm, bn, st in TMA_TILES]
    return list({v.name: (v.source, dict(v.defines), "sm_90a") for v in vs}.values())


#: Variants for the CPU compile test: every tile, both dtypes, both forms.
COMPILE_VARIANTS = _compile_variants()
