"""Measured choice of kernel and tile: ``with cuconv.autotune():``, as cuDNN's benchmark mode.

The automatic choice (:mod:`cuconv.dispatch`) follows rules measured on the benchmark's networks
(docs/tuning.md); a layer no rule was measured on may run faster on another tile or kernel. Under
autotune, the first call of each problem measures instead:

1. **Candidates.** The automatic choice; every other kernel that plans the problem (those the
   automatic choice passes over included); and variations one :class:`cuconv.Overrides` field at a
   time (tile width and height, halo tiles, ping-pong, split tail and split reduction, CTA pairs, how
   an NCHW ``x`` is read, the sm80 sub-path), first around the automatic choice's point, then around the
   fastest point of that round. Plans that come out the same are measured once; at most
   :data:`MAX_CANDIDATES` are.
2. **Operands.** Arrays of the problem's shapes, layout and dtype on its device, filled with random
   values: the caller's arrays are neither read nor written.
3. **Timing.** Each candidate runs as a call runs it (an NCHW call's operand moves included): once to
   load (the candidates' kernel variants are compiled in parallel first, :func:`cuconv.precompile`)
   and to check its result against the automatic choice's (within :data:`AGREEMENT`), then
   :data:`ROUNDS` rounds of calls back to back between CUDA events, each round queued behind memsets
   that keep the GPU busy while the host issues its calls (the GPU time, as in a forward pass whose
   host runs ahead; ``time.perf_counter`` on the CPU); its time is the median round, per call. The
   first candidate's rounds run once untimed first, to bring the GPU's clocks up.
4. **Choice.** The fastest, unless the automatic choice is within :data:`MARGIN` of it: a tie keeps
   the automatic choice, so tuning again gives the same answer.

A candidate that fails to plan, compile or run is left out, with its error in the record.
:func:`cuconv.explain` prints the record (``Explanation.tuning``). The decision holds for the process;
with ``path`` it is also written to a JSON file that later processes read instead of measuring, keyed
by the problem, the device (name, architecture, SM count) and the kernel sources' hash. A problem is
not measured while its stream captures a CUDA graph: the call raises, and one call before the capture
decides it.

>>> with cuconv.autotune(path="tuned.json"):                      # doctest: +SKIP
...     y = cuconv.conv2d(x, w, padding=1)        # measures this problem's candidates once
...     print(cuconv.explain(x, w, padding=1).tuning)
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import json
import math
import os
import threading
import time
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import numpy as np

from .overrides import SWITCHES, Overrides, _choices, overrides

__all__ = ["autotune", "Measured", "Tuning", "tuned_select", "forget", "MARGIN", "ROUNDS", "MAX_CANDIDATES"]

#: The automatic choice is kept unless the fastest candidate takes less than ``1 - MARGIN`` of its time.
MARGIN = 0.03
#: Timed rounds per candidate (the median is its time).
ROUNDS = 5
#: Candidates measured per problem at most (the automatic choice and the other kernels' own choices
#: first, then the variations).
MAX_CANDIDATES = 32
#: A round lasts about this long (calls back to back), between 1 and :data:`MAX_REPS` calls.
ROUND_SECONDS = 300e-6
MAX_REPS = 50
#: On a GPU each round starts behind memsets of a buffer this large, as many as cover the host's work
#: of issuing the round's calls (at most ``MAX_FILLS``).
HOLD_BYTES = 32 * 2 ** 20
MAX_FILLS = 400
#: The switches varied one at a time (``stacked_phases`` concerns gradients only; ``autotune`` is this one).
_VARIED_SWITCHES = tuple(s for s in SWITCHES if s not in ("stacked_phases", "autotune"))
_FILE_FORMAT = 1


@dataclass(frozen=True)
class Measured:
    """One candidate: its kernel, the overrides that make its plan (``name=value``, empty for the kernel's
    own choice), its plan's description, and its time per call in microseconds (None with ``error``)."""

    kernel: str
    overrides: str
    detail: str
    us: Optional[float]
    error: Optional[str] = None

    @property
    def label(self) -> str:
        """The kernel, with the overrides that make its plan in brackets where there are any."""
        return f"{self.kernel} [{self.overrides}]" if self.overrides else self.kernel

    def describe(self) -> str:
        when = _us(self.us) if self.error is None else f"failed: {self.error}"
        return f"{self.label}: {when} - {self.detail}"


