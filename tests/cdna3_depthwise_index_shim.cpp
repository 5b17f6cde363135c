// The C entry points tests/test_cdna3_depthwise_index.py calls through ctypes: each runs the index
// functions of kernels_hip/common/depthwise_index.h as the depthwise kernel composes them
// (kernels_hip/depthwise/), over every block, unit, work-item or tap it is asked about, and writes the
// results to flat arrays the test compares with cuconv/models/depthwise.py.
#include "common/depthwise_index.h"
using namespace cuconv;
using namespace cuconv::dw;

extern "C" {

long long dw_struct_size() { return (long long)sizeof(DwGeometry); }

// The members in declaration order, read through the C struct.
int dw_struct_members(const DwGeometry* g, int* out) {
  const int v[] = {g->N, g->D, g->H, g->W, g->C, g->K, g->O, g->P, g->Q, g->T, g->stride_d, g->stride_h, g->dil_d,
                   g->dil_h, g->pad_d, g->pad_h, g->pad_w, g->mult, g->cv, g->tp, g->tqg, g->tiles_p, g->tiles_q,
                   g->in_rows, g->in_cols, g->cin, (int)g->div_upp_mul, (int)g->div_upp_shr,
                   (int)g->div_cols_mul, (int)g->div_cols_shr, (int)g->div_tq_mul, (int)g->div_tq_shr,
                   (int)g->div_tp_mul, (int)g->div_tp_shr, (int)g->div_o_mul, (int)g->div_o_shr,
                   (int)g->div_n_mul, (int)g->div_n_shr};
  const int n = (int)(sizeof(v) / sizeof(v[0]));
  for (int i = 0; i < n; ++i) out[i] = v[i];
  return n;
}

void dw_blocks(const DwGeometry* g, unsigned count, int* out) {
  for (unsigned b = 0; b < count; ++b) {
    const DwBlock c = dw_block(*g, b);
    int* o = out + 5 * b;
    o[0] = c.n; o[1] = c.o; o[2] = c.tile_p; o[3] = c.tile_q; o[4] = c.chunk;
  }
}

int dw_depth(const DwGeometry* g, int o, int t) { return dw_input_depth(*g, o, t); }

// Every unit's voffset in the input plane (or the sentinel), in LDS order; returns the unit count.
int dw_tile_voffsets(const DwGeometry* g, unsigned block, int vec, int vin, int qt, int sw, int esize,
                     unsigned sentinel, unsigned* out) {
  const DwTileOrigin org = dw_tile_origin(*g, dw_block(*g, block), vec, qt, sw);
  const int units = dw_tile_units(*g, vin);
  for (int u = 0; u < units; ++u) out[u] = dw_unit_voffset(*g, org, dw_unit(*g, vin, u), vin, esize, sentinel);
  return units;
}

// The units work-item tid visits (halo_tile.h: u = tid, tid + threads, ...) as the walker sees them and
// as dw_unit decomposes them: rows of (u, row, col, cu, row, col, cu); returns the count.
int dw_walk(const DwGeometry* g, int vin, int tid, int threads, int* out) {
  DwUnitWalker walk(*g, vin, tid, threads);
  int n = 0;
  for (int u = tid; u < dw_tile_units(*g, vin); u += threads, ++n) {
    const DwUnit d = dw_unit(*g, vin, u);
    int* o = out + 7 * n;
    o[0] = u; o[1] = walk.at.row; o[2] = walk.at.col; o[3] = walk.at.cu; o[4] = d.row; o[5] = d.col; o[6] = d.cu;
    walk.advance();
  }
  return n;
}

// dw_walk on a tile of rows x cols pixels x upp units of one channel each (nothing else of the geometry).
int dw_walk_tile(int rows, int cols, int upp, int tid, int step, int* out) {
  DwGeometry g = {};
  g.in_rows = rows; g.in_cols = cols; g.cin = upp;
  return dw_walk(&g, 1, tid, step, out);
}

void dw_thread_map(const DwGeometry* g, int* out) {
  for (int tid = 0; tid < dw_threads(*g); ++tid) {
    const DwThread t = dw_thread(*g, tid);
    out[3 * tid] = t.cv; out[3 * tid + 1] = t.row; out[3 * tid + 2] = t.qg;
  }
}

// Tile element read by work-item tid at (r, s, q, v): [tid][r][s][q][v].
void dw_window_reads(const DwGeometry* g, int R, int S, int vec, int qt, int sw, int dwl, int* out) {
  int i = 0;
  for (int tid = 0; tid < dw_threads(*g); ++tid) {
    const DwThread th = dw_thread(*g, tid);
    for (int r = 0; r < R; ++r) {
      const int base = dw_window_base(*g, th, r, qt, sw);
      for (int s = 0; s < S; ++s)
        for (int q = 0; q < qt; ++q)
          for (int v = 0; v < vec; ++v)
            out[i++] = base + dw_window_col(q, s, sw, dwl) * g->cin + dw_input_channel(th.cv, v, vec, g->mult);
    }
  }
}

// Staging loop i -> (kl, tap, slot); and the slot each filter tap (t, r, s) is read from.
void dw_weight_slots(int taps, int cb, int* out) {
  for (int i = 0; i < taps * cb; ++i) {
    const DwWeightSlot s = dw_weight_slot(i, taps, cb);
    out[3 * i] = s.kl; out[3 * i + 1] = s.tap; out[3 * i + 2] = s.slot;
  }
}

int dw_tap(int t, int r, int s, int R, int S, int cb) { return dw_tap_slot(t, r, s, R, S, cb); }

int dw_weight_lds_bytes(const DwGeometry* g, int taps_per_slice, int vec) { return dw_weight_bytes(*g, taps_per_slice, vec); }

// Output offset of work-item tid's output j, -1 where the kernel stores nothing: [tid][j].
void dw_outputs(const DwGeometry* g, unsigned block, int vec, int qt, int sw, long long* out) {
  const DwBlock b = dw_block(*g, block);
  const DwTileOrigin org = dw_tile_origin(*g, b, vec, qt, sw);
  for (int tid = 0; tid < dw_threads(*g); ++tid) {
    const DwThread th = dw_thread(*g, tid);
    const DwOutputPixel first = dw_output_pixel(org, th, 0, vec, qt);
    for (int j = 0; j < qt; ++j) {
      const DwOutputPixel px = dw_output_pixel(org, th, j, vec, qt);
      const bool stored = first.p < g->P && first.k < g->K && px.q < g->Q;
      out[tid * qt + j] = stored ? dw_output_offset(*g, b.n, b.o, px.p, px.q, px.k) : -1;
    }
  }
}

}  // extern "C"
