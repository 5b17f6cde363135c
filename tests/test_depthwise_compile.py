"""Every depthwise variant the networks use compiles for sm_80 and sm_90a without spills (NVRTC, no GPU)."""

from __future__ import annotations

import pytest

from cuconv.backends.depthwise.variants import CATALOG, DW_SOURCE, dw_config, dw_variant
from cuconv.compiler import compile_cuda

from conftest import nvrtc_available

pytestmark = pytest.mark.skipif(not nvrtc_available(), reason="needs NVRTC (cuda-bindings)")

PROBLEMS = CATALOG


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("key", sorted(PROBLEMS))
def test_compiles_without_spills(key, arch):
    p = PROBLEMS[key]
    name, defines = dw_variant(p, dw_config(p))
    _, report = compile_cuda(DW_SOURCE, arch, defines)
    f = report.function(name)
    assert f.spill_stores == 0 and f.spill_loads == 0, report.log
    assert f.registers <= 255
