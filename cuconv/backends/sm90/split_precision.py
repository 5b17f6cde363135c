"""float32 convolution on Hopper tensor cores: ``sm90_bf16x3``, split bfloat16 parts + the wgmma kernel.

The Hopper kernel multiplies 16-bit operands. A float32 value ``v`` is ``hi + lo`` to 16 significant
bits (``hi = bf16(v)``, ``lo = bf16(v - hi)``, ``|v - hi - lo| <= 2^-16 |v|``), and a product of two
such values is ``hi_x hi_w + lo_x hi_w + hi_x lo_w`` to within ``3 * 2^-16`` of ``|x w|``. Those three products are one bf16
convolution over three times the channels, with the parts laid out along the channel axis
(kernels_cu/precision/split_bf16.cu)::

    x (N, H, W, C) float32   --split-->  xs (N, H, W, 3 Cp) bf16   [hi | lo | hi]   (2 Cp: [hi | lo])
    w (K, R, S, C) float32   --split-->  ws (K, R, S, 3 Cp) bf16   [hi | hi | lo]
    xs (*) ws: the Hopper kernel (TMA im2col or halo tiles, wgmma, fp32 accumulation promoted every
    two slots), its float32 epilogue variant (SM90_OUT_F32): out = act(alpha * acc + bias + beta * residual),
    all float32

``Cp`` is ``C`` rounded up to a multiple of 8 (the padding is zero), so any channel count runs. Where
``Cp`` is a multiple of 64 (the kernel's channel block), xs holds only ``[hi | lo]`` and the kernel
reads the reduction's third block from xs's first (``Sm90Plan.x_channels``): a third less written
by the split and read by the convolution. Where three parts of the channels fill less than one
block and the filter is wider than one column (an RGB stem), the split also folds the filter's S
columns into the channels (x becomes (N, H, Q, S * 3 Cp) under an R x 1 filter, :func:`folded_problem`),
so that the convolution's boxes carry whole 128-byte channel rows. The
split copies land in per-stream scratch buffers (:mod:`cuconv.scratch`) and are rewritten on every
call (x and w may change between calls). Each output is within ``3 * 2^-16`` of the convolution of
``|x|`` and ``|w|`` (plus the epilogue's fp32 rounding); the rounding errors of the parts are
unbiased, so over a layer the error is far smaller: 4.4e-6 of the result's norm on every ResNet-50
and SD VAE layer, within the 1e-5 that precision ``"float32"`` promises on normal data
(tests/test_precision_gpu.py and tests/test_split_precision_gpu.py measure it). That is about twenty
times tighter than one TF32 product, so the kernel also serves precision ``"tf32"``. The cost is three bf16 products per
term, about 1.5 times one TF32 product on the tensor cores, plus the split (x read once, and
written as 2 or 3 bf16 copies: as many bytes again, or 1.5 times).
"""

from __future__ import annotations

import numpy as np

from ...launch import RowKernel
from ...models.fold import padded_channels  # channels per part block (16-byte rows for TMA)
from ...plan import Declined, tf32_note
from ...registry import register
from ...scratch import scratch
from .fold import fold_width_problem
from ...problem import sixteen_bit_problem
from .kernel import RewritingKernel, RewritingPlan, Sm90TmaConv3d, Sm90TmaKernel

__all__ = ["Sm90SplitBf16Kernel", "Sm90SplitBf16Conv3d", "split_bf16x3", "SPLIT_SOURCE", "X_PARTS", "W_PARTS"]

SPLIT_SOURCE = "precision/split_bf16.cu"
#: Which of the three channel blocks hold ``lo`` (bit b: block b): x is [hi | lo | hi], w [hi | hi | lo].
X_PARTS, W_PARTS = 0b010, 0b100
_ARGS_FIELDS = [("rows", np.int64), ("src_row_stride", np.int64)] + [(n, np.int32) for n in (
    "C", "Cp", "lo_parts", "parts", "vec_loads", "taps", "stride", "dil", "pad", "src_w", "dst_w", "interleave")]
#: No fold: each destination row is the source row of the same index.
_NO_FOLD = dict(taps=1, stride=1, dil=1, pad=0, src_w=1, dst_w=1)
#: Where Cp is a multiple of the Hopper kernel's 64-channel block, x is stored as [hi | lo] only: the
#: kernel reads the reduction's third block (hi) from x's first (``Sm90Plan.x_channels``).
_BLOCK = 64

#: What CI compiles (tests/test_compile.py); the float32-output Hopper variants are in :mod:`.variants`.
COMPILE_VARIANTS = [(SPLIT_SOURCE, {}, arch) for arch in ("sm_80", "sm_90a")]