@dataclass(frozen=True)
class Tuning:
    """What autotune measured for a problem (``Explanation.tuning``).

    ``chosen`` runs it; ``automatic`` is the dispatcher's own choice; ``candidates`` lists every
    candidate, fastest first, failures last. ``source`` is "measured" or the file the decision was read
    from (its candidates are then the two recorded)."""

    chosen: Measured
    automatic: Measured
    candidates: Tuple[Measured, ...]
    source: str = "measured"

    def describe(self) -> str:
        if self.chosen == self.automatic:
            n = len(self.candidates)
            head = (f"autotune: the automatic choice {self.automatic.kernel} ({_us(self.automatic.us)}) is the "
                    + ("only candidate" if n == 1 else f"fastest of {n} candidates, or within {MARGIN:.0%} of it"))
        else:
            head = (f"autotune: {self.chosen.label} {_us(self.chosen.us)} against the automatic choice "
                    f"{self.automatic.kernel}'s {_us(self.automatic.us)} ({len(self.candidates)} candidates)")
        where = "" if self.source == "measured" else f"; read from {self.source}"
        return "\n".join([head + where] + [f"  {m.describe()}" for m in self.candidates])

    __str__ = describe


# ---------------------------------------------------------------------------------------------- state

_PATH: contextvars.ContextVar = contextvars.ContextVar("cuconv_autotune_path", default=None)
_LOCK = threading.RLock()
#: Decisions of this process: key -> (kernel name, Overrides of the chosen point, Tuning).
_DECIDED: Dict[tuple, Tuple[str, Overrides, Tuning]] = {}
#: Files read: path -> {entry key: entry}.
_FILES: Dict[str, dict] = {}


@contextlib.contextmanager
def autotune(enabled: bool = True, *, path=None):
    """Inside the block, each new problem's first call measures its candidate kernels and tiles and runs the
    fastest (module :mod:`cuconv.autotune` says how); later calls of the problem run that choice.

    Parameters
    ----------
    enabled : bool
        False turns autotune off inside the block (within an outer block or under ``CUCONV_AUTOTUNE=1``).
    path : str or os.PathLike, optional
        A JSON file of decisions: read when a problem is first met (a decision found there is not
        measured again), and written with each new decision. Several processes may share one file;
        the last writer of an entry wins.

    The first call of a problem takes the time of its measurements (and of compiling every candidate's
    kernel variants that are not cached). ``CUCONV_AUTOTUNE=1`` turns autotune on for the whole process,
    and ``CUCONV_AUTOTUNE_FILE`` names the decision file of calls outside a block with ``path``. Yields the
    :class:`cuconv.Overrides` in force inside the block. The block holds for the calls its own thread (or
    async task) makes inside it, as :func:`cuconv.overrides` does: a dask graph computed after the block,
    or on other threads, follows ``CUCONV_AUTOTUNE`` instead.
    """
    if not isinstance(enabled, bool):
        raise TypeError(f"enabled: expected True or False, got {enabled!r}")
    if path is not None:
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"path: expected a file path (str or os.PathLike) or None, got {type(path).__name__}")
        path = os.path.abspath(os.fspath(path))
        if os.path.isdir(path):
            raise ValueError(f"path: expected a file, got the folder {path!r}")
    token = _PATH.set(path if path is not None else _PATH.get())
    try:
        with overrides(autotune=enabled) as value:
            yield value
    finally:
        _PATH.reset(token)


def _env_path() -> Optional[str]:
    """``$CUCONV_AUTOTUNE_FILE`` as an absolute path, or None where it is unset or empty."""
    raw = os.environ.get("CUCONV_AUTOTUNE_FILE", "").strip()
    return os.path.abspath(raw) if raw else None


def forget() -> None:
    """Drop the decisions this process measured or read (the files stay as they are): the next call of
    each problem under autotune measures again (or reads its file again)."""
    from .registry import _LISTENERS
    with _LOCK:
        _DECIDED.clear()
        _FILES.clear()
    for listener in _LISTENERS:  # the call memos keep tuned plans
        listener()


# ---------------------------------------------------------------------------------------------- choice

