"""``smallc_mma``: dense convolution with few input channels and a long window (a 7x7 RGB stem),
conv2d and conv3d, NHWC / NDHWC, fp16 / bf16, on tensor cores of every sm_80+ NVIDIA GPU.

A 7x7 stem's 147 terms per output are too many for the fp32 direct kernel (``smallc_direct`` takes up
to 64) and its 3-channel pixels too narrow for the implicit GEMM loaders (16-byte rows). The kernel
(kernels_cu/smallc/smallc_mma.cu) copies each input tile with its halo into shared memory once and
reads every A fragment of mma.sync straight from it through a table of per-term offsets: the im2col
is never written (docs/architecture.md, "Few input channels").

A plan holds the tile shape (:func:`.mma_variants.mma_config`), and after its first run the loaded
function and the launch's packed arguments (:class:`cuconv.launch.PackedLaunch`).
"""

from __future__ import annotations

from ...registry import register
from ..depthwise.kernel import DirectKernel, DirectPlan
from ..depthwise.variants import problem_axes
from .mma_variants import MMA_SOURCE, MmaConfig, mma_config, mma_declined, mma_variant
from .params import mma_geometry

__all__ = ["SmallcMmaKernel", "SmallcMmaPlan"]


class SmallcMmaKernel(DirectKernel):
    """Few input channels on tensor cores: halo tiles in shared memory, A fragments read through an
    offset table, mma.sync with fp32 accumulators."""

    name = "smallc_mma"
    #: Below ``smallc_direct`` (112), which keeps the short windows (up to 64 terms) it runs faster;
    #: above the implicit GEMM kernels, which pad C (sm80_igemm) or decline it (sm90_tma).
    priority = 109

    def declined(self, problem):
        return mma_declined(problem)

    def config(self, problem):
        return mma_config(problem)

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

    def describe(self) -> str:
        c, p = self.cfg, self.problem
        T = problem_axes(p)[0]
        depth = f", {T} filter slices in turn" if p.nd == 3 else ""
        return (f"{self.name}: CTA tile {c.tp}x{c.tq} output pixels x {c.bn} channels ({c.threads} threads, "
                f"mma.sync m16n8k16 over {c.kp // 16} k16 steps), input tile {c.in_rows}x{c.in_cols}x{p.channels} "
                f"with halo in shared memory ({c.smem} bytes with the filter, copies of {c.vin} channels){depth}, "
                f"grid {c.chunks} chunks x {c.tiles_p}x{c.tiles_q} tiles per plane")

    def geometry(self):
        return mma_geometry(self.problem, self.cfg)

    def launch_grid(self, fn) -> int:
        return self.cfg.tiles(self.problem)  # one CTA per tile


register(SmallcMmaKernel())
