"""Every depthwise variant the networks use compiles for sm_80 and sm_90a without spills (NVRTC, no GPU)."""

from __future__ import annotations

import pytest

from cuconv.backends.depthwise.variants import DW_SOURCE, dw_config, dw_variant
from cuconv.compiler import compile_cuda

from conftest import nvrtc_available
from geometry import problem2d, problem3d

pytestmark = pytest.mark.skipif(not nvrtc_available(), reason="needs NVRTC (cuda-bindings)")

PROBLEMS = {
    "3x3_s1_bf16": problem2d(N=32, H=56, W=56, C=144, K=144, groups=144),
    "3x3_s2_f16": problem2d(N=32, H=56, W=56, C=144, K=144, stride=2, groups=144, dtype="float16"),
    "5x5_s2_bf16": problem2d(N=32, H=28, W=28, C=240, K=240, R=5, S=5, stride=2, padding=2, groups=240),
    "7x7_s1_bf16": problem2d(N=32, H=56, W=56, C=96, K=96, R=7, S=7, padding=3, groups=96),
    "7x7_s1_f32": problem2d(N=32, H=56, W=56, C=96, K=96, R=7, S=7, padding=3, groups=96, dtype="float32"),
    "3x3_odd_c": problem2d(C=7, K=7, groups=7),
    "3x3_mult3": problem2d(C=16, K=48, groups=16, dilation=2, padding=2),
    "3x3x3_bf16": problem3d(C=64, K=64, groups=64),
}


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("key", sorted(PROBLEMS))
def test_compiles_without_spills(key, arch):
    p = PROBLEMS[key]
    name, defines = dw_variant(p, dw_config(p))
    _, report = compile_cuda(DW_SOURCE, arch, defines)
    f = report.function(name)
    assert f.spill_stores == 0 and f.spill_loads == 0, report.log
    assert f.registers <= 255