def tuned_select(problem, device, strategy, current: Overrides, run_call):
    """``(plan, explanation)`` of the fastest candidate for ``problem`` on ``device`` under the overrides
    ``current`` (whose ``autotune`` is set): decided once per process, from the file of the
    :func:`autotune` block when it has the decision, else measured. ``run_call(plan, xp, device_id, x, w,
    bias, residual, channels_first)`` runs a plan as a call does (:func:`cuconv.api.call_with_plan`)."""
    base = dataclasses.replace(current, autotune=None)
    key = (problem, device, strategy, base)
    path = _PATH.get() or _env_path()
    with _LOCK:
        hit = _DECIDED.get(key)
        if hit is None:
            hit = _from_file(path, problem, device, strategy, base) if path else None
            if hit is None:
                if _capturing(device):
                    raise RuntimeError(
                        f"autotune: {problem.describe()} has no decision yet, and its candidates cannot be "
                        f"measured while a CUDA graph is being captured: call it once before the capture "
                        f"(under autotune), or capture outside the autotune block")
                hit = _measure_problem(problem, device, strategy, base, run_call)
                if path:
                    _write_entry(path, problem, device, strategy, base, hit)
            _DECIDED[key] = hit
    name, point, tuning = hit
    return _explained(problem, device, strategy, base, name, point, tuning)


def _capturing(device) -> bool:
    """Whether the current stream of a GPU is capturing a CUDA graph (timing would break the capture)."""
    if device.kind == "cpu":
        return False
    import cupy
    try:
        return bool(cupy.cuda.get_current_stream().is_capturing())
    except Exception:  # noqa: BLE001  (a stream that cannot say is not capturing for our purpose)
        return False


def _explained(problem, device, strategy, base, name, point, tuning):
    """The plan of the decision and an explanation that says how it was reached: the automatic choice's
    declines, the chosen plan, and the measurements (``tuning``)."""
    from . import dispatch
    auto_plan, auto = dispatch.select(problem, device, strategy=strategy, overrides=base)
    tuned = dataclasses.replace(base, autotune=True)
    if name == auto.kernel and point == base:
        return auto_plan, dataclasses.replace(auto, overrides=tuned, declined=dict(auto.declined),
                                              skipped=dict(auto.skipped), tuning=tuning)
    plan, chosen = dispatch.select(problem, device, forced=name, strategy=strategy, overrides=point)
    if name == auto.kernel:
        skipped = dict(auto.skipped)
    else:
        skipped = {auto.kernel: (f"the automatic choice, {_us(tuning.automatic.us)} against "
                                 f"{_us(tuning.chosen.us)} measured for {name}")}
    return plan, dataclasses.replace(auto, kernel=chosen.kernel, detail=chosen.detail, reason=chosen.reason,
                                     plan=plan, overrides=tuned, declined=dict(auto.declined), skipped=skipped,
                                     tuning=tuning)


def _us(v: Optional[float]) -> str:
    return "? us" if v is None else f"{v:.1f} us"


def _variations(base: Overrides) -> List[Overrides]:
    """``base`` with one field it leaves automatic set to each value that field takes."""
    points = []
    choices = _choices()
    for name in tuple(choices) + _VARIED_SWITCHES:
        if getattr(base, name) is not None:
            continue  # the caller set it
        values = choices[name] if name in choices else (True, False)
        points += [dataclasses.replace(base, **{name: v}) for v in values if not (name == "cluster" and v == 1)]
    return points


def _changes(point: Overrides, base: Overrides) -> str:
    """The fields ``point`` sets that ``base`` does not, as ``name=value``."""
    return ", ".join(f"{f.name}={getattr(point, f.name)!r}" for f in dataclasses.fields(point)
                     if getattr(point, f.name) != getattr(base, f.name))


def _identity(kernel, plan) -> tuple:
    """What tells two plans apart: the kernel, the plan's class and description, the variants it loads."""
    from .precompile import call_jobs
    jobs = tuple((src, tuple(sorted(defs.items()))) for src, defs in call_jobs(plan))
    # a sub-path forced by an override says so in its description; the plan is the same
    return kernel.name, type(plan).__name__, plan.describe().replace(" (forced)", ""), jobs


def _plans_at(problem, device, strategy, point: Overrides):
    """``[(kernel, plan)]`` of every kernel that plans ``problem`` under ``point`` (highest priority first),
    and ``{kernel name: error}`` of those that raised."""
    from .dispatch import kernels
    found, errors = [], {}
    for k in kernels():
        if not k.autotune_candidate or (strategy is not None and device.kind != "cpu" and k.strategy != strategy):
            continue
        try:
            plan = k.plan(problem, device, point)
        except Exception as e:  # noqa: BLE001  (a candidate that cannot plan is left out, not the call)
            errors[k.name] = f"{type(e).__name__}: {e}"
            continue
        if plan:
            found.append((k, plan))
    return found, errors


