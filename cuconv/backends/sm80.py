"""Portable implicit-GEMM kernel for sm_80+ (A100, A10/RTX 30, L4/RTX 40, H100, B200): ``sm80_igemm``.

cp.async software loaders + ldmatrix + mma.sync m16n8k16 (fp16/bf16 in, fp32 accumulate), source in
``kernels_cu/sm80/``. On a Hopper it serves what the TMA kernel (``sm90_tma``, priority 100)
declines; it can always be selected by name (``kernel="sm80_igemm"``).

The A operand (activations) is staged by one of three compile-time loader sub-paths
(see ``kernels_cu/sm80/loader_im2col.cuh`` and :mod:`cuconv.models.loader`, their NumPy model):

``pointwise``   1x1 filter, stride 1, no padding: the linear loader over x viewed as ``[M][C]``.
``uniform``     ``C/groups`` a multiple of the K tile (32): one filter tap per K tile.
``per_lane``    anything else (C = 3, 5, ...): each lane decomposes its own ``k``.

The dispatcher picks the first that applies, in that order. **Forcing a sub-path** (tests,
benchmarks): set the environment variable ``CUCONV_SM80_SUBPATH`` to ``pointwise``, ``uniform`` or
``per_lane``, or use the context manager :func:`forced_subpath`; a sub-path that cannot serve the
problem makes the kernel decline with the reason. ``cuconv.explain(...).detail`` names the sub-path,
tile and copy widths in use.

Copy width: each loader moves ``VEC`` contiguous elements per copy, the largest of 8/4/2 (cp.async
16/8/4 bytes) such that the channel counts (or leading dimension) are multiples of ``VEC`` and the
base pointer is ``2*VEC``-byte aligned; otherwise ``VEC = 1``, a synchronous 16-bit load with
zero for halo lanes (cp.async cannot copy 2 bytes).

CuPy is imported only inside functions, so importing this module on a CPU-only machine is free.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Optional, Tuple

import numpy as np

from ..compiler import load_cuda_module
from ..dispatch import Kernel, register
from ..launch import c_struct, dtype_code, epilogue_params
from ..models.loader import SUBPATHS, subpath_ok
from ..problem import ConvProblem, Epilogue

__all__ = ["Sm80IgemmKernel", "TileConfig", "forced_subpath", "choose_subpath", "conv_config", "matmul_config",
           "stage_a_tile", "run_matmul", "conv_variant", "matmul_variant"]

CONV_SOURCE = "sm80/conv2d_fprop_sm80.cu"
MATMUL_SOURCE = "sm80/matmul_sm80.cu"
BLOCK_K = 32
_SUBPATH_CODE = {"pointwise": 0, "uniform": 1, "per_lane": 2}
_DTYPE_TAG = {"float16": "f16", "bfloat16": "bf16"}
_MAX_GRID_Y = 65535


# ----------------------------------------------------------------------------- tile configs
@dataclass(frozen=True)
class TileConfig:
    """CTA tile ``bm x bn x bk``, ring depth, warp grid and occupancy hint of one kernel variant."""

    bm: int
    bn: int
    stages: int
    warps_m: int
    warps_n: int
    min_blocks: int
    bk: int = BLOCK_K

    @property
    def threads(self) -> int:
        return 32 * self.warps_m * self.warps_n

    @property
    def name(self) -> str:
        return f"{self.bm}x{self.bn}x{self.bk}_s{self.stages}_w{self.warps_m}x{self.warps_n}"

    def ring_bytes(self) -> int:
        return self.stages * (self.bm + self.bn) * self.bk * 2

    def smem_bytes(self, row_table: bool) -> int:
        """Dynamic shared memory: the ring, plus the 16-byte RowInfo per tile row for im2col."""
        return self.ring_bytes() + (16 * self.bm if row_table else 0)

    def defines(self) -> dict:
        return dict(CUCONV_BM=self.bm, CUCONV_BN=self.bn, CUCONV_BK=self.bk, CUCONV_STAGES=self.stages,
                    CUCONV_WARPS_M=self.warps_m, CUCONV_WARPS_N=self.warps_n, CUCONV_MIN_BLOCKS=self.min_blocks)


#: The variants, by GEMM N width. Warp tiles are 64x64 (big), 64x32, 32x32, 32x32 and 32x16.
CONFIGS = {
    256: TileConfig(128, 256, 4, 2, 4, 1),
    128: TileConfig(128, 128, 4, 2, 4, 1),  # 2 CTAs/SM (128 regs) spills the 64x32 warp tile
    64: TileConfig(128, 64, 4, 4, 2, 2),
    32: TileConfig(128, 32, 4, 4, 1, 2),
    16: TileConfig(128, 16, 4, 4, 1, 4),
}


def conv_config(problem: ConvProblem) -> TileConfig:
    """Heuristic: the narrowest N tile that covers ``K/groups`` (up to 256), so grouped and narrow
    convolutions waste little of the MMA."""
    kg = problem.gemm_n
    for bn in (16, 32, 64, 128):
        if kg <= bn:
            return CONFIGS[bn]
    return CONFIGS[256] if kg >= 256 else CONFIGS[128]


def matmul_config(m: int, n: int) -> TileConfig:
    """Heuristic for ``cuconv.matmul``: 128x256 for wide products, narrower for narrow ones. The
    B tile is staged ``[BK][BN]`` there, so BN >= 32."""
    if n >= 256 and m >= 128:
        return CONFIGS[256]
    if n > 64:
        return CONFIGS[128]
    return CONFIGS[64] if n > 32 else CONFIGS[32]


# ----------------------------------------------------------------------------- sub-path choice
_forced: Optional[str] = None


@contextlib.contextmanager
def forced_subpath(name: Optional[str]):
    """Force the im2col loader sub-path of ``sm80_igemm`` inside a ``with`` block (None: automatic)."""
    global _forced
    if name is not None and name not in SUBPATHS:
        raise ValueError(f"subpath: expected one of {SUBPATHS} or None, got {name!r}")
    previous, _forced = _forced, name
    try:
        yield
    finally:
        _forced = previous


def _requested_subpath() -> Optional[str]:
    if _forced is not None:
        return _forced
    env = os.environ.get("CUCONV_SM80_SUBPATH", "").strip()
    if not env or env == "auto":
        return None
    if env not in SUBPATHS:
        raise ValueError(f"CUCONV_SM80_SUBPATH: expected one of {SUBPATHS} or 'auto', got {env!r}")
    return env


def choose_subpath(problem: ConvProblem) -> Tuple[Optional[str], str]:
    """``(sub-path, why)``; sub-path is None when a forced one cannot serve ``problem``."""
    want = _requested_subpath()
    if want is not None:
        if subpath_ok(problem, want, BLOCK_K):
            return want, f"{want} (forced)"
        need = {"pointwise": "a 1x1 filter, stride 1 and no padding",
                "uniform": f"C/groups a multiple of {BLOCK_K}"}[want]
        return None, f"forced sub-path {want!r} needs {need}, got {problem.describe()}"
    for name in SUBPATHS:
        if subpath_ok(problem, name, BLOCK_K):
            return name, name
    raise AssertionError("per_lane serves every problem")  # pragma: no cover


def _vec(*, extents, pointer: Optional[int]) -> int:
    """Largest copy width (elements) dividing every extent with a suitably aligned base pointer."""
    for v in (8, 4, 2):
        if all(e % v == 0 for e in extents) and (pointer is None or pointer % (2 * v) == 0):
            return v
    return 1


def conv_variant(problem: ConvProblem, subpath: str, x_ptr: Optional[int] = None, w_ptr: Optional[int] = None):
    """``(kernel name, TileConfig, defines)`` of the conv kernel for ``problem`` on ``subpath``."""
    cfg = conv_config(problem)
    vec_a = _vec(extents=(problem.channels, problem.channels_per_group), pointer=x_ptr)
    vec_b = _vec(extents=(problem.gemm_k,), pointer=w_ptr)
    name = (f"conv2d_fprop_sm80_{subpath}_{_DTYPE_TAG[problem.dtype]}_{cfg.name}_va{vec_a}_vb{vec_b}")
    defines = dict(cfg.defines(), CUCONV_DTYPE=dtype_code(problem.dtype), CUCONV_SUBPATH=_SUBPATH_CODE[subpath],
                   CUCONV_VEC_A=vec_a, CUCONV_VEC_B=vec_b, CUCONV_KERNEL_NAME=name)
    return name, cfg, defines


def matmul_variant(dtype: str, m: int, n: int, k: int, a_ptr: Optional[int] = None, b_ptr: Optional[int] = None):
    """``(kernel name, TileConfig, defines)`` of the matmul kernel."""
    cfg = matmul_config(m, n)
    vec_a = _vec(extents=(k,), pointer=a_ptr)
    vec_b = _vec(extents=(n,), pointer=b_ptr)
    name = f"matmul_sm80_{_DTYPE_TAG[dtype]}_{cfg.name}_va{vec_a}_vb{vec_b}"
    defines = dict(cfg.defines(), CUCONV_DTYPE=dtype_code(dtype), CUCONV_VEC_A=vec_a, CUCONV_VEC_B=vec_b,
                   CUCONV_KERNEL_NAME=name)
    return name, cfg, defines


# ----------------------------------------------------------------------------- launch helpers
_GEOMETRY_FIELDS = [("M", np.int64)] + [(n, np.int32) for n in (
    "H", "W", "C", "P", "Q", "R", "S", "Cg", "k_gemm", "stride_h", "stride_w", "dil_h", "dil_w", "pad_h", "pad_w")]


def im2col_geometry(p: ConvProblem) -> np.void:
    """The ``Im2colGeometry`` struct of kernels_cu/sm80/loader_im2col.cuh."""
    (H, W), (P, Q), (R, S) = p.in_spatial, p.out_spatial, p.filter_spatial
    return c_struct(_GEOMETRY_FIELDS, dict(
        M=p.gemm_m, H=H, W=W, C=p.channels, P=P, Q=Q, R=R, S=S, Cg=p.channels_per_group, k_gemm=p.gemm_k,
        stride_h=p.stride[0], stride_w=p.stride[1], dil_h=p.dilation[0], dil_w=p.dilation[1],
        pad_h=p.pad_lo[0], pad_w=p.pad_lo[1]))


def _m_grid(m_tiles: int) -> Tuple[int, int]:
    """m tiles folded into grid (y, z): y <= 65535."""
    y = min(m_tiles, _MAX_GRID_Y)
    return y, -(-m_tiles // y)


def _function(source: str, device, defines: dict, name: str, smem: int):
    mod = load_cuda_module(source, device, defines)
    fn = mod.get_function(name)
    fn.max_dynamic_shared_size_bytes = smem
    return fn


_INT32_MAX = 2**31 - 1


# ----------------------------------------------------------------------------- the conv kernel
class Sm80IgemmKernel(Kernel):
    """Implicit GEMM with cp.async im2col loaders and mma.sync, for every sm_80+ NVIDIA GPU."""

    name = "sm80_igemm"
    backend = "cuda"
    priority = 50
    spatial_dims = (2,)

    def check(self, problem, device):
        if device.cc < (8, 0):
            return False, f"needs sm_80+ (cp.async, bf16 mma.sync), the GPU is sm_{device.cc[0]}{device.cc[1]}"
        if problem.dtype == "float32":
            return False, "float32: mma.sync here is fp16/bf16 only; the generic path takes float32"
        big = max(problem.channels, problem.gemm_k, *problem.in_spatial, *problem.out_spatial,
                  problem.batch * np.prod(problem.in_spatial))
        if big > _INT32_MAX:
            return False, f"an extent exceeds the kernel's 32-bit index range ({big})"
        subpath, why = choose_subpath(problem)
        if subpath is None:
            return False, why
        return True, f"fp16/bf16 conv2d on sm_80+, {why} loader"

    def describe(self, problem, device):
        subpath, why = choose_subpath(problem)
        if subpath is None:
            return why
        name, cfg, d = conv_variant(problem, subpath)
        return (f"{name}: loader {why}, tile {cfg.bm}x{cfg.bn}x{cfg.bk}, {cfg.stages}-stage cp.async ring, "
                f"{cfg.warps_m}x{cfg.warps_n} warps, copies of {d['CUCONV_VEC_A']} (A) / {d['CUCONV_VEC_B']} (B) "
                f"elements (when the pointers are aligned), grid covers {problem.groups} group(s)")

    def run(self, problem, x, w, bias, residual, out):
        import cupy as cp

        from ..device import device_of
        dev = device_of(x)
        subpath, why = choose_subpath(problem)
        if subpath is None:  # a sub-path forced after dispatch cached its choice for this problem
            from ..dispatch import KernelDeclined
            raise KernelDeclined(f"kernel: 'sm80_igemm' declines this problem: {why}")
        name, cfg, defines = conv_variant(problem, subpath, x.data.ptr, w.data.ptr)
        smem = cfg.smem_bytes(row_table=subpath != "pointwise")
        fn = _function(CONV_SOURCE, dev, defines, name, smem)
        ep = problem.epilogue
        K, Kg = problem.out_channels, problem.gemm_n
        pair_ok = int(K % 2 == 0 and Kg % 2 == 0 and out.data.ptr % 4 == 0)
        n_tiles = -(-Kg // cfg.bn)
        m_tiles = -(-problem.gemm_m // cfg.bm)
        gy, gz = _m_grid(m_tiles)
        bias_arg = bias if bias is not None else out  # never read when absent
        res_arg = residual if (residual is not None and ep.loads_residual) else out
        fn((n_tiles * problem.groups, gy, gz), (cfg.threads,),
           (x, w, bias_arg, res_arg, out, im2col_geometry(problem), np.int32(Kg), np.int32(n_tiles),
            np.int32(m_tiles), np.int32(pair_ok), epilogue_params(ep)), shared_mem=smem)
        del cp


def stage_a_tile(x, problem: ConvProblem, m_offset: int, k_offset: int, group: int = 0,
                 subpath: Optional[str] = None):
    """Debug entry: the A tile ``[BM][BK]`` the loader stages for ``(m_offset, k_offset)``, as NumPy.

    Runs the ``<kernel>_stage_a`` entry (one CTA, one ``load_tile``) of the variant ``sm80_igemm``
    would use for ``problem`` (or for ``subpath``); compare with
    :func:`cuconv.models.loader.loader_tile`. ``x`` is the native-layout CuPy input.
    """
    import cupy as cp

    from ..device import device_of
    if subpath is None:
        subpath, why = choose_subpath(problem)
        if subpath is None:
            raise ValueError(why)
    elif not subpath_ok(problem, subpath, BLOCK_K):
        raise ValueError(f"subpath: {subpath!r} cannot serve {problem.describe()}")
    name, cfg, defines = conv_variant(problem, subpath, x.data.ptr)
    smem = cfg.smem_bytes(row_table=True)
    fn = _function(CONV_SOURCE, device_of(x), defines, name + "_stage_a", smem)
    tile = cp.empty((cfg.bm, cfg.bk), dtype=x.dtype)
    fn((1,), (cfg.threads,), (x, im2col_geometry(problem), np.int32(group), np.int64(m_offset),
                              np.int64(k_offset), tile), shared_mem=smem)
    return cp.asnumpy(tile)


# ----------------------------------------------------------------------------- matmul
def run_matmul(a, b, bias, residual, out, epilogue: Epilogue) -> None:
    """``out = act(alpha * a @ b + bias + beta * residual)`` on the GPU with the sm80 kernel.

    All CuPy, C-contiguous, one 16-bit dtype; ``a (M, K)``, ``b (K, N)``, ``out (M, N)``;
    ``residual`` may be ``out``. Validation is :func:`cuconv.matmul`'s job.
    """
    from ..arrays import dtype_name
    from ..device import device_of
    M, K = a.shape
    N = b.shape[1]
    dtype = dtype_name(a, "a")
    name, cfg, defines = matmul_variant(dtype, M, N, K, a.data.ptr, b.data.ptr)
    smem = cfg.smem_bytes(row_table=False)
    fn = _function(MATMUL_SOURCE, device_of(a), defines, name, smem)
    m_tiles = -(-M // cfg.bm)
    gy, gz = _m_grid(m_tiles)
    pair_ok = int(N % 2 == 0 and out.data.ptr % 4 == 0)
    bias_arg = bias if bias is not None else out
    res_arg = residual if (residual is not None and epilogue.loads_residual) else out
    fn((-(-N // cfg.bn), gy, gz), (cfg.threads,),
       (a, b, bias_arg, res_arg, out, np.int64(M), np.int32(N), np.int32(K), np.int32(m_tiles), np.int32(pair_ok),
        epilogue_params(epilogue)), shared_mem=smem)


register(Sm80IgemmKernel())


def _compile_variants():
    """Representative (source, defines, arch) triples for the CPU compile test (tests/test_compile.py):
    every sub-path, the narrow and the widest tile, both element types, the 2-byte fallback."""
    out = []

    def conv(c, k, filt, pad, dtype="bfloat16", groups=1):
        p = ConvProblem.create(nd=2, batch=2, in_spatial=(16, 16), channels=c, out_channels=k, filter_spatial=filt,
                               stride=1, dilation=1, padding=pad, groups=groups, dtype=dtype, layout="NHWC")
        sub = next(s for s in SUBPATHS if subpath_ok(p, s, BLOCK_K))
        return conv_variant(p, sub)[2]

    defs = [(CONV_SOURCE, conv(64, 256, (3, 3), 1)),               # uniform, 128x256
            (CONV_SOURCE, conv(3, 64, (7, 7), 3)),                 # per-lane, 2-byte copies (stem)
            (CONV_SOURCE, conv(128, 128, (3, 3), 1, groups=32)),   # per-lane, 8-byte copies, 128x16
            (CONV_SOURCE, conv(64, 128, (1, 1), 0, "float16")),    # pointwise, fp16
            (MATMUL_SOURCE, matmul_variant("bfloat16", 8192, 8192, 8192)[2]),
            (MATMUL_SOURCE, matmul_variant("float16", 7, 13, 5)[2])]
    for arch in ("sm_80", "sm_90a"):
        out += [(src, d, arch) for src, d in defs]
    return out


COMPILE_VARIANTS = _compile_variants()
