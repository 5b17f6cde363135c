"""Gradients of the forward convolution, and transposed convolution: forward convolutions on rearranged
operands, and for the 2-D weight gradient a GEMM kernel of its own.

For a forward convolution ``y = conv(x, w)`` (any layout, stride ``s``, dilation ``d``, padding
``(lo, hi)`` per dim, groups), with the output gradient ``dy``:

* **input gradient** ``dx[n, i, c] = sum over k, f, o with i = o s - lo + f d of dy[n, o, k] w[k, f, c]``,
  split by output phase: the positions ``i = phi + s t`` (one ``phi < s`` per dim) are reached only by
  the taps ``f`` with ``s | phi + lo - f d``, which step through ``dy`` by ``d / gcd(s, d)``, so each
  phase is one stride-1 forward convolution of (a slice of) ``dy`` with those taps flipped and the
  filter's K and C axes exchanged within each group (:func:`_phases`): ``s^nd`` calls for a stride
  ``s``, none of them multiplying zeros, each writing its phase of ``dx``. Or, on a GPU with groups 1 (on the
  CPU only under ``overrides(stacked_phases=True)``), the phases stacked along the channels and
  computed by one forward convolution (:mod:`cuconv.subpixel`: its filter gathered from ``w``, zero where a phase has
  no tap), then put into place. On Hopper the convolution's epilogue stores the phases into place itself, and
  the convolution reads its filter (flipped or stacked) from ``w`` as it is, with no flip or gather launch,
  where its tiles allow (:mod:`cuconv.backends.sm90.phase_scatter`).
* **weight gradient** ``dw[k, f, c] = sum over n, o of dy[n, o, k] x[n, o s - lo + f d, c]``: on CuPy
  fp16 / bf16 2-D data one implicit GEMM over the output pixels, split across CTAs and summed in split
  order (``sm90_wgrad`` / ``sm80_wgrad``, :data:`WGRAD_KERNELS`); otherwise a forward convolution whose
  "batch" is the channels of x and whose "channels" are the images: x as ``(C, I, N)`` against ``dy``
  as a ``(K, O, N)`` filter, stride ``d``, dilation ``s``, padding ``lo`` in front (and enough behind
  to reach ``F`` outputs), the first ``F`` outputs kept, one call per group.
* **transposed convolution** ``conv_transpose(x, w)`` is the input gradient of the forward convolution
  with weight ``w`` whose output has x's shape, with the epilogue ``act(alpha * . + bias + beta * C)``
  fused into that forward call. Its output extent per dim is
  ``(I - 1) s - lo - hi + (F - 1) d + output_padding + 1`` (torch's ``conv_transpose`` with
  ``padding=p`` is ``lo = hi = p``).

Every forward convolution is validated and dispatched as :func:`cuconv.conv2d` / :func:`cuconv.conv3d`
would (once per geometry for the input gradient's phases), so each runs on the kernel the dispatcher
picks for it (NumPy: the CPU kernel, in float64 for float64 data) and ``kernel=`` / ``precision=``
apply to it. A phase no tap reaches (a dilation sharing a factor with the stride) gets the epilogue of
zero. The results are deterministic (a fixed order of every sum). Arrays in the caller's layout go in
and come out; channels-first operands are moved to channels-last for the computation.
:func:`explain_input_grad`, :func:`explain_weight_grad` and :func:`explain_transpose` say what runs.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from dataclasses import dataclass
from typing import Sequence, Tuple

import numpy as np

from . import subpixel
from .api import _SCALAR_TYPES, NO_KEY, _keyed_type, _operand_key, exact_key, execute
from .arrays import as_array, check_companion, check_same_place, dtype_name, meets, on_device_of, ranges_meet
from .layout import flip_filter, flip_taps, scatter_phase, to_channels_first, to_channels_last
from .problem import LAYOUTS, normalize_spatial
from .registry import on_change
from .scratch import scratch
from .overrides import active_overrides, current_overrides, on_environment_read
from .plan import KernelDeclined
from .validate import activation_of, check_ranks, layout_of, precision_of

__all__ = ["conv2d_input_grad", "conv3d_input_grad", "conv2d_weight_grad", "conv3d_weight_grad",
           "conv_transpose2d", "conv_transpose3d", "conv_transpose_output_shape", "explain_input_grad",
           "explain_weight_grad", "explain_transpose", "GradExplanation"]


# ------------------------------------------------------------------------------------------ helpers
def _xp(a):
    if isinstance(a, np.ndarray):
        return np
    import cupy
    return cupy


def _forward_fn(nd: int):
    from .api import conv2d, conv3d
    return conv2d if nd == 2 else conv3d


def _shape(value, name: str, nd: int) -> Tuple[int, ...]:
    """A full array shape given by the caller (``x_shape`` / ``w_shape``): ``nd + 2`` ints."""
    try:
        shape = tuple(int(v) for v in value)
    except TypeError:
        raise TypeError(f"{name}: expected a sequence of {nd + 2} ints, got {value!r}") from None
    if len(shape) != nd + 2 or any(isinstance(v, bool) for v in value):
        raise ValueError(f"{name}: expected {nd + 2} ints, got {value!r}")
    return shape


def _forward_problem(nd, x_shape, w_shape, dtype, layout, stride, padding, dilation, groups, precision):
    """The forward convolution being differentiated, validated (its padding resolved); memoised on
    hashable arguments."""
    args = (nd, tuple(x_shape), tuple(w_shape), dtype, layout, stride, padding, dilation, groups, precision)
    key = _hashable(args)
    return _forward_problem_cached(*key) if key is not None else _validated_problem(*args)


def _validated_problem(nd, x_shape, w_shape, dtype, layout, stride, padding, dilation, groups, precision):
    from .validate import conv_problem
    return conv_problem(nd, x_shape, w_shape, dtype, layout, stride, padding, dilation, groups, 1.0, 1.0,
                        False, False, None, precision)


_forward_problem_cached = functools.lru_cache(maxsize=512)(_validated_problem)


def _last(a, channels_first: bool, xp):
    """``a`` channels-last and contiguous (an activation ``(N, C, ...)`` or a weight ``(K, C/g, ...)``):
    :func:`cuconv.layout.to_channels_last` into a new array."""
    return to_channels_last(a, channels_first, xp)


def _first(a, channels_first: bool, xp):
    """A channels-last result back in the caller's layout (contiguous)."""
    return to_channels_first(a, xp) if channels_first else a


def _user_out_shape(p, layout: str) -> Tuple[int, ...]:
    shape = p.out_shape
    return tuple(shape) if LAYOUTS[layout][1] else (shape[0], shape[-1], *shape[1:-1])


