"""Grouped convolutions on Hopper: ``sm90_grouped``, each tile of output channels a dense convolution over
its group's channels on the wgmma kernel.

The Hopper kernel walks the reduction in 64-channel blocks of x. For a grouped convolution the tile whose
output channels start at ``n0`` reads x from channel ``(n0 // a_kg) * a_cg`` on (``Sm90ConvParams.a_kg``,
``a_cg``; the model and proof: :mod:`cuconv.models.grouped`):

* **Wide groups** (``Kg`` a multiple of 64, ``Cg`` a multiple of 8): a tile lies in one group and reduces
  over its ``Cg`` channels; the filter is the weight as it is.
* **Narrow groups** (``Cg == Kg`` dividing 64, at least :data:`MIN_GROUP_CHANNELS`; ResNeXt's 4-32): a
  tile of 64 output channels holds ``64 / Cg`` whole groups, which read exactly the 64 channels of the same
  block. The producer warpgroups of the kernel's grid first write the block-diagonal filter
  ``(K, taps, 64)`` into a scratch buffer (kernels_cu/sm90/blockdiag_prologue.cuh; on every call, as
  weights may change between calls) and meet at a grid barrier; the block then runs as a dense 64-channel
  convolution, in the same launch. Its zeros cost ``64 / Cg`` times the grouped multiplications, which the
  tensor cores absorb.

Tiles are 64 output channels wide; every other choice (halo tiles, height, split reductions, the
epilogue, channels-first output) is the dense kernel's. Data flow of one call::

    w (K, R, S, Cg)  --the kernel's grid, then a grid barrier (narrow groups)-->  w' (K, R, S, 64) scratch
    x (N, H, W, C), w' --the same launch: tile n0 reading x's channels [c0, c0 + 64)-->  out (N, P, Q, K)
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from ...launch import header_constants
from ...plan import SIXTEEN_BIT, Declined, Kernel
from ...registry import register
from ..sm80.subpaths import choose_subpath
from .kernel import BLOCKDIAG_TILE_N, RewritingPlan, Sm90TmaConv3d, Sm90TmaKernel, not_hopper

__all__ = ["Sm90GroupedKernel", "Sm90GroupedConv3d", "GroupedPlan", "grouped_form", "filter_rounds",
           "MIN_GROUP_CHANNELS", "YIELD_GROUP_CHANNELS", "YIELD_MAX_PIXELS"]

#: Narrow groups of fewer channels than this are left to the other kernels: the block-diagonal filter's
#: zeros would be more than 16 times the grouped work (depthwise layers have kernels of their own).
MIN_GROUP_CHANNELS = 4
#: Output channels per tile: one 64-channel block of narrow groups, or a part of one wide group (the
#: kernel's tile width for the variants that write the block-diagonal filter).
TILE_N = BLOCKDIAG_TILE_N
#: Narrow groups of this many channels with fewer output pixels than YIELD_MAX_PIXELS are left to sm80_igemm
#: in 2-D (:meth:`Sm90GroupedKernel.passes_over`; docs/tuning.md T-sm90-grouped-yield).
YIELD_GROUP_CHANNELS, YIELD_MAX_PIXELS = 32, 2048
#: 16-byte filter units each thread of the grid loads before it stores them (blockdiag_prologue.cuh).
BD_BATCH = header_constants("sm90/blockdiag_prologue.cuh")["SM90_BD_BATCH"]


def grouped_form(problem):
    """``(a_kg, a_cg, reduction channels)`` of a grouped problem on the Hopper kernel, or the reason it
    has none: wide groups read their own ``Cg`` channels, narrow ones their 64-channel block."""
    cg, kg = problem.channels // problem.groups, problem.out_channels // problem.groups
    if kg % TILE_N == 0:
        if cg % 8:
            return f"{cg} channels per group: wide groups need a multiple of 8 (16-byte TMA rows)"
        return kg, cg, cg
    if cg != kg:
        return (f"{cg} channels and {kg} filters per group: narrow groups need as many filters as channels "
                f"(or a multiple of {TILE_N} filters per group)")
    if TILE_N % cg:
        return f"{cg} channels per group: narrow groups must divide {TILE_N}"
    if cg < MIN_GROUP_CHANNELS:
        return (f"{cg} channel(s) per group: the block-diagonal filter would multiply {TILE_N // cg} times the "
                f"grouped work (fewer than {MIN_GROUP_CHANNELS} channels per group are left to the direct kernels)")
    return TILE_N, TILE_N, TILE_N


class Sm90GroupedKernel(Kernel):
    """Grouped conv2d of 16-bit data on Hopper: each 64-filter tile a dense convolution over its group's
    channels (narrow groups against the block-diagonal filter) on the wgmma kernel."""

    name = "sm90_grouped"
    backend = "cuda"
    priority = 90
    spatial_dims = (2,)
    precisions = SIXTEEN_BIT
    inner_kernel = Sm90TmaKernel

    def __init__(self):
        self.inner = self.inner_kernel()

    def passes_over(self, plan):
        """Narrow groups in 2-D that the automatic choice leaves to ``sm80_igemm`` (docs/tuning.md
        T-sm90-grouped-yield): groups of :data:`YIELD_GROUP_CHANNELS` channels on fewer than
        :data:`YIELD_MAX_PIXELS` output pixels, which sm80_igemm's implicit GEMM reduces over their own
        channels (its uniform loader: one tap per 32-channel step) in less time than the Hopper kernel's
        fixed cost and the 64-channel block-diagonal filter's doubled work take (on larger outputs the
        Hopper kernel's faster multiplies win); and grids too small to write the filter in one round of
        loads (:func:`filter_rounds`), whose rounds of load latency cost more than sm80_igemm's
        grouped_mma path spends on the whole call."""
        if not plan.narrow or plan.problem.nd != 2:
            return None
        p = plan.problem
        sub = choose_subpath(p, None)[0]
        cg = p.channels // p.groups
        if cg >= YIELD_GROUP_CHANNELS:
            if sub == "uniform" and p.gemm_m < YIELD_MAX_PIXELS:
                return (f"{cg} channels per group on {p.gemm_m} output pixels: sm80_igemm reduces over them "
                        f"alone in less time than the 64-channel block-diagonal filter takes")
            return None
        rounds = filter_rounds(plan)
        if rounds > 1 and sub == "grouped_mma":
            return (f"a grid of {plan.inner.cfg.grid} CTAs writes the block-diagonal filter in {rounds} rounds of "
                    f"loads: sm80_igemm's grouped_mma path is faster on so small a problem")
        return None

    def make_plan(self, problem, device, overrides):
        if not device.is_hopper:
            return not_hopper(device)
        if problem.groups == 1:
            return Declined("a dense convolution (groups == 1): sm90_tma's")
        form = grouped_form(problem)
        if isinstance(form, str):
            return Declined(form)
        a_kg, a_cg, cr = form
        taps = math.prod(problem.filter_spatial)
        if problem.out_channels * taps * 8 >= 2**31:
            return Declined(f"{problem.out_channels} x {taps} filter rows: over the filter writer's 32-bit index")
        if problem.channels % 8 or problem.out_channels % 8:
            return Declined(f"C={problem.channels}, K={problem.out_channels}: both must be multiples of 8 "
                            f"(16-byte TMA rows)")
        block = dataclasses.replace(problem, channels=cr, groups=1)
        inner = self.inner.make_plan(block, device, dataclasses.replace(overrides, block_n=TILE_N))
        if not inner:
            return Declined(f"the per-tile dense convolution ({cr} channels): {inner.reason}")
        cg = problem.channels // problem.groups
        narrow = cr == TILE_N and cg < TILE_N
        inner.read_groups(problem.channels, a_kg, a_cg, (taps, cg) if narrow else None)
        how = (f"{TILE_N // cg} groups of {cg} per 64-channel block against the block-diagonal filter"
               if narrow else f"groups of {problem.out_channels // problem.groups} filters over {cg} channels")
        return GroupedPlan(self, problem, device, inner, narrow,
                           f"grouped convolution as dense tiles on the Hopper kernel ({how})")


def filter_rounds(plan) -> int:
    """Rounds of :data:`BD_BATCH` loads per thread in which the grid of a narrow-group plan writes its
    block-diagonal filter (eight 16-byte units per filter row of each tap)."""
    cfg = plan.inner.cfg
    units = plan.problem.out_channels * math.prod(plan.problem.filter_spatial) * (TILE_N // 8)
    return -(-units // (cfg.grid * cfg.threads * BD_BATCH))


class Sm90GroupedConv3d(Sm90GroupedKernel):
    """The same for grouped conv3d (the "native" strategy)."""

    name = "conv3d_grouped"
    priority = 85
    spatial_dims = (3,)
    strategy = "native"
    inner_kernel = Sm90TmaConv3d


class GroupedPlan(RewritingPlan):
    """The Hopper plan of one tile's dense problem, reading each tile's channels of x (and, for narrow
    groups, writing the block-diagonal filter from ``w`` first, in the same launch)."""

    def __init__(self, kernel, problem, device, inner, narrow: bool, reason: str):
        super().__init__(kernel, problem, device, inner, reason)
        self.narrow = narrow
        self.writes_channels_first = inner.writes_channels_first

    def describe(self) -> str:
        p = self.problem
        cg = p.channels // p.groups
        first = (f"{TILE_N // cg} groups of {cg} per 64-channel block as one dense 64 x 64 filter per tap (written "
                 f"by the grid before a grid barrier, then read by TMA), " if self.narrow else
                 f"{p.groups} groups of {p.out_channels // p.groups} filters over {cg} channels, ")
        return first + f"each 64-filter tile over its channels of x: {self.inner.describe()}"

    def run(self, x, w, bias, residual, out):
        self.inner.run(x, w, bias, residual, out)


register(Sm90GroupedKernel())
register(Sm90GroupedConv3d())
