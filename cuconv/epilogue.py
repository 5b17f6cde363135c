"""The epilogue ``act(alpha * acc + bias + beta * residual)`` in NumPy, and the activations.

Used by the CPU kernel (in float32), the reference (in float64) and multi-pass GPU strategies'
host-side checks. GPU kernels implement the same arithmetic in kernels_cu/common/epilogue_math.cuh.
"""

from __future__ import annotations

import math

import numpy as np

from .problem import Epilogue

__all__ = ["activate_numpy", "apply_epilogue_numpy", "erf_approx"]

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


def activate_numpy(v: np.ndarray, activation) -> np.ndarray:
    """Apply ``activation`` (None, "relu", "silu", "gelu" in its erf form) elementwise; vectorized
    (gelu's erf through :func:`erf_approx`)."""
    if activation is None:
        return v
    if activation == "relu":
        return np.maximum(v, 0)
    if activation == "silu":
        return v / (1 + np.exp(-v))
    if activation == "gelu":
        return 0.5 * v * (1 + erf_approx(v * v.dtype.type(1 / math.sqrt(2))))
    raise ValueError(f"activation: unknown {activation!r}")


def apply_epilogue_numpy(acc: np.ndarray, e: Epilogue, bias, residual, dtype) -> np.ndarray:
    """``act(alpha * acc + bias + beta * residual)`` computed in ``dtype``; acc is channels-last."""
    v = acc.astype(dtype, copy=False) * dtype(e.alpha)
    if e.has_bias and bias is not None:
        v = v + np.asarray(bias).astype(dtype)
    if e.loads_residual and residual is not None:
        v = v + dtype(e.beta) * np.asarray(residual).astype(dtype)
    with np.errstate(over="ignore"):
        return activate_numpy(v, e.activation)
