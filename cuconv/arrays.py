"""Array-module handling: which library an argument belongs to, zero-copy GPU interop, dtypes.

* ``numpy.ndarray``                      -> NumPy (CPU backend, NumPy result)
* ``cupy.ndarray``                       -> CuPy (GPU, CuPy result)
* ``__dlpack__`` objects on a GPU        -> viewed zero-copy as CuPy (torch, JAX); on the CPU
  they are viewed as NumPy (bfloat16 included: :func:`_cpu_dlpack`). Preferred over the array
  interface when an object has both. The result of a call is a CuPy array for a GPU tensor and a
  NumPy array for a CPU tensor, whatever library made the tensor.
* ``__cuda_array_interface__`` objects   -> viewed zero-copy as CuPy (e.g. Numba)
"""

from __future__ import annotations

import ctypes
import functools
import numbers

import ml_dtypes
import numpy as np

from .device import cupy_or_none

__all__ = ["as_array", "module_name", "dtype_name", "check_companion", "check_same_place", "real_scalar", "SUPPORTED_DTYPES"]

BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
SUPPORTED_DTYPES = {np.dtype(np.float16): "float16", BFLOAT16: "bfloat16", np.dtype(np.float32): "float32",
                    np.dtype(np.float64): "float64"}

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
        try:
            if dev_type in _DLPACK_CUDA_DEVICES:
                if cp is None:
                    raise TypeError(f"{name}: a GPU tensor was given but CuPy is not installed "
                                    f"(pip install 'cuconv[cuda13]')")
                return cp.from_dlpack(obj)
            return _cpu_dlpack(obj, name)
        except (BufferError, RuntimeError) as e:  # the producer refuses to export (e.g. requires_grad)
            raise TypeError(f"{name}: the {type(obj).__name__} cannot be shared through DLPack ({e}); pass a "
                            f"plain tensor, e.g. tensor.detach()") from e
    if hasattr(obj, "__cuda_array_interface__"):
        if cp is None:
            raise TypeError(f"{name}: a GPU array was given but CuPy is not installed (pip install 'cuconv[cuda13]')")
        return cp.asarray(obj)
    if isinstance(obj, (np.generic, numbers.Number)):
        raise TypeError(f"{name}: expected an array, got the scalar {obj!r} (a {type(obj).__name__}); pass an "
                        f"array with the batch, spatial and channel axes")
    raise TypeError(f"{name}: expected a NumPy or CuPy array (or an object with __cuda_array_interface__ or "
                    f"__dlpack__), got {type(obj).__name__}")


_KDL_BFLOAT = 4  # DLDataTypeCode kDLBfloat


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32), ("dtype", _DLDataType),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]


class _DLManagedTensor(ctypes.Structure):
    pass


_DLManagedTensor._fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p),
                             ("deleter", ctypes.CFUNCTYPE(None, ctypes.POINTER(_DLManagedTensor)))]


# Private prototypes of the two capsule functions (setting restype/argtypes on ctypes.pythonapi's own
# attributes would change them for every other user in the process).
_capsule_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi))
_capsule_set_name = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_SetName", ctypes.pythonapi))


class _DLPackOwner:
    """Keeps a consumed DLPack tensor alive and calls its deleter when the last view goes."""

    def __init__(self, managed):
        self._managed = managed

    def __del__(self):
        if self._managed.contents.deleter:
            self._managed.contents.deleter(self._managed)


