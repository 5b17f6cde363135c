"""Public API: :func:`conv2d`, :func:`conv3d`, :func:`explain`.

Each call: normalise and validate the arguments -> one :class:`~cuconv.problem.ConvProblem` ->
dispatch (:mod:`cuconv.dispatch`: the memoised plan of the chosen kernel) -> run the plan on native
channels-last arrays -> hand back the result in the caller's layout and array library.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Optional

import numpy as np

from . import dispatch
from .arrays import (as_array, check_companion, check_same_place, dtype_name, meets, module_name, on_device_of,
                     ranges_meet)
from .autotune import tuned_select
from .device import cupy_or_none, device_of
from .epilogue import apply_epilogue
from .layout import native_result, operands_for, operands_mover_for, to_channels_first, to_channels_last
from .overrides import active_overrides, current_overrides, on_environment_read
from .problem import LAYOUTS, ConvProblem
from .registry import on_change
from .validate import activation_of, check_ranks, conv_problem, layout_of, precision_of, strategy_of, user_shape

__all__ = ["conv2d", "conv3d", "explain"]



@dataclass
class _Call:
    """A validated call: the problem, the native-layout operands and how to return the result."""

    problem: ConvProblem
    plan: object                # the dispatcher's plan (Plan) and its Explanation
    explanation: object
    x: object
    w: object
    bias: object
    residual: object
    out_native: object          # where the kernel writes (contiguous; native layout unless cf_out)
    out_user: object            # the caller's ``out`` (after as_array) or None
    out_given: object           # the caller's original ``out`` object, returned as is
    channels_first: bool
    cf_out: bool                # the kernel reads the residual and writes out channels-first itself
    xp: object                  # numpy or cupy


def _xp_of(a):
    if module_name(a) == "numpy":
        return np
    import cupy
    return cupy


def _to_native(a, channels_first: bool, xp, purpose=None):
    """Channels-first -> channels-last (moved, see :mod:`cuconv.layout`; into the scratch buffer
    ``purpose`` when named); channels-last -> contiguous (no copy if already)."""
    return to_channels_last(a, channels_first, xp, purpose)


def residual_and_output(xp, res_user, res_given, out_user, out_given, channels_first, native_shape, dtype,
                        cf_out=False, reads=()):
    """(the residual as the kernel reads it, the array the kernel writes) of a validated call.

    The residual may *be* ``out``: an in-place add, which every kernel supports (each output element is
    read before the same thread writes it); any other overlap with ``out`` reads a snapshot. The kernel
    writes straight into ``out`` when it is in the layout the kernel writes and contiguous and shares no
    memory with an array the kernel reads (``reads``: x, w and the bias as the kernel takes them; None
    skipped), else into a temporary that the call copies into ``out`` afterwards: with ``conv2d(x, w,
    out=x)`` tiles of the result would overwrite input pixels that other tiles still read. ``cf_out``:
    the kernel reads the residual and writes the result channels-first
    (:attr:`cuconv.plan.Plan.writes_channels_first`), so neither is moved."""
    res = None
    if res_user is not None:
        in_place = out_user is not None and (res_user is out_user or res_given is out_given)
        res = (res_user if res_user.flags.c_contiguous else xp.ascontiguousarray(res_user)) if cf_out else \
            _to_native(res_user, channels_first, xp, "residual")
        if not in_place and out_user is not None and xp.may_share_memory(res, out_user):
            res = res.copy()
    if (out_user is not None and (cf_out or not channels_first) and out_user.flags.c_contiguous
            and not meets(xp, out_user, reads)):
        return res, out_user
    if cf_out:
        return res, xp.empty((native_shape[0], native_shape[-1], *native_shape[1:-1]), dtype=dtype)
    return res, native_result(xp, native_shape, dtype, channels_first)


def _prepare(nd: int, x, w, bias, stride, padding, dilation, groups, layout, residual, alpha, beta,
             activation, out, kernel=None, strategy=None, precision=None) -> _Call:
    """Validate a call, choose its plan (:func:`cuconv.dispatch.select`) and lay its operands out as the
    plan reads them."""
    layout = layout_of(layout, nd)
    channels_first = not LAYOUTS[layout][1]
    x = as_array(x, "x")
    w = as_array(w, "w")
    check_same_place(w, "w", x)
    check_ranks(nd, layout, x, w)
    dtype = dtype_name(x, "x")
    wdt = dtype_name(w, "w")
    if wdt != dtype:
        raise TypeError(f"w: expected dtype {dtype} like x, got {wdt}")
    problem = conv_problem(nd, tuple(x.shape), tuple(w.shape), dtype, layout, stride, padding, dilation, groups,
                           alpha, beta, bias is not None, residual is not None, activation_of(activation),
                           precision_of(precision, dtype))
    xp = _xp_of(x)
    batch = x.shape[0]  # 0 for an empty batch (the problem is built for one image)
    user_out_shape = user_shape((batch, *problem.out_shape[1:]), layout)

    if bias is not None:
        bias = as_array(bias, "bias")
        check_companion(bias, "bias", (problem.out_channels,), dtype, x)
        bias = _to_native(bias, False, xp)
    out_given = out
    out_user = None
    if out is not None:
        out_user = as_array(out, "out")
        check_companion(out_user, "out", user_out_shape, dtype, x)
        if module_name(out_user) == "numpy" and not out_user.flags.writeable:
            raise ValueError("out: expected a writeable array, got a read-only one")
    res_user = None
    if residual is not None:
        res_user = as_array(residual, "residual")
        check_companion(res_user, "residual", user_out_shape, dtype, x)
    plan, explanation = choose(problem, device_of(x), kernel, strategy_of(strategy, nd))
    x_n, w_n, residual, out_native, cf_out = lay_out(plan, xp, x, w, bias, res_user, residual, out_user, out_given,
                                                     channels_first, batch)
    return _Call(problem=problem, plan=plan, explanation=explanation, x=x_n, w=w_n, bias=bias, residual=residual,
                 out_native=out_native, out_user=out_user, out_given=out_given, channels_first=channels_first,
                 cf_out=cf_out, xp=xp)


def choose(problem: ConvProblem, device, kernel, strategy):
    """``(plan, explanation)`` of a call: the kernel forced by name, the fastest measured under
    :func:`cuconv.autotune` (unless ``alpha == 0``: no kernel runs), or the dispatcher's automatic choice."""
    current = current_overrides()
    if current.autotune and kernel is None and problem.epilogue.alpha != 0:
        return tuned_select(problem, device, strategy, current, call_with_plan)
    return dispatch.select(problem, device, forced=kernel, strategy=strategy, overrides=current)


