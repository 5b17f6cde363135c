"""The stacked-phase convolution of an input gradient (:mod:`cuconv.subpixel`) with its phases stored into
place by the Hopper kernel's epilogue.

The stacked convolution's output ``z`` (``(N, *L, P C)``) holds the input gradient's ``P`` output phases
side by side; the general path writes it to scratch and puts the phases into place with
kernels_cu/layout/phase_stack.cu, a second pass over dx's bytes. The ``SM90_PHASE_OUT`` variant of
``sm90_tma`` / ``conv3d_native`` (kernels_cu/sm90/epilogue.cuh, ``consumer_epilogue_phases``) stores each
32-column group of a tile straight at its phase's positions in dx, from a table of the phases' offsets in
global memory (:func:`cuconv.subpixel.scatter_offsets`): no ``z``, no unstack launch.

:func:`scatter_plan` makes that plan from the dispatcher's plan of the stacked convolution, or says why
not: another kernel, a residual (stacked per phase, so it goes through ``z``), ``alpha == 0``, CTA pairs,
channels not a multiple of 32 (a column group must lie in one phase), float32 or channels-first
variants. A tile whose consumers would spill with the scattering epilogue (256-row tiles past 64 columns:
:func:`.variants.phase_out_fits`), or an automatic one wider than :data:`PHASE_MAX_AUTO_BN`, is replaced by
the chooser's tile of at most 128 columns, its height chosen by the chooser's rules for that width (192 rows
where they pay, docs/tuning.md T-bm-mid), or 128 rows where that height has no scattering variant.

:func:`direct_filter` makes a plan of an input gradient's convolution read its filter straight from the
forward weight (``SM90_B_MN``). The convolution's filter is ``w``'s taps flipped (per phase of a stride, a
subset of them) with its two channel axes exchanged; read MN-major, ``w`` viewed as (K, taps, C) already is
that operand, one 64 x 64 box per (tap, 64 columns, 64 reduction rows), so the flip or gather launch before
the convolution goes away. :func:`flipped_view` gives the view and tap table of a phase of the phase split
(stride 1 included), :func:`stacked_view` that of the stacked phases (where a phase has no tap, the kernel
loads a block of zeros: :func:`.params.zero_block`).
"""

from __future__ import annotations

import copy
import dataclasses
import math
from typing import Optional, Tuple

from .kernel import Sm90Plan
from .params import MnFilter, PhaseScatter
from .tiles import tile_config
from .variants import b_mn_fits, phase_out_fits

__all__ = ["PHASE_MAX_AUTO_BN", "PHASE_ONE_TAP_MAX_BN", "scatter_plan", "direct_filter", "flipped_view", "stacked_view"]


def _unpacked(plan):
    """``plan``, or for a width-packed plan (:mod:`.wpack`) the Hopper plan of the same convolution unpacked:
    the input-gradient variants store and read the convolution's own columns and filter."""
    from .wpack import WPackPlan
    return plan.unpacked() if isinstance(plan, WPackPlan) else plan


def _declines(plan) -> Optional[str]:
    """Why ``plan`` has no input-gradient variant (another kernel, a float32, channels-first or MN-major
    variant, a residual, ``alpha == 0``, CTA pairs), or None."""
    if not isinstance(plan, Sm90Plan):
        return f"the convolution runs on {plan.kernel.name}, not the Hopper kernel"
    p = plan.problem
    if plan.out_f32 or plan.tf32 or plan.xsplit or plan.writes_channels_first or plan.b_mn or plan.narrow:
        return "a float32, channels-first, MN-major or narrow variant of the Hopper kernel"
    if p.epilogue.loads_residual:
        return "a residual (the variants leave the epilogue-load warp out)"
    if p.epilogue.alpha == 0:
        return "alpha = 0 (only the epilogue of zero is computed)"
    if plan.cfg.cluster != 1:
        return "CTA pairs"
    return None


#: The widest automatic tile of the phase-scattering epilogue (docs/tuning.md T-phase-scatter): on the grad
#: suite's transposed convolutions of 3x3 and 4x4 filters the chooser's 128 x 256 tiles are slower than
#: 128-column ones of the chooser's height, up to 1.4x (the wave quantisation of the wider tile, and on a
#: 3x3 filter of stride 2 tiles spanning two phases, whose window taps are the union of both phases').
#: The aligned form takes its own width (:func:`cuconv.grad._aligned_width`).
PHASE_MAX_AUTO_BN = 128
#: The same for a stacked convolution of a one-tap window (a 2x2 filter of stride 2: one GEMM), where the
#: chooser's 128 x 256 measured 3-5% faster than 128 columns.
PHASE_ONE_TAP_MAX_BN = 256


