"""``narrowk_direct``: dense float32 conv2d with K <= 8 output channels and many input channels, NHWC,
on every sm_80+ NVIDIA GPU.

An implicit GEMM runs such a layer (a VAE's or UNet's last convolution, C = 128-320 -> K = 3-4) on its
narrowest tile, 16 or 64 columns for 3 or 4 real ones, and streams every activation byte through
shared memory once per product. The kernel (kernels_cu/narrowk/narrowk_fprop.cu) spreads the reduction
over the lanes instead: a group of lanes owns a few output pixels x all K channels, each lane a share
of the input channels, loaded from global memory in 16-byte vectors and multiplied with fp32
multiply-adds; the group's partial sums are reduce-scattered with shuffles (docs/architecture.md,
"Few output channels"). It runs float32 at full fp32 accuracy at either precision; the source also
builds for 16-bit data, where sm80_igemm's tensor-core tiles are faster (docs/tuning.md#T-narrowk).
"""

from __future__ import annotations

from ...plan import FLOAT32_FFMA, tf32_note
from ...registry import register
from ..depthwise.kernel import DirectKernel, DirectPlan
from .variants import NK_SOURCE, NkConfig, nk_config, nk_declined, nk_geometry, nk_variant

__all__ = ["NarrowkKernel", "NarrowkPlan"]


class NarrowkKernel(DirectKernel):
    """Direct conv2d for few output channels: the reduction over lanes, fp32 multiply-adds."""

    name = "narrowk_direct"
    spatial_dims = (2,)
    #: Above the float32 implicit GEMM kernels (sm90_tf32, sm90_bf16x3, sm80_tf32), whose narrowest
    #: tiles multiply mostly zero columns at K <= 8; below smallc_direct (few input channels).
    priority = 111
    #: float32 only, at full fp32 accuracy at either precision: 16-bit narrow outputs run faster on
    #: sm80_igemm's tensor-core tiles (docs/tuning.md#T-narrowk).
    precisions = FLOAT32_FFMA

    def declined(self, problem):
        return nk_declined(problem)

    def config(self, problem):
        return nk_config(problem)

    def plan_for(self, problem, device, cfg):
        return NarrowkPlan(self, problem, device, cfg,
                           f"few output channels (K = {problem.out_channels} <= 8) from C = {problem.channels}: a "
                           f"direct kernel, the reduction spread over lanes, fp32 multiply-adds{tf32_note(problem)}")


class NarrowkPlan(DirectPlan):
    """The launch shape of one narrow-output problem, and its packed launch once it has run."""

    source = NK_SOURCE
    w_vectors = True  # the filter is read in 16-byte channel vectors too

    def __init__(self, kernel, problem, device, cfg: NkConfig, reason: str):
        super().__init__(kernel, problem, device, cfg, nk_variant(problem, cfg), reason)

    def describe(self) -> str:
        c = self.cfg
        groups = 32 // c.ul
        return (f"{self.name}: groups of {c.ul} lanes, each {c.px} output pixels along W x {c.kv} channels "
                f"({c.units} channel vectors of {c.vin} per pixel over the lanes, reduce-scattered by "
                f"shuffles); CTA of 8 warps, one output row each, {groups} groups per warp; grid "
                f"{c.ctas} CTAs ({c.row_blocks} x {c.col_blocks} per image)")

    def geometry(self):
        return nk_geometry(self.problem, self.cfg)

    def launch_grid(self, fn) -> int:
        return self.cfg.ctas


register(NarrowkKernel())
