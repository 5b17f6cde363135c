"""``pointwise_mma``: dense 1x1 convolutions (stride 1, no padding) with few input or few output
channels, NHWC / NDHWC, fp16 / bf16, on every sm_80+ NVIDIA GPU.

Such a layer (a mobile network's expansion C = 16-40 -> K = 96-240, its projection back, a detection
head's 1x1, a map to 1-7 channels) is a GEMM ``out[M][K] = x[M][C] w[K][C]^T`` over the output pixels
that moves far more bytes than it multiplies. The implicit GEMM kernels read it in 64-channel reduction blocks, mostly
zero for C = 24, and store it from accumulator fragments. This kernel
(kernels_cu/pointwise/pointwise_fprop.cu) reads each tile's x rows as one contiguous run into shared
memory (the next tile's copy in flight while the tensor cores multiply the current one), keeps the
filter in shared memory, and writes every output pixel's channels as whole 16-byte vectors from a
staged tile (docs/architecture.md, "Pointwise layers").
"""

from __future__ import annotations

from ...plan import SIXTEEN_BIT, Declined
from ...registry import register
from ..depthwise.kernel import DirectKernel, DirectPlan
from .variants import PW_SOURCE, PwConfig, pw_config, pw_declined, pw_geometry, pw_variant

__all__ = ["PointwiseKernel", "PointwisePlan", "SHORT_C", "NARROW_K", "SHORT_C_NARROW_K"]

#: Input channels up to which the automatic choice takes a pointwise layer (:meth:`PointwiseKernel.passes_over`).
SHORT_C = 48
#: Output channels up to which the automatic choice takes a pointwise layer.
NARROW_K = 32
#: Input channels up to which an output of fewer than 8 channels is left to sm80_igemm.
SHORT_C_NARROW_K = 16


class PointwiseKernel(DirectKernel):
    """1x1 convolutions with a short reduction or a narrow output: contiguous x tiles in shared memory,
    mma.sync with fp32 accumulators, 16-byte stores from a staged tile."""

    name = "pointwise_mma"
    #: Above the Hopper implicit GEMM kernels (sm90_tma 100, sm90_wpack 101) for the problems
    #: :meth:`passes_over` leaves it; below the few-channel and depthwise direct kernels (110-113).
    priority = 104
    spatial_dims = (2, 3)
    #: fp16 / bf16 operands on the tensor cores, fp32 accumulators.
    precisions = SIXTEEN_BIT

    def declined(self, problem):
        return pw_declined(problem)

    def config(self, problem):
        return pw_config(problem)

    def passes_over(self, plan):
        """The automatic choice takes the conv2d layers whose reduction is short (C <= :data:`SHORT_C`: less
        than one of the implicit GEMM kernels' 64-channel reduction blocks), whose output is narrow (K <=
        :data:`NARROW_K`: less than their narrowest efficient tile) or whose output rows are off the 16-byte
        grid (K not a multiple of 8, which the Hopper kernels decline), and the layers whose input rows are (C
        not a multiple of 8, which the Hopper kernels decline too), with any fused epilogue; conv3d
        layers only where K is not a multiple of 8 or the GPU is not a Hopper one (conv3d_native runs the
        others at least as fast). It leaves conv2d outputs of fewer than 8 channels from at most
        :data:`SHORT_C_NARROW_K` channels to sm80_igemm's pointwise loader (those of at most 64 filter
        values, a detection head's 16 -> 1 map, are pointwise_narrow's, above it), and long reductions with
        wide outputs to the implicit GEMM kernels (docs/tuning.md#T-pointwise)."""
        p = plan.problem
        k, c = p.out_channels, p.channels
        if p.nd == 2 and k < 8 and c <= SHORT_C_NARROW_K:
            return (f"C = {c} -> K = {k}: a short reduction to fewer than 8 channels, which sm80_igemm's pointwise "
                    f"loader runs faster")
        if p.nd == 3 and k % 8 == 0 and plan.device.is_hopper:
            return f"a conv3d layer with K = {k}, a multiple of 8: conv3d_native runs it at least as fast"
        if c <= SHORT_C or k <= NARROW_K or k % 8 or c % 8:
            return None
        return (f"C = {c} -> K = {k}: neither a short reduction (C <= {SHORT_C}) nor a narrow output (K <= "
                f"{NARROW_K}), which the implicit GEMM kernels run at least as fast")

    def plan_for(self, problem, device, cfg: PwConfig):
        if device.smem_per_block_optin and cfg.smem > device.smem_per_block_optin:
            return Declined(f"{cfg.smem} bytes of shared memory per CTA: the GPU allows "
                            f"{device.smem_per_block_optin}")
        copies = "" if cfg.xvec == 8 else f" (copies of {cfg.xvec} channels: C is off the 16-byte grid)"
        stores = "whole 16-byte vectors" if cfg.ovec == 8 else "one channel per access (K is off the 16-byte grid)"
        return PointwisePlan(self, problem, device, cfg,
                             f"a pointwise layer (1x1, stride 1) with C = {problem.channels} -> K = "
                             f"{problem.out_channels}: the GEMM over pixels, x read as contiguous tiles{copies}, "
                             f"the output written as {stores}")


class PointwisePlan(DirectPlan):
    """The tile shape of one pointwise problem, and its packed launch once it has run."""

    source = PW_SOURCE

    def __init__(self, kernel, problem, device, cfg: PwConfig, reason: str):
        super().__init__(kernel, problem, device, cfg, pw_variant(problem, cfg), reason)

    def filter_alignment(self) -> int:
        """The filter is read in words of ``xvec`` channels, as x is."""
        return 2 * self.cfg.xvec

    def describe(self) -> str:
        c, p = self.cfg, self.problem
        chunks = f" in {c.chunks} chunks of {c.nt} channels" if c.chunks > 1 else ""
        return (f"{self.name}: tiles of {c.bm} pixels x {c.nt} output channels{chunks} (8 warps, {8 // c.wn} x "
                f"{c.wn}, each 16 pixels x {c.nw} channels on mma.sync m16n8k16), reduction {p.channels} "
                f"channels in {c.kc // 16} k16 steps, x tiles double-buffered in shared memory (copies of "
                f"{c.xvec} channels; {c.smem} bytes "
                f"with the filter and the staging), {c.tiles(p)} tiles over a persistent grid of at most as many "
                f"CTAs as the GPU holds at once")

    def geometry(self):
        return pw_geometry(self.problem, self.cfg)


register(PointwiseKernel())
