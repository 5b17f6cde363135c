"""float32 conv2d at precision ``"tf32"`` on sm_80+: ``sm80_tf32``.

The portable kernel's loaders move bytes (cp.async copies of channel runs into the shared-memory
ring) and ldmatrix hands each thread 32-bit registers holding two adjacent 16-bit elements of the
reduction. A float32 array of C channels is, byte for byte, a 16-bit array of 2C channels, and the
fragments ldmatrix gives for 16 16-bit elements of the reduction are, register for register, the
fragments of ``mma.sync.m16n8k8.tf32`` for the 8 floats they hold (kernels_cu/sm80/ptx_sm80.cuh).
So a float32 convolution at precision "tf32" is the bf16 implicit GEMM of the 16-bit view of its
operands, built with ``CUCONV_TF32`` (the tf32 mma and a float32 epilogue)::

    x (N, H, W, C) float32  --view-->  (N, H, W, 2C) 16-bit   (no copy)
    w (K, R, S, C) float32  --view-->  (K, R, S, 2C) 16-bit   (no copy)
    sm80 implicit GEMM (pointwise / uniform / per-lane loader; tf32 products, fp32 accumulation)
      --float32 epilogue: act(alpha * acc + bias + beta * residual)-->  out (N, P, Q, K) float32

Each product uses the operands' top 19 bits (one TF32 product per term, about 1e-3 relative error,
cuDNN's default for float32 under torch). Any C and groups run: the view has an even channel count per
group, and a copy moves at least one whole float. The grouped_mma and pad_channels paths of
``sm80_igemm`` have no tf32 form; their problems take the per-lane loader here. On Hopper the
``sm90_tf32`` and ``sm90_bf16x3`` kernels come first (higher priority); this kernel serves what they
decline (grouped layers) and every sm_80+ GPU without them.
"""

from __future__ import annotations

from ...plan import Declined, Kernel, Plan
from ...problem import sixteen_bit_problem
from ...registry import register
from .kernel import igemm_launch, index_range_declined
from .params import epilogue_operands
from .subpaths import choose_subpath, sm80_subpath_ok
from .variants import CONV_SOURCE, conv_variant

__all__ = ["Sm80Tf32Kernel", "Sm80Tf32Plan"]

#: The loader sub-paths with a tf32 form (the implicit GEMM's three).
_TF32_SUBPATHS = ("pointwise", "uniform", "per_lane")


class Sm80Tf32Kernel(Kernel):
    """conv2d of float32 data at precision "tf32" on sm_80+: the 16-bit view, tf32 mma.sync, float32 epilogue."""

    name = "sm80_tf32"
    backend = "cuda"
    priority = 50  # below every Hopper kernel (sm90_tf32 110, sm90_bf16x3 100), above generic_gpu
    spatial_dims = (2,)
    precisions = frozenset({("float32", "tf32")})

    def make_plan(self, problem, device, overrides):
        if device.cc < (8, 0):
            return Declined(f"needs sm_80+ (tf32 mma.sync), the GPU is sm_{device.cc[0]}{device.cc[1]}")
        view = sixteen_bit_problem(problem, 2 * problem.channels)
        declined = index_range_declined(view, "the 16-bit view's ")
        if declined is not None:
            return declined
        forced = overrides.sm80_subpath
        if forced is not None and forced not in _TF32_SUBPATHS:
            return Declined(f"forced sub-path {forced!r} has no tf32 form (only {', '.join(_TF32_SUBPATHS)})")
        subpath, why = choose_subpath(view, forced)
        if subpath is None:
            return Declined(why)
        if subpath not in _TF32_SUBPATHS:  # grouped_mma / pad_channels: the per-lane loader takes any problem
            subpath, why = "per_lane", f"per_lane (the {subpath} path has no tf32 form)"
        assert sm80_subpath_ok(view, subpath)
        return Sm80Tf32Plan(self, problem, device, view, subpath,
                            f"float32 operands as 16-bit pairs into the sm80 implicit GEMM ({why} loader), one tf32 "
                            f"mma.sync product per term (operands' 13 low mantissa bits dropped), fp32 accumulation "
                            f"and epilogue")


class Sm80Tf32Plan(Plan):
    """The sm80 implicit GEMM on the 16-bit views of x and w (no copies), tf32 products, float32 output."""

    def __init__(self, kernel, problem, device, view, subpath: str, reason: str):
        super().__init__(kernel, problem, device, reason)
        self.view = view          # the bfloat16 problem of 2C channels the loaders see
        self.subpath = subpath
        self._launches = {}       # operand alignments -> packed launch

    def describe(self) -> str:
        name, cfg, d = conv_variant(self.view, self.subpath, tf32=True)
        return (f"{name}: tf32 on the 16-bit view of float32 x and w ({self.view.channels} 16-bit channels), "
                f"{self.subpath} loader, tile {cfg.bm}x{cfg.bn}x{cfg.bk} (16-bit k), {cfg.stages}-stage cp.async ring, "
                f"{cfg.warps_m}x{cfg.warps_n} warps, copies of {d['CUCONV_VEC_A']} (A) / {d['CUCONV_VEC_B']} (B) "
                f"16-bit elements (when the pointers are aligned), float32 epilogue")

    def compile_jobs(self):
        return ((CONV_SOURCE, conv_variant(self.view, self.subpath, 0, 0, tf32=True)[2]),)

    def run(self, x, w, bias, residual, out):
        import cupy as cp
        xv, wv = x.view(cp.uint16), w.view(cp.uint16)
        bias_arg, res_arg, _ = epilogue_operands(out, bias, residual, self.problem.epilogue)
        ptrs = (xv.data.ptr, wv.data.ptr, bias_arg.data.ptr, res_arg.data.ptr, out.data.ptr)
        key = tuple(q & 15 for q in ptrs) + (bias is None, res_arg is out)
        launch = self._launches.get(key)
        if launch is None:  # copy and store widths depend on the alignments
            launch = self._launches[key] = igemm_launch(self.view, self.subpath, xv, wv, bias, residual, out,
                                                        self.device, tf32=True)
        launch(*ptrs)


register(Sm80Tf32Kernel())
