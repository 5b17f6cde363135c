"""The one validation step of a convolution call, shared by the calls, ``explain`` and the reference.

Every argument that is not an array's contents is checked here, with a ValueError or TypeError that
names the argument, says what was expected and what was given: the layout, the activation, alpha and
beta, conv3d's strategy, the precision, and the geometry (shapes, stride, padding, dilation, groups), which becomes
the :class:`~cuconv.problem.ConvProblem` (memoised on the arguments). :func:`cuconv.conv2d`,
:func:`cuconv.explain` and :mod:`cuconv.reference` all go through it, so they accept and refuse the
same calls with the same messages.
"""

from __future__ import annotations

from typing import Optional, Tuple

import numpy as np

from .arrays import real_scalar
from .problem import ACTIVATIONS, LAYOUTS, PRECISIONS, ConvProblem, Epilogue

__all__ = ["STRATEGIES", "PRECISION_VALUES", "layout_of", "activation_of", "strategy_of", "precision_of",
           "check_ranks", "conv_problem", "user_shape"]

#: The values ``precision=`` takes besides None (for float32 and float64 data; see :func:`precision_of`).
PRECISION_VALUES = ("float32", "tf32", "float64")

#: conv3d ``strategy=`` values. Each kernel declares the strategy it implements (``Kernel.strategy``).
STRATEGIES = ("auto", "qslice", "native", "generic")


def layout_of(layout, nd: int) -> str:
    """The canonical (upper-case) layout name for an ``nd``-D convolution."""
    if not isinstance(layout, str) or layout.upper() not in LAYOUTS or LAYOUTS[layout.upper()][0] != nd:
        allowed = [k for k, v in LAYOUTS.items() if v[0] == nd]
        raise ValueError(f"layout: expected one of {allowed}, got {layout!r}")
    return layout.upper()


def activation_of(activation) -> Optional[str]:
    """None or the canonical (lower-case) activation name; case does not matter, as for layouts."""
    if activation is None:
        return None
    if isinstance(activation, str) and activation.lower() in ACTIVATIONS:
        return activation.lower()
    raise ValueError(f"activation: expected None or one of {ACTIVATIONS}, got {activation!r}")


def strategy_of(strategy, nd: int) -> Optional[str]:
    """conv3d's strategy restriction (None for "auto"); conv2d takes none but "auto"."""
    if strategy is None or (isinstance(strategy, str) and strategy.lower() == "auto"):
        return None
    if not isinstance(strategy, str) or strategy.lower() not in STRATEGIES:
        raise ValueError(f"strategy: expected one of {STRATEGIES}, got {strategy!r}")
    if nd != 3:
        raise ValueError(f"strategy: only conv3d takes a strategy, got {strategy!r} for a conv{nd}d")
    return strategy.lower()


def precision_of(precision, dtype: str) -> str:
    """The precision a call computes at, for data of ``dtype``.

    The rule: float16 / bfloat16 data take ``precision=None`` only (their products are exact in the fp32
    accumulator, so there is nothing to choose). float32 data take None (= "float32"), "float32" (float32
    accuracy), "tf32" (one TF32 product per term) or "float64"; float64 data take None (= "float64"),
    "float64" or "float32" ("tf32" would round float64 operands to 10 mantissa bits and is refused).
    Case does not matter."""
    allowed = PRECISIONS[dtype]
    if precision is None:
        return allowed[0]
    if len(allowed) == 1:
        raise ValueError(f"precision: {dtype} data take precision=None only (16-bit products are exact in the fp32 "
                         f"accumulator), got {precision!r}")
    if not isinstance(precision, str) or precision.lower() not in PRECISION_VALUES:
        raise ValueError(f"precision: expected None or one of {PRECISION_VALUES}, got {precision!r}")
    value = precision.lower()
    if value not in allowed:
        raise ValueError(f"precision: {dtype} data take None or one of {allowed}, got {precision!r}")
    return value


