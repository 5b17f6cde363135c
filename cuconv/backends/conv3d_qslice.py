"""conv3d Q-slice strategy: a 3-D convolution as T fast 2-D convolutions with an fp32 accumulator.

For stride 1, dilation 1, groups 1 and no temporal padding (causal video VAEs pre-pad time)::

    out[n, z] = sum_t conv2d(x[n, z + t], w[:, t])          t = 0 .. T-1, z = 0 .. Z-1

Each term is one launch of the Hopper kernel's plan (``sm90_tma``) for the slice problem over the ``Z`` depth planes of image ``n`` as its batch, written to one reusable 16-bit
temporary; ``qslice_accumulate`` adds it into a zero-initialised fp32 accumulator, and
``qslice_cast`` applies the user's epilogue and rounds once. Chaining the slices through the 16-bit
output instead (residual with beta = 1) would round the running sum T times.

When K is a multiple of 64 but not of 128 the filter's K axis is zero-padded to the next multiple
of 128 once per call, so the 2-D kernel runs its full-width N tile; ``qslice_cast`` drops the
padded columns.

Extra device memory: the temporary (``Z*P*Q*K_pad`` 16-bit), the accumulator (``N*Z*P*Q*K_pad``
fp32) and the re-laid-out filter (``T*K_pad*R*S*C`` 16-bit); :func:`extra_bytes` counts it.
"""

from __future__ import annotations

from ..compiler import load_cuda_function
from ..launch import dtype_code, epilogue_params, grid_1d, operand_or
from ..plan import Declined, Kernel, Plan
from ..problem import ConvProblem, Epilogue
from ..registry import register
from .sm90 import Sm90TmaKernel

_SOURCE = "conv3d/qslice_accumulate.cu"
_BLOCK = 256

COMPILE_VARIANTS = [(_SOURCE, {"CUCONV_DTYPE": d}, arch) for d in (0, 1) for arch in ("sm_80", "sm_90a")]


def padded_k(k: int) -> int:
    """K rounded up to the 2-D kernel's full N tile (128) when it is a multiple of 64 only."""
    return k if k % 128 == 0 else -(-k // 128) * 128


def slice_problem(p: ConvProblem) -> ConvProblem:
    """The 2-D problem one slice launch solves: the Z output planes of one image as the batch."""
    return ConvProblem.create(nd=2, batch=p.out_spatial[0], in_spatial=p.in_spatial[1:], channels=p.channels,
                              out_channels=padded_k(p.out_channels), filter_spatial=p.filter_spatial[1:],
                              stride=1, dilation=1, padding=tuple(zip(p.pad_lo[1:], p.pad_hi[1:])), groups=1,
                              dtype=p.dtype, layout="NHWC", epilogue=Epilogue())


def extra_bytes(p: ConvProblem) -> int:
    """Peak extra device memory of the strategy (temporary + accumulator + padded filter)."""
    kp = padded_k(p.out_channels)
    plane = p.out_spatial[0] * p.out_spatial[1] * p.out_spatial[2] * kp
    return plane * p.itemsize + p.batch * plane * 4 + p.filter_spatial[0] * kp * p.gemm_k // p.filter_spatial[0] * p.itemsize


class QSliceConv3d(Kernel):
    name = "conv3d_qslice"
    backend = "cuda"
    priority = 90
    spatial_dims = (3,)
    strategy = "qslice"

    #: The 2-D kernel that runs each slice.
    slice_kernel = Sm90TmaKernel()

    def make_plan(self, problem, device, overrides):
        p = problem
        if p.dtype not in ("float16", "bfloat16"):
            return Declined(f"needs float16/bfloat16, got {p.dtype}")
        if p.groups != 1:
            return Declined(f"needs groups == 1, got {p.groups}")
        if any(s != 1 for s in p.stride) or any(d != 1 for d in p.dilation):
            return Declined(f"needs stride 1 and dilation 1, got stride {p.stride} dilation {p.dilation}")
        if p.filter_spatial[0] < 2:
            return Declined("needs a filter depth T > 1 (T == 1 is a plain 2-D convolution)")
        if p.pad_lo[0] or p.pad_hi[0]:
            return Declined(f"needs no temporal padding (pre-pad time as causal video VAEs do), got "
                            f"{p.pad_lo[0]}/{p.pad_hi[0]}")
        if p.channels % 64 or p.out_channels % 64:
            return Declined(f"needs C and K multiples of 64, got C={p.channels} K={p.out_channels}")
        inner = self.slice_kernel.plan(slice_problem(p), device, overrides)
        if not inner:
            return Declined(f"{self.slice_kernel.name} declines the slice problem: {inner.reason}")
        pad = (f" (K padded {p.out_channels} -> {padded_k(p.out_channels)})"
               if padded_k(p.out_channels) != p.out_channels else "")
        return QSlicePlan(self, problem, device, inner,
                          f"{p.filter_spatial[0]} x {inner.kernel.name} slices per image + fp32 accumulator{pad}")


class QSlicePlan(Plan):
    """T x N launches of the slice problem's plan, an fp32 accumulator and one epilogue pass."""

    def __init__(self, kernel, problem, device, inner: Plan, reason: str):
        super().__init__(kernel, problem, device, reason)
        self.inner = inner

    def describe(self):
        p = self.problem
        return (f"{p.batch} x {p.filter_spatial[0]} launches of [{self.inner.describe()}], "
                f"extra memory {extra_bytes(p) / 2**20:.1f} MiB")

    def compile_jobs(self):
        return self.inner.compile_jobs() + ((_SOURCE, {"CUCONV_DTYPE": dtype_code(self.problem.dtype)}),)

    def run(self, x, w, bias, residual, out):
        import cupy as cp

        p = self.problem
        sp = self.inner.problem
        defines = {"CUCONV_DTYPE": dtype_code(p.dtype)}
        accumulate = load_cuda_function(_SOURCE, self.device, defines, "qslice_accumulate")
        cast = load_cuda_function(_SOURCE, self.device, defines, "qslice_cast")
        T, Z = p.filter_spatial[0], p.out_spatial[0]
        K, kp = p.out_channels, sp.out_channels
        # (K, T, R, S, C) -> (T, K_pad, R, S, C): each depth slice a contiguous 2-D filter.
        w_slices = cp.zeros((T, kp, *p.filter_spatial[1:], p.channels), dtype=w.dtype)
        w_slices[:, :K] = cp.moveaxis(w, 1, 0)
        acc = cp.zeros((p.batch, Z, *p.out_spatial[1:], kp), dtype=cp.float32)
        tmp = cp.empty(sp.out_shape, dtype=x.dtype)
        plane = tmp.size
        for n in range(p.batch):            # N * T coarse launches, not per-tile work
            for t in range(T):
                self.inner.run(x[n, t:t + Z], w_slices[t], None, None, tmp)
                accumulate(grid_1d(-(-plane // 8), _BLOCK), (_BLOCK,), (tmp, acc[n], cp.int64(plane)))
        rows = p.gemm_m
        cast(grid_1d(rows * K, _BLOCK), (_BLOCK,),
             (acc, operand_or(bias, out), operand_or(residual, out), out, cp.int64(rows), cp.int32(K), cp.int32(kp),
              epilogue_params(p.epilogue)))


register(QSliceConv3d())
