"""``Sm90ConvParams``: the Hopper kernel's parameter struct, built from a problem and its tile config.

Mirrors the struct in kernels_cu/sm90/conv_fprop_sm90.cu field by field (tests/test_sm90_model.py
checks the names and order against the source); a 2-D problem is the 3-D one of depth 1.
"""

from __future__ import annotations

import functools
from typing import NamedTuple, Optional, Tuple

import numpy as np

from ...launch import c_struct, divisor_fields, divisor_values, geometry3d
from .tiles import TileConfig, c_blocks, halo_window, last_k16, staging_row

__all__ = ["PARAM_FIELDS", "PhaseScatter", "MnFilter", "BlockDiag", "phase_table", "tap_table", "zero_block", "kernel_params"]


class PhaseScatter(NamedTuple):
    """Where the phase-scattering epilogue (SM90_PHASE_OUT) stores the stacked phases: the input gradient
    ``(N, *extent, channels)`` (3 axes, a 2-D one with depth 1 in front), per axis the ``stride``, and per
    phase the ``offsets`` of its first position along the three axes (:func:`cuconv.subpixel.scatter_offsets`;
    the kernel reads them from :func:`phase_table`)."""

    channels: int
    extent: Tuple[int, int, int]
    stride: Tuple[int, int, int]
    offsets: Tuple[Tuple[int, int, int], ...]


class MnFilter(NamedTuple):
    """How the MN-major variant (SM90_B_MN) reads its filter straight from a forward weight: the weight
    viewed as ``(rows, taps, cols)`` (C-contiguous; rows = the reduction's channels, cols = output channels),
    and ``table``, per phase of the GEMM's columns (column ``n`` lies in phase ``n // cols``) the view's tap
    that each window tap of the convolution reads (row-major, one row of window taps per phase), -1 where the
    phase has no tap there (a box of :func:`zero_block`). The kernel reads it from :func:`tap_table`."""

    rows: int
    taps: int
    cols: int
    table: Tuple[int, ...]


class BlockDiag(NamedTuple):
    """The block-diagonal filter of narrow groups that the kernel's grid writes before reading it
    (kernels_cu/sm90/blockdiag_prologue.cuh): the weight's address ``src`` (``rows`` = K x ``taps`` rows of
    ``cg`` weights), the buffer ``dst`` its filter descriptor maps (rows of 64 channels), and the grid
    barrier's 64-bit counter ``sync`` (zero when the launch record is made)."""

    src: int
    dst: int
    sync: int
    rows: int
    taps: int
    cg: int


@functools.lru_cache(maxsize=256)
def tap_table(device_index: int, mn: MnFilter):
    """``mn.table`` as the kernel reads it: int32 on the GPU."""
    import cupy as cp
    with cp.cuda.Device(device_index):
        return cp.asarray(np.array(mn.table, dtype=np.int32))


@functools.lru_cache(maxsize=16)
def zero_block(device_index: int):
    """A 64 x 64 block of 16-bit zeros on the GPU: the box the MN-major variant loads for a phase's missing
    tap."""
    import cupy as cp
    with cp.cuda.Device(device_index):
        return cp.zeros((64, 64), dtype=np.uint16)


@functools.lru_cache(maxsize=256)
def phase_table(device_index: int, offsets: Tuple[Tuple[int, int, int], ...]):
    """The phases' offsets as the kernel reads them: ``(P, 4)`` int32 rows ``(d0, d1, d2, 0)`` on the GPU."""
    import cupy as cp
    with cp.cuda.Device(device_index):
        return cp.asarray(np.array([d + (0,) for d in offsets], dtype=np.int32).reshape(len(offsets), 4))

PARAM_FIELDS = [("M", "i8")] + [(n, "i4") for n in (
    "K", "O", "P", "Q", "T", "R", "S", "stride_d", "stride_h", "stride_w", "dil_d", "dil_h", "dil_w", "pad_d",
    "pad_h", "pad_w", "c_blocks", "last_k16", "n_tiles", "num_units", "dp_tiles", "k_iters", "split_ways", "x_tiles",
    "y_tiles", "halo_w", "halo_tx", "a_wrap")] + [(n, "u4") for n, _ in divisor_fields(
        "n_tiles_div", "opq_div", "pq_div", "q_div", "x_tiles_div", "y_tiles_div", "o_div")] + [
    ("residual", "u8"), ("ph_table", "u8")] + [
    (n, "i4") for n in ("ph_channels", "ph_ext0", "ph_ext1", "ph_ext2", "ph_s0", "ph_s1", "ph_s2")] + [
    (n, "u4") for n, _ in divisor_fields("ph_channels_div")] + [
    ("b_taps", "u8"), ("b_cols", "i4"), ("a_kg", "i4"), ("a_cg", "i4"), ("bd_src", "u8"), ("bd_dst", "u8"),
    ("bd_sync", "u8"), ("bd_rows", "i4"), ("bd_taps", "i4"), ("bd_cg", "i4"), ("st_w", "i4"), ("st_shift", "i4")]

