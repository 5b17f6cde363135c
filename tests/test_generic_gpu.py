"""The generic GPU kernel (explicit im2col + cuBLAS + epilogue) against the reference.

gpu-marked: skipped without a GPU. Outputs are NaN-poisoned so an unwritten element fails.
"""

import numpy as np
import pytest
from hypothesis import given, settings

import cuconv

from conftest import assert_close, random_array
from geometry import cases, check_case

pytestmark = pytest.mark.gpu


@given(cases(nd=2))
def test_conv2d_generic_gpu(cp, case):
    check_case(case, xp=cp, kernel="generic_gpu", poison=True)


@given(cases(nd=3, max_channels=8, max_spatial=8))
def test_conv3d_generic_gpu(cp, case):
    check_case(case, xp=cp, kernel="generic_gpu", poison=True)


@settings(max_examples=15)
@given(cases(nd=2, epilogue=True))
def test_in_place_residual_generic_gpu(cp, case):
    check_case(case, xp=cp, kernel="generic_gpu", in_place=True)


def test_auto_dispatch_on_gpu_returns_cupy(cp):
    rng = np.random.default_rng(1)
    x = cp.asarray(random_array(rng, (2, 10, 9, 16), "float16"))
    w = cp.asarray(random_array(rng, (8, 3, 3, 16), "float16"))
    y = cuconv.conv2d(x, w, padding=1)
    assert isinstance(y, cp.ndarray) and y.dtype == cp.float16
    assert_close(y, cuconv.reference.conv2d(x, w, padding=1), "float16")
    e = cuconv.explain(x, w, padding=1)
    assert e.kernel in {k.name for k in cuconv.kernels()} and "cpu" in e.declined


def test_non_contiguous_inputs(cp):
    rng = np.random.default_rng(2)
    x = cp.asarray(random_array(rng, (2, 12, 10, 8), "bfloat16"))[:, ::2, 1:]
    w = cp.asarray(random_array(rng, (8, 3, 3, 16), "bfloat16"))[..., ::2]
    y = cuconv.conv2d(x, w, padding="same", kernel="generic_gpu")
    assert_close(y, cuconv.reference.conv2d(x, w, padding="same"), "bfloat16")


def test_mixed_modules_and_devices(cp):
    rng = np.random.default_rng(3)
    x = random_array(rng, (1, 6, 6, 4), "float32")
    w = random_array(rng, (4, 3, 3, 4), "float32")
    with pytest.raises(TypeError, match=r"^w: expected a numpy array like x, got a cupy array"):
        cuconv.conv2d(x, cp.asarray(w))
    with pytest.raises(TypeError, match=r"^bias: expected a cupy array like x"):
        cuconv.conv2d(cp.asarray(x), cp.asarray(w), np.zeros(4, np.float32))
    with pytest.raises(TypeError, match=r"^residual: expected a cupy array like x"):
        cuconv.conv2d(cp.asarray(x), cp.asarray(w), residual=np.zeros((1, 4, 4, 4), np.float32))
    with pytest.raises(TypeError, match=r"^out: expected a cupy array like x"):
        cuconv.conv2d(cp.asarray(x), cp.asarray(w), out=np.zeros((1, 4, 4, 4), np.float32))


def test_dlpack_torch_tensor_zero_copy(cp):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    x = torch.randn(2, 8, 8, 16, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(16, 3, 3, 16, device="cuda", dtype=torch.bfloat16)
    y = cuconv.conv2d(x, w, padding=1)
    assert isinstance(y, cp.ndarray)
    ref = cuconv.reference.conv2d(cp.from_dlpack(x), cp.from_dlpack(w), padding=1)
    assert_close(y, ref, "bfloat16")
    # torch's own conv agrees (NCHW view of the same data)
    t = torch.nn.functional.conv2d(x.permute(0, 3, 1, 2).float(), w.permute(0, 3, 1, 2).float(), padding=1)
    assert_close(y, t.permute(0, 2, 3, 1).cpu().numpy(), "bfloat16")
