"""The float64 NumPy oracle: ``cuconv.reference.conv2d`` / ``conv3d``.

Written for clarity, not speed, and on purpose independent of every backend and of
:mod:`cuconv.problem`: it resolves padding and output sizes itself, so a mistake there in the
library cannot hide in the oracle. Every test and the benchmark compare against it.

The convolution is a sum over filter taps: for each tap ``(t, r, s)`` the input, zero-padded, is
sampled at ``out * stride + tap * dilation`` and multiplied by that tap's ``(K, C/groups)`` filter
matrix, group by group.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

__all__ = ["conv2d", "conv3d", "convnd"]


def _to_numpy64(a):
    if a is None:
        return None
    if hasattr(a, "get") and not isinstance(a, np.ndarray):  # CuPy
        a = a.get()
    elif not isinstance(a, np.ndarray):
        a = np.asarray(a)
    return a.astype(np.float64)


def _per_dim(v, nd):
    return (int(v),) * nd if np.isscalar(v) else tuple(int(u) for u in v)


def _pads(padding, nd, size, filt, stride, dilation):
    if isinstance(padding, str):
        if padding.lower() == "valid":
            return [(0, 0)] * nd
        if padding.lower() == "same":
            pads = []
            for n, f, s, d in zip(size, filt, stride, dilation):
                out = math.ceil(n / s)
                total = max((out - 1) * s + (f - 1) * d + 1 - n, 0)
                pads.append((total // 2, total - total // 2))
            return pads
        raise ValueError(f"padding: unknown {padding!r}")
    if np.isscalar(padding):
        return [(int(padding), int(padding))] * nd
    return [(int(p), int(p)) if np.isscalar(p) else (int(p[0]), int(p[1])) for p in padding]


def _gelu(v):
    return 0.5 * v * (1.0 + np.vectorize(math.erf, otypes=[np.float64])(v / math.sqrt(2.0)))


_ACT = {None: lambda v: v, "relu": lambda v: np.maximum(v, 0.0), "silu": lambda v: v / (1.0 + np.exp(-v)),
        "gelu": _gelu}


def convnd(x, w, bias=None, *, stride=1, padding=0, dilation=1, groups=1, layout="NHWC", residual=None,
           alpha=1.0, beta=1.0, activation=None):
    """N-d convolution in float64: ``act(alpha * conv(x, w) + bias + beta * residual)``.

    ``layout`` is "NHWC"/"NCHW" (2-D) or "NDHWC"/"NCDHW" (3-D); weights are ``(K, *filter, C/g)``
    for the channels-last layouts and ``(K, C/g, *filter)`` for the channels-first ones. Returns a
    float64 NumPy array in ``layout``.
    """
    channels_first = layout.upper() in ("NCHW", "NCDHW")
    x, w = _to_numpy64(x), _to_numpy64(w)
    if channels_first:  # work channels-last below
        x, w = np.moveaxis(x, 1, -1), np.moveaxis(w, 1, -1)
    nd = x.ndim - 2
    N, *size, C = x.shape
    K, *filt, Cg = w.shape
    stride, dilation = _per_dim(stride, nd), _per_dim(dilation, nd)
    pads = _pads(padding, nd, size, filt, stride, dilation)
    out_size = [(n + lo + hi - (f - 1) * d - 1) // s + 1
                for n, (lo, hi), f, s, d in zip(size, pads, filt, stride, dilation)]
    xpad = np.pad(x, [(0, 0)] + pads + [(0, 0)])
    Kg = K // groups
    out = np.zeros((N, *out_size, K))
    for g in range(groups):
        for tap in itertools.product(*[range(f) for f in filt]):
            window = tuple(slice(t * d, t * d + (o - 1) * s + 1, s)
                           for t, d, o, s in zip(tap, dilation, out_size, stride))
            patch = xpad[(slice(None),) + window + (slice(g * Cg, (g + 1) * Cg),)]  # (N, *out, Cg)
            taps_w = w[(slice(g * Kg, (g + 1) * Kg),) + tap]                        # (Kg, Cg)
            out[..., g * Kg:(g + 1) * Kg] += patch @ taps_w.T
    out *= alpha
    if bias is not None:
        out += _to_numpy64(bias)
    if residual is not None:
        res = _to_numpy64(residual)
        out += beta * (np.moveaxis(res, 1, -1) if channels_first else res)
    out = _ACT[activation](out)
    return np.moveaxis(out, -1, 1) if channels_first else out


def conv2d(x, w, bias=None, *, stride=1, padding=0, dilation=1, groups=1, layout="NHWC", residual=None,
           alpha=1.0, beta=1.0, activation=None):
    """Float64 reference of :func:`cuconv.conv2d` (same arguments, no ``out``); returns NumPy float64."""
    return convnd(x, w, bias, stride=stride, padding=padding, dilation=dilation, groups=groups, layout=layout,
                  residual=residual, alpha=alpha, beta=beta, activation=activation)


def conv3d(x, w, bias=None, *, stride=1, padding=0, dilation=1, groups=1, layout="NDHWC", residual=None,
           alpha=1.0, beta=1.0, activation=None):
    """Float64 reference of :func:`cuconv.conv3d` (same arguments, no ``out``); returns NumPy float64."""
    return convnd(x, w, bias, stride=stride, padding=padding, dilation=dilation, groups=groups, layout=layout,
                  residual=residual, alpha=alpha, beta=beta, activation=activation)