class _Split(RowKernel):
    """One split geometry on one GPU: ``rows`` rows of ``C`` float32 values -> ``rows`` rows of ``parts Cp``
    bf16 (``taps`` of them per row where the width folds)."""

    source, function, fields = SPLIT_SOURCE, "split_bf16x3", _ARGS_FIELDS

    def __init__(self, device_index: int, rows: int, c: int, lo_parts: int, parts: int = 3, fold=None,
                 interleave: bool = False):
        fold = fold or _NO_FOLD
        super().__init__(device_index, dict(rows=rows, src_row_stride=c, C=c, Cp=padded_channels(c),
                                            lo_parts=lo_parts, parts=parts, interleave=int(interleave), **fold),
                         rows * fold["taps"] * (padded_channels(c) // 8), c % 4 == 0)


def split_bf16x3(a, lo_parts: int, parts: int = 3):
    """The split of a C-contiguous float32 CuPy array ``a`` (``(..., C)``) into a new ``(..., parts Cp)``
    array of bf16 bit patterns (uint16), blocks laid out as ``lo_parts`` says (:data:`X_PARTS`,
    :data:`W_PARTS`; ``parts=2`` keeps the first two blocks). For tests and inspection; plans split
    into scratch buffers."""
    import cupy as cp
    if a.dtype != np.float32 or not a.flags.c_contiguous:
        raise ValueError(f"a: expected a C-contiguous float32 array, got {a.dtype} "
                         f"({'contiguous' if a.flags.c_contiguous else 'non-contiguous'})")
    c = a.shape[-1]
    if parts not in (2, 3):
        raise ValueError(f"parts: expected 2 or 3, got {parts!r}")
    out = cp.empty((*a.shape[:-1], parts * padded_channels(c)), dtype=cp.uint16)
    if a.size:
        _Split(a.data.device_id, a.size // c, c, lo_parts, parts)(a, out)
    return out


#: What both forms of the split compute (the plans' reasons).
_PRODUCTS = ("three products per term on the Hopper kernel (each output within 3 * 2^-16 of |x| (*) |w|; about "
             "4e-6 of the result on normal data)")


class Sm90SplitBf16Kernel(RewritingKernel):
    """conv2d of float32 data on Hopper: bf16 hi/lo parts, three products per term, one wgmma launch."""

    name = "sm90_bf16x3"
    backend = "cuda"
    priority = 100
    spatial_dims = (2,)
    precisions = frozenset({("float32", "float32"), ("float32", "tf32")})

    def rewrite_plan(self, problem, device, overrides):
        why_not = xsplit_declines(problem)
        if why_not is None:
            inner = self.inner.make_plan(sixteen_bit_problem(problem, 2 * problem.channels), device, overrides,
                                         out_f32=True, xsplit=True)
            why_not = xsplit_costs_more(problem, inner.cfg.block_n) if inner else f"the kernel on the 16-bit view: {inner.reason}"
            if why_not is None:
                return XSplitPlan(self, problem, device, inner,
                                  "float32 x split into bf16 hi + lo parts in registers against a filter split "
                                  f"per 16 channels, {_PRODUCTS}" + tf32_note(problem, "split bf16"))
        cp_ = padded_channels(problem.channels)
        if folds(problem):
            inner_problem, x_channels = folded_problem(problem), 0
        else:
            inner_problem = sixteen_bit_problem(problem, 3 * cp_)
            x_channels = 2 * cp_ if cp_ % _BLOCK == 0 else 0  # x as [hi | lo], its hi read twice
        inner = self.inner.make_plan(inner_problem, device, overrides, out_f32=True, x_channels=x_channels)
        if not inner:
            return Declined(f"the bf16 convolution over the {inner_problem.channels} split channels: {inner.reason}")
        return SplitBf16Plan(self, problem, device, inner,
                             f"float32 as bf16 hi + lo parts, {_PRODUCTS}; x split in a pass ahead of the kernel, "
                             f"not in registers: {why_not}" + tf32_note(problem, "split bf16"))


#: The split-in-registers cost model (docs/tuning.md#T-f32-xsplit): the register-A kernel keeps the
#: tensor cores busy for a smaller share of the time than the split pass's kernel, measured as about a
#: quarter of the products' time more at BN >= 96 and up to half at BN = 64 (n64 wgmmas are half as
#: long); the split pass reads and writes x once (8 bytes per value) and is one launch more.
_XSPLIT_STALL = {64: 0.5}
_XSPLIT_STALL_WIDE = 0.25
_TENSOR_FLOPS = 660e12   # bf16 products per second the kernel sustains (H100/H200)
_COPY_BYTES = 3.5e12     # bytes per second a streaming pass moves
_LAUNCH_S = 3e-6         # one more launch, back to back


def xsplit_costs_more(problem, block_n: int):
    """Why splitting x in registers would be slower than the split pass (None where it is faster): the
    stall share of the three products' time against the pass over x (docs/tuning.md#T-f32-xsplit)."""
    products = 3 * problem.flops / _TENSOR_FLOPS
    stall = _XSPLIT_STALL.get(block_n, _XSPLIT_STALL_WIDE) * products
    x_values = int(np.prod(problem.x_shape))
    split_pass = 8 * x_values / _COPY_BYTES + _LAUNCH_S
    if stall <= split_pass:
        return None
    return (f"splitting x in registers would stall the tensor cores for about {stall * 1e6:.1f} us, more than "
            f"the split pass over x takes ({split_pass * 1e6:.1f} us)")


def xsplit_declines(problem):
    """Why x is not split in the kernel's registers (None where it is): the kernel's A slots then hold
    32 floats per row and each 16 of them meet the filter's [hi x 16 | lo x 16] pair, so C must be a
    multiple of 16."""
    if problem.channels % 16:
        return f"C={problem.channels} is not a multiple of 16"
    return None


def folds(problem) -> bool:
    """Whether the split folds the filter width into the channels: few channels (three parts of them
    fill less than one 64-channel block) under a filter more than one column wide, in conv2d."""
    return problem.nd == 2 and 3 * padded_channels(problem.channels) < _BLOCK and problem.filter_spatial[-1] > 1


def folded_problem(problem):
    """The bf16 problem of a folded split: x (N, H, Q, S * 3 Cp) under an R x 1 filter
    (:func:`.fold.fold_width_problem`), channels-last (the float32 epilogue stores channels-last)."""
    return fold_width_problem(problem, 3 * padded_channels(problem.channels), "bfloat16", "NHWC")


class SplitBf16Plan(RewritingPlan):
    """Split x and w into scratch buffers, then the float32-output Hopper plan on the parts."""

    extra_jobs = ((SPLIT_SOURCE, {}),)

    def __init__(self, kernel, problem, device, inner, reason: str):
        super().__init__(kernel, problem, device, inner, reason)
        c, n, k = problem.channels, problem.batch, problem.out_channels
        self.folded = folds(problem)
        if self.folded:
            (H, W), (R, S), Q = problem.in_spatial, problem.filter_spatial, problem.out_spatial[1]
            self._x_parts = 3
            self._x_split = _Split(device.index, n * H * Q, c, X_PARTS, 3, dict(
                taps=S, stride=problem.stride[1], dil=problem.dilation[1], pad=problem.pad_lo[1], src_w=W, dst_w=Q))
            self._w_split = _Split(device.index, k * R, c, W_PARTS, 3, dict(taps=S, stride=0, dil=1, pad=0, src_w=S,
                                                                              dst_w=1))
        else:
            self._x_parts = inner.x_channels // padded_channels(c)  # 2 where the kernel reads hi twice, else 3
            self._x_split = _Split(device.index, n * int(np.prod(problem.in_spatial)), c, X_PARTS, self._x_parts)
            self._w_split = _Split(device.index, k * int(np.prod(problem.filter_spatial)), c, W_PARTS)

    def describe(self) -> str:
        cp_ = padded_channels(self.problem.channels)
        if self.folded:
            S = self.problem.filter_spatial[-1]
            return (f"split_bf16x3 with the filter's {S} columns folded into the channels (x as {S} x hi | lo | hi, "
                    f"w as {S} x hi | hi | lo: {S} x 3 x {cp_} channels under a {self.problem.filter_spatial[0]}x1 "
                    f"filter), then {self.inner.describe()}")
        x = ("x as hi | lo (2 x {0} channels, its hi blocks read twice)" if self._x_parts == 2
             else "x as hi | lo | hi (3 x {0} channels)").format(cp_)
        return (f"split_bf16x3: {x}, w as hi | hi | lo (3 x {cp_}), then {self.inner.describe()}")

    def run(self, x, w, bias, residual, out):
        ip = self.inner.problem
        xs = scratch("bf16x3 x", (*ip.x_shape[:-1], self.inner.x_channels), "uint16")
        ws = scratch("bf16x3 w", ip.w_shape, "uint16")
        self._x_split(x, xs)
        self._w_split(w, ws)
        self.inner.run(xs, ws, bias, residual, out)


class XSplitPlan(RewritingPlan):
    """Split w per 16 channels into a scratch buffer ([hi x 16 | lo x 16] bf16, the bytes of w; each eight
    channels in the order 0 4 1 5 2 6 3 7, as the kernel's fragments hold x's), then the split-x Hopper
    plan on x's 16-bit view (no copy of x)."""

    extra_jobs = ((SPLIT_SOURCE, {}),)

    def __init__(self, kernel, problem, device, inner, reason: str):
        super().__init__(kernel, problem, device, inner, reason)
        c, k = problem.channels, problem.out_channels
        self._w_split = _Split(device.index, k * int(np.prod(problem.filter_spatial)) * c // 16, 16, 0b10, 2,
                               interleave=True)

    def describe(self) -> str:
        return f"w split as [hi x 16 | lo x 16] per 16 channels, x split in registers: {self.inner.describe()}"

    def run(self, x, w, bias, residual, out):
        import cupy as cp
        ws = scratch("bf16x3 w pairs", self.inner.problem.w_shape, "uint16")
        self._w_split(w, ws)
        self.inner.run(x.view(cp.uint16), ws, bias, residual, out)


class Sm90SplitBf16Conv3d(Sm90SplitBf16Kernel):
    """conv3d of float32 data on Hopper ("native" strategy): the same split on the kernel's 5-D boxes or
    halo windows (no width fold)."""

    name = "conv3d_native_bf16x3"
    priority = 95
    spatial_dims = (3,)
    strategy = "native"


register(Sm90SplitBf16Kernel(Sm90TmaKernel()))
register(Sm90SplitBf16Conv3d(Sm90TmaConv3d()))
