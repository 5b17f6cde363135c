"""The CDNA3 kernel's compiled variants: tile constants, the variant choice, names and hiprtc loading.

Source: kernels_hip/cdna3/conv2d_fprop_cdna3.hip (tile shape in kernels_hip/common/index_math.h;
tests/test_cdna3_index_math.py checks that the two sides agree).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Dict, Tuple

from ...compiler import kernels_dir, tree_hash
from ...launch import dtype_code, dtype_tag
from ...models.loader import subpath_ok

__all__ = ["Variant", "choose_variant", "kernel_name", "padded_k", "all_variants", "hip_compile_options",
           "hip_function", "base_arch", "SOURCE", "BLOCK_M", "BLOCK_N", "BLOCK_K", "SCHED_K", "THREADS",
           "SUPPORTED_ARCHS"]

#: Entry file, relative to kernels_hip/.
SOURCE = "cdna3/conv2d_fprop_cdna3.hip"

# Tile shape: kernels_hip/common/index_math.h (kBlockM...). tests/test_cdna3_index_math.py checks they agree.
BLOCK_M, BLOCK_N, BLOCK_K = 128, 128, 32
THREADS = 256                      # 4 waves of 64
SCHED_K = 2 * BLOCK_K              # the 4-wave schedule consumes K in pairs of half-tiles
SUPPORTED_ARCHS = ("gfx942", "gfx90a")
SUBPATH_CODES = {"pointwise": 0, "uniform": 1, "per_lane": 2}


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
    dt = dtype_tag(v.dtype)
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


def base_arch(arch: str) -> str:
    return arch.split(":")[0]  # "gfx942:sramecc+:xnack-" -> "gfx942"


def hip_compile_options(arch: str, defines: Dict[str, int]) -> Tuple[str, ...]:
    """hiprtc options: include path of kernels_hip/, target, the variant's defines."""
    opts = [f"-I{kernels_dir('hip')}", "-std=c++17", "-O3", f"--offload-arch={base_arch(arch)}"]
    opts += [f"-D{k}={v}" for k, v in sorted(defines.items())]
    return tuple(opts)


def _hip_source_text() -> str:
    """The entry file, prefixed with the hash of the whole kernels_hip/ tree.

    CuPy keys its kernel cache on the code string and options only, not on the headers it
    #includes; the hash line makes any header edit a new cache entry.
    """
    text = (kernels_dir("hip") / SOURCE).read_text()
    return f"// cuconv kernels_hip tree {tree_hash('hip')}\n{text}"


@functools.lru_cache(maxsize=64)
def hip_function(variant: Variant, arch: str, device_id: int):
    """Compile (CuPy caches the code object on disk) and look up one variant on one device."""
    import cupy as cp
    # backend="nvrtc" *is* hiprtc on a ROCm build: CuPy maps "nvrtc" -> "hiprtc" and anything else
    # -> "hipcc" (cupy/cuda/compiler.py: _compile_module_with_cache), so spelling "hiprtc" here
    # would silently pick hipcc.
    with cp.cuda.Device(device_id):
        mod = cp.RawModule(code=_hip_source_text(), backend="nvrtc",
                           options=hip_compile_options(arch, variant.defines))
        return mod.get_function(kernel_name(variant))


