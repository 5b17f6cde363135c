"""kernels_cu/sm90/scheduler.cuh built for the CPU: every unit of a launch, as each role of each CTA walks
them, against the tile policy's :class:`~cuconv.backends.sm90.tiles.TileConfig` (whole tiles, the split
tail in halves, small problems split into many parts).

The scheduler is index arithmetic on the kernel's parameters and the CTA's ids; the harness gives it
``blockIdx`` / ``gridDim``, ``__umulhi`` and the fixed-width types, and a parameter struct with the
fields it reads (filled from the host's TileConfig and :func:`cuconv.launch.fast_divisor`). Checked:
each CTA's unit sequence; every tile is computed exactly once (whole, or by parts whose reduction
ranges partition ``[0, k_iters)``); the parts of a split tile are in one round of the grid, on distinct
CTAs; each PARTIAL part has its own workspace slot, and the FINISH part reads exactly its tile's slots,
in part order; the units that store are the whole tiles and the FINISH parts.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cuconv.backends.sm90.tiles import choose_tile_config
from cuconv.launch import fast_divisor

from conftest import kernel_source_library

_HARNESS = r"""
#include <cstdint>
struct Dim3 { unsigned x, y, z; };
static Dim3 blockIdx, gridDim;
#define __device__
#define __forceinline__ inline
inline uint32_t __umulhi(uint32_t a, uint32_t b) { return (uint32_t)(((uint64_t)a * b) >> 32); }
#include "common/fast_div.cuh"
#include "sm90/scheduler.cuh"

struct Params {
  int n_tiles, num_units, dp_tiles, k_iters, split_ways;
  cuconv::FastDivisor n_tiles_div;
};