def _cpu_dlpack(obj, name: str):
    """A CPU DLPack tensor as a NumPy view. NumPy's own importer takes every dtype but bfloat16; a
    bfloat16 tensor is read through the DLPack structure itself (the legacy ``dltensor`` capsule) and
    viewed as ``ml_dtypes.bfloat16``, still without a copy."""
    try:
        return np.from_dlpack(obj)
    except (RuntimeError, TypeError, BufferError) as e:
        if "dtype" not in str(e).lower():
            raise
    capsule = obj.__dlpack__()
    address = _capsule_pointer(capsule, b"dltensor")
    managed = ctypes.cast(address, ctypes.POINTER(_DLManagedTensor))
    t = managed.contents.dl_tensor
    code, bits, lanes = t.dtype.code, t.dtype.bits, t.dtype.lanes
    if (code, bits, lanes) != (_KDL_BFLOAT, 16, 1):
        raise TypeError(f"{name}: expected dtype float16, bfloat16, float32 or float64, got the DLPack type "
                        f"(code {code}, {bits} bits, {lanes} lanes)")
    _capsule_set_name(capsule, b"used_dltensor")  # consumed: the capsule no longer frees it, the owner does
    owner = _DLPackOwner(managed)
    shape = tuple(t.shape[i] for i in range(t.ndim))
    if t.strides:
        strides = tuple(2 * t.strides[i] for i in range(t.ndim))
    else:
        strides = tuple(2 * int(np.prod(shape[i + 1:], dtype=np.int64)) for i in range(t.ndim))
    extent = 1 + sum((n - 1) * st for n, st in zip(shape, strides)) // 2 if all(shape) else 0
    if extent == 0:
        return np.zeros(shape, dtype=BFLOAT16)
    # a ctypes buffer over the tensor's memory, carrying the owner: NumPy keeps the buffer (and so the
    # owner) alive as long as any view of it
    buffer_type = type("_DLPackBuffer", (ctypes.c_uint16 * extent,), {})
    buffer = buffer_type.from_address(t.data + t.byte_offset)
    buffer.owner = owner
    flat = np.frombuffer(buffer, dtype=np.uint16)
    return np.lib.stride_tricks.as_strided(flat, shape=shape, strides=strides).view(BFLOAT16)


def dtype_name(a, name: str) -> str:
    """``"float16"``, ``"bfloat16"``, ``"float32"`` or ``"float64"``; TypeError for any other dtype."""
    dt = np.dtype(a.dtype)
    if dt not in SUPPORTED_DTYPES:
        raise TypeError(f"{name}: expected dtype float16, bfloat16 (ml_dtypes.bfloat16), float32 or float64, "
                        f"got {dt}")
    return SUPPORTED_DTYPES[dt]


def foreign_device(a):
    """The ``cupy.cuda.Device`` of a CuPy array that is not on the current GPU, else None."""
    if type(a) is np.ndarray:
        return None
    cp = cupy_or_none()
    if cp is None or type(a) is not cp.ndarray:
        return None
    device_id = a.data.device_id
    return None if device_id == cp.cuda.runtime.getDevice() else cp.cuda.Device(device_id)


def on_device_of(position: int):
    """Decorator: the call runs with the GPU of its argument ``position`` (a CuPy array) current, so what
    it allocates (the output, scratch) and launches lands on its operands' GPU, whatever GPU is current."""
    def wrap(fn):
        @functools.wraps(fn)
        def call(*args, **kwargs):
            device = foreign_device(args[position])
            if device is None:
                return fn(*args, **kwargs)
            with device:
                return fn(*args, **kwargs)
        return call
    return wrap


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


def contiguous_strides(shape, itemsize: int) -> tuple:
    """The byte strides of a C-contiguous array of ``shape`` (empty axes count as one)."""
    strides, step = [], itemsize
    for n in reversed(shape):
        strides.append(step)
        step *= max(n, 1)
    return tuple(reversed(strides))


def meets(xp, out, reads) -> bool:
    """Whether an array of ``reads`` (None skipped) may share memory with ``out``: the library's bounds
    test (:func:`numpy.may_share_memory`), or on a GPU with every array contiguous the overlap of the
    address ranges (:func:`ranges_meet`, no bounds computation)."""
    if xp is not np and out.flags.c_contiguous and all(a is None or a.flags.c_contiguous for a in reads):
        return ranges_meet(out, reads)
    return any(a is not None and xp.may_share_memory(a, out) for a in reads)


def ranges_meet(out, reads) -> bool:
    """Whether the address range of a contiguous GPU array of ``reads`` (None skipped) meets that of the
    contiguous GPU array ``out`` (each array is one range: its pointer and byte count)."""
    lo = out.data.ptr
    hi = lo + out.nbytes
    for a in reads:
        if a is not None:
            start = a.data.ptr
            if start < hi and lo < start + a.nbytes:
                return True
    return False
