"""The epilogue ``act(alpha * acc + bias + beta * residual)`` in NumPy, and the activations.

Used by the CPU kernel (in float32), the reference (in float64) and multi-pass GPU strategies'
host-side checks. GPU kernels implement the same arithmetic in kernels_cu/common/epilogue_math.cuh.
"""

from __future__ import annotations

import math

import numpy as np

from .problem import Epilogue

__all__ = ["activate_numpy", "apply_epilogue_numpy"]

_erf = np.frompyfunc(math.erf, 1, 1)


def activate_numpy(v: np.ndarray, activation) -> np.ndarray:
    """Apply ``activation`` (None, "relu", "silu", "gelu" with the exact erf form) elementwise."""
    if activation is None:
        return v
    if activation == "relu":
        return np.maximum(v, 0)
    if activation == "silu":
        return v / (1 + np.exp(-v))
    if activation == "gelu":
        return 0.5 * v * (1 + _erf(v / math.sqrt(2)).astype(v.dtype))
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
