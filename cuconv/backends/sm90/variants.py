"""The Hopper kernel's compiled variants: names, defines, loading, and the list CI compiles.

A variant is a :class:`~cuconv.backends.sm90.tiles.TileConfig`'s (BM, BN, stages, cluster, halo,
ping-pong) plus the dtype, the rank and whether the residual is read; its kernel name spells all of
them (``conv2d_fprop_sm90_tma_128x256x64_s4_halo_res``). Source: kernels_cu/sm90/conv_fprop_sm90.cu.
"""

from __future__ import annotations


from ...compiler import load_cuda_function
from ...launch import dtype_code
from .tiles import (BLOCK_MS, F32_BLOCK_NS, NARROW_BLOCK_N, STAGES, TileConfig, bm_fits, halo_stages,
                    pingpong_block_m, stages_for)

__all__ = ["SOURCE", "ARCH", "kernel_name", "defines", "load_function", "phase_out_fits", "b_mn_fits",
           "COMPILE_VARIANTS"]

SOURCE = "sm90/conv_fprop_sm90.cu"
ARCH = "sm_90a"


def kernel_name(cfg: TileConfig, loads_residual: bool, nd: int = 2, nchw: bool = False, f32: bool = False,
                tf32: bool = False, xsplit: bool = False, phases: bool = False, b_mn: bool = False,
                narrow: bool = False) -> str:
    """The entry point's name of a variant. ``nchw``: channels-first output; ``f32``: float32 output
    (both read the residual in the consumers: ``_res`` names the epilogue-load warp, which neither has);
    ``tf32``: float32 operands multiplied as tf32, into the float32 output; ``xsplit``: float32 x split
    into bf16 parts in registers against a split filter, into the float32 output; ``phases``: the output columns
    are the stacked phases of an input gradient, stored into place (no residual); ``b_mn``: the filter read
    MN-major, straight from an input gradient's forward weight (``_bmn``); ``narrow``: 16-bit output of any K
    stored value by value from 16-column tiles (``_nk``, ``_nk_nchw`` with ``nchw``; the consumers read the
    residual). ``cfg.a_cf`` (with ``nchw``): x read
    channels-first too, as windows of channel rows (``_cf``); ``cfg.a_xpose``: as staged rows transposed in
    shared memory (``_xp``)."""
    return (f"conv{nd}d_fprop_sm90_tma_{cfg.block_m}x{cfg.block_n}x{cfg.block_k}_s{cfg.stages}"
            + (f"_c{cfg.cluster}" if cfg.cluster > 1 else "") + ("_halo" if cfg.halo else "")
            + ("_pp" if cfg.pingpong else "")
            + ("_xs" if xsplit else "_tf32" if tf32 else "_f32" if f32 else "_nk_nchw" if narrow and nchw
               else "_nk" if narrow else "_ph" if phases else "_cf" if cfg.a_cf
               else "_xp" if cfg.a_xpose else "_nchw" if nchw else "_res" if loads_residual else "") + ("_bmn" if b_mn else ""))


def defines(cfg: TileConfig, dtype: str, loads_residual: bool, nd: int = 2, nchw: bool = False,
            f32: bool = False, tf32: bool = False, xsplit: bool = False, phases: bool = False,
            b_mn: bool = False, narrow: bool = False) -> dict:
    """The ``-D`` values that build a variant (``tf32``, ``xsplit``: ``dtype`` is the 16-bit view, bfloat16)."""
    return _defines(dtype_code(dtype), nd, cfg.block_m, cfg.block_n, cfg.stages,
                    int(loads_residual and not (nchw or f32 or tf32 or xsplit or narrow)), cfg.cluster,
                    int(cfg.halo), int(cfg.pingpong), nchw, f32, tf32, xsplit, phases, b_mn, int(cfg.a_cf),
                    int(cfg.a_xpose), narrow)


def ring_loads_residual(loads_residual: bool, tf32: bool = False, xsplit: bool = False, narrow: bool = False) -> bool:
    """Whether a variant's shared memory holds the C ring: the tf32, split-x and narrow variants' consumers
    read the residual themselves."""
    return loads_residual and not (tf32 or xsplit or narrow)


def load_function(dev_index: int, cfg: TileConfig, dtype: str, loads_residual: bool, nd: int, nchw: bool = False,
                  f32: bool = False, tf32: bool = False, xsplit: bool = False, phases: bool = False,
                  b_mn: bool = False, narrow: bool = False):
    """``(function, dynamic shared memory)`` of a variant, compiled (or taken from the kernel cache) and
    loaded on the device, its shared-memory limit raised."""
    from ...device import gpu_info
    smem = cfg.smem_bytes(ring_loads_residual(loads_residual, tf32, xsplit, narrow))
    fn = load_cuda_function(SOURCE, gpu_info(dev_index),
                            defines(cfg, dtype, loads_residual, nd, nchw, f32, tf32, xsplit, phases, b_mn, narrow),
                            kernel_name(cfg, loads_residual, nd, nchw, f32, tf32, xsplit, phases, b_mn, narrow), smem)
    return fn, smem


