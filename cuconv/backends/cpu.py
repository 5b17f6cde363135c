"""CPU kernel (NumPy): im2col through ``sliding_window_view`` + one batched matmul in float32.

Data flow::

    x (N, *spatial, C) --pad--> xp --sliding_window_view--> windows (N, *out, C, *filter)
      (strided by the conv stride, the window by the dilation)
    A = windows regrouped to [G, M, Kgemm] (Kgemm ordered (t, r, s, c) like the weights)
    acc = A @ W^T  per group (float32)  ->  epilogue  ->  cast to the output dtype
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from ..plan import Kernel, Plan
from ..registry import register
from ..epilogue import apply_epilogue_numpy


def im2col_windows(problem, x):
    """The im2col view of native-layout ``x``: shape ``(N, *out_spatial, C, *filter)`` (no copy)."""
    nd = problem.nd
    pads = [(0, 0)] + list(zip(problem.pad_lo, problem.pad_hi)) + [(0, 0)]
    xp = np.pad(x, pads) if any(problem.pad_lo + problem.pad_hi) else x
    extent = tuple((f - 1) * d + 1 for f, d in zip(problem.filter_spatial, problem.dilation))
    win = sliding_window_view(xp, extent, axis=tuple(range(1, nd + 1)))  # (N, *L, C, *extent)
    sl = (slice(None),) + tuple(slice(0, o * s, s) for o, s in zip(problem.out_spatial, problem.stride)) \
        + (slice(None),) + tuple(slice(None, None, d) for d in problem.dilation)
    return win[sl]


class CPUKernel(Kernel):
    name = "cpu"
    backend = "cpu"
    priority = 0

    def make_plan(self, problem, device, overrides):
        return CPUPlan(self, problem, device, "NumPy im2col + float32 matmul accepts every valid problem")


class CPUPlan(Plan):
    def describe(self):
        return "sliding_window_view im2col + float32 matmul"

    def run(self, x, w, bias, residual, out):
        problem = self.problem
        nd, G = problem.nd, problem.groups
        Cg, Kg, Kgemm, M = problem.channels_per_group, problem.gemm_n, problem.gemm_k, problem.gemm_m
        win = im2col_windows(problem, x.astype(np.float32, copy=False))
        N = problem.batch
        # (N, *out, G, Cg, *filter) -> (G, N, *out, *filter, Cg) -> [G, M, Kgemm]
        win = win.reshape(N, *problem.out_spatial, G, Cg, *problem.filter_spatial)
        order = (nd + 1,) + tuple(range(0, nd + 1)) + tuple(range(nd + 3, 2 * nd + 3)) + (nd + 2,)
        a = np.ascontiguousarray(win.transpose(order)).reshape(G, M, Kgemm)
        b = w.astype(np.float32).reshape(G, Kg, Kgemm).transpose(0, 2, 1)
        acc = np.matmul(a, b)  # [G, M, Kg]
        acc = acc.transpose(1, 0, 2).reshape(problem.out_shape)
        res = apply_epilogue_numpy(acc, problem.epilogue, bias, residual, np.float32)
        out[...] = res.astype(out.dtype)


register(CPUKernel())