def lay_out(plan, xp, x, w, bias, res_user, res_given, out_user, out_given, channels_first: bool, batch: int):
    """``(x, w, residual, out, cf_out)`` as ``plan`` takes them from a validated call's arrays (``bias``
    already native): the operands moved to channels-last where the plan does not read the caller's
    layout, and the array the kernel writes (:func:`residual_and_output`)."""
    cf_out = channels_first and _writes_channels_first(plan, batch)
    if channels_first:
        x_n, w_n = operands_for(plan, x, w, xp)
    else:
        x_n, w_n = _to_native(x, False, xp), _to_native(w, False, xp)
    residual, out_native = residual_and_output(xp, res_user, res_given, out_user, out_given, channels_first,
                                               (batch, *plan.problem.out_shape[1:]), x.dtype, cf_out,
                                               (x_n, w_n, bias))
    return x_n, w_n, residual, out_native, cf_out


def call_with_plan(plan, xp, device_id, x, w, bias, residual, channels_first: bool):
    """The result of ``plan`` on contiguous arrays in the problem's layout (no ``out``), as a call computes
    it: what :mod:`cuconv.autotune` times."""
    x_n, w_n, res, out_native, cf_out = lay_out(plan, xp, x, w, bias, residual, residual, None, None, channels_first,
                                                x.shape[0])
    execute(plan, xp, device_id, x_n, w_n, bias, res, out_native)
    return deliver(xp, out_native, None, None, channels_first, cf_out)


def _writes_channels_first(plan, batch: int) -> bool:
    """Whether a channels-first call hands ``plan`` its residual and output channels-first: when the
    plan's kernel stores that layout and runs (not for an empty batch or ``alpha == 0``, where the
    epilogue is computed channels-last without a kernel)."""
    return plan.writes_channels_first and batch > 0 and plan.problem.epilogue.alpha != 0


