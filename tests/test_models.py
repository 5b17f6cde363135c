"""The NumPy im2col address models: the documented TMA examples, and agreement with explicit A."""

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from cuconv.models import (SUBPATHS, conv_box_params, im2col_matrix, loader_addresses, loader_tile,
                           subpath_ok, tma_im2col_box_load, tma_tile)
from cuconv.problem import ConvProblem

from geometry import cases

# The images of the TMA im2col tutorial: pixel values 1..16 (one 4x4 image) and 1..32 (two), 32 channels.
IMG1 = np.repeat(np.arange(1, 17, dtype=np.float32).reshape(1, 4, 4, 1), 32, axis=-1)
IMG2 = np.repeat(np.arange(1, 33, dtype=np.float32).reshape(2, 4, 4, 1), 32, axis=-1)


@pytest.mark.parametrize("img,lower,upper,coord,offsets,expected", [
    # 1: no padding, the whole image in order
    (IMG1, [0, 0], [0, 0], [0, 0, 0, 0], [0, 0], list(range(1, 17))),
    # 2: corners [-1,-1]: the window starts in the padding
    (IMG1, [-1, -1], [-1, -1], [0, -1, -1, 0], [0, 0], [0, 0, 0, 0, 0, 1, 2, 3, 0, 5, 6, 7, 0, 9, 10, 11]),
    # 3: same window shifted back onto the image by offsets [1,1]
    (IMG1, [-1, -1], [-1, -1], [0, -1, -1, 0], [1, 1], list(range(1, 17))),
    # 4: two images, start at (0,1,3): the box wraps into image 1
    (IMG2, [0, 0], [0, 0], [0, 1, 3, 0], [0, 0], list(range(8, 24))),
    # 5: two images with corners [-1,-1], start at (0,1,2)
    (IMG2, [-1, -1], [-1, -1], [0, 1, 2, 0], [0, 0], [7, 0, 9, 10, 11, 0, 0, 0, 0, 0, 17, 18, 19, 0, 21, 22]),
])
def test_tma_box_load_documented_examples(img, lower, upper, coord, offsets, expected):
    got = tma_im2col_box_load(img, lower_corner=lower, upper_corner=upper, coord=coord, offsets=offsets,
                              pixels=16, channels=32)
    np.testing.assert_array_equal(got[:, 0], np.asarray(expected, dtype=np.float32))
    np.testing.assert_array_equal(got, np.repeat(got[:, :1], 32, axis=1))  # every channel of a pixel


def _problem(case):
    return ConvProblem.create(nd=case.nd, batch=case.batch, in_spatial=case.spatial, channels=case.channels,
                              out_channels=case.out_channels, filter_spatial=case.filt, stride=case.stride,
                              dilation=case.dilation, padding=case.padding, groups=case.groups, dtype="float32",
                              layout="NHWC" if case.nd == 2 else "NDHWC")


def _expected_tile(a, m_offset, k_cols, tile_m):
    """Rows m_offset.. of A at columns k_cols (-1 = a zero column), zero past M."""
    out = np.zeros((tile_m, len(k_cols)), dtype=a.dtype)
    rows = min(tile_m, max(0, a.shape[0] - m_offset))
    for j, k in enumerate(k_cols):
        if 0 <= k < a.shape[1]:
            out[:rows, j] = a[m_offset:m_offset + rows, k]
    return out


