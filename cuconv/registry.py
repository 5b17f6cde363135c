"""The kernel registry: every :class:`~cuconv.plan.Kernel` instance by name.

Backends register their kernels when their module is imported (``cuconv/backends/__init__.py``
imports every built-in backend); :mod:`cuconv.dispatch` imports that package before it asks the
registry, so the registry itself depends on no backend.
"""

from __future__ import annotations

from typing import Callable, Dict, List

from .plan import Kernel

__all__ = ["register", "registered", "on_change"]

_REGISTRY: Dict[str, Kernel] = {}
_LISTENERS: List[Callable[[], None]] = []


def register(kernel: Kernel) -> Kernel:
    """Add a kernel instance to the registry (its ``name`` must be unique); returns it."""
    if not isinstance(kernel, Kernel):
        raise TypeError(f"kernel: expected a cuconv.plan.Kernel instance, got {type(kernel).__name__}")
    if kernel.name in _REGISTRY and _REGISTRY[kernel.name] is not kernel:
        raise ValueError(f"kernel: a kernel named {kernel.name!r} is already registered")
    _REGISTRY[kernel.name] = kernel
    for listener in _LISTENERS:
        listener()
    return kernel


def registered() -> List[Kernel]:
    """The registered kernels, highest priority first."""
    return sorted(_REGISTRY.values(), key=lambda k: -k.priority)


def on_change(listener: Callable[[], None]) -> None:
    """Call ``listener()`` whenever a kernel is registered (the dispatcher drops its memo of plans)."""
    _LISTENERS.append(listener)
