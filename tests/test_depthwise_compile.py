"""Every depthwise variant the networks use compiles for sm_80 and sm_90a without spills (NVRTC, no GPU)."""

from __future__ import annotations

import pytest

from cuconv.backends.depthwise.variants import CATALOG, DW_SOURCE, dw_config, dw_variant

from conftest import assert_compiles_without_spills, nvrtc_available

pytestmark = pytest.mark.skipif(not nvrtc_available(), reason="needs NVRTC (cuda-bindings)")

PROBLEMS = CATALOG


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("key", sorted(PROBLEMS))
def test_compiles_without_spills(key, arch):
    p = PROBLEMS[key]
    f = assert_compiles_without_spills(DW_SOURCE, arch, *dw_variant(p, dw_config(p)))
    assert f.registers <= 255