@given(case=cases(nd=2, groups=False, epilogue=False), data=st.data())
def test_tma_tiles_assemble_the_explicit_matrix(case, data):
    p = _problem(case)
    x = np.random.default_rng(case.seed).standard_normal(p.x_shape).astype(np.float32)
    a = im2col_matrix(x, p)
    tile_m = data.draw(st.sampled_from([8, 16, 64]))
    tile_k = data.draw(st.sampled_from([1, 4, 8]))
    m_offset = data.draw(st.integers(0, p.gemm_m - 1))
    tap = data.draw(st.integers(0, int(np.prod(p.filter_spatial)) - 1))
    c_block = data.draw(st.integers(0, (p.channels - 1) // tile_k))
    got = tma_tile(x, p, m_offset, tap * p.channels + c_block * tile_k, tile_m, tile_k)
    cols = [tap * p.channels + c if c < p.channels else -1 for c in range(c_block * tile_k, (c_block + 1) * tile_k)]
    np.testing.assert_array_equal(got, _expected_tile(a, m_offset, cols, tile_m))


@given(case=cases(nd=3, groups=False, epilogue=False, max_channels=6, max_spatial=6), data=st.data())
def test_tma_tiles_3d(case, data):
    p = _problem(case)
    x = np.random.default_rng(case.seed).standard_normal(p.x_shape).astype(np.float32)
    a = im2col_matrix(x, p)
    m_offset = data.draw(st.integers(0, p.gemm_m - 1))
    tap = data.draw(st.integers(0, int(np.prod(p.filter_spatial)) - 1))
    got = tma_tile(x, p, m_offset, tap * p.channels, 32, p.channels)
    cols = [tap * p.channels + c for c in range(p.channels)]
    np.testing.assert_array_equal(got, _expected_tile(a, m_offset, cols, 32))


@given(case=cases(nd=2, epilogue=False), data=st.data())
def test_loader_subpaths_assemble_the_explicit_matrix(case, data):
    p = _problem(case)
    x = np.random.default_rng(case.seed).standard_normal(p.x_shape).astype(np.float32)
    group = data.draw(st.integers(0, p.groups - 1))
    a = im2col_matrix(x, p, group)
    tile_m = data.draw(st.sampled_from([4, 16, 32]))
    subpath = data.draw(st.sampled_from(SUBPATHS))
    divisors = [d for d in (1, 2, 3, 4, 8) if p.channels_per_group % d == 0]
    tile_k = data.draw(st.sampled_from(divisors if subpath == "uniform" else [1, 5, 8, 16]))
    assume(subpath_ok(p, subpath, tile_k))
    m_offset = data.draw(st.integers(0, p.gemm_m - 1))
    k_offset = data.draw(st.integers(0, (p.gemm_k - 1) // tile_k)) * tile_k
    got = loader_tile(x, p, m_offset, k_offset, tile_m, tile_k, subpath, group)
    np.testing.assert_array_equal(got, _expected_tile(a, m_offset, list(range(k_offset, k_offset + tile_k)), tile_m))
    addr = loader_addresses(p, m_offset, k_offset, tile_m, tile_k, subpath, group)
    assert addr.max() < x.size  # never outside the tensor


def test_pointwise_is_the_linear_address_stream():
    p = ConvProblem.create(nd=2, batch=2, in_spatial=(3, 5), channels=8, out_channels=4, filter_spatial=(1, 1),
                           stride=1, dilation=1, padding=0, groups=1, dtype="float32", layout="NHWC")
    addr = loader_addresses(p, 4, 0, 8, 8, "pointwise")
    m = 4 + np.arange(8)[:, None]
    np.testing.assert_array_equal(addr, m * 8 + np.arange(8)[None, :])


def test_conv_box_params_follow_the_geometry():
    p = ConvProblem.create(nd=2, batch=1, in_spatial=(10, 9), channels=8, out_channels=8, filter_spatial=(3, 3),
                           stride=2, dilation=2, padding=((1, 2), (0, 3)), groups=1, dtype="float32",
                           layout="NHWC")
    bp = conv_box_params(p)
    assert bp.lower_corner == (-1, 0)
    assert bp.element_strides == (2, 2)
    assert bp.tap_offsets[0] == (0, 0) and bp.tap_offsets[-1] == (4, 4)
    # the base window holds exactly the output pixels
    for L, lo, up, s, o in zip(p.in_spatial, bp.lower_corner, bp.upper_corner, p.stride, p.out_spatial):
        assert len(range(lo, L - 1 + up + 1, s)) == o
