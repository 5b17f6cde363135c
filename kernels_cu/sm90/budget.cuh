// cuconv sm90: the shared-memory budget of the Hopper kernel, written once. The host reads these
// #define lines (cuconv/launch.py header_constants) to size the ring and the launch's dynamic shared
// memory exactly as the kernel lays it out (conv_fprop_sm90.cu, namespace cfg).
#pragma once

#define SM90_BLOCK_K 64             // channels per ring slot (one 128-byte swizzled row per pixel)
#define SM90_C_STAGES 2             // residual (C) ring slots, each BM rows x SM90_C_CHUNK channels
#define SM90_C_CHUNK 64             // channels per residual chunk
#define SM90_HALO_A_STAGES 2        // halo window ring slots
#define SM90_HALO_REACH_MAX 2       // extra window rows / columns: (R-1) dil_h and (S-1) dil_w at most
#define SM90_BARRIER_BYTES 256      // the mbarriers
#define SM90_SMEM_ALIGN_SLACK 1024  // re-alignment of the dynamic area to the 1024-byte swizzle atom
#define SM90_SMEM_LIMIT (227 * 1024)  // opt-in maximum per block on H100 / H200
#define SM90_MAX_STAGES 8           // deepest filter ring the kernel is built with
#define SM90_XPOSE_ST_STAGES 4      // SM90_A_XPOSE: staging ring slots (one input row of 64 channels each)
#define SM90_XPOSE_ST_W_MAX 88      // SM90_A_XPOSE: widest staged row, pixels (11 16-byte chunks)
#define SM90_XPOSE_EXTRA_BYTES 128  // SM90_A_XPOSE: the staging ring's mbarriers and a 16-byte scratch row
