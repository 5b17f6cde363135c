"""Generic GPU kernel: explicit im2col (our kernel) + batched cuBLAS GEMM (:mod:`cuconv.gemm`) + epilogue.

Serves every valid problem on CUDA, every dtype at every precision (it is CUDA only: there is no HIP
build of it). It is the visible fallback of the fast kernels, the path of float32 and float64 data,
and the baseline the benchmark compares the fast kernels with.

Data flow for one call (M chunked so the im2col matrix stays under ``_A_BYTES``)::

    x (N, *spatial, C)  --im2col-->          A[G, Mc, Kgemm]  acc dtype
    w (K, *filter, Cg)  --reshape/cast-->    B[G, Kg, Kgemm]  acc dtype
    A @ Bᵀ (cuBLAS, at the GEMM precision) -> acc[G, Mc, Kg]
    acc --epilogue--> out[m, g*Kg + k] = act(alpha*acc + bias + beta*residual)

The accumulator dtype is float64 at precision "float64", else float32. The GEMM precision: float16 and
bfloat16 data multiply on TF32 tensor cores, exactly (their values fit TF32); float32 data at
"float32" run fp32 cuBLAS with TF32 off, at "tf32" TF32 tensor cores; "float64" runs DGEMM.
"""

from __future__ import annotations

import numpy as np

from ..compiler import load_cuda_function
from ..launch import conv_geometry, dtype_code, epilogue_params, epilogue_params64, grid_1d, operand_or
from ..plan import EVERY_PRECISION, Kernel, Plan
from ..registry import register

_SOURCE = "generic/im2col_gemm.cu"
_A_BYTES = 1 << 30  # at most 1 GiB of im2col matrix per chunk
_BLOCK = 256

#: (dtype, precision) -> (accumulator: 0 float, 1 double; the :func:`cuconv.gemm.gemm` precision).
_ROUTES = {
    ("float16", "float16"): (0, "exact32"),
    ("bfloat16", "bfloat16"): (0, "exact32"),
    ("float32", "float32"): (0, "float32"),
    ("float32", "tf32"): (0, "tf32"),
    ("float32", "float64"): (1, "float64"),
    ("float64", "float64"): (1, "float64"),
    ("float64", "float32"): (0, "float32"),
}

_REASONS = {
    "exact32": "16-bit products, exact on TF32 tensor cores, fp32 accumulation",
    "float32": "fp32 cuBLAS with TF32 off",
    "tf32": "cuBLAS on TF32 tensor cores (sm_80+)",
    "float64": "float64 im2col and epilogue, cuBLAS DGEMM",
}

#: What CI compiles (tests/test_compile.py): every (dtype, accumulator) the routes use, both portable targets.
COMPILE_VARIANTS = [(_SOURCE, {"CUCONV_DTYPE": dtype_code(d), "CUCONV_ACC": acc}, arch)
                    for d, acc in sorted({(d, r[0]) for (d, _), r in _ROUTES.items()})
                    for arch in ("sm_80", "sm_90a")]


class GenericGPUKernel(Kernel):
    name = "generic_gpu"
    backend = "cuda"
    priority = 0
    precisions = EVERY_PRECISION
    #: The fallback writes the whole im2col matrix (R*S times x, in fp32): autotune times it only where it
    #: is the automatic choice.
    autotune_candidate = False

    def make_plan(self, problem, device, overrides):
        _, route = _ROUTES[(problem.dtype, problem.precision)]
        return GenericGPUPlan(self, problem, device,
                              f"explicit im2col + cuBLAS accepts every valid problem (fallback path; "
                              f"{_REASONS[route]})")


class GenericGPUPlan(Plan):
    def __init__(self, kernel, problem, device, reason):
        super().__init__(kernel, problem, device, reason)
        self.acc_double, self.gemm_precision = _ROUTES[(problem.dtype, problem.precision)]
        self.defines = {"CUCONV_DTYPE": dtype_code(problem.dtype), "CUCONV_ACC": self.acc_double}

    def describe(self):
        acc = "f64" if self.acc_double else "f32"
        return (f"im2col_{acc} + cuBLAS {self.gemm_precision} GEMM (batched over {self.problem.groups} group(s)) "
                f"+ epilogue")

    def compile_jobs(self):
        return ((_SOURCE, self.defines),)

    def run(self, x, w, bias, residual, out):
        import cupy as cp

        from ..gemm import gemm

        problem = self.problem
        im2col = load_cuda_function(_SOURCE, self.device, self.defines, "im2col")
        epi = load_cuda_function(_SOURCE, self.device, self.defines, "epilogue")
        geom = conv_geometry(problem)
        acc_dtype = cp.float64 if self.acc_double else cp.float32
        ep = epilogue_params64(problem.epilogue) if self.acc_double else epilogue_params(problem.epilogue)
        G, Kg, Kgemm, M = problem.groups, problem.gemm_n, problem.gemm_k, problem.gemm_m
        b = cp.ascontiguousarray(w.reshape(G, Kg, Kgemm), dtype=acc_dtype)  # [G, Kg, Kgemm]
        itemsize = np.dtype(acc_dtype).itemsize
        chunk = max(1, min(M, _A_BYTES // max(1, itemsize * G * Kgemm)))
        bias_arg, res_arg = operand_or(bias, out), operand_or(residual, out)
        for m_begin in range(0, M, chunk):  # a few coarse chunks, not per-tile work
            mc = min(chunk, M - m_begin)
            a = cp.empty((G, mc, Kgemm), dtype=acc_dtype)
            im2col(grid_1d(a.size, _BLOCK), (_BLOCK,), (x, a, geom, cp.int64(m_begin), cp.int64(mc)))
            acc = cp.empty((G, mc, Kg), dtype=acc_dtype)
            gemm(a, b, acc, self.gemm_precision, b_is_nk=True)
            del a
            epi(grid_1d(mc * G * Kg, _BLOCK), (_BLOCK,),
                (acc, bias_arg, res_arg, out, geom, cp.int64(m_begin), cp.int64(mc), ep))


register(GenericGPUKernel())
