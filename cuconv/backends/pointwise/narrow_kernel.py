"""``pointwise_narrow``: dense 1x1 convolutions (stride 1, no padding) to a few output channels from a
few input channels (K <= 8, C x K <= 64), NHWC / NDHWC, fp16 / bf16 / fp32, on every sm_80+ NVIDIA GPU.

Such a layer (a detection head's 16 -> 1 map, a segmentation head's 32 -> 2) reads C values and writes
K per output pixel and multiplies C x K: it is bound by memory, and a tensor-core tile pads its K to 16
columns and its C to a reduction block. The kernel (kernels_cu/pointwise/pointwise_narrow.cu) gives each
thread whole output pixels: the pixel's row of x in 16-byte loads, the filter in registers, fp32
multiply-adds and the fused epilogue (docs/architecture.md, "Pointwise layers").
"""

from __future__ import annotations

from ...plan import tf32_note
from ...registry import register
from ..depthwise.kernel import DirectKernel, DirectPlan
from .narrow_variants import PN_SOURCE, PnConfig, pn_config, pn_declined, pn_geometry, pn_variant

__all__ = ["PointwiseNarrowKernel", "PointwiseNarrowPlan"]


class PointwiseNarrowKernel(DirectKernel):
    """1x1 convolutions to at most 8 channels from few channels: a thread per output pixel, the filter in
    registers, fp32 multiply-adds."""

    name = "pointwise_narrow"
    #: Above pointwise_mma (104) and the implicit GEMM kernels: every layer it takes runs faster here
    #: (docs/tuning.md#T-pointwise-narrow); below the few-channel direct kernels (112-113), which take
    #: inputs of up to 8 channels.
    priority = 105

    def declined(self, problem):
        return pn_declined(problem)

    def config(self, problem):
        return pn_config(problem)

    def plan_for(self, problem, device, cfg: PnConfig):
        return PointwiseNarrowPlan(self, problem, device, cfg,
                                   f"a pointwise layer (1x1, stride 1) with C = {problem.channels} -> K = "
                                   f"{problem.out_channels}: bound by memory, a thread per output pixel with the "
                                   f"filter in registers{tf32_note(problem) or ', fp32 multiply-adds'}")


class PointwiseNarrowPlan(DirectPlan):
    """The launch of one narrow pointwise problem, packed once it has run."""

    source = PN_SOURCE

    def __init__(self, kernel, problem, device, cfg: PnConfig, reason: str):
        super().__init__(kernel, problem, device, cfg, pn_variant(problem, cfg), reason)

    def describe(self) -> str:
        p = self.problem
        return (f"{self.name}: {p.gemm_m} output pixels, a thread per pixel at a time over a persistent grid of "
                f"at most as many CTAs of 256 threads as the GPU holds at once; per pixel {p.channels // self.cfg.vin} "
                f"16-byte loads of x, {p.channels} x {p.out_channels} multiply-adds, {p.out_channels} stores")

    def geometry(self):
        return pn_geometry(self.problem, self.cfg)


register(PointwiseNarrowKernel())
