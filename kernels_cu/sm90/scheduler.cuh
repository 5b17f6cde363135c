// cuconv hopper: which output tile, and which part of its reduction, a CTA works on next.
//
// Tiles are numbered m-major: tile (m_tile, n_tile) covers GEMM rows [m_tile * BM, +BM) and
// columns [n_tile * BN, +BN), so CTAs resident at the same time share their activation rows (the
// large operand) in L2 while the small filter stays there.
//
// The unit of scheduling is a *cluster tile*: CLUSTER tiles with consecutive m_tile and the same
// n_tile, one per CTA of the cluster (CTA rank r takes m_tile = CLUSTER * unit_m + r); with
// CLUSTER == 1 it is a single tile. Units are numbered u = unit_m * n_tiles + n_tile. The grid is
// min(units, co-resident clusters) clusters; each strides through the unit list by the number of
// clusters (a persistent grid when there are more units than clusters, one unit per cluster
// otherwise). Every role of every CTA of a cluster walks the same sequence, so they agree on the
// tile (and on the filter tile they share) without talking to each other. A CTA whose m_tile lies
// past the last tile (odd m_tiles) still runs its unit, on rows >= M that TMA reads as zeros and
// the epilogue never stores: its share of the multicast filter load is what its peer waits for.
//
// Split tiles (CLUSTER == 1 only; the host decides, cuconv/backends/sm90/tiles.py): a split tile is cut
// into split_ways parts along the reduction, each its own unit. Tiles [0, dp_tiles) stay whole (units
// 0 .. dp_tiles - 1); split tile j = dp_tiles + i becomes units dp_tiles + i * split_ways + part, part
// 0 .. split_ways - 1 taking steps [part * k_iters / split_ways, (part + 1) * k_iters / split_ways).
// Parts 0 .. split_ways - 2 are PARTIAL (fp32 partial sums to workspace slot i * (split_ways - 1) +
// part); the last part is the FINISH: it adds the slots in part order (one fixed order: the same bits
// on every run) and runs the epilogue. Two uses:
//  - the split tail: when the last wave of tiles would leave at least half of the SMs idle, its tiles
//    are cut in two (split_ways = 2), so the last round takes half a tile's time;
//  - small problems: every tile cut into split_ways parts where tiles * split_ways units fit the SMs.
// Every part of a split tile lands on its own CTA of one round (units of a tile are consecutive and
// the host keeps a split tile's units within one round of the grid), so a FINISH never waits on a part
// its own CTA has still to run.
//
// Rotated columns (ROTATE, the SM90_B_MN variants): the tiles of row tile r take the column tiles in the
// order r, r + 1, ... (mod n_tiles). A stacked-phase convolution's column tiles are its phases, and a tile
// skips the window taps its phase has no filter tap at (mn_filter_loader.cuh), so its reduction length
// depends on the column tile. Where the grid is a multiple of n_tiles, a CTA striding through the units
// unrotated would meet the same column tile every time (a 3x3 filter of stride 2: one CTA all 16-step
// tiles, another all 4-step ones); rotated, it meets them in turn. Within a row tile the rotation is a
// permutation, so the tiles resident together (and the rows they share in L2) are the same.
//
// Halo tiles (SM90_HALO, halo_loader.cuh): a row tile is BM/64 output rows x 64 output columns of
// one (image, depth) plane instead of BM consecutive GEMM rows; m_tile numbers them column tile
// fastest, then row tile, then plane (halo_tile() below). Never split, never clustered.
#pragma once

#include "common/fast_div.cuh"

namespace cuconv {
namespace sm90 {

enum UnitPart : int { UNIT_WHOLE = 0, UNIT_PARTIAL = 1, UNIT_FINISH = 2 };

// Params: the kernel's parameter struct (a __grid_constant__ kernel parameter, so the reference
// reads the parameter bank and the scheduler costs no registers), with fields n_tiles (tiles along
// the GEMM N) and its FastDivisor n_tiles_div, num_units (ceil(m_tiles / CLUSTER) * n_tiles, plus
// split_ways - 1 per split tile), dp_tiles (units below this are whole tiles), k_iters (reduction steps
// of a whole tile) and split_ways (parts per split tile, >= 2 where any tile is split).
template <int CLUSTER, typename Params, bool ROTATE = false>
struct TileScheduler {
  const Params& p;
  int rank;  // this CTA's rank in its cluster

