"""Portable implicit-GEMM kernel for sm_80+ (A100, A10/RTX 30, L4/RTX 40, H100, B200): ``sm80_igemm``.

cp.async software loaders + ldmatrix + mma.sync m16n8k16 (fp16/bf16 in, fp32 accumulate), source in
``kernels_cu/sm80/``. On a Hopper it serves what the TMA kernel (``sm90_tma``, priority 100)
declines; it can always be selected by name (``kernel="sm80_igemm"``).

The A operand (activations) is staged by one of three compile-time loader sub-paths
(see ``kernels_cu/sm80/loader_im2col.cuh`` and :mod:`cuconv.models.loader`, their NumPy model):

``pointwise``   1x1 filter, stride 1, no padding: the linear loader over x viewed as ``[M][C]``.
``uniform``     ``C/groups`` a multiple of the K tile (32): one filter tap per K tile.
``per_lane``    anything else (C = 3, 5, ...): each lane decomposes its own ``k``.

Two more paths serve what the implicit GEMM does badly:

``grouped_mma``  grouped / depthwise convs with ``C/groups == K/groups`` in {1, 2, 4, 8, 16} and C a
                 multiple of 8 (ResNeXt's 32x4d, depthwise): ``kernels_cu/sm80/grouped_mma_sm80.cu``, a
                 direct kernel doing every group of a pixel per warp as block-diagonal mma.sync on
                 32-channel superblocks, weights packed into mma fragments by a prep kernel each call.
``pad_channels`` groups 1, odd C < 8, not pointwise (the stem, C = 3): a pre-pass copies x (and w) into a
                 scratch NHWC buffer with C padded to 4 (or 8) zero channels, so the ``per_lane`` loader
                 moves 8/16-byte cp.async chunks instead of 2-byte synchronous loads; with a W stride of
                 2-4 it also pads W and folds that many pixels into one (:func:`pad_plan`). The pre-pass
                 is a second kernel of the call and its time counts in the call's time.

The dispatcher picks the first that applies, in the order of :data:`SM80_SUBPATHS`. **Forcing a
sub-path** (tests, benchmarks): set the environment variable ``CUCONV_SM80_SUBPATH`` (read once per process) to one of
:data:`SM80_SUBPATHS`, or use the context manager :func:`forced_subpath`; a sub-path that cannot serve
the problem makes the kernel decline with the reason. ``cuconv.explain(...).detail`` names the sub-path,
tile and copy widths in use.

Copy width: each loader moves ``VEC`` contiguous elements per copy, the largest of 8/4/2 (cp.async
16/8/4 bytes) such that the channel counts (or leading dimension) are multiples of ``VEC`` and the
base pointer is ``2*VEC``-byte aligned; otherwise ``VEC = 1``, a synchronous 16-bit load with
zero for halo lanes (cp.async cannot copy 2 bytes).

CuPy is imported only inside functions, so importing this module on a CPU-only machine is free.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
from dataclasses import dataclass
from typing import Optional, Tuple

import numpy as np

from ..compiler import load_cuda_module
from ..dispatch import Kernel, register
from ..launch import c_struct, divisor_fields, divisor_values, dtype_code, epilogue_params
from ..models.loader import SUBPATHS, subpath_ok
from ..problem import ConvProblem, Epilogue
from ..scratch import scratch

__all__ = ["Sm80IgemmKernel", "TileConfig", "SM80_SUBPATHS", "forced_subpath", "choose_subpath", "conv_config",
           "matmul_config", "stage_a_tile", "run_matmul", "conv_variant", "matmul_variant", "grouped_variant",
           "padded_channels", "pad_plan", "PadPlan", "sm80_subpath_ok"]

CONV_SOURCE = "sm80/conv2d_fprop_sm80.cu"
MATMUL_SOURCE = "sm80/matmul_sm80.cu"
GROUPED_SOURCE = "sm80/grouped_mma_sm80.cu"
PAD_SOURCE = "sm80/pad_channels_sm80.cu"
#: Every sub-path of sm80_igemm, in the order the automatic choice tries them.
SM80_SUBPATHS = ("pointwise", "uniform", "grouped_mma", "pad_channels", "per_lane")
GROUPED_CG = (1, 2, 4, 8, 16)       # C/groups == K/groups values the grouped_mma path serves
GROUPED_SUPER = 32                  # channels per block-diagonal superblock
GROUPED_FRAG_BYTES = 2048           # mma A fragments per (tap, superblock): 4 x 32 lanes x 16 bytes
GROUPED_SBS, GROUPED_OCTETS = 1, 4  # superblocks per CTA, 8-pixel mma columns per warp (grouped_variant)
GROUPED_MAX_M = 2**31 - 4096        # output pixels: the kernel splits pixel indices with 32-bit divisions
SMEM_BUDGET = 99 * 1024             # kernels_cu/sm80/config.cuh kSmemBudgetBytes
BLOCK_K = 32
#: A group's filters up to this size are copied with L1 allocation (``_bl1`` variants): every CTA
#: reads the whole filter, so the CTAs of an SM then find it in L1 instead of each reading it from L2.
B_L1_MAX_BYTES = 64 * 1024
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
        """Dynamic shared memory: the ring, plus the 16-byte RowInfo per tile row of the im2col loader's
        2-byte path (copies of 2+ elements keep their rows in registers)."""
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


#: Short-reduction per-lane convs (the stem on padded channels: R*S*C <= 256, K <= 64): 64x64 tiles
#: of 4 warps, 4 CTAs per SM, so one CTA's prologue and epilogue overlap the others' few K tiles
#: (H100, stem: 0.266 vs 0.285 ms per call for 128x64). Not with 2-byte copies (conv_config).
SHORT_K_CONFIG = TileConfig(64, 64, 4, 2, 2, 4)


def conv_config(problem: ConvProblem, subpath: Optional[str] = None, two_byte: bool = False) -> TileConfig:
    """Heuristic: the narrowest N tile that covers ``K/groups`` (up to 256), so grouped and narrow
    convolutions waste little of the MMA; :data:`SHORT_K_CONFIG` for the per-lane sub-path with a
    short reduction, unless a loader moves 2-byte copies (``two_byte``; there 128x64 measured faster,
    H100 stem 0.62 vs 0.73 ms), which also run one CTA per SM (their values in flight plus the two
    fragment sets spill at the 128 registers of two)."""
    kg = problem.gemm_n
    if subpath == "per_lane" and not two_byte and problem.groups == 1 and 32 < kg <= 64 and problem.gemm_k <= 256:
        return SHORT_K_CONFIG
    cfg = next((CONFIGS[bn] for bn in (16, 32, 64, 128) if kg <= bn), CONFIGS[256] if kg >= 256 else CONFIGS[128])
    return dataclasses.replace(cfg, min_blocks=1) if two_byte else cfg


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
    """Force the sub-path of ``sm80_igemm`` (one of :data:`SM80_SUBPATHS`) inside a ``with`` block
    (None: automatic)."""
    global _forced
    if name is not None and name not in SM80_SUBPATHS:
        raise ValueError(f"subpath: expected one of {SM80_SUBPATHS} or None, got {name!r}")
    previous, _forced = _forced, name
    try:
        yield
    finally:
        _forced = previous


def _requested_subpath() -> Optional[str]:
    return _forced if _forced is not None else _env_subpath()


@functools.lru_cache(maxsize=None)
def _env_subpath() -> Optional[str]:
    """``CUCONV_SM80_SUBPATH``, read once per process (not on every call's dispatch)."""
    env = os.environ.get("CUCONV_SM80_SUBPATH", "").strip()
    if not env or env == "auto":
        return None
    if env not in SM80_SUBPATHS:
        raise ValueError(f"CUCONV_SM80_SUBPATH: expected one of {SM80_SUBPATHS} or 'auto', got {env!r}")
    return env


def _grouped_taps_fit(problem: ConvProblem) -> bool:
    """One superblock's fragment slab (taps x 2 KiB) fits the shared-memory budget."""
    return int(np.prod(problem.filter_spatial)) * GROUPED_FRAG_BYTES <= SMEM_BUDGET


def padded_channels(problem: ConvProblem) -> int:
    """Channel count the ``pad_channels`` pre-pass pads C to (4 for C <= 3, else 8)."""
    return pad_plan(problem).cp


_NEEDS = {"pointwise": "a 1x1 filter, stride 1 and no padding",
          "uniform": f"C/groups a multiple of {BLOCK_K}",
          "grouped_mma": (f"groups > 1, C/groups == K/groups in {GROUPED_CG}, C a multiple of 8, a filter of "
                          f"at most {SMEM_BUDGET // GROUPED_FRAG_BYTES} taps and N*P*Q <= {GROUPED_MAX_M}"),
          "pad_channels": "groups 1, an odd C below 8 and a filter that is not pointwise",
          "per_lane": "nothing"}


def sm80_subpath_ok(problem: ConvProblem, subpath: str) -> bool:
    """Whether the sm80 sub-path ``subpath`` (one of :data:`SM80_SUBPATHS`) may serve ``problem``."""
    if subpath == "grouped_mma":
        cg = problem.channels_per_group
        return (problem.groups > 1 and cg == problem.out_channels_per_group and cg in GROUPED_CG
                and problem.channels % 8 == 0 and _grouped_taps_fit(problem) and problem.gemm_m <= GROUPED_MAX_M)
    if subpath == "pad_channels":
        return (problem.groups == 1 and problem.channels % 2 == 1 and problem.channels < 8
                and not problem.is_pointwise)
    if subpath in SUBPATHS:
        return subpath_ok(problem, subpath, BLOCK_K)
    raise ValueError(f"subpath: expected one of {SM80_SUBPATHS}, got {subpath!r}")


def choose_subpath(problem: ConvProblem) -> Tuple[Optional[str], str]:
    """``(sub-path, why)``; sub-path is None when a forced one cannot serve ``problem``."""
    want = _requested_subpath()
    if want is not None:
        if sm80_subpath_ok(problem, want):
            return want, f"{want} (forced)"
        return None, f"forced sub-path {want!r} needs {_NEEDS[want]}, got {problem.describe()}"
    for name in SM80_SUBPATHS:
        if sm80_subpath_ok(problem, name):
            return name, name
    raise AssertionError("per_lane serves every problem")  # pragma: no cover


def _vec(*, extents, pointer: Optional[int]) -> int:
    """Largest copy width (elements) dividing every extent with a suitably aligned base pointer."""
    for v in (8, 4, 2):
        if all(e % v == 0 for e in extents) and (pointer is None or pointer % (2 * v) == 0):
            return v
    return 1


def conv_variant(problem: ConvProblem, subpath: str, x_ptr: Optional[int] = None, w_ptr: Optional[int] = None,
                 w_ld: Optional[int] = None):
    """``(kernel name, TileConfig, defines)`` of the conv kernel for ``problem`` on ``subpath``; ``w_ld``
    is the row pitch of the filters (default ``R*S*C/groups``; larger only with zeroed padding)."""
    vec_a = _vec(extents=(problem.channels, problem.channels_per_group), pointer=x_ptr)
    vec_b = _vec(extents=(w_ld or problem.gemm_k,), pointer=w_ptr)
    cfg = conv_config(problem, subpath, two_byte=1 in (vec_a, vec_b))
    b_l1 = int(vec_b == 8 and problem.gemm_n * (w_ld or problem.gemm_k) * 2 <= B_L1_MAX_BYTES)
    name = (f"conv2d_fprop_sm80_{subpath}_{_DTYPE_TAG[problem.dtype]}_{cfg.name}_va{vec_a}_vb{vec_b}"
            + ("_bl1" if b_l1 else ""))
    defines = dict(cfg.defines(), CUCONV_DTYPE=dtype_code(problem.dtype), CUCONV_SUBPATH=_SUBPATH_CODE[subpath],
                   CUCONV_VEC_A=vec_a, CUCONV_VEC_B=vec_b, CUCONV_B_L1=b_l1, CUCONV_KERNEL_NAME=name)
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


def grouped_variant(problem: ConvProblem):
    """``(kernel name, superblocks per CTA, defines)`` of the grouped_mma kernel for ``problem``.

    One superblock (32 channels) per CTA, 4 octets (32 pixels) per warp, 2 CTAs per SM (<= 128
    registers). Measured on the H100 (ResNeXt-50 32x4d 3x3, bf16): 0.085 ms, against 0.096 ms for 2
    superblocks x 2 octets (twice the fragment reads per pixel), 0.109 ms for 8 octets (204
    registers, one CTA per SM) and 0.112 ms for 2 superblocks x 4 octets."""
    name = f"conv2d_fprop_sm80_grouped_mma_{_DTYPE_TAG[problem.dtype]}_sb{GROUPED_SBS}_o{GROUPED_OCTETS}"
    defines = dict(CUCONV_DTYPE=dtype_code(problem.dtype), CUCONV_SBS=GROUPED_SBS, CUCONV_OCTETS=GROUPED_OCTETS,
                   CUCONV_GM_MIN_BLOCKS=2, CUCONV_KERNEL_NAME=name)
    return name, GROUPED_SBS, defines


def pad_variant(cp_: int):
    """``(kernel name, defines)`` of the channel-pad pre-pass to ``cp_`` channels."""
    name = f"pad_channels_sm80_c{cp_}"
    return name, dict(CUCONV_PAD_CP=cp_, CUCONV_KERNEL_NAME=name)


# ----------------------------------------------------------------------------- launch helpers
_GEOMETRY_FIELDS = [("M", np.int64)] + [(n, np.int32) for n in (
    "H", "W", "C", "P", "Q", "R", "S", "Cg", "k_gemm", "stride_h", "stride_w", "dil_h", "dil_w", "pad_h", "pad_w")] + \
    divisor_fields("div_q", "div_p", "div_cg", "div_s")


@functools.lru_cache(maxsize=256)
def im2col_geometry(p: ConvProblem) -> np.void:
    """The ``Im2colGeometry`` struct of kernels_cu/sm80/loader_im2col.cuh (memoised: a pure function
    of the problem, built on every call otherwise; callers pass it by value and never modify it)."""
    (H, W), (P, Q), (R, S) = p.in_spatial, p.out_spatial, p.filter_spatial
    return c_struct(_GEOMETRY_FIELDS, dict(
        M=p.gemm_m, H=H, W=W, C=p.channels, P=P, Q=Q, R=R, S=S, Cg=p.channels_per_group, k_gemm=p.gemm_k,
        stride_h=p.stride[0], stride_w=p.stride[1], dil_h=p.dilation[0], dil_w=p.dilation[1],
        pad_h=p.pad_lo[0], pad_w=p.pad_lo[1], **divisor_values(div_q=Q, div_p=P, div_cg=p.channels_per_group, div_s=S)))


_GROUPED_FIELDS = [("M", np.int64)] + [(n, np.int32) for n in (
    "H", "W", "C", "P", "Q", "R", "S", "Cg", "stride_h", "stride_w", "dil_h", "dil_w", "pad_h", "pad_w", "out_vec")] + \
    divisor_fields("div_q", "div_p")


def grouped_geometry(p: ConvProblem, vec: int) -> np.void:
    """The ``GroupedGeometry`` struct of kernels_cu/sm80/grouped_mma_sm80.cu (``vec``: :func:`out_vec`)."""
    (H, W), (P, Q), (R, S) = p.in_spatial, p.out_spatial, p.filter_spatial
    return c_struct(_GROUPED_FIELDS, dict(
        M=p.gemm_m, H=H, W=W, C=p.channels, P=P, Q=Q, R=R, S=S, Cg=p.channels_per_group,
        stride_h=p.stride[0], stride_w=p.stride[1], dil_h=p.dilation[0], dil_w=p.dilation[1],
        pad_h=p.pad_lo[0], pad_w=p.pad_lo[1], out_vec=int(vec), **divisor_values(div_q=Q, div_p=P)))


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
#: Largest leading dimension (elements) of an operand the linear loader reads: its in-tile offset
#: row * ld + col (rows < 256) is a 32-bit int.
MAX_LD = _INT32_MAX // 256


def out_vec(ld: int, col_step: int, *pointers: Optional[int]) -> int:
    """Widest output access of the epilogue (``out_vec`` of ``kernels_cu/sm80/epilogue.cuh``): 8
    elements (16 bytes) when the row pitch ``ld``, the group's column step and every pointer
    (out, and residual / bias when present) allow it, else 2 (4 bytes), else 1."""
    ptrs = [p for p in pointers if p is not None]
    for vec in (8, 2):
        if ld % vec == 0 and col_step % vec == 0 and all(p % (2 * vec) == 0 for p in ptrs):
            return vec
    return 1


def _epilogue_operands(out, bias, residual, ep: Epilogue):
    """``(bias_arg, residual_arg, residual_ptr)`` for a launch: absent operands are passed as ``out``
    (never read: the kernel checks ``has_bias`` / ``has_residual``); ``residual_ptr`` is the
    residual's address when the epilogue reads it, else None (for :func:`out_vec`)."""
    loads_res = residual is not None and ep.loads_residual
    return (bias if bias is not None else out, residual if loads_res else out,
            residual.data.ptr if loads_res else None)


def _conv_smem(cfg: TileConfig, subpath: str, defines: dict) -> int:
    """Dynamic shared memory of a conv kernel variant: the RowInfo table only for the im2col loader's
    2-byte copies (:meth:`TileConfig.smem_bytes`)."""
    return cfg.smem_bytes(row_table=subpath != "pointwise" and defines["CUCONV_VEC_A"] == 1)


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
        if max(problem.channels, problem.gemm_k) > MAX_LD:
            return False, (f"C = {problem.channels} / R*S*C/groups = {problem.gemm_k} exceeds {MAX_LD}: the loaders' "
                           f"in-tile offsets (256 rows x that leading dimension) are 32-bit")
        subpath, why = choose_subpath(problem)
        if subpath is None:
            return False, why
        return True, f"fp16/bf16 conv2d on sm_80+, {why} loader"

    def settings(self):
        """The forced sub-path (``forced_subpath`` / ``CUCONV_SM80_SUBPATH``), or None."""
        return _requested_subpath()

    def describe(self, problem, device):
        subpath, why = choose_subpath(problem)
        if subpath is None:
            return why
        if subpath == "grouped_mma":
            name, sbs, _ = grouped_variant(problem)
            return (f"{name}: {why} path, direct block-diagonal mma.sync over {GROUPED_SUPER}-channel superblocks "
                    f"({problem.groups} groups of {problem.channels_per_group}), {sbs} superblock(s) per CTA, "
                    f"16-byte activation loads; weights packed into mma fragments by a prep kernel each call")
        if subpath == "pad_channels":
            plan = pad_plan(problem)
            kp = plan.kernel_problem
            name, cfg, d = conv_variant(kp, "per_lane", w_ld=plan.w_ld)
            fold = (f", W padded to {plan.width} and folded {plan.fold} pixels -> 1 of {kp.channels} channels "
                    f"(filter {kp.filter_spatial[0]}x{kp.filter_spatial[1]}, W stride 1)" if plan.fold > 1 else "")
            return (f"{name}: {why} path, pre-pass pads C {problem.channels} -> {plan.cp}{fold} into a scratch NHWC "
                    f"copy of x ({problem.batch * problem.in_spatial[0] * plan.width * plan.cp * 2} bytes, its time "
                    f"counts) and of w, then the per_lane loader, tile {cfg.bm}x{cfg.bn}x{cfg.bk}, copies of "
                    f"{d['CUCONV_VEC_A']} (A) / {d['CUCONV_VEC_B']} (B) elements")
        name, cfg, d = conv_variant(problem, subpath)
        return (f"{name}: loader {why}, tile {cfg.bm}x{cfg.bn}x{cfg.bk}, {cfg.stages}-stage cp.async ring, "
                f"{cfg.warps_m}x{cfg.warps_n} warps, copies of {d['CUCONV_VEC_A']} (A) / {d['CUCONV_VEC_B']} (B) "
                f"elements (when the pointers are aligned), grid covers {problem.groups} group(s)")

    def run(self, problem, x, w, bias, residual, out):
        from ..device import device_of
        dev = device_of(x)
        subpath, why = choose_subpath(problem)
        if subpath is None:  # a sub-path forced after dispatch cached its choice for this problem
            from ..dispatch import KernelDeclined
            raise KernelDeclined(f"kernel: 'sm80_igemm' declines this problem: {why}")
        if subpath == "grouped_mma":
            _run_grouped(problem, x, w, bias, residual, out, dev)
        elif subpath == "pad_channels":
            plan = pad_plan(problem)
            xp, wp = _pad_channels(problem, plan, x, w, dev)
            _run_igemm(plan.kernel_problem, "per_lane", xp, wp, bias, residual, out, dev, w_ld=plan.w_ld)
        else:
            _run_igemm(problem, subpath, x, w, bias, residual, out, dev)


def _run_igemm(problem, subpath, x, w, bias, residual, out, dev, w_ld=None):
    """Launch the implicit-GEMM kernel on ``subpath`` (pointwise / uniform / per_lane); the filters'
    rows are ``w_ld`` elements apart (default ``R*S*C/groups``)."""
    w_ld = w_ld or problem.gemm_k
    name, cfg, defines = conv_variant(problem, subpath, x.data.ptr, w.data.ptr, w_ld)
    smem = _conv_smem(cfg, subpath, defines)
    fn = _function(CONV_SOURCE, dev, defines, name, smem)
    ep = problem.epilogue
    K, Kg = problem.out_channels, problem.gemm_n
    n_tiles = -(-Kg // cfg.bn)
    m_tiles = -(-problem.gemm_m // cfg.bm)
    gy, gz = _m_grid(m_tiles)
    bias_arg, res_arg, res_ptr = _epilogue_operands(out, bias, residual, ep)
    vec = out_vec(K, Kg, out.data.ptr, None if bias is None else bias.data.ptr, res_ptr)
    fn((n_tiles * problem.groups, gy, gz), (cfg.threads,),
       (x, w, bias_arg, res_arg, out, im2col_geometry(problem), np.int32(Kg), np.int32(w_ld), np.int32(n_tiles),
        np.int32(m_tiles), np.int32(vec), epilogue_params(ep)), shared_mem=smem)


@dataclass(frozen=True)
class PadPlan:
    """How the ``pad_channels`` pre-pass lays out its copies of x and w, and the problem the
    ``per_lane`` kernel then runs on them (:func:`pad_plan`)."""

    cp: int                  # channels after padding (4 or 8)
    fold: int                # W pixels folded into one kernel pixel (1: no folding)
    width: int               # W of the copy of x (padded in W when fold > 1)
    pad_w: int               # zero columns written left of x's first column
    taps_w: int              # filter width of the copy of w (S rounded up to a multiple of fold)
    w_ld: int                # row pitch (elements) of the copy of w
    kernel_problem: ConvProblem


@functools.lru_cache(maxsize=256)
def pad_plan(problem: ConvProblem) -> PadPlan:
    """The ``pad_channels`` layout for ``problem`` (groups 1, odd C < 8).

    Channels are padded to ``CP`` = 4 (C <= 3) or 8 so that a tap's channels move in one 8- or
    16-byte copy. With a W stride ``u`` >= 2 (and no W dilation, ``u*CP <= 32``, ``u <= S``) the copy of
    x is also padded in W (the conv's W padding written as zeros) and ``u`` adjacent pixels are
    *folded* into one pixel of ``u*CP`` channels: output column q reads padded columns ``u*q + s``,
    which is folded pixel ``q + s // u``, element ``s % u``. The kernel then runs a conv with W
    stride 1, no W padding, ``ceil(S/u)`` filter columns and ``u*CP`` channels (the weights are laid
    out to match, zero past S), so the stem (3 -> 4 channels, stride 2) moves 16-byte copies, each
    two taps, instead of 8-byte copies of one."""
    cp_ = 4 if problem.channels <= 3 else 8
    (R, S), (H, W), Q = problem.filter_spatial, problem.in_spatial, problem.out_spatial[1]
    u, dil_w = problem.stride[1], problem.dilation[1]
    if 2 <= u <= S and dil_w == 1 and u * cp_ <= 32:
        taps_w = -(-S // u)                     # folded filter columns
        width = u * (Q + taps_w - 1)            # padded columns the folded conv reads: exactly Q outputs
        kp = dataclasses.replace(
            problem, in_spatial=(H, width // u), channels=u * cp_, filter_spatial=(R, taps_w),
            stride=(problem.stride[0], 1), pad_lo=(problem.pad_lo[0], 0), pad_hi=(problem.pad_hi[0], 0))
        return PadPlan(cp_, u, width, problem.pad_lo[1], taps_w * u, kp.gemm_k, kp)
    kp = dataclasses.replace(problem, channels=cp_)
    return PadPlan(cp_, 1, W, 0, S, -(-kp.gemm_k // 8) * 8, kp)


_PAD_BLOCK_FIELDS = [("src", np.uint64), ("dst", np.uint64), ("outer", np.int64), ("inner_src", np.int32),
                     ("inner_dst", np.int32), ("lo", np.int32)] + divisor_fields("div_inner_dst")


def _pad_block(src, dst, outer: int, inner_src: int, inner_dst: int, lo: int) -> np.void:
    """The ``PadBlock`` struct of kernels_cu/sm80/pad_channels_sm80.cu."""
    return c_struct(_PAD_BLOCK_FIELDS, dict(src=src.data.ptr, dst=dst.data.ptr, outer=outer, inner_src=inner_src,
                                            inner_dst=inner_dst, lo=lo, **divisor_values(div_inner_dst=inner_dst)))


def _pad_channels(problem: ConvProblem, plan: PadPlan, x, w, dev):
    """The pad_channels pre-pass (one launch): copies of x ``[N, H, plan.width, CP]`` and of w
    (``[K][R][plan.taps_w][CP]`` folded, else ``[K][R*S*CP]`` rows ``plan.w_ld`` apart) in the
    stream's scratch buffers (:mod:`cuconv.scratch`), every padded element written as zero. The
    caller's arrays are only read."""
    (R, S), (H, W) = problem.filter_spatial, problem.in_spatial
    N, K, cp_ = problem.batch, problem.out_channels, plan.cp
    xp = scratch("sm80.pad_channels.x", (N, H, plan.width, cp_), x.dtype)
    wp = scratch("sm80.pad_channels.w", (K, plan.w_ld), w.dtype)
    tx = _pad_block(x, xp, N * H, W, plan.width, plan.pad_w)
    if plan.fold > 1:   # each filter row (k, r): S taps -> taps_w taps
        tw = _pad_block(w, wp, K * R, S, plan.taps_w, 0)
    else:               # each filter: R*S taps -> w_ld / CP rows
        tw = _pad_block(w, wp, K, R * S, plan.w_ld // cp_, 0)
    rows = xp.size // cp_ + wp.size // cp_
    name, defines = pad_variant(cp_)
    fn = _function(PAD_SOURCE, dev, defines, name, 0)
    fn((max(1, min(-(-rows // 256), 65535 * 4)),), (256,), (tx, tw, np.int32(problem.channels)))
    return xp, wp


def _run_grouped(problem, x, w, bias, residual, out, dev):
    """Launch the grouped_mma prep kernel (weights -> mma fragments) and the direct kernel."""
    import cupy as cp
    if x.data.ptr % 16:  # 16-byte activation loads: realign a view that is only 2-byte aligned
        x = x.copy()
    name, sbs, defines = grouped_variant(problem)
    taps = int(np.prod(problem.filter_spatial))
    n_super = -(-problem.channels // GROUPED_SUPER)
    frags = scratch("sm80.grouped_mma.frags", (taps * n_super * GROUPED_FRAG_BYTES // 4,), cp.uint32)
    prep = _function(GROUPED_SOURCE, dev, defines, name + "_frags", 0)
    prep((max(1, min(-(-frags.size // 256), 4096)),), (256,),
         (w, frags, np.int32(taps), np.int32(problem.channels), np.int32(problem.channels_per_group),
          np.int32(n_super)))
    smem = taps * sbs * GROUPED_FRAG_BYTES
    fn = _function(GROUPED_SOURCE, dev, defines, name, smem)
    ep = problem.epilogue
    bias_arg, res_arg, res_ptr = _epilogue_operands(out, bias, residual, ep)
    vec = out_vec(problem.channels, GROUPED_SUPER, out.data.ptr, res_ptr)  # bias is read per element
    slabs = -(-n_super // sbs)
    pixel_blocks = -(-problem.gemm_m // (64 * GROUPED_OCTETS))  # 8 warps x octets x 8 pixels per CTA iteration
    sms = dev.sm_count or 132
    grid_x = max(1, min(pixel_blocks, (4 * sms) // slabs or 1))  # ~4 CTAs per SM (2 resident), grid-stride
    fn((grid_x, slabs), (256,), (x, frags, bias_arg, res_arg, out, grouped_geometry(problem, vec),
                                 epilogue_params(ep)), shared_mem=smem)


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
        if subpath not in SUBPATHS:
            raise ValueError(f"subpath: the automatic choice {subpath!r} stages no im2col tile; pass one of {SUBPATHS}")
    elif subpath not in SUBPATHS or not subpath_ok(problem, subpath, BLOCK_K):
        raise ValueError(f"subpath: {subpath!r} cannot serve {problem.describe()}")
    name, cfg, defines = conv_variant(problem, subpath, x.data.ptr)
    smem = _conv_smem(cfg, subpath, defines)
    fn = _function(CONV_SOURCE, device_of(x), defines, name + "_stage_a", smem)
    tile = cp.empty((cfg.bm, cfg.bk), dtype=x.dtype)
    fn((1,), (cfg.threads,), (x, im2col_geometry(problem), np.int32(group), np.int64(m_offset),
                              np.int64(k_offset), tile), shared_mem=smem)
    return cp.asnumpy(tile)


# ----------------------------------------------------------------------------- matmul
def run_matmul(a, b, bias, residual, out, epilogue: Epilogue) -> None:
    """``out = act(alpha * a @ b + bias + beta * residual)`` on the GPU with the sm80 kernel.

    All CuPy, C-contiguous, one 16-bit dtype; ``a (M, K)``, ``b (K, N)``, ``out (M, N)`` with K and
    N at most :data:`MAX_LD`; ``residual`` may be ``out``. Validation is :func:`cuconv.matmul`'s job.
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
    bias_arg, res_arg, res_ptr = _epilogue_operands(out, bias, residual, epilogue)
    vec = out_vec(N, N, out.data.ptr, None if bias is None else bias.data.ptr, res_ptr)
    fn((-(-N // cfg.bn), gy, gz), (cfg.threads,),
       (a, b, bias_arg, res_arg, out, np.int64(M), np.int32(N), np.int32(K), np.int32(m_tiles), np.int32(vec),
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

    def grouped(c, groups, dtype="bfloat16", filt=(3, 3)):
        return ConvProblem.create(nd=2, batch=2, in_spatial=(16, 16), channels=c, out_channels=c, filter_spatial=filt,
                                  stride=1, dilation=1, padding=1, groups=groups, dtype=dtype, layout="NHWC")

    def stem(stride):
        return pad_plan(ConvProblem.create(
            nd=2, batch=2, in_spatial=(16, 16), channels=3, out_channels=64, filter_spatial=(7, 7), stride=stride,
            dilation=1, padding=3, groups=1, dtype="bfloat16", layout="NHWC"))

    defs = [(CONV_SOURCE, conv(64, 256, (3, 3), 1)),               # uniform, 128x256
            (CONV_SOURCE, conv(3, 64, (7, 7), 3)),                 # per-lane, 2-byte copies (stem)
            (CONV_SOURCE, conv(128, 128, (3, 3), 1, groups=32)),   # per-lane, 8-byte copies, 128x16
            (CONV_SOURCE, conv(64, 128, (1, 1), 0, "float16")),    # pointwise, fp16
            # pad_channels: the stem folded (2 pixels of C padded to 4), and a stride-1 7x7 on C padded to 4
            (CONV_SOURCE, conv_variant(stem(2).kernel_problem, "per_lane", w_ld=stem(2).w_ld)[2]),
            (CONV_SOURCE, conv_variant(stem(1).kernel_problem, "per_lane", w_ld=stem(1).w_ld)[2]),
            (PAD_SOURCE, pad_variant(4)[1]),
            (PAD_SOURCE, pad_variant(8)[1]),
            (GROUPED_SOURCE, grouped_variant(grouped(128, 32))[2]),            # ResNeXt 32x4d
            (GROUPED_SOURCE, grouped_variant(grouped(64, 64, "float16"))[2]),  # depthwise, fp16
            (GROUPED_SOURCE, grouped_variant(grouped(8, 8, filt=(7, 7)))[2]),  # depthwise 7x7
            (MATMUL_SOURCE, matmul_variant("bfloat16", 8192, 8192, 8192)[2]),
            (MATMUL_SOURCE, matmul_variant("float16", 7, 13, 5)[2])]
    for arch in ("sm_80", "sm_90a"):
        out += [(src, d, arch) for src, d in defs]
    return out


COMPILE_VARIANTS = _compile_variants()
