"""kernels_cu/sm90/wgrad_fused_end.cuh built for the CPU: the fused end of the weight gradient's split
grid, its CTAs run as threads, against common/split_sum.cuh's order in NumPy, bit for bit.

The fused end is the one part of the TMA-form weight-gradient kernel whose threads synchronise across
CTAs: every CTA of a tile stores its fp32 partial sums, arrives at the tile's counter
(``wgrad_tile_barrier``), and then adds its share of the tile over all the splits' planes into dw
(``reduce_wgrad_share``), in the reduce launch's order so that dw has that launch's bits. Here each
emulated CTA is ``NT`` host threads (``threadIdx`` thread-local), its named barrier a condition variable,
and the counter's release / acquire operations ``__atomic`` builtins: a host ``common/gpu_sync.cuh``
stands in for the PTX one, and everything else is the header's own code.

Checked: dw (bf16, rounded to nearest even) equals the float32 split order sum of every element of every
tile, rows and columns past the group's edge included (partial tiles); no CTA leaves the tile barrier
before every split of its tile has arrived; the counters are reused across launches with no reset (their
low bits back at zero and the top bit flipped once per launch, whatever it was). The one-split-at-a-time
form (``share_only``) covers the long splits (16 to 140: two to sixteen runs per element, whose run sums
meet in shared memory).

What this does not check: the GPU's memory model (release / acquire at GPU scope, ``ld.cg`` past L1) and
the code generation; tests/test_grad_gpu.py runs the kernel against the reduce launch on a Hopper GPU.
"""

from __future__ import annotations

import ctypes

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import kernel_source_library, split_order_sum

#: The consumer threads and CTA tiles of the TMA form's variants: (NT, BM, BN).
CONFIGS = ((128, 64, 128), (256, 128, 128), (256, 128, 192), (256, 128, 256))

_GPU_SYNC = r"""
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
namespace cuconv {
// One emulated CTA's named barrier: its NT threads meet (generation counted, reusable).
struct HostBarrier {
  std::mutex m;
  std::condition_variable cv;
  int count = 0, generation = 0, threads = 0;
  void wait() {
    std::unique_lock<std::mutex> lock(m);
    const int gen = generation;
    if (++count == threads) {
      count = 0;
      ++generation;
      cv.notify_all();
    } else {
      cv.wait(lock, [&] { return generation != gen; });
    }
  }
};
extern thread_local HostBarrier* cta_barrier;
template <int NT> inline void named_barrier_sync() { cta_barrier->wait(); }
inline unsigned atomic_add_release_gpu(unsigned* w, unsigned a) { return __atomic_fetch_add(w, a, __ATOMIC_RELEASE); }
// A poll past the launch's deadline (a counter that never flips: the barrier would hang) sets `stuck`
// and reads the flipped top bit, so the launch ends and the test fails instead of waiting forever.
extern std::atomic<bool> stuck;
extern std::chrono::steady_clock::time_point deadline;
inline unsigned load_acquire_gpu(const unsigned* w) {
  const unsigned v = __atomic_load_n(w, __ATOMIC_ACQUIRE);
  if (std::chrono::steady_clock::now() < deadline) return v;
  stuck = true;
  return v ^ 0x80000000u;
}
}  // namespace cuconv
"""