_FIELDS = [(n, np.dtype(t).type) for n, t in PARAM_FIELDS]


def kernel_params(problem, cfg: TileConfig, residual: int = 0, x_channels: int = 0,
                  phases: Optional[PhaseScatter] = None, phase_table_ptr: int = 0,
                  mn_filter: Optional[MnFilter] = None, tap_table_ptr: int = 0,
                  groups: Tuple[int, int] = (0, 0), blockdiag: Optional[BlockDiag] = None) -> np.void:
    """The ``Sm90ConvParams`` value of ``problem`` run with ``cfg`` (``residual``: the address of a
    residual the consumers read, in a channels-first or float32-output variant; 0 otherwise).
    ``x_channels``: the channels x holds, when fewer than the reduction's (a multiple of 64: the
    reduction's channel blocks past them read x's from the first again); 0 for ``problem.channels``.
    ``phases``: where the phase-scattering epilogue stores (zeros without it), its offsets at the device
    address ``phase_table_ptr``. ``mn_filter``: how the MN-major variant reads the filter (zeros without
    it), its table at the device address ``tap_table_ptr``. ``groups``: ``(a_kg, a_cg)`` of a grouped
    convolution (output channel ``n`` reads x from channel ``(n // a_kg) * a_cg`` on; :mod:`.grouped`), or
    ``(0, 0)``. ``blockdiag``: where the grid writes the block-diagonal filter of narrow groups before it
    reads it (:class:`BlockDiag`), or None."""
    g = geometry3d(problem)
    halo_w, halo_h = halo_window(problem, cfg)
    x_tiles, y_tiles = -(-g.Q // 64), -(-g.P // cfg.tile_rows)
    vals = dict(M=problem.gemm_m, K=problem.out_channels, O=g.O, P=g.P, Q=g.Q, T=g.T, R=g.R, S=g.S,
                c_blocks=c_blocks(problem.channels), last_k16=last_k16(problem.channels), n_tiles=cfg.n_tiles,
                num_units=cfg.num_units, dp_tiles=cfg.dp_tiles, k_iters=cfg.k_iters, split_ways=cfg.split_ways,
                x_tiles=x_tiles, y_tiles=y_tiles, halo_w=halo_w, halo_tx=halo_w * halo_h * 128 if cfg.halo else 0,
                residual=residual,
                a_wrap=c_blocks(x_channels or problem.channels))
    vals.update(zip(("stride_d", "stride_h", "stride_w"), g.stride))
    vals.update(zip(("dil_d", "dil_h", "dil_w"), g.dilation))
    vals.update(zip(("pad_d", "pad_h", "pad_w"), g.pad))
    vals.update(divisor_values(n_tiles_div=cfg.n_tiles, opq_div=g.O * g.P * g.Q, pq_div=g.P * g.Q, q_div=g.Q,
                               x_tiles_div=x_tiles, y_tiles_div=y_tiles, o_div=g.O))
    vals.update(_phase_values(phases, phase_table_ptr))
    vals.update(b_taps=tap_table_ptr if mn_filter else 0, b_cols=mn_filter.cols if mn_filter else 0)
    vals.update(a_kg=groups[0], a_cg=groups[1])
    bd = blockdiag or BlockDiag(0, 0, 0, 0, 0, 0)
    vals.update(bd_src=bd.src, bd_dst=bd.dst, bd_sync=bd.sync, bd_rows=bd.rows, bd_taps=bd.taps, bd_cg=bd.cg)
    st_w, st_shift = staging_row(problem) if cfg.a_xpose else (0, 0)
    vals.update(st_w=st_w, st_shift=st_shift)
    return c_struct(_FIELDS, vals)


def _phase_values(ph: Optional[PhaseScatter], table_ptr: int) -> dict:
    vals = dict(ph_channels=ph.channels if ph else 0, ph_table=table_ptr if ph else 0)
    for a in range(3):
        vals[f"ph_ext{a}"] = ph.extent[a] if ph else 0
        vals[f"ph_s{a}"] = ph.stride[a] if ph else 0
    vals.update(divisor_values(ph_channels_div=ph.channels if ph else 1))
    return vals
