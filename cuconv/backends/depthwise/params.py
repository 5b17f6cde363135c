"""The depthwise kernel's run-time parameter struct (``DwGeometry`` of kernels_cu/depthwise/depthwise_fprop.cu)."""

from __future__ import annotations

import numpy as np

from ...launch import c_struct, divisor_fields, divisor_values, geometry3d
from ...problem import ConvProblem
from .variants import DwConfig

__all__ = ["dw_geometry", "DW_FIELDS"]

#: ``DwGeometry``'s members in declaration order (32-bit ints, then the fast divisors of the loader's
#: unit index and of the work-item index).
DW_FIELDS = [(n, np.int32) for n in (
    "N", "D", "H", "W", "C", "K", "O", "P", "Q", "T", "stride_d", "stride_h", "dil_d", "dil_h",
    "pad_d", "pad_h", "pad_w", "mult", "cv", "tp", "tqg", "tiles_p", "tiles_q", "in_rows", "in_cols", "cin")] + \
    divisor_fields("div_upp", "div_cols", "div_tq", "div_tp", "div_o", "div_n")


def dw_geometry(p: ConvProblem, cfg: DwConfig) -> np.void:
    """The struct for ``p`` launched with ``cfg`` (a conv2d is a conv3d of depth 1)."""
    g = geometry3d(p)
    return c_struct(DW_FIELDS, dict(
        N=p.batch, D=g.D, H=g.H, W=g.W, C=p.channels, K=p.out_channels, O=g.O, P=g.P, Q=g.Q, T=g.T,
        stride_d=g.stride[0], stride_h=g.stride[1], dil_d=g.dilation[0], dil_h=g.dilation[1],
        pad_d=g.pad[0], pad_h=g.pad[1], pad_w=g.pad[2], mult=cfg.mult, cv=cfg.cv, tp=cfg.tp, tqg=cfg.tqg,
        tiles_p=cfg.tiles_p, tiles_q=cfg.tiles_q, in_rows=cfg.in_rows, in_cols=cfg.in_cols, cin=cfg.cin,
        **divisor_values(div_upp=cfg.cin // cfg.vin, div_cols=cfg.in_cols, div_tq=cfg.tiles_q, div_tp=cfg.tiles_p,
                         div_o=g.O, div_n=p.batch)))