_HARNESS = r"""
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <pthread.h>
#include <sched.h>
#include <vector>
struct Dim3 { unsigned x, y, z; };
static thread_local Dim3 threadIdx;
static Dim3 blockIdx, blockDim, gridDim;  // named by common/split_sum.cuh's reduce launch, unused here
#define __device__
#define __forceinline__ inline
#define __shared__ static
#define __restrict__
using std::min;
struct float4 { float x, y, z, w; };
inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
struct uint2 { uint32_t x, y; };
inline uint2 make_uint2(uint32_t x, uint32_t y) { return {x, y}; }
inline float4 __ldcg(const float4* p) { return *p; }
inline void __syncthreads() {}
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline void __nanosleep(unsigned) { sched_yield(); }
namespace cuconv {
struct bf16_t { uint16_t bits; };
template <typename T> T from_float(float f);
template <> inline bf16_t from_float<bf16_t>(float f) {  // round to nearest even, as cvt.rn.bf16.f32
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return {(uint16_t)((u >> 16) | 0x40)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return {(uint16_t)(u >> 16)};
}
}  // namespace cuconv
typedef cuconv::bf16_t elem_t;
#include "sm90/wgrad_fused_end.cuh"

namespace cuconv {
thread_local HostBarrier* cta_barrier = nullptr;
std::atomic<bool> stuck{false};
std::chrono::steady_clock::time_point deadline;
}  // namespace cuconv

struct Geo { int splits, Kg, K, cols; };

struct Cta {
  cuconv::HostBarrier barrier;
  std::vector<float4> part;
  int group, m0, n0, split, tile;
};

struct Job {
  const float* partials;  // the splits' sums, [splits][K][cols] (null: ws holds them already)
  float* ws;
  elem_t* dw;
  unsigned* counters;     // null: no tile barrier (share_only)
  int* arrived;           // [tiles][splits]: the launch each split of the tile last arrived for
  std::atomic<int>* early;
  int launch;
  Geo geo;
};

struct Thread { const Job* job; Cta* cta; unsigned t; };

template <int NT, int BM, int BN>
static void cta_thread(const Job& j, Cta& c, unsigned t) {
  threadIdx = {t, 0, 0};
  cuconv::cta_barrier = &c.barrier;
  const Geo& g = j.geo;
  if (j.partials) {  // the CTA's partial sums into its plane (the kernel's store_wgrad_partials)
    const int rows = std::min(BM, g.Kg - c.m0), cols = std::min(BN, g.cols - c.n0);
    for (int e = (int)t; e < rows * cols; e += NT) {
      const long long i = ((long long)c.split * g.K + (long long)c.group * g.Kg + c.m0 + e / cols) * g.cols + c.n0 + e % cols;
      j.ws[i] = j.partials[i];
    }
  }
  if (j.counters) {
    if (t == 0) __atomic_store_n(&j.arrived[c.tile * g.splits + c.split], j.launch, __ATOMIC_RELAXED);
    cuconv::sm90::wgrad_tile_barrier<NT>(j.counters + c.tile, c.split, g.splits);
    for (int s = 0; s < g.splits; ++s)
      if (__atomic_load_n(&j.arrived[c.tile * g.splits + s], __ATOMIC_RELAXED) != j.launch) ++*j.early;
  }
  cuconv::sm90::reduce_wgrad_share<NT, BM, BN>(j.ws, j.dw, g, c.group, c.m0, c.n0, c.split, c.part.data());
}

template <int NT, int BM, int BN>
static void* entry(void* arg) {
  const Thread* th = static_cast<const Thread*>(arg);
  cta_thread<NT, BM, BN>(*th->job, *th->cta, th->t);
  return nullptr;
}

typedef void* (*Entry)(void*);

using Ctas = std::vector<std::unique_ptr<Cta>>;  // a barrier's mutex does not move

static int run_ctas(const Job& j, Ctas& ctas, int nt, Entry fn) {
  std::vector<Thread> args;
  args.reserve(ctas.size() * nt);
  for (auto& c : ctas) {
    c->barrier.threads = nt;
    c->part.assign(nt, float4{0, 0, 0, 0});
    for (int t = 0; t < nt; ++t) args.push_back({&j, c.get(), (unsigned)t});
  }
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, 1 << 16);
  std::vector<pthread_t> ids(args.size());
  size_t started = 0;
  for (; started < args.size(); ++started)
    if (pthread_create(&ids[started], &attr, fn, &args[started]) != 0) break;
  pthread_attr_destroy(&attr);
  for (size_t i = 0; i < started; ++i) pthread_join(ids[i], nullptr);
  return started == args.size() ? 0 : -1;
}

static Entry entry_of(int nt, int bm, int bn) {
  if (nt == 128 && bm == 64 && bn == 128) return entry<128, 64, 128>;
  if (nt == 256 && bm == 128 && bn == 128) return entry<256, 128, 128>;
  if (nt == 256 && bm == 128 && bn == 192) return entry<256, 128, 192>;
  if (nt == 256 && bm == 128 && bn == 256) return entry<256, 128, 256>;
  return nullptr;
}

static Ctas grid(const Geo& g, int groups, int bm, int bn) {
  const int m_tiles = (g.Kg + bm - 1) / bm, n_tiles = (g.cols + bn - 1) / bn;
  Ctas ctas;
  for (int grp = 0; grp < groups; ++grp)
    for (int mt = 0; mt < m_tiles; ++mt)
      for (int nt = 0; nt < n_tiles; ++nt)
        for (int s = 0; s < g.splits; ++s) {
          ctas.emplace_back(new Cta);
          Cta& c = *ctas.back();
          c.group = grp, c.m0 = mt * bm, c.n0 = nt * bn, c.split = s, c.tile = (grp * m_tiles + mt) * n_tiles + nt;
        }
  return ctas;
}

extern "C" {

// Every CTA of the grid at once, `launches` times over the same counters: returns the number of
// (thread of a CTA, split) pairs that found a split of its tile not yet arrived after the barrier,
// -1 where a thread could not be started or the configuration is unknown, -2 where a tile barrier was
// still closed 20 s into a launch.
int fused_grid(const float* partials, float* ws, elem_t* dw, unsigned* counters, int* arrived, int nt, int bm,
               int bn, int splits, int Kg, int K, int cols, int groups, int launches) {
  const Entry fn = entry_of(nt, bm, bn);
  if (!fn) return -1;
  std::atomic<int> early{0};
  for (int l = 1; l <= launches; ++l) {
    Job j{partials, ws, dw, counters, arrived, &early, l, {splits, Kg, K, cols}};
    Ctas ctas = grid(j.geo, groups, bm, bn);
    cuconv::stuck = false;
    cuconv::deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    if (run_ctas(j, ctas, nt, fn) != 0) return -1;
    if (cuconv::stuck) return -2;
  }
  return early.load();
}

// The reduce alone, one CTA at a time (ws holds every split's sums): for split counts whose grid
// would take too many host threads at once.
int share_only(float* ws, elem_t* dw, int nt, int bm, int bn, int splits, int Kg, int K, int cols, int groups) {
  const Entry fn = entry_of(nt, bm, bn);
  if (!fn) return -1;
  std::atomic<int> early{0};
  Job j{nullptr, ws, dw, nullptr, nullptr, &early, 1, {splits, Kg, K, cols}};
  for (auto& c : grid(j.geo, groups, bm, bn)) {
    Ctas one;
    one.push_back(std::move(c));
    if (run_ctas(j, one, nt, fn) != 0) return -1;
  }
  return 0;
}

}  // extern "C"
"""


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    folder = tmp_path_factory.mktemp("wgrad_fused_end")
    (folder / "common").mkdir()
    (folder / "common" / "gpu_sync.cuh").write_text(_GPU_SYNC)
    so = kernel_source_library(folder, _HARNESS, flags=("-pthread", "-lstdc++"))  # clang-19 as the driver links no C++ runtime
    f32, u16, u32, i32 = (np.ctypeslib.ndpointer(t, flags="C_CONTIGUOUS")
                          for t in (np.float32, np.uint16, np.uint32, np.int32))
    so.fused_grid.argtypes = [f32, f32, u16, u32, i32] + [ctypes.c_int] * 9
    so.share_only.argtypes = [f32, u16] + [ctypes.c_int] * 8
    return so


