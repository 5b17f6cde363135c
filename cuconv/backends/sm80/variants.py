"""The sm80 kernels' compiled variants: tile configs, copy widths, names, defines, loading.

Sources in kernels_cu/sm80/: the implicit-GEMM conv (``conv2d_fprop_sm80.cu``), ``cuconv.matmul``'s
kernel (``matmul_sm80.cu``), the grouped/depthwise direct kernel (``grouped_mma_sm80.cu``) and the
channel-pad pre-pass (``pad_channels_sm80.cu``). A variant's kernel name spells its choices
(``conv2d_fprop_sm80_uniform_bf16_128x256x32_s4_w2x4_va8_vb8``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

from ...launch import dtype_code, dtype_tag, header_constants
from ...problem import ConvProblem

__all__ = ["TileConfig", "CONFIGS", "SHORT_K_CONFIG", "conv_config", "matmul_config", "conv_variant",
           "matmul_variant", "grouped_variant", "pad_variant", "conv_smem",
           "CONV_SOURCE", "MATMUL_SOURCE", "GROUPED_SOURCE", "PAD_SOURCE", "BLOCK_K", "SMEM_BUDGET"]

CONV_SOURCE = "sm80/conv2d_fprop_sm80.cu"
MATMUL_SOURCE = "sm80/matmul_sm80.cu"
GROUPED_SOURCE = "sm80/grouped_mma_sm80.cu"
PAD_SOURCE = "sm80/pad_channels_sm80.cu"
SMEM_BUDGET = header_constants("sm80/config.cuh")["SM80_SMEM_BUDGET"]
BLOCK_K = 32
GROUPED_SUPER = 32                  # channels per block-diagonal superblock
GROUPED_FRAG_BYTES = 2048           # mma A fragments per (tap, superblock): 4 x 32 lanes x 16 bytes
GROUPED_SBS, GROUPED_OCTETS = 1, 4  # superblocks per CTA, 8-pixel mma columns per warp (docs/tuning.md T-sm80-grouped)
#: A group's filters up to this size are copied with L1 allocation (``_bl1`` variants): every CTA
#: reads the whole filter, so the CTAs of an SM find it in L1 instead of each reading it from L2
#: (docs/tuning.md T-sm80-b-l1).
B_L1_MAX_BYTES = 64 * 1024
_SUBPATH_CODE = {"pointwise": 0, "uniform": 1, "per_lane": 2}


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
#: (docs/tuning.md T-sm80-short-k). Not with 2-byte copies (conv_config).
SHORT_K_CONFIG = TileConfig(64, 64, 4, 2, 2, 4)


def conv_config(problem: ConvProblem, subpath: Optional[str] = None, two_byte: bool = False) -> TileConfig:
    """Heuristic: the narrowest N tile that covers ``K/groups`` (up to 256), so grouped and narrow
    convolutions waste little of the MMA; :data:`SHORT_K_CONFIG` for the per-lane sub-path with a
    short reduction, unless a loader moves copies of 2 or 4 bytes (``two_byte``; there 128x64 is faster,
    docs/tuning.md T-sm80-short-k), which also run one CTA per SM (their values in flight plus the two
    fragment sets spill at the 128 registers of two: 100-232 bytes for the per-lane loader's 4-byte
    copies at 128x64 / 64x64)."""
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


def _vec(*, extents, pointer: Optional[int]) -> int:
    """Largest copy width (elements) dividing every extent with a suitably aligned base pointer."""
    for v in (8, 4, 2):
        if all(e % v == 0 for e in extents) and (pointer is None or pointer % (2 * v) == 0):
            return v
    return 1


def conv_variant(problem: ConvProblem, subpath: str, x_ptr: Optional[int] = None, w_ptr: Optional[int] = None,
                 w_ld: Optional[int] = None, tf32: bool = False):
    """``(kernel name, TileConfig, defines)`` of the conv kernel for ``problem`` on ``subpath``; ``w_ld``
    is the row pitch of the filters (default ``R*S*C/groups``; larger only with zeroed padding).
    ``tf32``: ``problem`` is the bfloat16 view of a float32 one (:mod:`.tf32`): tf32 mma, float32
    epilogue (``CUCONV_TF32``)."""
    vec_a = _vec(extents=(problem.channels, problem.channels_per_group), pointer=x_ptr)
    vec_b = _vec(extents=(w_ld or problem.gemm_k,), pointer=w_ptr)
    cfg = conv_config(problem, subpath, two_byte=min(vec_a, vec_b) <= 2)
    b_l1 = int(vec_b == 8 and problem.gemm_n * (w_ld or problem.gemm_k) * 2 <= B_L1_MAX_BYTES)
    if tf32 and problem.dtype != "bfloat16":
        raise ValueError(f"tf32: the problem is the bfloat16 view of float32 data, got dtype {problem.dtype}")
    name = (f"conv2d_fprop_sm80_{subpath}_{'tf32' if tf32 else dtype_tag(problem.dtype)}_{cfg.name}_va{vec_a}"
            f"_vb{vec_b}" + ("_bl1" if b_l1 else ""))
    defines = dict(cfg.defines(), CUCONV_DTYPE=dtype_code(problem.dtype), CUCONV_SUBPATH=_SUBPATH_CODE[subpath],
                   CUCONV_VEC_A=vec_a, CUCONV_VEC_B=vec_b, CUCONV_B_L1=b_l1, CUCONV_KERNEL_NAME=name)
    if tf32:
        defines["CUCONV_TF32"] = 1
    return name, cfg, defines


def matmul_variant(dtype: str, m: int, n: int, k: int, a_ptr: Optional[int] = None, b_ptr: Optional[int] = None):
    """``(kernel name, TileConfig, defines)`` of the matmul kernel."""
    cfg = matmul_config(m, n)
    vec_a = _vec(extents=(k,), pointer=a_ptr)
    vec_b = _vec(extents=(n,), pointer=b_ptr)
    name = f"matmul_sm80_{dtype_tag(dtype)}_{cfg.name}_va{vec_a}_vb{vec_b}"
    defines = dict(cfg.defines(), CUCONV_DTYPE=dtype_code(dtype), CUCONV_VEC_A=vec_a, CUCONV_VEC_B=vec_b,
                   CUCONV_KERNEL_NAME=name)
    return name, cfg, defines


def grouped_variant(problem: ConvProblem):
    """``(kernel name, superblocks per CTA, defines)`` of the grouped_mma kernel for ``problem``.

    One superblock (32 channels) per CTA, 4 octets (32 pixels) per warp, 2 CTAs per SM (<= 128
    registers): the fastest of the shapes compared in docs/tuning.md T-sm80-grouped."""
    name = f"conv2d_fprop_sm80_grouped_mma_{dtype_tag(problem.dtype)}_sb{GROUPED_SBS}_o{GROUPED_OCTETS}"
    defines = dict(CUCONV_DTYPE=dtype_code(problem.dtype), CUCONV_SBS=GROUPED_SBS, CUCONV_OCTETS=GROUPED_OCTETS,
                   CUCONV_GM_MIN_BLOCKS=2, CUCONV_KERNEL_NAME=name)
    return name, GROUPED_SBS, defines


def pad_variant(cp_: int):
    """``(kernel name, defines)`` of the channel-pad pre-pass to ``cp_`` channels."""
    name = f"pad_channels_sm80_c{cp_}"
    return name, dict(CUCONV_PAD_CP=cp_, CUCONV_KERNEL_NAME=name)


def conv_smem(cfg: TileConfig, subpath: str, defines: dict) -> int:
    """Dynamic shared memory of a conv kernel variant: the RowInfo table only for the im2col loader's
    2-byte copies (:meth:`TileConfig.smem_bytes`)."""
    return cfg.smem_bytes(row_table=subpath != "pointwise" and defines["CUCONV_VEC_A"] == 1)
