"""``cdna3_igemm``: AMD CDNA3 (gfx942) / CDNA2 (gfx90a) implicit GEMM, kernels_hip/cdna3/.

Data flow of one call (one launch, no Python loop over tiles)::

    x (N, H, W, C) NHWC, bf16/fp16   --buffer_load_dword ... lds (im2col loader)-->  LDS A half-tiles
    w (K, R, S, Cg) -> [G*Kg, Kpad]   --zero-pad K to 2*BK (host), linear loader--->  LDS B half-tiles
    4-wave MFMA mainloop (v_mfma_f32_32x32x8 bf16/f16 -> fp32), double-buffered LDS
    epilogue: out = act(alpha * acc + bias + beta * residual)  -> NHWC out

Compiled at run time by CuPy-ROCm through hiprtc (``cupy.RawModule(code=..., backend="nvrtc")``, which
CuPy routes to hiprtc on a HIP build);
the CI compiles the same sources with clang-19 for gfx942 and checks the ISA
(tests/test_cdna3_compile.py), and checks the loaders' index math against cuconv/models/loader.py on
the CPU (tests/test_cdna3_index_math.py). Not yet run on AMD hardware: see docs/rocm.md.

Everything CuPy-related happens inside ``Plan.run``; importing this module on a CPU-only or CUDA machine
is free.
"""

from __future__ import annotations

from ...launch import epilogue_params, operand_or
from ...plan import Declined, Kernel, Plan
from ...registry import register
from .params import MAX_RESOURCE_BYTES, hip_geometry, w_bytes, x_bytes
from .variants import (BLOCK_M, BLOCK_N, SUPPORTED_ARCHS, THREADS, base_arch, choose_variant, hip_function,
                       kernel_name, padded_k)

__all__ = ["Cdna3IGemmKernel", "Cdna3Plan"]

_NO_FALLBACK = "no HIP fallback kernel exists (generic_gpu is CUDA-only)"


class Cdna3IGemmKernel(Kernel):
    """Implicit GEMM on AMD CDNA3 / CDNA2: buffer_load ... lds im2col loader + MFMA."""

    name = "cdna3_igemm"
    backend = "hip"
    priority = 50
    spatial_dims = (2,)

    def make_plan(self, problem, device, overrides):
        arch = base_arch(device.arch)
        if arch not in SUPPORTED_ARCHS:
            return Declined(f"needs gfx942 (CDNA3) or gfx90a (CDNA2) for MFMA bf16/fp16 and buffer_load ... lds, "
                            f"device is {device.arch}; {_NO_FALLBACK}")
        if problem.dtype == "float32":
            return Declined(f"float32: this kernel has bf16/fp16 MFMA paths only; {_NO_FALLBACK}")
        if problem.channels_per_group % 2:
            return Declined(f"C // groups = {problem.channels_per_group} is odd: each lane moves one dword = 2 "
                            f"channels; {_NO_FALLBACK}")
        if x_bytes(problem) > MAX_RESOURCE_BYTES:
            return Declined(f"input tensor is {x_bytes(problem)} bytes, above the 4 GiB cap of one buffer resource "
                            f"(num_records is a 32-bit byte count); {_NO_FALLBACK}")
        if w_bytes(problem) > MAX_RESOURCE_BYTES:
            return Declined(f"K-padded weights are {w_bytes(problem)} bytes, above the 4 GiB cap of one buffer "
                            f"resource; {_NO_FALLBACK}")
        if problem.gemm_m >= (1 << 31) or problem.out_channels >= (1 << 31):
            return Declined(f"GEMM M = {problem.gemm_m} needs 64-bit row indices; {_NO_FALLBACK}")
        v = choose_variant(problem)
        return Cdna3Plan(self, problem, device, v, arch,
                         f"{arch} MFMA implicit GEMM, {v.subpath} im2col loader"
                         f"{', halo to the num_records sentinel' if v.halo else ''}"
                         f" (compile- and index-math-verified; not run on AMD hardware)")


class Cdna3Plan(Plan):
    """A CDNA3 plan: the variant (loader sub-path, halo, K mask) and the grid."""

    def __init__(self, kernel, problem, device, variant, arch: str, reason: str):
        super().__init__(kernel, problem, device, reason)
        self.variant = variant
        self._arch = arch
        self.grid = (-(-problem.gemm_m // BLOCK_M), -(-problem.gemm_n // BLOCK_N), problem.groups)

    def describe(self) -> str:
        p = self.problem
        return (f"{kernel_name(self.variant)} grid {self.grid} x {THREADS} threads, K {p.gemm_k} padded to "
                f"{padded_k(p)}")

    def run(self, x, w, bias, residual, out):
        import cupy as cp

        problem = self.problem
        fn = hip_function(self.variant, self._arch, self.device.index)
        G, Kg, Kgemm, kpad = problem.groups, problem.gemm_n, problem.gemm_k, padded_k(problem)
        w2 = w.reshape(G * Kg, Kgemm)
        if kpad != Kgemm:  # K padding: zero columns up to the schedule's multiple (2 * BLOCK_K)
            wp = cp.zeros((G * Kg, kpad), dtype=w.dtype)
            wp[:, :Kgemm] = w2
        else:
            wp = cp.ascontiguousarray(w2)
        fn(self.grid, (THREADS,), (cp.ascontiguousarray(x), wp, operand_or(bias, out), operand_or(residual, out), out,
                                   hip_geometry(problem), epilogue_params(problem.epilogue)))


register(Cdna3IGemmKernel())
