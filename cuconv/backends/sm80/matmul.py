"""``cuconv.matmul`` on the GPU: the sm80 mainloop with a linear loader (kernels_cu/sm80/matmul_sm80.cu)."""

from __future__ import annotations

import numpy as np

from ...compiler import load_cuda_function
from ...launch import epilogue_params
from ...problem import Epilogue
from .params import epilogue_operands, m_grid, out_vec
from .variants import MATMUL_SOURCE, matmul_variant

__all__ = ["run_matmul"]


def run_matmul(a, b, bias, residual, out, epilogue: Epilogue) -> None:
    """``out = act(alpha * a @ b + bias + beta * residual)`` on the GPU with the sm80 kernel.

    All CuPy, C-contiguous, one 16-bit dtype; ``a (M, K)``, ``b (K, N)``, ``out (M, N)`` with K and
    N at most :data:`MAX_LD`; ``residual`` may be ``out``. Validation is :func:`cuconv.matmul`'s job.
    """
    from ...arrays import dtype_name
    from ...device import device_of
    M, K = a.shape
    N = b.shape[1]
    dtype = dtype_name(a, "a")
    name, cfg, defines = matmul_variant(dtype, M, N, K, a.data.ptr, b.data.ptr)
    smem = cfg.smem_bytes(row_table=False)
    fn = load_cuda_function(MATMUL_SOURCE, device_of(a), defines, name, smem)
    m_tiles = -(-M // cfg.bm)
    gy, gz = m_grid(m_tiles)
    bias_arg, res_arg, res_ptr = epilogue_operands(out, bias, residual, epilogue)
    vec = out_vec(N, N, out.data.ptr, None if bias is None else bias.data.ptr, res_ptr)
    fn((-(-N // cfg.bn), gy, gz), (cfg.threads,),
       (a, b, bias_arg, res_arg, out, np.int64(M), np.int32(N), np.int32(K), np.int32(m_tiles), np.int32(vec),
        epilogue_params(epilogue)), shared_mem=smem)


