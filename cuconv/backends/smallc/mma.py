"""``smallc_mma``: dense convolution with few input channels and a long window (a 7x7 RGB stem),
conv2d and conv3d, fp16 / bf16, on tensor cores of every sm_80+ NVIDIA GPU. NHWC / NDHWC, and NCHW /
NCDHW read and written by the kernel itself (its ``_cf`` variants: no operand is moved).

A 7x7 stem's 147 terms per output are too many for the fp32 direct kernel (``smallc_direct`` takes up
to 64) and its 3-channel pixels too narrow for the implicit GEMM loaders (16-byte rows). The kernel
(kernels_cu/smallc/smallc_mma.cu) copies each input tile with its halo into shared memory once and
reads every A fragment of mma.sync straight from it through a table of per-term offsets: the im2col
is never written (docs/architecture.md, "Few input channels").

The grid is persistent: each CTA loads its chunk's filter once and takes output tiles in turn. A plan
holds the tile shape (:func:`.mma_variants.mma_config`), and after its first run the loaded function
and the launch's packed arguments (:class:`cuconv.launch.PackedLaunch`).
"""

from __future__ import annotations

from typing import Optional

from ...overrides import Overrides
from ...plan import SIXTEEN_BIT
from ...problem import LAYOUTS
from ...registry import register, registered
from ..depthwise.kernel import DirectKernel, DirectPlan
from ..depthwise.variants import problem_axes
from .mma_variants import MAX_BN, MMA_SOURCE, MmaConfig, mma_config, mma_declined, mma_variant
from .params import mma_geometry
from .variants import smallc_declined

__all__ = ["SmallcMmaKernel", "SmallcMmaPlan", "MIN_TERMS", "STEM_MAX_C", "more_channels_passed_over"]

#: Reduction terms per output (C x R x S) below which the automatic choice leaves a problem to
#: ``smallc_direct`` (:meth:`SmallcMmaKernel.passes_over`).
MIN_TERMS = 16
#: Input channels up to which the automatic choice takes every problem this kernel serves (past
#: :data:`MIN_TERMS`); from there to :data:`~.mma_variants.MMA_MAX_C` it takes those of
#: :func:`more_channels_passed_over`.
STEM_MAX_C = 8


def more_channels_passed_over(p, device) -> Optional[str]:
    """Why the automatic choice leaves a problem of 9-32 input channels to the implicit GEMM kernels, or
    None: on Hopper it takes a conv2d on channels-last arrays with a filter of more than one tap and one
    chunk of output channels (K <= 64), fewer than 32 channels or at most 32 outputs, whose W axis
    ``sm90_wpack`` does not pack. The Hopper kernel's 64-channel blocks are a quarter (C = 16) or three eighths
    (C = 24) full, and its 64-column tiles half full at K = 32, where this kernel reads the window's terms
    as they are; 32 channels into 64 outputs fill its tiles better than this kernel's mma.sync does, more
    chunks re-read the input, and where ``sm90_wpack``'s automatic choice packs the pixels (an even enough
    W on Hopper) it runs 5-15% faster (docs/tuning.md#T-smallc-channels)."""
    if device is None or device.kind != "cuda" or device.cc < (9, 0):
        return (f"C = {p.channels}: the automatic choice takes more than {STEM_MAX_C} channels on Hopper, where "
                f"it was measured against the implicit GEMM kernels")
    if p.nd != 2 or not LAYOUTS[p.layout][1]:
        return (f"C = {p.channels}: the automatic choice takes more than {STEM_MAX_C} channels for conv2d on "
                f"channels-last arrays")
    R, S = p.filter_spatial
    if R * S == 1:
        return f"C = {p.channels} under a 1x1 filter: the pointwise and GEMM kernels read each pixel once as fast"
    if p.out_channels > MAX_BN or (p.channels >= 32 and p.out_channels > 32):
        return (f"C = {p.channels} into K = {p.out_channels}: the Hopper and sm80 implicit GEMM kernels fill their "
                f"tiles here (this kernel would take {-(-p.out_channels // MAX_BN)} chunks of {MAX_BN} channels)")
    packed = _packed_plan(p, device)
    if packed is not None:
        return (f"C = {p.channels}: sm90_wpack packs {packed.pack.g} pixels of this W axis into "
                f"{packed.pack.g * p.channels} channels, which runs faster")
    return None