def execute(plan, xp, device_id, x, w, bias, residual, out_native) -> None:
    """Compute ``out_native`` for a validated call: nothing for an empty batch; the epilogue alone,
    ``act(bias + beta * residual)``, when ``alpha == 0`` (the convolution is not computed); else
    ``plan.run`` on the arrays' GPU (``device_id``, None on the CPU)."""
    if out_native.shape[0] == 0:
        return
    if plan.problem.epilogue.alpha == 0:
        values = apply_epilogue(xp, None, plan.problem.epilogue, bias, residual, out_native.shape,
                                np.float64 if plan.problem.precision == "float64" else np.float32)
        out_native[...] = values.astype(out_native.dtype)
    elif device_id is None or device_id == xp.cuda.runtime.getDevice():
        plan.run(x, w, bias, residual, out_native)
    else:
        with xp.cuda.Device(device_id):
            plan.run(x, w, bias, residual, out_native)


def deliver(xp, out_native, out_user, out_given, channels_first, cf_out=False):
    """The call's result: ``out_given`` (filled from ``out_native`` when the kernel wrote elsewhere), or
    ``out_native`` in the caller's layout (moved there unless the kernel wrote it so: ``cf_out``)."""
    if channels_first and not cf_out:
        result = to_channels_first(out_native, xp, out_user)
        return out_given if out_user is not None else result
    if out_user is not None:
        if out_native is not out_user:
            out_user[...] = out_native
        return out_given
    return out_native


#: Calls already validated and planned, by signature (:func:`_signature`): what a repeated call needs.
_CALLS: dict = {}
_CALLS_LIMIT = 1024
on_change(_CALLS.clear)  # a kernel registered later may plan these calls differently
on_environment_read(_CALLS.clear)  # the environment's overrides are keyed by their reading, not their value
_SCALAR_TYPES = (int, float)  # exactly these (bool is refused by validation, so it takes the full path)


@dataclass(frozen=True)
class _Known:
    """What a validated call of a signature left to reuse: its plan and how to shape its operands."""

    plan: object
    xp: object
    device_id: Optional[int]
    channels_first: bool
    native_out_shape: tuple
    cf_out: bool        # the kernel reads the residual and writes the result channels-first
    x_native: bool      # x (w, bias) is already channels-last and contiguous: passed as is
    w_native: bool
    bias_native: bool
    move_xw: object     # channels-first calls: (x, w) -> what the plan takes (cuconv.layout.operands_mover_for)
    replay: object      # a _Replay where the signature leaves nothing to decide but the run, else None


class _Replay:
    """A repeated call whose signature fixes every decision: the kernel writes the result (a new array,
    or ``out``) in the caller's layout, reads each operand as passed (a channels-first call on a GPU: the
    moved x and w; a residual as passed, or ``out`` itself), and the convolution runs. What is left is the
    allocation (or, with ``out``, the test that x, w and the bias do not share its memory), the operands'
    move (channels-first) and the plan's run, on a GPU with the arrays' GPU current."""

    __slots__ = ("_run", "_move_xw", "_meets", "_new", "_shape", "_dtype", "_device_id", "_current_device",
                 "_device")

    def __init__(self, plan, move_xw, shape, dtype, xp, device_id: Optional[int]):
        self._run, self._move_xw = plan.run, move_xw
        # every array of a replayed call is contiguous: on a GPU the address ranges tell
        self._meets = functools.partial(meets, np) if xp is np else ranges_meet
        self._new, self._shape, self._dtype = xp.ndarray, shape, dtype
        self._device_id = device_id
        if device_id is not None:
            self._current_device, self._device = xp.cuda.runtime.getDevice, xp.cuda.Device

    @staticmethod
    def of(call: _Call, x, w, bias, residual, out, device_id, move_xw) -> Optional["_Replay"]:
        """The replay of a validated first call (``x`` ... ``out`` as the caller passed them), or None where
        a repeat needs the general path: for ``alpha == 0`` or an empty batch, where an operand is copied
        or moved before the launch (other than by ``move_xw``), where the result is moved or copied after
        it, and where ``residual`` and ``out`` were two arrays."""
        if call.out_native.shape[0] == 0 or call.problem.epilogue.alpha == 0:
            return None
        if call.channels_first != call.cf_out or call.bias is not bias:
            return None
        if not call.channels_first and (call.x is not x or call.w is not w):
            return None
        if residual is not None and call.residual is not residual:
            return None  # the residual is copied (a view, or overlapping out) or moved
        if out is not None and (call.out_native is not out or (residual is not None and residual is not out)):
            return None
        return _Replay(call.plan, move_xw, call.out_native.shape, call.out_native.dtype, call.xp, device_id)

    def __call__(self, x, w, bias, residual, out):
        """The result, or None where this call's arrays need the general path: ``residual`` and ``out``
        given as two arrays (they may overlap), or ``out`` sharing memory with x, w or the bias."""
        if self._device_id is not None and self._current_device() != self._device_id:
            with self._device(self._device_id):
                return self(x, w, bias, residual, out)
        if out is not None and residual is not None and residual is not out:
            return None
        if self._move_xw is not None:
            x, w = self._move_xw(x, w)
        if out is None:
            out = self._new(self._shape, self._dtype)
        elif self._meets(out, (x, w, bias)):
            return None
        self._run(x, w, bias, residual, out)
        return out