  __device__ __forceinline__ int first() const { return blockIdx.x / CLUSTER; }
  __device__ __forceinline__ int next(int u) const { return u + gridDim.x / CLUSTER; }
  __device__ __forceinline__ bool valid(int u) const { return u < p.num_units; }
  // Which split tile a unit >= dp_tiles belongs to, and which of its parts it is.
  __device__ __forceinline__ int split_index(int u) const { return (u - p.dp_tiles) / p.split_ways; }
  __device__ __forceinline__ int part_index(int u) const { return (u - p.dp_tiles) % p.split_ways; }
  // The (cluster) tile a unit works on.
  __device__ __forceinline__ int tile(int u) const { return u < p.dp_tiles ? u : p.dp_tiles + split_index(u); }
  __device__ __forceinline__ int part(int u) const {
    return u < p.dp_tiles ? UNIT_WHOLE : (part_index(u) == p.split_ways - 1 ? UNIT_FINISH : UNIT_PARTIAL);
  }
  // Workspace slot of part j (< split_ways - 1) of u's split tile.
  __device__ __forceinline__ int slot(int u, int j) const { return split_index(u) * (p.split_ways - 1) + j; }
  __device__ __forceinline__ int k_begin(int u) const {
    return u < p.dp_tiles ? 0 : part_index(u) * p.k_iters / p.split_ways;
  }
  __device__ __forceinline__ int k_end(int u) const {
    return u < p.dp_tiles ? p.k_iters : (part_index(u) + 1) * p.k_iters / p.split_ways;
  }
  // Units whose epilogue stores (and, with a residual, reads C): all but the PARTIAL parts.
  __device__ __forceinline__ bool stores(int u) const { return part(u) != UNIT_PARTIAL; }
  __device__ __forceinline__ int m_tile(int u) const { return row_tile(u) * CLUSTER + rank; }
  __device__ __forceinline__ int n_tile(int u) const {
    if constexpr (ROTATE) {
      const int r = row_tile(u), n = tile(u) - r * p.n_tiles;
      const int turned = n + (r - (int)fast_div((uint32_t)r, p.n_tiles_div) * p.n_tiles);  // < 2 n_tiles
      return turned < p.n_tiles ? turned : turned - p.n_tiles;
    } else {
      return tile(u) - row_tile(u) * p.n_tiles;
    }
  }
  __device__ __forceinline__ int row_tile(int u) const { return (int)fast_div((uint32_t)tile(u), p.n_tiles_div); }
};

// Where a halo tile lies: image n_img, output depth z, first output row y0 and column x0, and
// plane_row0 = (n_img * O + z) * P + y0, the tile's first output row counted over all planes (the
// residual's row coordinate; GEMM row of pixel (y0 + i, x0 + j) = (plane_row0 + i) * Q + x0 + j).
// Params: fields x_tiles = ceil(Q / 64), y_tiles = ceil(P / rows), O, P, and the FastDivisors
// x_tiles_div, y_tiles_div, o_div of the first three.
struct HaloTile {
  int n_img, z, y0, x0, plane_row0;
};

template <int ROWS, typename Params>
__device__ __forceinline__ HaloTile halo_tile(int m_tile, const Params& p) {
  const int rest = (int)fast_div((uint32_t)m_tile, p.x_tiles_div);
  const int xt = m_tile - rest * p.x_tiles;
  const int plane = (int)fast_div((uint32_t)rest, p.y_tiles_div);  // n_img * O + z
  const int yt = rest - plane * p.y_tiles;
  HaloTile h;
  h.n_img = (int)fast_div((uint32_t)plane, p.o_div);
  h.z = plane - h.n_img * p.O;
  h.y0 = yt * ROWS;
  h.x0 = xt * 64;
  h.plane_row0 = plane * p.P + h.y0;
  return h;
}

// The first channel of x that the reduction of a tile whose output channels start at n0 reads: 0 for
// a dense convolution; for a grouped one (Sm90ConvParams.a_kg / a_cg) the first channel of n0's group,
// or of its 64-channel block of groups.
template <typename Params>
__device__ __forceinline__ int grouped_c0(const Params& g, int n0) {
  return g.a_kg ? (n0 / g.a_kg) * g.a_cg : 0;
}

// The first channel of x that reduction channel block cb reads (BK channels per block), from a tile's first
// channel c0: blocks past the a_wrap blocks x holds read x's from the first again (Sm90ConvParams.a_wrap).
template <int BK, typename Params>
__device__ __forceinline__ int x_channel(const Params& g, int c0, int cb) {
  return c0 + (cb < g.a_wrap ? cb : cb - g.a_wrap) * BK;
}

}  // namespace sm90
}  // namespace cuconv
