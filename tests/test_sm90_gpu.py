"""The Hopper kernel ``sm90_tma`` on the GPU (``gpu`` marker; skipped without a Hopper).

The kernel is forced with ``kernel="sm90_tma"`` and checked against the float64 reference with the
output NaN-poisoned (or written in place over the residual): one property test over drawn geometry
per tile setting (:data:`SETTINGS`: cooperative, taller tiles, split tail, split of small problems into
several parts, halo tiles, ping-pong),
named edge cases under each tiling the policy can choose (CTA pairs, widths, heights, split tail,
halo, ping-pong), and the launch records a plan keeps. Every forced tiling is checked in
``cuconv.explain`` first, so a test never passes on a variant it did not mean to run. Tolerances
come from conftest.TOLERANCE (the one table).
"""

from __future__ import annotations

import numpy as np
import pytest

import cuconv
from cuconv.backends.sm90.tiles import bm_fits

from conftest import needs_hopper
from geometry import Case, Setting, case2d, check_case, coverage_cases, explain_detail, halo_cases, run_property

gpu = pytest.mark.gpu

#: One property test per tile setting: (id, drawn cases, overrides, what explain must name, examples).
SETTINGS = [
    # whole tiles only (small problems would otherwise mostly take the split tail: see "split")
    Setting("cooperative", coverage_cases(), dict(split=False), max_examples=60),
    Setting("in_place_residual", coverage_cases(), {}, max_examples=20, in_place=True),
    Setting("tall_256", coverage_cases(),
            lambda c: dict(block_m=256, block_n=64 if c.out_channels <= 64 else 96, split=False), "256x"),
    Setting("tall_192", coverage_cases(),
            lambda c: dict(block_m=192, block_n=64 if c.out_channels <= 64 else 128, split=False), "192x"),
    Setting("split", coverage_cases(), dict(split=True)),
    # small problems cut into 3-8 parts along the reduction (fewer where fewer fit, none where one does)
    Setting("split_ways", coverage_cases(), lambda c: dict(split_ways=3 + c.seed % 6, block_m=128, halo=False)),
    Setting("halo", halo_cases(nd=2), dict(halo=True), "_halo", max_examples=40),
    Setting("halo_in_place_residual", halo_cases(nd=2), dict(halo=True), max_examples=15, in_place=True),
    Setting("halo_pingpong", halo_cases(nd=2), dict(halo=True, pingpong=True)),
]


@gpu
@needs_hopper
@pytest.mark.parametrize("setting", SETTINGS, ids=[s.id for s in SETTINGS])
def test_sm90_property(cp, setting):
    run_property(cp, "sm90_tma", setting)