def _keyed_type(a):
    """``type(a)`` where it is an array type that call memos key (numpy or cupy ndarray), else None."""
    tx = type(a)
    return tx if tx is _NUMPY_NDARRAY or tx is (_CUPY_NDARRAY or _cupy_ndarray()) else None


def _operand_key(a, tx):
    """(shape, strides, dtype, device) of an operand of the call's array type, or None for an absent one;
    raises KeyError for one of another type (the full path then validates it)."""
    if a is None:
        return None
    if type(a) is not tx:
        raise KeyError
    return (a.shape, a.strides, a.dtype, None if tx is _NUMPY_NDARRAY else a.data.device_id)


#: What :func:`exact_key` returns for a value a memo key cannot vouch for.
NO_KEY = object()


def exact_key(v):
    """``v`` itself where it is exactly an int, str or None, or a tuple of such (recursively), so that a
    memo key never equates values that validation tells apart (2 and 2.0, 1 and True); else
    :data:`NO_KEY`. Lists take the full path (they are not hashable)."""
    t = type(v)
    if t is int or t is str or v is None:
        return v
    if t is not tuple:
        return NO_KEY
    for u in v:
        tu = type(u)
        if not (tu is int or tu is str or u is None or (tu is tuple and exact_key(u) is not NO_KEY)):
            return NO_KEY
    return v


def _geometry_key(v):
    """:func:`exact_key` of a stride, padding or dilation, lists taken as the tuples they equal (validation
    reads a list and a tuple of the same ints alike)."""
    if type(v) is list:
        v = tuple(tuple(e) if type(e) is list else e for e in v)
    return exact_key(v)


def _cupy_ndarray():
    """``cupy.ndarray``, or a type no array has where CuPy does not import (looked up once)."""
    global _CUPY_NDARRAY
    if _CUPY_NDARRAY is None:
        cp = cupy_or_none()
        _CUPY_NDARRAY = cp.ndarray if cp is not None else type("_NoCupy", (), {})
    return _CUPY_NDARRAY


_CUPY_NDARRAY = None
_NUMPY_NDARRAY = np.ndarray