def check_ranks(nd: int, layout: str, x, w) -> None:
    """``x`` and ``w`` must be ``nd + 2``-dimensional."""
    if x.ndim != nd + 2:
        raise ValueError(f"x: expected a {nd + 2}-D array ({layout}), got {x.ndim}-D with shape {tuple(x.shape)}")
    if w.ndim != nd + 2:
        raise ValueError(f"w: expected a {nd + 2}-D array, got {w.ndim}-D with shape {tuple(w.shape)}")


def user_shape(native_shape, layout: str) -> Tuple[int, ...]:
    """A channels-last shape in ``layout``'s order."""
    if LAYOUTS[layout][1]:
        return tuple(native_shape)
    return (native_shape[0], native_shape[-1], *native_shape[1:-1])


def _typed(v):
    """A hashable, type-exact image of an argument value (lists -> tuples, scalars -> (type, value))."""
    if isinstance(v, (list, tuple)):
        return (type(v).__name__,) + tuple(_typed(u) for u in v)
    return (type(v), v)


_PROBLEMS: dict = {}


def conv_problem(nd, x_shape, w_shape, dtype, layout, stride, padding, dilation, groups, alpha, beta, has_bias,
                 has_residual, activation, precision=None) -> ConvProblem:
    """Validate the geometry and the epilogue and build the ConvProblem, memoised on the arguments.

    ``layout``, ``activation`` and ``precision`` must already be canonical (:func:`layout_of`,
    :func:`activation_of`, :func:`precision_of`; None: the dtype's default); alpha and beta are checked
    here. An empty batch (N = 0) is valid: the problem is built for one image (the caller returns an
    empty result without running it). The memo key carries each free-form
    value's type (``1``, ``1.0`` and ``True`` hash alike, but only the int is valid), so a cached
    problem is never returned for an argument that would be refused.
    """
    alpha, beta = real_scalar(alpha, "alpha"), real_scalar(beta, "beta")
    args = (nd, tuple(x_shape), tuple(w_shape), dtype, layout, stride, padding, dilation, groups, alpha, beta,
            has_bias, has_residual, activation, precision)
    free = (stride, padding, dilation, groups)
    if all(type(v) is int or type(v) is str for v in free):
        key = args  # plain ints / strings (the usual call): their values are their types' only form
    else:
        try:  # only the caller's free-form values need their types in the key
            key = args[:5] + tuple(_typed(v) for v in free) + args[9:]
            hash(key)
        except TypeError:  # an unhashable argument: build uncached, which raises the precise error
            return _build_problem(*args)
    problem = _PROBLEMS.get(key)
    if problem is None:
        problem = _build_problem(*args)
        if len(_PROBLEMS) >= 1024:
            _PROBLEMS.clear()
        _PROBLEMS[key] = problem
    return problem


def _build_problem(nd, x_shape, w_shape, dtype, layout, stride, padding, dilation, groups, alpha, beta,
                   has_bias, has_residual, activation, precision) -> ConvProblem:
    channels_first = not LAYOUTS[layout][1]
    if channels_first:
        N, C, *spatial = x_shape
        K, Cg_w, *filt = w_shape
    else:
        N, *spatial, C = x_shape
        K, *filt, Cg_w = w_shape
    if N < 0 or any(v < 1 for v in x_shape[1:]):
        raise ValueError(f"x: every dimension but the batch must be >= 1, got shape {x_shape}")
    if any(v < 1 for v in w_shape):
        raise ValueError(f"w: every dimension must be >= 1, got shape {w_shape}")
    if isinstance(groups, (int, np.integer)) and not isinstance(groups, bool) and groups >= 1 \
            and C % groups == 0 and Cg_w * groups != C:
        raise ValueError(f"w: channel mismatch: x has C={C} channels and groups={groups}, so w needs "
                         f"C/groups={C // groups} input channels, got {Cg_w} (w shape {w_shape}, {layout})")
    epilogue = Epilogue(alpha=alpha, beta=beta, has_bias=has_bias, has_residual=has_residual, activation=activation)
    return ConvProblem.create(nd=nd, batch=max(N, 1), in_spatial=tuple(spatial), channels=C, out_channels=K,
                              filter_spatial=tuple(filt), stride=stride, dilation=dilation, padding=padding,
                              groups=groups, dtype=dtype, layout=layout, epilogue=epilogue, precision=precision)