def _packed_plan(p, device):
    """``sm90_wpack``'s plan of ``p`` where its automatic choice takes it (no overrides), else None."""
    wpack = next((k for k in registered() if k.name == "sm90_wpack"), None)
    if wpack is None:
        return None
    plan = wpack.plan(p, device, Overrides())
    return plan if plan and wpack.passes_over(plan) is None else None


class SmallcMmaKernel(DirectKernel):
    """Few input channels on tensor cores: halo tiles in shared memory, A fragments read through an
    offset table, mma.sync with fp32 accumulators."""

    name = "smallc_mma"
    #: Above ``smallc_direct`` (112), which keeps float32 (this kernel declines it) and the problems
    #: :meth:`passes_over` leaves, and above the implicit GEMM kernels, which pad C (sm80_igemm) or
    #: decline it (sm90_tma). Evidence: docs/tuning.md#T-smallc-mma.
    priority = 113
    #: fp16 / bf16 operands on the tensor cores, fp32 accumulators.
    precisions = SIXTEEN_BIT

    def declined(self, problem):
        return mma_declined(problem)

    def config(self, problem):
        return mma_config(problem)

    def passes_over(self, plan):
        """The automatic choice leaves to ``smallc_direct`` the windows of fewer than :data:`MIN_TERMS`
        terms (a 1x1 or 2x1 filter over a few channels: one k16 step, mostly padding) and the conv3d
        problems it takes, whose filter slices this kernel multiplies one tile copy at a time
        (docs/tuning.md#T-smallc-mma)."""
        p = plan.problem
        _, R, S, _, _, _ = problem_axes(p)
        if p.channels * R * S < MIN_TERMS:
            return (f"{p.channels * R * S} terms per output fill less than one k16 step: the fp32 multiply-adds "
                    f"of smallc_direct cost less than its padding")
        if p.channels > STEM_MAX_C:
            why = more_channels_passed_over(p, plan.device)
            if why:
                return why
        if p.nd == 3 and not smallc_declined(p):
            return ("a conv3d within smallc_direct's reach: its fp32 multiply-adds run it faster than one tile "
                    "copy per filter slice here")
        return None

    def plan_for(self, problem, device, cfg):
        _, R, S, _, _, _ = problem_axes(problem)
        terms = problem.channels * R * S
        return SmallcMmaPlan(self, problem, device, cfg,
                             f"few input channels (C = {problem.channels}) and a long window ({terms} terms per "
                             f"output): tensor cores, the im2col read from the input tile in shared memory")


class SmallcMmaPlan(DirectPlan):
    """The tile shape of one few-channel problem on tensor cores, and its packed launch once it has run."""

    source = MMA_SOURCE

    def __init__(self, kernel, problem, device, cfg: MmaConfig, reason: str):
        super().__init__(kernel, problem, device, cfg, mma_variant(problem, cfg), reason)
        #: NCHW / NCDHW problems: the kernel reads x and w and writes the result (and reads the residual)
        #: channels-first itself.
        self.writes_channels_first = self.reads_channels_first = "MM_NCHW" in self.defines

    def describe(self) -> str:
        c, p = self.cfg, self.problem
        T = problem_axes(p)[0]
        depth = f", {T} filter slices in turn" if p.nd == 3 else ""
        reads = "pairs of terms" if c.pairs else "single terms"
        if c.planar:
            copies = f"each channel plane's rows copied as {2 * c.span}-byte words, stored [row][c][col]"
        elif c.span:
            copies = f"rows copied as {2 * c.span}-byte words"
        else:
            copies = f"copies of {c.vin} channels"
            if c.cst != p.channels:
                copies += (f", each pixel stored as {c.cst} elements, {c.cst - p.channels} of them zero, so that A "
                           f"reads fall on distinct banks")
        return (f"{self.name}: CTA tile {c.tp}x{c.tq} output pixels x {c.bn} channels ({c.threads} threads, "
                f"mma.sync m16n8k16 over {c.kp // 16} k16 steps, A read as {reads}), input tile "
                f"{c.in_rows}x{c.in_cols}x{p.channels} with halo in shared memory, two buffers ({c.smem} bytes with "
                f"the filter, {copies}){depth}, {c.tiles(p)} tiles ({c.chunks} chunks x "
                f"{c.tiles_p}x{c.tiles_q} per plane) over a persistent grid"
                + (f", x and w read channels-first (the input tile {'copied' if c.planar else 'gathered'} from the "
                   "channel planes), epilogue stores channels-first (a pair of pixels per 32-bit store along each "
                   "channel plane)" if self.reads_channels_first else ""))

    def geometry(self):
        return mma_geometry(self.problem, self.cfg)


register(SmallcMmaKernel())
