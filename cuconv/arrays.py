"""Array-module handling: which library an argument belongs to, zero-copy GPU interop, dtypes.

* ``numpy.ndarray``                      -> NumPy (CPU backend, NumPy result)
* ``cupy.ndarray``                       -> CuPy (GPU, CuPy result)
* ``__dlpack__`` objects on a GPU        -> viewed zero-copy as CuPy (torch, JAX); on the CPU
  they are viewed as NumPy. Preferred over the array interface when an object has both.
* ``__cuda_array_interface__`` objects   -> viewed zero-copy as CuPy (e.g. Numba)
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from .device import cupy_or_none

__all__ = ["as_array", "module_name", "dtype_name", "SUPPORTED_DTYPES"]

BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
SUPPORTED_DTYPES = {np.dtype(np.float16): "float16", BFLOAT16: "bfloat16", np.dtype(np.float32): "float32"}

_DLPACK_CUDA_DEVICES = (2, 3, 10, 13)  # kDLCUDA, kDLCUDAHost, kDLROCM, kDLCUDAManaged


def module_name(a) -> str:
    """``"numpy"`` or ``"cupy"`` for an array :func:`as_array` returned."""
    return "numpy" if isinstance(a, np.ndarray) else "cupy"


def as_array(obj, name: str):
    """Return ``obj`` as a NumPy or CuPy array without copying; TypeError for anything else."""
    if isinstance(obj, np.ndarray):
        return obj
    cp = cupy_or_none()
    if cp is not None and isinstance(obj, cp.ndarray):
        return obj
    # DLPack first: it carries bfloat16 as a real type code, where __cuda_array_interface__ can only
    # say "<V2" (torch does exactly that for bfloat16 tensors).
    if hasattr(obj, "__dlpack__") and hasattr(obj, "__dlpack_device__"):
        dev_type = int(obj.__dlpack_device__()[0])
        if dev_type in _DLPACK_CUDA_DEVICES:
            if cp is None:
                raise TypeError(f"{name}: a GPU tensor was given but CuPy is not installed (pip install 'cuconv[cuda13]')")
            return cp.from_dlpack(obj)
        return np.from_dlpack(obj)
    if hasattr(obj, "__cuda_array_interface__"):
        if cp is None:
            raise TypeError(f"{name}: a GPU array was given but CuPy is not installed (pip install 'cuconv[cuda13]')")
        return cp.asarray(obj)
    raise TypeError(f"{name}: expected a NumPy or CuPy array (or an object with __cuda_array_interface__ or "
                    f"__dlpack__), got {type(obj).__name__}")


def dtype_name(a, name: str) -> str:
    """``"float16"``, ``"bfloat16"`` or ``"float32"``; TypeError for any other dtype."""
    dt = np.dtype(a.dtype)
    if dt not in SUPPORTED_DTYPES:
        raise TypeError(f"{name}: expected dtype float16, bfloat16 (ml_dtypes.bfloat16) or float32, got {dt}")
    return SUPPORTED_DTYPES[dt]
