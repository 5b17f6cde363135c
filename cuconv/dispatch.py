"""Kernel registry and dispatch.

Every kernel (CPU, generic GPU, Hopper TMA, portable sm_80, ROCm...) is a :class:`Kernel`: it
answers ``supports(problem, device) -> (ok, why)`` and, when chosen, ``run(...)``. The dispatcher
asks each registered kernel in priority order and takes the first that accepts; ``explain``
returns the whole conversation, so a fallback is never silent.

Adding a kernel: subclass :class:`Kernel`, give it a unique ``name``, a ``priority`` (higher is
tried first) and the ``backend`` it runs on, and call :func:`register` at import time of its module
(see ``cuconv/backends/__init__.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from .device import DeviceInfo
from .problem import ConvProblem

__all__ = ["Kernel", "register", "kernels", "select", "Explanation", "KernelDeclined"]


class KernelDeclined(ValueError):
    """Raised when ``kernel=`` forces a kernel that does not support the problem."""


class Kernel:
    """Base class of every convolution kernel.

    Subclasses set ``name``, ``backend`` (``"cpu"``, ``"cuda"`` or ``"hip"``), ``priority`` and
    ``spatial_dims`` (the ``nd`` values they serve), and implement :meth:`check` and :meth:`run`.
    """

    name: str = "?"
    backend: str = "cpu"
    priority: int = 0
    spatial_dims: Tuple[int, ...] = (2, 3)
    #: For conv3d: the ``strategy=`` this kernel implements ("generic", "qslice" or "native").
    strategy: str = "generic"

    def supports(self, problem: ConvProblem, device: DeviceInfo) -> Tuple[bool, str]:
        """``(True, why-chosen)`` or ``(False, why-declined)``; never raises for a valid problem."""
        if device.kind != self.backend:
            return False, f"runs on {self.backend}, the arrays are on {device.kind}"
        if problem.nd not in self.spatial_dims:
            return False, f"serves conv{'/'.join(map(str, self.spatial_dims))}d only"
        return self.check(problem, device)

    def check(self, problem: ConvProblem, device: DeviceInfo) -> Tuple[bool, str]:
        """Kernel-specific part of :meth:`supports` (backend and rank are already checked)."""
        return True, "supports every valid problem"

    def run(self, problem: ConvProblem, x, w, bias, residual, out) -> None:
        """Compute ``out`` (native layout, contiguous, ``problem.dtype``) from native-layout inputs.

        ``bias`` and ``residual`` are ``None`` when absent; ``residual`` may be ``out`` itself.
        """
        raise NotImplementedError

    def describe(self, problem: ConvProblem, device: DeviceInfo) -> str:
        """Variant details (tile config...) shown by ``explain``; override when there is a choice."""
        return self.name

    def settings(self):
        """The kernel's current run-time overrides (environment variables, context managers) that
        change :meth:`check` or :meth:`describe`, as a hashable value; part of the selection memo's key,
        so forcing a variant never shows a stale explanation. Default: none."""
        return None

    def __repr__(self) -> str:
        return f"<cuconv kernel {self.name} ({self.backend})>"


_REGISTRY: Dict[str, Kernel] = {}
#: The registered kernels that override :meth:`Kernel.settings` (asked on every selection).
_CONFIGURABLE: List[Kernel] = []


def register(kernel: Kernel) -> Kernel:
    """Add a kernel instance to the registry (its ``name`` must be unique)."""
    if kernel.name in _REGISTRY and _REGISTRY[kernel.name] is not kernel:
        raise ValueError(f"a kernel named {kernel.name!r} is already registered")
    _REGISTRY[kernel.name] = kernel
    if type(kernel).settings is not Kernel.settings and kernel not in _CONFIGURABLE:
        _CONFIGURABLE.append(kernel)
    _SELECTIONS.clear()
    return kernel


def kernels() -> List[Kernel]:
    """All registered kernels, highest priority first."""
    from . import backends  # noqa: F401  (registers the built-in kernels)
    return sorted(_REGISTRY.values(), key=lambda k: -k.priority)


@dataclass
class Explanation:
    """Which kernel runs a problem and why every other kernel declined.

    Attributes
    ----------
    kernel : str
        Name of the kernel that runs (or would run) the problem.
    detail : str
        That kernel's description of the variant it will use (tile config...).
    reason : str
        Why it accepted.
    declined : dict
        ``{kernel name: reason}`` for every other kernel that was asked and said no.
    skipped : dict
        ``{kernel name: reason}`` for kernels of lower priority that were not needed.
    problem : ConvProblem
    device : DeviceInfo
    """

    kernel: str
    detail: str
    reason: str
    problem: ConvProblem
    device: DeviceInfo
    declined: Dict[str, str] = field(default_factory=dict)
    skipped: Dict[str, str] = field(default_factory=dict)
    forced: bool = False

    def __str__(self) -> str:
        lines = [self.problem.describe(), f"device: {self.device.describe()}",
                 f"runs: {self.kernel}{' (forced)' if self.forced else ''} [{self.detail}] - {self.reason}"]
        for name, why in self.declined.items():
            lines.append(f"  declined {name}: {why}")
        for name, why in self.skipped.items():
            lines.append(f"  not needed {name}: {why}")
        return "\n".join(lines)

    _repr_pretty_ = lambda self, p, cycle: p.text(str(self))  # noqa: E731  (IPython display)


#: (problem, device, forced, strategy, kernels' settings) -> (kernel, explanation). Problems and devices are frozen, so a
#: repeated call skips every ``supports``; registering a kernel clears it.
_SELECTIONS: Dict[tuple, Tuple[Kernel, "Explanation"]] = {}
_SELECTIONS_LIMIT = 4096


def select(problem: ConvProblem, device: DeviceInfo, forced: Optional[str] = None,
           strategy: Optional[str] = None) -> Tuple[Kernel, Explanation]:
    """Pick the kernel for ``problem`` on ``device``; memoised (declines are re-raised each time).

    With ``forced`` (a kernel name) that kernel is used if it supports the problem, else
    :class:`KernelDeclined` is raised with its reason. With ``strategy`` (conv3d on a GPU) only
    kernels implementing that strategy are considered; the others are listed as declined.
    """
    key = (problem, device, forced, strategy, tuple(k.settings() for k in _CONFIGURABLE))
    hit = _SELECTIONS.get(key)
    if hit is None:
        hit = _select_uncached(problem, device, forced, strategy)
        if len(_SELECTIONS) >= _SELECTIONS_LIMIT:
            _SELECTIONS.clear()
        _SELECTIONS[key] = hit
    return hit


def _select_uncached(problem: ConvProblem, device: DeviceInfo, forced: Optional[str],
                     strategy: Optional[str]) -> Tuple[Kernel, Explanation]:
    table = kernels()
    names = [k.name for k in table]
    if forced is not None:
        if forced not in names:
            raise ValueError(f"kernel: expected one of {names}, got {forced!r}")
        k = next(k for k in table if k.name == forced)
        ok, why = k.supports(problem, device)
        if not ok:
            raise KernelDeclined(f"kernel: {forced!r} declines this problem: {why} ({problem.describe()})")
        return k, Explanation(kernel=k.name, detail=k.describe(problem, device), reason=why, problem=problem,
                              device=device, forced=True)
    declined: Dict[str, str] = {}
    chosen = None
    skipped: Dict[str, str] = {}
    for k in table:
        if strategy is not None and device.kind != "cpu" and k.strategy != strategy:
            declined[k.name] = f"implements strategy {k.strategy!r}, {strategy!r} was asked for"
            continue
        ok, why = k.supports(problem, device)
        if chosen is None:
            if ok:
                chosen = (k, why)
            else:
                declined[k.name] = why
        elif ok:
            skipped[k.name] = f"would accept ({why}), lower priority than {chosen[0].name}"
        else:
            declined[k.name] = why
    if chosen is None and strategy is not None:
        raise KernelDeclined(f"strategy: no {strategy!r} kernel supports this problem: {declined}")
    if chosen is None:  # the generic kernels accept every valid problem; this is a bug if reached
        raise RuntimeError(f"no cuconv kernel accepts {problem.describe()} on {device.describe()}: {declined}")
    k, why = chosen
    return k, Explanation(kernel=k.name, detail=k.describe(problem, device), reason=why, problem=problem,
                          device=device, declined=declined, skipped=skipped)
