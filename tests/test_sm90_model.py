"""The Hopper kernel's host-side descriptors against the NumPy models, and its parameter struct
against the kernel source (CPU, no GPU).

* TMA im2col boxes: :func:`tma_box_params` replayed through the NumPy box-load model
  (cuconv.models.tma) tile the explicit im2col matrix exactly (4-D boxes for conv2d, 5-D for conv3d).
* Halo windows: every (r, s) tap's shifted rows of a window (cuconv.models.halo) are the explicit
  im2col rows of the tile's output pixels.
* ``Sm90ConvParams``: :data:`PARAM_FIELDS` lists the members of the struct in
  kernels_cu/sm90/conv_fprop_sm90.cu in order, and every multiply-shift divisor divides exactly.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cuconv.backends.sm90.params import PARAM_FIELDS, kernel_params
from cuconv.backends.sm90.tensormap import tma_box_params
from cuconv.backends.sm90.tiles import halo_geometry, halo_window, tile_config
from cuconv.launch import fast_divisor
from cuconv.overrides import Overrides
from cuconv.problem import ConvProblem

from geometry import cases, halo_cases, problem2d, problem3d


def _float_problem(case, nd):
    return ConvProblem.create(nd=nd, batch=case.batch, in_spatial=case.spatial, channels=case.channels,
                              out_channels=case.out_channels, filter_spatial=case.filt, stride=case.stride,
                              dilation=case.dilation, padding=case.padding, groups=1, dtype="float32",
                              layout="NHWC" if nd == 2 else "NDHWC")


@pytest.mark.parametrize("nd", [2, 3])
@settings(max_examples=30)
@given(st.data())
def test_descriptor_params_reproduce_explicit_im2col(nd, data):
    """Box loads with tma_box_params (replayed by the NumPy TMA model) tile the explicit A exactly
    (4-D boxes for conv2d, 5-D for conv3d's native strategy)."""
    from cuconv.models.im2col import im2col_matrix
    from cuconv.models.tma import tma_im2col_box_load
    case = data.draw(cases(nd=nd, dtypes=("bfloat16",), layouts=("NHWC",) if nd == 2 else ("NDHWC",), groups=False,
                           epilogue=False, max_spatial=9 if nd == 2 else 8, max_channels=20), label="case")
    p = _float_problem(case, nd)
    rng = np.random.default_rng(case.seed)
    x = rng.standard_normal(p.x_shape).astype(np.float32)
    pixels = data.draw(st.sampled_from([8, 16, 32]), label="pixels")
    channels = data.draw(st.sampled_from([8, 16]), label="channels")
    bp = tma_box_params(p, pixels_per_column=pixels, channels_per_pixel=channels)
    a = im2col_matrix(x, p)
    C = p.channels
    for m0 in range(0, p.gemm_m, pixels):
        for tap, offsets in enumerate(bp.tap_offsets):
            for c0 in range(0, C, channels):
                box = tma_im2col_box_load(x, lower_corner=bp.lower_corner, upper_corner=bp.upper_corner,
                                          coord=bp.start_coord(p, m0, c0), offsets=offsets, pixels=pixels,
                                          channels=channels, element_strides=bp.element_strides)
                want = np.zeros((pixels, channels), np.float32)
                rows = a[m0:m0 + pixels, tap * C + c0: tap * C + min(C, c0 + channels)]
                want[:rows.shape[0], :rows.shape[1]] = rows
                np.testing.assert_array_equal(box, want, err_msg=f"m0={m0} tap={tap} c0={c0} {p.describe()}")


@pytest.mark.parametrize("nd", [2, 3])
@settings(max_examples=25, deadline=None)
@given(st.data())
def test_halo_windows_reproduce_explicit_im2col(nd, data):
    """Halo tiles, replayed by the NumPy model (cuconv.models.halo): every tap's shifted window rows
    are the explicit A rows of the tile's output pixels, for every tile, depth tap and channel block."""
    from cuconv.models import halo_tap_rows, im2col_matrix
    from cuconv.models import halo_window as model_window
    case = data.draw(halo_cases(nd=nd, max_width=80, max_channels=24), label="case")
    p = _float_problem(case, nd)
    assert halo_geometry(p) is not None
    rows = data.draw(st.sampled_from([2, 4]), label="rows")
    x = np.random.default_rng(case.seed).standard_normal(p.x_shape).astype(np.float32)
    a = im2col_matrix(x, p)
    *planes_shape, P, Q = p.out_spatial
    O = planes_shape[0] if planes_shape else 1
    T = p.filter_spatial[0] if nd == 3 else 1
    R, S = p.filter_spatial[-2:]
    C = p.channels
    for n in range(p.batch):
        for z in range(O):
            for y0 in range(0, P, rows):
                for x0 in range(0, Q, 64):
                    for t in range(T):
                        for c0 in range(0, C, 16):
                            win = model_window(x, p, n, z, y0, x0, t, c0, rows, channels=16)
                            for g in range(rows):
                                if y0 + g >= P:
                                    continue
                                valid = min(64, Q - x0)
                                m = ((n * O + z) * P + y0 + g) * Q + x0
                                for r in range(R):
                                    for s_ in range(S):
                                        tap = (t * R + r) * S + s_
                                        got = halo_tap_rows(win, p, g, r, s_)[:valid, :min(16, C - c0)]
                                        want = a[m:m + valid, tap * C + c0: tap * C + min(C, c0 + 16)]
                                        np.testing.assert_array_equal(got, want, err_msg=f"{p.describe()} n{n} z{z} "
                                                                      f"y0 {y0} x0 {x0} t{t} c0 {c0} g{g} r{r} s{s_}")



def test_model_window_wholly_in_the_padding_is_zeros():
    """A window above or left of x (padding larger than the window: a 1x1 filter, two rows of padding,
    one-row tiles) holds no pixel of x: zeros, and the window below it starts with x's first row."""
    from cuconv.models import halo_window as model_window
    p = problem2d(N=1, H=3, W=8, C=8, K=8, R=1, S=1, padding=((2, 0), (0, 0)))
    x = np.arange(1, 1 + 3 * 8 * 8, dtype=np.float32).reshape(1, 3, 8, 8)
    for y0 in (0, 1):
        assert not model_window(x, p, 0, 0, y0, 0, 0, 0, 1, channels=8).any()
    np.testing.assert_array_equal(model_window(x, p, 0, 0, 2, 0, 0, 0, 1, channels=8)[0, :8], x[0, 0])
    q = problem2d(N=1, H=4, W=3, C=8, K=8, R=1, S=1, padding=((0, 0), (70, 0)))
    assert not model_window(np.ones((1, 4, 3, 8), np.float32), q, 0, 0, 0, 0, 0, 0, 1, channels=8).any()

def test_box_params_formula():
    p = problem2d(H=56, W=57, R=3, S=5, stride=(2, 1), dilation=(1, 2), padding=((1, 2), (3, 0)))
    bp = tma_box_params(p)
    P, Q = p.out_spatial
    assert bp.lower_corner == (-1, -3)
    assert bp.upper_corner == ((P - 1) * 2 - 1 - 55, (Q - 1) * 1 - 3 - 56)
    assert bp.element_strides == (2, 1)
    assert bp.tap_offsets[1 * 5 + 4] == (1, 8)


def test_halo_window_extent():
    """A halo tile's window: 64 + (S-1) dil_w columns by BM/64 + (R-1) dil_h rows, and the parameter
    struct's byte count of one window (128-byte pixel rows)."""
    p = problem2d(N=1, H=9, W=70, C=32, K=32, R=2, S=3, dilation=(2, 1), padding=1)
    with_halo = tile_config(p, 132, Overrides(halo=True, block_m=192, block_n=64))
    assert with_halo.halo and with_halo.block_m == 192
    assert halo_window(p, with_halo) == (64 + 2, 3 + 2)
    v = kernel_params(p, with_halo)
    assert (int(v["halo_w"]), int(v["halo_tx"])) == (66, 66 * 5 * 128)
    boxes = tile_config(p, 132, Overrides(halo=False))
    assert not boxes.halo and int(kernel_params(p, boxes)["halo_tx"]) == 0


def _kernel_struct_fields(name: str) -> list:
    """Member names of ``struct name`` in the Hopper entry file, FastDivisor members as (mul, shr)."""
    src = (Path(__file__).resolve().parents[1] / "kernels_cu" / "sm90" / "conv_fprop_sm90.cu").read_text()
    body = src[src.index(f"struct {name} {{"):]
    body = body[:body.index("};")]
    out = []
    for m in re.finditer(r"^\s*(?:long long|int|cuconv::FastDivisor|const void\*|const int4\*|const int\*|const uint16_t\*|uint16_t\*|unsigned long long\*)\s+([^;]+);", body, re.M):
        names = [n.strip() for n in m.group(1).split(",")]
        fast = "FastDivisor" in m.group(0)
        for n in names:
            arr = re.fullmatch(r"(\w+)\[(\w+)\]", n)  # an array: one entry per element
            if arr:
                size = int(re.search(rf"#define {arr.group(2)} (\d+)", src).group(1)) if not arr.group(2).isdigit() \
                    else int(arr.group(2))
                out += [f"{arr.group(1)}_{k}" for k in range(size)]
            else:
                out += [f"{n}_{part}" for part in ("mul", "shr")] if fast else [n]
    return out


def test_kernel_params_match_the_source_and_divide_exactly():
    """The host's Sm90ConvParams (sm90.params.kernel_params) lists the kernel struct's members in order,
    and each multiply-shift divisor divides like its plain value over the indices the kernel splits."""
    assert [n for n, _ in PARAM_FIELDS] == _kernel_struct_fields("Sm90ConvParams")
    problems = [problem2d(N=3, H=30, W=70, C=64, K=192), problem2d(N=64, H=14, W=14, C=1024, K=256, R=1, S=1, padding=0),
                problem3d(N=2, D=10, H=20, W=130, C=64, K=96, padding=((0, 0), (1, 1), (1, 1)))]
    for p in problems:
        cfg = tile_config(p, 132, Overrides())
        v = kernel_params(p, cfg)
        assert [n for n in v.dtype.names] == [n for n, _ in PARAM_FIELDS]
        plain = dict(n_tiles_div=v["n_tiles"], opq_div=v["O"] * v["P"] * v["Q"], pq_div=v["P"] * v["Q"],
                     q_div=v["Q"], x_tiles_div=v["x_tiles"], y_tiles_div=v["y_tiles"], o_div=v["O"])
        for name, d in plain.items():
            mul, shr = fast_divisor(int(d))
            assert (int(v[f"{name}_mul"]), int(v[f"{name}_shr"])) == (mul, shr), (p.describe(), name)
            x = np.arange(0, min(int(v["M"]) + 256, 1 << 20), dtype=np.uint64)
            assert np.array_equal((((x * mul) >> 32) + x) >> shr, x // int(d)), (p.describe(), name)
