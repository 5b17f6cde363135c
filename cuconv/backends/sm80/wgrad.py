"""``sm80_wgrad``: the conv2d weight gradient as one implicit GEMM on sm_80+ (fp16 / bf16, NHWC).

``dw[K][R*S*C/groups] = dy^T @ im2col(x)``: the reduction runs over the ``N*P*Q`` output pixels, the
layout both operands are stored in, so the kernel (kernels_cu/sm80/conv2d_wgrad_sm80.cu) reads both
with ``ldmatrix.trans`` (dy through the linear loader, x through the transposed im2col loader). A
weight gradient has few output tiles and a long reduction, so the pixels are split across CTAs
(:func:`choose_splits`: whole waves of CTAs); each split writes fp32 partial sums to a workspace (a
:mod:`cuconv.scratch` buffer), and a second launch adds them in an order fixed by the split count and
casts. Same bits on every run.

CuPy is imported only inside functions.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Optional

import numpy as np

from ...compiler import load_cuda_function
from ...launch import PackedLaunch, c_struct, divisor_fields, divisor_values, dtype_code, dtype_tag
from ...problem import ConvProblem
from ...scratch import scratch
from .variants import TileConfig, _vec

__all__ = ["WGRAD_SOURCE", "WgradVariant", "WgradLaunch", "declines", "wgrad_config", "wgrad_variant",
           "sm80_variant", "choose_splits", "launch_for", "COMPILE_VARIANTS"]

WGRAD_SOURCE = "sm80/conv2d_wgrad_sm80.cu"
#: Tiles by filters per group: 128 x 128 (warp tiles 64 x 32), 64 x 128 (32 x 32, two CTAs per SM)
#: where ``K/groups <= 64`` would leave half of a 128-row tile empty, 32 x 128 (16 x 32) for 32 or fewer.
_WIDE = TileConfig(128, 128, 4, 2, 4, 1)
_NARROW = TileConfig(64, 128, 4, 2, 4, 2)
_TINY = TileConfig(32, 128, 4, 2, 4, 2)  # K/groups <= 32 (a decoder's 3- or 4-filter output conv)
#: The fewest reduction tiles (of 32 pixels) one split gets: a split's prologue and partial-sum
#: store are amortised over at least this many tiles.
MIN_SPLIT_TILES = 16
#: Bytes of fp32 partial sums that stay in L2 between the main kernel and the reduce (about half of the
#: H100's / H200's 50 MB; the A100 has 40 MB): past them every split's sums go to DRAM and back.
PARTIALS_IN_L2 = 24 << 20
#: Partial-sum bytes moved to DRAM and back in the time of one modelled step of a 128 x 128 x 64 tile
#: (about 0.28 us on an H100 / H200 SM at its bf16 rate, with ~1.5 TB/s of DRAM traffic beside the GEMM).
#: docs/tuning.md#T-wgrad-split-traffic.
SPILL_BYTES_PER_STEP = 420_000
_LIMIT = 2**31 - 4096  # N*P*Q (plus the tiles a mainloop reads past its end) as a 32-bit int


def declines(p: ConvProblem, device) -> Optional[str]:
    """Why the kernel cannot compute ``p``'s weight gradient on ``device`` (None: it can)."""
    if p.nd != 2:
        return "conv3d: the kernel is 2-D"
    if device is None or device.kind != "cuda" or device.cc < (8, 0):
        return "needs an sm_80+ NVIDIA GPU (cp.async, mma.sync)"
    if p.dtype not in ("float16", "bfloat16"):
        return f"{p.dtype}: mma.sync here is fp16/bf16 only"
    if p.gemm_m >= _LIMIT or p.gemm_k >= _LIMIT or p.out_channels * 256 >= _LIMIT:
        return "an extent exceeds the kernel's 32-bit index range"
    return None


def wgrad_config(p: ConvProblem, narrow_copies: bool = False) -> TileConfig:
    """:data:`_TINY` for ``K/groups <= 32``, :data:`_NARROW` for ``<= 64``, else :data:`_WIDE` (the
    filters are the tile's rows: fewer rows waste less of a tile on few filters); one CTA per SM with
    copies of fewer than 4 elements (``narrow_copies``: their unrolled addresses spill at 128
    registers)."""
    cfg = _TINY if p.gemm_n <= 32 else _NARROW if p.gemm_n <= 64 else _WIDE
    return dataclasses.replace(cfg, min_blocks=1) if narrow_copies else cfg