# ------------------------------------------------------------------------------------------ input gradient
def _phases(I: int, F: int, O: int, s: int, d: int, lo: int):
    """The input gradient along one axis, split by output phase: for each ``phi < s`` (positions
    ``phi + s t``), ``(phi, T, spec)`` with ``T`` the phase's positions and ``spec`` None when no tap
    reaches them (or no ``dy`` entry does), else the stride-1 convolution that computes them:

    ``dx[phi + s t] = sum_j dy[t + b + j r] w[taps[j]]``, the taps ``f`` with ``s | phi + lo - f d`` in
    reverse order (``flip``, a slice of the filter axis: they step by ``s / gcd(s, d)``, their ``dy``
    offsets by ``r = d / gcd(s, d)``), ``dy``
    read from ``b`` on: the slice ``src`` of ``dy`` with zero padding ``pad`` (lo, hi) in front of and
    behind it, so that the convolution (dilation ``r``, no stride) has exactly ``T`` outputs."""
    r = d // math.gcd(s, d)
    out = []
    for phi in range(min(s, I)):
        T = -(-(I - phi) // s)
        taps = [f for f in range(F) if (phi + lo - f * d) % s == 0]
        if not taps:
            out.append((phi, T, None))
            continue
        b = (phi + lo - taps[0] * d) // s - (len(taps) - 1) * r
        length = T + (len(taps) - 1) * r
        lo_pad, start, stop = max(0, -b), max(0, b), min(O, b + length)
        if stop <= start:
            out.append((phi, T, None))
            continue
        step = s // math.gcd(s, d)  # the taps in reverse order, as a slice of the filter axis
        flip = slice(taps[-1], taps[0] - step if taps[0] >= step else None, -step)
        out.append((phi, T, dict(flip=flip, dil=r,
                                 pad=(lo_pad, length - lo_pad - (stop - start)), src=slice(start, stop))))
    return out


def _hashable(v):
    """``v`` with its lists made tuples (a memo key), or None where something is not hashable."""
    if isinstance(v, (list, tuple)):
        items = tuple(_hashable(u) for u in v)
        return None if any(u is None for u in items) else items
    try:
        hash(v)
    except TypeError:
        return None
    return v


@dataclass(frozen=True)
class _InputPlan:
    """The input gradient of one geometry: the forward problem and, per output phase, where its
    positions are in dx (``where``), and None (no tap reaches them: ``shape`` is theirs) or the
    forward call computing them: ``src`` (the slice of dy; ``src_full`` when it is all of dy),
    ``flips`` (the flipped taps of each filter axis, :func:`cuconv.layout.flip_taps`), ``pad``,
    ``dil``, ``out`` (the phase's extent) and ``origin`` (its first position in dx)."""

    problem: object
    phases: tuple
    #: The stacked-phase convolution (:mod:`cuconv.subpixel`) that computes every phase at once, where it
    #: applies (strides, groups 1); None otherwise.
    subpixel: object = None
    #: Its aligned form (``subpixel.geometry(p, aligned=True)``), where a phase of it is shifted: on Hopper
    #: the direct plan takes it where its tiles skip the window taps their phase has none at
    #: (:func:`_aligned_direct`); None otherwise.
    aligned: object = None


def _input_plan_of(*args):
    """``(key, plan)``: the :class:`_InputPlan` of ``(nd, x_shape, w_shape, dtype, layout, stride, padding,
    dilation, groups, precision)``, memoised where the arguments make a key (``key`` None otherwise)."""
    key = _hashable(args)
    return key, (_input_plan_cached(*key) if key is not None else _input_plan(*args))


@functools.lru_cache(maxsize=512)
def _input_plan_cached(nd, x_shape, w_shape, dtype, layout, stride, padding, dilation, groups, precision):
    return _input_plan(nd, x_shape, w_shape, dtype, layout, stride, padding, dilation, groups, precision)


def _input_plan(nd, x_shape, w_shape, dtype, layout, stride, padding, dilation, groups, precision) -> _InputPlan:
    p = _forward_problem(nd, x_shape, w_shape, dtype, layout, stride, padding, dilation, groups, precision)
    I, F, O = p.in_spatial, p.filter_spatial, p.out_spatial
    axes = [_phases(i, f, o, s, d, lo) for i, f, o, s, d, lo in zip(I, F, O, p.stride, p.dilation, p.pad_lo)]
    phases = []
    for combo in itertools.product(*axes):
        where = (slice(None),) + tuple(slice(phi, None, s) for (phi, _, _), s in zip(combo, p.stride)) + (slice(None),)
        specs = [spec for _, _, spec in combo]
        if any(spec is None for spec in specs):
            phases.append((where, None, (x_shape[0], *(T for _, T, _ in combo), p.channels)))
            continue
        flips = flip_taps(F, [sp["flip"] for sp in specs])
        full = all(sp["src"] == slice(0, o) for sp, o in zip(specs, O))
        phases.append((where, dict(out=tuple(T for _, T, _ in combo), flips=flips, src_full=full,
                                   origin=tuple(sl.start for sl in where[1:-1]),
                                   src=(slice(None),) + tuple(sp["src"] for sp in specs) + (slice(None),),
                                   pad=tuple(sp["pad"] for sp in specs),
                                   dil=tuple(sp["dil"] for sp in specs)), None))
    sp = subpixel.geometry(p)
    return _InputPlan(p, tuple(phases), sp, None if sp is None else subpixel.geometry(p, aligned=True))


class _KnownInput:
    """An input-gradient call validated before (:data:`_GRAD_CALLS`): its :class:`_InputPlan`, the key its
    forward plans are kept under (:func:`_phase_plan`), whether it is channels-first, and its
    :mod:`cuconv.grad_replay` replay (None until its first call ran; False where it has none)."""

    __slots__ = ("plan", "memo", "cf", "replay")

    def __init__(self, plan, memo, cf):
        self.plan, self.memo, self.cf, self.replay = plan, memo, cf, None


#: Input-gradient calls already validated, by :func:`_call_key`: :class:`_KnownInput`.
_GRAD_CALLS: dict = {}
_GRAD_CALLS_LIMIT = 1024
on_change(_GRAD_CALLS.clear)  # their replays hold forward plans
on_environment_read(_GRAD_CALLS.clear)  # keyed by the overrides block in force, not the environment's


def _call_key(nd, dy, w, x_shape, stride, padding, dilation, groups, layout, kernel, precision, ep, out, base=None):
    """A key fixing everything :func:`_validated_input` decides for a call, or None where the call has
    arguments it cannot vouch for (the full path then runs every time): operands by shape, strides,
    dtype and device, the other arguments as :func:`cuconv.api.exact_key` values, scalars by type and
    value, and the :func:`cuconv.overrides` block in force (:func:`cuconv.overrides.active_overrides`).
    ``base``: a caller's key that already fixes dy, w and the geometry (:func:`_transpose`)."""
    tx = type(dy)
    if base is None:
        if _keyed_type(dy) is None:
            return None
        args = exact_key((nd, x_shape, stride, padding, dilation, groups, layout))
        if args is NO_KEY:
            return None
    alpha, beta, act = ep["alpha"], ep["beta"], ep["activation"]
    rest = exact_key((kernel, precision, act))
    if type(alpha) not in _SCALAR_TYPES or type(beta) not in _SCALAR_TYPES or rest is NO_KEY:
        return None
    if out is not None and tx is np.ndarray and not out.flags.writeable:
        return None
    try:
        if base is None:
            base = (tx, _operand_key(dy, tx), _operand_key(w, tx), args)
        return (base, _operand_key(ep["bias"], tx), _operand_key(ep["residual"], tx), _operand_key(out, tx), rest,
                alpha, type(alpha), beta, type(beta), active_overrides())
    except KeyError:
        return None


def _validated_input(nd, dy, w, x_shape, stride, padding, dilation, groups, layout, kernel, precision, ep, out):
    """Validate an input-gradient call (every argument, named in its error): its :class:`_KnownInput`."""
    layout = layout_of(layout, nd)
    cf = not LAYOUTS[layout][1]
    dy = as_array(dy, "dy")
    w = as_array(w, "w")
    check_same_place(w, "w", dy, "dy")
    dtype = dtype_name(dy, "dy")
    if dtype_name(w, "w") != dtype:
        raise TypeError(f"w: expected dtype {dtype} like dy, got {dtype_name(w, 'w')}")
    if w.ndim != nd + 2:
        raise ValueError(f"w: expected a {nd + 2}-D array, got {w.ndim}-D with shape {tuple(w.shape)}")
    x_shape = _shape(x_shape, "x_shape", nd)
    key, plan = _input_plan_of(nd, x_shape, tuple(w.shape), dtype, layout, stride, padding, dilation, groups,
                               precision_of(precision, dtype))
    want = (x_shape[0], *_user_out_shape(plan.problem, layout)[1:])
    if tuple(dy.shape) != want:
        raise ValueError(f"dy: expected shape {want} (the output of the forward convolution of x_shape "
                         f"{x_shape} with w {tuple(w.shape)}, {layout}), got {tuple(dy.shape)}")
    xp = _xp(dy)
    for name, v in (("residual", ep["residual"]), ("out", out)):
        if v is not None:
            v = as_array(v, name)
            check_companion(v, name, x_shape, dtype, dy, "x")
            if name == "out" and xp is np and not v.flags.writeable:
                raise ValueError("out: expected a writeable array, got a read-only one")
    if ep["bias"] is not None:
        check_companion(as_array(ep["bias"], "bias"), "bias", (plan.problem.channels,), dtype, dy, "x")
    activation_of(ep["activation"])
    memo = None if key is None else (key, type(dy), None if xp is np else dy.data.device_id, ep["bias"] is not None,
                                     ep["residual"] is not None, ep["alpha"], type(ep["alpha"]), ep["beta"],
                                     type(ep["beta"]), ep["activation"], kernel, current_overrides())
    return _KnownInput(plan, memo, cf)


@on_device_of(1)
def _input_grad(nd, dy, w, x_shape, stride, padding, dilation, groups, layout, kernel, precision,
                epilogue=None, out=None, base_key=None):
    """The input gradient (module docstring), computed channels-last; ``epilogue``: the keywords
    (bias, residual, alpha, beta, activation) fused into the forward calls (transposed convolution),
    ``out`` where to write. ``residual`` and ``out`` have ``x_shape``, in ``layout``. A call whose
    :func:`_call_key` was validated before skips validation and planning (``base_key``: see there)."""
    ep = {**dict(bias=None, residual=None, alpha=1.0, beta=1.0, activation=None), **(epilogue or {})}
    key = _call_key(nd, dy, w, x_shape, stride, padding, dilation, groups, layout, kernel, precision, ep, out,
                    base_key)
    known = None if key is None else _GRAD_CALLS.get(key)
    if known is None:
        known = _validated_input(nd, dy, w, x_shape, stride, padding, dilation, groups, layout, kernel, precision,
                                 ep, out)
        if key is not None:
            if len(_GRAD_CALLS) >= _GRAD_CALLS_LIMIT:
                _GRAD_CALLS.clear()
            _GRAD_CALLS[key] = known
    elif known.replay and (out is None or not ranges_meet(out, (dy, w, ep["bias"]))):
        # the key fixes CuPy operands, channels-last and contiguous: only launches remain
        y = known.replay(dy, w, ep["bias"], out)
        if y is not None:
            return y
    else:  # the operands are arrays of the kinds the key holds; only their conversion remains
        dy, w = as_array(dy, "dy"), as_array(w, "w")
    plan, memo, cf = known.plan, known.memo, known.cf
    p, xp = plan.problem, _xp(dy)
    dy_n, w_n = _last(dy, cf, xp), _last(w, cf, xp)
    N, I, C = dy.shape[0], p.in_spatial, p.channels
    residual, bias = ep["residual"], ep["bias"]
    if residual is not None:
        residual = _last(as_array(residual, "residual"), cf, xp)  # read before out is written (cf: a copy)
    if out is not None:
        out = as_array(out, "out")
    if bias is not None:
        bias = as_array(bias, "bias")
        bias = bias if bias.flags.c_contiguous else xp.ascontiguousarray(bias)
    dtype = p.dtype
    # the caller's array, where it is channels-last and shares no memory with what the convolutions read
    into = out if out is not None and not cf and not meets(xp, out, (dy_n, w_n, bias)) else None
    if _stacks(plan, xp is not np):
        y = into if into is not None else xp.empty((N, *I, C), dtype=dy_n.dtype)
        _stacked(plan, xp, dy_n, w_n, ep, bias, residual, y, memo, nd, kernel, precision)
    else:
        y = _phase_split(plan, xp, dy_n, w_n, ep, bias, residual, into, memo, nd, kernel, precision, dtype)
    if known.replay is None and key is not None:
        known.replay = _input_replay(plan, memo, ep, dy, w, bias, out, y, cf) or False
    if out is None:
        return _first(y, cf, xp)
    if cf:
        to_channels_first(y, xp, out)
    elif y is not out:
        out[...] = y
    return out


def _phase_split(plan, xp, dy_n, w_n, ep, bias, residual, into, memo, nd, kernel, precision, dtype: str):
    """The input gradient (channels-last) phase by phase: per phase the flipped taps, its forward call, its
    rows put into place (on Hopper by the call's epilogue, and with ``w`` read as it is where the tiles allow);
    phases no tap reaches get the epilogue of zero. Into ``into`` where given, else a new array; returns it."""
    p = plan.problem
    N, I, C, g = dy_n.shape[0], p.in_spatial, p.channels, p.groups
    plain = ep["bias"] is None and residual is None and ep["activation"] is None
    zeros = plain and any(spec is None for _, spec, _ in plan.phases)
    if into is not None:
        y = into
        if zeros:
            y.fill(0)
    else:  # phases no tap reaches are zeros without an epilogue: one fill of the whole result
        y = (xp.zeros if zeros else xp.empty)((N, *I, C), dtype=dy_n.dtype)
    whole = len(plan.phases) == 1  # stride 1: the one phase is written straight into y
    for i, (where, spec, zero_shape) in enumerate(plan.phases):
        res_part = None if residual is None else (residual if whole else xp.ascontiguousarray(residual[where]))
        if spec is None:  # no tap reaches these positions: the epilogue of zero
            if not zeros:
                y[where] = _epilogue_of_zero(xp, ep, res_part, zero_shape, dtype)
            continue
        src = dy_n if spec["src_full"] else xp.ascontiguousarray(dy_n[spec["src"]])
        device_id = None if xp is np else src.data.device_id
        direct_ok = xp is not np and res_part is None and w_n.flags.c_contiguous and p.groups == 1
        direct = _known_variant(memo, "direct", i) if direct_ok else None
        if direct is not None:  # (made by an earlier call) no flip: the convolution reads w and writes y
            execute(direct, xp, device_id, src, w_n, bias, None, y)
            continue
        wt = flip_filter(w_n, None, g, xp, spec["flips"])
        part = y if whole else xp.empty((N, *spec["out"], C), dtype=dy_n.dtype)
        fplan = _phase_plan(memo, i, nd, src, wt, ep, res_part, part, g, spec, kernel, precision)
        scatter = None if whole or xp is np else _kept_variant(memo, "scatter", i,
                                                               lambda: _one_phase_scatter(fplan, p, spec))
        into_y = fplan if whole and res_part is None else scatter  # a plan writing y itself
        direct = _kept_variant(memo, "direct", i, lambda: _direct_filter(into_y, _flipped_view(w_n.shape, spec))) \
            if direct_ok and into_y else None
        if direct is not None:  # every call runs it (the same bits each time); this one's flip goes unused
            execute(direct, xp, device_id, src, w_n, bias, None, y)
            continue
        if scatter is not None:  # the epilogue stores the phase into y
            execute(scatter, xp, device_id, src, wt, bias, None, y)
            continue
        execute(fplan, xp, device_id, src, wt, bias, res_part, part)
        if not whole:
            scatter_phase(part, y, p.stride, spec["origin"], xp)
    return y


def _known_variant(memo, kind: str, which):
    """The Hopper plan variant :func:`_kept_variant` keeps for this call, where an earlier call made one."""
    return None if memo is None else (_PHASE_PLANS.get((memo, kind, which)) or None)


def _kept_variant(memo, kind: str, which, make):
    """A Hopper plan variant of an input gradient's convolution (:mod:`cuconv.backends.sm90.phase_scatter`:
    ``kind`` "scatter", storing phases into place in dx, or "direct", reading the filter straight from w),
    from ``make()`` (``(plan or None, why)``) on the first call with this ``memo`` key and ``which`` (a
    phase of the split, or "stacked"), then kept with the call's forward plans; or None."""
    key = (memo, kind, which)
    plan = None if memo is None else _PHASE_PLANS.get(key)
    if plan is None:
        plan = make()[0] or False
        if memo is not None:
            _PHASE_PLANS[key] = plan
    return plan or None


def _direct_filter(fplan, mn):
    """``(plan, why)`` of an input gradient's convolution ``fplan`` reading its filter from w itself as the
    view ``mn`` says (:func:`_flipped_view`, :func:`_stacked_view`)."""
    from .backends.sm90.phase_scatter import direct_filter
    return direct_filter(fplan, mn)


def _flipped_view(w_shape, spec):
    """How a phase's convolution (``spec``: :func:`_phases`) reads its flipped taps from a weight of
    ``w_shape`` (channels-last, groups 1) MN-major."""
    from .backends.sm90.phase_scatter import flipped_view
    return flipped_view(tuple(w_shape), spec["flips"])


def _stacked_view(sp, w_shape):
    """How the stacked-phase convolution of ``sp`` reads its taps from a weight of ``w_shape`` MN-major."""
    from .backends.sm90.phase_scatter import stacked_view
    return stacked_view(sp, tuple(w_shape))


def _known_direct_stacked(memo):
    """The direct plan of the stacked phases kept for this call (the aligned form's where it was taken)."""
    return _known_variant(memo, "direct", "aligned") or _known_variant(memo, "direct", "stacked")


def _tries_aligned(plan, direct) -> bool:
    """Whether the aligned form of ``plan``'s stacked convolution is tried (on a GPU, with the direct filter
    allowed: ``direct`` is the shifted form's direct plan, None where it has none, False where no direct
    plan is allowed): where it exists and the shifted form does not run on halo tiles, which share one
    window among every tap and so never skip one."""
    return (plan.aligned is not None and direct is not False and (direct is None or not direct.cfg.halo)
            and _aligned_width(plan.problem.channels) is not None)


def _aligned_direct(fplan, spa, C: int, w_shape):
    """``(plan, how)``: the aligned stacked convolution ``fplan`` (the dispatcher's plan of it on im2col
    tiles) storing its phases into dx and reading its taps from w, where each tile lies in one phase (so
    it skips the window taps its phase has none at: docs/tuning.md T-dead-taps), and how (for the
    explanation); or ``(None, why not)``."""
    scatter, stores = _scatter_of(fplan, spa, C)  # (its width is forced: kept)
    if scatter is None:
        return None, stores
    direct, reads = _direct_filter(scatter, _stacked_view(spa, w_shape))
    if direct is None:
        return None, reads
    if direct.cfg.halo:
        return None, "halo tiles (they multiply every window tap)"
    if C % direct.cfg.block_n:
        return None, (f"its {direct.cfg.block_n}-column tiles span phases of {C} channels (a tile multiplies "
                      f"the window taps of every phase it holds)")
    if direct.cfg.split_tiles:
        return None, (f"its {direct.cfg.num_tiles} tiles would be split along the reduction, whose parts do not "
                      f"share the skipped window taps evenly")
    return direct, f"{stores}, no unstack pass; {reads}"


#: The tile width of the aligned form (docs/tuning.md T-aligned-phases): 128 x 256 tiles of one phase each,
#: where the phases' channels are a multiple of it. On the grad suite's shapes the aligned form was faster
#: on those tiles only; with 64- or 128-column tiles of one phase the shifted form's tiles were as fast or
#: faster.
ALIGNED_BLOCK_N = 256


def _aligned_width(C: int):
    """The tile width the aligned form of phases of ``C`` channels runs at (a forced ``block_n`` where it
    divides C and is whole 64-column blocks), or None where it is not taken."""
    forced = current_overrides().block_n
    width = ALIGNED_BLOCK_N if forced is None else forced
    return width if C % width == 0 and width % 64 == 0 else None


def _planned_aligned(plan_with, C: int):
    """The dispatcher's plan of the aligned stacked convolution by ``plan_with()``, on im2col tiles of
    :func:`_aligned_width` columns."""
    from .overrides import overrides
    with overrides(halo=False, block_n=_aligned_width(C)):
        return plan_with()


def _plan_aligned(memo, nd, spa, dy_n, w_n, ep, kernel, precision):
    """``(plan, why)`` of :func:`_aligned_direct` for a call (:func:`_planned_aligned`), made from scratch
    operands of the aligned convolution's shapes (the plan is only made from them: the direct plan reads
    dy and w)."""
    C = w_n.shape[-1]
    wt = scratch("aligned stacked filter (shape)", subpixel.stacked_filter_shape(spa, w_n.shape), dy_n.dtype)
    z = scratch("aligned stacked phases (shape)", (dy_n.shape[0], *spa.length, spa.phases * C), dy_n.dtype)
    fplan = _planned_aligned(lambda: _phase_plan(memo, "aligned", nd, dy_n, wt, ep, None, z, 1,
                                                 dict(pad=spa.pad, dil=1), kernel, precision), C)
    return _aligned_direct(fplan, spa, C, w_n.shape)


def _one_phase_scatter(fplan, p, spec):
    """``(plan, why)`` of one phase's convolution ``fplan`` storing its rows at their positions in dx."""
    from .backends.sm90.phase_scatter import scatter_plan
    return scatter_plan(fplan, p.channels, p.in_spatial, p.stride, (spec["origin"],))


def _stacks(plan, on_gpu: bool) -> bool:
    """Whether the input gradient of ``plan`` runs as the stacked-phase convolution: where it applies, on a
    GPU unless ``overrides(stacked_phases=False)`` says otherwise, on the CPU only where
    ``overrides(stacked_phases=True)`` asks for it (docs/tuning.md T-stacked-phases)."""
    asked = current_overrides().stacked_phases
    return plan.subpixel is not None and (on_gpu if asked is None else asked)


def _stacked(plan, xp, dy_n, w_n, ep, bias, residual, y, memo, nd, kernel, precision) -> None:
    """The input gradient into ``y`` (channels-last) as one convolution over the stacked phases
    (:mod:`cuconv.subpixel`): the filter gathered, the bias repeated and the residual stacked per phase,
    the forward call, the phases put into place (on Hopper by the call's epilogue, with no gather where the
    convolution reads its taps from ``w`` itself: :mod:`cuconv.backends.sm90.phase_scatter`)."""
    sp, C = plan.subpixel, plan.problem.channels
    P = sp.phases
    device_id = None if xp is np else dy_n.data.device_id
    b = None if bias is None else subpixel.stacked_bias(sp, bias, xp, None if xp is np else "stacked-phase bias")
    # W' is w read MN-major, per phase and window tap the filter tap (or zeros)
    direct_ok = xp is not np and residual is None and w_n.flags.c_contiguous
    direct = _known_direct_stacked(memo) if direct_ok else None
    if direct is not None:  # (made by an earlier call) no gather: the convolution reads w and stores into y
        execute(direct, xp, device_id, dy_n, w_n, b, None, y)
        return
    # W' and z live until the put-into-place launch: per-stream scratch buffers on a GPU
    wt = subpixel.stacked_filter(sp, w_n, xp, "stacked-phase filter")
    z_shape = (dy_n.shape[0], *sp.length, P * C)
    z = xp.empty(z_shape, dtype=dy_n.dtype) if xp is np else scratch("stacked phases", z_shape, dy_n.dtype)
    res_z = None
    if residual is not None:
        res_z = xp.empty_like(z)
        subpixel.stack(sp, residual, res_z, xp)
    spec = dict(pad=sp.pad, dil=1)
    fplan = _phase_plan(memo, "stacked", nd, dy_n, wt, dict(ep, bias=b), res_z, z, 1, spec, kernel, precision)
    scatter = None if xp is np else _kept_variant(memo, "scatter", "stacked", lambda: _scatter_of(fplan, sp, C))
    direct = _kept_variant(memo, "direct", "stacked", lambda: _direct_filter(scatter, _stacked_view(sp, w_n.shape))) \
        if direct_ok and scatter else None
    if scatter and _tries_aligned(plan, direct if direct_ok else False):
        aligned = _kept_variant(memo, "direct", "aligned",
                                lambda: _plan_aligned(memo, nd, plan.aligned, dy_n, w_n, dict(ep, bias=b), kernel,
                                                      precision))
        direct = aligned or direct
    if direct is not None:  # every call runs it (the same bits each time); this one's gather goes unused
        execute(direct, xp, device_id, dy_n, w_n, b, None, y)
        return
    if scatter is not None:  # the epilogue stores the phases into y: no z, no unstack
        execute(scatter, xp, device_id, dy_n, wt, b, None, y)
        return
    execute(fplan, xp, device_id, dy_n, wt, b, res_z, z)
    subpixel.unstack(sp, z, y, xp)


def _input_replay(plan, memo, ep, dy, w, bias, out, y, cf):
    """The :mod:`cuconv.grad_replay` replay of an input-gradient call that just ran (its forward plans are
    made), or None where the call has none: only CuPy operands, channels-last and contiguous (dy, w, the
    bias, ``out``), no residual, a non-empty result; the stacked-phase convolution, the stride-1
    convolution, or one phase with taps and zeros elsewhere without an epilogue."""
    from . import grad_replay
    from .layout import flip_filter_launch, flipped_shape, scatter_phase_launch
    if (isinstance(dy, np.ndarray) or cf or ep["residual"] is not None or not y.size or not dy.flags.c_contiguous
            or not w.flags.c_contiguous or (bias is not None and bias is not ep["bias"])
            or (out is not None and out is not y)):
        return None
    p, device_id, dtype, g = plan.problem, dy.data.device_id, dy.dtype, plan.problem.groups
    if _stacks(plan, True):
        sp = plan.subpixel
        fplan = _PHASE_PLANS.get((memo, "stacked"))
        if fplan is None:
            return None
        K, F, C = w.shape[0], tuple(w.shape[1:-1]), w.shape[-1]
        direct = _known_direct_stacked(memo)
        if direct is not None:
            return grad_replay.DirectInput(y.shape, dtype, device_id, direct, False, sp)
        gather = subpixel.stacked_filter_launch(sp, w, K, F, C)
        z_shape = (dy.shape[0], *sp.length, sp.phases * C)
        scatter = _known_variant(memo, "scatter", "stacked")
        return grad_replay.StackedInput(y.shape, dtype, device_id, scatter or fplan, sp, gather,
                                        subpixel.stacked_filter_shape(sp, w.shape), z_shape,
                                        None if scatter else (lambda z, yy: subpixel.unstack_launch(sp, z, yy)))
    live = [(i, spec) for i, (_, spec, _) in enumerate(plan.phases) if spec is not None]
    if len(live) != 1 or not live[0][1]["src_full"] or w.itemsize not in (2, 4, 8):
        return None
    i, spec = live[0]
    fplan = _PHASE_PLANS.get((memo, i))
    if fplan is None:
        return None
    direct = _known_variant(memo, "direct", i)
    if direct is not None and len(plan.phases) == 1:
        return grad_replay.DirectInput(y.shape, dtype, device_id, direct, False)
    flip, wt_shape = flip_filter_launch(w, g, spec["flips"]), flipped_shape(w.shape, g, spec["flips"])
    if len(plan.phases) == 1:
        return grad_replay.WholeInput(y.shape, dtype, device_id, fplan, flip, wt_shape)
    if bias is not None or ep["activation"] is not None:  # the zero phases would need the epilogue of zero
        return None
    if direct is not None:
        return grad_replay.DirectInput(y.shape, dtype, device_id, direct, True)
    part_shape = (dy.shape[0], *spec["out"], y.shape[-1])
    scatter = _known_variant(memo, "scatter", i)
    return grad_replay.OnePhaseInput(y.shape, dtype, device_id, scatter or fplan, flip, wt_shape, part_shape,
                                     None if scatter else
                                     (lambda part, yy: scatter_phase_launch(part, yy, p.stride, spec["origin"],
                                                                            fill=True)))


#: The forward plans of input-gradient phases: (call memo key, phase) -> the dispatcher's plan.
_PHASE_PLANS: dict = {}
_PHASE_PLANS_MAX = 2048
on_change(_PHASE_PLANS.clear)  # a kernel registered later may plan these calls differently


#: Kernels the automatic choice may take for a gradient's forward convolution that have no variant storing
#: phases into place or reading the filter from w as it is (backends/sm90/phase_scatter.py serves the
#: Hopper kernel's plans only). On Hopper a gradient runs such a convolution on :data:`_IN_PLACE_KERNEL`
#: instead where that accepts it: the flip launch and the pass putting phases into place are saved.
_NO_IN_PLACE_VARIANT = frozenset({"pointwise_mma"})
_IN_PLACE_KERNEL = "sm90_tma"


def _in_place_instead(plan, kernel) -> bool:
    """Whether a gradient asks :data:`_IN_PLACE_KERNEL` for the forward convolution the automatic choice
    (``kernel`` None) gave to ``plan``."""
    return kernel is None and plan.kernel.name in _NO_IN_PLACE_VARIANT and plan.device.is_hopper


def _in_place_retry(plan, kernel, choose):
    """``choose(_IN_PLACE_KERNEL)`` (a plan, or a plan and its explanation) where :func:`_in_place_instead`
    asks for it and that kernel accepts the problem, else None."""
    if not _in_place_instead(plan, kernel):
        return None
    try:
        return choose(_IN_PLACE_KERNEL)
    except KernelDeclined:
        return None


def _in_place_note(passed_over: str) -> str:
    return (f"; {_IN_PLACE_KERNEL} chosen over {passed_over}, which has no variant storing phases into place or "
            f"reading the filter from w")


def _phase_plan(memo, i, nd, src, wt, ep, residual, part, g, spec, kernel, precision):
    """The forward plan of phase ``i`` (validated and dispatched as :func:`cuconv.conv2d` would, but on Hopper
    on the Hopper kernel where the automatic choice has no in-place variant: :func:`_in_place_instead`), made
    on the first call with this ``memo`` key and kept: later calls only launch it (:func:`cuconv.api.execute`)."""
    fplan = None if memo is None else _PHASE_PLANS.get((memo, i))
    if fplan is None:
        from .api import _prepare

        def prepare(k):
            return _prepare(nd, src, wt, ep["bias"], 1, spec["pad"], spec["dil"], g, "NHWC" if nd == 2 else "NDHWC",
                            residual, ep["alpha"], ep["beta"], ep["activation"], part, k, None, precision).plan
        fplan = prepare(kernel)
        fplan = _in_place_retry(fplan, kernel, prepare) or fplan
        if memo is not None:
            if len(_PHASE_PLANS) >= _PHASE_PLANS_MAX:
                _PHASE_PLANS.clear()
            _PHASE_PLANS[(memo, i)] = fplan
    return fplan


def _epilogue_of_zero(xp, ep: dict, residual, shape, dtype: str):
    """``act(bias + beta * residual)`` (the epilogue of a zero convolution), or zeros without one."""
    from .epilogue import apply_epilogue
    from .problem import Epilogue
    e = Epilogue(alpha=float(ep["alpha"]), beta=float(ep["beta"]), has_bias=ep["bias"] is not None,
                 has_residual=residual is not None, activation=activation_of(ep["activation"]))
    acc = np.float64 if dtype == "float64" else np.float32
    bias = None if ep["bias"] is None else as_array(ep["bias"], "bias")
    return apply_epilogue(xp, None, e, bias, residual, shape, acc)


def _doc_input_grad(nd: int) -> str:
    return f"""The gradient of a conv{nd}d's input: ``dx`` of shape ``x_shape`` from the output gradient ``dy``.

    Parameters
    ----------
    dy : array
        The gradient of the forward output (its shape, in ``layout``), NumPy or CuPy.
    w : array
        The forward weight (``(K, *filter, C/groups)`` channels-last, ``(K, C/groups, *filter)``
        channels-first), same dtype and device as ``dy``.
    x_shape : sequence of {nd + 2} ints
        The forward input's shape, in ``layout``.
    stride, padding, dilation, groups, layout
        As in :func:`cuconv.conv{nd}d` (``"same"`` and ``"valid"`` included).
    kernel, precision
        For the forward convolution that computes it (see :func:`cuconv.conv{nd}d`).

    Returns
    -------
    array of ``x_shape``, the array library of ``dy``. Computed as forward convolutions of ``dy`` with
    the flipped filter, one per output phase of the stride: see :mod:`cuconv.grad`.
    """


def conv2d_input_grad(dy, w, x_shape, *, stride=1, padding=0, dilation=1, groups=1, layout="NHWC", kernel=None,
                      precision=None):
    return _input_grad(2, dy, w, x_shape, stride, padding, dilation, groups, layout, kernel, precision)


def conv3d_input_grad(dy, w, x_shape, *, stride=1, padding=0, dilation=1, groups=1, layout="NDHWC", kernel=None,
                      precision=None):
    return _input_grad(3, dy, w, x_shape, stride, padding, dilation, groups, layout, kernel, precision)


conv2d_input_grad.__doc__ = _doc_input_grad(2)
conv3d_input_grad.__doc__ = _doc_input_grad(3)


# ------------------------------------------------------------------------------------------ weight gradient
#: Weight-gradient calls already validated, by :func:`_weight_key`: their :mod:`cuconv.grad_replay`
#: replay, or False where they have none (they take the full path, validation included).
_WGRAD_CALLS: dict = {}
on_change(_WGRAD_CALLS.clear)
on_environment_read(_WGRAD_CALLS.clear)


def _weight_key(nd, x, dy, w_shape, stride, padding, dilation, groups, layout, bias_grad, kernel, precision):
    """A key fixing everything the weight gradient's validation decides for a call (as :func:`_call_key`),
    or None."""
    tx = _keyed_type(x)
    if tx is None or type(bias_grad) is not bool:
        return None
    args = exact_key((nd, w_shape, stride, padding, dilation, groups, layout, kernel, precision))
    if args is NO_KEY:
        return None
    try:
        return (tx, _operand_key(x, tx), _operand_key(dy, tx), args, bias_grad, active_overrides())
    except KeyError:
        return None


def _weight_grad(nd, x, dy, w_shape, stride, padding, dilation, groups, layout, bias_grad, kernel, precision):
    key = _weight_key(nd, x, dy, w_shape, stride, padding, dilation, groups, layout, bias_grad, kernel, precision)
    replay = None if key is None else _WGRAD_CALLS.get(key)
    if replay:  # a signature seen before: the replay makes the operands' GPU current itself where it is not
        result = replay(x, dy)
        if result is not None:
            return result
    return _weight_grad_on_device(key, replay, nd, x, dy, w_shape, stride, padding, dilation, groups, layout,
                                  bias_grad, kernel, precision)


@on_device_of(3)
def _weight_grad_on_device(key, replay, nd, x, dy, w_shape, stride, padding, dilation, groups, layout, bias_grad,
                           kernel, precision):
    """A weight-gradient call the memo cannot replay: validated and computed (and its replay memoised under
    ``key``), with x's GPU current."""
    p, xp, cf, x_n, dy_n, _ = _weight_grad_operands(nd, x, dy, w_shape, stride, padding, dilation, groups, layout,
                                                    precision)
    if not isinstance(bias_grad, bool):
        raise TypeError(f"bias_grad: expected True or False, got {bias_grad!r}")
    F, K, Cg = p.filter_spatial, p.out_channels, p.channels_per_group
    run, _ = _wgrad_kernel(p, x_n, dy_n, kernel)
    if replay is None and key is not None:
        if len(_WGRAD_CALLS) >= _GRAD_CALLS_LIMIT:
            _WGRAD_CALLS.clear()
        _WGRAD_CALLS[key] = (run is not None and _weight_replay(p, x, dy, x_n, dy_n, cf, bias_grad, kernel)) or False
    if run is not None:
        dw = xp.empty((K, *F, Cg), dtype=x_n.dtype)
        run(x_n, dy_n, dw)
    else:
        dw = _weight_grad_by_forward(nd, p, x_n, dy_n, kernel, precision, xp)
    if cf:
        dw = to_channels_first(dw, xp)
    return (dw, _bias_grad(dy_n)) if bias_grad else dw


def _bias_grad(dy_n):
    """The bias gradient: channels-last ``dy_n`` summed over every axis but the channels, in fp32 (fp64 for
    float64 data), in dy's dtype."""
    acc = np.float64 if dy_n.dtype == np.float64 else np.float32
    return dy_n.sum(axis=tuple(range(dy_n.ndim - 1)), dtype=acc).astype(dy_n.dtype)


def _weight_replay(p, x, dy, x_n, dy_n, cf, bias_grad: bool, kernel):
    """The :class:`cuconv.grad_replay.WeightReplay` of a validated weight-gradient call that a
    weight-gradient GEMM computes, or None where it has none: CuPy operands, channels-last and
    contiguous."""
    if isinstance(x, np.ndarray) or cf or x_n is not x or dy_n is not dy or p.nd != 2 or not x.size:
        return None
    from .device import device_of
    from .grad_replay import WeightReplay
    device = device_of(x)

    def run_of(x_align, dy_align):
        return _wgrad_choice(p, device, x_align, dy_align, kernel)[0]
    return WeightReplay((p.out_channels, *p.filter_spatial, p.channels_per_group), x.dtype, x.data.device_id,
                        run_of, _bias_grad if bias_grad else None)


def _weight_grad_operands(nd, x, dy, w_shape, stride, padding, dilation, groups, layout, precision):
    """Validated weight-gradient operands: ``(problem, xp, channels_first, x_n, dy_n, dtype)`` with
    ``x_n`` and ``dy_n`` channels-last and contiguous."""
    layout = layout_of(layout, nd)
    cf = not LAYOUTS[layout][1]
    x = as_array(x, "x")
    dy = as_array(dy, "dy")
    check_same_place(dy, "dy", x)
    dtype = dtype_name(x, "x")
    if x.ndim != nd + 2:
        raise ValueError(f"x: expected a {nd + 2}-D array ({layout}), got {x.ndim}-D with shape {tuple(x.shape)}")
    w_shape = _shape(w_shape, "w_shape", nd)
    p = _forward_problem(nd, tuple(x.shape), w_shape, dtype, layout, stride, padding, dilation, groups,
                         precision_of(precision, dtype))
    want = (x.shape[0], *_user_out_shape(p, layout)[1:])
    check_companion(dy, "dy", want, dtype, x, "x")
    xp = _xp(x)
    return p, xp, cf, _last(x, cf, xp), _last(dy, cf, xp), dtype


#: The kernel= names of the weight-gradient GEMMs, in the order they are tried.
WGRAD_KERNELS = ("sm90_wgrad", "sm80_wgrad")


def _wgrad_kernel(p, x, dy, kernel):
    """``(run, reasons)``: the weight-gradient GEMM that computes ``p`` (``run(x, dy, dw)``, a
    :class:`~cuconv.backends.sm80.wgrad.WgradLaunch`), or None with why each declined (then the
    forward formulation runs). ``kernel`` names one of :data:`WGRAD_KERNELS` (an error when it
    declines), a forward kernel (the forward formulation on it), or None (the first that accepts)."""
    if kernel is not None and kernel not in WGRAD_KERNELS:
        return None, {name: f"kernel={kernel!r} names a forward kernel" for name in WGRAD_KERNELS}
    if isinstance(x, np.ndarray):
        run, reasons = None, {name: "NumPy arrays compute on the CPU" for name in WGRAD_KERNELS}
    else:
        from .device import device_of
        run, reasons = _wgrad_choice(p, device_of(x), x.data.ptr & 15, dy.data.ptr & 15, kernel)
        reasons = dict(reasons)
    if run is None and kernel is not None:
        raise ValueError(f"kernel: {kernel} cannot compute this weight gradient: {reasons[kernel]}")
    return run, reasons


@functools.lru_cache(maxsize=512)
def _wgrad_choice(p, device, x_align: int, dy_align: int, kernel):
    """:func:`_wgrad_kernel` for CuPy operands whose addresses are ``x_align`` / ``dy_align`` modulo 16
    (memoised: the launch is packed once)."""
    from .backends.sm80 import wgrad as w80
    from .backends.sm90 import wgrad as w90
    reasons = {"sm90_wgrad": w90.declines(p, device, x_align, dy_align), "sm80_wgrad": w80.declines(p, device)}
    sms = max(device.sm_count, 1)
    launches = {"sm90_wgrad": lambda: w90.launch_for(p, device, w90.variant(p, sm_count=sms)),
                "sm80_wgrad": lambda: w80.launch_for(p, device, w80.sm80_variant(p, x_align, dy_align))}
    px = w90.exchanged_roles(p) if reasons["sm90_wgrad"] is not None and kernel != "sm80_wgrad" else None
    if px is not None:  # dy as the input, x as the output gradient, on sm90_wgrad (its own choice of form)
        inner = _wgrad_choice(px, device, dy_align, x_align, "sm90_wgrad")[0]
        if inner is not None:
            reasons["sm90_wgrad"] = None
            launches["sm90_wgrad"] = lambda: w90.ExchangedRoles(inner, p, px)
    p8 = w90.padded_filters(p) if reasons["sm90_wgrad"] is not None else None
    if p8 is not None and w90.declines(p8, device, x_align, 0) is None:  # the padded dy is a new buffer
        reasons["sm90_wgrad"] = None
        launches["sm90_wgrad"] = lambda: w90.PaddedFilters(w90.launch_for(p8, device, w90.variant(p8, sm_count=sms)),
                                                           p.out_channels, p8.out_channels, device)
    if reasons["sm90_wgrad"] is not None and p.groups == 1 and p.channels % 8:
        pf = w90.folded_width(p)
        if pf is not None and w90.declines(pf, device, 0, dy_align) is None:  # the folded x is a new buffer
            reasons["sm90_wgrad"] = None
            launches["sm90_wgrad"] = lambda: w90.FoldedWidth(
                w90.launch_for(pf, device, w90.variant(pf, bm=w90.folded_tile(pf), sm_count=sms)), p, pf, device)
        elif device.cc == (9, 0):
            why = w90.fold_declined(p) or f"the width-folded problem: {w90.declines(pf, device, 0, dy_align)}"
            reasons["sm90_wgrad"] += f"; {why}"
    for name in ([kernel] if kernel else WGRAD_KERNELS):
        if reasons[name] is None:
            return launches[name](), tuple(reasons.items())
    return None, tuple(reasons.items())


def _behind(p):
    """The forward formulation's padding behind x per dim: enough for at least F outputs,
    ``(F - 1) d + (O - 1) s + 1 <= I + lo + hi``."""
    return [max(0, (f - 1) * d + (o - 1) * s + 1 - i - lo)
            for f, d, o, s, i, lo in zip(p.filter_spatial, p.dilation, p.out_spatial, p.stride, p.in_spatial,
                                         p.pad_lo)]


def _weight_grad_by_forward(nd, p, x_n, dy_n, kernel, precision, xp):
    """The weight gradient as forward convolutions, one per group (module docstring): channels-last
    ``x_n`` and ``dy_n`` in, ``(K, *F, C/groups)`` out."""
    F, K, C, g = p.filter_spatial, p.out_channels, p.channels, p.groups
    Kg, Cg = K // g, C // g
    pads = tuple(zip(p.pad_lo, _behind(p)))
    native = "NHWC" if nd == 2 else "NDHWC"
    fwd = _forward_fn(nd)
    parts = []
    for j in range(g):
        xs = xp.ascontiguousarray(xp.moveaxis(x_n[..., j * Cg:(j + 1) * Cg], (0, nd + 1), (nd + 1, 0)))  # (Cg, *I, N)
        ds = xp.ascontiguousarray(xp.moveaxis(dy_n[..., j * Kg:(j + 1) * Kg], (0, nd + 1), (nd + 1, 0)))  # (Kg, *O, N)
        r = fwd(xs, ds, stride=p.dilation, padding=pads, dilation=p.stride, layout=native, kernel=kernel,
                precision=precision)  # (Cg, *>=F, Kg)
        r = r[(slice(None),) + tuple(slice(0, f) for f in F) + (slice(None),)]
        parts.append(xp.moveaxis(r, (0, nd + 1), (nd + 1, 0)))  # (Kg, *F, Cg)
    return xp.ascontiguousarray(parts[0] if g == 1 else xp.concatenate(parts, axis=0))


def _doc_weight_grad(nd: int) -> str:
    return f"""The gradient of a conv{nd}d's weight: ``dw`` of shape ``w_shape`` from its input ``x`` and the
    output gradient ``dy``.

    Parameters
    ----------
    x : array
        The forward input, NumPy or CuPy, in ``layout``.
    dy : array
        The gradient of the forward output, same dtype and device as ``x``.
    w_shape : sequence of {nd + 2} ints
        The forward weight's shape (``(K, *filter, C/groups)`` channels-last, ``(K, C/groups, *filter)``
        channels-first).
    stride, padding, dilation, groups, layout
        As in :func:`cuconv.conv{nd}d`.
    bias_grad : bool
        Also return the bias gradient (``dy`` summed over every axis but the channels).
    kernel, precision
        ``kernel``: one of ``"sm90_wgrad"`` / ``"sm80_wgrad"`` (an error where it declines), a forward
        kernel (the forward formulation on it), or None (the first that accepts, else the forward
        formulation). ``precision``: as in :func:`cuconv.conv{nd}d`.

    Returns
    -------
    ``dw`` (or ``(dw, db)``), the array library of ``x``. Computed by the weight-gradient GEMM or as a
    forward convolution with the images as channels and ``dy`` as the filter: see :mod:`cuconv.grad`
    and :func:`explain_weight_grad`.
    """


def conv2d_weight_grad(x, dy, w_shape, *, stride=1, padding=0, dilation=1, groups=1, layout="NHWC", bias_grad=False,
                       kernel=None, precision=None):
    return _weight_grad(2, x, dy, w_shape, stride, padding, dilation, groups, layout, bias_grad, kernel, precision)


def conv3d_weight_grad(x, dy, w_shape, *, stride=1, padding=0, dilation=1, groups=1, layout="NDHWC",
                       bias_grad=False, kernel=None, precision=None):
    return _weight_grad(3, x, dy, w_shape, stride, padding, dilation, groups, layout, bias_grad, kernel, precision)


conv2d_weight_grad.__doc__ = _doc_weight_grad(2)
conv3d_weight_grad.__doc__ = _doc_weight_grad(3)


# ------------------------------------------------------------------------------------------ explanations
@dataclass(frozen=True)
class GradExplanation:
    """What computes a gradient (or transposed convolution): ``kernel`` (the name of what runs),
    ``detail`` (its variant), ``declined`` (``{name: reason}`` of the kernels that did not take it) and
    ``steps`` (one line per forward convolution the computation is made of, with the kernel that runs
    it). ``str()`` gives all of it."""

    what: str
    problem: object
    kernel: str
    detail: str
    declined: dict
    steps: tuple

    #: Why :func:`cuconv.precompile` does not take it (its message says so).
    precompile_note = ("a gradient's variants are made from its arrays on the first call: a run with "
                       "CUCONV_COMPILE_LOG set lists them for python -m cuconv.prebuilt build --jobs-from")

    def __str__(self) -> str:
        lines = [f"{self.what} of {self.problem.describe()}", f"runs: {self.kernel} [{self.detail}]"]
        lines += [f"  declined {name}: {why}" for name, why in self.declined.items()]
        lines += [f"  {step}" for step in self.steps]
        return "\n".join(lines)


def _scatter_of(fplan, sp, C: int):
    """``(plan, why)`` of the stacked convolution ``fplan`` storing the phases of ``sp`` into place; a one-tap
    window (a filter the size of the stride: one GEMM, no dead tap, no padded row) keeps the chooser's
    128 x 256 tile (docs/tuning.md T-phase-scatter)."""
    from .backends.sm90.phase_scatter import PHASE_ONE_TAP_MAX_BN, scatter_plan
    widest = {} if math.prod(sp.window) > 1 else dict(max_block_n=PHASE_ONE_TAP_MAX_BN)
    return scatter_plan(fplan, C, sp.extent, sp.stride, subpixel.scatter_offsets(sp), **widest)


def _forward_explanation(p, device, x_shape, w_shape, stride, padding, dilation, groups, ep, kernel,
                         with_plan: bool = False):
    """The dispatcher's explanation of one forward convolution of a gradient (channels-last); with
    ``with_plan``, ``(plan, explanation)``."""
    from . import dispatch
    from .validate import conv_problem
    nd = p.nd
    fp = conv_problem(nd, tuple(x_shape), tuple(w_shape), p.dtype, "NHWC" if nd == 2 else "NDHWC", stride, padding,
                      dilation, groups, float(ep.get("alpha", 1.0)), float(ep.get("beta", 1.0)),
                      ep.get("bias") is not None, ep.get("residual") is not None,
                      activation_of(ep.get("activation")), p.precision)
    hit = dispatch.select(fp, device, forced=kernel)
    again = _in_place_retry(hit[0], kernel, lambda k: dispatch.select(fp, device, forced=k))  # as _phase_plan
    if again is not None:
        hit = again[0], dataclasses.replace(again[1], detail=again[1].detail + _in_place_note(hit[1].kernel))
    return hit if with_plan else hit[1]


def _explain_aligned(p, device, spa, epilogue, kernel):
    """``(plan, why)`` of :func:`_aligned_direct` for :func:`_explain_input` (the plan made from shapes)."""
    fplan = _planned_aligned(lambda: _forward_explanation(
        p, device, (p.batch, *p.out_spatial, p.out_channels), (spa.phases * p.channels, *spa.window, p.out_channels),
        1, spa.pad, 1, 1, epilogue or {}, kernel, with_plan=True)[0], p.channels)
    return _aligned_direct(fplan, spa, p.channels, p.w_shape)


def _explain_input(nd, dy, w, x_shape, stride, padding, dilation, groups, layout, kernel, precision, what,
                   epilogue=None) -> GradExplanation:
    from .device import device_of
    dy, w = as_array(dy, "dy"), as_array(w, "w")
    dtype = dtype_name(dy, "dy")
    x_shape = _shape(x_shape, "x_shape", nd)
    layout = layout_of(layout, nd)
    _, plan = _input_plan_of(nd, x_shape, tuple(w.shape), dtype, layout, stride, padding, dilation, groups,
                             precision_of(precision, dtype))
    p, device = plan.problem, device_of(dy)
    sp = plan.subpixel
    if _stacks(plan, device.kind != "cpu"):
        fplan, e = _forward_explanation(p, device, (x_shape[0], *p.out_spatial, p.out_channels),
                                        (sp.phases * p.channels, *sp.window, p.out_channels), 1, sp.pad, 1, 1,
                                        epilogue or {}, kernel, with_plan=True)
        scatter, how = (None, None) if device.kind == "cpu" else _scatter_of(fplan, sp, p.channels)
        direct = None
        if scatter is not None:
            detail, places = scatter.describe(), f"; {how}, no unstack pass"
            if (epilogue or {}).get("residual") is None:
                direct, why = _direct_filter(scatter, _stacked_view(sp, p.w_shape))
                detail = direct.describe() if direct is not None else detail
                places += f"; {why}" if direct is not None else \
                    f"; the filter gathered (not read from w as it is: {why})"
                if _tries_aligned(plan, direct):
                    aligned, how_aligned = _explain_aligned(p, device, plan.aligned, epilogue, kernel)
                    if aligned is not None:
                        sp = plan.aligned
                        from .backends.sm90.tiles import HALO_SWITCHED_OFF
                        detail = aligned.describe().replace(  # the aligned plan is made with halo=False
                            HALO_SWITCHED_OFF, "the aligned form skips window taps on im2col tiles only")
                        places = (f"; {how_aligned}; the phases aligned (each phase's taps at their own offsets "
                                  f"in a {'x'.join(map(str, sp.window))} window, {'x'.join(map(str, sp.length))} "
                                  f"rows per image instead of the shifted form's "
                                  f"{'x'.join(map(str, plan.subpixel.length))})")
                    else:
                        places += f"; the phases shifted (the aligned form declined: {how_aligned})"
        elif how is None:
            detail, places = e.detail, "; phases put into place by strided copies"
        else:
            detail, places = e.detail, f"; phases put into place by kernels_cu/layout/phase_stack.cu (not by the " \
                                       f"epilogue: {how})"
        steps = (f"stacked convolution of dy: {p.out_channels} -> {sp.phases} x {p.channels} channels, "
                 f"{'x'.join(map(str, sp.window))} filter, padding {sp.pad}, on {e.kernel} [{detail}]{places}",)
        return GradExplanation(what, p, e.kernel, sp.describe(by_epilogue=scatter is not None,
                                                             from_w=direct is not None), {}, steps)
    steps, kernels = [], []
    for where, spec, _ in plan.phases:
        phase = tuple(sl.start for sl in where[1:-1])
        if spec is None:
            steps.append(f"phase {phase}: no tap reaches it (the epilogue of zero)")
            continue
        taps = tuple(n for _, _, n in spec["flips"])
        src = (x_shape[0], *(len(range(o)[sl]) for o, sl in zip(p.out_spatial, spec["src"][1:-1])), p.out_channels)
        fplan, e = _forward_explanation(p, device, src, (p.channels, *taps, p.gemm_n), 1, spec["pad"], spec["dil"],
                                        p.groups, epilogue or {}, kernel, with_plan=True)
        kernels.append(e.kernel)
        detail, places = e.detail, ""
        into_y = fplan if len(plan.phases) == 1 else None
        if len(plan.phases) > 1 and device.kind != "cpu":
            scatter, how = _one_phase_scatter(fplan, p, spec)
            detail = scatter.describe() if scatter is not None else detail
            places = f"; {how}" if scatter is not None else f"; put into place by phase_scatter.cu (not by the " \
                                                                f"epilogue: {how})"
            into_y = scatter
        if (device.kind != "cpu" and into_y is not None and p.groups == 1
                and (epilogue or {}).get("residual") is None):
            direct, why = _direct_filter(into_y, _flipped_view(p.w_shape, spec))
            detail, places = (direct.describe(), places + f"; {why}") if direct is not None else \
                (detail, places + f"; the filter flipped by kernels_cu/layout/flip_filter.cu (not read from w as it "
                                  f"is: {why})")
        steps.append(f"phase {phase}: filter taps {taps}, stride-1 convolution of dy on {e.kernel} "
                     f"[{detail}]{places}")
    name = ", ".join(dict.fromkeys(kernels)) or "none (every phase is the epilogue of zero)"
    detail = (f"{len(plan.phases)} output phase(s) of stride {tuple(p.stride)}, each a forward convolution of dy "
              f"with its taps of the flipped filter (kernels_cu/layout/flip_filter.cu, or on Hopper read from w "
              f"as it is: each phase below says which)"
              + ((", written into place by kernels_cu/layout/phase_scatter.cu" if device.kind == "cpu" else
                  ", written into place by the convolution's epilogue or kernels_cu/layout/phase_scatter.cu "
                  "(each phase below says which)") if len(plan.phases) > 1 else ""))
    return GradExplanation(what, p, name, detail, {}, tuple(steps))


def _explain_weight(nd, x, dy, w_shape, stride, padding, dilation, groups, layout, kernel, precision):
    from .device import device_of
    p, xp, cf, x_n, dy_n, _ = _weight_grad_operands(nd, x, dy, w_shape, stride, padding, dilation, groups, layout,
                                                   precision)
    run, reasons = _wgrad_kernel(p, x_n, dy_n, kernel)
    if run is not None:
        name = run.variant.kernel
        declined = {k: v for k, v in reasons.items() if v is not None and k != name}
        return GradExplanation("weight gradient", p, name, run.describe(), declined, ())
    e = _forward_explanation(p, device_of(x_n), (p.channels_per_group, *p.in_spatial, x_n.shape[0]),
                             (p.gemm_n, *p.out_spatial, x_n.shape[0]), p.dilation,
                             tuple(zip(p.pad_lo, _behind(p))), p.stride, 1, {}, kernel)
    detail = (f"{p.groups} forward convolution(s) (one per group) with the images as channels and dy as the filter: "
              f"{e.kernel} [{e.detail}]")
    return GradExplanation("weight gradient", p, f"forward formulation on {e.kernel}", detail,
                           {k: v for k, v in reasons.items() if v is not None}, ())


def explain_input_grad(dy, w, x_shape, *, stride=1, padding=0, dilation=1, groups=1, layout=None, kernel=None,
                       precision=None) -> GradExplanation:
    """What :func:`conv2d_input_grad` / :func:`conv3d_input_grad` runs for these arguments (the rank of
    ``w`` picks 2-D or 3-D; ``layout`` defaults to channels-last): the forward convolution of each
    output phase and the kernel each runs. Computes nothing."""
    nd = as_array(w, "w").ndim - 2
    layout = layout or ("NHWC" if nd == 2 else "NDHWC")
    return _explain_input(nd, dy, w, x_shape, stride, padding, dilation, groups, layout, kernel, precision,
                          "input gradient")


def explain_weight_grad(x, dy, w_shape, *, stride=1, padding=0, dilation=1, groups=1, layout=None, kernel=None,
                        precision=None) -> GradExplanation:
    """What :func:`conv2d_weight_grad` / :func:`conv3d_weight_grad` runs for these arguments: the
    weight-gradient GEMM (``sm90_wgrad`` / ``sm80_wgrad``, its tile and split) or, where both decline
    (each says why), the forward formulation and its kernel. Runs no convolution (channels-first
    operands are moved to channels-last, as the call moves them: the kernels' choice depends on
    their alignment)."""
    nd = as_array(x, "x").ndim - 2
    layout = layout or ("NHWC" if nd == 2 else "NDHWC")
    return _explain_weight(nd, x, dy, w_shape, stride, padding, dilation, groups, layout, kernel, precision)


# ------------------------------------------------------------------------------------------ transposed
def _pairs(padding, nd: int):
    """Transposed-convolution padding: an int, one int per dim, or one (lo, hi) pair per dim."""
    if isinstance(padding, str):
        raise ValueError(f"padding: a transposed convolution takes ints or (lo, hi) pairs, got {padding!r}")
    if isinstance(padding, (int, np.integer)) and not isinstance(padding, bool):
        if padding < 0:
            raise ValueError(f"padding: must be >= 0, got {padding}")
        return ((int(padding), int(padding)),) * nd
    try:
        items = list(padding)
    except TypeError:
        raise TypeError(f"padding: expected an int, {nd} ints or {nd} (lo, hi) pairs, got {padding!r}") from None
    if len(items) != nd:
        raise ValueError(f"padding: expected {nd} entries, got {padding!r}")
    out = []
    for v in items:
        pair = (v, v) if isinstance(v, (int, np.integer)) and not isinstance(v, bool) else tuple(v)
        if len(pair) != 2 or any(isinstance(u, bool) or not isinstance(u, (int, np.integer)) or u < 0 for u in pair):
            raise ValueError(f"padding: expected non-negative ints or (lo, hi) pairs, got {padding!r}")
        out.append((int(pair[0]), int(pair[1])))
    return tuple(out)


def conv_transpose_output_shape(x_shape: Sequence[int], w_shape: Sequence[int], *, stride=1, padding=0,
                                output_padding=0, dilation=1, groups=1, layout="NHWC") -> Tuple[int, ...]:
    """The output shape of :func:`conv_transpose2d` / :func:`conv_transpose3d` (``x_shape`` and ``w_shape``
    in ``layout``; the weight as the forward convolution's, ``(C_in, *filter, C_out/groups)``
    channels-last): ``(I - 1) s - lo - hi + (F - 1) d + output_padding + 1`` per spatial dim."""
    nd = len(x_shape) - 2
    layout = layout_of(layout, nd)
    cf = not LAYOUTS[layout][1]
    x_shape, w_shape = _shape(x_shape, "x_shape", nd), _shape(w_shape, "w_shape", nd)
    stride = normalize_spatial(stride, nd, "stride")
    dilation = normalize_spatial(dilation, nd, "dilation")
    op = normalize_spatial(output_padding, nd, "output_padding", minimum=0)
    for o, s in zip(op, stride):
        if o >= s:
            raise ValueError(f"output_padding: must be smaller than the stride in each dim (the rows it adds "
                             f"are ones the forward convolution's stride skips), got {tuple(op)} with stride {stride}")
    pads = _pairs(padding, nd)
    if not isinstance(groups, (int, np.integer)) or isinstance(groups, bool) or groups < 1:
        raise ValueError(f"groups: expected an int >= 1, got {groups!r}")
    N, Cin, *I = (x_shape[0], x_shape[1], *x_shape[2:]) if cf else (x_shape[0], x_shape[-1], *x_shape[1:-1])
    Kw, Cog, *F = (w_shape[0], w_shape[1], *w_shape[2:]) if cf else (w_shape[0], w_shape[-1], *w_shape[1:-1])
    if Kw != Cin:
        raise ValueError(f"w: a transposed convolution's weight has the input's C_in={Cin} channels first, "
                         f"got shape {tuple(w_shape)} ({layout})")
    if Cin % groups:
        raise ValueError(f"groups: must divide the input channels C_in={Cin}, got {groups}")
    size = [(i - 1) * s - lo - hi + (f - 1) * d + o + 1
            for i, s, (lo, hi), f, d, o in zip(I, stride, pads, F, dilation, op)]
    if any(v < 1 for v in size):
        raise ValueError(f"output size: must be >= 1 in every spatial dim, got {tuple(size)} from input "
                         f"{tuple(I)}, filter {tuple(F)}, stride {stride}, padding {pads}, dilation {dilation}, "
                         f"output_padding {op}")
    C_out = Cog * groups
    return (N, C_out, *size) if cf else (N, *size, C_out)


#: Transposed-convolution geometries already validated: key -> (output shape, padding pairs).
_TRANSPOSE_SHAPES: dict = {}
_TRANSPOSE_SHAPES_LIMIT = 1024


@on_device_of(1)
def _transpose(nd, x, w, bias, stride, padding, output_padding, dilation, groups, layout, residual, alpha, beta,
               activation, out, kernel, precision):
    tx = _keyed_type(x)
    args = exact_key((nd, stride, padding, output_padding, dilation, groups, layout))
    key = None
    if args is not NO_KEY and tx is not None:
        try:
            key = ("transpose", tx, _operand_key(x, tx), _operand_key(w, tx), args)
        except KeyError:  # w of another kind: validation says so
            pass
    known = None if key is None else _TRANSPOSE_SHAPES.get(key)
    if known is None:
        layout_n = layout_of(layout, nd)
        x = as_array(x, "x")
        w = as_array(w, "w")
        check_same_place(w, "w", x)
        check_ranks(nd, layout_n, x, w)
        y_shape = conv_transpose_output_shape(tuple(x.shape), tuple(w.shape), stride=stride, padding=padding,
                                              output_padding=output_padding, dilation=dilation, groups=groups,
                                              layout=layout_n)
        known = (y_shape, _pairs(padding, nd))
        if key is not None:
            if len(_TRANSPOSE_SHAPES) >= _TRANSPOSE_SHAPES_LIMIT:
                _TRANSPOSE_SHAPES.clear()
            _TRANSPOSE_SHAPES[key] = known
    y_shape, pads = known
    epilogue = dict(bias=bias, residual=residual, alpha=alpha, beta=beta, activation=activation)
    return _input_grad(nd, x, w, y_shape, stride, pads, dilation, groups, layout, kernel, precision, epilogue, out,
                       key)


def explain_transpose(x, w, bias=None, *, stride=1, padding=0, output_padding=0, dilation=1, groups=1, layout=None,
                      residual=None, alpha=1.0, beta=1.0, activation=None, kernel=None,
                      precision=None) -> GradExplanation:
    """What :func:`conv_transpose2d` / :func:`conv_transpose3d` runs for these arguments (the forward
    convolution of each output phase and its kernel, the epilogue fused into each). Computes nothing."""
    x, w = as_array(x, "x"), as_array(w, "w")
    nd = w.ndim - 2
    layout = layout_of(layout or ("NHWC" if nd == 2 else "NDHWC"), nd)
    check_ranks(nd, layout, x, w)
    y_shape = conv_transpose_output_shape(tuple(x.shape), tuple(w.shape), stride=stride, padding=padding,
                                          output_padding=output_padding, dilation=dilation, groups=groups,
                                          layout=layout)
    epilogue = dict(bias=bias, residual=residual, alpha=alpha, beta=beta, activation=activation)
    return _explain_input(nd, x, w, y_shape, stride, _pairs(padding, nd), dilation, groups, layout, kernel, precision,
                          "transposed convolution", epilogue)


def _doc_transpose(nd: int) -> str:
    return f"""Transposed convolution (the input gradient of a conv{nd}d, run forward), with the fused epilogue
    ``act(alpha * conv_transpose(x, w) + bias + beta * residual)``.

    Parameters
    ----------
    x : array
        ``(N, *spatial, C_in)`` channels-last or ``(N, C_in, *spatial)`` channels-first, NumPy or CuPy.
    w : array
        The weight of the forward convolution whose input gradient this computes:
        ``(C_in, *filter, C_out/groups)`` channels-last, ``(C_in, C_out/groups, *filter)`` channels-first
        (torch's convention), so ``conv_transpose{nd}d(x, w, ...)`` equals
        ``conv{nd}d_input_grad(x, w, output_shape, ...)``.
    bias : array (C_out,), optional
    stride, dilation, groups
        As the forward convolution's.
    padding : int, {nd} ints, or {nd} (lo, hi) pairs
        The forward convolution's padding (it trims the output): torch's ``padding=p`` is ``p``.
    output_padding : int or {nd} ints
        Extra output rows at the high end, each smaller than the stride.
    layout, residual, alpha, beta, activation, out, kernel, precision
        As in :func:`cuconv.conv{nd}d`; ``residual`` and ``out`` have the output's shape.

    Returns
    -------
    array of :func:`conv_transpose_output_shape`, the array library of ``x``.
    """


def conv_transpose2d(x, w, bias=None, *, stride=1, padding=0, output_padding=0, dilation=1, groups=1, layout="NHWC",
                     residual=None, alpha=1.0, beta=1.0, activation=None, out=None, kernel=None, precision=None):
    return _transpose(2, x, w, bias, stride, padding, output_padding, dilation, groups, layout, residual, alpha,
                      beta, activation, out, kernel, precision)


def conv_transpose3d(x, w, bias=None, *, stride=1, padding=0, output_padding=0, dilation=1, groups=1,
                     layout="NDHWC", residual=None, alpha=1.0, beta=1.0, activation=None, out=None, kernel=None,
                     precision=None):
    return _transpose(3, x, w, bias, stride, padding, output_padding, dilation, groups, layout, residual, alpha,
                      beta, activation, out, kernel, precision)


conv_transpose2d.__doc__ = _doc_transpose(2)
conv_transpose3d.__doc__ = _doc_transpose(3)
