"""Generic GPU kernel: explicit im2col (our kernel) + batched cuBLAS GEMM (cupy.matmul) + epilogue.

Serves every valid problem on CUDA (it is CUDA only: there is no HIP build of it). It is the visible
fallback of the fast kernels and the baseline the benchmark compares them with.

Data flow for one call (M chunked so the fp32 im2col matrix stays under ``_A_BYTES``)::

    x (N, *spatial, C)  --im2col_f32-->  A[G, Mc, Kgemm] fp32
    w (K, *filter, Cg)  --reshape/cast-> B[G, Kgemm, Kg]  fp32
    A @ B (cuBLAS, fp32)              -> acc[G, Mc, Kg]
    acc --epilogue--> out[m, g*Kg + k] = act(alpha*acc + bias + beta*residual)
"""

from __future__ import annotations

from ..compiler import load_cuda_function
from ..launch import conv_geometry, dtype_code, epilogue_params, grid_1d, operand_or
from ..plan import Kernel, Plan
from ..registry import register

_SOURCE = "generic/im2col_gemm.cu"
_A_BYTES = 1 << 30  # at most 1 GiB of fp32 im2col matrix per chunk
_BLOCK = 256

#: What CI compiles (tests/test_compile.py): every dtype, both portable targets.
COMPILE_VARIANTS = [(_SOURCE, {"CUCONV_DTYPE": d}, arch) for d in (0, 1, 2) for arch in ("sm_80", "sm_90a")]


class GenericGPUKernel(Kernel):
    name = "generic_gpu"
    backend = "cuda"
    priority = 0

    def make_plan(self, problem, device, overrides):
        return GenericGPUPlan(self, problem, device,
                              "explicit im2col + cuBLAS accepts every valid problem (fallback path)")


class GenericGPUPlan(Plan):
    def describe(self):
        return f"im2col_f32 + cupy.matmul (batched over {self.problem.groups} group(s)) + epilogue"

    def compile_jobs(self):
        return ((_SOURCE, {"CUCONV_DTYPE": dtype_code(self.problem.dtype)}),)

    def run(self, x, w, bias, residual, out):
        import cupy as cp

        problem = self.problem
        defines = {"CUCONV_DTYPE": dtype_code(problem.dtype)}
        im2col = load_cuda_function(_SOURCE, self.device, defines, "im2col_f32")
        epi = load_cuda_function(_SOURCE, self.device, defines, "epilogue")
        geom = conv_geometry(problem)
        ep = epilogue_params(problem.epilogue)
        G, Kg, Kgemm, M = problem.groups, problem.gemm_n, problem.gemm_k, problem.gemm_m
        b = w.reshape(G, Kg, Kgemm).astype(cp.float32).transpose(0, 2, 1)  # [G, Kgemm, Kg]
        chunk = max(1, min(M, _A_BYTES // max(1, 4 * G * Kgemm)))
        bias_arg, res_arg = operand_or(bias, out), operand_or(residual, out)
        for m_begin in range(0, M, chunk):  # a few coarse chunks, not per-tile work
            mc = min(chunk, M - m_begin)
            a = cp.empty((G, mc, Kgemm), dtype=cp.float32)
            im2col(grid_1d(a.size, _BLOCK), (_BLOCK,), (x, a, geom, cp.int64(m_begin), cp.int64(mc)))
            acc = cp.matmul(a, b)  # [G, mc, Kg] fp32
            del a
            epi(grid_1d(mc * G * Kg, _BLOCK), (_BLOCK,),
                (acc, bias_arg, res_arg, out, geom, cp.int64(m_begin), cp.int64(mc), ep))


register(GenericGPUKernel())