def _signature(nd, x, w, bias, stride, padding, dilation, groups, layout, residual, alpha, beta, activation, out,
               kernel, strategy, precision=None):
    """A key that fixes everything validation and dispatch decide for a call, or None when the call has
    arguments this key cannot vouch for (anything but numpy / cupy arrays, ints, strings and tuples or
    lists of them for the geometry, int / float scalars):
    those calls take the full path every time. Operands are keyed by shape, strides, dtype and device
    (the device of a CuPy array; NumPy arrays all have None), scalars by type and value, and the
    :func:`cuconv.overrides` block in force is part of it (the environment's overrides are read once
    per process: :func:`cuconv.overrides.env_overrides`).

    Every repeated call builds this key, so it is written for speed: one tuple, x's and w's attributes
    read in place."""
    tx = type(x)
    if tx is _NUMPY_NDARRAY:
        on_gpu = False
    elif tx is (_CUPY_NDARRAY or _cupy_ndarray()):
        on_gpu = True
    else:
        return None
    if (type(groups) is not int or type(alpha) not in _SCALAR_TYPES or type(beta) not in _SCALAR_TYPES
            or type(w) is not tx):
        return None
    # stride, padding and dilation as ints (the usual case, tested first), or as sequences of ints / pairs
    if type(stride) is not int:
        stride = _geometry_key(stride)
    if type(padding) is not int:
        padding = _geometry_key(padding)
    if type(dilation) is not int:
        dilation = _geometry_key(dilation)
    if stride is NO_KEY or padding is NO_KEY or dilation is NO_KEY:
        return None
    if bias is None and residual is None and out is None:
        operands = ()
    else:
        try:
            operands = (_operand_key(bias, tx), _operand_key(residual, tx), _operand_key(out, tx))
        except KeyError:
            return None
        if out is not None and not on_gpu and not out.flags.writeable:
            return None
    return (nd, x.shape, x.strides, x.dtype, x.data.device_id if on_gpu else None, w.shape, w.strides, w.dtype,
            w.data.device_id if on_gpu else None, operands, stride, padding, dilation, groups, layout, alpha,
            type(alpha), beta, type(beta), activation, kernel, strategy, precision, active_overrides())


def _conv(nd, x, w, bias, stride, padding, dilation, groups, layout, residual, alpha, beta, activation, out,
          kernel, strategy, precision=None):
    key = _signature(nd, x, w, bias, stride, padding, dilation, groups, layout, residual, alpha, beta, activation,
                     out, kernel, strategy, precision)
    try:
        known = None if key is None else _CALLS.get(key)
    except TypeError:  # an unhashable argument (a layout or activation of the wrong type): validation says so
        key = known = None
    if known is not None and known.replay is not None:
        result = known.replay(x, w, bias, residual, out)
        if result is not None:
            return result
    return _conv_on_device(key, known, nd, x, w, bias, stride, padding, dilation, groups, layout, residual, alpha,
                           beta, activation, out, kernel, strategy, precision)


@on_device_of(3)
def _conv_on_device(key, known, nd, x, w, bias, stride, padding, dilation, groups, layout, residual, alpha, beta,
                    activation, out, kernel, strategy, precision):
    """A call the memo cannot replay: validated and planned (and memoised under ``key``), or, for a
    signature seen before, run with what depends on the arrays' identities decided again."""
    if known is None:
        call = _prepare(nd, x, w, bias, stride, padding, dilation, groups, layout, residual, alpha, beta,
                        activation, out, kernel, strategy, precision)
        plan = call.plan
        device_id = None if call.xp is np else call.x.device.id
        if key is not None:
            if len(_CALLS) >= _CALLS_LIMIT:
                _CALLS.clear()
            move_xw = operands_mover_for(plan, x, w, call.xp) if call.channels_first else None
            _CALLS[key] = _Known(plan, call.xp, device_id, call.channels_first,
                                 (x.shape[0], *call.problem.out_shape[1:]), call.cf_out, call.x is x, call.w is w,
                                 call.bias is bias, move_xw,
                                 _Replay.of(call, x, w, bias, residual, out, device_id, move_xw))
        execute(plan, call.xp, device_id, call.x, call.w, call.bias, call.residual, call.out_native)
        return deliver(call.xp, call.out_native, call.out_user, call.out_given, call.channels_first, call.cf_out)
    # A signature seen before: its validation and plan hold; what depends on the arrays' identities
    # (the residual written in place, overlaps with out) is decided again.
    xp, cf = known.xp, known.channels_first
    if cf:
        x_n, w_n = known.move_xw(x, w)
    else:
        x_n = x if known.x_native else _to_native(x, False, xp)
        w_n = w if known.w_native else _to_native(w, False, xp)
    b_n = bias if known.bias_native else _to_native(bias, False, xp)
    res, out_native = residual_and_output(xp, residual, residual, out, out, cf, known.native_out_shape, x.dtype,
                                          known.cf_out, (x_n, w_n, b_n))
    execute(known.plan, xp, known.device_id, x_n, w_n, b_n, res, out_native)
    return deliver(xp, out_native, out, out, cf, known.cf_out)


