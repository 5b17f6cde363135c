"""The epilogue ``act(alpha * acc + bias + beta * residual)`` in NumPy, and the activations.

Used by the CPU kernel (in float32, or float64 at precision "float64"), the reference (in float64)
and multi-pass GPU strategies' host-side checks. GPU kernels implement the same arithmetic in
kernels_cu/common/epilogue_math.cuh.
"""

from __future__ import annotations

import math

import numpy as np

from .problem import Epilogue

__all__ = ["activate_numpy", "apply_epilogue", "erf_approx", "erf_exact"]

#: Abramowitz & Stegun 7.1.26: erf(x) = 1 - t (a1 + t (a2 + ...)) exp(-x^2), t = 1 / (1 + p x), x >= 0,
#: absolute error below 1.5e-7: float32's own resolution near 1, which is where gelu uses it.
_AS_P = 0.3275911
_AS_A = (1.061405429, -1.453152027, 1.421413741, -0.284496736, 0.254829592)


def erf_approx(v: np.ndarray) -> np.ndarray:
    """erf elementwise, vectorized, absolute error below 1.5e-7 (for the float32 CPU path)."""
    a = np.abs(v)
    t = 1.0 / (1.0 + _AS_P * a)
    poly = _AS_A[0]
    for c in _AS_A[1:]:
        poly = poly * t + c
    return np.copysign(1.0 - poly * t * np.exp(-a * a), v)


#: erf to float64's own accuracy, elementwise (``math.erf`` per element: slower than :func:`erf_approx`,
#: which float64 cannot use, its error being far above float64's resolution).
erf_exact = np.vectorize(math.erf, otypes=[np.float64])


def activate_numpy(v: np.ndarray, activation) -> np.ndarray:
    """Apply ``activation`` (None, "relu", "silu", "gelu" in its erf form) elementwise; vectorized
    (gelu's erf through :func:`erf_approx`, or :func:`erf_exact` for float64 values)."""
    if activation is None:
        return v
    if activation == "relu":
        return np.maximum(v, 0)
    if activation == "silu":
        return v / (1 + np.exp(-v))
    if activation == "gelu":
        erf = erf_exact if v.dtype == np.float64 else erf_approx
        return 0.5 * v * (1 + erf(v * v.dtype.type(1 / math.sqrt(2))))
    raise ValueError(f"activation: unknown {activation!r}")


def apply_epilogue(xp, acc, e: Epilogue, bias, residual, shape=None, dtype=np.float32):
    """``act(alpha * acc + bias + beta * residual)`` in ``dtype`` (float32 by default, or float64) with array module
    ``xp`` (NumPy or CuPy); ``acc`` is channels-last.

    The conventions of every path, BLAS's: with ``beta == 0`` the residual is not read (NaN or inf in it
    do not reach the result), and with ``alpha == 0`` the convolution is not computed: ``acc`` may be
    None, its term is exactly zero (``shape`` then gives the result's shape)."""
    dt = np.dtype(dtype).type
    if acc is None or e.alpha == 0:
        v = xp.zeros(shape if acc is None else acc.shape, dtype=dt)
    else:
        v = acc.astype(dt, copy=False) * dt(e.alpha)
    if e.has_bias and bias is not None:
        v = v + xp.asarray(bias).astype(dt)
    if e.loads_residual and residual is not None:
        v = v + dt(e.beta) * xp.asarray(residual).astype(dt)
    if xp is np:
        with np.errstate(over="ignore"):
            return activate_numpy(v, e.activation)
    if e.activation == "relu":
        return xp.maximum(v, 0)
    if e.activation == "silu":
        return v / (1 + xp.exp(-v))
    if e.activation == "gelu":
        import cupyx.scipy.special as sp
        return 0.5 * v * (1 + sp.erf(v * dt(1 / math.sqrt(2))))
    return v
