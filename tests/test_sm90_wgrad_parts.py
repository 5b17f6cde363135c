"""Balanced parts of sm90_wgrad's TMA form (cuconv.backends.sm90.wgrad.balanced_parts): a Python model of
the kernel's walk (kernels_cu/sm90/wgrad_common.cuh, ``WgradPartWalk``) checked against the host's table,
and the choice between parts and the split grid. CPU only."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from cuconv.backends.sm80.wgrad import choose_splits
from cuconv.backends.sm90.wgrad import balanced_parts, parts_declined, parts_pay, variant
from cuconv.problem import ConvProblem


def walk(b: int, units: int, k_tiles: int, ctas: int):
    """CTA ``b``'s parts as the kernel walks them: (tile, first step, end step, slot)."""
    def cta_of(u):
        return ((u + 1) * ctas - 1) // units
    u, end = b * units // ctas, (b + 1) * units // ctas
    out = []
    while u < end:
        tile, first = u // k_tiles, (u // k_tiles) * k_tiles
        kt0, kt1 = u - first, min(k_tiles, end - first)
        out.append((tile, kt0, kt1, b - cta_of(first)))
        u = first + kt1
    return out


@given(tiles=st.integers(1, 300), k_tiles=st.integers(1, 400), ctas=st.integers(1, 300))
def test_parts_cover_every_step_once_and_the_slots_match_the_table(tiles, k_tiles, ctas):
    """Every (tile, step) is one CTA's, the runs differ by at most one step, each tile's parts take slots
    0 .. tile_parts[t] - 1 in order of their steps, and no CTA computes more parts than ``most_per_cta``."""
    parts = balanced_parts(tiles, k_tiles, ctas)
    assert parts.ctas == min(ctas, tiles * k_tiles) and parts.units == tiles * k_tiles
    seen = {}
    runs = []
    for b in range(parts.ctas):
        mine = walk(b, parts.units, k_tiles, parts.ctas)
        assert 1 <= len(mine) <= parts.most_per_cta
        runs.append(sum(kt1 - kt0 for _, kt0, kt1, _ in mine))
        for tile, kt0, kt1, slot in mine:
            assert 0 <= kt0 < kt1 <= k_tiles
            seen.setdefault(tile, []).append((kt0, kt1, slot))
    assert max(runs) - min(runs) <= 1
    assert sorted(seen) == list(range(tiles))
    for t, segs in seen.items():
        segs.sort()
        assert [s for _, _, s in segs] == list(range(parts.tile_parts[t]))
        assert segs[0][0] == 0 and segs[-1][1] == k_tiles
        assert all(a[1] == b[0] for a, b in zip(segs, segs[1:]))


def _problem(N, H, C, K, f, s=1):
    return ConvProblem.create(nd=2, batch=N, in_spatial=(H, H), channels=C, out_channels=K, filter_spatial=(f, f),
                              stride=s, dilation=1, padding=f // 2, groups=1, dtype="bfloat16", layout="NHWC")


def test_parts_are_taken_where_the_split_grid_quantises_and_the_operands_fit_l2():
    """In 128 x 128 tiles (the only ones the automatic choice weighs parts on) the VAE's 3x3 512 -> 512 at 64x64
    and ResNet-50's 3x3 512 layers have 144 output tiles on 132 SMs: the split grid runs 3 waves of whole
    splits, the parts one even run per CTA, and x and dy fit L2. The same layer at 128x128 reads 34 MB of
    operands, which the parts' CTAs would fetch from DRAM once per tile column; a 1x1 256 -> 128 layer with
    two output tiles has too many parts per tile."""
    for p, want in ((_problem(1, 64, 512, 512, 3), True), (_problem(32, 7, 512, 512, 3), True),
                    (_problem(1, 128, 512, 512, 3), False), (_problem(32, 56, 256, 128, 1), False)):
        v = variant(p, bm=128, bn=128, tma=True)
        splits = choose_splits(p, v, 132)
        parts = balanced_parts(splits.tiles, -(-p.gemm_m // v.bk), 132 * v.per_sm)
        assert parts_pay(p, v, splits, parts) is want, p.describe()


def test_parts_decline_what_their_reduce_cannot_index():
    assert parts_declined(_problem(1, 8, 64, 70000, 1), 10) is not None
    assert "output tiles" in parts_declined(_problem(1, 8, 64, 64, 1), 1 << 20)
    assert parts_declined(_problem(1, 8, 64, 64, 1), 4) is None
