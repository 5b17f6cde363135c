"""The few-channel kernels' run-time parameter structs: ``ScGeometry`` of kernels_cu/smallc/smallc_fprop.cu,
``MmaGeometry`` of kernels_cu/smallc/smallc_mma.cu. Both start with the problem's extents (:data:`EXTENTS`)
and go on with the halo loader's two fast divisors (``MmaGeometry`` then with the tile index's four)."""

from __future__ import annotations

import numpy as np

from ...launch import c_struct, divisor_fields, divisor_values, geometry3d
from ...problem import ConvProblem
from .mma_variants import MmaConfig
from .variants import ScConfig

__all__ = ["sc_geometry", "SC_FIELDS", "mma_geometry", "MMA_FIELDS", "EXTENTS"]

#: The members both structs start with: extents, strides, dilations and padding in front (32-bit ints).
EXTENTS = ("N", "D", "H", "W", "K", "O", "P", "Q", "T", "stride_d", "stride_h", "dil_d", "dil_h",
           "pad_d", "pad_h", "pad_w")

#: ``ScGeometry``'s members in declaration order (32-bit ints, then the loader's two fast divisors).
SC_FIELDS = [(n, np.int32) for n in EXTENTS + ("kg", "tp", "tqg", "tiles_p", "tiles_q", "in_rows", "in_cols")] + \
    divisor_fields("div_upp", "div_cols")

#: ``MmaGeometry``'s members in declaration order (32-bit ints, the loader's two fast divisors, then the
#: tile index's four).
MMA_FIELDS = [(n, np.int32) for n in EXTENTS + ("tiles_p", "tiles_q", "tiles", "in_rows")] + \
    divisor_fields("div_upp", "div_cols", "div_tq", "div_tp", "div_o", "div_n")


def _struct(fields, p: ConvProblem, cfg, pixel: int, **tile) -> np.void:
    """``fields`` filled from ``p`` (:data:`EXTENTS`; a conv2d is a conv3d of depth 1), the tile members
    ``tile`` and the loader's divisors (by ``pixel`` / VIN copy units per stored pixel of ``pixel``
    elements, by the tile's stored columns)."""
    g = geometry3d(p)
    return c_struct(fields, dict(
        N=p.batch, D=g.D, H=g.H, W=g.W, K=p.out_channels, O=g.O, P=g.P, Q=g.Q, T=g.T,
        stride_d=g.stride[0], stride_h=g.stride[1], dil_d=g.dilation[0], dil_h=g.dilation[1],
        pad_d=g.pad[0], pad_h=g.pad[1], pad_w=g.pad[2], **tile,
        **divisor_values(div_upp=pixel // cfg.vin, div_cols=cfg.in_cols)))


def sc_geometry(p: ConvProblem, cfg: ScConfig) -> np.void:
    """The ``ScGeometry`` struct for ``p`` launched with ``cfg``."""
    return _struct(SC_FIELDS, p, cfg, p.channels, kg=cfg.kg, tp=cfg.tp, tqg=cfg.tqg, tiles_p=cfg.tiles_p,
                   tiles_q=cfg.tiles_q, in_rows=cfg.in_rows, in_cols=cfg.in_cols)


def mma_geometry(p: ConvProblem, cfg: MmaConfig) -> np.void:
    """The ``MmaGeometry`` struct for ``p`` launched with ``cfg`` on the tensor-core kernel, with the
    tile index's divisors (by the tile columns and rows per plane, by O and by N)."""
    g = geometry3d(p)
    return _struct(MMA_FIELDS, p, cfg, cfg.cst, tiles_p=cfg.tiles_p, tiles_q=cfg.tiles_q, tiles=cfg.tiles(p),
                   in_rows=cfg.in_rows,
                   **divisor_values(div_tq=cfg.tiles_q, div_tp=cfg.tiles_p, div_o=g.O, div_n=p.batch))
