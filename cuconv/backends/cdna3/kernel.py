"""ROCm kernel: AMD CDNA3 (gfx942) / CDNA2 (gfx90a) implicit GEMM, kernels_hip/cdna3/.

Data flow of one call (one launch, no Python loop over tiles)::

    x (N, H, W, C) NHWC, bf16/fp16   --buffer_load_dword ... lds (im2col loader)-->  LDS A half-tiles
    w (K, R, S, Cg) -> [G*Kg, Kpad]   --zero-pad K to 2*BK (host), linear loader--->  LDS B half-tiles
    4-wave MFMA mainloop (v_mfma_f32_32x32x8 bf16/f16 -> fp32), double-buffered LDS
    epilogue: out = act(alpha * acc + bias + beta * residual)  -> NHWC out

Compiled at run time by CuPy-ROCm through hiprtc (``cupy.RawModule(code=..., backend="nvrtc")``, which
CuPy routes to hiprtc on a HIP build);
the CI compiles the same sources with clang-19 for gfx942 and checks the ISA
(tests/test_hip_compile.py), and checks the loaders' index math against cuconv/models/loader.py on
the CPU (tests/test_hip_index_math.py). Not yet run on AMD hardware: see docs/rocm.md.

Everything CuPy-related happens inside ``run``; importing this module on a CPU-only or CUDA machine
is free.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Dict, Tuple

import numpy as np

from ..dispatch import Kernel, register
from ..launch import c_struct, dtype_code, epilogue_params
from ..models.loader import subpath_ok

__all__ = ["Cdna3IGemmKernel", "Variant", "choose_variant", "kernel_name", "fast_divmod_params", "hip_geometry",
           "padded_k", "all_variants", "SOURCE", "BLOCK_M", "BLOCK_N", "BLOCK_K", "SCHED_K", "THREADS",
           "MAX_RESOURCE_BYTES", "SUPPORTED_ARCHS"]

#: Entry file, relative to kernels_hip/.
SOURCE = "cdna3/conv2d_fprop_cdna3.hip"

# Tile shape: kernels_hip/common/index_math.h (kBlockM...). tests/test_hip_index_math.py checks they agree.
BLOCK_M, BLOCK_N, BLOCK_K = 128, 128, 32
THREADS = 256                      # 4 waves of 64
SCHED_K = 2 * BLOCK_K              # the 4-wave schedule consumes K in pairs of half-tiles
#: num_records of a buffer resource is a 32-bit byte count.
MAX_RESOURCE_BYTES = (1 << 32) - 1
SUPPORTED_ARCHS = ("gfx942", "gfx90a")
SUBPATH_CODES = {"pointwise": 0, "uniform": 1, "per_lane": 2}

_NO_FALLBACK = "no HIP fallback kernel exists yet (generic_gpu is CUDA-only)"


# ----------------------------------------------------------------------------- variant selection
@dataclass(frozen=True)
class Variant:
    """The compile-time choices of one kernel build (the ``-D`` defines)."""

    dtype: str         # "bfloat16" | "float16"
    subpath: str       # "pointwise" | "uniform" | "per_lane"
    halo: bool         # padding present: out-of-bounds lanes go to the num_records sentinel
    mask_k: bool       # Kgemm < Kpad: columns past Kgemm go to the sentinel too

    @property
    def name(self) -> str:
        return kernel_name(self)

    @property
    def defines(self) -> Dict[str, int]:
        return {"CUCONV_DTYPE": dtype_code(self.dtype), "CUCONV_SUBPATH": SUBPATH_CODES[self.subpath],
                "CUCONV_HALO": int(self.halo), "CUCONV_MASK_K": int(self.mask_k)}


def kernel_name(v: Variant) -> str:
    """``conv2d_fprop_cdna3_<bf16|f16>_128x128x32_<subpath>[_halo][_maskk]``, as the entry file spells it."""
    dt = {"bfloat16": "bf16", "float16": "f16"}[v.dtype]
    return (f"conv2d_fprop_cdna3_{dt}_{BLOCK_M}x{BLOCK_N}x{BLOCK_K}_{v.subpath}"
            f"{'_halo' if v.halo else ''}{'_maskk' if v.mask_k else ''}")


def padded_k(problem) -> int:
    """Kgemm rounded up to the schedule's multiple (2 * BLOCK_K); the host zero-pads the filter to it."""
    return -(-problem.gemm_k // SCHED_K) * SCHED_K


def choose_variant(problem) -> Variant:
    """Pointwise when the im2col matrix is the input, uniform when a K tile sits in one filter tap, else per-lane."""
    if problem.is_pointwise and subpath_ok(problem, "pointwise", BLOCK_K):
        sub = "pointwise"
    elif subpath_ok(problem, "uniform", BLOCK_K):
        sub = "uniform"
    else:
        sub = "per_lane"
    halo = any(problem.pad_lo) or any(problem.pad_hi)
    return Variant(dtype=problem.dtype, subpath=sub, halo=bool(halo), mask_k=padded_k(problem) != problem.gemm_k)


def all_variants(dtype: str = "bfloat16"):
    """Every valid variant of ``dtype`` (pointwise has no halo)."""
    out = []
    for sub in SUBPATH_CODES:
        for halo in ((False,) if sub == "pointwise" else (False, True)):
            for mask_k in (False, True):
                out.append(Variant(dtype, sub, halo, mask_k))
    return out


# ------------------------------------------------------------------------------- kernel parameters
def fast_divmod_params(divisor: int) -> Tuple[int, int, int]:
    """``(divisor, multiplier, shift)`` of kernels_hip/common/index_math.h: FastDivmod.

    ``n // d == (((n * multiplier) >> 32) + n) >> shift`` for every 32-bit ``n`` (Granlund-Montgomery
    with a 33-bit magic number whose top bit is the ``+ n``).
    """
    d = int(divisor)
    if not 1 <= d < (1 << 31):
        raise ValueError(f"divisor: expected 1 <= d < 2**31, got {d}")
    shift = (d - 1).bit_length()                       # ceil(log2(d))
    multiplier = ((1 << 32) * ((1 << shift) - d)) // d + 1
    assert 0 < multiplier < (1 << 32)
    return d, multiplier, shift


_I32 = [(n, np.int32) for n in ("N", "H", "W", "C", "P", "Q", "R", "S", "Cg", "G", "Kg", "K", "stride_h", "stride_w",
                                "dil_h", "dil_w", "pad_h", "pad_w", "M", "Kgemm", "Kpad")]
_DIVS = ("div_Q", "div_P", "div_Cg", "div_S")
#: Field list of ``ConvGeometryHip`` (a FastDivmod member is three consecutive uint32: same layout).
GEOMETRY_FIELDS = _I32 + [("x_bytes", np.uint32), ("w_bytes", np.uint32)] + \
    [(f"{d}_{part}", np.uint32) for d in _DIVS for part in ("divisor", "multiplier", "shift")]


def hip_geometry(problem) -> np.void:
    """The ``ConvGeometryHip`` kernel parameter for a 2-D problem (x and padded weights contiguous)."""
    H, W = problem.in_spatial
    P, Q = problem.out_spatial
    R, S = problem.filter_spatial
    kpad = padded_k(problem)
    vals = dict(N=problem.batch, H=H, W=W, C=problem.channels, P=P, Q=Q, R=R, S=S, Cg=problem.channels_per_group,
                G=problem.groups, Kg=problem.out_channels_per_group, K=problem.out_channels,
                stride_h=problem.stride[0], stride_w=problem.stride[1], dil_h=problem.dilation[0],
                dil_w=problem.dilation[1], pad_h=problem.pad_lo[0], pad_w=problem.pad_lo[1], M=problem.gemm_m,
                Kgemm=problem.gemm_k, Kpad=kpad, x_bytes=_x_bytes(problem), w_bytes=_w_bytes(problem))
    for name, d in zip(_DIVS, (Q, P, problem.channels_per_group, S)):
        for part, v in zip(("divisor", "multiplier", "shift"), fast_divmod_params(d)):
            vals[f"{name}_{part}"] = v
    return c_struct(GEOMETRY_FIELDS, vals)


def _x_bytes(problem) -> int:
    return problem.batch * math.prod(problem.in_spatial) * problem.channels * problem.itemsize


def _w_bytes(problem) -> int:
    return problem.out_channels * padded_k(problem) * problem.itemsize


# ----------------------------------------------------------------------------------- compilation
def _base_arch(arch: str) -> str:
    return arch.split(":")[0]  # "gfx942:sramecc+:xnack-" -> "gfx942"


def hip_compile_options(arch: str, defines: Dict[str, int]) -> Tuple[str, ...]:
    """hiprtc options: include path of kernels_hip/, target, the variant's defines."""
    from ..compiler import kernels_dir
    opts = [f"-I{kernels_dir('hip')}", "-std=c++17", "-O3", f"--offload-arch={_base_arch(arch)}"]
    opts += [f"-D{k}={v}" for k, v in sorted(defines.items())]
    return tuple(opts)


def _hip_source_text() -> str:
    """The entry file, prefixed with the hash of the whole kernels_hip/ tree.

    CuPy keys its kernel cache on the code string and options only, not on the headers it
    #includes; the hash line makes any header edit a new cache entry.
    """
    from ..compiler import _tree_hash, kernels_dir
    text = (kernels_dir("hip") / SOURCE).read_text()
    return f"// cuconv kernels_hip tree {_tree_hash('hip')}\n{text}"


@functools.lru_cache(maxsize=64)
def _hip_function(variant: Variant, arch: str, device_id: int):
    """Compile (CuPy caches the code object on disk) and look up one variant on one device."""
    import cupy as cp
    # backend="nvrtc" *is* hiprtc on a ROCm build: CuPy maps "nvrtc" -> "hiprtc" and anything else
    # -> "hipcc" (cupy/cuda/compiler.py: _compile_module_with_cache), so spelling "hiprtc" here
    # would silently pick hipcc.
    with cp.cuda.Device(device_id):
        mod = cp.RawModule(code=_hip_source_text(), backend="nvrtc",
                           options=hip_compile_options(arch, variant.defines))
        return mod.get_function(kernel_name(variant))


# ------------------------------------------------------------------------------------------ kernel
class Cdna3IGemmKernel(Kernel):
    name = "cdna3_igemm"
    backend = "hip"
    priority = 50
    spatial_dims = (2,)

    def check(self, problem, device):
        arch = _base_arch(device.arch)
        if arch not in SUPPORTED_ARCHS:
            return False, (f"needs gfx942 (CDNA3) or gfx90a (CDNA2) for MFMA bf16/fp16 and buffer_load ... lds, "
                           f"device is {device.arch}; {_NO_FALLBACK}")
        if problem.dtype == "float32":
            return False, f"float32: this kernel has bf16/fp16 MFMA paths only; {_NO_FALLBACK}"
        if problem.channels_per_group % 2:
            return False, (f"C // groups = {problem.channels_per_group} is odd: each lane moves one dword = 2 "
                           f"channels; {_NO_FALLBACK}")
        xb, wb = _x_bytes(problem), _w_bytes(problem)
        if xb > MAX_RESOURCE_BYTES:
            return False, (f"input tensor is {xb} bytes, above the 4 GiB cap of one buffer resource "
                           f"(num_records is a 32-bit byte count); {_NO_FALLBACK}")
        if wb > MAX_RESOURCE_BYTES:
            return False, (f"K-padded weights are {wb} bytes, above the 4 GiB cap of one buffer resource; "
                           f"{_NO_FALLBACK}")
        if problem.gemm_m >= (1 << 31) or problem.out_channels >= (1 << 31):
            return False, f"GEMM M = {problem.gemm_m} needs 64-bit row indices; {_NO_FALLBACK}"
        v = choose_variant(problem)
        return True, (f"{arch} MFMA implicit GEMM, {v.subpath} im2col loader"
                      f"{', halo to the num_records sentinel' if v.halo else ''}"
                      f" (compile- and index-math-verified; not yet run on AMD hardware)")

    def describe(self, problem, device):
        v = choose_variant(problem)
        grid = (-(-problem.gemm_m // BLOCK_M), -(-problem.gemm_n // BLOCK_N), problem.groups)
        return f"{kernel_name(v)} grid {grid} x {THREADS} threads, K {problem.gemm_k} padded to {padded_k(problem)}"

    def run(self, problem, x, w, bias, residual, out):
        import cupy as cp

        from ..device import device_of
        dev = device_of(x)
        v = choose_variant(problem)
        fn = _hip_function(v, _base_arch(dev.arch), dev.index)
        G, Kg, Kgemm, kpad = problem.groups, problem.gemm_n, problem.gemm_k, padded_k(problem)
        w2 = w.reshape(G * Kg, Kgemm)
        if kpad != Kgemm:  # K padding: zero columns up to the schedule's multiple (2 * BLOCK_K)
            wp = cp.zeros((G * Kg, kpad), dtype=w.dtype)
            wp[:, :Kgemm] = w2
        else:
            wp = cp.ascontiguousarray(w2)
        x = cp.ascontiguousarray(x)
        geom = hip_geometry(problem)
        ep = epilogue_params(problem.epilogue)
        bias_arg = bias if bias is not None else out  # never read when absent
        res_arg = residual if residual is not None else out
        grid = (-(-problem.gemm_m // BLOCK_M), -(-Kg // BLOCK_N), G)
        fn(grid, (THREADS,), (x, wp, bias_arg, res_arg, out, geom, ep))


register(Cdna3IGemmKernel())
