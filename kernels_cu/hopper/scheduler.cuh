// cuconv hopper: which output tile a CTA works on next.
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
#pragma once

namespace cuconv {
namespace sm90 {

template <int CLUSTER>
struct TileScheduler {
  int n_tiles;    // tiles along the GEMM N (output channels)
  int num_units;  // ceil(m_tiles / CLUSTER) * n_tiles
  int rank;       // this CTA's rank in its cluster

  __device__ __forceinline__ int first() const { return blockIdx.x / CLUSTER; }
  __device__ __forceinline__ int next(int u) const { return u + gridDim.x / CLUSTER; }
  __device__ __forceinline__ bool valid(int u) const { return u < num_units; }
  __device__ __forceinline__ int m_tile(int u) const { return (u / n_tiles) * CLUSTER + rank; }
  __device__ __forceinline__ int n_tile(int u) const { return u - (u / n_tiles) * n_tiles; }
};

}  // namespace sm90
}  // namespace cuconv
