"""Reusable convolution plans: validate and plan once, then call many times at the launch's cost.

``cuconv.conv2d`` validates every argument and looks its plan up on every call. A network's forward
pass calls the same layer with new arrays of the same shapes again and again; a :class:`ConvPlan`
(made by :func:`plan_conv2d` / :func:`plan_conv3d`, in the spirit of ``cupyx.scipy.fft.get_fft_plan``)
keeps what does not change and checks, per call, only that the arrays are what the plan was made for
(array library, shape, dtype, device). Arrays laid out like the example ones (their strides too) run the
replay of the example call: the output's allocation and the kernel's launch, with no signature to build
and look up as a repeated :func:`cuconv.conv2d` call has.

>>> plan = cuconv.plan_conv2d(x, w, bias, padding=1, activation="relu")   # doctest: +SKIP
>>> y = plan(x, w, bias)                     # same as cuconv.conv2d(x, w, bias, padding=1, activation="relu")
>>> plan(x2, w2, bias2, out=y)               # new arrays of the same shapes, written into y
"""

from __future__ import annotations

import numpy as np

from .api import _operand_key, _prepare, _Replay, deliver, execute, residual_and_output
from .arrays import as_array, contiguous_strides
from .layout import operands_for, operands_mover_for

__all__ = ["ConvPlan", "plan_conv2d", "plan_conv3d"]