class _Round:
    """The candidates met so far, by plan identity, and their times."""

    def __init__(self, problem, device, strategy, base, limit):
        self.problem, self.device, self.strategy, self.base, self.limit = problem, device, strategy, base, limit
        self.seen: Dict[tuple, dict] = {}
        self.order: List[dict] = []
        self.failed: Dict[str, dict] = {}  # kernel name -> its first candidate that failed to plan

    def add(self, point: Overrides) -> None:
        """Take the candidates new at ``point`` (up to the limit) and the first failure of each kernel."""
        found, errors = _plans_at(self.problem, self.device, self.strategy, point)
        for k, plan in found:
            if len(self.order) >= self.limit:
                break
            ident = _identity(k, plan)
            if ident in self.seen:
                continue
            c = dict(kernel=k.name, point=point, plan=plan, us=None, error=None)
            self.seen[ident] = c
            self.order.append(c)
        for name, error in errors.items():  # outside the limit
            self.failed.setdefault(name, dict(kernel=name, point=point, plan=None, us=None, error=error))


def _measure_problem(problem, device, strategy, base, run_call) -> Tuple[str, Overrides, Tuning]:
    from . import dispatch
    auto_plan, _ = dispatch.select(problem, device, strategy=strategy, overrides=base)
    rnd = _Round(problem, device, strategy, base, MAX_CANDIDATES)
    rnd.add(base)
    automatic = rnd.seen.get(_identity(auto_plan.kernel, auto_plan))
    if automatic is None:  # not among the plans made again (a kernel whose plans differ call to call)
        automatic = dict(kernel=auto_plan.kernel.name, point=base, plan=auto_plan, us=None, error=None)
        rnd.order.insert(0, automatic)
    for point in _variations(base):
        rnd.add(point)
    operands = _Operands(problem, device, run_call)
    _time_all([automatic] + [c for c in rnd.order if c is not automatic], operands)
    if automatic["us"] is None:
        raise RuntimeError(f"autotune: the automatic choice {automatic['kernel']} failed to run: {automatic['error']}")
    best = _fastest(rnd.order)
    if best is not None and best["point"] != base:
        # second round: around the fastest point, one more field at a time
        before = len(rnd.order)
        for point in _variations(best["point"]):
            rnd.add(point)
        _time_all(rnd.order[before:], operands)
        best = _fastest(rnd.order)
    chosen = best if best is not None and best["us"] < (1 - MARGIN) * automatic["us"] else automatic
    every = rnd.order + list(rnd.failed.values())
    records = {id(c): _record(c, base) for c in every}
    ranked = sorted(every, key=lambda c: (c["us"] is None, c["us"] or 0.0))
    tuning = Tuning(chosen=records[id(chosen)], automatic=records[id(automatic)],
                    candidates=tuple(records[id(c)] for c in ranked))
    return chosen["kernel"], chosen["point"], tuning


def _fastest(candidates) -> Optional[dict]:
    timed = [c for c in candidates if c["us"] is not None]
    return min(timed, key=lambda c: c["us"]) if timed else None


def _record(c: dict, base: Overrides) -> Measured:
    detail = c["plan"].describe() if c["plan"] is not None else ""
    return Measured(kernel=c["kernel"], overrides=_changes(c["point"], base), detail=detail, us=c["us"],
                    error=c["error"])


# ---------------------------------------------------------------------------------------------- timing