def _defines(dt, nd, bm, bn, stages, res, cl, halo, pp=0, nchw=0, f32=0, tf32=0, xsplit=0, phases=0, b_mn=0,
             a_cf=0, a_xpose=0, narrow=0) -> dict:
    d = {"CUCONV_DTYPE": dt, "SM90_NDIM": nd, "SM90_BM": bm, "SM90_BN": bn, "SM90_STAGES": stages,
         "SM90_HAS_RESIDUAL": res, "SM90_CLUSTER": cl, "SM90_HALO": halo, "SM90_PINGPONG": pp}
    if nchw:
        d["SM90_NCHW_OUT"] = 1
    if f32 or tf32 or xsplit:
        d["SM90_OUT_F32"] = 1
    if tf32:
        d["SM90_TF32"] = 1
    if xsplit:
        d["SM90_XSPLIT"] = 1
    if phases:
        d["SM90_PHASE_OUT"] = 1
    if b_mn:
        d["SM90_B_MN"] = 1
    if a_cf:
        d["SM90_A_CF"] = 1
    if a_xpose:
        d["SM90_A_XPOSE"] = 1
    if narrow:
        d["SM90_NARROW_OUT"] = 1
    return d


#: The widest tile (BN) of the phase-scattering epilogue per (BM, halo) of the cooperative consumers: wider
#: tiles spill (`python -m pytest tests/test_compile.py -k SM90_PHASE_OUT` with them added; the 256 x 128 halo
#: tile 4 bytes). Ping-pong tiles all fit.
_PHASE_OUT_MAX_BN = {(128, False): 256, (128, True): 256, (192, False): 192, (192, True): 192, (256, False): 64,
                     (256, True): 64}


def phase_out_fits(cfg: TileConfig) -> bool:
    """Whether the phase-scattering variant of ``cfg`` is built (its consumers fit their registers)."""
    return cfg.cluster == 1 and (cfg.pingpong or cfg.block_n <= _PHASE_OUT_MAX_BN[(cfg.block_m, bool(cfg.halo))])


def b_mn_fits(cfg: TileConfig) -> bool:
    """Whether ``cfg`` has a variant reading the filter MN-major (SM90_B_MN): single CTAs on tiles of whole
    64-column blocks (im2col boxes or halo windows, ping-pong included)."""
    return cfg.cluster == 1 and cfg.block_n % 64 == 0


def _compile_variant(*args, **kw):
    return (SOURCE, _defines(*args, **kw), ARCH)


