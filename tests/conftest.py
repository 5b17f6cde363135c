"""Shared test machinery: tolerances, data, the ``gpu`` marker, hypothesis profiles, the environment fixture.

Compare by relative norm error ``||out - ref|| / ||ref||`` against the per-dtype bound in
:data:`TOLERANCE`; NaN never passes. The reference sees the *same* rounded inputs (converted
exactly to float64), so the bound covers accumulation order and the final rounding to the output
dtype only.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import sys

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, settings

from cuconv.device import gpu_available

#: Relative norm error bound per output dtype (one table for every test).
TOLERANCE = {"float32": 1e-4, "float16": 2e-3, "bfloat16": 1.5e-2, "float64": 1e-12}

DTYPES = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16, "float32": np.float32, "float64": np.float64}

settings.register_profile("default", max_examples=40, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("ci", max_examples=25, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("gpu", max_examples=60, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "default"))


#: ``config.stash`` key of the tests selected to run (after ``-k`` / ``-m`` deselection): the compile
#: tests build their selected variants in parallel first (tests/test_compile.py).
SELECTED_TESTS = pytest.StashKey()


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    config.stash[SELECTED_TESTS] = items  # the list pytest runs, as deselection left it
    if gpu_available():
        return
    skip = pytest.mark.skip(reason="needs a GPU visible to CuPy (none here)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def hopper_available() -> bool:
    """A Hopper (cc 9.0) GPU is visible to CuPy: the sm90 kernels (conv2d, conv3d native and Q-slice) run."""
    if not gpu_available():
        return False
    from cuconv.device import current_gpu
    return current_gpu().is_hopper


#: Skip marker of the tests that launch the Hopper kernels.
needs_hopper = pytest.mark.skipif(not hopper_available(), reason="needs a Hopper (cc 9.0) GPU")


@pytest.fixture(scope="module")
def cp():
    """The CuPy module, for gpu-marked tests (imported only when one runs)."""
    import cupy
    return cupy


def assert_compiles_without_spills(source: str, arch: str, name: str, defines, no_stack: bool = False):
    """Compile the variant ``defines`` of kernels_cu/``source`` for ``arch`` (NVRTC) and assert that ptxas
    spilled nothing in entry ``name`` (and, with ``no_stack``, kept no local array on the stack); return
    the entry's ptxas figures."""
    from cuconv.compiler import compile_cuda
    _, report = compile_cuda(source, arch, defines)
    f = report.function(name)
    assert f.spill_stores == 0 and f.spill_loads == 0, report.log
    assert not no_stack or f.stack_frame == 0, report.log
    return f


def cupy_for_sm80(kernel: str):
    """The CuPy module for a module's ``cp`` fixture whose kernel needs sm_80+ (cp.async), or a skip
    saying why: no GPU visible to CuPy, or one below compute capability 8.0."""
    from cuconv.device import gpu_available
    if not gpu_available():
        pytest.skip("needs a GPU visible to CuPy")
    import cupy
    if cupy.cuda.Device().compute_capability < "80":
        pytest.skip(f"{kernel} needs compute capability >= 8.0")
    return cupy


@pytest.fixture
def cuconv_env(monkeypatch):
    """``cuconv_env(name, value)``: a context manager with the environment variable ``name`` set to
    ``value``; the once-per-process reading of the ``CUCONV_*`` overrides
    (:func:`cuconv.overrides.reread_environment`) is redone on entry and on exit."""
    from cuconv.overrides import reread_environment

    @contextlib.contextmanager
    def setting(name: str, value: str):
        monkeypatch.setenv(name, value)
        reread_environment()
        try:
            yield
        finally:
            monkeypatch.delenv(name)
            reread_environment()

    return setting


def random_array(rng, shape, dtype_name, scale=1.0):
    """Standard-normal data (never zeros) rounded to ``dtype_name``, as NumPy."""
    return (rng.standard_normal(shape) * scale).astype(DTYPES[dtype_name])