// For CTA `cta` of a grid of `grid` CTAs (CLUSTER 1): the units it walks, and per unit
// (tile, m_tile, n_tile, part, k_begin, k_end, stores, slot of part j for j < split_ways - 1 ...) in `out`,
// 7 + 16 ints per unit. Returns the number of units.
extern "C" int walk(const Params* p, int cta, int grid, int* units, int* out, int max_units) {
  blockIdx = Dim3{(unsigned)cta, 0, 0};
  gridDim = Dim3{(unsigned)grid, 1, 1};
  cuconv::sm90::TileScheduler<1, Params> sched{*p, 0};
  int n = 0;
  for (int u = sched.first(); sched.valid(u) && n < max_units; u = sched.next(u), ++n) {
    int* o = out + n * 23;
    units[n] = u;
    o[0] = sched.tile(u);
    o[1] = sched.m_tile(u);
    o[2] = sched.n_tile(u);
    o[3] = sched.part(u);
    o[4] = sched.k_begin(u);
    o[5] = sched.k_end(u);
    o[6] = sched.stores(u);
    for (int j = 0; j < 16; ++j) o[7 + j] = (u >= p->dp_tiles && j < p->split_ways - 1) ? sched.slot(u, j) : -1;
  }
  return n;
}
"""

WHOLE, PARTIAL, FINISH = 0, 1, 2


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    L = kernel_source_library(tmp_path_factory.mktemp("sm90_scheduler"), _HARNESS)
    P = ctypes.c_void_p
    L.walk.argtypes = [P, ctypes.c_int, ctypes.c_int, P, P, ctypes.c_int]
    L.walk.restype = ctypes.c_int
    return L


class _Params(ctypes.Structure):
    _fields_ = [(n, ctypes.c_int) for n in ("n_tiles", "num_units", "dp_tiles", "k_iters", "split_ways")] + [
        ("div_mul", ctypes.c_uint32), ("div_shr", ctypes.c_uint32)]


def _walk(lib, cfg):
    mul, shr = fast_divisor(cfg.n_tiles)
    p = _Params(cfg.n_tiles, cfg.num_units, cfg.dp_tiles, cfg.k_iters, cfg.split_ways, mul, shr)
    per_cta = []
    for cta in range(cfg.grid):
        units = np.zeros(4096, np.int32)
        out = np.zeros((4096, 23), np.int32)
        n = lib.walk(ctypes.byref(p), cta, cfg.grid, units.ctypes.data_as(ctypes.c_void_p),
                     out.ctypes.data_as(ctypes.c_void_p), 4096)
        per_cta.append([(int(u), out[i]) for i, u in enumerate(units[:n])])
    return per_cta


def _check(lib, cfg):
    per_cta = _walk(lib, cfg)
    seen = {}
    for cta, walked in enumerate(per_cta):
        assert [u for u, _ in walked] == list(range(cta, cfg.num_units, cfg.grid))
        for rnd, (u, o) in enumerate(walked):
            seen[u] = (cta, rnd, o)
    assert sorted(seen) == list(range(cfg.num_units))
    pieces = {}
    slots = set()
    for u, (cta, rnd, o) in seen.items():
        tile, m_tile, n_tile, part, k0, k1, stores = (int(v) for v in o[:7])
        assert tile == m_tile * cfg.n_tiles + n_tile and 0 <= n_tile < cfg.n_tiles and m_tile < cfg.m_tiles
        assert stores == (part != PARTIAL)
        pieces.setdefault(tile, []).append((k0, k1, part, cta, rnd, u, o))
    assert sorted(pieces) == list(range(cfg.num_tiles))
    for tile, parts in pieces.items():
        parts.sort()
        if len(parts) == 1:
            k0, k1, part = parts[0][:3]
            assert (k0, k1, part) == (0, cfg.k_iters, WHOLE)
            continue
        assert len(parts) == cfg.split_ways
        assert [k0 for k0, *_ in parts] == [0, *[k1 for _, k1, *_ in parts[:-1]]] and parts[-1][1] == cfg.k_iters
        assert all(k1 > k0 for k0, k1, *_ in parts)
        assert [p for _, _, p, *_ in parts] == [PARTIAL] * (cfg.split_ways - 1) + [FINISH]
        assert len({rnd for *_, rnd, _, _ in parts}) == 1, "a split tile's parts in one round"
        assert len({cta for *_, cta, _, _, _ in parts}) == cfg.split_ways, "on distinct CTAs"
        own = []
        for j, (_, _, part, _, _, u, o) in enumerate(parts[:-1]):
            slot = int(o[7 + j])  # a PARTIAL part writes the slot of its own index
            assert slot not in slots
            slots.add(slot)
            own.append(slot)
        finish = parts[-1][6]
        assert [int(v) for v in finish[7:7 + cfg.split_ways - 1]] == own  # the FINISH reads them in part order
    assert slots == set(range(cfg.split_tiles * (cfg.split_ways - 1)))  # the workspace the host allocates


@pytest.mark.parametrize("kw", [
    dict(gemm_m=64 * 14 * 14, gemm_n=256, k_iters=16, block_m=128),              # split tail: 132 + 64 halves
    dict(gemm_m=64 * 56 * 56, gemm_n=64, k_iters=9, block_m=128),                # persistent, no split
    dict(gemm_m=2 * 8 * 8, gemm_n=1280, k_iters=180, block_m=128, block_n=128, split_ways=13),
    dict(gemm_m=7 * 7, gemm_n=512, k_iters=3, block_m=128, block_n=128, split_ways=16),  # 3 parts (3 steps)
])
def test_named_launches(lib, kw):
    cfg = choose_tile_config(sm_count=132, cluster=1, **kw)
    _check(lib, cfg)


@settings(max_examples=120, deadline=None)
@given(m=st.integers(1, 40000), n=st.integers(8, 2048), k_iters=st.integers(1, 400),
       ways=st.sampled_from([None, None, 2, 3, 5, 8, 16]), split=st.sampled_from([None, True]),
       sms=st.sampled_from([132, 114, 78]))
def test_drawn_launches(lib, m, n, k_iters, ways, split, sms):
    cfg = choose_tile_config(m, n, sms, cluster=1, k_iters=k_iters, split=split, split_ways=ways, block_m=128)
    if cfg.num_units > 20000:
        return
    _check(lib, cfg)