def _partials(rng, splits: int, K: int, cols: int) -> np.ndarray:
    """Partial sums of mixed magnitudes, so that another order of the adds changes the rounding."""
    scale = np.float32(10.0) ** rng.uniform(-3, 3, size=(splits, K, cols)).astype(np.float32)
    return (rng.standard_normal((splits, K, cols)).astype(np.float32) * scale).astype(np.float32)


def _want(partials: np.ndarray) -> np.ndarray:
    """dw's bits: the split order sum of each element rounded to bf16 (to nearest even)."""
    splits, K, cols = partials.shape
    total = split_order_sum(partials.reshape(splits, K * cols)).reshape(K, cols)
    return total.astype(ml_dtypes.bfloat16).view(np.uint16)


@st.composite
def _grids(draw, max_ctas: int):
    nt, bm, bn = draw(st.sampled_from(CONFIGS))
    groups = draw(st.integers(1, 2))
    Kg = draw(st.integers(1, 2 * bm))
    cols = 4 * draw(st.integers(1, (bn + bn // 2) // 4))
    tiles = groups * -(-Kg // bm) * -(-cols // bn)
    budget = max_ctas * 128 // nt
    splits = draw(st.integers(1, max(1, min(15, budget // tiles))))
    return nt, bm, bn, groups, Kg, cols, splits


@settings(max_examples=12)
@given(g=_grids(max_ctas=16), seed=st.integers(0, 2**31 - 1), top=st.booleans(), launches=st.integers(1, 3))
def test_fused_end_gives_the_reduce_launchs_bits_after_every_split_arrives(lib, g, seed, top, launches):
    nt, bm, bn, groups, Kg, cols, splits = g
    K = groups * Kg
    rng = np.random.default_rng(seed)
    partials = _partials(rng, splits, K, cols)
    ws = np.full_like(partials, np.nan)
    dw = np.full((K, cols), 0xFFFF, dtype=np.uint16)  # a NaN where no CTA stores
    tiles = groups * -(-Kg // bm) * -(-cols // bn)
    start = np.uint32(0x80000000 if top else 0)
    counters = np.full(tiles, start, dtype=np.uint32)  # a counter left by another problem's launches
    arrived = np.zeros((tiles, splits), dtype=np.int32)
    early = lib.fused_grid(partials, ws, dw, counters, arrived, nt, bm, bn, splits, Kg, K, cols, groups, launches)
    assert early != -1, "the emulated CTAs' threads could not be started"
    assert early != -2, "a tile barrier never opened: its counter's top bit did not flip"
    assert early == 0, f"{early} CTAs left the tile barrier before their tile's splits had all arrived"
    np.testing.assert_array_equal(dw, _want(partials))
    flipped = np.uint32(0x80000000 if launches % 2 else 0)
    np.testing.assert_array_equal(counters, np.full(tiles, start ^ flipped, dtype=np.uint32))


@settings(max_examples=8)
@given(cfg=st.sampled_from(CONFIGS), splits=st.integers(16, 140), rows=st.integers(1, 80),
       quads=st.integers(1, 40), seed=st.integers(0, 2**31 - 1))
def test_long_splits_meet_in_shared_memory_in_run_order(lib, cfg, splits, rows, quads, seed):
    nt, bm, bn = cfg
    Kg, cols = min(rows, bm + 8), min(4 * quads, bn + 16)  # at most two tiles each way
    partials = _partials(np.random.default_rng(seed), splits, Kg, cols)
    dw = np.full((Kg, cols), 0xFFFF, dtype=np.uint16)
    assert lib.share_only(partials, dw, nt, bm, bn, splits, Kg, Kg, cols, 1) == 0
    np.testing.assert_array_equal(dw, _want(partials))