def wgrad_variant(p: ConvProblem, x_ptr: Optional[int] = None, dy_ptr: Optional[int] = None):
    """``(kernel name, TileConfig, defines)``: copies as wide as the channel counts and pointers allow."""
    vec_a = _vec(extents=(p.out_channels, p.gemm_n), pointer=dy_ptr)
    vec_b = _vec(extents=(p.channels, p.channels_per_group), pointer=x_ptr)
    cfg = wgrad_config(p, min(vec_a, vec_b) < 4)
    name = f"conv2d_wgrad_sm80_{dtype_tag(p.dtype)}_{cfg.name}_va{vec_a}_vb{vec_b}"
    defines = dict(cfg.defines(), CUCONV_DTYPE=dtype_code(p.dtype), CUCONV_VEC_A=vec_a, CUCONV_VEC_B=vec_b,
                   CUCONV_KERNEL_NAME=name)
    return name, cfg, defines


@dataclass(frozen=True)
class WgradVariant:
    """One compiled weight-gradient kernel: the ``kernel=`` name it serves (``"sm80_wgrad"`` /
    ``"sm90_wgrad"``), its source, name and defines (a tuple of pairs), CTA tile ``bm x bn x bk``,
    threads, dynamic shared memory and CTAs per SM."""

    kernel: str
    source: str
    name: str
    defines: tuple
    bm: int
    bn: int
    bk: int
    threads: int
    smem: int
    per_sm: int
    tma: bool = False  # TMA boxes and a producer warp (sm90/conv_wgrad_tma_sm90.cu), not cp.async copies


def sm80_variant(p: ConvProblem, x_ptr: Optional[int] = None, dy_ptr: Optional[int] = None) -> WgradVariant:
    """:func:`wgrad_variant` as a :class:`WgradVariant`."""
    name, cfg, defines = wgrad_variant(p, x_ptr, dy_ptr)
    return WgradVariant("sm80_wgrad", WGRAD_SOURCE, name, tuple(sorted(defines.items())), cfg.bm, cfg.bn, cfg.bk,
                        cfg.threads, cfg.ring_bytes(), cfg.min_blocks)


@dataclass(frozen=True)
class Splits:
    """The reduction's split: ``count`` CTAs per output tile, ``length`` pixels each (a multiple of 32);
    ``steps``: its modelled time in reduction tiles of the variant (:func:`choose_splits`' cost)."""

    count: int
    length: int
    tiles: int  # output tiles (all groups)
    steps: float