EDGE_CASES = {
    # M = 2*7*7 = 98 < one 128-row tile; K = 24 < BN
    "m_and_k_below_one_tile": case2d(N=2, H=7, W=7, C=16, K=24),
    # M = 3*13*11 = 429, not a multiple of 128: the last tile runs past the last image
    "m_not_multiple_of_tile": case2d(N=3, H=13, W=11, C=32, K=64),
    # K = 200: BN = 256 would pad; the heuristic takes BN = 128 and the last N tile is partial
    "k_not_multiple_of_tile": case2d(N=2, H=12, W=12, C=32, K=200),
    # C below / not a multiple of the 64-channel block: TMA zero fill on A and on B
    "c8": case2d(C=8, K=32),
    "c24": case2d(C=24, K=48),
    "c72": case2d(C=72, K=16, H=10, W=10),
    # one 128-row tile spans several images and image rows (boundaries inside a tile)
    "image_boundaries_in_tile": case2d(N=5, H=5, W=6, C=16, K=16),
    # M = 320: three row tiles, so the second CTA pair has a ghost CTA (rows past M, stores masked)
    "odd_row_tiles_ghost_cta": case2d(N=1, H=16, W=20, C=32, K=64),
    "stride2_pad1": case2d(N=2, H=17, W=15, C=32, K=64, stride=2, padding=1),
    "stride2_pad_asym": case2d(N=2, H=16, W=16, C=16, K=32, stride=(2, 3), padding=((0, 1), (2, 0))),
    "dilation2": case2d(N=2, H=13, W=12, C=16, K=16, dilation=2, padding=2),
    "asymmetric_padding": case2d(N=1, H=11, W=9, C=16, K=32, R=3, S=5, padding=((2, 0), (1, 3))),
    "valid_large_filter": case2d(N=2, H=12, W=14, C=8, K=8, R=7, S=5, padding=0),
    "pointwise": case2d(N=4, H=14, W=14, C=256, K=128, R=1, S=1, padding=0),
    "large_k_bn256": case2d(N=4, H=32, W=32, C=64, K=512, padding=1),
    "fp16_full_epilogue": case2d(C=32, K=64, dtype="float16",
                                ep=dict(bias=True, residual=True, beta=0.5, alpha=-1.25, activation="silu")),
    "bf16_gelu_bias": case2d(C=32, K=64, ep=dict(bias=True, activation="gelu")),
    "relu_residual_beta0": case2d(C=16, K=16, ep=dict(residual=True, beta=0.0, activation="relu")),
    # 8*40*40 = 12800 rows x 512 channels = 100 x 2 tiles > 132 SMs: CTAs loop over tiles
    "persistent_many_tiles": case2d(N=8, H=40, W=40, C=64, K=512, ep=dict(residual=True, beta=1.0)),
    # 8*72*72 = 41472 rows = 162 tiles of 256 (automatic for BN 96 there: 2 waves vs 3 of 128)
    "persistent_tall": case2d(N=8, H=72, W=72, C=64, K=96, ep=dict(residual=True, beta=1.0, bias=True)),
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
    case = case2d(N=2, H=32, W=32, C=64, K=512, ep=dict(residual=True, beta=1.0, bias=True, activation="relu"))
    check_case(case, xp=cp, kernel="sm90_tma", in_place=True)


@gpu
@needs_hopper
@pytest.mark.parametrize("name", ["m_not_multiple_of_tile", "odd_row_tiles_ghost_cta", "fp16_full_epilogue",
                                  "large_k_bn256", "persistent_many_tiles", "bf16_gelu_bias"])
def test_sm90_cta_pairs_multicast(cp, name):
    """cuconv.overrides(cluster=2) (CTA pairs multicasting the filter tile, ghost CTA on odd row tiles)."""
    with cuconv.overrides(cluster=2):
        check_case(EDGE_CASES[name], xp=cp, kernel="sm90_tma", poison=True)


@gpu
@needs_hopper
@pytest.mark.parametrize("bn", [96, 160, 192])
@pytest.mark.parametrize("name,cluster", [("m_not_multiple_of_tile", 1), ("k_not_multiple_of_tile", 1),
                                          ("c72", 1), ("fp16_full_epilogue", 1), ("persistent_many_tiles", 1),
                                          ("odd_row_tiles_ghost_cta", 2), ("persistent_many_tiles", 2)])
def test_sm90_tile_widths(cp, bn, name, cluster):
    """The BN = 96 / 160 / 192 variants (forced through cuconv.overrides): partial last N tile, the
    32-wide last epilogue chunk with a residual, persistent grids and CTA pairs."""
    case = EDGE_CASES[name]
    with cuconv.overrides(block_n=bn, cluster=cluster):
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
    with cuconv.overrides(block_m=bm, block_n=bn, split=split):
        detail = _sm90_detail(cp, case)
        assert f"{bm}x{bn or ''}" in detail and f"{bm // 64} consumer warpgroups" in detail, detail
        check_case(case, xp=cp, kernel="sm90_tma", poison=True)


@gpu
@needs_hopper
@pytest.mark.parametrize("bm,bn", [(256, None), (192, 128)])
def test_sm90_taller_tiles_in_place_residual(cp, bm, bn):
    with cuconv.overrides(block_m=bm, block_n=bn):
        check_case(EDGE_CASES["persistent_tall"], xp=cp, kernel="sm90_tma", in_place=True)


SPLIT_CASES = {
    # 136 tiles of 64: one full wave of 132 and a tail of 4, split automatically (9 steps: 4 + 5);
    # the finishing halves run the full epilogue, the residual read in place
    "mixed_whole_and_split": case2d(N=4, H=64, W=68, C=64, K=64,
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
    with cuconv.overrides(split=None if name == "mixed_whole_and_split" else True, block_m=128,
                          block_n=256 if name == "large_k_bn256" else None):
        assert "split in two" in _sm90_detail(cp, case)
        check_case(case, xp=cp, kernel="sm90_tma", poison=True)
        check_case(case, xp=cp, kernel="sm90_tma", poison=True)  # the flags were put back to 0


@gpu
@needs_hopper
@pytest.mark.parametrize("ways", [3, 4, 7, 16])
@pytest.mark.parametrize("name", ["m_not_multiple_of_tile", "c72", "pointwise", "large_k_bn256", "fp16_full_epilogue",
                                  "stride2_pad_asym", "dilation2"])
def test_sm90_split_ways(cp, name, ways):
    """Every tile of a small problem cut into up to ``ways`` parts: the PARTIAL parts hand fp32 sums to
    the FINISH part, which adds them in part order. Run twice (the flags are put back to 0)."""
    case = SPLIT_CASES[name]
    with cuconv.overrides(split_ways=ways, block_m=128, halo=False,
                          block_n=256 if name == "large_k_bn256" else None):
        detail = _sm90_detail(cp, case)
        assert " along the reduction" in detail and "all " in detail, detail
        check_case(case, xp=cp, kernel="sm90_tma", poison=True)
        check_case(case, xp=cp, kernel="sm90_tma", poison=True)


@gpu
@needs_hopper
def test_sm90_split_ways_same_bits_and_in_place(cp):
    """The FINISH part adds the other parts in one fixed order: two runs give the same bits; the residual
    may be the output itself."""
    rng = np.random.default_rng(5)
    x = cp.asarray(rng.standard_normal((2, 8, 8, 512)).astype(np.float16))
    w = cp.asarray((rng.standard_normal((640, 3, 3, 512)) / 48).astype(np.float16))
    res = cp.asarray(rng.standard_normal((2, 8, 8, 640)).astype(np.float16))
    with cuconv.overrides(split_ways=12, block_m=128, halo=False):
        assert "12 ways" in cuconv.explain(x, w, padding=1, residual=res).detail
        a = cuconv.conv2d(x, w, padding=1, residual=res, kernel="sm90_tma")
        b = cuconv.conv2d(x, w, padding=1, residual=res, kernel="sm90_tma")
        assert bool((a.view(cp.uint16) == b.view(cp.uint16)).all())
        with cuconv.overrides(split_ways=None, split=False):
            whole = cuconv.conv2d(x, w, padding=1, residual=res, kernel="sm90_tma")
        assert float(cp.abs(a.astype(cp.float32) - whole.astype(cp.float32)).max()) < 0.05
        inplace = res.copy()
        cuconv.conv2d(x, w, padding=1, residual=inplace, out=inplace, kernel="sm90_tma")
        assert bool((inplace.view(cp.uint16) == a.view(cp.uint16)).all())


@gpu
@needs_hopper
def test_sm90_split_tail_in_place_residual(cp):
    case = SPLIT_CASES["mixed_whole_and_split"]
    with cuconv.overrides(block_m=128):
        assert "split in two" in _sm90_detail(cp, case)
        check_case(case, xp=cp, kernel="sm90_tma", in_place=True)


def _sm90_detail(cp, case):
    """What ``cuconv.explain`` says of the sm90 kernel for the case's geometry (tile, grid, split)."""
    return explain_detail(cp, case, "sm90_tma")


@gpu
@needs_hopper
def test_sm90_is_chosen_automatically(cp):
    x = cp.ones((1, 8, 8, 64), dtype=cp.float16)
    w = cp.ones((16, 3, 3, 64), dtype=cp.float16)
    assert cuconv.explain(x, w, padding=1).kernel == "sm90_tma"
    e = cuconv.explain(x.astype(cp.float32), w.astype(cp.float32), padding=1)
    assert e.kernel != "sm90_tma" and "float32" in e.declined["sm90_tma"]


@gpu
@needs_hopper
def test_sm90_launch_record_reused_across_outputs(cp):
    """A fresh output array per call (no ``out=``) reuses the plan's launch record (descriptors, params,
    packed arguments): the plan that ``explain`` shows is the one the calls run, and its record count
    does not grow with other output addresses; results stay right."""
    from conftest import assert_close
    x = cp.asarray(np.random.default_rng(0).standard_normal((2, 9, 9, 16)), dtype=cp.float16)
    w = cp.asarray(np.random.default_rng(1).standard_normal((32, 3, 3, 16)) * 0.1, dtype=cp.float16)
    ref = cuconv.reference.conv2d(x, w, padding=1)
    plan = cuconv.explain(x, w, padding=1).plan
    assert plan.kernel.name == "sm90_tma"
    first = cuconv.conv2d(x, w, padding=1)
    assert cuconv.explain(x, w, padding=1).plan is plan  # one memo of plans
    n = plan.launch_records
    assert n >= 1
    keep = [cuconv.conv2d(x, w, padding=1) for _ in range(3)]   # distinct output addresses
    assert len({int(y.data.ptr) for y in keep + [first]}) == 4
    assert plan.launch_records == n
    for y in keep + [first]:
        assert_close(y, ref, "float16")
    odd = cp.empty(2 * 9 * 9 * 32 + 1, dtype=cp.float16)[1:].reshape(2, 9, 9, 32)  # 2-byte aligned out
    assert_close(cuconv.conv2d(x, w, padding=1, out=odd), ref, "float16")


HALO_CASES = {
    # several 64-column tiles, the last one partial (Q = 150); rows not a multiple of the tile's rows
    "columns_partial_last_tile": case2d(N=2, H=7, W=150, C=64, K=64),
    "asymmetric_padding": case2d(N=1, H=9, W=70, C=32, K=48, padding=((2, 0), (0, 2))),
    "valid_no_padding": case2d(N=2, H=8, W=66, C=16, K=16, padding=0),
    "c72_partial_block": case2d(N=1, H=6, W=80, C=72, K=40),
    "k200_partial_n_tile": case2d(N=2, H=5, W=64, C=32, K=200),
    "filter_1x3": case2d(N=1, H=5, W=100, C=64, K=64, R=1, S=3, padding=((0, 0), (1, 1))),
    "filter_2x2_dilation2": case2d(N=1, H=9, W=70, C=32, K=32, R=2, S=2, dilation=2, padding=1),
    "narrow_image": case2d(N=3, H=5, W=9, C=16, K=24),
    "fp16_full_epilogue": case2d(N=2, H=6, W=90, C=32, K=64, dtype="float16",
                                ep=dict(bias=True, residual=True, beta=0.5, alpha=-1.25, activation="silu")),
    "residual_bn256": case2d(N=1, H=6, W=70, C=64, K=512, ep=dict(residual=True, beta=1.0, activation="gelu")),
    # 8 x 10 x 3 row tiles of 4 rows > 132 SMs: a persistent grid of 256-row halo tiles
    "persistent_tall": case2d(N=8, H=40, W=150, C=64, K=96, ep=dict(residual=True, beta=1.0, bias=True)),
}


@gpu
@needs_hopper
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("name", list(HALO_CASES))
def test_sm90_halo_edge_cases(cp, name, dtype):
    """Halo tiles (forced): partial column and row tiles, padding on any side, short channel blocks,
    1x3 / dilated 2x2 filters, the fused epilogue and residual ring in halo-tile order."""
    case = Case(**{**HALO_CASES[name].__dict__, "dtype": dtype})
    with cuconv.overrides(halo=True):
        assert "_halo" in _sm90_detail(cp, case)
        check_case(case, xp=cp, kernel="sm90_tma", poison=True)


@gpu
@needs_hopper
@pytest.mark.parametrize("bn,bm", [(96, 256), (96, 128), (128, 256), (160, 128), (192, 128), (64, 192), (128, 192),
                                   (192, 192)])
@pytest.mark.parametrize("name", ["columns_partial_last_tile", "fp16_full_epilogue", "k200_partial_n_tile"])
def test_sm90_halo_tile_shapes(cp, bn, bm, name):
    """Forced halo tile shapes; with a residual, a height the variant list lacks (256 x 128) runs as 128 rows."""
    case = HALO_CASES[name]
    rows = bm if bm_fits(bm, bn, 1, bool(case.epilogue.get("residual")), halo=True) else 128
    with cuconv.overrides(halo=True, block_n=bn, block_m=bm):
        assert f"{rows}x{bn}x64" in _sm90_detail(cp, case) and "_halo" in _sm90_detail(cp, case)
        check_case(case, xp=cp, kernel="sm90_tma", poison=True)


#: Layers 64 output channels wide whose columns pad by 3/8 in halo tiles: halo tiles when automatic
#: (docs/tuning.md T-halo-narrow-n).
NARROW_N_HALO_CASES = {
    "q80_one_block": case2d(N=2, H=10, W=80, C=64, K=64, ep=dict(bias=True, activation="silu")),
    "q40_residual": case2d(N=3, H=9, W=40, C=256, K=64, dtype="float16",
                           ep=dict(bias=True, residual=True, beta=0.5, activation="relu")),
    "q80_k32": case2d(N=1, H=7, W=80, C=128, K=32),
}


@gpu
@needs_hopper
@pytest.mark.parametrize("name", list(NARROW_N_HALO_CASES))
def test_sm90_narrow_n_halo_automatic(cp, name):
    """The automatic choice takes halo tiles for these 64-column layers; results equal the reference."""
    case = NARROW_N_HALO_CASES[name]
    assert "_halo" in _sm90_detail(cp, case) and "x64x64" in _sm90_detail(cp, case)
    check_case(case, xp=cp, kernel="sm90_tma", poison=True)


# More row tiles than twice the SMs, so that both warpgroups of every CTA take several turns.
PINGPONG_CASES = {
    "persistent_bn96": case2d(N=8, H=40, W=150, C=64, K=96, ep=dict(bias=True, activation="relu")),
    "persistent_bn256": case2d(N=4, H=37, W=130, C=40, K=256, dtype="float16"),
    "persistent_bn64": case2d(N=16, H=33, W=70, C=72, K=64, ep=dict(alpha=0.5, activation="silu")),
}


@gpu
@needs_hopper
@pytest.mark.parametrize("name", list(PINGPONG_CASES) + [n for n in HALO_CASES if n != "persistent_tall"])
def test_sm90_halo_pingpong(cp, name):
    """Ping-pong halo tiles (forced): the two consumer warpgroups alternate over the CTA's tiles; a
    residual keeps the cooperative kernel (and explain says which ran)."""
    case = PINGPONG_CASES.get(name) or HALO_CASES[name]
    with cuconv.overrides(halo=True, pingpong=True):
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
    with cuconv.overrides(halo=True, pingpong=True, block_n=bn, block_m=bm):
        detail = _sm90_detail(cp, case)
        assert f"{bm}x{bn}x64" in detail and "_halo_pp" in detail, detail
        check_case(case, xp=cp, kernel="sm90_tma", poison=True)


@gpu
@needs_hopper
@pytest.mark.parametrize("name", ["columns_partial_last_tile", "narrow_image", "fp16_full_epilogue", "residual_bn256",
                                  "persistent_tall", "c72_partial_block"])
def test_sm90_halo_cta_pairs(cp, name):
    """Halo tiles in CTA pairs (forced): each CTA multicasts half of every filter box; an odd tile
    count leaves a ghost CTA that reads zeros and stores nothing (narrow_image: 3 tiles)."""
    case = HALO_CASES[name]
    with cuconv.overrides(halo=True, cluster=2):
        detail = _sm90_detail(cp, case)
        assert "_c2_halo" in detail, detail
        check_case(case, xp=cp, kernel="sm90_tma", poison=True)


@gpu
@needs_hopper
@pytest.mark.parametrize("n, hw, c, k, parts", [
    (16, 20, 512, 128, 2),    # YOLOv8s Detect.cv3.2.0: one partial wave of 96-wide tiles -> 128 wide in 2 parts
    (2, 16, 1280, 1280, 3),   # SD UNet 3x3 at 16x16: a small problem's 96-wide parts -> 128 wide in 3 parts
])
def test_sm90_wider_split_chosen_automatically(cp, n, hw, c, k, parts):
    """The wider split (docs/tuning.md T-split-wider), chosen without being asked, with a bias, a residual
    and an activation: within the tolerance of the reference on the first image, the same bits twice, and
    close to the unsplit kernel's result."""
    from conftest import assert_close
    rng = np.random.default_rng(c + k)
    x = cp.asarray(rng.standard_normal((n, hw, hw, c)).astype(np.float16))
    w = cp.asarray((rng.standard_normal((k, 3, 3, c)) / np.sqrt(9 * c)).astype(np.float16))
    b = cp.asarray(rng.standard_normal((k,)).astype(np.float16))
    res = cp.asarray(rng.standard_normal((n, hw, hw, k)).astype(np.float16))
    kw = dict(padding=1, residual=res, activation="relu")
    detail = cuconv.explain(x, w, b, **kw).detail
    assert "T-split-wider" in detail and (" in two " if parts == 2 else f"{parts} ways") in detail, detail
    a = cuconv.conv2d(x, w, b, **kw)
    assert bool((cuconv.conv2d(x, w, b, **kw).view(cp.uint16) == a.view(cp.uint16)).all())
    want = cuconv.reference.conv2d(cp.asnumpy(x[:1]), cp.asnumpy(w), cp.asnumpy(b), padding=1,
                                   residual=cp.asnumpy(res[:1]), activation="relu")
    assert_close(cp.asnumpy(a[:1]), want, "float16")
    with cuconv.overrides(split=False):
        whole = cuconv.conv2d(x, w, b, **kw)
    assert float(cp.abs(a.astype(cp.float32) - whole.astype(cp.float32)).max()) < 0.05


LONG_K_CASES = {
    # 144 reduction steps: 192 x 128 tiles (57 of them, each in two parts) instead of 128 x 96
    "192x128_c1024_k384": case2d(N=8, H=21, W=21, C=1024, K=384, ep=dict(residual=True, beta=0.5, bias=True,
                                                                          activation="relu")),
    # 128 x 256 tiles (35 of them, each in three parts)
    "128x256_c1024_k256": case2d(N=4, H=33, W=33, C=1024, K=256, dtype="float16", ep=dict(bias=True)),
}


@gpu
@needs_hopper
@pytest.mark.parametrize("name", list(LONG_K_CASES))
def test_sm90_long_reduction_tiles(cp, name):
    """The taller or wider tiles the automatic choice takes over long reductions (docs/tuning.md T-long-k),
    with the split of small problems, against the reference."""
    case = LONG_K_CASES[name]
    tile = name.split("_")[0]
    detail = _sm90_detail(cp, case)
    assert f"_{tile}x64_" in detail and "T-long-k" in detail, detail
    check_case(case, xp=cp, kernel="sm90_tma", poison=True)
