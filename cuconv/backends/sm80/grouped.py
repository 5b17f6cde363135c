"""The ``grouped_mma`` path: grouped / depthwise convolution as block-diagonal mma.sync over
32-channel superblocks, weights packed into mma fragments by a prep kernel per call
(kernels_cu/sm80/grouped_mma_sm80.cu)."""

from __future__ import annotations

import numpy as np

from ...compiler import load_cuda_function
from ...launch import epilogue_params
from ...scratch import scratch
from .params import epilogue_operands, grouped_geometry, out_vec
from .variants import GROUPED_FRAG_BYTES, GROUPED_OCTETS, GROUPED_SOURCE, GROUPED_SUPER, grouped_variant

__all__ = ["run_grouped"]


def run_grouped(problem, x, w, bias, residual, out, dev):
    """Launch the grouped_mma prep kernel (weights -> mma fragments) and the direct kernel."""
    import cupy as cp
    if x.data.ptr % 16:  # 16-byte activation loads: realign a view that is only 2-byte aligned
        x = x.copy()
    name, sbs, defines = grouped_variant(problem)
    taps = int(np.prod(problem.filter_spatial))
    n_super = -(-problem.channels // GROUPED_SUPER)
    frags = scratch("sm80.grouped_mma.frags", (taps * n_super * GROUPED_FRAG_BYTES // 4,), cp.uint32)
    prep = load_cuda_function(GROUPED_SOURCE, dev, defines, name + "_frags", 0)
    prep((max(1, min(-(-frags.size // 256), 4096)),), (256,),
         (w, frags, np.int32(taps), np.int32(problem.channels), np.int32(problem.channels_per_group),
          np.int32(n_super)))
    smem = taps * sbs * GROUPED_FRAG_BYTES
    fn = load_cuda_function(GROUPED_SOURCE, dev, defines, name, smem)
    ep = problem.epilogue
    bias_arg, res_arg, res_ptr = epilogue_operands(out, bias, residual, ep)
    vec = out_vec(problem.channels, GROUPED_SUPER, out.data.ptr, res_ptr)  # bias is read per element
    slabs = -(-n_super // sbs)
    pixel_blocks = -(-problem.gemm_m // (64 * GROUPED_OCTETS))  # 8 warps x octets x 8 pixels per CTA iteration
    sms = dev.sm_count or 132
    grid_x = max(1, min(pixel_blocks, (4 * sms) // slabs or 1))  # ~4 CTAs per SM (2 resident), grid-stride
    fn((grid_x, slabs), (256,), (x, frags, bias_arg, res_arg, out, grouped_geometry(problem, vec),
                                 epilogue_params(ep)), shared_mem=smem)