def choose_splits(p: ConvProblem, v: WgradVariant, sm_count: int) -> Splits:
    """The split count with the shortest modelled time: waves of CTAs (``v.per_sm`` per SM) times
    the reduction tiles of a split plus two for its prologue and partial-sum store, each split at
    least :data:`MIN_SPLIT_TILES` tiles of 32 pixels long, plus the time the splits' fp32 partial sums
    past :data:`PARTIALS_IN_L2` take to reach DRAM and come back for the reduce (ties: fewer splits, less
    workspace traffic). Evidence: docs/tuning.md#T-wgrad-split-traffic."""
    tiles = -(-p.gemm_n // v.bm) * -(-p.gemm_k // v.bn) * p.groups
    k_tiles = -(-p.gemm_m // v.bk)
    per_wave = max(sm_count, 1) * v.per_sm
    min_tiles = max(1, MIN_SPLIT_TILES * 32 // v.bk)
    split_bytes = 4 * p.out_channels * p.gemm_k  # one split's fp32 partial sums (every group)
    step_bytes = SPILL_BYTES_PER_STEP * v.bm * v.bn * v.bk / (128 * 128 * 64)
    best = None
    for count in range(1, max(1, k_tiles // min_tiles) + 1):
        length = -(-k_tiles // count)
        count = -(-k_tiles // length)  # no empty split
        spill = max(0, count * split_bytes - PARTIALS_IN_L2)
        cost = -(-tiles * count // per_wave) * (length + 2) + 2 * spill / step_bytes
        if best is None or cost < best[0]:
            best = (cost, count, length)
    cost, count, length = best
    return Splits(count=count, length=length * v.bk, tiles=tiles, steps=cost)


_FIELDS = [(n, np.int32) for n in (
    "L", "H", "W", "C", "P", "Q", "S", "Cg", "Kg", "K", "cols", "stride_h", "stride_w", "dil_h", "dil_w", "pad_h",
    "pad_w", "split_len", "splits", "m_tiles", "n_tiles")] + divisor_fields("div_q", "div_pq", "div_cg", "div_s")


def _geometry(p: ConvProblem, splits: Splits, m_tiles: int, n_tiles: int) -> np.void:
    (H, W), (P, Q), (_, S) = p.in_spatial, p.out_spatial, p.filter_spatial
    return c_struct(_FIELDS, dict(
        L=p.gemm_m, H=H, W=W, C=p.channels, P=P, Q=Q, S=S, Cg=p.channels_per_group, Kg=p.gemm_n, K=p.out_channels,
        cols=p.gemm_k, stride_h=p.stride[0], stride_w=p.stride[1], dil_h=p.dilation[0], dil_w=p.dilation[1],
        pad_h=p.pad_lo[0], pad_w=p.pad_lo[1], split_len=splits.length, splits=splits.count, m_tiles=m_tiles,
        n_tiles=n_tiles, **divisor_values(div_q=Q, div_pq=P * Q, div_cg=p.channels_per_group, div_s=S)))


class WgradLaunch:
    """The two launches of one problem with one kernel variant on one device, packed once
    (:class:`~cuconv.launch.PackedLaunch`): a call then takes the workspace from scratch and rewrites five
    addresses."""

    def __init__(self, p: ConvProblem, device, v: WgradVariant):
        self.variant = v
        self.problem = p
        defines = dict(v.defines)
        self._fn = load_cuda_function(v.source, device, defines, v.name, v.smem)
        reduce_fn = load_cuda_function(v.source, device, defines, v.name + "_reduce")
        self.splits = choose_splits(p, v, device.sm_count)
        m_tiles, n_tiles = -(-p.gemm_n // v.bm), -(-p.gemm_k // v.bn)
        self.count = p.out_channels * p.gemm_k
        self._grid = (n_tiles, m_tiles, p.groups * self.splits.count)
        self._geometry = _geometry(p, self.splits, m_tiles, n_tiles)
        null = np.uint64(0)
        # split_sum.cuh gives a long sum up to 16 threads (runs of splits): CTAs for 16 threads per 4 elements
        blocks = max(1, min(-(-self.count * 4 // 256), 8 * max(device.sm_count, 1)))
        self._reduce = PackedLaunch(reduce_fn, blocks, 256, 0, (null, null, np.int64(self.count),
                                                                np.int32(self.splits.count)), slots=(0, 1))
        self._main = self._pack((null, null, null, self._geometry), slots=(0, 1, 2))

    def _pack(self, args, slots) -> PackedLaunch:
        """The main kernel's launch with ``args`` (``slots``: the pointer arguments rewritten per call)."""
        v = self.variant
        return PackedLaunch(self._fn, self._grid, v.threads, v.smem, args, slots=slots)

    def _launch_main(self, x, dy, ws) -> None:
        self._main(x.data.ptr, dy.data.ptr, ws.data.ptr)

    @property
    def name(self) -> str:
        return self.variant.name

    def describe(self) -> str:
        v, sp = self.variant, self.splits
        loads = "TMA boxes from a producer warp, " if v.tma else ""
        return (f"{v.name}: tile {v.bm}x{v.bn}x{v.bk}, {loads}{sp.tiles} output tile(s) x {sp.count} split(s) of "
                f"{sp.length} pixels, fp32 partial sums ({4 * sp.count * self.count} bytes) added in a fixed order")

    def __call__(self, x, dy, dw) -> None:
        ws = scratch("weight-gradient partial sums", (self.splits.count * self.count,), np.float32)
        self._launch_main(x, dy, ws)
        self._reduce(ws.data.ptr, dw.data.ptr)


@functools.lru_cache(maxsize=256)
def launch_for(p: ConvProblem, device, v: WgradVariant) -> WgradLaunch:
    """The packed :class:`WgradLaunch` of ``p`` with variant ``v`` (memoised)."""
    return WgradLaunch(p, device, v)


def _compile_variants():
    def problem(c, k, f, dtype, groups=1):
        return ConvProblem.create(nd=2, batch=2, in_spatial=(16, 16), channels=c, out_channels=k, filter_spatial=(f, f),
                                  stride=1, dilation=1, padding=f // 2, groups=groups, dtype=dtype, layout="NHWC")
    probs = [problem(64, 256, 3, "bfloat16"), problem(64, 64, 3, "float16"), problem(3, 64, 7, "bfloat16"),
             problem(12, 20, 3, "bfloat16", groups=2), problem(128, 3, 3, "bfloat16"), problem(64, 16, 3, "float16")]
    return [(WGRAD_SOURCE, wgrad_variant(q)[2], arch) for q in probs for arch in ("sm_80", "sm_90a")]


#: Variants for the CPU compile test: both tiles, both dtypes, 8-, 2- and 4-element copies.
COMPILE_VARIANTS = _compile_variants()
