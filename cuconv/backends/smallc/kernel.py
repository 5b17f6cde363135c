"""``smallc_direct``: dense convolution with few input channels (stems: C = 1-8, at most 64
multiply-adds per output, 196 for float32 at precision "float32"), conv2d and conv3d, fp16 / bf16 /
fp32, on every sm_80+ NVIDIA GPU. NHWC / NDHWC, and NCHW / NCDHW read and written by the kernel itself
(its ``_cf`` variants: no operand is moved).

A stem's reduction (C x R x S: 27 for an RGB 3x3) is too short to feed a tensor-core tile, which pads
it to 32 or 64 and spends its time moving the output. The kernel (kernels_cu/smallc/smallc_fprop.cu)
copies each input tile with its halo, all C channels, into shared memory once and computes every
output from there with fp32 multiply-adds, PX outputs x KV channels per thread (docs/architecture.md,
"Few input channels").

A plan holds the tile shape (:func:`.variants.sc_config`), and after its first run the loaded function
and the launch's packed arguments (:class:`cuconv.launch.PackedLaunch`).
"""

from __future__ import annotations

import numpy as np

from ...plan import tf32_note
from ...registry import register
from ..depthwise.kernel import DirectKernel, DirectPlan
from ..depthwise.variants import problem_axes
from .params import sc_geometry
from .variants import SC_SOURCE, ScConfig, max_taps, sc_config, sc_variant, smallc_declined

__all__ = ["SmallcKernel", "SmallcPlan"]


class SmallcKernel(DirectKernel):
    """Direct convolution for few input channels: halo tiles in shared memory, fp32 multiply-adds."""

    name = "smallc_direct"
    #: Above the implicit GEMM kernels (sm90_tma declines C % 8 != 0; sm90_tf32 folds a stem's filter
    #: columns into its channels, and sm80_igemm pads C) for the problems it takes.
    priority = 112

    def declined(self, problem):
        return smallc_declined(problem)

    def config(self, problem):
        return sc_config(problem)

    def plan_for(self, problem, device, cfg):
        taps = problem.channels * int(np.prod(problem.filter_spatial))
        return SmallcPlan(self, problem, device, cfg,
                          f"few input channels (C = {problem.channels}, {taps} <= {max_taps(problem.dtype, problem.precision)} multiply-adds per "
                          f"output): a direct kernel, each input tile read once into shared memory, fp32 "
                          f"multiply-adds{tf32_note(problem)}")


class SmallcPlan(DirectPlan):
    """The tile shape of one few-channel problem, and its packed launch once it has run."""

    source = SC_SOURCE

    def __init__(self, kernel, problem, device, cfg: ScConfig, reason: str):
        super().__init__(kernel, problem, device, cfg, sc_variant(problem, cfg), reason)
        #: NCHW / NCDHW problems: the kernel reads x and w and writes the result (and reads the residual)
        #: channels-first itself.
        self.writes_channels_first = self.reads_channels_first = "SC_NCHW" in self.defines

    def describe(self) -> str:
        c, p = self.cfg, self.problem
        T = problem_axes(p)[0]
        depth = f", {T} filter slices in turn" if p.nd == 3 else ""
        return (f"{self.name}: CTA tile {c.tp}x{c.tq} output pixels x {c.cb} channels ({c.threads} threads: "
                f"{c.kg} groups of {c.kv} channels x {c.tp * c.tqg} pixel groups of {c.px} along W), input tile "
                f"{c.in_rows}x{c.in_cols}x{p.channels} with halo in shared memory ({c.smem} bytes with the taps, "
                f"copies of {c.vin} channels){depth}, grid {c.chunks} chunks x {c.tiles_p}x{c.tiles_q} tiles per "
                f"plane" + (f", x and w read channels-first (the input tile gathered from the channel planes), each "
                            f"channel's {c.px} pixels stored as one vector" if self.reads_channels_first else ""))

    def geometry(self):
        return sc_geometry(self.problem, self.cfg)

    def launch_grid(self, fn) -> int:
        return self.cfg.tiles(self.problem)  # one CTA per tile


register(SmallcKernel())
