"""Foreign tensors through DLPack (cuconv/arrays.py): bfloat16 CPU tensors, refused exports, results.

A CPU DLPack tensor comes back as NumPy and a GPU one as CuPy. The bfloat16 path is tested without
torch through a minimal producer (NumPy's own DLPack export of the raw bits, its type code rewritten
to bfloat16), and with torch and JAX where they are installed.
"""

from __future__ import annotations

import ctypes

import ml_dtypes
import numpy as np
import pytest

import cuconv
from cuconv import arrays

BF16 = np.dtype(ml_dtypes.bfloat16)


class Bf16Producer:
    """A CPU tensor that exports ``bits`` (uint16) through DLPack as bfloat16, as torch and JAX do."""

    def __init__(self, values: np.ndarray):
        self._bits = values.astype(BF16).view(np.uint16)

    def __dlpack_device__(self):
        return (1, 0)  # kDLCPU

    def __dlpack__(self, **kwargs):
        capsule = self._bits.__dlpack__()
        managed = ctypes.cast(arrays._capsule_pointer(capsule, b"dltensor"), ctypes.POINTER(arrays._DLManagedTensor))
        managed.contents.dl_tensor.dtype.code = arrays._KDL_BFLOAT
        return capsule


class RefusingProducer:
    """A tensor whose export fails, as torch's does for a tensor that requires grad."""

    def __dlpack_device__(self):
        return (1, 0)

    def __dlpack__(self, **kwargs):
        raise BufferError("Can't export tensors that require gradient, use tensor.detach()")


def test_bfloat16_cpu_tensor_is_viewed_without_copy():
    v = np.random.default_rng(0).standard_normal((2, 3, 5)).astype(np.float32)
    producer = Bf16Producer(v)
    a = arrays.as_array(producer, "x")
    assert isinstance(a, np.ndarray) and a.dtype == BF16 and a.shape == (2, 3, 5)
    assert np.array_equal(a.view(np.uint16), producer._bits)
    producer._bits[0, 0, 0] ^= 1  # the same memory
    assert a.view(np.uint16)[0, 0, 0] == producer._bits[0, 0, 0]


def test_bfloat16_cpu_tensor_convolves_like_numpy():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, 6, 7, 4)).astype(np.float32)
    w = rng.standard_normal((8, 3, 3, 4)).astype(np.float32)
    y = cuconv.conv2d(Bf16Producer(x), Bf16Producer(w), padding=1)
    want = cuconv.conv2d(x.astype(BF16), w.astype(BF16), padding=1)
    assert isinstance(y, np.ndarray) and y.dtype == BF16
    assert np.array_equal(y.view(np.uint16), want.view(np.uint16))


def test_a_refused_export_is_a_type_error_naming_the_argument():
    w = np.ones((2, 1, 1, 3), np.float32)
    with pytest.raises(TypeError, match=r"^x: .*detach"):
        cuconv.conv2d(RefusingProducer(), w)


def test_torch_cpu_tensors():
    torch = pytest.importorskip("torch")
    x = torch.randn(2, 5, 6, 4).to(torch.bfloat16)
    w = torch.randn(8, 3, 3, 4).to(torch.bfloat16)
    y = cuconv.conv2d(x, w, padding=1)
    want = cuconv.conv2d(x.float().numpy().astype(BF16), w.float().numpy().astype(BF16), padding=1)
    assert isinstance(y, np.ndarray) and np.array_equal(y.view(np.uint16), want.view(np.uint16))
    nchw = cuconv.conv2d(x.permute(0, 3, 1, 2), w.permute(0, 3, 1, 2), padding=1, layout="NCHW")  # strided views
    assert np.array_equal(np.moveaxis(nchw, 1, -1).view(np.uint16), want.view(np.uint16))
    with pytest.raises(TypeError, match=r"^x: .*detach"):
        cuconv.conv2d(torch.randn(1, 4, 4, 3, requires_grad=True), torch.randn(2, 1, 1, 3))


def test_jax_cpu_arrays():
    jnp = pytest.importorskip("jax.numpy")
    x = jnp.ones((1, 4, 4, 3), dtype=jnp.bfloat16)
    w = jnp.ones((2, 1, 1, 3), dtype=jnp.bfloat16)
    y = cuconv.conv2d(x, w)
    on_gpu = x.devices().pop().platform == "gpu"   # JAX's default device: CuPy result there, NumPy on the CPU
    if on_gpu:
        y = y.get()
    assert isinstance(y, np.ndarray) and y.dtype == BF16 and np.all(y.astype(np.float32) == 3)
