"""Arrays on a GPU other than the current one: every call runs on its operands' GPU (launches, the output
and scratch there), whatever GPU is current. Skipped with fewer than two GPUs."""

from __future__ import annotations

import numpy as np
import pytest

import cuconv

from conftest import assert_close, random_array

pytestmark = pytest.mark.gpu


@pytest.fixture
def second_gpu(cp):
    if cp.cuda.runtime.getDeviceCount() < 2:
        pytest.skip(f"needs 2 GPUs, {cp.cuda.runtime.getDeviceCount()} visible")
    return cp.cuda.Device(1)


def _on(cp, device, *arrays):
    with device:
        return [None if a is None else cp.asarray(a) for a in arrays]


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_conv2d_on_the_second_gpu_while_the_first_is_current(cp, second_gpu, dtype):
    rng = np.random.default_rng(1)
    x, w, b = (random_array(rng, (2, 9, 10, 32), dtype), random_array(rng, (64, 3, 3, 32), dtype, 0.2),
               random_array(rng, (64,), dtype))
    res = random_array(rng, (2, 9, 10, 64), dtype)
    kw = dict(padding=1, activation="relu", beta=0.5)
    xg, wg, bg, rg = _on(cp, second_gpu, x, w, b, res)
    with cp.cuda.Device(0):
        for _ in range(2):  # the second call takes the memoised path
            y = cuconv.conv2d(xg, wg, bg, residual=rg, **kw)
            assert y.device.id == 1
            assert_close(y, cuconv.reference.conv2d(x, w, b, residual=res, **kw), dtype)



@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
def test_plan_on_the_second_gpu_while_the_first_is_current(cp, second_gpu, layout):
    """A plan made for arrays of GPU 1, called (twice) while GPU 0 is current: its output is on GPU 1."""
    rng = np.random.default_rng(4)
    x, w = random_array(rng, (2, 9, 10, 32), "float16"), random_array(rng, (64, 3, 3, 32), "float16", 0.2)
    if layout == "NCHW":
        x, w = np.ascontiguousarray(np.moveaxis(x, -1, 1)), np.ascontiguousarray(np.moveaxis(w, -1, 1))
    xg, wg = _on(cp, second_gpu, x, w)
    with second_gpu:
        plan = cuconv.plan_conv2d(xg, wg, padding=1, layout=layout)
    with cp.cuda.Device(0):
        for _ in range(2):
            y = plan(xg, wg)
            assert y.device.id == 1
            assert_close(y, cuconv.reference.conv2d(x, w, padding=1, layout=layout), "float16")

def test_conv3d_and_layouts_on_the_second_gpu(cp, second_gpu):
    rng = np.random.default_rng(2)
    x, w = random_array(rng, (1, 16, 6, 7, 8), "float16"), random_array(rng, (16, 16, 3, 3, 3), "float16", 0.2)
    xg, wg = _on(cp, second_gpu, x, w)
    with cp.cuda.Device(0):
        y = cuconv.conv3d(xg, wg, padding="same", layout="NCDHW")
    assert y.device.id == 1
    assert_close(y, cuconv.reference.conv3d(x, w, padding="same", layout="NCDHW"), "float16")


def test_gradients_and_transpose_on_the_second_gpu(cp, second_gpu):
    rng = np.random.default_rng(3)
    x, w = random_array(rng, (2, 8, 8, 16), "bfloat16"), random_array(rng, (32, 3, 3, 16), "bfloat16", 0.2)
    dy = random_array(rng, (2, 4, 4, 32), "bfloat16")
    wt = random_array(rng, (32, 3, 3, 16), "bfloat16", 0.2)  # transposed: (C_in, R, S, C_out)
    kw = dict(stride=2, padding=1)
    xg, wg, dyg, wtg = _on(cp, second_gpu, x, w, dy, wt)
    with cp.cuda.Device(0):
        dx = cuconv.conv2d_input_grad(dyg, wg, x.shape, **kw)
        dw = cuconv.conv2d_weight_grad(xg, dyg, w.shape, **kw)
        t = cuconv.conv_transpose2d(dyg, wtg, **kw)
    assert dx.device.id == 1 and dw.device.id == 1 and t.device.id == 1
    f64 = lambda a: a.astype(np.float64)  # noqa: E731
    assert_close(dx, cuconv.conv2d_input_grad(f64(dy), f64(w), x.shape, **kw), "bfloat16")
    assert_close(dw, cuconv.conv2d_weight_grad(f64(x), f64(dy), w.shape, **kw), "bfloat16")
    assert_close(t, cuconv.conv_transpose2d(f64(dy), f64(wt), **kw), "bfloat16")
