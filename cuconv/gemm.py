"""cuBLAS matrix products at an explicit precision (CuPy arrays): the generic GPU path and ``matmul``.

``cupy.matmul`` on float32 runs TF32 tensor cores when the ``CUPY_TF32`` environment variable is set,
so a caller of it cannot promise float32 accuracy. :func:`gemm` calls ``cublasGemmStridedBatchedEx``
itself with the compute type of the precision asked:

============  =========================  ======================================================
precision     operands                   cuBLAS compute type
============  =========================  ======================================================
"float32"     float32                    ``CUBLAS_COMPUTE_32F`` (with the handle's TF32 math mode
                                         off for the call: no tensor-core rounding of operands)
"tf32"        float32                    ``CUBLAS_COMPUTE_32F_FAST_TF32``
"float64"     float64                    ``CUBLAS_COMPUTE_64F`` (DGEMM)
"exact32"     float32 holding 16-bit     ``CUBLAS_COMPUTE_32F_FAST_TF32``: float16 and bfloat16
              values                     values have at most 11 significant bits, so TF32
                                         (11 bits) holds them exactly and each product is exact
============  =========================  ======================================================

Row-major operands map onto column-major cuBLAS as transposes: ``c = a @ b`` is computed as
``cᵀ = bᵀ aᵀ``. cuBLAS is imported on the first call, not with cuconv.
"""

from __future__ import annotations

import numpy as np

__all__ = ["gemm", "GEMM_PRECISIONS"]

#: The precisions :func:`gemm` takes, with the operand dtype each needs.
GEMM_PRECISIONS = {"float32": np.float32, "tf32": np.float32, "exact32": np.float32, "float64": np.float64}

_INT_MAX = 2**31 - 1
# cublasMath_t values (cublas_api.h); CuPy's binding names only some of them.
_DEFAULT_MATH = 0
_TF32_TENSOR_OP_MATH = 3
_M_CHUNK = 1 << 30  # rows per call: cuBLAS counts m, n, k in 32-bit ints


def _compute_type(cublas, precision: str) -> int:
    if precision == "float64":
        return cublas.CUBLAS_COMPUTE_64F
    if precision == "float32":
        return cublas.CUBLAS_COMPUTE_32F
    return cublas.CUBLAS_COMPUTE_32F_FAST_TF32


def gemm(a, b, out, precision: str, b_is_nk: bool = False) -> None:
    """``out[g] = a[g] @ b[g]`` for every ``g`` (``b[g].T`` when ``b_is_nk``), computed at ``precision``.

    ``a`` is ``[G, M, K]``, ``b`` is ``[G, K, N]`` (``[G, N, K]`` when ``b_is_nk``), ``out`` is
    ``[G, M, N]``; 2-D arrays are one batch. All three are C-contiguous CuPy arrays of the precision's
    dtype (:data:`GEMM_PRECISIONS`) on the current device; the product runs on the current stream.
    ``N`` and ``K`` must be below 2**31 (cuBLAS's leading dimensions are 32-bit); ``M`` is split into
    calls of at most 2**30 rows."""
    import cupy as cp
    from cupy.cuda import device, runtime
    from cupy_backends.cuda.libs import cublas

    dtype = np.dtype(GEMM_PRECISIONS[precision])
    a3, b3, o3 = (v.reshape((1, *v.shape)) if v.ndim == 2 else v for v in (a, b, out))
    for name, v in (("a", a3), ("b", b3), ("out", o3)):
        if v.dtype != dtype or not v.flags.c_contiguous:
            raise ValueError(f"{name}: expected a C-contiguous {dtype} array for precision {precision!r}, "
                             f"got {v.dtype} with strides {v.strides}")
    G, M, K = a3.shape
    N = b3.shape[1] if b_is_nk else b3.shape[2]
    if b3.shape != ((G, N, K) if b_is_nk else (G, K, N)) or o3.shape != (G, M, N):
        raise ValueError(f"a, b, out: shapes {a3.shape}, {b3.shape}, {o3.shape} do not form a batched product")
    if max(N, K) > _INT_MAX:
        raise ValueError(f"a, b: N = {N} and K = {K} must be below 2**31 (cuBLAS's 32-bit leading dimensions)")
    if G == 0 or M == 0 or N == 0:
        return
    if K == 0:
        o3.fill(0)
        return
    data_type = runtime.CUDA_R_64F if dtype == np.float64 else runtime.CUDA_R_32F
    compute = _compute_type(cublas, precision)
    one, zero = np.ones((), dtype), np.zeros((), dtype)  # host scalars (the handle's pointer mode is host)
    # column-major view: cᵀ (N x M, ld N) = op(b) (N x K) @ aᵀ (K x M, ld K)
    op_b, ld_b = (cublas.CUBLAS_OP_T, K) if b_is_nk else (cublas.CUBLAS_OP_N, N)
    handle = device.get_cublas_handle()
    cublas.setStream(handle, cp.cuda.get_current_stream().ptr)
    mode = restore = None
    if precision == "float32":
        mode = cublas.getMathMode(handle)
        if mode & 0xF == _TF32_TENSOR_OP_MATH:  # someone allowed TF32 on this handle
            restore = mode
            cublas.setMathMode(handle, (mode & ~0xF) | _DEFAULT_MATH)
    try:
        size = dtype.itemsize
        for m0 in range(0, M, _M_CHUNK):
            mc = min(_M_CHUNK, M - m0)
            cublas.gemmStridedBatchedEx(
                handle, op_b, cublas.CUBLAS_OP_N, N, mc, K,
                one.ctypes.data,
                b3.data.ptr, data_type, ld_b, N * K,
                a3.data.ptr + m0 * K * size, data_type, K, M * K,
                zero.ctypes.data,
                o3.data.ptr + m0 * N * size, data_type, N, M * N,
                G, compute, cublas.CUBLAS_GEMM_DEFAULT)
    finally:
        if restore is not None:
            cublas.setMathMode(handle, restore)
