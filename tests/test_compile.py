"""Every kernels_cu/ source compiles (NVRTC) for sm_80 and sm_90a without register spills.

Runs on the CPU (CI). Each backend lists the (source, defines, arch) variants it launches in a
module-level ``COMPILE_VARIANTS`` (sm90: ``sm90.variants``, sm80: ``sm80.catalog``, generic_gpu,
conv3d_qslice, sm90.split_precision, sm90.fold, cuconv.layout and cuconv.subpixel); this test compiles all of
them and checks that every .cu file is covered. The
per-backend SASS checks are in tests/test_sm90_compile.py and tests/test_sm80_compile.py.
"""

import importlib
import os
import pkgutil
from concurrent.futures import ThreadPoolExecutor

import pytest

import cuconv.backends
from cuconv.compiler import compile_cuda, kernels_dir

from conftest import SELECTED_TESTS, nvrtc_available

nvrtc = pytest.importorskip("cuda.bindings.nvrtc", reason="cuda-bindings (the cuda13 extra) not installed")


def _all_variants():
    """Every module's ``COMPILE_VARIANTS`` under cuconv.backends (subpackages included),
    :mod:`cuconv.layout`'s (the transposes of channels-first calls, the gradients' flips and scatters)
    and :mod:`cuconv.subpixel`'s (the stacked phases of a strided input gradient)."""
    import cuconv.layout
    import cuconv.subpixel
    variants = list(cuconv.layout.COMPILE_VARIANTS) + list(cuconv.subpixel.COMPILE_VARIANTS)
    for mod in pkgutil.walk_packages(cuconv.backends.__path__, prefix="cuconv.backends."):
        m = importlib.import_module(mod.name)
        if "COMPILE_VARIANTS" in vars(m) and not mod.ispkg:
            variants += list(m.COMPILE_VARIANTS)
    return variants


def test_every_backend_declares_its_variants():
    sources = {v[0].split("/")[0] for v in _all_variants()}
    assert {"sm90", "sm80", "depthwise", "generic", "conv3d"} <= sources, sources


pytestmark = pytest.mark.skipif(not nvrtc_available(), reason="NVRTC library not found (pip install nvidia-cuda-nvrtc)")


@pytest.fixture(scope="module")
def compiled_in_parallel(request):
    """Compile the selected variants on one thread per CPU first (NVRTC releases the GIL), so that each
    test below finds its variant in the compiler's memo. A variant that fails here is compiled again
    by its own test, which reports the error."""
    jobs = {(p["source"], p["arch"], tuple(sorted(p["defines"].items())))
            for item in request.config.stash[SELECTED_TESTS]
            if item.module is request.module and hasattr(item, "callspec") and "source" in item.callspec.params
            for p in [item.callspec.params]}

    def build(job):
        source, arch, items = job
        try:
            compile_cuda(source, arch, dict(items))
        except Exception:  # reported by the variant's own test
            pass

    with ThreadPoolExecutor(max_workers=max(1, min(len(jobs), os.cpu_count() or 1))) as pool:
        list(pool.map(build, sorted(jobs)))


@pytest.mark.parametrize("source,defines,arch", _all_variants(), ids=lambda v: str(v))
def test_kernels_compile_without_spills(source, defines, arch, compiled_in_parallel):
    _, report = compile_cuda(source, arch, defines)
    assert report.functions, report.log
    assert report.spills == 0, report.log


def test_every_cuda_source_is_compiled_by_some_variant():
    covered = {v[0] for v in _all_variants()}
    sources = {str(p.relative_to(kernels_dir("cu"))) for p in kernels_dir("cu").rglob("*.cu")}
    assert sources <= covered, f"kernel sources no backend declares in COMPILE_VARIANTS: {sources - covered}"
