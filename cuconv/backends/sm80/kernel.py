"""``sm80_igemm``: the portable implicit-GEMM kernel for sm_80+ (A100, RTX 30/40, L4, H100, B200).

cp.async software loaders + ldmatrix + mma.sync m16n8k16 (fp16/bf16 in, fp32 accumulate), source in
kernels_cu/sm80/. On a Hopper it serves what ``sm90_tma`` declines; ``kernel="sm80_igemm"`` forces
it. A plan fixes the path (:mod:`.subpaths`: three loader sub-paths of the implicit GEMM, the
``grouped_mma`` direct kernel, the ``pad_channels`` pre-pass) once per problem.

Copy width: each loader moves ``VEC`` contiguous elements per copy, the largest of 8/4/2 (cp.async
16/8/4 bytes) such that the channel counts (or leading dimension) are multiples of ``VEC`` and the
base pointer is ``2*VEC``-byte aligned; otherwise ``VEC = 1``, a synchronous 16-bit load with zero
for halo lanes. The width depends on the pointers, so it is chosen per call (the variant's
function is loaded once).

CuPy is imported only inside functions: importing this module on a CPU-only machine is free.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from ...compiler import load_cuda_function
from ...launch import PackedLaunch, epilogue_params
from ...models.loader import SUBPATHS, subpath_ok
from ...plan import Declined, Kernel, Plan
from ...problem import ConvProblem
from ...registry import register
from .grouped import GroupedLaunch
from .pad import pad_channels, pad_plan
from .params import INT32_MAX, MAX_LD, epilogue_operands, im2col_geometry, m_grid, out_vec
from .subpaths import choose_subpath
from .variants import (BLOCK_K, CONV_SOURCE, GROUPED_SOURCE, GROUPED_SUPER, PAD_SOURCE, conv_smem, conv_variant,
                       grouped_variant, pad_variant)

__all__ = ["Sm80IgemmKernel", "Sm80Plan", "stage_a_tile", "igemm_launch", "index_range_declined"]


class Sm80IgemmKernel(Kernel):
    """Implicit GEMM with cp.async im2col loaders and mma.sync, for every sm_80+ NVIDIA GPU."""

    name = "sm80_igemm"
    backend = "cuda"
    priority = 50
    spatial_dims = (2,)

    def make_plan(self, problem, device, overrides):
        if device.cc < (8, 0):
            return Declined(f"needs sm_80+ (cp.async, bf16 mma.sync), the GPU is sm_{device.cc[0]}{device.cc[1]}")
        if problem.dtype == "float32":
            return Declined("float32: mma.sync here is fp16/bf16 only; the generic path takes float32")
        declined = index_range_declined(problem)
        if declined is not None:
            return declined
        subpath, why = choose_subpath(problem, overrides.sm80_subpath)
        if subpath is None:
            return Declined(why)
        return Sm80Plan(self, problem, device, subpath, why, f"fp16/bf16 conv2d on sm_80+, {why} loader")


def index_range_declined(problem: ConvProblem, what: str = "") -> Optional[Declined]:
    """The decline of a problem (``what`` names it, e.g. "the 16-bit view's ") whose extents exceed the
    implicit GEMM's 32-bit index arithmetic, or None."""
    big = max(problem.channels, problem.gemm_k, *problem.in_spatial, *problem.out_spatial,
              problem.batch * int(np.prod(problem.in_spatial)))
    if big > INT32_MAX:
        return Declined(f"an extent of {what or 'the problem '}exceeds the kernel's 32-bit index range ({big})")
    if max(problem.channels, problem.gemm_k) > MAX_LD:
        return Declined(f"{what}C = {problem.channels} / R*S*C/groups = {problem.gemm_k} exceeds {MAX_LD}: the "
                        f"loaders' in-tile offsets (256 rows x that leading dimension) are 32-bit")
    return None


class Sm80Plan(Plan):
    """An sm80 plan: the path (``subpath``) and, for ``pad_channels``, the pad layout."""

    def __init__(self, kernel, problem, device, subpath: str, why: str, reason: str):
        super().__init__(kernel, problem, device, reason)
        self.subpath = subpath
        self._why = why
        self.pad = pad_plan(problem) if subpath == "pad_channels" else None
        self._grouped = GroupedLaunch(problem, device) if subpath == "grouped_mma" else None
        self._launches = {}  # operand alignments -> packed implicit-GEMM launch

    def describe(self) -> str:
        problem, subpath, why = self.problem, self.subpath, self._why
        if subpath == "grouped_mma":
            name, sbs, _ = grouped_variant(problem)
            return (f"{name}: {why} path, direct block-diagonal mma.sync over {GROUPED_SUPER}-channel superblocks "
                    f"({problem.groups} groups of {problem.channels_per_group}), {sbs} superblock(s) per CTA, "
                    f"16-byte activation loads; weights packed into mma fragments by a prep kernel each call (both launches packed once per stream)")
        if subpath == "pad_channels":
            plan = self.pad
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

    def compile_jobs(self):
        p = self.problem
        if self.subpath == "grouped_mma":
            return ((GROUPED_SOURCE, grouped_variant(p)[2]),)
        if self.subpath == "pad_channels":
            return ((PAD_SOURCE, pad_variant(self.pad.cp)[1]),
                    (CONV_SOURCE, conv_variant(self.pad.kernel_problem, "per_lane", 0, 0, self.pad.w_ld)[2]))
        return ((CONV_SOURCE, conv_variant(p, self.subpath, 0, 0)[2]),)

    def run(self, x, w, bias, residual, out):
        if self.subpath == "grouped_mma":
            self._grouped(x, w, bias, residual, out)
        elif self.subpath == "pad_channels":
            xp, wp = pad_channels(self.problem, self.pad, x, w, self.device)
            run_igemm(self.pad.kernel_problem, "per_lane", xp, wp, bias, residual, out, self.device,
                      w_ld=self.pad.w_ld)
        else:
            self._run_packed(x, w, bias, residual, out)

    def _run_packed(self, x, w, bias, residual, out):
        """run_igemm's launch, packed once per alignment of the operands' addresses (the copy widths
        depend on it), then only the five addresses change."""
        ep = self.problem.epilogue
        bias_arg, res_arg, _ = epilogue_operands(out, bias, residual, ep)
        ptrs = (x.data.ptr, w.data.ptr, bias_arg.data.ptr, res_arg.data.ptr, out.data.ptr)
        key = tuple(q & 15 for q in ptrs) + (bias is None, res_arg is out)
        launch = self._launches.get(key)
        if launch is None:
            launch = self._launches[key] = igemm_launch(self.problem, self.subpath, x, w, bias, residual, out, self.device)
        launch(*ptrs)


