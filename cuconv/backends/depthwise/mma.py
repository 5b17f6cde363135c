"""``depthwise_mma``: depthwise convolution (multiplier 1) on the tensor cores of every sm_80+ NVIDIA GPU,
conv2d, NHWC, fp16 / bf16, W stride 1, filters whose 8-output window fits 16 input columns
((S - 1) x dilation_w <= 8: up to 9 wide).

Along W one filter row of one channel is a banded matrix, so 8 outputs of 16 output rows are one
m16n8k16 MMA per filter row (kernels_cu/depthwise/depthwise_mma.cu; docs/architecture.md, "Depthwise").
The direct kernel (``depthwise_direct``) does the same sums with fp32 multiply-adds, which bind it on
filters 5 and more wide; both accumulate exact 16-bit products in fp32.

The grid is persistent like the direct kernel's: each CTA takes a run of output tiles, the next tile's
input copied in while it computes one. A plan holds the tile shape (:func:`.mma_variants.mma_config`)
and after its first run the packed launch (:class:`cuconv.launch.PackedLaunch`).
"""

from __future__ import annotations

from ...plan import SIXTEEN_BIT
from ...registry import register
from .kernel import DirectKernel, DirectPlan
from .mma_variants import MMA_SOURCE, DwMmaConfig, mma_config, mma_declined, mma_variant
from .params import dw_geometry
from .variants import problem_axes

__all__ = ["DepthwiseMmaKernel", "DepthwiseMmaPlan", "MIN_FILTER_WIDTH", "min_rows"]

#: Filter widths below this are left to ``depthwise_direct`` by the automatic choice
#: (:meth:`DepthwiseMmaKernel.passes_over`; docs/tuning.md#T-dw-mma).
MIN_FILTER_WIDTH = 5
#: Output rows a plane needs for the automatic choice, by filter width: 7 and wider from 14 rows, 5-6
#: from 28. Smaller planes leave most of the 16-row MMA blocks empty (7 of 16 rows at 7x7) or give too
#: few tiles to hide the transpose and staging passes, and the direct kernel is faster there.
WIDE_MIN_ROWS = 14
NARROW_MIN_ROWS = 28
WIDE_FILTER = 7


def min_rows(S: int) -> int:
    """Output rows per plane from which the automatic choice takes the kernel for a filter S wide."""
    return WIDE_MIN_ROWS if S >= WIDE_FILTER else NARROW_MIN_ROWS


class DepthwiseMmaKernel(DirectKernel):
    """Depthwise convolution on tensor cores: halo tiles transposed into per-channel planes in shared
    memory, banded filter matrices as B fragments, mma.sync with fp32 accumulators, fused epilogue."""

    name = "depthwise_mma"
    #: Above ``depthwise_direct`` (110), which keeps float32, conv3d, multipliers, W strides and the
    #: problems :meth:`passes_over` leaves.
    priority = 111
    precisions = SIXTEEN_BIT

    def declined(self, problem):
        return mma_declined(problem)

    def config(self, problem):
        return mma_config(problem)

    def passes_over(self, plan):
        """The automatic choice leaves to ``depthwise_direct`` filters narrower than
        :data:`MIN_FILTER_WIDTH` (their few multiply-adds per output keep the direct kernel at the memory
        limit, where this kernel's transpose and staging passes cost more than they save) and planes of
        fewer output rows than :func:`min_rows` asks."""
        _, _, S, _, _, (P, _) = problem_axes(plan.problem)
        if S < MIN_FILTER_WIDTH:
            return (f"filter width {S} < {MIN_FILTER_WIDTH}: depthwise_direct's fp32 multiply-adds keep up with "
                    f"memory there")
        if P < min_rows(S):
            return (f"{P} output rows < {min_rows(S)} for a filter {S} wide: the 16-row MMA blocks run mostly "
                    f"empty or too few tiles hide the transpose, and depthwise_direct is faster")
        return None

    def plan_for(self, problem, device, cfg):
        return DepthwiseMmaPlan(self, problem, device, cfg,
                                f"depthwise (groups == C = {problem.channels}), filter {problem.filter_spatial[-2]}x"
                                f"{problem.filter_spatial[-1]}: each filter row as a banded 16 x 8 matrix on the "
                                f"tensor cores (mma.sync m16n8k16, fp32 accumulators)")


class DepthwiseMmaPlan(DirectPlan):
    """The tile shape of one problem of ``depthwise_mma``, and its packed launch once it has run."""

    source = MMA_SOURCE

    def __init__(self, kernel, problem, device, cfg: DwMmaConfig, reason: str):
        super().__init__(kernel, problem, device, cfg, mma_variant(problem, cfg), reason)

    def describe(self) -> str:
        c, p = self.cfg, self.problem
        return (f"{self.name}: CTA tile {c.tp}x{c.tq} output pixels x {c.cb} channels (8 warps, 2 channels each), "
                f"input tile {c.in_rows}x{c.in_cols}x{c.cb} with halo copied into shared memory (two buffers, copies "
                f"of {c.vin} channels) and transposed into one plane per channel; per channel and filter row "
                f"{c.nb} MMA(s) of 16 rows x 8 columns; fp32 results staged in shared memory for "
                f"{c.vec}-channel stores ({c.smem} bytes); {c.tiles(p)} tiles ({c.chunks} chunks x "
                f"{c.tiles_p}x{c.tiles_q} per plane) over a persistent grid of at most as many CTAs as the GPU "
                f"holds at once")

    def geometry(self):
        return dw_geometry(self.problem, self.cfg)


register(DepthwiseMmaKernel())
