"""The ``grouped_mma`` path: grouped / depthwise convolution as block-diagonal mma.sync over
32-channel superblocks, weights packed into mma fragments by a prep kernel per call
(kernels_cu/sm80/grouped_mma_sm80.cu)."""

from __future__ import annotations

import numpy as np

from ...compiler import load_cuda_function
from ...launch import PackedLaunch, epilogue_params
from .params import epilogue_operands, grouped_geometry, out_vec
from .variants import GROUPED_FRAG_BYTES, GROUPED_OCTETS, GROUPED_SOURCE, GROUPED_SUPER, grouped_variant

__all__ = ["GroupedLaunch"]

#: Streams a plan keeps packed launches for (each with its own fragment buffer).
_STREAMS_KEPT = 4


class GroupedLaunch:
    """The grouped_mma path of one plan, packed once: the prep launch (weights -> fragments) and the
    direct kernel's launch, per CUDA stream (each stream has its own fragment buffer, so launches on
    different streams never share one). A call then writes the operands' addresses and launches twice;
    the parameter structs, grid and functions are built on the first call of a stream."""

    def __init__(self, problem, dev):
        self.problem, self.dev = problem, dev
        self._per_stream = {}

    def _build(self, vec: int):
        import cupy as cp
        p, dev = self.problem, self.dev
        name, sbs, defines = grouped_variant(p)
        taps = int(np.prod(p.filter_spatial))
        n_super = -(-p.channels // GROUPED_SUPER)
        frags = cp.empty((taps * n_super * GROUPED_FRAG_BYTES // 4,), dtype=cp.uint32)
        prep = load_cuda_function(GROUPED_SOURCE, dev, defines, name + "_frags", 0)
        null = np.uint64(0)
        prep_launch = PackedLaunch(prep, max(1, min(-(-frags.size // 256), 4096)), 256, 0,
                                   (null, np.uint64(frags.data.ptr), np.int32(taps), np.int32(p.channels),
                                    np.int32(p.channels_per_group), np.int32(n_super)), slots=(0,))
        smem = taps * sbs * GROUPED_FRAG_BYTES
        fn = load_cuda_function(GROUPED_SOURCE, dev, defines, name, smem)
        slabs = -(-n_super // sbs)
        pixel_blocks = -(-p.gemm_m // (64 * GROUPED_OCTETS))  # 8 warps x octets x 8 pixels per CTA iteration
        grid_x = max(1, min(pixel_blocks, (4 * (dev.sm_count or 132)) // slabs or 1))  # ~4 CTAs/SM, grid-stride
        main = PackedLaunch(fn, (grid_x, slabs), 256, smem,
                            (null, np.uint64(frags.data.ptr), null, null, null, grouped_geometry(p, vec),
                             epilogue_params(p.epilogue)), slots=(0, 2, 3, 4))
        return frags, prep_launch, main

    def __call__(self, x, w, bias, residual, out):
        import cupy as cp
        if x.data.ptr % 16:  # 16-byte activation loads: realign a view that is only 2-byte aligned
            x = x.copy()
        ep = self.problem.epilogue
        bias_arg, res_arg, res_ptr = epilogue_operands(out, bias, residual, ep)
        out_ptr = out.data.ptr
        vec = 8 if (out_ptr | (res_ptr or 0)) % 16 == 0 else out_vec(self.problem.channels, GROUPED_SUPER, out_ptr,
                                                                        res_ptr)  # bias is read per element
        key = (cp.cuda.get_current_stream().ptr, vec)
        entry = self._per_stream.get(key)
        if entry is None:
            if len(self._per_stream) >= _STREAMS_KEPT:
                self._per_stream.pop(next(iter(self._per_stream)))
            entry = self._per_stream[key] = self._build(vec)
        _, prep, main = entry
        prep(w.data.ptr)
        main(x.data.ptr, bias_arg.data.ptr, res_arg.data.ptr, out_ptr)
        del x  # an aligned copy (if any) lives until the launches are queued

