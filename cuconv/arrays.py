"""Array-module handling: which library an argument belongs to, zero-copy GPU interop, dtypes.

* ``numpy.ndarray``                      -> NumPy (CPU backend, NumPy result)
* ``cupy.ndarray``                       -> CuPy (GPU, CuPy result)
* ``__dlpack__`` objects on a GPU        -> viewed zero-copy as CuPy (torch, JAX); on the CPU
  they are viewed as NumPy. Preferred over the array interface when an object has both.
* ``__cuda_array_interface__`` objects   -> viewed zero-copy as CuPy (e.g. Numba)
"""

from __future__ import annotations

import numbers

import ml_dtypes
import numpy as np

from .device import cupy_or_none

__all__ = ["as_array", "module_name", "dtype_name", "check_companion", "check_same_place", "real_scalar", "SUPPORTED_DTYPES"]

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


def check_same_place(a, name: str, ref, ref_name: str = "x"):
    """``a`` must be of the same array library as ``ref`` and, on a GPU, on the same device."""
    if module_name(a) != module_name(ref):
        raise TypeError(f"{name}: expected a {module_name(ref)} array like {ref_name}, got a {module_name(a)} array")
    if module_name(a) == "cupy" and a.device.id != ref.device.id:
        raise ValueError(f"{name}: expected an array on GPU {ref.device.id} like {ref_name}, got GPU {a.device.id}")


def check_companion(a, name: str, shape, dtype: str, ref, ref_name: str = "x"):
    """Shape / dtype / array-module / device checks of an operand that must match ``ref``."""
    check_same_place(a, name, ref, ref_name)
    if tuple(a.shape) != tuple(shape):
        raise ValueError(f"{name}: expected shape {tuple(shape)}, got {tuple(a.shape)}")
    got = dtype_name(a, name)
    if got != dtype:
        raise TypeError(f"{name}: expected dtype {dtype} like {ref_name}, got {got}")


def real_scalar(v, name: str) -> float:
    """A real Python/NumPy number as float; TypeError naming ``name`` otherwise (bools refused)."""
    if type(v) is float:  # the common case, before the (slower) abstract-class check
        return v
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        raise TypeError(f"{name}: expected a real number, got {v!r}")
    return float(v)
