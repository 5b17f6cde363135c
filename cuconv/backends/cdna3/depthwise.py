"""``cdna3_depthwise``: depthwise convolution (``groups == C``, any channel multiplier), conv2d and conv3d,
NHWC / NDHWC, fp16 / bf16 / fp32, on AMD CDNA3 (gfx942) and CDNA2 (gfx90a); device code
kernels_hip/depthwise/depthwise_fprop.hip.

It is the HIP counterpart of the CUDA ``depthwise_direct`` kernel and shares its host policy: the tile
shape is :func:`cuconv.backends.depthwise.variants.dw_config`, the compiled variant's name and ``-D``
defines are :func:`~cuconv.backends.depthwise.variants.dw_variant`, and the parameter struct is
:func:`cuconv.backends.depthwise.params.dw_geometry` (the HIP ``DwGeometry`` has the same members in the
same order). What differs is what the AMD side can hold:

* LDS: at most 64 KiB per workgroup (and per CU) on gfx90a / gfx942, so ``dw_config`` sizes the tiles
  for that budget (:data:`LDS_LIMIT`, aiming at :data:`LDS_TARGET` so that two workgroups share a CU);
  a filter whose smallest tile does not fit is declined;
* buffer resources: each workgroup addresses one input plane (image, depth slice) through a buffer
  resource whose ``num_records`` is a 32-bit byte count, so a plane over 4 GiB - 1 bytes is declined;
* the grid: a HIP launch counts its grid in work-items with 32 bits, so blocks x threads < 2**32.

Compiled at run time by CuPy-ROCm through hiprtc, like ``cdna3_igemm``; CI compiles every variant with
clang-19 and checks its ISA (tests/test_cdna3_depthwise_compile.py) and checks the index math
(kernels_hip/common/depthwise_index.h) against cuconv/models/depthwise.py on the CPU
(tests/test_cdna3_depthwise_index.py). It has never run on AMD hardware: see docs/rocm.md.
"""

from __future__ import annotations

import functools
from typing import Dict, Tuple

from ...compiler import kernels_dir, tree_hash
from ...launch import epilogue_params
from ...plan import FLOAT32_FFMA, SIXTEEN_BIT, Declined, Kernel, Plan, tf32_note
from ...registry import register
from ..depthwise.params import dw_geometry
from ..depthwise.kernel import aligned_operands
from ..depthwise.variants import DwConfig, depthwise_declined, dw_config, dw_variant, problem_axes
from .params import MAX_RESOURCE_BYTES
from .variants import SUPPORTED_ARCHS, base_arch, hip_compile_options

__all__ = ["Cdna3DepthwiseKernel", "Cdna3DepthwisePlan", "DW_HIP_SOURCE", "LDS_LIMIT", "LDS_TARGET", "hip_dw_config"]

#: Entry file, relative to kernels_hip/.
DW_HIP_SOURCE = "depthwise/depthwise_fprop.hip"
#: LDS one workgroup may use on gfx90a / gfx942 (bytes).
LDS_LIMIT = 64 * 1024
#: LDS a tile aims at: two workgroups per CU share its 64 KiB.
LDS_TARGET = 32 * 1024
#: A HIP grid's size in work-items is a 32-bit count.
MAX_GRID_WORK_ITEMS = 2**32 - 1

_NO_FALLBACK = "no HIP fallback kernel exists (generic_gpu is CUDA-only)"


def plane_bytes(problem) -> int:
    """Bytes of one input plane (one image, one depth slice): what one buffer resource covers."""
    h, w = problem.in_spatial[-2:]
    return h * w * problem.channels * problem.itemsize


def lds_limit(device) -> int:
    """LDS bytes a workgroup may use on ``device``: 64 KiB, or less where the device reports less."""
    reported = device.smem_per_block_optin
    return min(LDS_LIMIT, reported) if reported > 0 else LDS_LIMIT


def hip_dw_config(problem, device):
    """:func:`dw_config` with the LDS budgets of ``device`` (:func:`lds_limit`, :data:`LDS_TARGET`), wide
    filters on the 4-channel shape (the wide-filter shape is measured on the CUDA kernel only)."""
    limit = lds_limit(device)
    return dw_config(problem, smem_limit=limit, smem_target=min(LDS_TARGET, limit), buffers=1, wide_filters=False)


