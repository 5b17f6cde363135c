"""Dispatch: ask every kernel for a plan, run the first that makes one, and say why.

Each registered kernel (:mod:`cuconv.registry`), highest priority first, answers
``plan(problem, device, overrides)`` with a :class:`~cuconv.plan.Plan` or a
:class:`~cuconv.plan.Declined`; the first plan that its kernel does not pass over
(:meth:`~cuconv.plan.Kernel.passes_over`) runs. :func:`select` memoises the outcome per
(problem, device, forced kernel, strategy, overrides): one memo of plans, so a repeated call costs a
dictionary lookup. :func:`cuconv.explain` returns the whole conversation
(:class:`Explanation`), so a fallback is never silent.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from . import backends  # noqa: F401  (registers the built-in kernels)
from .device import DeviceInfo
from .layout import describe as describe_layout
from .overrides import Overrides, current_overrides
from .plan import Kernel, KernelDeclined, Plan
from .problem import PRECISION_MEANING, ConvProblem
from .registry import on_change, registered

__all__ = ["kernels", "select", "Explanation", "KernelDeclined"]


def kernels() -> List[Kernel]:
    """All registered kernels, highest priority first."""
    return registered()


@dataclass
class Explanation:
    """Which kernel runs a problem, its plan, and why every other kernel declined.

    Attributes
    ----------
    kernel : str
        Name of the kernel that runs (or would run) the problem.
    detail : str
        Its plan's description of the variant (tile config, sub-path...).
    reason : str
        Why it accepted.
    plan : Plan
        The plan itself (``plan.describe()`` is ``detail``).
    declined : dict
        ``{kernel name: reason}`` for every other kernel that was asked and said no.
    skipped : dict
        ``{kernel name: reason}`` for kernels of lower priority that would accept but were not needed.
    overrides : Overrides
        The :func:`cuconv.overrides` in force when the plan was made.
    tuning : cuconv.autotune.Tuning or None
        Under :func:`cuconv.autotune`: the candidates measured, their times and the one chosen (the
        declines listed are those of the automatic choice); None otherwise.
    precision : str
        The precision the kernel computes at (``problem.precision``: "float16", "bfloat16", "float32",
        "tf32" or "float64"); the plan's reason says where the kernel is more accurate than asked.
    """

    kernel: str
    detail: str
    reason: str
    problem: ConvProblem
    device: DeviceInfo
    plan: Plan
    overrides: Overrides
    declined: Dict[str, str] = field(default_factory=dict)
    skipped: Dict[str, str] = field(default_factory=dict)
    forced: bool = False
    tuning: Optional[object] = None

    @property
    def precision(self) -> str:
        return self.problem.precision

    def __str__(self) -> str:
        lines = [self.problem.describe(), f"device: {self.device.describe()}",
                 f"precision: {self.precision} ({PRECISION_MEANING[self.precision]})",
                 f"runs: {self.kernel}{' (forced)' if self.forced else ''} [{self.detail}] - {self.reason}",
                 self.layout]
        if self.variants:
            lines.append(self.variants)
        if self.overrides.describe():
            lines.append(f"overrides: {self.overrides.describe()}")
        for name, why in self.declined.items():
            lines.append(f"  declined {name}: {why}")
        for name, why in self.skipped.items():
            lines.append(f"  not needed {name}: {why}")
        if self.tuning is not None:
            lines.append(self.tuning.describe())
        return "\n".join(lines)

    @property
    def layout(self) -> str:
        """How the call's layout reaches the kernel: whether operands are moved to channels-last, by
        what, and the bytes that moves (:func:`cuconv.layout.describe`)."""
        return describe_layout(self.problem, self.device, self.plan)

    @property
    def variants(self) -> str:
        """Where the compiled kernels a call loads come from (:func:`cuconv.compiler.variant_origin`): this
        process, the kernel cache, the prebuilt store, or NVRTC on the first call (about a second each).
        Empty where nothing is compiled (the CPU) or NVRTC is not installed."""
        from .precompile import call_jobs
        if self.device.kind != "cuda":
            return ""
        try:
            from .compiler import variant_origin
            origins = [variant_origin(source, self.device.arch, defines) for source, defines in call_jobs(self.plan)]
        except ImportError:
            return ""
        if not origins:
            return ""
        words = {"process": "loaded by this process", "cache": "in the kernel cache",
                 "store": "in the prebuilt store", "nvrtc": "compiled by NVRTC on the first call (about a second each)"}
        counts = [f"{origins.count(o)} {words[o]}" for o in words if o in origins]
        return f"kernel variants: {len(origins)} (" + ", ".join(counts) + ")"

    _repr_pretty_ = lambda self, p, cycle: p.text(str(self))  # noqa: E731  (IPython display)


_PLANS: Dict[tuple, Tuple[Plan, Explanation]] = {}
_PLANS_LIMIT = 4096
on_change(_PLANS.clear)


def select(problem: ConvProblem, device: DeviceInfo, forced: Optional[str] = None,
           strategy: Optional[str] = None, overrides: Optional[Overrides] = None) -> Tuple[Plan, Explanation]:
    """The plan that runs ``problem`` on ``device`` and its explanation (memoised).

    With ``forced`` (a kernel name) that kernel's plan is used if it makes one, else
    :class:`KernelDeclined` is raised with its reason. With ``strategy`` (conv3d on a GPU) only
    kernels implementing that strategy are asked; the others are listed as declined. ``overrides``
    defaults to those in force (:func:`cuconv.overrides`).
    """
    if overrides is None:
        overrides = current_overrides()
    key = (problem, device, forced, strategy, overrides)
    hit = _PLANS.get(key)
    if hit is None:
        hit = _select_uncached(problem, device, forced, strategy, overrides)
        if len(_PLANS) >= _PLANS_LIMIT:
            _PLANS.clear()
        _PLANS[key] = hit
    return hit


def _select_uncached(problem: ConvProblem, device: DeviceInfo, forced: Optional[str], strategy: Optional[str],
                     overrides: Overrides) -> Tuple[Plan, Explanation]:
    table = kernels()
    if forced is not None:
        k = next((k for k in table if k.name == forced), None)
        if k is None:
            raise ValueError(f"kernel: expected one of {[k.name for k in table]}, got {forced!r}")
        plan = k.plan(problem, device, overrides)
        if not plan:
            raise KernelDeclined(f"kernel: {forced!r} declines this problem: {plan.reason} ({problem.describe()})")
        return plan, Explanation(kernel=k.name, detail=plan.describe(), reason=plan.reason, problem=problem,
                                 device=device, plan=plan, overrides=overrides, forced=True)
    declined: Dict[str, str] = {}
    skipped: Dict[str, str] = {}
    chosen: Optional[Plan] = None
    for k in table:
        if strategy is not None and device.kind != "cpu" and k.strategy != strategy:
            declined[k.name] = f"implements strategy {k.strategy!r}, {strategy!r} was asked for"
            continue
        answer = k.plan(problem, device, overrides)
        if not answer:
            declined[k.name] = answer.reason
        elif (why := k.passes_over(answer)) is not None:
            declined[k.name] = f"runs it, but the automatic choice passes it over: {why} (kernel={k.name!r} forces it)"
        elif chosen is None:
            chosen = answer
        else:
            skipped[k.name] = f"would accept ({answer.reason}), lower priority than {chosen.kernel.name}"
    if chosen is None and strategy is not None:
        raise KernelDeclined(f"strategy: no {strategy!r} kernel supports this problem: {declined}")
    if chosen is None:  # CPU and CUDA have kernels for every problem; HIP has no fallback kernel
        raise KernelDeclined(f"no cuconv kernel serves {problem.describe()} on {device.describe()}: {declined}")
    return chosen, Explanation(kernel=chosen.kernel.name, detail=chosen.describe(), reason=chosen.reason,
                               problem=problem, device=device, plan=chosen, overrides=overrides, declined=declined,
                               skipped=skipped)
