"""NumPy model of the width fold (kernels_cu/layout/fold_width.cu): the oracle the kernel is tested against,
and the proof on the CPU that the folded convolution is the original one (tests/test_fold.py).

A convolution of ``x (N, H, W, C)`` with ``w (K, R, S, C)`` (stride ``(sh, sw)``, dilation ``(dh, dw)``,
padding ``((ph_lo, ph_hi), (pw_lo, pw_hi))``) equals the convolution of

    x' (N, H, Q, S * Cp):  x'[n, h, q, s * Cp + c] = x[n, h, q * sw - pw_lo + s * dw, c]   (0 outside, c >= C)
    w' (K, R, 1, S * Cp):  w'[k, r, 0, s * Cp + c] = w[k, r, s, c]                         (0 for c >= C)

with an ``R x 1`` filter, stride ``(sh, 1)``, dilation ``(dh, 1)``, padding ``((ph_lo, ph_hi), (0, 0))``:
the same output ``(N, P, Q, K)``. ``Cp`` is ``C`` rounded up to a multiple of 8.

The dense fold (:func:`fold_x_dense`, :func:`unfold_w_dense`; the weight gradient's) puts the ``S * C``
channels side by side and pads once, to ``Cf = ceil8(S * C)``; the same output follows.
"""

from __future__ import annotations

import numpy as np

__all__ = ["padded_channels", "fold_rows", "fold_x", "fold_w", "fold_x_dense", "unfold_w_dense"]


def padded_channels(c: int) -> int:
    """``c`` rounded up to a multiple of 8 (16-byte rows of 16-bit values)."""
    return -(-c // 8) * 8


def fold_rows(src, taps: int, stride: int, dil: int, pad: int, dst_w: int):
    """The kernel's operation on ``src`` ``(rows_in, src_w, C)``: ``(rows_in, dst_w, taps * Cp)``, destination
    column ``q`` holding, for each tap ``s``, source column ``q * stride - pad + s * dil`` (zeros outside
    the source and past ``C``)."""
    rows, src_w, c = src.shape
    cp = padded_channels(c)
    out = np.zeros((rows, dst_w, taps, cp), dtype=src.dtype)
    for s in range(taps):
        cols = np.arange(dst_w) * stride - pad + s * dil
        ok = (cols >= 0) & (cols < src_w)
        out[:, ok, s, :c] = src[:, cols[ok], :]
    return out.reshape(rows, dst_w, taps * cp)


def fold_x(x, filter_width: int, stride_w: int, dilation_w: int, pad_w_lo: int, out_w: int):
    """``x (N, H, W, C)`` folded: ``(N, H, out_w, S * Cp)``."""
    n, h, w, c = x.shape
    folded = fold_rows(x.reshape(n * h, w, c), filter_width, stride_w, dilation_w, pad_w_lo, out_w)
    return folded.reshape(n, h, out_w, -1)


def fold_w(w):
    """``w (K, R, S, C)`` folded: ``(K, R, 1, S * Cp)``."""
    k, r, s, c = w.shape
    return fold_rows(w.reshape(k * r, s, c), s, 0, 1, 0, 1).reshape(k, r, 1, -1)


def fold_x_dense(x, filter_width: int, stride_w: int, dilation_w: int, pad_w_lo: int, out_w: int):
    """``x (N, H, W, C)`` folded without padding each tap (``fold_width_dense``): ``(N, H, out_w, Cf)``,
    element ``s * C + c`` of column ``q`` being ``x[..., q * stride_w - pad_w_lo + s * dilation_w, c]``
    (zero outside the image), ``Cf = S * C`` rounded up to a multiple of 8 (zeros past ``S * C``)."""
    n, h, w, c = x.shape
    taps = filter_width
    out = np.zeros((n, h, out_w, padded_channels(taps * c)), dtype=x.dtype)
    for s in range(taps):
        cols = np.arange(out_w) * stride_w - pad_w_lo + s * dilation_w
        ok = (cols >= 0) & (cols < w)
        out[:, :, ok, s * c:(s + 1) * c] = x[:, :, cols[ok], :]
    return out


def unfold_w_dense(wf, filter_width: int, channels: int):
    """The inverse of the dense fold for a weight: ``wf (K, R, 1, Cf)`` -> ``(K, R, S, channels)`` (a view,
    NumPy or CuPy): the weight gradient of the densely folded convolution unfolds into the original's."""
    k, r = wf.shape[:2]
    return wf[..., :filter_width * channels].reshape(k, r, filter_width, channels)