class _Operands:
    """Random operands of a problem in its own layout on its device (as a caller would pass them)."""

    def __init__(self, problem, device, run_call):
        from .problem import LAYOUTS
        self.problem, self.run_call = problem, run_call
        self.channels_first = not LAYOUTS[problem.layout][1]
        if device.kind == "cpu":
            self.xp, self.device_id = np, None
        else:
            import cupy
            self.xp, self.device_id = cupy, device.index
        self.reference = None
        self._hold_buffer, self._fill_seconds, self.fills = None, None, 8
        self.warm = False
        p = problem
        fan_in = p.channels_per_group * math.prod(p.filter_spatial)
        with self._on_device():
            self.x = self._random(self._user(p.x_shape))
            self.w = self._random(self._user(p.w_shape), 1.0 / math.sqrt(max(fan_in, 1)))
            self.bias = self._random((p.out_channels,)) if p.epilogue.has_bias else None
            self.residual = self._random(self._user(p.out_shape)) if p.epilogue.has_residual else None

    def _on_device(self):
        return contextlib.nullcontext() if self.device_id is None else self.xp.cuda.Device(self.device_id)

    def _user(self, native_shape):
        if not self.channels_first:
            return native_shape
        return (native_shape[0], native_shape[-1], *native_shape[1:-1])

    def _random(self, shape, scale=1.0):
        from .arrays import BFLOAT16
        dtype = BFLOAT16 if self.problem.dtype == "bfloat16" else np.dtype(self.problem.dtype)
        wide = np.float64 if dtype == np.float64 else np.float32
        if self.xp is np:
            values = np.random.default_rng(0).standard_normal(shape, dtype=wide)
        else:
            values = self.xp.random.standard_normal(shape, dtype=wide)
        return (values * scale).astype(dtype)

    def check(self, result) -> None:
        """Keep the first result as the reference; raise ValueError for a later one that differs from it
        by more than :data:`AGREEMENT` allows."""
        xp = self.xp
        if self.problem.dtype == "bfloat16":  # widened through its bits: exact, and no bfloat16 cast needed
            values = (result.view(xp.uint16).astype(xp.uint32) << 16).view(xp.float32)
        else:
            values = result.astype(xp.float64 if self.problem.precision == "float64" else xp.float32)
        if self.reference is None:
            self.reference = values
            return
        scale = float(xp.linalg.norm(self.reference.ravel()))
        error = float(xp.linalg.norm((values - self.reference).ravel())) / max(scale, 1e-30)
        bound = AGREEMENT[self.problem.precision]
        if not error <= bound:
            raise ValueError(f"its result differs from the automatic choice's by {error:.2e} (relative norm; "
                             f"at most {bound:.0e} allowed)")

    def runner(self, plan):
        """A function that runs ``plan`` on these operands as a call does."""
        return functools.partial(self.run_call, plan, self.xp, self.device_id, self.x, self.w, self.bias,
                                 self.residual, self.channels_first)

    def seconds(self, run, reps: int) -> float:
        """Time of ``reps`` calls of ``run`` back to back: on a GPU, the GPU time between two events, the
        queue held by memsets while the host issues the calls (so a layer shorter than its call's host
        work is timed by its GPU work, as in a forward pass whose host runs ahead)."""
        if self.xp is np:
            t0 = time.perf_counter()
            for _ in range(reps):
                run()
            return time.perf_counter() - t0
        xp = self.xp
        hold, fill_seconds = self._hold()
        for _ in range(self.fills):
            hold.fill(0)
        start, end = xp.cuda.Event(), xp.cuda.Event()
        start.record()
        t0 = time.perf_counter()
        for _ in range(reps):
            run()
        host = time.perf_counter() - t0
        end.record()
        end.synchronize()
        # the next rounds hold the queue for longer than this one's host work took
        self.fills = max(self.fills, min(MAX_FILLS, math.ceil(1.5 * host / fill_seconds)))
        return xp.cuda.get_elapsed_time(start, end) * 1e-3

    def _hold(self):
        """A buffer whose memsets hold the queue, and the seconds one takes (measured once)."""
        if self._hold_buffer is None:
            xp = self.xp
            self._hold_buffer = xp.empty(HOLD_BYTES, dtype=xp.uint8)
            start, end = xp.cuda.Event(), xp.cuda.Event()
            self._hold_buffer.fill(0)
            start.record()
            for _ in range(8):
                self._hold_buffer.fill(0)
            end.record()
            end.synchronize()
            self._fill_seconds = max(xp.cuda.get_elapsed_time(start, end) * 1e-3 / 8, 1e-6)
        return self._hold_buffer, self._fill_seconds


#: How far a candidate's result may be from the automatic choice's (relative norm of the difference),
#: by the precision both compute at: twice what each may differ from the exact result.
AGREEMENT = {"float16": 4e-3, "bfloat16": 3e-2, "tf32": 2e-2, "float32": 2e-4, "float64": 1e-10}


