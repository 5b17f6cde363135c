"""``cuconv.precompile``: the kernel variants of many plans compiled at once (NVRTC, no GPU needed).

Plans are asked on the model H100 / A100 (:mod:`geometry`); the compiled cubins land in a temporary
kernel cache.
"""

from __future__ import annotations

import pytest

import cuconv
from cuconv import compiler, dispatch, kernel_cache
from cuconv.plan import Plan

from conftest import nvrtc_available
from geometry import A100, H100, problem2d

pytestmark = pytest.mark.skipif(not nvrtc_available(), reason="needs NVRTC (cuda-bindings)")


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CUCONV_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(compiler, "_COMPILED", {})
    return tmp_path / "cache"


def test_variants_of_every_path_compile_once(fresh_cache):
    problems = [problem2d(C=64, K=64), problem2d(C=64, K=64), problem2d(C=48, K=48, groups=48),
                problem2d(C=40, K=40, groups=40),
                problem2d(C=3, K=32, stride=2), problem2d(C=64, K=64, groups=16), problem2d(C=24, K=24, dtype="float32")]
    plans = [dispatch.select(p, dev)[0] for p in problems for dev in (H100, A100)]
    kernels = {p.kernel.name for p in plans}
    assert {"sm90_tma", "sm80_igemm", "depthwise_direct", "generic_gpu"} <= kernels
    jobs = {(s, p.device.arch, tuple(sorted(d.items()))) for p in plans for s, d in p.compile_jobs()}
    assert cuconv.precompile(plans, workers=2) == len(jobs)
    assert len(list(kernel_cache._entries())) == len(jobs)
    # what a run loads is now a cache hit: compiling it again is the memo's answer
    for source, arch, items in jobs:
        assert (source, arch, items, (), compiler.line_info()) in compiler._COMPILED


def test_explanations_and_conv_plans_are_accepted(fresh_cache):
    import numpy as np
    e = dispatch.select(problem2d(C=16, K=16, groups=16), A100)[1]
    assert cuconv.precompile([e]) == 1
    cpu_plan = cuconv.plan_conv2d(np.zeros((1, 5, 5, 4), np.float32), np.zeros((4, 3, 3, 4), np.float32))
    assert cuconv.precompile([cpu_plan]) == 0  # the CPU kernel compiles nothing
    assert isinstance(cpu_plan.explanation.plan, Plan)


def test_bad_arguments():
    import numpy as np
    with pytest.raises(TypeError, match="plans: expected"):
        cuconv.precompile(["resnet"])
    g = cuconv.explain_input_grad(np.zeros((1, 4, 4, 8), np.float32), np.zeros((8, 3, 3, 4), np.float32),
                                  (1, 4, 4, 4), padding=1)
    with pytest.raises(TypeError, match="got GradExplanation; a gradient's variants .* --jobs-from"):
        cuconv.precompile([g])
    with pytest.raises(ValueError, match="workers"):
        cuconv.precompile([dispatch.select(problem2d(), H100)[0]], workers=0)