_COMMON_DOC = """
    Parameters
    ----------
    x : array
        Input activations: ``{xshape}`` for layout ``"{native}"`` (native, fastest) or ``{xshape_cf}``
        for ``"{cf}"``. A NumPy array runs on the CPU and returns NumPy; a CuPy array (or a GPU tensor
        exposing ``__cuda_array_interface__`` / ``__dlpack__``, e.g. torch or JAX) runs on its GPU and
        returns CuPy. dtype float16, bfloat16 (``ml_dtypes.bfloat16``), float32 or float64;
        non-contiguous arrays are accepted.
    w : array
        Filters: ``{wshape}`` for ``"{native}"``, ``{wshape_cf}`` for ``"{cf}"`` (as torch). Same dtype
        and device as ``x``.
    bias : array, optional
        ``(K,)``, same dtype as ``x``.
    stride, dilation : int or sequence of {nd} ints
        Each >= 1.
    padding : int, {nd} ints, {nd} (lo, hi) pairs, "valid" or "same"
        Zero padding per spatial dim. ``"same"`` gives an output of ``ceil(in / stride)``, the odd
        element of padding going at the end (as TensorFlow / JAX ``SAME``).
    groups : int
        Grouped convolution; must divide C and K. ``groups == C == K`` is depthwise.
    layout : {layouts}
        Memory layout of ``x``, ``w``, ``residual``, ``out`` and the result.
    residual : array, optional
        Added as ``beta * residual``; output shape and dtype. May be ``out`` itself (in place).
    alpha, beta : float
        Scales of the convolution and of the residual.
    activation : None, "relu", "silu" or "gelu"
        Applied last; ``"gelu"`` is the exact (erf) form.
    out : array, optional
        Written with the result and returned. Nothing else the caller passed is modified. It may be
        the residual (an in-place add) or share memory with x, w or the bias (``out=x`` where the
        shapes allow): the result is then computed apart and copied into it.
    kernel : str, optional
        Force one kernel by name (see :func:`cuconv.explain`); raises
        :class:`cuconv.KernelDeclined` (a ValueError) if that kernel does not support the problem.
    precision : None, "float32", "tf32" or "float64"
        How the products and sums are computed. None: the dtype's own ("float32" for float32 data,
        "float64" for float64 data; float16 / bfloat16 multiply exactly into an fp32 accumulator).
        "float32": relative error at most 1e-5 of the result against float64 on normally
        distributed data (fp32 FMAs, or on Hopper split bf16 products: each output within
        3 * 2^-16 of the convolution of |x| and |w|, about 4e-6 of a layer's result). "tf32": each product of operands
        reduced to TF32 (10 mantissa bits; on Hopper the tf32 tensor cores truncate, elsewhere cuBLAS
        rounds), fp32 accumulation (about 1e-3 relative error, the default of cuDNN under torch). "float64": float64 products and sums. float16 / bfloat16
        data take None only; float64 data take None, "float64" or "float32" (not "tf32"). A kernel
        that cannot honour the precision declines; :func:`cuconv.explain` names the one that ran.

    Returns
    -------
    array
        ``act(alpha * conv(x, w) + bias + beta * residual)`` with the dtype of ``x`` (accumulated in
        float32, or in float64 at ``precision="float64"``), in ``layout``, as the array library of ``x``.

    Raises
    ------
    ValueError, TypeError
        For every invalid argument, naming the argument, what was expected and what was given.
"""


def conv2d(x, w, bias=None, *, stride=1, padding=0, dilation=1, groups=1, layout="NHWC", residual=None,
           alpha=1.0, beta=1.0, activation=None, out=None, kernel=None, precision=None):
    return _conv(2, x, w, bias, stride, padding, dilation, groups, layout, residual, alpha, beta, activation,
                 out, kernel, None, precision)