def igemm_launch(problem: ConvProblem, subpath: str, x, w, bias, residual, out, dev, tf32: bool = False) -> PackedLaunch:
    """:func:`run_igemm`'s launch for these operands' alignments, as a :class:`PackedLaunch` whose slots
    are the addresses of x, w, bias, residual and out (absent operands: out's). ``tf32``: ``problem`` is
    the 16-bit view of float32 data, ``x`` and ``w`` its views, bias, residual and out float32
    (:mod:`.tf32`)."""
    name, cfg, defines = conv_variant(problem, subpath, x.data.ptr, w.data.ptr, tf32=tf32)
    smem = conv_smem(cfg, subpath, defines)
    fn = load_cuda_function(CONV_SOURCE, dev, defines, name, smem)
    ep = problem.epilogue
    Kg = problem.gemm_n
    n_tiles = -(-Kg // cfg.bn)
    m_tiles = -(-problem.gemm_m // cfg.bm)
    gy, gz = m_grid(m_tiles)
    _, _, res_ptr = epilogue_operands(out, bias, residual, ep)
    vec = out_vec(problem.out_channels, Kg, out.data.ptr, None if bias is None else bias.data.ptr, res_ptr,
                  itemsize=out.itemsize)
    null = np.uint64(0)
    args = (null, null, null, null, null, im2col_geometry(problem), np.int32(Kg), np.int32(problem.gemm_k),
            np.int32(n_tiles), np.int32(m_tiles), np.int32(vec), epilogue_params(ep))
    return PackedLaunch(fn, (n_tiles * problem.groups, gy, gz), cfg.threads, smem, args, slots=(0, 1, 2, 3, 4))


def run_igemm(problem: ConvProblem, subpath: str, x, w, bias, residual, out, dev, w_ld: Optional[int] = None):
    """Launch the implicit-GEMM kernel on ``subpath`` (pointwise / uniform / per_lane); the filters'
    rows are ``w_ld`` elements apart (default ``R*S*C/groups``)."""
    w_ld = w_ld or problem.gemm_k
    name, cfg, defines = conv_variant(problem, subpath, x.data.ptr, w.data.ptr, w_ld)
    smem = conv_smem(cfg, subpath, defines)
    fn = load_cuda_function(CONV_SOURCE, dev, defines, name, smem)
    ep = problem.epilogue
    K, Kg = problem.out_channels, problem.gemm_n
    n_tiles = -(-Kg // cfg.bn)
    m_tiles = -(-problem.gemm_m // cfg.bm)
    gy, gz = m_grid(m_tiles)
    bias_arg, res_arg, res_ptr = epilogue_operands(out, bias, residual, ep)
    vec = out_vec(K, Kg, out.data.ptr, None if bias is None else bias.data.ptr, res_ptr)
    fn((n_tiles * problem.groups, gy, gz), (cfg.threads,),
       (x, w, bias_arg, res_arg, out, im2col_geometry(problem), np.int32(Kg), np.int32(w_ld), np.int32(n_tiles),
        np.int32(m_tiles), np.int32(vec), epilogue_params(ep)), shared_mem=smem)


def stage_a_tile(x, problem: ConvProblem, m_offset: int, k_offset: int, group: int = 0,
                 subpath: Optional[str] = None):
    """Debug entry: the A tile ``[BM][BK]`` the loader stages for ``(m_offset, k_offset)``, as NumPy.

    Runs the ``<kernel>_stage_a`` entry (one CTA, one ``load_tile``) of the variant ``sm80_igemm``
    would use for ``problem`` (or for ``subpath``); compare with
    :func:`cuconv.models.loader.loader_tile`. ``x`` is the native-layout CuPy input.
    """
    import cupy as cp

    from ...device import device_of
    if subpath is None:
        subpath, why = choose_subpath(problem)
        if subpath not in SUBPATHS:
            raise ValueError(f"subpath: the automatic choice {subpath!r} stages no im2col tile; pass one of {SUBPATHS}")
    elif subpath not in SUBPATHS or not subpath_ok(problem, subpath, BLOCK_K):
        raise ValueError(f"subpath: {subpath!r} cannot serve {problem.describe()}")
    name, cfg, defines = conv_variant(problem, subpath, x.data.ptr)
    smem = conv_smem(cfg, subpath, defines)
    fn = load_cuda_function(CONV_SOURCE, device_of(x), defines, name + "_stage_a", smem)
    tile = cp.empty((cfg.bm, cfg.bk), dtype=x.dtype)
    fn((1,), (cfg.threads,), (x, im2col_geometry(problem), np.int32(group), np.int64(m_offset),
                              np.int64(k_offset), tile), shared_mem=smem)
    return cp.asnumpy(tile)


register(Sm80IgemmKernel())
