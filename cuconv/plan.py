"""The kernel contract: a :class:`Kernel` answers a problem with a :class:`Plan` or a :class:`Declined`.

``Kernel.plan(problem, device, overrides)`` makes every decision of the kernel once (tile
configuration, loader sub-path, split, grid) and returns a :class:`Plan` that carries it, or a
:class:`Declined` with the precise reason. A plan is a pure function of its three inputs (no
environment or global state is read), so the dispatcher memoises plans on them
(:mod:`cuconv.dispatch`); ``Plan.run`` is then a cache lookup and a launch.

Adding a kernel: subclass :class:`Kernel`, set ``name``, ``backend``, ``priority``,
``spatial_dims`` and ``precisions`` (the (dtype, precision) pairs it computes as promised),
implement :meth:`Kernel.make_plan` returning your :class:`Plan` subclass (with
:meth:`Plan.describe` and :meth:`Plan.run`), and register an instance with
:func:`cuconv.registry.register` in a module that ``cuconv/backends/__init__.py`` imports. A kernel that
can run a problem but is not the better choice for it everywhere (a rewrite that pays only on large
layers) says so in :meth:`Kernel.passes_over`: the automatic choice moves on, ``kernel=`` still runs it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import FrozenSet, Optional, Tuple, Union

from .device import DeviceInfo
from .overrides import Overrides
from .problem import PRECISIONS, ConvProblem

__all__ = ["Kernel", "Plan", "Declined", "KernelDeclined", "SIXTEEN_BIT", "FLOAT32_FFMA", "EVERY_PRECISION",
           "precisions_text", "tf32_note"]

#: (dtype, precision) pairs of the 16-bit dtypes (tensor-core products are exact in fp32 for them).
SIXTEEN_BIT: FrozenSet[Tuple[str, str]] = frozenset({("float16", "float16"), ("bfloat16", "bfloat16")})
#: float32 computed with fp32 multiply-adds: float32 accuracy, which is also more than "tf32" promises.
FLOAT32_FFMA: FrozenSet[Tuple[str, str]] = frozenset({("float32", "float32"), ("float32", "tf32")})
#: Every pair :data:`cuconv.problem.PRECISIONS` allows.
EVERY_PRECISION: FrozenSet[Tuple[str, str]] = frozenset((d, p) for d, ps in PRECISIONS.items() for p in ps)


def precisions_text(pairs) -> str:
    """``pairs`` in words, for a decline reason: "float16, bfloat16, float32 at precision tf32"."""
    words = []
    for dtype in PRECISIONS:
        ps = [p for p in PRECISIONS[dtype] if (dtype, p) in pairs]
        if ps == [dtype]:
            words.append(dtype)
        elif ps:
            words.append(f"{dtype} at precision {' or '.join(ps)}")
    return ", ".join(words) or "nothing"


def tf32_note(problem: ConvProblem, how: str = "fp32 multiply-adds") -> str:
    """What the reason of a kernel that computes float32 ``how`` adds at precision "tf32": it is more
    accurate than asked (empty at any other precision)."""
    return f" ({how}: more accurate than tf32 asks)" if problem.precision == "tf32" else ""


class KernelDeclined(ValueError):
    """Raised when ``kernel=`` (or ``strategy=``) forces a kernel that does not support the problem."""


@dataclass(frozen=True)
class Declined:
    """A kernel's answer when it cannot serve a problem: ``reason`` says precisely why."""

    reason: str

    def __bool__(self) -> bool:  # a declined answer is falsy, a plan truthy
        return False


