"""NumPy model of grouped convolutions on the Hopper kernel (:mod:`cuconv.backends.sm90.grouped`): the
block-diagonal filter (kernels_cu/sm90/blockdiag_prologue.cuh) and the channels each output tile reads.

A grouped convolution with ``Cg`` input channels and ``Kg`` filters per group runs as a dense one per
tile column: the tile whose output channels start at ``n0`` reduces over x's channels
``[c0, c0 + Cr)`` with ``c0 = (n0 // a_kg) * a_cg`` (:func:`tile_channels`). Two forms:

* ``Kg`` a multiple of 64 (tiles of 64 output channels lie in one group): ``a_kg = Kg``, ``a_cg = Cr = Cg``;
  the filter is the weight itself, ``(K, taps, Cg)``.
* ``Cg == Kg`` dividing 64 (ResNeXt's 4-32 channels per group): a tile of 64 output channels holds
  ``64 / Cg`` whole groups, which read exactly the 64 channels of the same block: ``a_kg = a_cg = Cr = 64``,
  and the filter is block-diagonal (:func:`blockdiag_filter`), ``(K, taps, 64)``, filter ``k``'s weights
  at offset ``(k % 64) - (k % Cg)`` of its row, zeros elsewhere. The zeros cost multiplications
  (``64 / Cg`` times the grouped work), not traffic: x is still read once per tile.

:func:`grouped_as_tiles` runs that plan on the CPU (one dense convolution per tile column) so the tests
compare it with the grouped reference.
"""

from __future__ import annotations

import numpy as np

__all__ = ["blockdiag_filter", "tile_channels", "grouped_as_tiles"]


def blockdiag_filter(w: np.ndarray, cg: int) -> np.ndarray:
    """The kernel's operation: ``w`` ``(K, *taps, Cg)`` with ``Cg`` dividing 64 -> ``(K, *taps, 64)``."""
    k = w.shape[0]
    out = np.zeros(w.shape[:-1] + (64,), dtype=w.dtype)
    for f in range(k):
        off = (f % 64) - (f % cg)
        out[f, ..., off:off + cg] = w[f]
    return out


def tile_channels(n0: int, a_kg: int, a_cg: int) -> int:
    """The first channel of x that the tile whose output channels start at ``n0`` reads."""
    return (n0 // a_kg) * a_cg


def grouped_as_tiles(x: np.ndarray, w: np.ndarray, groups: int, conv, tile_n: int = 64, **kw) -> np.ndarray:
    """The grouped convolution of channels-last ``x`` and ``w`` computed as the Hopper plan does: per
    ``tile_n`` output channels, a dense convolution (``conv``, the float64 reference) over the channels
    :func:`tile_channels` names, with the block-diagonal filter where groups are narrower than 64."""
    c, k = x.shape[-1], w.shape[0]
    cg, kg = c // groups, k // groups
    if kg % 64 == 0:
        a_kg, a_cg, filt = kg, cg, w
    elif cg == kg and 64 % cg == 0:
        a_kg, a_cg, filt = 64, 64, blockdiag_filter(w, cg)
    else:
        raise ValueError(f"groups of {cg} channels and {kg} filters: neither form applies")
    cr = filt.shape[-1]
    xp = np.concatenate([x, np.zeros(x.shape[:-1] + (cr,), x.dtype)], axis=-1)  # reads past C are zeros
    parts = []
    for n0 in range(0, k, tile_n):
        c0 = tile_channels(n0, a_kg, a_cg)
        parts.append(conv(xp[..., c0:c0 + cr], filt[n0:n0 + tile_n], **kw))
    return np.concatenate(parts, axis=-1)
