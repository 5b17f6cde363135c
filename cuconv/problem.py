"""The one description of a convolution: :class:`ConvProblem`.

Every public call builds exactly one ``ConvProblem`` from its arguments (after they are
validated) and hands it to the dispatcher. Backends and kernels read the geometry from it;
nobody recomputes output sizes, padding or the GEMM view.

Conventions
-----------
* ``nd`` is the number of spatial dimensions (2 for conv2d, 3 for conv3d).
* Spatial tuples are ordered outermost first: ``(H, W)`` or ``(D, H, W)``.
* The *native* layout is channels-last: activations ``(N, *spatial, C)``, weights
  ``(K, *filter, C // groups)``; the API converts ``NCHW``/``NCDHW`` to it.
* Implicit-GEMM view, per group ``g``::

      M = N * prod(out_spatial)            (one row per output pixel)
      N_gemm = K // groups                  (one column per output channel of the group)
      K_gemm = prod(filter) * (C // groups) (one reduction index per (t, r, s, c))

  with the reduction index ordered ``((t * R + r) * S + s) * Cg + c`` (channel fastest), which
  is the order of the native weight layout and of every im2col loader in cuconv.
"""

from __future__ import annotations

import math
import functools
import dataclasses
from dataclasses import dataclass, fields
from typing import Optional, Tuple

import numpy as np

__all__ = [
    "ConvProblem",
    "sixteen_bit_problem",
    "Epilogue",
    "ACTIVATIONS",
    "LAYOUTS",
    "normalize_spatial",
    "normalize_padding",
    "output_size",
    "DTYPE_NAMES",
    "PRECISIONS",
    "PRECISION_MEANING",
]

#: Activation names accepted by ``activation=`` (``None`` means identity).
ACTIVATIONS = ("relu", "silu", "gelu")

#: Layout name -> (number of spatial dims, channels-last?)
LAYOUTS = {
    "NHWC": (2, True),
    "NCHW": (2, False),
    "NDHWC": (3, True),
    "NCDHW": (3, False),
}

DTYPE_NAMES = ("float16", "bfloat16", "float32", "float64")

#: The precisions a problem of each dtype may ask for, its default first. A 16-bit dtype has only its
#: own: products of 16-bit values are exact in the fp32 accumulator, so no choice changes the result.
PRECISIONS = {
    "float16": ("float16",),
    "bfloat16": ("bfloat16",),
    "float32": ("float32", "tf32", "float64"),
    "float64": ("float64", "float32"),
}

#: What each precision promises (``cuconv.explain`` prints it).
PRECISION_MEANING = {
    "float16": "float16 products, fp32 accumulation",
    "bfloat16": "bfloat16 products, fp32 accumulation",
    "float32": "relative error at most 1e-5 of the result against float64 on normally distributed data",
    "tf32": "one TF32 product per term (operands rounded to 10 mantissa bits), fp32 accumulation",
    "float64": "float64 products and accumulation",
}

_ITEMSIZE = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8}

Ints = Tuple[int, ...]


