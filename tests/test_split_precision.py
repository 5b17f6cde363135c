"""``sm90_bf16x3`` (float32 data on Hopper as split bf16 parts): the dispatcher's choices, on the CPU.

The kernel serves float32 at precision "float32" and "tf32" (split products are more accurate than
TF32), declines everything else with a reason, and plans the Hopper kernel's split-x variant on the
16-bit view of x where C is a multiple of 16 (x split in registers, the filter split per 16 channels),
else its float32-output variant on 3 x Cp bf16 channels (C rounded up to a multiple of 8).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings

from cuconv import dispatch
from cuconv.backends.sm90.split_precision import X_PARTS, W_PARTS, padded_channels
from cuconv.backends.sm90.variants import COMPILE_VARIANTS, kernel_name
from cuconv.problem import ConvProblem, Epilogue

from geometry import A100, H100, Case, cases


def _problem(C=64, K=64, dtype="float32", precision=None, layout="NHWC", groups=1, residual=False, **kw):
    return ConvProblem.create(nd=2, batch=2, in_spatial=(20, 20), channels=C, out_channels=K, filter_spatial=(3, 3),
                              stride=kw.get("stride", 1), dilation=1, padding=1, groups=groups, dtype=dtype,
                              layout=layout, epilogue=Epilogue(has_bias=True, has_residual=residual),
                              precision=precision)


@pytest.mark.parametrize("C", [2, 3, 4, 8, 13, 64, 100, 512])
@pytest.mark.parametrize("precision", [None, "tf32"])
def test_float32_runs_split_on_hopper(C, precision):
    """float32 runs the split by default; at "tf32" sm90_tf32 comes first (tests/test_tf32_gpu.py) and the
    split serves it when forced, more accurately than asked."""
    auto, _ = dispatch.select(_problem(C=C, precision=precision), H100)
    tf32_takes = C % 4 == 0 or 3 * 8 * -(-C // 4) <= 64  # the 16-bit view, or its 3x3 width fold
    if C <= 8 and 9 * C <= (64 if precision == "tf32" else 196):  # few channels: exact fp32 multiply-adds
        # (tests/test_smallc.py; float32 at precision "float32" takes up to 196 per output there)
        assert auto.kernel.name == "smallc_direct"
    else:
        assert auto.kernel.name == ("sm90_tf32" if precision == "tf32" and tf32_takes else "sm90_bf16x3")
    plan, _ = dispatch.select(_problem(C=C, precision=precision), H100, forced="sm90_bf16x3")
    assert plan.kernel.name == "sm90_bf16x3"
    inner = plan.inner
    assert inner.out_f32 and inner.problem.dtype == "bfloat16"
    assert ("more accurate than tf32 asks" in plan.reason) == (precision == "tf32")
    if C % 16 == 0:  # x split in registers (test_x_splits_in_registers)
        assert inner.xsplit and inner.problem.channels == 2 * C and "_xs" in plan.describe()
        return
    assert not inner.xsplit and f"C={C} is not a multiple of 16" in plan.reason
    assert inner.problem.channels == (3 * 3 if plan.folded else 3) * padded_channels(C)  # 3x3: 3 columns folded
    assert padded_channels(C) % 8 == 0 and plan.folded == (3 * padded_channels(C) < 64)
    assert padded_channels(C) - C < 8
    assert "_f32" in plan.describe() and "split_bf16x3" in plan.describe()


@pytest.mark.parametrize("nd", [2, 3])
@pytest.mark.parametrize("C,K,residual,f", [(16, 64, False, 3), (48, 3, True, 3), (64, 64, True, 3),
                                            (512, 100, False, 1)])
def test_x_splits_in_registers(nd, C, K, residual, f):
    """C a multiple of 16 on a memory-bound layer: the kernel's split-x variant on x's 16-bit view (no
    copy of x, no C ring: its consumers read the float32 residual), the filter split into a (K, taps,
    2C) 16-bit buffer."""
    spatial, filt = ((6, 20, 20), (f,) * 3) if nd == 3 else ((20, 20), (f, f))
    p = ConvProblem.create(nd=nd, batch=2, in_spatial=spatial, channels=C, out_channels=K, filter_spatial=filt,
                           stride=1, dilation=1, padding=1, groups=1, dtype="float32",
                           layout="NHWC" if nd == 2 else "NDHWC",
                           epilogue=Epilogue(has_bias=True, has_residual=residual))
    plan, _ = dispatch.select(p, H100, forced="sm90_bf16x3" if nd == 2 else "conv3d_native_bf16x3")
    inner = plan.inner
    assert inner.xsplit and not inner.tf32 and inner.out_f32
    assert inner.problem.channels == 2 * C and inner.problem.w_shape == (K, *filt, 2 * C)
    assert inner.cfg.block_m == 128 and inner.cfg.block_n == (16 if K <= 16 else 64 if K <= 64 else 128)
    (source, defines), (split_source, _) = plan.compile_jobs()
    assert defines["SM90_XSPLIT"] == 1 and defines["SM90_OUT_F32"] == 1 and defines["SM90_HAS_RESIDUAL"] == 0
    assert split_source == "precision/split_bf16.cu"
    assert (source, defines, "sm_90a") in COMPILE_VARIANTS  # CI compiles every variant the policy picks
    assert "x split in registers" in plan.describe() and "in registers against a filter split" in plan.reason


@pytest.mark.parametrize("C,hw,filt,n,registers", [(256, 56, 1, 32, True), (128, 56, 1, 32, True),
                                                   (512, 64, 3, 1, False), (128, 512, 3, 1, False),
                                                   (256, 14, 3, 32, False)])
def test_compute_bound_layers_keep_the_split_pass(C, hw, filt, n, registers):
    """The register split stalls the tensor cores for a share of the products' time; where that is more
    than the split pass over x takes (docs/tuning.md#T-f32-xsplit), x is split by the pass."""
    p = ConvProblem.create(nd=2, batch=n, in_spatial=(hw, hw), channels=C, out_channels=C, filter_spatial=(filt, filt),
                           stride=1, dilation=1, padding=filt // 2, groups=1, dtype="float32", layout="NHWC")
    plan, _ = dispatch.select(p, H100)
    assert plan.kernel.name == "sm90_bf16x3" and plan.inner.xsplit == registers
    assert ("would stall the tensor cores" in plan.reason) == (not registers)


@pytest.mark.parametrize("C,x_channels", [(60, 128), (124, 256), (100, 3 * 104), (24, 72), (200, 3 * 200)])
def test_x_is_two_parts_where_blocks_align(C, x_channels):
    """Cp a multiple of 64: x holds [hi | lo] and the kernel reads the third block from the first."""
    plan, _ = dispatch.select(_problem(C=C), H100)
    assert plan.inner.x_channels == x_channels and plan.inner.problem.channels == 3 * padded_channels(C)
    assert ("hi blocks read twice" in plan.describe()) == (x_channels == 2 * padded_channels(C))


@pytest.mark.parametrize("C,filt,stride,folded", [(3, 7, 2, True), (4, 3, 1, True), (12, 3, 1, True),
                                                  (3, 1, 1, False), (24, 3, 1, False), (72, 3, 1, False)])
def test_few_channels_fold_the_filter_width(C, filt, stride, folded):
    """3 * Cp < 64 under a filter wider than one column: S columns folded into the channels, an R x 1
    filter over (N, H, Q, S * 3 Cp), the same output."""
    p = ConvProblem.create(nd=2, batch=2, in_spatial=(30, 26), channels=C, out_channels=64,
                           filter_spatial=(filt, filt), stride=stride, dilation=1, padding=filt // 2, groups=1,
                           dtype="float32", layout="NHWC")
    plan, _ = dispatch.select(p, H100, forced="sm90_bf16x3")  # few-channel ones run smallc_direct by default
    assert plan.kernel.name == "sm90_bf16x3" and plan.folded == folded
    ip = plan.inner.problem
    assert ip.out_spatial == p.out_spatial
    if folded:
        assert ip.filter_spatial == (filt, 1) and ip.stride == (stride, 1) and ip.pad_lo == (filt // 2, 0)
        assert ip.in_spatial == (30, p.out_spatial[1]) and ip.channels == filt * 3 * padded_channels(C)
        assert "folded into the channels" in plan.describe()


def test_channels_first_float32_moves_the_result():
    """The float32 epilogue stores channels-last: a channels-first call's result is transposed back."""
    plan, _ = dispatch.select(_problem(layout="NCHW", residual=True), H100)
    assert plan.kernel.name == "sm90_bf16x3" and not plan.writes_channels_first
    assert plan.inner.problem.layout == "NHWC" and not plan.inner.writes_channels_first


@pytest.mark.parametrize("problem,why", [
    (_problem(C=8, K=8, groups=2), "groups=2"),
])
def test_declines_with_a_reason(problem, why):
    plan, explanation = dispatch.select(problem, H100)
    assert plan.kernel.name != "sm90_bf16x3"
    assert why in explanation.declined["sm90_bf16x3"]


@pytest.mark.parametrize("K", [3, 4, 12, 65])
def test_any_output_width(K):
    """The float32 epilogue stores any K (4-byte accesses for odd K): decoders' last layers included
    (narrowk_direct runs them by default where K <= 8)."""
    plan, _ = dispatch.select(_problem(C=128, K=K), H100, forced="sm90_bf16x3")
    assert plan.kernel.name == "sm90_bf16x3" and plan.inner.problem.out_channels == K


def test_conv3d_float32_runs_split_on_hopper():
    p = ConvProblem.create(nd=3, batch=1, in_spatial=(5, 12, 12), channels=8, out_channels=16,
                           filter_spatial=(3, 3, 3), stride=1, dilation=1, padding=1, groups=1, dtype="float32",
                           layout="NCDHW")  # 8 x 27 = 216 multiply-adds per output: past smallc_direct's 196
    plan, _ = dispatch.select(p, H100)
    assert plan.kernel.name == "conv3d_native_bf16x3" and not plan.folded  # the width fold is conv2d's
    assert plan.inner.problem.nd == 3 and plan.inner.problem.layout == "NDHWC"
    assert plan.inner.problem.channels == 3 * 8 and plan.inner.out_f32
    plan, _ = dispatch.select(p, H100, strategy="native")
    assert plan.kernel.name == "conv3d_native_bf16x3"


def test_other_dtypes_and_devices_are_declined():
    for p in (_problem(dtype="bfloat16"), _problem(precision="float64"), _problem(dtype="float64")):
        _, explanation = dispatch.select(p, H100)
        assert explanation.declined["sm90_bf16x3"].startswith("dtype ")
    _, explanation = dispatch.select(_problem(), A100)
    assert "needs a Hopper GPU" in explanation.declined["sm90_bf16x3"]


def test_parts_layout_gives_the_three_products():
    """x blocks [hi, lo, hi] against w blocks [hi, hi, lo]: hi*hi + lo*hi + hi*lo, never lo*lo."""
    pairs = {(X_PARTS >> b & 1, W_PARTS >> b & 1) for b in range(3)}
    assert pairs == {(0, 0), (1, 0), (0, 1)}


def test_float32_output_variants_are_compiled_in_ci():
    """Every float32-output variant is in the compile list, with no epilogue-load warp."""
    f32 = [d for _, d, _ in COMPILE_VARIANTS if d.get("SM90_OUT_F32")]
    assert f32 and all(d["SM90_HAS_RESIDUAL"] == 0 and d["CUCONV_DTYPE"] == 1 for d in f32)
    plan, _ = dispatch.select(_problem(C=256, K=256, residual=True), H100)
    assert kernel_name(plan.inner.cfg, True, 2, False, True).endswith("_f32")
    assert plan.inner.compile_jobs()[0][1]["SM90_HAS_RESIDUAL"] == 0


# ------------------------------------------------------------------------------ a NumPy model of the path
def split_model(a, lo_parts: int, parts: int = 3, fold=None):
    """What kernels_cu/precision/split_bf16.cu writes for a (rows, C) float32 matrix ``a`` (the kernel's
    index math, in NumPy): per destination row and tap, ``parts`` blocks of Cp bf16 values, hi or lo."""
    import ml_dtypes
    c = a.shape[-1]
    cp_ = padded_channels(c)
    hi = a.astype(ml_dtypes.bfloat16).astype(np.float32)
    finite = np.isfinite(hi)  # a non-finite hi: hi 0, the whole value in lo
    lo = np.where(finite, (a - np.where(finite, hi, 0)).astype(ml_dtypes.bfloat16).astype(np.float32), hi)
    hi = np.where(finite, hi, 0.0)
    blocks = np.zeros((a.shape[0], 3, cp_), np.float32)
    for b in range(3):
        blocks[:, b, :c] = lo if lo_parts >> b & 1 else hi
    blocks = blocks[:, :parts]
    f = {**dict(taps=1, stride=1, dil=1, pad=0, src_w=1, dst_w=1), **(fold or {})}
    if fold is None:
        return blocks.reshape(a.shape[0], parts * cp_)
    rows = a.shape[0] // f["src_w"] * f["dst_w"]
    out = np.zeros((rows, f["taps"], parts * cp_), np.float32)
    for row in range(rows):
        nh, q = divmod(row, f["dst_w"])
        for t in range(f["taps"]):
            col = q * f["stride"] - f["pad"] + t * f["dil"]
            if 0 <= col < f["src_w"]:
                out[row, t] = blocks[nh * f["src_w"] + col].reshape(-1)
    return out.reshape(rows, -1)


def modelled_conv(problem, x, w):
    """The float64 result of the bf16 convolution sm90_bf16x3 runs on ``problem`` (NHWC float32 x, w):
    the split (and fold) by :func:`split_model`, then the inner problem's geometry. Products of bf16
    values are exact in float64, so this is the kernel's result up to its summation order."""
    from cuconv.backends.sm90.split_precision import folded_problem, folds
    import cuconv.reference as reference
    N, H, W, C = x.shape
    K, R, S, _ = w.shape
    if folds(problem):
        ip = folded_problem(problem)
        Q = problem.out_spatial[1]
        xf = split_model(x.reshape(-1, C), X_PARTS, 3, dict(taps=S, stride=problem.stride[1],
                         dil=problem.dilation[1], pad=problem.pad_lo[1], src_w=W, dst_w=Q)).reshape(N, H, Q, -1)
        wf = split_model(w.reshape(-1, C), W_PARTS, 3, dict(taps=S, stride=0, dil=1, pad=0, src_w=S, dst_w=1))
        wf = wf.reshape(K, R, 1, -1)
        geometry = dict(stride=ip.stride, dilation=ip.dilation, padding=tuple(zip(ip.pad_lo, ip.pad_hi)))
    else:
        parts = 2 if padded_channels(C) % 64 == 0 else 3
        xf = split_model(x.reshape(-1, C), X_PARTS, parts).reshape(N, H, W, -1)
        if parts == 2:  # the kernel reads the third block from the first
            xf = np.concatenate([xf, xf[..., :padded_channels(C)]], axis=-1)
        wf = split_model(w.reshape(-1, C), W_PARTS).reshape(K, R, S, -1)
        geometry = dict(stride=problem.stride, dilation=problem.dilation,
                        padding=tuple(zip(problem.pad_lo, problem.pad_hi)))
    return reference.conv2d(xf.astype(np.float64), wf.astype(np.float64), **geometry)


def split_error_bound(x, w, conv_kwargs):
    """Elementwise bound on the split products' error: hi + lo is within 2^-16 of each value, and lo x lo
    is left out, so each product is within 3 * 2^-16 of |x| |w| and the sum within 3 * 2^-16 of the
    convolution of |x| and |w|; 3.2 leaves room for the tensor cores' partial sums (at most 16 k16 steps
    of one-sided rounding, 2^-19, before each promotion)."""
    import cuconv.reference as reference
    return 3.2 * 2.0 ** -16 * reference.conv2d(np.abs(x).astype(np.float64), np.abs(w).astype(np.float64), **conv_kwargs)


def _case(C, spatial, filt, stride, dilation, padding):
    return Case(nd=2, batch=2, spatial=spatial, channels=C, out_channels=5, filt=filt, stride=stride,
                dilation=dilation, padding=padding, groups=1, dtype="float32", layout="NHWC", seed=C)


@settings(max_examples=150, deadline=None)
@given(cases(nd=2, dtypes=("float32",), groups=False, epilogue=False, max_channels=72, max_spatial=12,
             layouts=("NHWC",)))
@example(_case(3, (19, 23), (7, 7), (2, 2), (1, 1), 3))                    # an RGB stem: folded
@example(_case(5, (9, 14), (3, 4), (1, 3), (2, 2), ((1, 2), (3, 0))))     # folded, dilated, uneven padding
@example(_case(64, (7, 9), (3, 3), (2, 1), (1, 2), ((0, 1), (2, 2))))     # x as two blocks
def test_modelled_split_is_within_its_bound(case):
    """The split's index math (folds and two-block x included) and its error bound, on the CPU: the
    model of what the kernel multiplies stays within :func:`split_error_bound` of the float64 result."""
    import cuconv.reference as reference
    from geometry import make_operands
    x, w, _, _ = make_operands(case)
    kw = case.conv_kwargs()
    kw.pop("layout")
    p = ConvProblem.create(nd=2, batch=case.batch, in_spatial=case.spatial, channels=case.channels,
                           out_channels=case.out_channels, filter_spatial=case.filt, stride=case.stride,
                           dilation=case.dilation, padding=case.padding, groups=1, dtype="float32", layout="NHWC")
    want = reference.conv2d(x.astype(np.float64), w.astype(np.float64), **kw)
    got = modelled_conv(p, x, w)
    assert got.shape == want.shape
    assert np.all(np.abs(got - want) <= split_error_bound(x, w, kw) + 1e-30)
