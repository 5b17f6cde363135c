"""CPU kernel (NumPy): im2col through ``sliding_window_view`` + batched matmuls, in chunks.

The matmuls and the epilogue run in float32, or in float64 for a problem at precision "float64" (the
default for float64 data). Data flow of one chunk (a range of images, or of output rows of one image)::

    x[chunk's input rows] --pad--> --sliding_window_view--> windows (n, *out, C, *filter)
      (strided by the conv stride, the window by the dilation; no copy)
    A = windows regrouped to [G, m, Kgemm] in the compute dtype (Kgemm ordered (t, r, s, c) like the weights)
    acc = A @ W^T per group  ->  epilogue  ->  cast into out[chunk]

The chunks keep the temporaries (the chunk's padded input, A, acc and the epilogue's values) under
:data:`CHUNK_BYTES`, so memory beyond the operands stays bounded whatever the problem's size; a
problem that fits runs as one chunk.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from ..epilogue import apply_epilogue
from ..plan import EVERY_PRECISION, Kernel, Plan, tf32_note
from ..registry import register

__all__ = ["CPUKernel", "CPUPlan", "CHUNK_BYTES", "im2col_windows"]

#: Bytes of temporaries one chunk may hold (the im2col matrix dominates).
CHUNK_BYTES = 128 << 20


def im2col_windows(x, pads, out_spatial, filter_spatial, stride, dilation):
    """The im2col view of channels-last ``x``: ``(n, *out_spatial, C, *filter)``, a view of ``x``
    (of a padded copy of it when ``pads``, one (lo, hi) pair per spatial dim, is not all zero)."""
    nd = len(out_spatial)
    xp = np.pad(x, [(0, 0), *pads, (0, 0)]) if any(lo or hi for lo, hi in pads) else x
    extent = tuple((f - 1) * d + 1 for f, d in zip(filter_spatial, dilation))
    win = sliding_window_view(xp, extent, axis=tuple(range(1, nd + 1)))  # (n, *L, C, *extent)
    sl = ((slice(None),) + tuple(slice(0, o * s, s) for o, s in zip(out_spatial, stride))
          + (slice(None),) + tuple(slice(None, None, d) for d in dilation))
    return win[sl]


def compute_dtype(problem):
    """The dtype the CPU kernel multiplies, sums and applies the epilogue in: float64 at precision
    "float64", else float32 (for "tf32" too: more accurate than asked)."""
    return np.dtype(np.float64 if problem.precision == "float64" else np.float32)


def _chunks(problem):
    """Chunks as (image range, output-row range of the first spatial dim): whole images where
    several fit :data:`CHUNK_BYTES`, else runs of output rows of one image."""
    N, rows = problem.batch, problem.out_spatial[0]
    per_row = math.prod(problem.out_spatial[1:])
    # per output pixel: A (Kgemm*G values) + acc + epilogue values (K values each) + input share
    row_bytes = per_row * compute_dtype(problem).itemsize * (problem.gemm_k * problem.groups
                                                             + 3 * problem.out_channels)
    rows_per_chunk = max(1, CHUNK_BYTES // max(1, row_bytes))
    if rows_per_chunk >= rows:
        images = rows_per_chunk // rows
        return [((n, min(N, n + images)), (0, rows)) for n in range(0, N, images)]
    return [((n, n + 1), (p, min(rows, p + rows_per_chunk))) for n in range(N) for p in range(0, rows, rows_per_chunk)]


class CPUKernel(Kernel):
    name = "cpu"
    backend = "cpu"
    priority = 0
    precisions = EVERY_PRECISION

    def make_plan(self, problem, device, overrides):
        dt = compute_dtype(problem).name
        return CPUPlan(self, problem, device, f"NumPy im2col + {dt} matmul accepts every valid problem"
                                              f"{tf32_note(problem, 'float32 matmul')}")


class CPUPlan(Plan):
    def describe(self):
        n = len(_chunks(self.problem))
        return (f"sliding_window_view im2col + {compute_dtype(self.problem).name} matmul"
                + (f" in {n} chunks" if n > 1 else ""))

    def run(self, x, w, bias, residual, out):
        p = self.problem
        nd, G = p.nd, p.groups
        Cg, Kg, Kgemm = p.channels_per_group, p.gemm_n, p.gemm_k
        dt = compute_dtype(p)
        b = w.astype(dt).reshape(G, Kg, Kgemm).transpose(0, 2, 1)  # [G, Kgemm, Kg]
        # (n, *out, G, Cg, *filter) -> (G, n, *out, *filter, Cg)
        order = (nd + 1,) + tuple(range(0, nd + 1)) + tuple(range(nd + 3, 2 * nd + 3)) + (nd + 2,)
        s0, d0 = p.stride[0], p.dilation[0]
        extent0 = (p.filter_spatial[0] - 1) * d0 + 1
        lo0 = p.pad_lo[0]
        for (n0, n1), (r0, r1) in _chunks(p):
            # input rows of the first spatial dim this chunk reads, clipped to x, and the zero rows around
            first, last = r0 * s0 - lo0, (r1 - 1) * s0 - lo0 + extent0  # [first, last) in x's rows
            lo = min(max(first, 0), x.shape[1])
            hi = min(max(last, lo), x.shape[1])
            before = max(0, min(lo, last) - first)
            pads = [(before, (last - first) - (hi - lo) - before)] + list(zip(p.pad_lo[1:], p.pad_hi[1:]))
            out_sp = (r1 - r0,) + p.out_spatial[1:]
            win = im2col_windows(x[n0:n1, lo:hi], pads, out_sp, p.filter_spatial, p.stride, p.dilation)
            m = (n1 - n0) * math.prod(out_sp)
            win = win.reshape(n1 - n0, *out_sp, G, Cg, *p.filter_spatial)
            a = np.empty(tuple(win.shape[i] for i in order), dtype=dt)
            a[...] = win.transpose(order)  # one pass: gather and convert
            acc = np.matmul(a.reshape(G, m, Kgemm), b)  # [G, m, Kg]
            del a
            acc = acc.transpose(1, 0, 2).reshape(n1 - n0, *out_sp, p.out_channels)
            res = None if residual is None else residual[n0:n1, r0:r1]
            out[n0:n1, r0:r1] = apply_epilogue(np, acc, p.epilogue, bias, res, dtype=dt)


register(CPUKernel())
