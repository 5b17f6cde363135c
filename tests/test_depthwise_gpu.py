"""The depthwise kernel (``depthwise_direct``) on the GPU against the float64 reference.

gpu-marked: skipped without a GPU or on one older than sm_80. Drawn depthwise convolutions (odd and
wide channel counts, multipliers 1-3, filters up to 7x7 and, on the wide-filter shape, 7-9 wide,
strides, dilations, asymmetric padding, every dtype, NHWC / NCHW, conv2d and conv3d, the whole
epilogue) run forced onto the kernel with a NaN-poisoned output, or written in place over the
residual; the network layers it is tuned for run at full size.
"""

import numpy as np
import pytest

import cuconv

from conftest import assert_close, cupy_for_sm80, random_array
from geometry import Setting, check_depthwise_layer, check_depthwise_misaligned_views, depthwise_cases, run_property

pytestmark = pytest.mark.gpu

KERNEL = "depthwise_direct"


@pytest.fixture(scope="module")
def cp():
    return cupy_for_sm80("depthwise_direct")


SETTINGS = [
    Setting("2d", depthwise_cases(nd=2), max_examples=60),
    Setting("2d_wide", depthwise_cases(nd=2, max_channels=300, max_spatial=40, multipliers=(1,)), max_examples=25),
    Setting("2d_in_place", depthwise_cases(nd=2), in_place=True, max_examples=20),
    # the wide-filter shape (2-channel vectors, 8-output windows): 16-bit, 7-9 wide, W stride and dilation 1
    Setting("2d_wide_filter", depthwise_cases(nd=2, dtypes=("float16", "bfloat16"), max_channels=140, max_spatial=30,
                                              min_filter=7, max_filter=9, unit_w_step=True), max_examples=30),
    Setting("3d", depthwise_cases(nd=3, max_spatial=12, max_channels=24), max_examples=30),
    Setting("3d_in_place", depthwise_cases(nd=3, max_spatial=10, max_channels=20), in_place=True, max_examples=10),
]


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: s.id)
def test_drawn(cp, setting):
    run_property(cp, KERNEL, setting)


@pytest.mark.parametrize("c, hw, filt, stride, mult", [
    (144, 56, 3, 1, 1), (144, 56, 3, 2, 1), (960, 7, 3, 1, 1), (96, 56, 7, 1, 1), (192, 28, 7, 1, 1),
    (384, 14, 7, 1, 1), (768, 7, 7, 1, 1), (240, 28, 5, 2, 1), (32, 112, 3, 1, 2), (100, 23, 5, 1, 1),
    (98, 17, 7, 1, 1),
])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
def test_network_layers(cp, c, hw, filt, stride, mult, dtype, layout):
    # 16-bit filters 5 and more wide at W stride 1, multiplier 1, on planes of enough rows: the tensor-core
    # kernel's (test_depthwise_mma.py)
    from cuconv.backends.depthwise.mma import min_rows
    mma = dtype != "float32" and filt >= 5 and stride == 1 and mult == 1 and hw >= min_rows(filt)
    check_depthwise_layer(cp, "depthwise_mma" if mma else KERNEL, c, hw, filt, stride, mult, dtype, layout)


def test_misaligned_views(cp):
    """Views whose addresses are 2 bytes off the vector size go through aligned copies."""
    check_depthwise_misaligned_views(cp, KERNEL)


def test_repeated_calls_reuse_the_plan(cp):
    """The second call with other arrays of the same shapes runs the same plan with their pointers."""
    rng = np.random.default_rng(5)
    for seed in range(3):
        x = random_array(rng, (2, 12, 12, 64), "float16")
        w = random_array(rng, (64, 3, 3, 1), "float16")
        ref = cuconv.reference.conv2d(x, w, padding=1, groups=64)
        assert_close(cuconv.conv2d(cp.asarray(x), cp.asarray(w), padding=1, groups=64), ref, "float16")
