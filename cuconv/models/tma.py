"""NumPy model of one TMA im2col box load (``cp.async.bulk.tensor.*.im2col``), and the
descriptor parameters a convolution needs.

The hardware walks the pixels of an *access window* per image, row-major, with the element strides
as steps, starting from a start coordinate, and returns ``pixels`` pixels of ``channels`` channels
each. For spatial dim ``i`` of size ``L_i`` the window of base coordinates is::

    [lower_corner[i], L_i - 1 + upper_corner[i]]   stepped by element_strides[i], from lower_corner[i]

and the pixel actually read is ``base + offsets[i]``. When the innermost coordinate passes the
window's upper end it returns to the lower end and the next dim advances; past the outermost
spatial dim the image index advances (a box can span images). Pixels outside the tensor (in the
padding, or past the last image) and channels past ``C`` read as zero.

The conv descriptor (:func:`conv_box_params`) makes the window the set of output pixels: lower
corner ``-pad_lo``, upper corner ``(out - 1) * stride - pad_lo - (L - 1)``, element strides = the
conv stride, and one box load per filter tap with offsets ``tap * dilation``. Row ``m`` of the GEMM
then starts at base ``out_coord * stride - pad_lo`` of image ``n``.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Sequence, Tuple

import numpy as np

from ..problem import ConvProblem
from .im2col import pixel_coordinates

__all__ = ["tma_im2col_box_load", "conv_box_params", "ConvBoxParams", "tma_tile"]


def tma_im2col_box_load(x: np.ndarray, *, lower_corner: Sequence[int], upper_corner: Sequence[int],
                        coord: Sequence[int], offsets: Sequence[int], pixels: int, channels: int,
                        element_strides: Sequence[int] = None) -> np.ndarray:
    """The ``(pixels, channels)`` block one im2col box load returns from channels-last ``x``.

    ``coord`` is ``(n, *spatial_base, c_start)`` with the spatial part in window (base)
    coordinates; ``offsets`` the per-dim filter offsets; ``element_strides`` the spatial strides
    (default 1; a full ``(1, *spatial, 1)`` TMA stride vector is accepted too).
    """
    nd = x.ndim - 2
    N, *size, C = x.shape
    if element_strides is None:
        element_strides = (1,) * nd
    element_strides = tuple(element_strides)
    if len(element_strides) == nd + 2:
        element_strides = element_strides[1:-1]
    lo = [int(v) for v in lower_corner]
    hi = [L - 1 + int(u) for L, u in zip(size, upper_corner)]
    n, *base, c0 = (int(v) for v in coord)
    out = np.zeros((pixels, channels), dtype=x.dtype)
    c_hi = min(C, c0 + channels)
    for p in range(pixels):
        pos = [b + o for b, o in zip(base, offsets)]
        if 0 <= n < N and all(0 <= v < L for v, L in zip(pos, size)) and c_hi > c0:
            out[p, :c_hi - c0] = x[(n, *pos)][c0:c_hi]
        # advance the traversal, innermost spatial dim first
        for i in reversed(range(nd)):
            base[i] += element_strides[i]
            if base[i] <= hi[i]:
                break
            base[i] = lo[i]
        else:
            n += 1
    return out


@dataclass(frozen=True)
class ConvBoxParams:
    """TMA im2col descriptor parameters for a convolution (spatial dims outermost first)."""

    lower_corner: Tuple[int, ...]
    upper_corner: Tuple[int, ...]
    element_strides: Tuple[int, ...]
    tap_offsets: Tuple[Tuple[int, ...], ...]   # one per filter tap, taps in (t, r, s) row-major order

    def start_coord(self, problem: ConvProblem, m: int, c_start: int = 0) -> Tuple[int, ...]:
        """Start coordinate ``(n, *base, c_start)`` of GEMM row ``m``."""
        n, out = pixel_coordinates(problem, np.asarray([m]))
        base = [int(o[0]) * s - lo for o, s, lo in zip(out, problem.stride, problem.pad_lo)]
        return (int(n[0]), *base, c_start)


def conv_box_params(problem: ConvProblem) -> ConvBoxParams:
    """Descriptor parameters that make box loads produce rows of the im2col matrix."""
    lower = tuple(-lo for lo in problem.pad_lo)
    upper = tuple((o - 1) * s - lo - (L - 1)
                  for o, s, lo, L in zip(problem.out_spatial, problem.stride, problem.pad_lo, problem.in_spatial))
    taps = tuple(tuple(t * d for t, d in zip(tap, problem.dilation))
                 for tap in itertools.product(*[range(f) for f in problem.filter_spatial]))
    return ConvBoxParams(lower_corner=lower, upper_corner=upper, element_strides=tuple(problem.stride),
                         tap_offsets=taps)


def tma_tile(x: np.ndarray, problem: ConvProblem, m_offset: int, k_offset: int, tile_m: int,
             tile_k: int) -> np.ndarray:
    """The ``(tile_m, tile_k)`` A tile that one box load produces for a K-block within one tap.

    ``k_offset`` must lie in one tap with ``k_offset % Cg`` the channel start (groups == 1 for TMA);
    channels past C read zero, as do rows past M (the box runs past the last image).
    """
    if problem.groups != 1:
        raise ValueError("groups: the TMA loader model covers groups == 1 only")
    C = problem.channels
    tap, c_start = divmod(k_offset, C)
    params = conv_box_params(problem)
    if m_offset >= problem.gemm_m:
        return np.zeros((tile_m, tile_k), dtype=x.dtype)
    return tma_im2col_box_load(x, lower_corner=params.lower_corner, upper_corner=params.upper_corner,
                               coord=params.start_coord(problem, m_offset, c_start),
                               offsets=params.tap_offsets[tap], pixels=tile_m, channels=tile_k,
                               element_strides=params.element_strides)
