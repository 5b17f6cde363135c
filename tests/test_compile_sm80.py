"""CPU (CI) checks of the sm_80+ kernels: NVRTC compiles for sm_80 and sm_90a with zero spills, the
SASS holds tensor-core MMAs (HMMA) and asynchronous global->shared copies (LDGSTS), the variant
choice, and the NumPy path of ``cuconv.matmul``. No GPU needed.
"""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import cuconv
from cuconv.backends import sm80
from cuconv.problem import ConvProblem

from conftest import find_cuobjdump, nvrtc_available


needs_nvrtc = pytest.mark.skipif(not nvrtc_available(), reason="NVRTC (cuda-bindings + nvidia-cuda-nvrtc) not installed")


def _problem(c, k, filt, pad, groups=1, stride=1, dtype="bfloat16"):
    return ConvProblem.create(nd=2, batch=2, in_spatial=(16, 16), channels=c, out_channels=k, filter_spatial=filt,
                              stride=stride, dilation=1, padding=pad, groups=groups, dtype=dtype, layout="NHWC")


@needs_nvrtc
@pytest.mark.parametrize("source,defines,arch", sm80.COMPILE_VARIANTS,
                         ids=[f"{d['CUCONV_KERNEL_NAME']}-{a}" for _, d, a in sm80.COMPILE_VARIANTS])
def test_compiles_without_spills_and_uses_tensor_cores(source, defines, arch):
    from cuconv.compiler import compile_cuda
    cubin, report = compile_cuda(source, arch, defines)
    main = report.function(defines["CUCONV_KERNEL_NAME"])
    assert report.spills == 0 and main.stack_frame == 0, report.log
    tool = find_cuobjdump()
    if tool is None:
        pytest.skip("cuobjdump not found (pip install nvidia-cuda-cuobjdump)")
    sass = subprocess.run([tool, "--dump-sass", cubin], capture_output=True, text=True, check=True).stdout
    assert "HMMA.16816.F32" in sass, "no m16n8k16 tensor-core MMA in the SASS"
    assert "LDSM" in sass, "no ldmatrix in the SASS"
    if defines["CUCONV_VEC_A"] > 1 or defines["CUCONV_VEC_B"] > 1:
        assert "LDGSTS" in sass, "no cp.async (LDGSTS) in the SASS"


def test_subpath_choice_and_forcing():
    assert sm80.choose_subpath(_problem(64, 64, (1, 1), 0))[0] == "pointwise"
    assert sm80.choose_subpath(_problem(64, 64, (3, 3), 1))[0] == "uniform"
    assert sm80.choose_subpath(_problem(3, 64, (7, 7), 3, stride=2))[0] == "per_lane"
    assert sm80.choose_subpath(_problem(128, 128, (3, 3), 1, groups=32))[0] == "per_lane"
    with sm80.forced_subpath("per_lane"):
        assert sm80.choose_subpath(_problem(64, 64, (1, 1), 0))[0] == "per_lane"
    with sm80.forced_subpath("uniform"):
        sub, why = sm80.choose_subpath(_problem(3, 64, (3, 3), 1))
        assert sub is None and "uniform" in why
    with pytest.raises(ValueError, match="subpath"):
        with sm80.forced_subpath("bogus"):
            pass


def test_copy_widths_follow_channels_and_alignment():
    assert sm80.conv_variant(_problem(3, 64, (7, 7), 3), "per_lane")[2]["CUCONV_VEC_A"] == 1
    assert sm80.conv_variant(_problem(6, 64, (3, 3), 1), "per_lane")[2]["CUCONV_VEC_A"] == 2
    assert sm80.conv_variant(_problem(128, 128, (3, 3), 1, groups=32), "per_lane")[2]["CUCONV_VEC_A"] == 4
    assert sm80.conv_variant(_problem(64, 64, (3, 3), 1), "uniform")[2]["CUCONV_VEC_A"] == 8
    # a base pointer only 2-byte aligned forces 2-byte copies
    assert sm80.conv_variant(_problem(64, 64, (3, 3), 1), "uniform", x_ptr=2)[2]["CUCONV_VEC_A"] == 1
    name = sm80.conv_variant(_problem(64, 256, (3, 3), 1), "uniform")[0]
    assert name == "conv2d_fprop_sm80_uniform_bf16_128x256x32_s4_w2x4_va8_vb8"


def test_tile_budgets():
    for cfg in sm80.CONFIGS.values():
        assert cfg.smem_bytes(row_table=True) <= 99 * 1024
        assert (cfg.bm // cfg.warps_m) % 16 == 0 and (cfg.bn // cfg.warps_n) % 16 == 0


def test_import_is_cpu_only():
    code = "import sys, cuconv, cuconv.backends.sm80; print('cupy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env=dict(os.environ, PYTHONPATH=str(Path(cuconv.__file__).parent.parent)))
    assert out.stdout.strip() == "False"


# ----------------------------------------------------------------------------- matmul on the CPU
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("m,n,k", [(1, 1, 1), (7, 13, 5), (33, 17, 64)])
def test_matmul_numpy(dtype, m, n, k):
    rng = np.random.default_rng(m + n + k)
    a = rng.standard_normal((m, k)).astype(dtype)
    b = rng.standard_normal((k, n)).astype(dtype)
    bias = rng.standard_normal(n).astype(dtype)
    r = rng.standard_normal((m, n)).astype(dtype)
    got = cuconv.matmul(a, b, bias=bias, residual=r, alpha=0.5, beta=-1.0, activation="silu")
    v = 0.5 * (a.astype(np.float64) @ b.astype(np.float64)) + bias - r.astype(np.float64)
    ref = v / (1 + np.exp(-v))
    assert got.dtype == dtype and got.shape == (m, n)
    tol = 1e-5 if dtype == np.float32 else 2e-3
    assert np.linalg.norm(got.astype(np.float64) - ref) <= tol * np.linalg.norm(ref)
    out = r.copy()
    res = cuconv.matmul(a, b, residual=out, out=out)
    assert res is out
    np.testing.assert_allclose(out.astype(np.float64), a.astype(np.float64) @ b.astype(np.float64) + r,
                               rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("kwargs,exc,match", [
    (dict(a=np.ones((2, 3), np.float32), b=np.ones((4, 2), np.float32)), ValueError, "b: expected 3 rows"),
    (dict(a=np.ones((2, 3, 1), np.float32), b=np.ones((3, 2), np.float32)), ValueError, "a: expected a 2-D"),
    (dict(a=np.ones((2, 3), np.float32), b=np.ones((3, 2), np.float16)), TypeError, "b: expected dtype float32"),
    (dict(a=np.ones((2, 3), np.int32), b=np.ones((3, 2), np.int32)), TypeError, "a: expected dtype"),
    (dict(a=np.ones((2, 3), np.float32), b=np.ones((3, 2), np.float32), bias=np.ones(3, np.float32)),
     ValueError, r"bias: expected shape \(2,\)"),
    (dict(a=np.ones((2, 3), np.float32), b=np.ones((3, 2), np.float32), activation="tanh"), ValueError, "activation"),
    (dict(a=np.ones((2, 3), np.float32), b=np.ones((3, 2), np.float32), alpha="x"), TypeError, "alpha"),
    (dict(a=[[1.0]], b=np.ones((1, 1), np.float32)), TypeError, "a: expected a NumPy or CuPy array"),
])
def test_matmul_validation(kwargs, exc, match):
    a, b = kwargs.pop("a"), kwargs.pop("b")
    with pytest.raises(exc, match=match):
        cuconv.matmul(a, b, **kwargs)
