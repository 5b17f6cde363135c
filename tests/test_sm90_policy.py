"""The Hopper kernel ``sm90_tma`` (TMA im2col + warp-specialized wgmma, kernels_cu/sm90/).

CPU part (runs in CI): every compiled variant builds for sm_90a without spills and its SASS holds
HGMMA and UTMALDG; the TMA descriptor parameters replayed through the NumPy box-load model give
the explicit im2col matrix, and so do the halo tiles' windows (cuconv.models.halo); ``check`` declines with precise reasons; the tile heuristic is sane.

GPU part (``gpu`` marker; skipped without a Hopper GPU): the kernel forced with
``kernel="sm90_tma"`` against the float64 reference, over drawn geometry inside its coverage and
over named edge cases, outputs NaN-poisoned, in-place residual included; the same with halo tiles
forced (``tile_settings(halo=True)``). Tolerances come from
conftest.TOLERANCE (the one table).
"""

from __future__ import annotations

import contextlib
import subprocess

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import cuconv
from cuconv.backends.hopper_tma import (COMPILE_VARIANTS, Sm90TmaKernel, choose_tile_config, tile_settings,
                                       tma_box_params)
from cuconv.device import DeviceInfo
from cuconv.problem import ConvProblem, Epilogue

from conftest import find_cuobjdump, needs_hopper, nvrtc_available
from geometry import Case, cases, check_case, explain_detail, halo_cases, with_residual

H100 = DeviceInfo(kind="cuda", index=0, name="H100 (model)", cc=(9, 0), arch="sm_90a", sm_count=132,
                  smem_per_block_optin=232448)


def _problem(N=2, H=9, W=11, C=16, K=16, R=3, S=3, stride=1, dilation=1, padding=1, groups=1,
             dtype="bfloat16", epilogue=Epilogue()):
    return ConvProblem.create(nd=2, batch=N, in_spatial=(H, W), channels=C, out_channels=K, filter_spatial=(R, S),
                              stride=stride, dilation=dilation, padding=padding, groups=groups, dtype=dtype,
                              layout="NHWC", epilogue=epilogue)


# ----------------------------------------------------------------------------------------- CPU
@pytest.mark.skipif(not nvrtc_available(), reason="NVRTC (cuda-bindings) not available")
@pytest.mark.parametrize("source,defines,arch", COMPILE_VARIANTS, ids=lambda v: str(v))
def test_sm90_variant_compiles_without_spills_and_uses_hgmma_tma(source, defines, arch):
    from cuconv.compiler import compile_cuda
    path, report = compile_cuda(source, arch, defines)
    assert report.functions, report.log
    assert report.spills == 0 and all(f.stack_frame == 0 for f in report.functions), report.log
    assert "C7508" not in report.log, "setmaxnreg ignored by ptxas:\n" + report.log
    assert "C7519" not in report.log and "serialized" not in report.log, "wgmma serialised by ptxas:\n" + report.log
    exe = find_cuobjdump()
    if exe is None:
        pytest.skip("cuobjdump not found (pip install nvidia-cuda-cuobjdump)")
    sass = subprocess.run([exe, "-sass", path], capture_output=True, text=True, check=True).stdout
    assert "HGMMA" in sass, "no wgmma (HGMMA) in the SASS"
    # each ring slot's wgmmas are one commit group: only the last of a group sets the scoreboard
    # (gsb0), and there is no empty wgmma closing a group. A branch between a slot's wgmmas makes each
    # one its own group, and wait_group 1 then drains the slot (docs/architecture.md, section 2.1).
    hgmma = [line for line in sass.splitlines() if "HGMMA" in line]
    assert "HGMMA.64x8x16" not in sass, "ptxas closed a wgmma group with an empty wgmma"
    assert sum("gsb0" in line for line in hgmma) < len(hgmma), "every wgmma is its own commit group"
    if defines["SM90_HALO"]:  # halo tiles: the window is a tiled 5-D box, no im2col box at all
        assert "UTMALDG.5D" in sass and "IM2COL" not in sass, "halo variant without its 5-D tiled window load"
    else:
        assert "UTMALDG" in sass and "IM2COL" in sass, "no TMA im2col load (UTMALDG...IM2COL) in the SASS"
    if defines["SM90_CLUSTER"] > 1:
        assert "UTMALDG.3D.MULTICAST" in sass, "cluster variant without a multicast filter load"
        assert "UCGABAR" in sass, "cluster variant without a cluster barrier"
    else:
        assert "MULTICAST" not in sass


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
    p = ConvProblem.create(nd=nd, batch=case.batch, in_spatial=case.spatial, channels=case.channels,
                           out_channels=case.out_channels, filter_spatial=case.filt, stride=case.stride,
                           dilation=case.dilation, padding=case.padding, groups=1, dtype="float32",
                           layout=case.layout)
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
                                          coord=bp.start_coord(p, m0, c0), offsets=offsets, pixels=pixels, channels=channels,
                                          element_strides=bp.element_strides)
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
    from cuconv.backends.hopper_tma import _halo_geometry
    from cuconv.models import halo_tap_rows, halo_window, im2col_matrix
    case = data.draw(halo_cases(nd=nd, max_width=80, max_channels=24), label="case")
    p = ConvProblem.create(nd=nd, batch=case.batch, in_spatial=case.spatial, channels=case.channels,
                           out_channels=case.out_channels, filter_spatial=case.filt, stride=case.stride,
                           dilation=case.dilation, padding=case.padding, groups=1, dtype="float32",
                           layout="NHWC" if nd == 2 else "NDHWC")
    assert _halo_geometry(p) is not None
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
                            win = halo_window(x, p, n, z, y0, x0, t, c0, rows, channels=16)
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


def test_box_params_formula():
    p = _problem(H=56, W=57, R=3, S=5, stride=(2, 1), dilation=(1, 2), padding=((1, 2), (3, 0)))
    bp = tma_box_params(p)
    P, Q = p.out_spatial
    assert bp.lower_corner == (-1, -3)
    assert bp.upper_corner == ((P - 1) * 2 - 1 - 55, (Q - 1) * 1 - 3 - 56)
    assert bp.element_strides == (2, 1)
    assert bp.tap_offsets[1 * 5 + 4] == (1, 8)


def _kernel_struct_fields(name: str) -> list:
    """Member names of ``struct name`` in the Hopper entry file, FastDivisor members as (mul, shr)."""
    import re
    from pathlib import Path
    src = (Path(__file__).resolve().parents[1] / "kernels_cu" / "hopper" / "conv_fprop_sm90.cu").read_text()
    body = src[src.index(f"struct {name} {{"):]
    body = body[:body.index("};")]
    out = []
    for m in re.finditer(r"^\s*(?:long long|int|cuconv::FastDivisor)\s+([^;]+);", body, re.M):
        names = [n.strip() for n in m.group(1).split(",")]
        fast = "FastDivisor" in m.group(0)
        out += [f"{n}_{part}" for n in names for part in ("mul", "shr")] if fast else names
    return out


