"""``depthwise_diag``: depthwise convolution (multiplier 1) on the tensor cores of every sm_80+ NVIDIA GPU,
conv2d, NHWC, fp16 / bf16, C a multiple of 16, filters of up to 9 taps, strides and dilations 1-2.

16 output pixels x 8 channels are one m16n8k16 MMA per pair of filter taps: A's rows are the two taps'
8-channel runs of the input pixels (read by ldmatrix from the channels-last tile as it is), B two
diagonal 8 x 8 blocks of the taps' weights (kernels_cu/depthwise/depthwise_diag.cu; docs/architecture.md,
"Depthwise"). ``depthwise_direct`` spends about 36 instructions an output on a 3x3 filter (bound by
instruction issue); here a block of 16 pixels x 8 channels is 5 ldmatrix + 5 MMAs. The automatic choice
does not take the kernel (:data:`AUTOMATIC`): measured on an H100 it beats ``depthwise_direct`` by 3-21% on
14x14-28x28 planes and loses on the larger and smaller ones, its per-item work (the ring's copies, the B
fragments, a barrier) a third of its instructions (docs/tuning.md#T-dw-diag).

The grid is persistent like the direct kernel's: each CTA takes a run of output tiles, the input tiles
(and chunk weights) of the next three copied in while it computes one. A plan holds the tile shape
(:func:`.diag_variants.diag_config`, fitted to the GPU's SM count) and after its first run the packed
launch (:class:`cuconv.launch.PackedLaunch`).
"""

from __future__ import annotations

from ...plan import SIXTEEN_BIT
from ...registry import register
from .diag_variants import DIAG_SOURCE, NOMINAL_SMS, STAGES, DwDiagConfig, diag_config, diag_declined, diag_variant
from .kernel import DirectKernel, DirectPlan
from .mma import MIN_FILTER_WIDTH as BANDED_MIN_WIDTH
from .params import dw_geometry
from .variants import problem_axes

__all__ = ["DepthwiseDiagKernel", "DepthwiseDiagPlan", "AUTOMATIC"]

#: Whether the automatic choice takes the kernel for the layers it accepts (:meth:`DepthwiseDiagKernel.passes_over`).
AUTOMATIC = False


class DepthwiseDiagKernel(DirectKernel):
    """Depthwise convolution on tensor cores: halo tiles in shared memory (swizzled 16-byte units), tap
    pairs as the MMA's reduction against diagonal B blocks, fp32 accumulators, fused epilogue."""

    name = "depthwise_diag"
    #: Above ``depthwise_mma`` (111) and ``depthwise_direct`` (110): :meth:`passes_over` leaves the wide
    #: filters to the first and float32, conv3d, multipliers and odd C go to the second.
    priority = 112
    precisions = SIXTEEN_BIT

    def declined(self, problem):
        return diag_declined(problem)

    def config(self, problem):
        return diag_config(problem)

    def config_for(self, problem, device):
        return diag_config(problem, sm_count=device.sm_count or NOMINAL_SMS)

    def passes_over(self, plan):
        """The automatic choice leaves filters ``depthwise_mma`` takes (at least
        :data:`cuconv.backends.depthwise.mma.MIN_FILTER_WIDTH` wide, W stride 1) to it, and the others to
        ``depthwise_direct`` while :data:`AUTOMATIC` is off: the kernel runs when forced
        (``kernel="depthwise_diag"``); on the layers measured it is slower than ``depthwise_direct`` on
        56x56-112x112 and 7x7 planes and at most 21% faster on the others (docs/tuning.md#T-dw-diag)."""
        _, _, S, (_, sw), _, _ = problem_axes(plan.problem)
        if S >= BANDED_MIN_WIDTH and sw == 1:
            return (f"filter width {S} >= {BANDED_MIN_WIDTH} at W stride 1: depthwise_mma's banded matrices do "
                    f"more of a wide filter row per MMA")
        if not AUTOMATIC:
            return ("the automatic choice keeps depthwise_direct: measured slower than it on 56x56-112x112 and 7x7 "
                    "planes, at most 21% faster on the others (docs/tuning.md#T-dw-diag); kernel='depthwise_diag' "
                    "forces it")
        return None

    def plan_for(self, problem, device, cfg):
        R, S = problem.filter_spatial
        return DepthwiseDiagPlan(self, problem, device, cfg,
                                 f"depthwise (groups == C = {problem.channels}), filter {R}x{S}: pairs of taps as "
                                 f"the reduction of mma.sync m16n8k16 against diagonal 8 x 8 weight blocks "
                                 f"(fp32 accumulators)")


class DepthwiseDiagPlan(DirectPlan):
    """The tile shape of one problem of ``depthwise_diag``, and its packed launch once it has run."""

    source = DIAG_SOURCE
    #: The stages' weights are 16-byte copies of the filter.
    w_vectors = True

    def __init__(self, kernel, problem, device, cfg: DwDiagConfig, reason: str):
        super().__init__(kernel, problem, device, cfg, diag_variant(problem, cfg), reason)

    def describe(self) -> str:
        c, p = self.cfg, self.problem
        R, S = p.filter_spatial
        pairs = -(-R * S // 2)
        return (f"{self.name}: CTA tile {c.tp}x{c.tq} output pixels x {c.cb} channels (8 warps: "
                f"{c.cb // 8} channel group(s) of 8, {c.m_blocks} blocks of 2x8 pixels), input tile "
                f"{c.in_rows}x{c.in_cols}x{c.cb} with halo and the chunk's weights copied into a ring of "
                f"{STAGES} stages in shared memory (16-byte units swizzled for ldmatrix, {c.smem} bytes); per "
                f"block and channel group {pairs} MMA(s) of 16 pixels x 8 channels x 2 taps; the epilogue from the accumulators, transposed within quads "
                f"of lanes for 16-byte stores; "
                f"{c.tiles(p)} tiles ({c.chunks} chunks x {c.tiles_p}x{c.tiles_q} per plane) over a "
                f"persistent grid of at most as many CTAs as the GPU holds at once")

    def geometry(self):
        return dw_geometry(self.problem, self.cfg)


register(DepthwiseDiagKernel())