class ConvPlan:
    """A validated, planned convolution for arrays of fixed shapes, dtype, layout and device.

    Call it as ``plan(x, w, bias=None, residual=None, out=None)``: ``bias`` and ``residual`` must be
    given exactly when they were given to make the plan. Returns what :func:`cuconv.conv2d` would.
    ``plan.explanation`` is the :class:`cuconv.Explanation` of the kernel that runs; the plan keeps the
    kernel plan chosen under the :func:`cuconv.overrides` in force when it was made.
    """

    def __init__(self, nd, x, w, bias, stride, padding, dilation, groups, layout, residual, alpha, beta, activation,
                 kernel, strategy, precision=None):
        call = _prepare(nd, x, w, bias, stride, padding, dilation, groups, layout, residual, alpha, beta, activation,
                        None, kernel, strategy, precision)
        self._plan, self.explanation = call.plan, call.explanation
        self._cf_out = call.cf_out
        self.problem = call.problem
        self._xp = call.xp
        self._channels_first = call.channels_first
        self._native_out_shape = (call.x.shape[0], *call.problem.out_shape[1:])
        self._user_out_shape = (self._native_out_shape if not call.channels_first else
                                (self._native_out_shape[0], self._native_out_shape[-1], *self._native_out_shape[1:-1]))
        x, w = as_array(x, "x"), as_array(w, "w")
        self._type, self._dtype = type(x), x.dtype
        self._device = None if call.xp is np else x.device.id
        self._shapes = {"x": tuple(x.shape), "w": tuple(w.shape), "bias": None if bias is None else call.bias.shape,
                        "residual": None if residual is None else self._user_out_shape}
        itemsize = np.dtype(self._dtype).itemsize
        self._contiguous = {name: None if shape is None else contiguous_strides(shape, itemsize)
                            for name, shape in self._shapes.items()}
        # Arrays like the example ones (the same library, shapes, strides, dtype and device) go straight to
        # the launch, as a repeated cuconv.conv2d call does: the plan keeps the replay of its example call,
        # the operand keys of the example and the key of an ``out`` the kernel writes as it is.
        self._example = self._operands_key(x, w, bias, residual)
        self._replay = None
        if self._example is not None:
            move_xw = operands_mover_for(call.plan, x, w, call.xp) if call.channels_first else None
            self._replay = _Replay.of(call, x, w, bias, residual, None, self._device, move_xw)
        self._out_key = (self._user_out_shape, contiguous_strides(self._user_out_shape, itemsize), self._dtype,
                         self._device)

    def _operands_key(self, x, w, bias, residual):
        """Each operand's :func:`cuconv.api._operand_key` (None for an absent one), or None where one is not
        an array of the plan's library: what a call must share with the example to run its replay."""
        tx = self._type
        try:
            return _operand_key(x, tx), _operand_key(w, tx), _operand_key(bias, tx), _operand_key(residual, tx)
        except KeyError:
            return None

    def _replays_out(self, out) -> bool:
        """Whether the replay may write ``out`` as it is: an array of the plan's library, shape and dtype,
        contiguous, on the plan's GPU (a NumPy one writeable)."""
        try:
            return _operand_key(out, self._type) == self._out_key and (self._device is not None or
                                                                      out.flags.writeable)
        except KeyError:
            return False

    def _operand(self, a, name):
        """``a`` as the plan's array kind, checked against what the plan was made for."""
        want = self._shapes[name]
        if a is None:
            if want is not None:
                raise ValueError(f"{name}: this plan was made with a {name}; pass one of shape {want}")
            return None
        if want is None:
            raise ValueError(f"{name}: this plan was made without a {name}; make a plan with one")
        if type(a) is not self._type:
            a = as_array(a, name)
            if type(a) is not self._type:
                raise TypeError(f"{name}: this plan runs on {self._type.__module__} arrays, got {type(a).__name__}")
        if a.shape != want or a.dtype != self._dtype:
            raise ValueError(f"{name}: this plan was made for shape {want} and dtype {self._dtype}, "
                             f"got shape {tuple(a.shape)} and dtype {a.dtype}")
        if self._device is not None and a.data.device_id != self._device:
            raise ValueError(f"{name}: this plan runs on GPU {self._device}, got an array on GPU {a.device.id}")
        return a

    def _contiguous_operand(self, a, name):
        """``a`` C-contiguous (itself when it already is: a stride comparison, the cheapest test): the
        bias, and x and w of a channels-last plan (a channels-first one moves them instead)."""
        if a is None:
            return None
        return a if a.strides == self._contiguous[name] else self._xp.ascontiguousarray(a)

    def __call__(self, x, w, bias=None, residual=None, out=None):
        replay = self._replay
        if replay is not None and self._operands_key(x, w, bias, residual) == self._example and (
                out is None or self._replays_out(out)):
            result = replay(x, w, bias, residual, out)
            if result is not None:
                return result
        if self._device is not None and self._xp.cuda.runtime.getDevice() != self._device:
            with self._xp.cuda.Device(self._device):  # the output and scratch land on the plan's GPU
                return self(x, w, bias, residual, out)
        xp, cf = self._xp, self._channels_first
        x, w = self._operand(x, "x"), self._operand(w, "w")
        bias, res_user = self._operand(bias, "bias"), self._operand(residual, "residual")
        out_user = None
        if out is not None:
            out_user = as_array(out, "out")
            if type(out_user) is not self._type or out_user.shape != self._user_out_shape or \
                    out_user.dtype != self._dtype:
                raise ValueError(f"out: expected a {self._type.__name__} of shape {self._user_out_shape} and dtype "
                                 f"{self._dtype}, got {type(out_user).__name__} {tuple(out_user.shape)} {out_user.dtype}")
            if xp is np and not out_user.flags.writeable:
                raise ValueError("out: expected a writeable array, got a read-only one")
        if cf:
            x_n, w_n = operands_for(self._plan, x, w, xp)
        else:
            x_n, w_n = self._contiguous_operand(x, "x"), self._contiguous_operand(w, "w")
        bias_n = self._contiguous_operand(bias, "bias")
        res, out_native = residual_and_output(xp, res_user, residual, out_user, out, cf, self._native_out_shape,
                                              self._dtype, self._cf_out, (x_n, w_n, bias_n))
        execute(self._plan, xp, self._device, x_n, w_n, bias_n, res, out_native)
        return deliver(xp, out_native, out_user, out, cf, self._cf_out)

    def __repr__(self) -> str:
        return f"<cuconv ConvPlan {self.problem.describe()} -> {self.explanation.kernel}>"


def plan_conv2d(x, w, bias=None, *, stride=1, padding=0, dilation=1, groups=1, layout="NHWC", residual=None,
                alpha=1.0, beta=1.0, activation=None, kernel=None, precision=None) -> ConvPlan:
    """A :class:`ConvPlan` for :func:`cuconv.conv2d` with these arguments (``x``, ``w``, ``bias`` and
    ``residual`` are example arrays: their shapes, dtype, library and device fix the plan's; ``precision``
    as for :func:`cuconv.conv2d`)."""
    return ConvPlan(2, x, w, bias, stride, padding, dilation, groups, layout, residual, alpha, beta, activation,
                    kernel, None, precision)


def plan_conv3d(x, w, bias=None, *, stride=1, padding=0, dilation=1, groups=1, layout="NDHWC", residual=None,
                alpha=1.0, beta=1.0, activation=None, strategy="auto", kernel=None, precision=None) -> ConvPlan:
    """A :class:`ConvPlan` for :func:`cuconv.conv3d` (see :func:`plan_conv2d`)."""
    return ConvPlan(3, x, w, bias, stride, padding, dilation, groups, layout, residual, alpha, beta, activation,
                    kernel, strategy, precision)
