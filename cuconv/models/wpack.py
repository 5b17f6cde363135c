"""NumPy model of the width pack (``sm90_wpack``): a convolution of few channels run as one over groups of
pixels, and the proof on the CPU that the packed convolution is the original one (tests/test_wpack.py).

Along the last spatial axis (W), ``g`` neighbouring input pixels of ``C`` channels are one pixel of ``g C``
channels, and ``go`` neighbouring output pixels of ``K`` channels one of ``go K``. Both are the same bytes of a
contiguous channels-last array, so x, the output and the residual are only seen differently::

    x (N, H, W, C) = x' (N, H, W / g, g C)          out (N, P, Q, K) = out' (N, P, Q / go, go K)

Output column ``q = go q' + j`` reads input column ``sw q - pl + s dw = g st' q' + rel(j, s)`` with
``rel(j, s) = sw j - pl + s dw`` and ``st' = sw go / g`` (``go`` is the least count that makes it whole);
that is column ``e = rel mod g`` of input group ``st' q' + floor(rel / g)``. With ``lo`` the least and ``hi``
the greatest ``floor(rel / g)``, the packed convolution has ``S' = hi - lo + 1`` taps along W, stride ``st'``,
dilation 1 and padding ``-lo`` in front, and its filter

    w'[j K + k, r, s', e C + c] = w[k, r, s, c]   where floor(rel(j, s) / g) = s' + lo, rel(j, s) mod g = e

is zero elsewhere (the bias repeats ``go`` times). Positions outside ``[0, W)`` fall in groups outside
``[0, W / g)``, which the packed convolution's padding reads as zeros, as the original's padding does.

What it buys: a tile of the Hopper kernel is at least 64 output channels wide and reads each tap in
64-channel blocks. ``C = 32, K = 32`` fills a quarter of every product there; packed in pairs it fills half
(the zero taps of ``w'``), in half as many tiles. :func:`work_ratio` is that count.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Union

import numpy as np

__all__ = ["WPack", "w_axis", "wpack_or_reason", "wpack_geometry", "pack_filter_index", "pack_filter", "pack_bias",
           "work_ratio", "BLOCK_CHANNELS"]

#: The packed pixel's channels: one 64-channel block of the Hopper kernel's reduction.
BLOCK_CHANNELS = 64


@dataclass(frozen=True)
class WPack:
    """One packing of the last spatial axis: ``g`` input and ``go`` output pixels per packed pixel."""

    g: int            # input pixels per packed pixel
    go: int           # output pixels per packed pixel
    taps: int         # S': the packed filter's taps along W
    stride: int       # st': the packed convolution's stride along W
    pad_lo: int       # -lo
    pad_hi: int       # what makes the packed output exactly Q / go columns
    in_w: int         # W / g
    out_w: int        # Q / go


def _filter_axis(S: int, dw: int, sw: int, pl: int, g: int, go: int):
    """``lo`` and ``hi`` of ``floor(rel(j, s) / g)`` over every output ``j < go`` and tap ``s < S``."""
    return (-pl) // g, (sw * (go - 1) - pl + (S - 1) * dw) // g


def w_axis(problem):
    """A problem's last spatial axis as :func:`wpack_or_reason` takes it: (W, Q, S, stride, dilation,
    padding in front)."""
    return (problem.in_spatial[-1], problem.out_spatial[-1], problem.filter_spatial[-1], problem.stride[-1],
            problem.dilation[-1], problem.pad_lo[-1])


def wpack_or_reason(W: int, Q: int, S: int, sw: int, dw: int, pl: int, C: int) -> Union[WPack, str]:
    """The packing of a W axis of ``W`` input / ``Q`` output columns and ``C`` channels under an ``S``-tap filter
    (stride ``sw``, dilation ``dw``, padding ``pl`` in front), or why none exists: ``C`` must divide
    :data:`BLOCK_CHANNELS` at least twice over and be a multiple of 8, ``W`` a multiple of ``g`` and ``Q`` of
    ``go``, and the packed convolution must end exactly at ``Q / go`` columns without negative padding."""
    if C % 8 or BLOCK_CHANNELS % C or C >= BLOCK_CHANNELS:
        return (f"C={C}: packing needs a multiple of 8 that divides {BLOCK_CHANNELS // 2} (two or more pixels per "
                f"{BLOCK_CHANNELS}-channel block)")
    g = BLOCK_CHANNELS // C
    go = g // math.gcd(g, sw)
    if W % g:
        return f"W={W} is not a multiple of {g}: a group of {g} pixels would run into the next row"
    if Q % go:
        return f"the output's {Q} columns are not a multiple of {go}: a packed output pixel would run into the next row"
    lo, hi = _filter_axis(S, dw, sw, pl, g, go)
    taps, stride, w_in, q_out = hi - lo + 1, sw * go // g, W // g, Q // go
    pad_hi = max(0, (q_out - 1) * stride + taps - w_in + lo)
    if (w_in - lo + pad_hi - taps) // stride + 1 != q_out:
        return f"the packed filter of {g}-pixel groups cannot end at the output's last column without negative padding"
    return WPack(g=g, go=go, taps=taps, stride=stride, pad_lo=-lo, pad_hi=pad_hi, in_w=w_in, out_w=q_out)


def wpack_geometry(W: int, Q: int, S: int, sw: int, dw: int, pl: int, C: int) -> Optional[WPack]:
    """:func:`wpack_or_reason`'s packing, or None where none exists."""
    pack = wpack_or_reason(W, Q, S, sw, dw, pl, C)
    return pack if isinstance(pack, WPack) else None


def pack_filter_index(pack: WPack, K: int, R: int, S: int, C: int, sw: int, dw: int, pl: int) -> np.ndarray:
    """int32 ``(go K, R, S', g C)``: for each element of ``w'``, the flat index into ``w (K, R, S, C)`` it copies,
    or -1 where ``w'`` is zero (kernels_cu/layout/gather_index.cu's table)."""
    g, go = pack.g, pack.go
    index = np.full((go, K, R, pack.taps, g, C), -1, dtype=np.int64)
    flat = np.arange(K * R * S * C, dtype=np.int64).reshape(K, R, S, C)
    for j in range(go):
        for s in range(S):
            rel = sw * j - pl + s * dw
            index[j, :, :, rel // g + pack.pad_lo, rel % g, :] = flat[:, :, s, :]
    return index.reshape(go * K, R, pack.taps, g * C).astype(np.int32)


def pack_filter(w, pack: WPack, sw: int, dw: int, pl: int):
    """``w'`` of a NumPy ``w (K, R, S, C)``."""
    K, R, S, C = w.shape
    index = pack_filter_index(pack, K, R, S, C, sw, dw, pl)
    flat = np.ascontiguousarray(w).reshape(-1)
    return np.where(index >= 0, flat[np.maximum(index, 0)], w.dtype.type(0))


def pack_bias(bias, pack: WPack):
    """The packed convolution's bias: ``bias`` repeated once per output pixel of a packed pixel."""
    return np.tile(bias, pack.go)


def _tile_width(k: int) -> int:
    """Output channels a Hopper tile spends on ``k`` (its narrowest tile is 64 wide, then steps of 32)."""
    return max(64, -(-k // 32) * 32)


def work_ratio(pack: WPack, C: int, K: int, S: int) -> float:
    """Tensor-core work of the packed convolution over the original's, both as the Hopper kernel counts it
    (rows x tile width x taps along W x 64-channel blocks; the taps along H cancel)."""
    direct = _tile_width(K) * S * -(-C // BLOCK_CHANNELS)
    packed = _tile_width(pack.go * K) * pack.taps / pack.go
    return packed / direct