def _time_all(candidates, operands: _Operands) -> None:
    """Fill in ``us`` (or ``error``) of each candidate with a plan. The first result is the reference (the
    caller puts the automatic choice first); a candidate whose result is farther from it than
    :data:`AGREEMENT` allows is left out."""
    from .precompile import precompile
    plans = [c["plan"] for c in candidates if c["plan"] is not None]
    with operands._on_device():
        try:
            precompile(plans)
        except Exception:  # noqa: BLE001  (each candidate's own load below names its failure)
            pass
        for c in candidates:
            if c["plan"] is None:
                continue
            run = operands.runner(c["plan"])
            try:
                operands.check(run())  # compiles (if the cache missed), loads, and checks the result
                once = operands.seconds(run, 1)
                reps = max(1, min(MAX_REPS, int(ROUND_SECONDS / max(once, 1e-7))))
                if not operands.warm:  # the first candidate's rounds also bring the clocks up: once untimed
                    for _ in range(ROUNDS):
                        operands.seconds(run, reps)
                    operands.warm = True
                rounds = sorted(operands.seconds(run, reps) / reps for _ in range(ROUNDS))
            except Exception as e:  # noqa: BLE001  (a candidate that fails is left out, not the call)
                c["error"] = f"{type(e).__name__}: {e}"
                continue
            c["us"] = rounds[len(rounds) // 2] * 1e6


# ---------------------------------------------------------------------------------------------- files

@functools.lru_cache(maxsize=None)
def _sources_hash(kind: str) -> str:
    if kind not in ("cuda", "hip"):
        return ""
    from .compiler import tree_hash
    return tree_hash("cu" if kind == "cuda" else "hip")[:16]


def _entry_key(problem, device, strategy, base) -> str:
    return "|".join([repr(problem), f"{device.kind}:{device.name}:{device.arch}:{device.sm_count}", repr(strategy),
                     repr(base), _sources_hash(device.kind)])


def _read_file(path: str) -> dict:
    if path in _FILES:
        return _FILES[path]
    entries = {}
    if os.path.exists(path):
        try:
            with open(path) as f:
                data = json.load(f)
        except (OSError, ValueError) as e:
            raise ValueError(f"path: {path!r} is not an autotune file ({type(e).__name__}: {e})") from None
        if not isinstance(data, dict) or data.get("format") != _FILE_FORMAT or not isinstance(data.get("entries"), dict):
            raise ValueError(f"path: {path!r} is not an autotune file of format {_FILE_FORMAT}")
        entries = data["entries"]
    _FILES[path] = entries
    return entries


def _from_file(path, problem, device, strategy, base):
    """The decision ``path`` holds for the problem, re-planned, or None (absent, or its kernel no longer
    plans the problem)."""
    from . import dispatch
    from .plan import KernelDeclined
    entry = _read_file(path).get(_entry_key(problem, device, strategy, base))
    if entry is None:
        return None
    try:
        point = dataclasses.replace(base, **entry["overrides"])
        dispatch.select(problem, device, forced=entry["kernel"], strategy=strategy, overrides=point)
        auto_plan, _ = dispatch.select(problem, device, strategy=strategy, overrides=base)
    except (KernelDeclined, ValueError, TypeError, KeyError):
        return None
    chosen = Measured(entry["kernel"], _changes(point, base), entry.get("detail", ""), entry.get("us"))
    automatic = Measured(auto_plan.kernel.name, "", auto_plan.describe(), entry.get("automatic_us"))
    same = entry["kernel"] == automatic.kernel and point == base
    tuning = Tuning(chosen=automatic if same else chosen, automatic=automatic,
                    candidates=(automatic,) if same else (chosen, automatic), source=path)
    return entry["kernel"], point, tuning


def _write_entry(path, problem, device, strategy, base, decision) -> None:
    name, point, tuning = decision
    entries = _read_file(path)
    # the file may have gained entries from another process since it was read
    try:
        with open(path) as f:
            entries.update(json.load(f).get("entries", {}))
    except (OSError, ValueError, AttributeError):
        pass
    entries[_entry_key(problem, device, strategy, base)] = {
        "kernel": name, "overrides": {f.name: getattr(point, f.name) for f in dataclasses.fields(point)
                                      if getattr(point, f.name) != getattr(base, f.name)},
        "detail": tuning.chosen.detail, "us": tuning.chosen.us, "automatic_us": tuning.automatic.us,
        "candidates": len(tuning.candidates)}
    folder = os.path.dirname(path)
    os.makedirs(folder, exist_ok=True)
    tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
    with open(tmp, "w") as f:
        json.dump({"format": _FILE_FORMAT, "entries": entries}, f, indent=1, sort_keys=True)
    os.replace(tmp, path)