#: Every (source, defines, arch) the kernel may launch, for the CPU compile test.
COMPILE_VARIANTS = [
    _compile_variant(dt, nd, bm, bn, stages_for(bm, bn, bool(res)), res, cl, 0)
    for nd in (2, 3) for cl in (1, 2) for dt in (0, 1) for bm in BLOCK_MS for bn in STAGES for res in (0, 1)
    if bm_fits(bm, bn, cl, bool(res), halo=False)
] + [
    _compile_variant(dt, nd, bm, bn, halo_stages(bm, bn, bool(res)), res, cl, 1)
    for nd in (2, 3) for cl in (1, 2) for dt in (0, 1) for bm in BLOCK_MS for bn in STAGES for res in (0, 1)
    if bm_fits(bm, bn, cl, bool(res), halo=True)
] + [
    _compile_variant(dt, nd, pingpong_block_m(bn), bn, halo_stages(pingpong_block_m(bn), bn, False), 0, 1, 1, 1)
    for nd in (2, 3) for dt in (0, 1) for bn in STAGES
] + [  # channels-first output: bf16 2-D, single CTAs (the epilogue is the only difference)
    _compile_variant(1, 2, bm, bn, (halo_stages if halo else stages_for)(bm, bn, True), 0, 1, halo, 0, 1)
    for halo in (0, 1) for bm in BLOCK_MS for bn in STAGES if bm_fits(bm, bn, 1, True, halo=bool(halo))
] + [
    _compile_variant(1, 2, pingpong_block_m(bn), bn, halo_stages(pingpong_block_m(bn), bn, False), 0, 1, 1, 1, 1)
    for bn in STAGES
] + [  # channels-first x read as it is (NCHW in and out): 16-bit halo tiles of the channels-first epilogue's
    # heights, single CTAs: bf16 2-D cooperative tiles of every width at 128 rows and the widest at 192 and 256,
    # ping-pong tiles of 64, 128 (also fp16 and 3-D) and 256 columns (every one the policy picks compiles
    # without spills: 52 variants checked on the device, docs/tuning.md T-cf-windows)
    _compile_variant(1, 2, bm, bn, halo_stages(bm, bn, False, True), 0, 1, 1, 0, 1, a_cf=1)
    for bm, bn in [(128, b) for b in STAGES] + [(192, 192), (256, 96)]
] + [
    _compile_variant(dt, nd, pingpong_block_m(bn), bn, halo_stages(pingpong_block_m(bn), bn, False, True), 0, 1, 1, 1,
                     1, a_cf=1)
    for dt, nd, bns in ((1, 2, (64, 128, 256)), (0, 2, (128,)), (1, 3, (128,))) for bn in bns
] + [  # channels-first x staged by rows and transposed in shared memory into channels-last windows (NCHW in
    # and out): the same tiles as the windows of channel rows above
    _compile_variant(1, 2, bm, bn, halo_stages(bm, bn, False, a_xpose=True), 0, 1, 1, 0, 1, a_xpose=1)
    for bm, bn in [(128, b) for b in STAGES] + [(192, 192), (256, 96)]
] + [
    _compile_variant(dt, nd, pingpong_block_m(bn), bn, halo_stages(pingpong_block_m(bn), bn, False, a_xpose=True),
                     0, 1, 1, 1, 1, a_xpose=1)
    for dt, nd, bns in ((1, 2, (64, 128, 256)), (0, 2, (128,)), (1, 3, (128,))) for bn in bns
] + [  # float32 output (the split-bf16 float32 path): bf16, 128-row tiles of at most 128 columns
    # (promotion doubles the accumulators: tiles.F32_BLOCK_NS), whole and halo tiles, single CTAs and pairs
    _compile_variant(1, nd, 128, bn, stages, 0, cl, halo, 0, 0, 1)
    for nd in (2, 3) for cl in (1, 2) for halo in (0, 1) for bn in F32_BLOCK_NS
    for stages in sorted({(halo_stages if halo else stages_for)(128, bn, res) for res in (False, True)})
] + [  # narrow 16-bit output (any K, 16-column tiles, the consumers read the residual): both dtypes, 2-D and
    # 3-D, whole and halo tiles of every height, single CTAs; channels-first output bf16 2-D
    _compile_variant(dt, nd, bm, NARROW_BLOCK_N, (halo_stages if halo else stages_for)(bm, NARROW_BLOCK_N, False),
                     0, 1, halo, nchw=nchw, narrow=1)
    for dt in (0, 1) for nd in (2, 3) for nchw in (0, 1) for halo in (0, 1) for bm in BLOCK_MS
    if not nchw or (dt, nd) == (1, 2)
] + [  # tf32 (float32 operands as 16-bit pairs, float32 output, no promotion): every tile of the 16-bit
    # kernel without a C ring (its consumers read the residual)
    _compile_variant(1, nd, bm, bn, (halo_stages if halo else stages_for)(bm, bn, False), 0, cl, halo, tf32=1)
    for nd in (2, 3) for cl in (1, 2) for halo in (0, 1) for bm in BLOCK_MS for bn in STAGES
    if bm_fits(bm, bn, cl, False, halo=bool(halo))
] + [
    _compile_variant(1, nd, pingpong_block_m(bn), bn, halo_stages(pingpong_block_m(bn), bn, False), 0, 1, 1, 1,
                     tf32=1)
    for nd in (2, 3) for bn in STAGES
] + [  # float32 x split in registers (the split-bf16 float32 path where C is a multiple of 16): the float32
    # output's tiles, without a C ring (its consumers read the residual)
    _compile_variant(1, nd, 128, bn, (halo_stages if halo else stages_for)(128, bn, False), 0, cl, halo, xsplit=1)
    for nd in (2, 3) for cl in (1, 2) for halo in (0, 1) for bn in F32_BLOCK_NS
] + [  # the stacked phases of an input gradient stored into place: 16-bit, single CTAs, no residual
    _compile_variant(dt, nd, bm, bn, (halo_stages if halo else stages_for)(bm, bn, False), 0, 1, halo, phases=1)
    for nd in (2, 3) for dt in (0, 1) for halo in (0, 1) for bm in BLOCK_MS for bn in STAGES
    if bm_fits(bm, bn, 1, False, halo=bool(halo)) and bn <= _PHASE_OUT_MAX_BN[(bm, bool(halo))]
] + [
    _compile_variant(dt, nd, pingpong_block_m(bn), bn, halo_stages(pingpong_block_m(bn), bn, False), 0, 1, 1, 1,
                     phases=1)
    for nd in (2, 3) for dt in (0, 1) for bn in STAGES
] + [  # the filter read MN-major from an input gradient's forward weight (2-D, 16-bit, single CTAs, tiles of
    # whole 64-column blocks, no residual), with and without the phase-scattering epilogue
    _compile_variant(dt, 2, bm, bn, (halo_stages if halo else stages_for)(bm, bn, False), 0, 1, halo, phases=ph,
                     b_mn=1)
    for dt in (0, 1) for ph in (0, 1) for halo in (0, 1) for bm in BLOCK_MS for bn in STAGES
    if bn % 64 == 0 and bm_fits(bm, bn, 1, False, halo=bool(halo))
    and (not ph or bn <= _PHASE_OUT_MAX_BN[(bm, bool(halo))])
] + [
    _compile_variant(dt, 2, pingpong_block_m(bn), bn, halo_stages(pingpong_block_m(bn), bn, False), 0, 1, 1, 1,
                     phases=ph, b_mn=1)
    for dt in (0, 1) for ph in (0, 1) for bn in STAGES if bn % 64 == 0
]