class Plan:
    """One kernel's decisions for one (problem, device, overrides), ready to run.

    Subclasses keep whatever their ``run`` needs (tile config, compiled function handles, launch
    records); ``reason`` says why the kernel accepted, :meth:`describe` names the variant.
    """

    #: True when :meth:`run` takes ``out`` and ``residual`` in the problem's own channels-first layout
    #: (contiguous ``(N, K, *out_spatial)``) and writes ``out`` there: the kernel's epilogue stores that
    #: layout, so the caller moves neither (:mod:`cuconv.layout`). ``x`` and ``w`` are channels-last unless
    #: :attr:`reads_channels_first`.
    writes_channels_first: bool = False
    #: True when :meth:`run` also takes ``x`` and ``w`` channels-first (contiguous ``(N, C, *spatial)`` and
    #: ``(K, C/groups, *filter)``): the kernel reads that layout itself, and the caller moves no operand.
    #: Implies :attr:`writes_channels_first`.
    reads_channels_first: bool = False
    #: True when :meth:`run` takes ``x`` channels-first (contiguous ``(N, C, *spatial)``) and ``w``
    #: channels-last: the kernel reads x in that layout, and the caller moves only the filter. Implies
    #: :attr:`writes_channels_first`.
    reads_x_channels_first: bool = False

    def __init__(self, kernel: "Kernel", problem: ConvProblem, device: DeviceInfo, reason: str):
        self.kernel = kernel
        self.problem = problem
        self.device = device
        self.reason = reason

    def describe(self) -> str:
        """The variant that runs (tile config, sub-path...), for :func:`cuconv.explain`."""
        return self.kernel.name

    def compile_jobs(self) -> Tuple[Tuple[str, dict], ...]:
        """The ``(source, defines)`` pairs of the CUDA kernels :meth:`run` loads, for operands at
        16-byte aligned addresses (:func:`cuconv.precompile` compiles them ahead of the first call).
        Empty for a kernel that compiles nothing."""
        return ()

    def run(self, x, w, bias, residual, out) -> None:
        """Compute ``out`` (native layout, contiguous, the problem's dtype) from native-layout inputs
        (``out`` and ``residual`` channels-first where :attr:`writes_channels_first`, ``x`` and ``w`` too
        where :attr:`reads_channels_first`, ``x`` alone where :attr:`reads_x_channels_first`).

        ``bias`` and ``residual`` are ``None`` when absent; ``residual`` may be ``out`` itself.
        """
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<cuconv plan {self.kernel.name}: {self.describe()}>"


class Kernel:
    """Base class of every convolution kernel (see the module docstring)."""

    name: str = "?"
    #: ``"cpu"``, ``"cuda"`` or ``"hip"``: the device kind the kernel runs on.
    backend: str = "cpu"
    #: Higher is asked first; the first kernel that plans a problem runs it.
    priority: int = 0
    #: The ``nd`` values (2: conv2d, 3: conv3d) the kernel serves.
    spatial_dims: Tuple[int, ...] = (2, 3)
    #: For conv3d: the ``strategy=`` this kernel implements ("generic", "qslice" or "native").
    strategy: str = "generic"
    #: The (dtype, precision) pairs (``problem.dtype``, ``problem.precision``) the kernel computes at least
    #: as accurately as the precision promises; every other pair is declined before :meth:`make_plan`.
    precisions: FrozenSet[Tuple[str, str]] = SIXTEEN_BIT
    #: Whether :func:`cuconv.autotune` measures this kernel's plans besides the automatic choice (False
    #: for a fallback whose memory grows with the problem).
    autotune_candidate: bool = True

    def plan(self, problem: ConvProblem, device: DeviceInfo, overrides: Overrides) -> Union[Plan, Declined]:
        """A :class:`Plan` for ``problem``, or :class:`Declined` with the reason; never raises for a
        valid problem. Checks the device kind, rank, dtype and precision, then asks :meth:`make_plan`."""
        if device.kind != self.backend:
            return Declined(f"runs on {self.backend}, the arrays are on {device.kind}")
        if problem.nd not in self.spatial_dims:
            return Declined(f"serves conv{'/'.join(map(str, self.spatial_dims))}d only")
        if (problem.dtype, problem.precision) not in self.precisions:
            asked = (problem.dtype if problem.precision == problem.dtype
                     else f"{problem.dtype} at precision {problem.precision}")
            return Declined(f"dtype {asked}: this kernel computes {precisions_text(self.precisions)} only")
        return self.make_plan(problem, device, overrides)

    def make_plan(self, problem: ConvProblem, device: DeviceInfo, overrides: Overrides) -> Union[Plan, Declined]:
        """The kernel-specific part of :meth:`plan` (device kind and rank already checked)."""
        raise NotImplementedError

    def passes_over(self, plan: Plan) -> Optional[str]:
        """Why the automatic choice should leave ``plan`` (one of this kernel's) to a kernel of lower
        priority although it runs correctly, or None to take it; a call that forces the kernel
        (``kernel=``) runs it regardless. The default takes every plan."""
        return None

    def __repr__(self) -> str:
        return f"<cuconv kernel {self.name} ({self.backend})>"
