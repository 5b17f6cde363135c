"""Compile the kernels of many convolutions at once, in parallel, before their first call.

The first call of a convolution whose kernel variant is not in the on-disk cache compiles it with
NVRTC (about a second for a Hopper variant). A forward pass meets its variants one layer at a time, so
a fresh environment pays them in series. :func:`precompile` takes the plans of a network's layers
(:func:`cuconv.plan_conv2d` / :func:`cuconv.plan_conv3d` objects, :func:`cuconv.explain` results or
kernel plans), collects the distinct variants they load (:func:`call_jobs`) and compiles them on a
pool of threads (NVRTC releases the GIL); the calls then find them in the cache.

>>> plans = [cuconv.plan_conv2d(x, w, padding=1) for x, w in layers]   # doctest: +SKIP
>>> cuconv.precompile(plans)                                             # doctest: +SKIP
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import Iterable, Optional

from .compiler import compile_cuda
from .layout import SOURCE as TRANSPOSE_SOURCE
from .plan import Plan
from .problem import LAYOUTS

__all__ = ["precompile", "call_jobs"]


def _kernel_plan(obj) -> Plan:
    """The kernel plan of a ConvPlan, an Explanation or a Plan."""
    plan = getattr(getattr(obj, "explanation", obj), "plan", obj)
    if not isinstance(plan, Plan):
        hint = getattr(obj, "precompile_note", "")  # an object that says why it cannot be precompiled
        raise TypeError(f"plans: expected cuconv.ConvPlan, cuconv.Explanation or cuconv.plan.Plan objects, "
                        f"got {type(obj).__name__}{'; ' + hint if hint else ''}")
    return plan


def call_jobs(plan: Plan) -> tuple:
    """The ``(source, defines)`` pairs a call of ``plan`` compiles: its kernel's (``Plan.compile_jobs``) and,
    for a channels-first call on a CUDA GPU whose kernel does not read both operands in that layout, the
    transpose kernel that moves them (:mod:`cuconv.layout`)."""
    jobs = tuple(plan.compile_jobs())
    if plan.device.kind == "cuda" and not LAYOUTS[plan.problem.layout][1] and not plan.reads_channels_first:
        jobs += ((TRANSPOSE_SOURCE, {}),)
    return jobs


def precompile(plans: Iterable, workers: Optional[int] = None) -> int:
    """Compile every kernel variant ``plans`` will load (those not cached yet) on ``workers`` threads
    (default: one per CPU, at most one per variant); return how many distinct variants there are.

    A variant already in the kernel cache is only checked there, and one the prebuilt store holds is read from
    it (:mod:`cuconv.prebuilt`). Nothing is loaded on the GPU."""
    jobs = {}
    for obj in plans:
        plan = _kernel_plan(obj)
        for source, defines in call_jobs(plan):
            key = (source, plan.device.arch, tuple(sorted(defines.items())))
            jobs.setdefault(key, (source, plan.device.arch, dict(defines)))
    if workers is not None and (not isinstance(workers, int) or isinstance(workers, bool) or workers < 1):
        raise ValueError(f"workers: expected a positive int or None, got {workers!r}")
    if not jobs:
        return 0
    n = min(len(jobs), workers or os.cpu_count() or 1)
    with ThreadPoolExecutor(max_workers=n) as pool:
        list(pool.map(lambda job: compile_cuda(*job), jobs.values()))
    return len(jobs)