def rel_error(out, ref) -> float:
    """``||out - ref|| / ||ref||`` in float64; NaN/inf in ``out`` gives inf."""
    if hasattr(out, "get") and not isinstance(out, np.ndarray):
        out = out.get()
    out = np.asarray(out).astype(np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if not np.all(np.isfinite(out)):
        return float("inf")
    denom = np.linalg.norm(ref)
    return float(np.linalg.norm(out - ref) / (denom if denom > 0 else 1.0))


def assert_close(out, ref, dtype_name, context=""):
    err = rel_error(out, ref)
    assert err <= TOLERANCE[dtype_name], f"relative error {err:.3g} > {TOLERANCE[dtype_name]} ({dtype_name}) {context}"


def split_order_sum(ws: np.ndarray) -> np.ndarray:
    """common/split_sum.cuh's order in float32: G runs of ceil(splits / G) consecutive splits (G = 1 below
    16 splits, doubling while there are 16 G or more, at most 16), each summed from zero in split order,
    then the runs' sums in run order."""
    splits = ws.shape[0]
    g = 1
    while g < 16 and splits >= 16 * g:
        g *= 2
    length = -(-splits // g)
    runs = []
    for r in range(g):
        run = np.zeros(ws.shape[1], dtype=np.float32)
        for s in range(r * length, min(splits, (r + 1) * length)):
            run = (run + ws[s]).astype(np.float32)
        runs.append(run)
    total = runs[0]
    for run in runs[1:]:
        total = (total + run).astype(np.float32)
    return total


def nvrtc_available() -> bool:
    """True when cuda-bindings can load NVRTC (the CPU compile tests need it)."""
    try:
        from cuda.bindings import nvrtc
        return int(nvrtc.nvrtcVersion()[0]) == 0
    except Exception:
        return False


def host_shared_library(folder, source, flags=()):
    """``source`` (C++) built for this CPU into a shared library in ``folder`` and loaded with ctypes, by
    the first host compiler found (clang-19, clang++, g++, c++); the test is skipped when there is none,
    and fails with the compiler's message when the build does. For the tests that check kernels_hip/
    index math on the CPU (``-I kernels_hip``)."""
    import ctypes
    import subprocess
    from pathlib import Path

    cxx = next((p for p in map(shutil.which, ("clang-19", "clang++", "g++", "c++")) if p), None)
    if cxx is None:
        pytest.skip("no host C++ compiler (clang-19, clang++, g++ or c++) to build the index-math shim")
    hip_dir = Path(__file__).resolve().parent.parent / "kernels_hip"
    so = Path(folder) / "libshim.so"
    cmd = [cxx, "-x", "c++", "-std=c++17", "-O1", "-shared", "-fPIC", f"-I{hip_dir}", str(source), "-o", str(so),
           *flags]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, f"{' '.join(cmd)}\n{res.stderr}"
    return ctypes.CDLL(str(so))


def kernel_source_library(folder, harness: str, flags=()):
    """``harness`` (C++ that ``#include``s kernels_cu/ sources) built for this CPU by
    :func:`host_shared_library`, with a host ``common/types.cuh`` (the fixed-width integer types) ahead
    of the real one, which holds PTX conversions a host compiler cannot build; and the real
    ``common/fast_div.cuh`` beside it; ``flags``: more compiler options. For kernels whose code is index
    arithmetic and copies, run thread by thread on the CPU."""
    from pathlib import Path

    from cuconv.compiler import kernels_dir
    folder = Path(folder)
    (folder / "common").mkdir(exist_ok=True)
    (folder / "common" / "types.cuh").write_text("#pragma once\n#include <cstdint>\n")
    (folder / "common" / "fast_div.cuh").write_text((kernels_dir("cu") / "common" / "fast_div.cuh").read_text())
    src = folder / "harness.cpp"
    src.write_text(harness)
    return host_shared_library(folder, src, (f"-I{folder}", f"-I{kernels_dir('cu')}", *flags))


def find_cuobjdump():
    """Path of cuobjdump (on PATH, or from the nvidia-cuda-cuobjdump wheel), or None."""
    exe = shutil.which("cuobjdump")
    if exe:
        return exe
    for site in sys.path:
        hits = glob.glob(os.path.join(site, "nvidia", "cu1*", "bin", "cuobjdump"))
        if hits:
            return hits[0]
    return None


class DeviceBuf:
    """An array stand-in with a device address (``data.ptr``); a copy is a fresh, 256-byte aligned one."""

    _next = 1 << 20

    def __init__(self, ptr=None):
        if ptr is None:
            ptr, DeviceBuf._next = DeviceBuf._next, DeviceBuf._next + 4096
        self.data = type("Mem", (), {"ptr": ptr})()
        self.assigned = None

    def copy(self):
        return DeviceBuf()

    def __setitem__(self, key, value):
        self.assigned = value