def _is_int(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def normalize_spatial(value, nd: int, name: str, minimum: int = 1) -> Ints:
    """Turn an int or a sequence of ``nd`` ints into an ``nd``-tuple, checking ``>= minimum``."""
    if _is_int(value):
        vals = (int(value),) * nd
    elif isinstance(value, (tuple, list)) and all(_is_int(v) for v in value):
        if len(value) != nd:
            raise ValueError(f"{name}: expected an int or {nd} ints (one per spatial dim), got {value!r}")
        vals = tuple(int(v) for v in value)
    else:
        raise TypeError(f"{name}: expected an int or a sequence of {nd} ints, got {value!r}")
    if any(v < minimum for v in vals):
        raise ValueError(f"{name}: every value must be >= {minimum}, got {value!r}")
    return vals


def output_size(size: int, filt: int, stride: int, dilation: int, pad_lo: int, pad_hi: int) -> int:
    """Output extent of one spatial dim (may be < 1 for an invalid problem)."""
    extent = (filt - 1) * dilation + 1
    return (size + pad_lo + pad_hi - extent) // stride + 1


def normalize_padding(padding, nd: int, in_spatial: Ints, filt: Ints, stride: Ints,
                      dilation: Ints) -> Tuple[Ints, Ints]:
    """Resolve ``padding=`` into per-dim ``(pad_lo, pad_hi)`` tuples.

    Accepted forms: an int; one int per spatial dim; one ``(lo, hi)`` pair per spatial dim;
    ``"valid"`` (no padding); ``"same"`` (output size ``ceil(in / stride)``; when the total pad is
    odd the extra element goes at the end, as TensorFlow/JAX ``SAME`` does).
    """
    if isinstance(padding, str):
        mode = padding.lower()
        if mode == "valid":
            return (0,) * nd, (0,) * nd
        if mode == "same":
            lo, hi = [], []
            for size, f, s, d in zip(in_spatial, filt, stride, dilation):
                extent = (f - 1) * d + 1
                out = -(-size // s)
                total = max((out - 1) * s + extent - size, 0)
                lo.append(total // 2)
                hi.append(total - total // 2)
            return tuple(lo), tuple(hi)
        raise ValueError(f"padding: expected 'same', 'valid', an int, {nd} ints or {nd} (lo, hi) pairs, "
                         f"got the string {padding!r}")
    if _is_int(padding):
        lo = hi = (int(padding),) * nd
    elif isinstance(padding, (tuple, list)) and len(padding) == nd and all(_is_int(p) for p in padding):
        lo = hi = tuple(int(p) for p in padding)
    elif (isinstance(padding, (tuple, list)) and len(padding) == nd
          and all(isinstance(p, (tuple, list)) and len(p) == 2 and all(_is_int(v) for v in p)
                  for p in padding)):
        lo = tuple(int(p[0]) for p in padding)
        hi = tuple(int(p[1]) for p in padding)
    else:
        raise TypeError(f"padding: expected 'same', 'valid', an int, {nd} ints or {nd} (lo, hi) pairs, "
                        f"got {padding!r}")
    if any(v < 0 for v in lo + hi):
        raise ValueError(f"padding: must be non-negative, got {padding!r}")
    return lo, hi


def cached_fields_hash(self) -> int:
    """Hash of a frozen dataclass's fields, computed once per instance (use as ``__hash__``).

    Problems and devices are dictionary keys on every call (problem memo, kernel selection, launch
    records); the generated dataclass hash would rebuild the field tuple each time.
    """
    h = self.__dict__.get("_hash")
    if h is None:
        h = hash(tuple(getattr(self, f.name) for f in fields(self)))
        object.__setattr__(self, "_hash", h)
    return h


def fields_state(self) -> dict:
    """Pickled state (use as ``__getstate__``): the fields only (string hashes differ between processes, so a cached hash
    must not travel; cached derived shapes are recomputed)."""
    return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True)
class Epilogue:
    """What happens to the accumulator: ``act(alpha * acc + bias + beta * residual)``.

    ``has_bias`` / ``has_residual`` say whether the term is present; ``beta`` only matters with a
    residual. ``activation`` is ``None`` or one of :data:`ACTIVATIONS`.
    """

    alpha: float = 1.0
    beta: float = 1.0
    has_bias: bool = False
    has_residual: bool = False
    activation: Optional[str] = None

    __hash__ = cached_fields_hash
    __getstate__ = fields_state

    @property
    def loads_residual(self) -> bool:
        """True when the residual must actually be read (present and ``beta != 0``)."""
        return self.has_residual and self.beta != 0.0

    @property
    def activation_code(self) -> int:
        """Integer code of the activation used by every kernel: 0 none, 1 relu, 2 silu, 3 gelu."""
        return 0 if self.activation is None else 1 + ACTIVATIONS.index(self.activation)


@dataclass(frozen=True)
class ConvProblem:
    """A fully resolved, validated convolution (forward propagation).

    Build it with :meth:`ConvProblem.create`, which validates geometry and derives everything
    else; fields are then read-only.
    """

    nd: int
    batch: int
    in_spatial: Ints
    channels: int
    out_channels: int
    filter_spatial: Ints
    stride: Ints
    dilation: Ints
    pad_lo: Ints
    pad_hi: Ints
    groups: int
    dtype: str
    layout: str
    out_spatial: Ints
    epilogue: Epilogue = Epilogue()
    #: How the products and sums are computed (one of ``PRECISIONS[dtype]``); None resolves to the dtype's
    #: default. Kernels that cannot honour it decline (``Kernel.precisions``).
    precision: Optional[str] = None

    __hash__ = cached_fields_hash
    __getstate__ = fields_state

    def __post_init__(self):
        if self.dtype not in DTYPE_NAMES:
            raise TypeError(f"dtype: expected one of {DTYPE_NAMES}, got {self.dtype!r}")
        allowed = PRECISIONS[self.dtype]
        if self.precision is None:
            object.__setattr__(self, "precision", allowed[0])
        elif self.precision not in allowed:
            raise ValueError(f"precision: expected one of {allowed} for {self.dtype} data, got {self.precision!r}")

    # ------------------------------------------------------------------ construction
    @classmethod
    def create(cls, *, nd: int, batch: int, in_spatial: Ints, channels: int, out_channels: int,
               filter_spatial: Ints, stride, dilation, padding, groups: int, dtype: str, layout: str,
               epilogue: Epilogue = Epilogue(), precision: Optional[str] = None) -> "ConvProblem":
        """Validate the geometry and build the problem.

        ``stride``, ``dilation`` and ``padding`` may be given in any form the public API accepts;
        ``precision`` is None (the dtype's default) or one of ``PRECISIONS[dtype]``.
        """
        if layout not in LAYOUTS or LAYOUTS[layout][0] != nd:
            allowed = [k for k, v in LAYOUTS.items() if v[0] == nd]
            raise ValueError(f"layout: expected one of {allowed}, got {layout!r}")
        if dtype not in DTYPE_NAMES:
            raise TypeError(f"dtype: expected one of {DTYPE_NAMES}, got {dtype!r}")
        stride_t = normalize_spatial(stride, nd, "stride")
        dilation_t = normalize_spatial(dilation, nd, "dilation")
        if not _is_int(groups):
            raise TypeError(f"groups: expected an int, got {groups!r}")
        groups = int(groups)
        if groups < 1:
            raise ValueError(f"groups: must be >= 1, got {groups}")
        if channels % groups:
            raise ValueError(f"groups: must divide the input channels C={channels}, got groups={groups}")
        if out_channels % groups:
            raise ValueError(f"groups: must divide the output channels K={out_channels}, got groups={groups}")
        pad_lo, pad_hi = normalize_padding(padding, nd, in_spatial, filter_spatial, stride_t, dilation_t)
        out = tuple(output_size(*a) for a in zip(in_spatial, filter_spatial, stride_t, dilation_t, pad_lo, pad_hi))
        if any(o < 1 for o in out):
            raise ValueError(
                f"output size: must be >= 1 in every spatial dim, got {out} from input {tuple(in_spatial)}, "
                f"filter {tuple(filter_spatial)}, stride {stride_t}, dilation {dilation_t}, "
                f"padding lo {pad_lo} hi {pad_hi}")
        return cls(nd=nd, batch=int(batch), in_spatial=tuple(int(v) for v in in_spatial), channels=int(channels),
                   out_channels=int(out_channels), filter_spatial=tuple(int(v) for v in filter_spatial),
                   stride=stride_t, dilation=dilation_t, pad_lo=pad_lo, pad_hi=pad_hi, groups=groups,
                   dtype=dtype, layout=layout, out_spatial=out, epilogue=epilogue, precision=precision)

    def with_epilogue(self, epilogue: Epilogue) -> "ConvProblem":
        """The same geometry with another epilogue (used by multi-pass strategies)."""
        import dataclasses
        return dataclasses.replace(self, epilogue=epilogue)

    # ------------------------------------------------------------------ derived
    @property
    def channels_per_group(self) -> int:
        return self.channels // self.groups

    @property
    def out_channels_per_group(self) -> int:
        return self.out_channels // self.groups

    @functools.cached_property
    def gemm_m(self) -> int:
        """Rows of the implicit GEMM: one per output pixel, ``N * prod(out_spatial)``."""
        return self.batch * math.prod(self.out_spatial)

    @property
    def gemm_n(self) -> int:
        """Columns of the implicit GEMM of one group: ``K // groups``."""
        return self.out_channels_per_group

    @functools.cached_property
    def gemm_k(self) -> int:
        """Reduction length of one group: ``prod(filter) * C // groups``."""
        return math.prod(self.filter_spatial) * self.channels_per_group

    @property
    def flops(self) -> int:
        """Multiply-adds counted as 2 FLOPs, over all groups."""
        return 2 * self.gemm_m * self.gemm_n * self.gemm_k * self.groups

    @property
    def itemsize(self) -> int:
        return _ITEMSIZE[self.dtype]

    @property
    def min_bytes(self) -> int:
        """Fewest bytes a kernel must move: x, w and out once each (+ residual when it is read)."""
        x = self.batch * math.prod(self.in_spatial) * self.channels
        w = self.out_channels * math.prod(self.filter_spatial) * self.channels_per_group
        o = self.gemm_m * self.out_channels
        r = o if self.epilogue.loads_residual else 0
        return (x + w + o + r) * self.itemsize

    @property
    def is_pointwise(self) -> bool:
        """1x1(x1) filter, stride 1, no padding: the im2col matrix *is* the input."""
        return (all(f == 1 for f in self.filter_spatial) and all(s == 1 for s in self.stride)
                and not any(self.pad_lo) and not any(self.pad_hi))

    # native (channels-last) shapes
    @functools.cached_property
    def x_shape(self) -> Ints:
        return (self.batch, *self.in_spatial, self.channels)

    @functools.cached_property
    def w_shape(self) -> Ints:
        return (self.out_channels, *self.filter_spatial, self.channels_per_group)

    @functools.cached_property
    def out_shape(self) -> Ints:
        return (self.batch, *self.out_spatial, self.out_channels)

    def describe(self) -> str:
        """One line, for logs and ``explain``."""
        sp = "x".join(map(str, self.in_spatial))
        fs = "x".join(map(str, self.filter_spatial))
        pads = ",".join(f"{lo}/{hi}" for lo, hi in zip(self.pad_lo, self.pad_hi))
        return (f"conv{self.nd}d {self.dtype} (precision {self.precision}) N={self.batch} C={self.channels} {sp} "
                f"-> K={self.out_channels} filter {fs} stride {self.stride} dilation {self.dilation} pad(lo/hi) {pads} "
                f"groups {self.groups}; GEMM M={self.gemm_m} N={self.gemm_n} K={self.gemm_k}")


def sixteen_bit_problem(problem: ConvProblem, channels: int) -> ConvProblem:
    """The 16-bit (bfloat16) problem a float32 kernel hands a 16-bit one: ``channels`` channels (split
    parts, or the 16-bit view of float32 data: twice the channels), channels-last x and w (as they
    reach a plan), no precision."""
    channels_last = {"NCHW": "NHWC", "NCDHW": "NDHWC"}.get(problem.layout, problem.layout)
    return dataclasses.replace(problem, dtype="bfloat16", precision=None, channels=channels, layout=channels_last)