def scatter_plan(plan, channels: int, extent, stride, offsets,
                 max_block_n: int = PHASE_MAX_AUTO_BN) -> Tuple[Optional[Sm90Plan], str]:
    """``(plan, why)``: the plan of a convolution ``plan`` (the dispatcher's) whose output columns are
    ``len(offsets)`` phases of ``channels`` each, with its epilogue storing phase ``ph``'s row ``u`` at
    ``stride * u + offsets[ph]`` (per axis) of the input gradient of spatial ``extent``, where that is
    inside it; or ``(None, why not)``. The stacked-phase convolution (:func:`cuconv.subpixel.scatter_offsets`)
    and one phase of the phase split (its origin) both take this form. An automatic tile wider than
    ``max_block_n``, or one without a scattering variant, is replaced by the chooser's tile of at most
    ``max_block_n`` columns (at most 128 for the latter), its height the chooser's for that width, else 128
    rows."""
    plan = _unpacked(plan)
    why = _declines(plan)
    if why:
        return None, why
    p, cfg = plan.problem, plan.cfg
    if channels % 32:
        return None, f"C={channels} is not a multiple of 32 (a 32-column group must lie in one phase)"
    if p.gemm_m >= 2 ** 31:
        return None, "more than 2^31 rows"
    out = copy.copy(plan)
    note = ""
    too_wide = plan._overrides.block_n is None and not cfg.pingpong and cfg.block_n > max_block_n
    if not phase_out_fits(cfg) or too_wide:
        width = min(cfg.block_n, max_block_n if too_wide else 128)
        ov = dataclasses.replace(plan._overrides, block_n=width)
        out.cfg = tile_config(p, plan.device.sm_count, ov)
        if not phase_out_fits(out.cfg):
            out.cfg = tile_config(p, plan.device.sm_count, dataclasses.replace(ov, block_m=128))
        if not phase_out_fits(out.cfg):
            return None, f"no {out.cfg.block_m}x{out.cfg.block_n} tile of the phase-scattering epilogue"
        why_not = ("consumers spill with this epilogue" if not phase_out_fits(cfg) else
                   f"at most {max_block_n} columns with this epilogue, docs/tuning.md T-phase-scatter")
        note = f" ({out.cfg.block_m}x{out.cfg.block_n} tiles: the {cfg.block_m}x{cfg.block_n} tile's {why_not})"
    pad = 3 - len(stride)
    out.phase_scatter = PhaseScatter(channels, (1,) * pad + tuple(extent), (1,) * pad + tuple(stride),
                                     tuple((0,) * pad + tuple(d) for d in offsets))
    out.reset_launches()
    what = f"the {len(offsets)} phases" if len(offsets) > 1 else "the phase"
    return out, f"{what} stored into place in dx by the epilogue{note}"


def direct_filter(plan, mn: MnFilter) -> Tuple[Optional[Sm90Plan], str]:
    """``(plan, why)``: a copy of ``plan`` (the Hopper plan of an input gradient's convolution, possibly
    storing phases) whose filter operand is read MN-major from the forward weight as ``mn`` says
    (:func:`flipped_view`, :func:`stacked_view`); or ``(None, why not)``."""
    plan = _unpacked(plan)
    why = _declines(plan)
    if why:
        return None, why
    p, cfg = plan.problem, plan.cfg
    window = math.prod(p.filter_spatial)
    view_phases = len(mn.table) // window
    if len(mn.table) != view_phases * window or mn.rows != p.channels or view_phases * mn.cols != p.out_channels:
        raise ValueError(f"mn: a ({mn.rows}, {mn.taps}, {mn.cols}) view with {len(mn.table)} table entries does "
                         f"not fit a {window}-tap convolution of {p.channels} -> {p.out_channels} channels")
    if p.nd != 2:
        return None, "a 2-D convolution only (the 3-D kernel has no MN-major variant)"
    if view_phases > 1 and mn.cols % 64:
        return None, f"C={mn.cols} is not a multiple of 64 (a 64-column box of the filter must lie in one phase)"
    out = copy.copy(plan)
    scatters = plan.phase_scatter is not None
    if not b_mn_fits(cfg):
        ov = dataclasses.replace(plan._overrides, block_n=128 if cfg.block_n >= 128 else 64)
        out.cfg = tile_config(p, plan.device.sm_count, ov)
        if not b_mn_fits(out.cfg) or (scatters and not phase_out_fits(out.cfg)):
            return None, (f"no {out.cfg.block_m}x{out.cfg.block_n}{' halo' if out.cfg.halo else ''} tile reading the "
                          f"filter MN-major{' with the phase-scattering epilogue' if scatters else ''}")
    out.mn_filter = mn
    out.reset_launches()
    skips = ("; a tile's window taps where none of its phases has a filter tap are skipped"
             if view_phases > 1 and not out.cfg.halo and any(t < 0 for t in mn.table) else "")
    return out, "the filter read straight from w (MN-major), no transpose launch" + skips


def flipped_view(w_shape, flips) -> MnFilter:
    """The MN-major view of a forward weight of shape ``w_shape`` (``(K, *F, C)``, groups 1) for the
    convolution whose filter is :func:`cuconv.layout.flip_filter` of it with ``flips`` (per axis
    ``(start, step, count)``: window tap ``t`` reads filter tap ``start - t * step``): one phase."""
    K, F, C = w_shape[0], tuple(w_shape[1:-1]), w_shape[-1]
    table = [0]
    for f, (start, step, count) in zip(F, flips):
        table = [t * f + start - i * step for t in table for i in range(count)]
    return MnFilter(K, math.prod(F), C, tuple(table))


def stacked_view(sp, w_shape) -> MnFilter:
    """The MN-major view of a forward weight of shape ``w_shape`` (``(K, *F, C)``) for the stacked-phase
    convolution of ``sp`` (:mod:`cuconv.subpixel`): per phase and window tap the filter tap, -1 where the
    phase has none. Where the window is one tap and phase ``ph`` reads tap ``ph`` (a filter the size of the
    stride, no padding), ``w`` read as ``(K, 1, P C)`` with one phase of ``P C`` columns, whatever C is."""
    from ...subpixel import filter_is_w, phase_taps
    K, F, C = w_shape[0], tuple(w_shape[1:-1]), w_shape[-1]
    if filter_is_w(sp, F):
        return MnFilter(K, 1, sp.phases * C, (0,))
    return MnFilter(K, math.prod(F), C, tuple(int(t) for t in phase_taps(sp, F).reshape(-1)))
