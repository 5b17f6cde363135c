"""NumPy address models of the im2col loaders: the oracle the device loaders are tested against.

* :mod:`.im2col` -- the explicit im2col matrix ``A[M, Kgemm]``;
* :mod:`.tma`    -- one TMA im2col box load, and the descriptor parameters of a convolution;
* :mod:`.loader` -- the software loader's three sub-paths (pointwise / uniform / per-lane);
* :mod:`.halo`   -- the Hopper kernel's halo tiles (one window per channel block, shifted per tap; channels-first
  windows, one per filter column).

Models of single kernels are imported from their modules: :mod:`.depthwise`, :mod:`.fold`,
:mod:`.wpack`, :mod:`.smallc_mma` (the tensor-core few-channel kernel's A addressing).
"""

from .halo import cf_tap_block, cf_window, halo_tap_rows, halo_window, staged_row, xpose_window
from .im2col import im2col_matrix, pixel_coordinates
from .loader import SUBPATHS, loader_addresses, loader_tile, subpath_ok
from .tma import ConvBoxParams, conv_box_params, tma_im2col_box_load, tma_tile

__all__ = ["im2col_matrix", "pixel_coordinates", "SUBPATHS", "loader_addresses", "loader_tile", "subpath_ok",
           "ConvBoxParams", "conv_box_params", "tma_im2col_box_load", "tma_tile", "halo_window", "halo_tap_rows", "staged_row", "xpose_window",
           "cf_window", "cf_tap_block"]
