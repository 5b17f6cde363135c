// cuconv hopper: which output tile a CTA works on next.
//
// Tiles are numbered m-major: tile t covers GEMM rows [m_tile * BM, +BM) and columns
// [n_tile * BN, +BN) with m_tile = t / n_tiles, n_tile = t % n_tiles, so CTAs resident at the same
// time share their activation rows (the large operand) in L2 while the small filter stays there.
// The grid is min(tiles, SMs) CTAs; each strides through the tile list by gridDim.x (a persistent
// grid when there are more tiles than SMs, one tile per CTA otherwise). Every role of a CTA walks
// the same sequence, so they agree on the tile without talking to each other.
#pragma once

namespace cuconv {
namespace sm90 {

struct TileScheduler {
  int n_tiles;    // tiles along the GEMM N (output channels)
  int num_tiles;  // m_tiles * n_tiles

  __device__ __forceinline__ int first() const { return blockIdx.x; }
  __device__ __forceinline__ int next(int t) const { return t + gridDim.x; }
  __device__ __forceinline__ bool valid(int t) const { return t < num_tiles; }
  __device__ __forceinline__ int m_tile(int t) const { return t / n_tiles; }
  __device__ __forceinline__ int n_tile(int t) const { return t - (t / n_tiles) * n_tiles; }
};

}  // namespace sm90
}  // namespace cuconv
