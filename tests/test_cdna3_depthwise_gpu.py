"""``cdna3_depthwise`` on a ROCm GPU (gfx942 / gfx90a) against the float64 reference.

gpu-marked, and skipped unless CuPy is a ROCm build that sees a CDNA GPU: no such machine runs this
suite yet (docs/rocm.md). Drawn depthwise convolutions (odd and wide channel counts, multipliers 1-3,
filters up to 7x7, strides, dilations, asymmetric padding, every dtype, NHWC / NCHW, conv2d and conv3d,
the whole epilogue; the ones whose tile the kernel declines are skipped) run forced onto the kernel
with a NaN-poisoned output or in place over the residual; network layers run at full size, and
misaligned views go through aligned copies.
"""

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from cuconv.backends.cdna3.depthwise import Cdna3DepthwiseKernel
from cuconv.backends.cdna3.variants import SUPPORTED_ARCHS, base_arch
from cuconv.device import gpu_available
from cuconv.overrides import Overrides
from cuconv.problem import ConvProblem

from geometry import (check_case, check_depthwise_layer, check_depthwise_misaligned_views, depthwise_cases,
                      with_residual)

pytestmark = pytest.mark.gpu

KERNEL = "cdna3_depthwise"


@pytest.fixture(scope="module")
def cp():
    if not gpu_available():
        pytest.skip("needs a GPU visible to CuPy")
    import cupy
    if not cupy.cuda.runtime.is_hip:
        pytest.skip("needs a ROCm build of CuPy (cdna3_depthwise is a HIP kernel)")
    from cuconv.device import current_gpu
    if base_arch(current_gpu().arch) not in SUPPORTED_ARCHS:
        pytest.skip(f"needs gfx942 or gfx90a, the GPU is {current_gpu().arch}")
    return cupy


def _served(case) -> bool:
    from cuconv.device import current_gpu
    p = ConvProblem.create(nd=case.nd, batch=case.batch, in_spatial=case.spatial, channels=case.channels,
                           out_channels=case.out_channels, filter_spatial=case.filt, stride=case.stride,
                           dilation=case.dilation, padding=case.padding, groups=case.groups, dtype=case.dtype,
                           layout="NHWC" if case.nd == 2 else "NDHWC")
    return bool(Cdna3DepthwiseKernel().plan(p, current_gpu(), Overrides()))


CASES = st.one_of(depthwise_cases(nd=2), depthwise_cases(nd=2, max_channels=300, max_spatial=40, multipliers=(1,)),
                  depthwise_cases(nd=3, max_spatial=12, max_channels=24))


@settings(max_examples=80)
@given(case=CASES, in_place=st.booleans())
def test_drawn(cp, case, in_place):
    if in_place:
        case = with_residual(case)
    assume(_served(case))
    check_case(case, xp=cp, kernel=KERNEL, poison=not in_place, in_place=in_place)


@pytest.mark.parametrize("c, hw, filt, stride, mult", [
    (144, 56, 3, 1, 1), (144, 56, 3, 2, 1), (960, 7, 3, 1, 1), (96, 56, 7, 1, 1), (768, 7, 7, 1, 1),
    (672, 14, 5, 2, 1), (32, 112, 3, 1, 2), (100, 23, 5, 1, 1),
])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_network_layers(cp, c, hw, filt, stride, mult, dtype):
    check_depthwise_layer(cp, KERNEL, c, hw, filt, stride, mult, dtype)


def test_misaligned_views(cp):
    """Views whose addresses are 2 bytes off the vector size go through aligned copies."""
    check_depthwise_misaligned_views(cp, KERNEL)