class Cdna3DepthwiseKernel(Kernel):
    """Direct depthwise convolution on CDNA: halo tiles in LDS (buffer loads), fp32 FMAs, fused epilogue."""

    name = "cdna3_depthwise"
    backend = "hip"
    priority = 60  # above cdna3_igemm (50): a depthwise layer is one channel per group, no GEMM to feed
    spatial_dims = (2, 3)
    strategy = "native"
    #: fp32 FMAs for every dtype: float32 at precision "float32", and "tf32" more accurately.
    precisions = SIXTEEN_BIT | FLOAT32_FFMA

    def make_plan(self, problem, device, overrides):
        arch = base_arch(device.arch)
        if arch not in SUPPORTED_ARCHS:
            return Declined(f"needs gfx942 (CDNA3) or gfx90a (CDNA2), device is {device.arch}")
        why_not = depthwise_declined(problem)
        if why_not:
            return Declined(why_not)
        if plane_bytes(problem) > MAX_RESOURCE_BYTES:
            return Declined(f"one input plane is {plane_bytes(problem)} bytes, above the 4 GiB cap of a buffer "
                            f"resource (num_records is a 32-bit byte count); {_NO_FALLBACK}")
        cfg = hip_dw_config(problem, device)  # within the device's LDS, or the reason it cannot be
        if isinstance(cfg, str):
            return Declined(f"{cfg}; {_NO_FALLBACK}")
        blocks = cfg.tiles(problem)
        if blocks * cfg.threads > MAX_GRID_WORK_ITEMS:
            return Declined(f"{blocks} workgroups of {cfg.threads} work-items: over the 2**32 - 1 work-items "
                            f"of a HIP grid; {_NO_FALLBACK}")
        mult = problem.out_channels // problem.channels
        return Cdna3DepthwisePlan(self, problem, device, cfg, arch,
                                  f"depthwise (groups == C = {problem.channels}, multiplier {mult}): a memory-bound "
                                  f"direct kernel, each input tile read once into LDS (compile- and "
                                  f"index-math-verified; not run on AMD hardware){tf32_note(problem)}")


class Cdna3DepthwisePlan(Plan):
    """The tile shape of one depthwise problem, its compiled variant and its grid."""

    def __init__(self, kernel, problem, device, cfg: DwConfig, arch: str, reason: str):
        super().__init__(kernel, problem, device, reason)
        self.cfg = cfg
        self.name, self.defines = dw_variant(problem, cfg)
        self.grid = cfg.tiles(problem)
        self._arch = arch

    def describe(self) -> str:
        c, p = self.cfg, self.problem
        T = problem_axes(p)[0]
        depth = f", {T} filter slices in turn" if p.nd == 3 else ""
        return (f"{self.name} ({self._arch}): workgroup tile {c.tp}x{c.tq} output pixels x {c.cb} channels "
                f"({c.threads} work-items: {c.cv} vectors of {c.vec} channels x {c.tp * c.tqg} pixel groups of "
                f"{c.qt} along W), input tile {c.in_rows}x{c.in_cols}x{c.cin} with halo in LDS ({c.smem} bytes, "
                f"buffer loads of {c.vin} channels){depth}, grid {self.grid} workgroups")

    def run(self, x, w, bias, residual, out):
        fn = _dw_function(self.name, tuple(sorted(self.defines.items())), self._arch, self.device.index)
        x, bias, residual, target = aligned_operands(self.problem, self.cfg, x, bias, residual, out)
        # Absent operands: any valid array of the call (the kernel reads them only when flagged).
        b = target if bias is None else bias
        r = target if residual is None else residual
        fn((self.grid,), (self.cfg.threads,), (x, w, b, r, target, dw_geometry(self.problem, self.cfg),
                                                epilogue_params(self.problem.epilogue)),
           shared_mem=self.cfg.smem)
        if target is not out:
            out[...] = target


def _source_text() -> str:
    """The entry file, prefixed with the hash of the whole kernels_hip/ tree (CuPy keys its cache on the
    code string and options, not on the headers it includes)."""
    text = (kernels_dir("hip") / DW_HIP_SOURCE).read_text()
    return f"// cuconv kernels_hip tree {tree_hash('hip')}\n{text}"


@functools.lru_cache(maxsize=64)
def _dw_function(name: str, defines: Tuple[Tuple[str, object], ...], arch: str, device_id: int):
    """Compile one variant with hiprtc (CuPy caches the code object on disk) and look it up on one device."""
    import cupy as cp
    opts: Dict[str, object] = dict(defines)
    # backend="nvrtc" is hiprtc on a ROCm build of CuPy (see cdna3.variants.hip_function).
    with cp.cuda.Device(device_id):
        mod = cp.RawModule(code=_source_text(), backend="nvrtc", options=hip_compile_options(arch, opts))
        return mod.get_function(name)


register(Cdna3DepthwiseKernel())
