"""Where a call runs: the array module of its inputs and, on a GPU, what that GPU can do.

CuPy is imported lazily: ``import cuconv`` works on a machine with no GPU and no CuPy.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Optional, Tuple

from .problem import cached_fields_hash, fields_state

__all__ = ["DeviceInfo", "cupy_or_none", "gpu_available", "device_of", "CPU"]


@functools.lru_cache(maxsize=None)
def cupy_or_none():
    """The ``cupy`` module if it imports, else ``None`` (asked once per process)."""
    try:
        import cupy  # noqa: F401
    except Exception:  # ImportError, or a broken CUDA install that fails on import
        return None
    return cupy


@functools.lru_cache(maxsize=None)
def gpu_available() -> bool:
    """True when CuPy imports and sees at least one GPU."""
    cp = cupy_or_none()
    if cp is None:
        return False
    try:
        return cp.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


@dataclass(frozen=True)
class DeviceInfo:
    """What a kernel's ``supports`` needs to know about the device.

    ``kind`` is ``"cpu"``, ``"cuda"`` or ``"hip"``; ``cc`` is the compute capability
    ``(major, minor)`` on CUDA; ``arch`` the compile target (``"sm_90a"``, ``"sm_80"``,
    ``"gfx942"``...).
    """

    kind: str
    index: int = 0
    name: str = "cpu"
    cc: Tuple[int, int] = (0, 0)
    arch: str = "cpu"
    sm_count: int = 0
    smem_per_block_optin: int = 0

    @property
    def is_hopper(self) -> bool:
        return self.kind == "cuda" and self.cc == (9, 0)

    __hash__ = cached_fields_hash  # a dictionary key on every call (kernel selection): hashed once
    __getstate__ = fields_state

    def describe(self) -> str:
        if self.kind == "cpu":
            return "CPU (NumPy)"
        return f"{self.name} ({self.arch}, {self.sm_count} SMs)"


CPU = DeviceInfo(kind="cpu")


@functools.lru_cache(maxsize=None)
def gpu_info(index: int) -> DeviceInfo:
    import cupy as cp

    props = cp.cuda.runtime.getDeviceProperties(index)
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    if cp.cuda.runtime.is_hip:
        arch = props.get("gcnArchName", b"gfx000")
        arch = (arch.decode() if isinstance(arch, bytes) else str(arch)).split(":")[0]
        return DeviceInfo(kind="hip", index=index, name=name, cc=(props["major"], props["minor"]), arch=arch,
                          sm_count=props["multiProcessorCount"],
                          smem_per_block_optin=props.get("sharedMemPerBlock", 65536))
    major, minor = props["major"], props["minor"]
    # sm_90a / sm_100a unlock wgmma, setmaxnreg and friends; they only run on that exact chip.
    arch = f"sm_{major}{minor}" + ("a" if major in (9, 10) else "")
    return DeviceInfo(kind="cuda", index=index, name=name, cc=(major, minor), arch=arch,
                      sm_count=props["multiProcessorCount"],
                      smem_per_block_optin=props.get("sharedMemPerBlockOptin", props["sharedMemPerBlock"]))


def device_of(array) -> DeviceInfo:
    """The device a (NumPy or CuPy) array lives on."""
    cp = cupy_or_none()
    if cp is not None and isinstance(array, cp.ndarray):
        return gpu_info(array.device.id)
    return CPU


def current_gpu() -> Optional[DeviceInfo]:
    """The current CuPy device, or ``None`` without a GPU."""
    if not gpu_available():
        return None
    import cupy as cp
    return gpu_info(cp.cuda.Device().id)