conv2d.__doc__ = """2-D convolution (cross-correlation, as in deep learning) with a fused epilogue.

    ``out = act(alpha * conv(x, w) + bias + beta * residual)``, each term only when given.
""" + _COMMON_DOC.format(nd=2, xshape="(N, H, W, C)", xshape_cf="(N, C, H, W)", native="NHWC", cf="NCHW",
                         wshape="(K, R, S, C // groups)", wshape_cf="(K, C // groups, R, S)",
                         layouts='"NHWC" or "NCHW"') + """
    Examples
    --------
    >>> import numpy as np, cuconv
    >>> x = np.random.rand(1, 8, 8, 4).astype(np.float32)
    >>> w = np.random.rand(16, 3, 3, 4).astype(np.float32)
    >>> cuconv.conv2d(x, w, padding="same", activation="relu").shape
    (1, 8, 8, 16)
"""


def conv3d(x, w, bias=None, *, stride=1, padding=0, dilation=1, groups=1, layout="NDHWC", residual=None,
           alpha=1.0, beta=1.0, activation=None, out=None, strategy="auto", kernel=None, precision=None):
    return _conv(3, x, w, bias, stride, padding, dilation, groups, layout, residual, alpha, beta, activation,
                 out, kernel, strategy, precision)


conv3d.__doc__ = """3-D convolution with a fused epilogue; see :func:`conv2d` for the semantics.
""" + _COMMON_DOC.format(nd=3, xshape="(N, D, H, W, C)", xshape_cf="(N, C, D, H, W)", native="NDHWC",
                         cf="NCDHW", wshape="(K, T, R, S, C // groups)", wshape_cf="(K, C // groups, T, R, S)",
                         layouts='"NDHWC" or "NCDHW"') + """
    strategy : "auto", "qslice", "native" or "generic"
        How a 3-D problem is computed on the GPU: ``"auto"`` lets the dispatcher choose (see
        :func:`cuconv.explain`); the others restrict the choice to kernels of that strategy and fail
        with :class:`cuconv.KernelDeclined` if none of them supports the problem. On the CPU every
        strategy runs the NumPy kernel.
"""


def explain(x, w, bias=None, *, stride=1, padding=0, dilation=1, groups=1, layout=None, residual=None,
            alpha=1.0, beta=1.0, activation=None, out=None, kernel=None, strategy="auto", precision=None):
    """Which kernel :func:`conv2d` / :func:`conv3d` would run for these arguments, and why.

    Takes the same arguments (the rank comes from ``layout``, or from ``x.ndim`` when ``layout`` is
    None: 4-D -> conv2d NHWC, 5-D -> conv3d NDHWC). Validates them exactly as the call would, runs
    nothing, and returns a :class:`cuconv.Explanation`: ``.kernel`` is the chosen kernel,
    ``.precision`` the precision it computes at, ``.declined`` maps every kernel that said no to its
    reason. ``print()`` it for a summary. Inside :func:`cuconv.autotune` it measures the problem's
    candidates as the call would (once per problem; on operands of its own), and ``.tuning`` lists
    their times.
    """
    if layout is None:
        ndim = as_array(x, "x").ndim
        if ndim not in (4, 5):
            raise ValueError(f"x: expected a 4-D (conv2d) or 5-D (conv3d) array, got ndim={ndim}")
        layout = "NHWC" if ndim == 4 else "NDHWC"
    if not isinstance(layout, str) or layout.upper() not in LAYOUTS:
        ndim = as_array(x, "x").ndim
        if ndim in (4, 5):
            layout_of(layout, ndim - 2)  # the message conv2d / conv3d would give
        raise ValueError(f"layout: expected one of {list(LAYOUTS)}, got {layout!r}")
    nd = LAYOUTS[layout.upper()][0]
    call = _prepare(nd, x, w, bias, stride, padding, dilation, groups, layout, residual, alpha, beta, activation,
                    out, kernel, strategy, precision)
    explanation = call.explanation
    # the dispatcher memoises explanations: hand out a copy the caller may keep or change
    copy = dataclasses.replace(explanation, declined=dict(explanation.declined), skipped=dict(explanation.skipped))
    if call.problem.epilogue.alpha == 0:
        copy.reason = ("alpha = 0: the convolution is not computed, the epilogue runs alone "
                       f"(act(bias + beta * residual)); for alpha != 0: {copy.reason}")
    elif call.out_native.shape[0] == 0:
        copy.reason = f"an empty batch: nothing is computed; for images: {copy.reason}"
    return copy
