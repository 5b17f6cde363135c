"""The float64 NumPy oracle: ``cuconv.reference.conv2d`` / ``conv3d``.

Written for clarity, not speed, and on purpose independent of every backend and of
:mod:`cuconv.problem`: it resolves padding and output sizes itself, so a mistake there in the
library cannot hide in the oracle. Every test and the benchmark compare against it. Its arguments
are checked by the library's own validation step (:mod:`cuconv.validate`), so it accepts and refuses
the calls :func:`cuconv.conv2d` does, with the same messages (float64 arrays included).

Conventions (the library's, BLAS's): with ``beta == 0`` the residual is not read, and with
``alpha == 0`` the convolution is not computed, so NaN or inf in a term that is scaled by zero does
not reach the result.

The convolution is a sum over filter taps: for each tap ``(t, r, s)`` the input, zero-padded, is
sampled at ``out * stride + tap * dilation`` and multiplied by that tap's ``(K, C/groups)`` filter
matrix, group by group.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from .arrays import as_array, dtype_name
from .problem import LAYOUTS
from .validate import activation_of, check_ranks, conv_problem, layout_of, user_shape

__all__ = ["conv2d", "conv3d", "convnd"]


def _to_numpy64(a):
    if a is None:
        return None
    a = as_array(a, "array")  # NumPy, CuPy or a DLPack tensor (checked by the caller)
    if not isinstance(a, np.ndarray):  # CuPy
        a = a.get()
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


def _validated(nd, x, w, bias, stride, padding, dilation, groups, layout, residual, alpha, beta, activation):
    """The library's checks of a call; returns the canonical layout and activation."""
    layout = layout_of(layout, nd)
    xa, wa = as_array(x, "x"), as_array(w, "w")
    check_ranks(nd, layout, xa, wa)
    dtypes = [dtype_name(a, n) for a, n in ((xa, "x"), (wa, "w"))]
    if dtypes[1] != dtypes[0]:
        raise TypeError(f"w: expected dtype {dtypes[0]} like x, got {dtypes[1]}")
    activation = activation_of(activation)
    problem = conv_problem(nd, tuple(xa.shape), tuple(wa.shape), "float32", layout, stride, padding, dilation,
                           groups, alpha, beta, bias is not None, residual is not None, activation)
    out_shape = user_shape((xa.shape[0], *problem.out_shape[1:]), layout)
    for name, a, shape in (("bias", bias, (problem.out_channels,)), ("residual", residual, out_shape)):
        got = None if a is None else tuple(as_array(a, name).shape)
        if got is not None and got != tuple(shape):
            raise ValueError(f"{name}: expected shape {tuple(shape)}, got {got}")
    return layout, activation


def convnd(x, w, bias=None, *, stride=1, padding=0, dilation=1, groups=1, layout="NHWC", residual=None,
           alpha=1.0, beta=1.0, activation=None):
    """N-d convolution in float64: ``act(alpha * conv(x, w) + bias + beta * residual)``.

    ``layout`` is "NHWC"/"NCHW" (2-D) or "NDHWC"/"NCDHW" (3-D); weights are ``(K, *filter, C/g)``
    for the channels-last layouts and ``(K, C/g, *filter)`` for the channels-first ones. Returns a
    float64 NumPy array in ``layout``. ``alpha == 0`` skips the convolution, ``beta == 0`` the residual.
    """
    nd = LAYOUTS.get(layout.upper(), (2,))[0] if isinstance(layout, str) else 2
    return _run(nd, x, w, bias, stride, padding, dilation, groups, layout, residual, alpha, beta, activation)


def _run(nd, x, w, bias, stride, padding, dilation, groups, layout, residual, alpha, beta, activation):
    layout, activation = _validated(nd, x, w, bias, stride, padding, dilation, groups, layout, residual, alpha,
                                    beta, activation)
    channels_first = not LAYOUTS[layout][1]
    x, w = _to_numpy64(x), _to_numpy64(w)
    if channels_first:  # work channels-last below
        x, w = np.moveaxis(x, 1, -1), np.moveaxis(w, 1, -1)
    N, *size, C = x.shape
    K, *filt, Cg = w.shape
    stride, dilation = _per_dim(stride, nd), _per_dim(dilation, nd)
    pads = _pads(padding, nd, size, filt, stride, dilation)
    out_size = [(n + lo + hi - (f - 1) * d - 1) // s + 1
                for n, (lo, hi), f, s, d in zip(size, pads, filt, stride, dilation)]
    Kg = K // groups
    out = np.zeros((N, *out_size, K))
    if alpha != 0:
        xpad = np.pad(x, [(0, 0)] + pads + [(0, 0)])
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
    if residual is not None and beta != 0:
        res = _to_numpy64(residual)
        out += beta * (np.moveaxis(res, 1, -1) if channels_first else res)
    out = _ACT[activation](out)
    return np.moveaxis(out, -1, 1) if channels_first else out


def conv2d(x, w, bias=None, *, stride=1, padding=0, dilation=1, groups=1, layout="NHWC", residual=None,
           alpha=1.0, beta=1.0, activation=None):
    """Float64 reference of :func:`cuconv.conv2d` (same arguments, no ``out``); returns NumPy float64."""
    return _run(2, x, w, bias, stride, padding, dilation, groups, layout, residual, alpha, beta, activation)


def conv3d(x, w, bias=None, *, stride=1, padding=0, dilation=1, groups=1, layout="NDHWC", residual=None,
           alpha=1.0, beta=1.0, activation=None):
    """Float64 reference of :func:`cuconv.conv3d` (same arguments, no ``out``); returns NumPy float64."""
    return _run(3, x, w, bias, stride, padding, dilation, groups, layout, residual, alpha, beta, activation)
