"""Non-overlapping patches on Hopper: ``sm90_patch``, the filter's width read as channels through a view.

A patch embedding (a ViT's 16x16 stride-16 convolution of an RGB image, a 2x2 stride-2 one of a latent)
has few input channels, which the Hopper kernel cannot read (it needs 16-byte pixel rows, C a multiple
of 8). Where the filter's columns do not overlap along W (stride S, no padding, dilation 1 along W, W a
multiple of S), the S input columns of output column q are the contiguous run ``x[n, h, q S : q S + S, :]``
of S * C elements, so channels-last x *is* the width-folded input, and w the folded filter::

    x (N, H, W, C)  ==view==  x' (N, H, W / S, S * C)      w (K, R, S, C)  ==view==  w' (K, R, 1, S * C)
    x' (*) w' with an R x 1 filter, stride (sh, 1), dilation (dh, 1), padding (ph, 0): the same output

The folded problem (``sm90_fold``'s, without its pre-pass: :func:`.fold.fold_width_problem`) runs on the
Hopper kernel where ``S * C`` is a multiple of 8 (16 x 3 = 48 for a ViT, 2 x 4 = 8 for a latent): no pass,
no copy. Where the rows do not overlap either (stride R, no padding, dilation 1 along H, H a multiple of R:
a patch embedding), each output row's R input rows are one image of R rows, and the batch takes them::

    x' (N, H, Q, S * C)  ==view==  x'' (N * P, R, Q, S * C)     out (N, P, Q, K)  ==view==  (N * P, 1, Q, K)

which the Hopper kernel reads at stride 1 (its TMA im2col boxes step at most 8 rows: a ViT's stride of 16
would not fit), channels-last (a channels-first result goes through the caller's transpose).

Its priority (60) is above ``sm80_igemm``'s (50), which would pad C to 4 or 8 in a pre-pass, and below the
few-channel kernels (``smallc_mma``, ``smallc_direct``), which take the small windows.
"""

from __future__ import annotations

from ...plan import SIXTEEN_BIT, Declined
from ...registry import register
from .fold import fold_width_problem
from .kernel import RewritingKernel, RewritingPlan, Sm90TmaKernel

__all__ = ["Sm90PatchKernel", "PatchPlan", "patch_decline", "patch_problem"]


def patch_decline(problem):
    """Why the width of ``problem``'s filter cannot be read as channels through a view, or None: conv2d
    with columns that do not overlap (stride S, dilation 1, no padding along W, W a multiple of S, S > 1),
    S x C a multiple of 8, and C not one (the Hopper kernel then takes the problem as it is)."""
    if problem.nd != 2:
        return "conv3d: the view folds a 2-D filter's width"
    (_, W), (_, S) = problem.in_spatial, problem.filter_spatial
    if S == 1:
        return "a one-column filter: no width to fold"
    if problem.channels % 8 == 0:
        return f"C = {problem.channels}, a multiple of 8: sm90_tma reads the problem as it is"
    if problem.stride[1] != S or problem.dilation[1] != 1 or problem.pad_lo[1] or problem.pad_hi[1]:
        return (f"overlapping or spaced filter columns (stride {problem.stride[1]}, dilation {problem.dilation[1]}, "
                f"padding {problem.pad_lo[1]}/{problem.pad_hi[1]} along W for {S} columns): the view needs "
                f"stride = filter width, dilation 1 and no padding along W")
    if W % S:
        return f"W = {W} is not a multiple of the filter width {S}: the view needs whole patches"
    if (S * problem.channels) % 8:
        return (f"a patch row of {S} x {problem.channels} = {S * problem.channels} channels: the Hopper kernel "
                f"needs a multiple of 8")
    return None


def _rows_collapse(problem) -> bool:
    """Whether the filter's rows do not overlap either (stride R, dilation 1, no padding along H, H = P x R,
    R > 1): each output row reads its own R input rows."""
    (H, _), (R, _) = problem.in_spatial, problem.filter_spatial
    return (R > 1 and problem.stride[0] == R and problem.dilation[0] == 1 and not problem.pad_lo[0]
            and not problem.pad_hi[0] and H == problem.out_spatial[0] * R)


def patch_problem(problem):
    """The problem the Hopper kernel runs on the views of ``problem``'s operands (a :func:`patch_decline`
    None one): the width-folded problem, with its rows as images where they do not overlap (channels-last
    then, whatever ``problem``'s layout)."""
    from ...problem import ConvProblem
    folded = fold_width_problem(problem, problem.channels, problem.dtype, problem.layout)
    if not _rows_collapse(problem):
        return folded
    (R, _), (P, Q) = problem.filter_spatial, problem.out_spatial
    return ConvProblem.create(nd=2, batch=problem.batch * P, in_spatial=(R, Q), channels=folded.channels,
                              out_channels=problem.out_channels, filter_spatial=(R, 1), stride=1, dilation=1,
                              padding=0, groups=1, dtype=problem.dtype, layout="NHWC", epilogue=problem.epilogue)


class Sm90PatchKernel(RewritingKernel):
    """conv2d of 16-bit data over non-overlapping patches along W: x and w viewed as width-folded, then the
    wgmma kernel."""

    name = "sm90_patch"
    backend = "cuda"
    priority = 60
    spatial_dims = (2,)
    precisions = SIXTEEN_BIT

    def rewrite_plan(self, problem, device, overrides):
        why = patch_decline(problem)
        if why is not None:
            return Declined(why)
        inner_problem = patch_problem(problem)
        inner = self.inner.make_plan(inner_problem, device, overrides)
        if not inner:
            return Declined(f"the viewed convolution ({inner_problem.channels} channels under a "
                            f"{problem.filter_spatial[0]}x1 filter): {inner.reason}")
        S = problem.filter_spatial[1]
        return PatchPlan(self, problem, device, inner,
                         f"non-overlapping patches along W: each output column's {S} input columns are one run of "
                         f"{S * problem.channels} channels (a view of x and w, no pass), then the Hopper kernel")


class PatchPlan(RewritingPlan):
    """The Hopper plan of the viewed problem, run on views of x and w."""

    def __init__(self, kernel, problem, device, inner, reason: str):
        super().__init__(kernel, problem, device, inner, reason)
        self.writes_channels_first = inner.writes_channels_first
        ip = inner.problem
        self._x_shape, self._w_shape = ip.x_shape, ip.w_shape
        # the result's shape as the inner plan takes it: its own where it writes channels-first
        self._out_shape = ((ip.batch, ip.out_channels, *ip.out_spatial) if inner.writes_channels_first
                           else ip.out_shape)

    def describe(self) -> str:
        p, ip = self.problem, self.inner.problem
        S = p.filter_spatial[1]
        rows = (f", each output row's {p.filter_spatial[0]} input rows an image of the batch ({ip.batch})"
                if ip.batch != p.batch else "")
        return (f"patch view: x as {p.in_spatial[1] // S} columns of {S} x {p.channels} channels{rows}, w under a "
                f"{p.filter_spatial[0]}x1 filter, then {self.inner.describe()}")

    def run(self, x, w, bias, residual, out):
        import cupy as cp
        x, w = (a if a.flags.c_contiguous else cp.ascontiguousarray(a) for a in (x, w))
        out_v = out.reshape(self._out_shape)
        res_v = None if residual is None else out_v if residual is out else residual.reshape(self._out_shape)
        self.inner.run(x.reshape(self._x_shape), w.reshape(self._w_shape), bias, res_v, out_v)


register(Sm90PatchKernel(Sm90TmaKernel()))
