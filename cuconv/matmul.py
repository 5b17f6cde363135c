"""Public :func:`matmul`: ``act(alpha * a @ b + bias + beta * residual)`` with the conv epilogue.

On the GPU (CuPy, float16 / bfloat16, sm_80+) it runs the sm80 implicit-GEMM mainloop with two linear
loaders (``kernels_cu/sm80/matmul_sm80.cu``): the same cp.async ring, ldmatrix and mma.sync as
``sm80_igemm``. NumPy arrays compute on the CPU (a matmul, then the epilogue, in float32, or float64 at
precision "float64"). CuPy float32 and float64 arrays, GPUs older than sm_80 and K or N above 8,388,607
(the kernel's loaders use 32-bit in-tile offsets) run a cuBLAS GEMM at the call's precision
(:func:`cuconv.gemm.gemm`) and the same epilogue.
"""

from __future__ import annotations


import numpy as np

from .arrays import as_array, check_companion, check_same_place, dtype_name, module_name, ranges_meet, real_scalar
from .epilogue import apply_epilogue
from .problem import Epilogue
from .validate import activation_of, precision_of

__all__ = ["matmul"]


def _companion(arr, name: str, shape, dtype: str, ref):
    arr = as_array(arr, name)
    check_companion(arr, name, shape, dtype, ref, ref_name="a")
    return arr


def _gemm_precision(dtype: str, precision: str) -> str:
    """The :func:`cuconv.gemm.gemm` precision of a GPU product of ``dtype`` data at ``precision``."""
    return "exact32" if dtype in ("float16", "bfloat16") else precision


def matmul(a, b, *, bias=None, residual=None, alpha=1.0, beta=1.0, activation=None, out=None, precision=None):
    """Matrix product with a fused epilogue: ``act(alpha * a @ b + bias + beta * residual)``.

    Parameters
    ----------
    a : array, shape (M, K)
        Left operand: NumPy (computed on the CPU) or CuPy / any ``__cuda_array_interface__`` or
        ``__dlpack__`` GPU array (computed on its GPU). dtype float16, bfloat16, float32 or float64.
    b : array, shape (K, N)
        Right operand; same dtype and device as ``a``.
    bias : array of shape (N,), optional
        Added to every row.
    residual : array of shape (M, N), optional
        Added as ``beta * residual``. May be ``out`` itself (in place).
    alpha, beta : float
        Scales of the product and of the residual.
    activation : None, "relu", "silu" or "gelu"
        Applied last (``"gelu"`` is the exact erf form).
    out : array of shape (M, N), optional
        Written with the result and returned. Nothing else the caller passed is modified.
    precision : None, "float32", "tf32" or "float64"
        As for :func:`cuconv.conv2d`: None is the dtype's own; float16 / bfloat16 take None only;
        float32 takes "float32" (fp32 products, TF32 off), "tf32" (TF32 tensor cores on the GPU; the
        CPU computes fp32, more accurately) or "float64"; float64 takes "float64" or "float32".

    Returns
    -------
    array of shape (M, N)
        Same dtype and array library as ``a``. Accumulation is float32 (float64 at precision
        "float64"); on the GPU float16 / bfloat16 run the sm_80+ mma.sync kernel.

    Raises
    ------
    ValueError, TypeError
        For every invalid argument, naming the argument, what was expected and what was given.

    Examples
    --------
    >>> import numpy as np, cuconv
    >>> a = np.ones((3, 4), np.float32); b = np.ones((4, 2), np.float32)
    >>> cuconv.matmul(a, b, bias=np.array([1, 2], np.float32), activation="relu")
    array([[5., 6.],
           [5., 6.],
           [5., 6.]], dtype=float32)
    """
    a = as_array(a, "a")
    b = as_array(b, "b")
    check_same_place(b, "b", a, "a")
    if a.ndim != 2:
        raise ValueError(f"a: expected a 2-D array (M, K), got {a.ndim}-D with shape {tuple(a.shape)}")
    if b.ndim != 2:
        raise ValueError(f"b: expected a 2-D array (K, N), got {b.ndim}-D with shape {tuple(b.shape)}")
    dtype = dtype_name(a, "a")
    if dtype_name(b, "b") != dtype:
        raise TypeError(f"b: expected dtype {dtype} like a, got {dtype_name(b, 'b')}")
    M, K = a.shape
    if b.shape[0] != K:
        raise ValueError(f"b: expected {K} rows to match a's {K} columns, got shape {tuple(b.shape)}")
    N = b.shape[1]
    if min(M, K, N) < 1:
        raise ValueError(f"a, b: every dimension must be >= 1, got a {tuple(a.shape)} and b {tuple(b.shape)}")
    activation = activation_of(activation)
    precision = precision_of(precision, dtype)
    acc_dtype = np.float64 if precision == "float64" else np.float32
    alpha, beta = real_scalar(alpha, "alpha"), real_scalar(beta, "beta")
    if bias is not None:
        bias = _companion(bias, "bias", (N,), dtype, a)
    out_given = out
    if out is not None:
        out = _companion(out, "out", (M, N), dtype, a)
        if module_name(out) == "numpy" and not out.flags.writeable:
            raise ValueError("out: expected a writeable array, got a read-only one")
    in_place = residual is not None and out is not None and (residual is out_given or residual is out)
    if residual is not None:
        residual = _companion(residual, "residual", (M, N), dtype, a)
    e = Epilogue(alpha=alpha, beta=beta, has_bias=bias is not None, has_residual=residual is not None,
                 activation=activation)

    if module_name(a) == "numpy":
        acc = a.astype(acc_dtype) @ b.astype(acc_dtype)
        res = apply_epilogue(np, acc, e, bias, residual, dtype=acc_dtype).astype(a.dtype)
        if out is None:
            return res
        out[...] = res
        return out_given

    import cupy as cp

    from .device import device_of
    dev = device_of(a)
    with a.device:
        from .backends.sm80.matmul import run_matmul
        from .backends.sm80.params import MAX_LD
        from .gemm import gemm
        if dtype not in ("float16", "bfloat16") or dev.cc < (8, 0) or max(K, N) > MAX_LD:
            acc = cp.empty((M, N), dtype=acc_dtype)
            gemm(cp.ascontiguousarray(a, dtype=acc_dtype), cp.ascontiguousarray(b, dtype=acc_dtype), acc,
                 _gemm_precision(dtype, precision))
            res = apply_epilogue(cp, acc, e, bias, residual, dtype=acc_dtype).astype(a.dtype)
            if out is None:
                return res
            out[...] = res
            return out_given
        a_c, b_c = cp.ascontiguousarray(a), cp.ascontiguousarray(b)
        bias_c = None if bias is None else cp.ascontiguousarray(bias)
        # out sharing memory with a, b or the bias: the kernel writes apart, then the result is copied in
        direct = out is not None and out.flags.c_contiguous and not ranges_meet(out, (a_c, b_c, bias_c))
        target = out if direct else cp.empty((M, N), dtype=a.dtype)
        if residual is None:
            res_c = None
        elif in_place and direct:
            res_c = target  # each element read then written by one thread
        else:
            res_c = cp.ascontiguousarray(residual)
            if direct and cp.may_share_memory(res_c, target) and res_c is not target:
                res_c = res_c.copy()  # partial overlap with out: read a snapshot
        run_matmul(a_c, b_c, bias_c, res_c, target, e)
        if out is None:
            return target
        if not direct:
            out[...] = target
        return out_given