def test_kernel_params_match_the_source_and_divide_exactly():
    """The host's Sm90ConvParams (hopper_tma._params) lists the kernel struct's members in order, and
    each multiply-shift divisor divides like its plain value over the indices the kernel splits."""
    from cuconv.backends import hopper_tma as h
    from cuconv.launch import fast_divisor
    assert [n for n, _ in h._PARAM_FIELDS] == _kernel_struct_fields("Sm90ConvParams")
    problems = [_problem(N=3, H=30, W=70, C=64, K=192), _problem(N=64, H=14, W=14, C=1024, K=256, R=1, S=1, padding=0),
                ConvProblem.create(nd=3, batch=2, in_spatial=(10, 20, 130), channels=64, out_channels=96,
                                   filter_spatial=(3, 3, 3), stride=1, dilation=1, padding=((0, 0), (1, 1), (1, 1)), groups=1,
                                   dtype="bfloat16", layout="NDHWC", epilogue=Epilogue())]
    for p in problems:
        cfg = h._tile_config(p, 132)
        v = h._params(p, cfg)
        plain = dict(n_tiles_div=v["n_tiles"], opq_div=v["O"] * v["P"] * v["Q"], pq_div=v["P"] * v["Q"],
                     q_div=v["Q"], x_tiles_div=v["x_tiles"], y_tiles_div=v["y_tiles"], o_div=v["O"])
        for name, d in plain.items():
            mul, shr = fast_divisor(int(d))
            assert (int(v[f"{name}_mul"]), int(v[f"{name}_shr"])) == (mul, shr), (p.describe(), name)
            x = np.arange(0, min(int(v["M"]) + 256, 1 << 20), dtype=np.uint64)
            assert np.array_equal((((x * mul) >> 32) + x) >> shr, x // int(d)), (p.describe(), name)


@pytest.mark.parametrize("kwargs,device,reason", [
    (dict(), DeviceInfo(kind="cuda", cc=(8, 0), arch="sm_80", name="A100"), "needs a Hopper GPU"),
    (dict(dtype="float32"), H100, "dtype float32"),
    (dict(groups=2), H100, "groups=2"),
    (dict(C=12, K=16), H100, "C=12 is not a multiple of 8"),
    (dict(C=16, K=20), H100, "K=20 is not a multiple of 8"),
    (dict(H=400, padding=200), H100, "corner"),
    (dict(H=600, W=600, R=3, S=3, dilation=(130, 1), padding=((0, 200), (1, 1))), H100, "offsets"),
    (dict(H=50, W=50, R=1, S=1, stride=9, padding=0), H100, "stride"),
])
def test_check_declines_with_reason(kwargs, device, reason):
    ok, why = Sm90TmaKernel().supports(_problem(**kwargs), device)
    assert not ok and reason in why, why


def test_check_accepts_and_dispatch_prefers_it():
    p = _problem(C=24, K=40, stride=2, dilation=2, padding=((0, 3), (2, 1)))
    ok, why = Sm90TmaKernel().supports(p, H100)
    assert ok, why
    from cuconv import dispatch
    k, e = dispatch.select(p, H100)
    assert k.name == "sm90_tma" and "128x64x64" in e.detail
    k, e = dispatch.select(_problem(groups=2), H100)
    assert k.name != "sm90_tma" and "groups=2" in e.declined["sm90_tma"]


@pytest.mark.parametrize("m,n,sms", [(1, 8, 132), (64 * 56 * 56, 64, 132), (4 * 64 * 64, 512, 132),
                                     (8 * 64 * 64, 320, 132), (64 * 196, 256, 132), (10 ** 7, 4096, 132)])
def test_tile_heuristic(m, n, sms):
    cfg = choose_tile_config(m, n, sms)
    assert cfg.block_n in (64, 96, 128, 160, 192, 256) and cfg.block_m in (128, 192, 256) and cfg.stages >= 3
    assert cfg.block_m == 128 or (cfg.block_n in (64, 96) and cfg.cluster == 1 and cfg.consumers == 4) or (
        cfg.block_m == 192 and cfg.block_n <= 192 and cfg.cluster == 1 and cfg.consumers == 3)
    assert cfg.n_tiles * cfg.block_n >= n and (cfg.n_tiles - 1) * cfg.block_n < n
    assert cfg.cluster in (1, 2) and cfg.grid % cfg.cluster == 0
    assert cfg.cluster == 1 or cfg.m_tiles >= 2, "a pair needs two row tiles"
    assert cfg.num_units * cfg.cluster >= cfg.num_tiles > (cfg.num_units - cfg.n_tiles) * cfg.cluster
    assert 1 <= cfg.grid <= min(sms, cfg.cluster * cfg.num_units)
    assert cfg.smem_bytes(False) <= 227 * 1024
    with_c = choose_tile_config(m, n, sms, loads_residual=True)  # a residual ring costs ring slots at BM 256
    assert with_c.smem_bytes(True) <= 227 * 1024 and with_c.stages >= 3
    assert choose_tile_config(m, n, sms) == cfg  # pure
    single = choose_tile_config(m, n, sms, cluster=1)
    assert single.cluster == 1 and single.grid == min(sms, single.num_tiles)
    pair = choose_tile_config(m, n, sms, cluster=2)
    assert pair.cluster == (2 if pair.m_tiles >= 2 else 1) and pair.grid % pair.cluster == 0
    assert pair.num_units * pair.cluster >= pair.num_tiles and pair.grid <= sms


@pytest.mark.parametrize("m,n,bn", [
    (8 * 64 * 64, 320, 160),      # 2 x 160 covers N = 320 exactly (3 x 128 pads 64 columns)
    (8 * 16 * 16, 1280, 160),     # 16 x 8 = 128 tiles: one wave on 132 SMs (BN = 128: 160 tiles, two)
    (4 * 120 * 208, 192, 192),    # no padded columns (BN = 256 would waste a quarter)
    (4 * 240 * 416, 96, 96),
    (4 * 128 * 128, 512, 256),    # large N, many tiles: the widest tile
    (64 * 56 * 56, 64, 64),
    (64 * 14 * 14, 256, 128),     # near tie in the model: the measured rule's choice stays
])
def test_tile_width_choice(m, n, bn):
    assert choose_tile_config(m, n, 132, cluster=1).block_n == bn


@pytest.mark.parametrize("m,n,bm,stages", [
    (64 * 56 * 56, 64, 256, 5),       # ResNet 64->64 at 56x56: 784 tiles of 256 rows, 6 waves (12 of 128)
    (4 * 240 * 416, 96, 256, 5),      # conv3d 96->96 at 240x416: B's share of L2->SM traffic halved
    (140 * 256, 64, 128, 8),          # 140 tiles of 256 = 2 waves; 280 of 128 = 3: the tall tile costs a wave
    (64 * 56 * 56, 128, 128, 6),      # BN = 128: too wide for four 112-register consumer warpgroups
    (2 * 512 * 512, 128, 192, 5),     # ... but 2731 tiles of 192 rows take fewer tile-times (21 waves vs 32)
    (1000, 64, 128, 8),               # one tile either way: keep two consumer warpgroups
    (4 * 64 * 68, 64, 192, 7),        # 68 tall tiles would leave half the SMs idle; 91 of 192 rows: one wave
])
def test_tall_tile_rule(m, n, bm, stages):
    cfg = choose_tile_config(m, n, 132, cluster=1)
    assert (cfg.block_m, cfg.stages, cfg.consumers, cfg.threads) == (bm, stages, bm // 64, 128 * (1 + bm // 64))
    assert cfg.m_tiles == -(-m // bm)
    if bm == 256:
        res = choose_tile_config(m, n, 132, cluster=1, loads_residual=True)
        assert res.block_m == 128, "a residual keeps 128-row tiles (the 256-row C ring leaves 3-4 slots)"
        res = choose_tile_config(m, n, 132, cluster=1, loads_residual=True, block_m=256)
        assert res.block_m == 256 and res.stages == {64: 4, 96: 3}[n] and res.smem_bytes(True) <= 227 * 1024
        assert choose_tile_config(m, n, 132, cluster=2).block_m == 128, "no 256-row tiles in CTA pairs"
        assert choose_tile_config(m, n, 132, cluster=1, block_m=128).block_m == 128


@pytest.mark.parametrize("m,n,k_iters,res,bm,stages", [
    (64 * 14 * 14, 256, 16, False, 192, 5),   # 1x1 1024->256: 132 tiles of 192 (one wave), 196 of 128 (two)
    (64 * 14 * 14, 256, 36, False, 192, 5),   # 3x3 256->256 at 14x14: the same tiles
    (64 * 14 * 14, 256, 16, True, 192, 4),    # ... with a residual (C ring of 192-row chunks: 4 slots)
    (64 * 28 * 28, 128, 18, False, 128, 6),   # 262 tiles of 192 = 2 waves vs 392 of 128 = 3: a tie keeps 128
    (64 * 7 * 7, 512, 72, False, 128, 6),     # one wave either way: 1.5 times the work per tile would cost
    (64 * 14 * 14, 512, 16, False, 128, 4),   # BN = 256: too wide for 160-register consumers
])
def test_mid_tile_rule(m, n, k_iters, res, bm, stages):
    cfg = choose_tile_config(m, n, 132, cluster=1, k_iters=k_iters, loads_residual=res)
    assert (cfg.block_m, cfg.stages, cfg.consumers, cfg.threads) == (bm, stages, bm // 64, 128 * (1 + bm // 64))
    assert cfg.m_tiles == -(-m // bm) and cfg.smem_bytes(res) <= 227 * 1024
    if bm == 192:
        assert cfg.split_tiles == 0 and cfg.kernel_name(res).startswith("conv2d_fprop_sm90_tma_192x")
        assert choose_tile_config(m, n, 132, cluster=2, k_iters=k_iters).block_m == 128, "no 192-row tiles in pairs"
        assert choose_tile_config(m, n, 132, cluster=1, k_iters=k_iters, block_m=128).block_m == 128


def test_mid_tile_rule_on_halo_tiles():
    geom = (2, 512, 512, 9)  # 3x3 128->128 at 512x512, N = 2
    beta0 = choose_tile_config(2 * 512 * 512, 128, 132, cluster=1, k_iters=18, halo_geometry=geom, pingpong=False)
    assert beta0.halo and beta0.block_m == 256, "without a residual the 256-row cooperative halo tile wins"
    beta1 = choose_tile_config(2 * 512 * 512, 128, 132, cluster=1, k_iters=18, halo_geometry=geom, loads_residual=True)
    # 2 x 171 x 8 = 2736 tiles of 3 rows (21 waves) vs 4096 of 2 (32): 192 rows, 6 filter slots (exact-size windows)
    assert (beta1.halo, beta1.block_m, beta1.m_tiles, beta1.stages) == (True, 192, 2736, 6)
    vae = choose_tile_config(8 * 64 * 64, 320, 132, cluster=1, k_iters=45, halo_geometry=(8, 64, 64, 9),
                             loads_residual=True)
    assert vae.halo and vae.block_m == 128, "352 tiles of 192 (3 waves) vs 512 of 128 (4): not fewer tile-times"


@contextlib.contextmanager
def _sm90_env(monkeypatch, name: str, value: str):
    """``name`` set to ``value`` for the block; the once-per-process reading of the CUCONV_SM90_*
    settings is redone on entry and on exit."""
    from cuconv.backends import hopper_tma
    monkeypatch.setenv(name, value)
    hopper_tma._env_settings.cache_clear()
    try:
        yield
    finally:
        monkeypatch.delenv(name)
        hopper_tma._env_settings.cache_clear()


def test_tall_tile_forced(monkeypatch):
    with tile_settings(block_m=256):
        assert choose_tile_config(1000, 64, 132, cluster=1).block_m == 256
        assert choose_tile_config(1000, 64, 132, cluster=1).m_tiles == 4
        assert choose_tile_config(1000, 128, 132, cluster=1, block_n=128).block_m == 128  # too wide
        with tile_settings(block_n=96):  # nested blocks keep the outer block_m
            assert choose_tile_config(1000, 64, 132, cluster=1).block_m == 256
    with pytest.raises(ValueError, match="block_m"):
        with tile_settings(block_m=320):
            pass
    with pytest.raises(ValueError, match="block_m"):
        choose_tile_config(1000, 64, 132, block_m=96)
    assert choose_tile_config(1000, 64, 132, block_m=64).block_m == 128, "64 rows only in ping-pong halo tiles"
    with _sm90_env(monkeypatch, "CUCONV_SM90_BM", "512"):
        with pytest.raises(ValueError, match="CUCONV_SM90_BM"):
            choose_tile_config(1000, 64, 132)
    with _sm90_env(monkeypatch, "CUCONV_SM90_BM", "128"):
        assert choose_tile_config(64 * 56 * 56, 64, 132, cluster=1).block_m == 128


@pytest.mark.parametrize("c,steps", [(8, 1), (16, 1), (24, 2), (64, 4), (72, 1), (96, 2), (128, 4), (200, 1), (320, 4)])
def test_last_channel_block_steps(c, steps):
    """The kernel issues only the k16 steps of the last channel block that hold real channels."""
    from cuconv.backends.hopper_tma import _last_k16
    assert _last_k16(c) == steps


def test_tile_width_forced(monkeypatch):
    with tile_settings(block_n=192):
        assert choose_tile_config(1000, 64, 132, cluster=1).block_n == 192
        assert choose_tile_config(1000, 64, 132, cluster=1, block_n=96).block_n == 96
        with tile_settings(cluster=2):
            assert choose_tile_config(1000, 64, 132) == choose_tile_config(1000, 64, 132, 2, 192)
    assert choose_tile_config(1000, 64, 132, cluster=1).block_n == 64
    with pytest.raises(ValueError, match="block_n"):
        with tile_settings(block_n=100):
            pass
    # the environment's defaults, read once per process
    with _sm90_env(monkeypatch, "CUCONV_SM90_BN", "100"):
        with pytest.raises(ValueError, match="CUCONV_SM90_BN"):
            choose_tile_config(1000, 64, 132)
    with _sm90_env(monkeypatch, "CUCONV_SM90_BN", "160"):
        assert choose_tile_config(1000, 64, 132).block_n == 160


@pytest.mark.parametrize("m,n,k_iters,split,bn,units,grid", [
    (64 * 14 * 14, 256, 16, 64, 128, 196 + 64, 132),  # 1x1 1024->256: 196 tiles = 132 + a tail of 64
    (64 * 14 * 14, 256, 36, 64, 128, 196 + 64, 132),  # 3x3 256->256: the same tiles, longer reduction
    (64 * 7 * 7, 256, 36, 0, 96, 75, 75),              # no full wave before the tail: not split
    (64 * 7 * 7, 512, 72, 0, 128, 100, 100),           # 512->512 at 7x7: 100 tiles, more than half the SMs
    (64 * 14 * 14, 256, 4, 0, 128, 196, 132),          # too short a reduction to halve
    (64 * 28 * 28, 128, 18, 0, 128, 392, 132),         # tail of 128 tiles: splitting would need 256 SMs
    (4 * 64 * 64, 512, 72, 0, 256, 256, 132),          # tail of 124 tiles
    (132 * 128, 64, 9, 0, 64, 132, 132),               # exactly one full wave: no tail
])
def test_split_tail_rule(m, n, k_iters, split, bn, units, grid):
    """The split rule on 128-row tiles (the first two shapes run 132 tiles of 192 rows when left
    automatic, see test_mid_tile_rule)."""
    cfg = choose_tile_config(m, n, 132, cluster=1, k_iters=k_iters, block_m=128)
    assert (cfg.block_n, cfg.split_tiles, cfg.num_units, cfg.grid) == (bn, split, units, grid)
    assert cfg.dp_tiles == cfg.num_tiles - split and cfg.k_split == k_iters // 2
    # the split halves are the last 2 * split units, after every whole tile
    assert cfg.dp_tiles + 2 * cfg.split_tiles == cfg.num_units
    assert choose_tile_config(m, n, 132, cluster=1, k_iters=k_iters, block_m=128, split=False).split_tiles == 0
    assert choose_tile_config(m, n, 132, cluster=2, k_iters=k_iters).split_tiles == 0, "no split with CTA pairs"


def test_split_tail_forced_and_env(monkeypatch):
    # forced: even a 2-step reduction is halved (1 + 1), and a problem with no full wave, but never
    # past what the SMs take at once
    assert choose_tile_config(64 * 14 * 14, 256, 132, cluster=1, k_iters=2, split=True, block_m=128).split_tiles == 64
    assert choose_tile_config(64 * 7 * 7, 256, 132, cluster=1, k_iters=36, block_n=128, split=True).split_tiles == 50
    assert choose_tile_config(64 * 14 * 14, 256, 132, cluster=1, k_iters=1, split=True).split_tiles == 0
    assert choose_tile_config(64 * 28 * 28, 128, 132, cluster=1, k_iters=18, split=True).split_tiles == 0
    with tile_settings(split=False):
        assert choose_tile_config(64 * 14 * 14, 256, 132, cluster=1, k_iters=16).split_tiles == 0
        with tile_settings(block_n=64):  # nested blocks keep the outer split setting
            assert choose_tile_config(64 * 14 * 14, 256, 132, cluster=1, k_iters=16).split_tiles == 0
    with pytest.raises(ValueError, match="split"):
        with tile_settings(split="yes"):
            pass
    with _sm90_env(monkeypatch, "CUCONV_SM90_SPLIT", "maybe"):
        with pytest.raises(ValueError, match="CUCONV_SM90_SPLIT"):
            choose_tile_config(1000, 64, 132)
    with _sm90_env(monkeypatch, "CUCONV_SM90_SPLIT", "0"):
        assert choose_tile_config(64 * 14 * 14, 256, 132, cluster=1, k_iters=16).split_tiles == 0


# ---- halo tiles (kernels_cu/sm90/halo_loader.cuh)
def _geom(p):
    from cuconv.backends.hopper_tma import _halo_geometry
    return _halo_geometry(p)


@pytest.mark.parametrize("kwargs,reason", [
    (dict(stride=2), "stride"),
    (dict(stride=(1, 2)), "stride"),
    (dict(R=5, S=5, padding=2), "reach"),
    (dict(dilation=2, padding=2), "reach"),
])
def test_halo_declines_with_reason(kwargs, reason):
    from cuconv.backends.hopper_tma import _halo_decline
    p = _problem(**kwargs)
    assert _geom(p) is None and reason in _halo_decline(p)


@pytest.mark.parametrize("kwargs,taps", [(dict(), 9), (dict(R=1, S=3, padding=((0, 0), (1, 1))), 3),
                                         (dict(R=2, S=2, dilation=2), 4), (dict(R=1, S=1, padding=0), 1)])
def test_halo_geometry(kwargs, taps):
    p = _problem(N=3, H=20, W=70, **kwargs)
    P, Q = p.out_spatial
    assert _geom(p) == (3, P, Q, taps)


@pytest.mark.parametrize("Q,taps,want", [
    (416, 9, True),    # 448 columns computed, 7.7% padding (conv3d 96->96 at 240x416: 502 -> 317 us)
    (56, 9, True),     # 14%: ResNet 3x3 64->64 at 56x56 (45.6 -> 40.7 us)
    (64, 9, True), (512, 9, True),
    (208, 9, False),   # 23%: conv3d 192->192 at 120x208 measured 266 -> 322 us
    (104, 9, False),   # 23%: conv3d 384->384 at 60x104, 254 -> 314 us
    (28, 9, False), (7, 9, False),
    (512, 1, False),   # a 1x1 filter: nothing to share
])
def test_halo_rule(Q, taps, want):
    from cuconv.backends.hopper_tma import _halo_rule
    assert _halo_rule(4, 60, Q, taps) is want


def test_halo_tile_config():
    geom = (4, 240, 416, 9)  # conv3d 96->96 at 240x416, D 6 -> 4 planes
    m = 4 * 240 * 416
    cfg = choose_tile_config(m, 96, 132, cluster=1, k_iters=54, halo_geometry=geom)
    assert cfg.halo and (cfg.block_m, cfg.block_n, cfg.split_tiles, cfg.cluster) == (256, 96, 0, 1)
    assert cfg.m_tiles == 4 * 60 * 7 and cfg.num_units == cfg.m_tiles and cfg.grid == 132
    assert cfg.stages == 8 and cfg.smem_bytes(False) <= 227 * 1024 and "_halo" in cfg.kernel_name(False, 3)
    res = choose_tile_config(m, 96, 132, cluster=1, k_iters=54, halo_geometry=geom, loads_residual=True)
    assert res.halo and res.stages >= 3 and res.smem_bytes(True) <= 227 * 1024
    assert res.kernel_name(True, 3).endswith("_halo_res")
    wide = choose_tile_config(2 * 512 * 512, 128, 132, cluster=1, halo_geometry=(2, 512, 512, 9), pingpong=False)
    assert wide.halo and wide.block_m == 256 and wide.m_tiles == 2 * 128 * 8, "BN 128: 256-row halo tiles"
    wide_res = choose_tile_config(2 * 512 * 512, 128, 132, cluster=1, halo_geometry=(2, 512, 512, 9),
                                  loads_residual=True)
    assert wide_res.halo and wide_res.block_m == 192, "with a residual BN 128 spills at 256 rows: 192"
    wider = choose_tile_config(4 * 64 * 64, 256, 132, cluster=1, halo_geometry=(4, 64, 64, 9), pingpong=False)
    assert wider.halo and wider.block_m == 128
    few = choose_tile_config(4 * 64, 64, 132, cluster=1, halo_geometry=(1, 4, 64, 9))
    assert few.halo and few.block_m == 128, "too few tiles for four row warpgroups"
    # declined by the rule, switched off, or CTA pairs: im2col boxes
    assert not choose_tile_config(m, 96, 132, cluster=1, halo_geometry=(4, 120, 208, 9)).halo
    assert not choose_tile_config(m, 96, 132, cluster=1, halo_geometry=geom, halo=False).halo
    pair = choose_tile_config(m, 96, 132, cluster=2, halo_geometry=geom)
    assert pair.halo and pair.cluster == 2 and pair.block_m == 128 and pair.num_units == -(-pair.m_tiles // 2)
    assert pair.kernel_name(False, 3).endswith("_c2_halo")
    # a residual at BN = 256 leaves 4 filter slots (the kernel's alignment slack is partial there):
    # halo tiles; beta = 0 gets 5
    big = (4, 64, 64, 9)
    plain = choose_tile_config(4 * 64 * 64, 512, 132, cluster=1, halo_geometry=big, pingpong=False)
    assert plain.halo and plain.block_n == 256 and plain.stages == 5 and plain.smem_bytes(False) == 227 * 1024
    with_res = choose_tile_config(4 * 64 * 64, 512, 132, cluster=1, halo_geometry=big, loads_residual=True)
    assert with_res.halo and (with_res.block_m, with_res.block_n, with_res.stages) == (128, 256, 4)
    assert with_res.smem_bytes(True) <= 227 * 1024
    # fewer slots than HALO_MIN_RES_STAGES: im2col tiles (unless forced)
    import cuconv.backends.hopper_tma as h
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(h, "HALO_MIN_RES_STAGES", 5)
        assert not choose_tile_config(4 * 64 * 64, 512, 132, cluster=1, halo_geometry=big, loads_residual=True).halo
        assert choose_tile_config(4 * 64 * 64, 512, 132, cluster=1, halo_geometry=big, loads_residual=True,
                                  halo=True).halo
    assert choose_tile_config(m, 96, 132, cluster=1, halo_geometry=geom, loads_residual=True).halo
    # ... except N <= 256, where 192 x 128 halo tiles (five filter slots) take over
    vae = (4, 256, 256, 9)
    narrow = choose_tile_config(4 * 256 * 256, 256, 132, cluster=1, halo_geometry=vae, loads_residual=True)
    assert narrow.halo and (narrow.block_m, narrow.block_n) == (192, 128) and narrow.stages >= 4
    assert narrow.smem_bytes(True) <= 227 * 1024 and narrow.kernel_name(True, 2).endswith("_halo_res")
    assert "N <= 256" in narrow.note and "4 filter slots" in narrow.note
    beta0 = choose_tile_config(4 * 256 * 256, 256, 132, cluster=1, halo_geometry=vae)
    assert beta0.pingpong and beta0.block_n == 128, "beta = 0: 128 x 128 ping-pong tiles"
    assert choose_tile_config(4 * 256 * 256, 256, 132, cluster=1, halo_geometry=vae, pingpong=False).block_n == 256
    forced = choose_tile_config(4 * 256 * 256, 256, 132, cluster=1, halo_geometry=vae, loads_residual=True, block_n=256)
    assert forced.halo and (forced.block_m, forced.block_n) == (128, 256), "BN forced to 256: 128 x 256 halo tiles"
    assert choose_tile_config(4 * 256 * 256, 256, 132, cluster=2, halo_geometry=vae, loads_residual=True).block_n == 256
    assert not choose_tile_config(m, 96, 132, cluster=1, halo=True).halo, "no geometry: not eligible"
    assert choose_tile_config(m, 96, 132, cluster=1, halo_geometry=(4, 120, 208, 9), halo=True).halo


def test_halo_forced_and_env(monkeypatch):
    geom = (4, 120, 208, 9)
    with tile_settings(halo=True):
        assert choose_tile_config(100000, 96, 132, cluster=1, halo_geometry=geom).halo
        with tile_settings(block_n=192):  # nested blocks keep the outer halo setting
            assert choose_tile_config(100000, 96, 132, cluster=1, halo_geometry=geom).halo
    with pytest.raises(ValueError, match="halo"):
        with tile_settings(halo="yes"):
            pass
    with _sm90_env(monkeypatch, "CUCONV_SM90_HALO", "maybe"):
        with pytest.raises(ValueError, match="CUCONV_SM90_HALO"):
            choose_tile_config(1000, 64, 132)
    with _sm90_env(monkeypatch, "CUCONV_SM90_HALO", "0"):
        assert not choose_tile_config(100000, 96, 132, cluster=1, halo_geometry=(4, 240, 416, 9)).halo


def test_pingpong_tile_config():
    """Ping-pong halo tiles: each warpgroup holds a whole tile, so BM x BN / 128 <= 128 accumulators;
    only without a residual and without CTA pairs; automatic as 128 x 128 tiles where N % 128 == 0."""
    from cuconv.backends.hopper_tma import _pingpong_block_m, _pingpong_fits
    assert [_pingpong_block_m(bn) for bn in (64, 96, 128, 160, 192, 256)] == [256, 128, 128, 64, 64, 64]
    assert _pingpong_fits(128, 128) and not _pingpong_fits(128, 256) and not _pingpong_fits(96, 64)
    c3d = (16, 64, 64, 9)  # conv3d N = 2, D = 10 -> 8 output planes, 64 x 64
    m = 16 * 64 * 64
    with tile_settings(pingpong=True):
        cfg = choose_tile_config(m, 256, 132, cluster=1, k_iters=108, halo_geometry=c3d)
        assert cfg.pingpong and cfg.halo and (cfg.block_m, cfg.block_n, cfg.consumers, cfg.threads) == (64, 256, 2, 384)
        assert cfg.m_tiles == 16 * 64 and cfg.grid == 132 and cfg.kernel_name(False, 3).endswith("_halo_pp")
        assert cfg.defines("bfloat16", False, 3)["SM90_PINGPONG"] == 1 and cfg.smem_bytes(False) <= 227 * 1024
        with tile_settings(block_n=128):
            cfg = choose_tile_config(m, 256, 132, cluster=1, k_iters=108, halo_geometry=c3d)
            assert (cfg.block_m, cfg.block_n, cfg.m_tiles, cfg.n_tiles, cfg.stages) == (128, 128, 16 * 32, 2, 8)
            with tile_settings(block_m=256):  # too many accumulators for one warpgroup: the tallest that fits
                assert choose_tile_config(m, 256, 132, cluster=1, halo_geometry=c3d).block_m == 128
        res = choose_tile_config(m, 256, 132, cluster=1, halo_geometry=c3d, loads_residual=True)
        assert not res.pingpong, "a residual keeps the cooperative warpgroups"
        assert not choose_tile_config(m, 256, 132, cluster=2, halo_geometry=c3d).pingpong
        assert not choose_tile_config(m, 256, 132, cluster=1).pingpong, "not a halo problem"
        with tile_settings(block_m=64, pingpong=False):  # 64-row tiles exist only in ping-pong
            assert choose_tile_config(m, 256, 132, cluster=1, halo_geometry=c3d).block_m == 128
    # automatic: 128 x 128 ping-pong tiles where N is a multiple of 128, halo tiles, no residual, no pairs
    auto = choose_tile_config(m, 256, 132, cluster=1, k_iters=108, halo_geometry=c3d)
    assert auto.pingpong and (auto.block_m, auto.block_n, auto.m_tiles, auto.n_tiles) == (128, 128, 16 * 32, 2)
    assert choose_tile_config(2 * 512 * 512, 128, 132, cluster=1, halo_geometry=(2, 512, 512, 9)).pingpong
    assert not choose_tile_config(8 * 64 * 64, 320, 132, cluster=1, halo_geometry=(8, 64, 64, 9)).pingpong
    assert not choose_tile_config(4 * 240 * 416, 96, 132, cluster=1, halo_geometry=(4, 240, 416, 9)).pingpong
    assert not choose_tile_config(m, 256, 132, cluster=1, halo_geometry=c3d, loads_residual=True).pingpong
    assert not choose_tile_config(m, 256, 132, cluster=2, halo_geometry=c3d).pingpong
    assert not choose_tile_config(m, 256, 132, cluster=1, halo_geometry=c3d, block_n=256).pingpong, "BN forced"
    assert not choose_tile_config(m, 256, 132, cluster=1, halo_geometry=c3d, block_m=128).pingpong, "BM forced"
    assert not choose_tile_config(m, 256, 132, cluster=1, halo_geometry=c3d, pingpong=False).pingpong
    with pytest.raises(ValueError, match="pingpong"):
        with tile_settings(pingpong="yes"):
            pass


def test_explain_names_halo_choice():
    from cuconv import dispatch
    _, e = dispatch.select(_problem(N=2, H=20, W=416, C=64, K=64), H100)
    assert "_halo" in e.detail and "halo tiles" in e.detail
    _, e = dispatch.select(_problem(N=2, H=20, W=208, C=64, K=64), H100)
    assert "_halo" not in e.detail and "pad to 256" in e.detail
    _, e = dispatch.select(_problem(N=2, H=20, W=416, C=64, K=64, stride=2), H100)
    assert "not halo tiles: H/W stride (2, 2)" in e.detail


# ----------------------------------------------------------------------------------------- GPU
gpu = pytest.mark.gpu


def _coverage_cases(**kw):
    kw.setdefault("max_spatial", 14)
    kw.setdefault("max_channels", 80)
    return cases(nd=2, dtypes=("bfloat16", "float16"), layouts=("NHWC", "NCHW"), groups=False,
                 channel_multiple=8, **kw)


@gpu
@needs_hopper
@settings(max_examples=60)
@given(_coverage_cases())
def test_sm90_property(cp, case):
    # whole tiles only (small problems would otherwise mostly take the split tail: see the
    # test_sm90_split_tail* tests)
    with tile_settings(split=False):
        check_case(case, xp=cp, kernel="sm90_tma", poison=True)


@gpu
@needs_hopper
@settings(max_examples=20)
@given(_coverage_cases())
def test_sm90_in_place_residual(cp, case):
    case = with_residual(case)
    check_case(case, xp=cp, kernel="sm90_tma", in_place=True)


def _case(N=2, H=9, W=9, C=16, K=16, R=3, S=3, stride=1, dilation=1, padding=1, dtype="bfloat16", ep=None,
          seed=0):
    return Case(nd=2, batch=N, spatial=(H, W), channels=C, out_channels=K, filt=(R, S), stride=(stride,) * 2
                if isinstance(stride, int) else stride, dilation=(dilation,) * 2 if isinstance(dilation, int)
                else dilation, padding=padding, groups=1, dtype=dtype, layout="NHWC", epilogue=ep or {}, seed=seed)


EDGE_CASES = {
    # M = 2*7*7 = 98 < one 128-row tile; K = 24 < BN
    "m_and_k_below_one_tile": _case(N=2, H=7, W=7, C=16, K=24),
    # M = 3*13*11 = 429, not a multiple of 128: the last tile runs past the last image
    "m_not_multiple_of_tile": _case(N=3, H=13, W=11, C=32, K=64),
    # K = 200: BN = 256 would pad; the heuristic takes BN = 128 and the last N tile is partial
    "k_not_multiple_of_tile": _case(N=2, H=12, W=12, C=32, K=200),
    # C below / not a multiple of the 64-channel block: TMA zero fill on A and on B
    "c8": _case(C=8, K=32),
    "c24": _case(C=24, K=48),
    "c72": _case(C=72, K=16, H=10, W=10),
    # one 128-row tile spans several images and image rows (boundaries inside a tile)
    "image_boundaries_in_tile": _case(N=5, H=5, W=6, C=16, K=16),
    # M = 320: three row tiles, so the second CTA pair has a ghost CTA (rows past M, stores masked)
    "odd_row_tiles_ghost_cta": _case(N=1, H=16, W=20, C=32, K=64),
    "stride2_pad1": _case(N=2, H=17, W=15, C=32, K=64, stride=2, padding=1),
    "stride2_pad_asym": _case(N=2, H=16, W=16, C=16, K=32, stride=(2, 3), padding=((0, 1), (2, 0))),
    "dilation2": _case(N=2, H=13, W=12, C=16, K=16, dilation=2, padding=2),
    "asymmetric_padding": _case(N=1, H=11, W=9, C=16, K=32, R=3, S=5, padding=((2, 0), (1, 3))),
    "valid_large_filter": _case(N=2, H=12, W=14, C=8, K=8, R=7, S=5, padding=0),
    "pointwise": _case(N=4, H=14, W=14, C=256, K=128, R=1, S=1, padding=0),
    "large_k_bn256": _case(N=4, H=32, W=32, C=64, K=512, padding=1),
    "fp16_full_epilogue": _case(C=32, K=64, dtype="float16",
                                ep=dict(bias=True, residual=True, beta=0.5, alpha=-1.25, activation="silu")),
    "bf16_gelu_bias": _case(C=32, K=64, ep=dict(bias=True, activation="gelu")),
    "relu_residual_beta0": _case(C=16, K=16, ep=dict(residual=True, beta=0.0, activation="relu")),
    # 8*40*40 = 12800 rows x 512 channels = 100 x 2 tiles > 132 SMs: CTAs loop over tiles
    "persistent_many_tiles": _case(N=8, H=40, W=40, C=64, K=512, ep=dict(residual=True, beta=1.0)),
    # 8*72*72 = 41472 rows = 162 tiles of 256 (automatic for BN 96 there: 2 waves vs 3 of 128)
    "persistent_tall": _case(N=8, H=72, W=72, C=64, K=96, ep=dict(residual=True, beta=1.0, bias=True)),
}


@gpu
@needs_hopper
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("name", list(EDGE_CASES))
def test_sm90_edge_cases(cp, name, dtype):
    case = EDGE_CASES[name]
    case = Case(**{**case.__dict__, "dtype": dtype})
    check_case(case, xp=cp, kernel="sm90_tma", poison=True)


@gpu
@needs_hopper
def test_sm90_in_place_residual_large(cp):
    case = _case(N=2, H=32, W=32, C=64, K=512, ep=dict(residual=True, beta=1.0, bias=True, activation="relu"))
    check_case(case, xp=cp, kernel="sm90_tma", in_place=True)


@gpu
@needs_hopper
@pytest.mark.parametrize("name", ["m_not_multiple_of_tile", "odd_row_tiles_ghost_cta", "fp16_full_epilogue",
                                  "large_k_bn256", "persistent_many_tiles", "bf16_gelu_bias"])
def test_sm90_cta_pairs_multicast(cp, name):
    """tile_settings(cluster=2) (CTA pairs multicasting the filter tile, ghost CTA on odd row tiles)."""
    with tile_settings(cluster=2):
        check_case(EDGE_CASES[name], xp=cp, kernel="sm90_tma", poison=True)


@gpu
@needs_hopper
@pytest.mark.parametrize("bn", [96, 160, 192])
@pytest.mark.parametrize("name,cluster", [("m_not_multiple_of_tile", 1), ("k_not_multiple_of_tile", 1),
                                          ("c72", 1), ("fp16_full_epilogue", 1), ("persistent_many_tiles", 1),
                                          ("odd_row_tiles_ghost_cta", 2), ("persistent_many_tiles", 2)])
def test_sm90_tile_widths(cp, bn, name, cluster):
    """The BN = 96 / 160 / 192 variants (forced through tile_settings): partial last N tile, the
    32-wide last epilogue chunk with a residual, persistent grids and CTA pairs."""
    case = EDGE_CASES[name]
    with tile_settings(block_n=bn, cluster=cluster):
        assert f"128x{bn}x64" in _sm90_detail(cp, case)
        check_case(case, xp=cp, kernel="sm90_tma", poison=True)


TALL_CASES = ["m_and_k_below_one_tile", "m_not_multiple_of_tile", "c8", "c72", "image_boundaries_in_tile",
               "stride2_pad_asym", "dilation2", "fp16_full_epilogue", "relu_residual_beta0", "persistent_tall"]


@gpu
@needs_hopper
@pytest.mark.parametrize("bm,bn,split", [(256, None, False), (256, None, True), (192, 96, False), (192, 128, False),
                                         (192, 192, False), (192, 128, True)])
@pytest.mark.parametrize("name", TALL_CASES)
def test_sm90_taller_tiles(cp, name, bm, bn, split):
    """256-row tiles (four consumer warpgroups, BN 64/96 as the rule picks) and 192-row tiles (three,
    also at the widths only they can hold, 128 and 192), forced: partial row tiles, boundaries, the
    residual ring of BM-row chunks, a persistent grid, and split halves handing over BM-row partial sums."""
    case = EDGE_CASES[name]
    with tile_settings(block_m=bm, block_n=bn, split=split):
        detail = _sm90_detail(cp, case)
        assert f"{bm}x{bn or ''}" in detail and f"{bm // 64} consumer warpgroups" in detail, detail
        check_case(case, xp=cp, kernel="sm90_tma", poison=True)


@gpu
@needs_hopper
@pytest.mark.parametrize("bm,wide_bn", [(256, 96), (192, 128)])
@settings(max_examples=30)
@given(case=_coverage_cases())
def test_sm90_taller_tiles_property(cp, bm, wide_bn, case):
    with tile_settings(block_m=bm, block_n=64 if case.out_channels <= 64 else wide_bn, split=False):
        assert f"{bm}x" in _sm90_detail(cp, case)
        check_case(case, xp=cp, kernel="sm90_tma", poison=True)


@gpu
@needs_hopper
@pytest.mark.parametrize("bm,bn", [(256, None), (192, 128)])
def test_sm90_taller_tiles_in_place_residual(cp, bm, bn):
    with tile_settings(block_m=bm, block_n=bn):
        check_case(EDGE_CASES["persistent_tall"], xp=cp, kernel="sm90_tma", in_place=True)


SPLIT_CASES = {
    # 136 tiles of 64: one full wave of 132 and a tail of 4, split automatically (9 steps: 4 + 5);
    # the finishing halves run the full epilogue, the residual read in place
    "mixed_whole_and_split": _case(N=4, H=64, W=68, C=64, K=64,
                                   ep=dict(residual=True, beta=1.0, bias=True, activation="relu")),
    # forced on small problems (every tile is in the one, partial, wave)
    "m_not_multiple_of_tile": EDGE_CASES["m_not_multiple_of_tile"],
    "k_not_multiple_of_tile": EDGE_CASES["k_not_multiple_of_tile"],
    "c72": EDGE_CASES["c72"],                          # the last channel block's short k16 steps
    "pointwise": EDGE_CASES["pointwise"],              # 4 steps: 2 + 2, each half starting mid-tap
    "large_k_bn256": EDGE_CASES["large_k_bn256"],     # 32 x 2 tiles of 256 (forced BN below)
    "fp16_full_epilogue": EDGE_CASES["fp16_full_epilogue"],
    "stride2_pad_asym": EDGE_CASES["stride2_pad_asym"],
    "dilation2": EDGE_CASES["dilation2"],
}


@gpu
@needs_hopper
@pytest.mark.parametrize("name", list(SPLIT_CASES))
def test_sm90_split_tail(cp, name):
    """Tiles cut in two along the reduction (a PARTIAL half hands fp32 sums to a FINISH half)."""
    case = SPLIT_CASES[name]
    # 128-row tiles (the mixed case's 136 of them would run as 91 tiles of 192 rows, one wave, unsplit)
    with tile_settings(split=None if name == "mixed_whole_and_split" else True, block_m=128,
                       block_n=256 if name == "large_k_bn256" else None):
        assert "split in two" in _sm90_detail(cp, case)
        check_case(case, xp=cp, kernel="sm90_tma", poison=True)
        check_case(case, xp=cp, kernel="sm90_tma", poison=True)  # the flags were put back to 0


@gpu
@needs_hopper
@settings(max_examples=30)
@given(_coverage_cases())
def test_sm90_split_tail_property(cp, case):
    with tile_settings(split=True):
        check_case(case, xp=cp, kernel="sm90_tma", poison=True)


@gpu
@needs_hopper
def test_sm90_split_tail_in_place_residual(cp):
    case = SPLIT_CASES["mixed_whole_and_split"]
    with tile_settings(block_m=128):
        assert "split in two" in _sm90_detail(cp, case)
        check_case(case, xp=cp, kernel="sm90_tma", in_place=True)


def _sm90_detail(cp, case):
    """What ``cuconv.explain`` says of the sm90 kernel for the case's geometry (tile, grid, split)."""
    return explain_detail(cp, case, "sm90_tma")


@gpu
@needs_hopper
def test_sm90_is_chosen_automatically(cp):
    x = cp.ones((1, 8, 8, 16), dtype=cp.float16)
    w = cp.ones((16, 3, 3, 16), dtype=cp.float16)
    assert cuconv.explain(x, w, padding=1).kernel == "sm90_tma"
    e = cuconv.explain(x.astype(cp.float32), w.astype(cp.float32), padding=1)
    assert e.kernel != "sm90_tma" and "float32" in e.declined["sm90_tma"]


@gpu
@needs_hopper
def test_sm90_launch_record_reused_across_outputs(cp):
    """A fresh output array per call (no ``out=``) reuses the cached descriptors; results stay right."""
    from cuconv.backends import hopper_tma
    from conftest import assert_close
    x = cp.asarray(np.random.default_rng(0).standard_normal((2, 9, 9, 16)), dtype=cp.float16)
    w = cp.asarray(np.random.default_rng(1).standard_normal((32, 3, 3, 16)) * 0.1, dtype=cp.float16)
    ref = cuconv.reference.conv2d(x, w, padding=1)
    first = cuconv.conv2d(x, w, padding=1)
    n = len(hopper_tma._LAUNCHES)
    keep = [cuconv.conv2d(x, w, padding=1) for _ in range(3)]   # distinct output addresses
    assert len({int(y.data.ptr) for y in keep + [first]}) == 4
    assert len(hopper_tma._LAUNCHES) == n
    for y in keep + [first]:
        assert_close(y, ref, "float16")
    odd = cp.empty(2 * 9 * 9 * 32 + 1, dtype=cp.float16)[1:].reshape(2, 9, 9, 32)  # 2-byte aligned out
    assert_close(cuconv.conv2d(x, w, padding=1, out=odd), ref, "float16")


HALO_CASES = {
    # several 64-column tiles, the last one partial (Q = 150); rows not a multiple of the tile's rows
    "columns_partial_last_tile": _case(N=2, H=7, W=150, C=64, K=64),
    "asymmetric_padding": _case(N=1, H=9, W=70, C=32, K=48, padding=((2, 0), (0, 2))),
    "valid_no_padding": _case(N=2, H=8, W=66, C=16, K=16, padding=0),
    "c72_partial_block": _case(N=1, H=6, W=80, C=72, K=40),
    "k200_partial_n_tile": _case(N=2, H=5, W=64, C=32, K=200),
    "filter_1x3": _case(N=1, H=5, W=100, C=64, K=64, R=1, S=3, padding=((0, 0), (1, 1))),
    "filter_2x2_dilation2": _case(N=1, H=9, W=70, C=32, K=32, R=2, S=2, dilation=2, padding=1),
    "narrow_image": _case(N=3, H=5, W=9, C=16, K=24),
    "fp16_full_epilogue": _case(N=2, H=6, W=90, C=32, K=64, dtype="float16",
                                ep=dict(bias=True, residual=True, beta=0.5, alpha=-1.25, activation="silu")),
    "residual_bn256": _case(N=1, H=6, W=70, C=64, K=512, ep=dict(residual=True, beta=1.0, activation="gelu")),
    # 8 x 10 x 3 row tiles of 4 rows > 132 SMs: a persistent grid of 256-row halo tiles
    "persistent_tall": _case(N=8, H=40, W=150, C=64, K=96, ep=dict(residual=True, beta=1.0, bias=True)),
}


@gpu
@needs_hopper
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("name", list(HALO_CASES))
def test_sm90_halo_edge_cases(cp, name, dtype):
    """Halo tiles (forced): partial column and row tiles, padding on any side, short channel blocks,
    1x3 / dilated 2x2 filters, the fused epilogue and residual ring in halo-tile order."""
    case = Case(**{**HALO_CASES[name].__dict__, "dtype": dtype})
    with tile_settings(halo=True):
        assert "_halo" in _sm90_detail(cp, case)
        check_case(case, xp=cp, kernel="sm90_tma", poison=True)


@gpu
@needs_hopper
@pytest.mark.parametrize("bn,bm", [(96, 256), (96, 128), (128, 256), (160, 128), (192, 128), (64, 192), (128, 192),
                                   (192, 192)])
@pytest.mark.parametrize("name", ["columns_partial_last_tile", "fp16_full_epilogue", "k200_partial_n_tile"])
def test_sm90_halo_tile_shapes(cp, bn, bm, name):
    case = HALO_CASES[name]
    with tile_settings(halo=True, block_n=bn, block_m=bm):
        assert f"{bm}x{bn}x64" in _sm90_detail(cp, case) and "_halo" in _sm90_detail(cp, case)
        check_case(case, xp=cp, kernel="sm90_tma", poison=True)


@gpu
@needs_hopper
@settings(max_examples=40)
@given(halo_cases(nd=2))
def test_sm90_halo_property(cp, case):
    with tile_settings(halo=True):
        assert "_halo" in _sm90_detail(cp, case)
        check_case(case, xp=cp, kernel="sm90_tma", poison=True)


@gpu
@needs_hopper
@settings(max_examples=15)
@given(halo_cases(nd=2))
def test_sm90_halo_in_place_residual(cp, case):
    case = with_residual(case)
    with tile_settings(halo=True):
        check_case(case, xp=cp, kernel="sm90_tma", in_place=True)


# More row tiles than twice the SMs, so that both warpgroups of every CTA take several turns.
PINGPONG_CASES = {
    "persistent_bn96": _case(N=8, H=40, W=150, C=64, K=96, ep=dict(bias=True, activation="relu")),
    "persistent_bn256": _case(N=4, H=37, W=130, C=40, K=256, dtype="float16"),
    "persistent_bn64": _case(N=16, H=33, W=70, C=72, K=64, ep=dict(alpha=0.5, activation="silu")),
}


@gpu
@needs_hopper
@pytest.mark.parametrize("name", list(PINGPONG_CASES) + [n for n in HALO_CASES if n != "persistent_tall"])
def test_sm90_halo_pingpong(cp, name):
    """Ping-pong halo tiles (forced): the two consumer warpgroups alternate over the CTA's tiles; a
    residual keeps the cooperative kernel (and explain says which ran)."""
    case = PINGPONG_CASES.get(name) or HALO_CASES[name]
    with tile_settings(halo=True, pingpong=True):
        detail = _sm90_detail(cp, case)
        assert ("_halo_pp" in detail) != ("_res" in detail), detail
        check_case(case, xp=cp, kernel="sm90_tma", poison=True)


@gpu
@needs_hopper
@pytest.mark.parametrize("bn,bm", [(256, 64), (192, 64), (160, 64), (128, 128), (128, 64), (96, 128), (64, 256),
                                   (64, 192), (64, 128)])
@pytest.mark.parametrize("name", ["persistent_bn96", "persistent_bn64"])
def test_sm90_halo_pingpong_tile_shapes(cp, bn, bm, name):
    case = PINGPONG_CASES[name]
    with tile_settings(halo=True, pingpong=True, block_n=bn, block_m=bm):
        detail = _sm90_detail(cp, case)
        assert f"{bm}x{bn}x64" in detail and "_halo_pp" in detail, detail
        check_case(case, xp=cp, kernel="sm90_tma", poison=True)


@gpu
@needs_hopper
@settings(max_examples=30)
@given(halo_cases(nd=2))
def test_sm90_halo_pingpong_property(cp, case):
    with tile_settings(halo=True, pingpong=True):
        check_case(case, xp=cp, kernel="sm90_tma", poison=True)


@gpu
@needs_hopper
@pytest.mark.parametrize("name", ["columns_partial_last_tile", "narrow_image", "fp16_full_epilogue", "residual_bn256",
                                  "persistent_tall", "c72_partial_block"])
def test_sm90_halo_cta_pairs(cp, name):
    """Halo tiles in CTA pairs (forced): each CTA multicasts half of every filter box; an odd tile
    count leaves a ghost CTA that reads zeros and stores nothing (narrow_image: 3 tiles)."""
    case = HALO_CASES[name]
    with tile_settings(halo=True, cluster=2):
        detail = _sm90_detail(cp, case)
        assert "_c2_halo" in detail, detail
        check_case(case, xp=cp, kernel="sm90_tma", poison=True)
