"""``depthwise_direct``: depthwise convolution (``groups == C``, any channel multiplier), conv2d and
conv3d, NHWC / NDHWC, fp16 / bf16 / fp32, on every sm_80+ NVIDIA GPU.

A depthwise layer does R*S (*T) multiply-adds per output element, far too few to feed tensor cores
from an implicit GEMM whose reduction is one channel wide; its speed is set by how fast it moves its
input and output. The kernel (kernels_cu/depthwise/depthwise_fprop.cu) reads each input tile with its
halo into shared memory once and computes from there with fp32 multiply-adds (docs/architecture.md,
"Depthwise").

The grid is persistent: as many CTAs as the GPU holds at once, each taking output tiles in turn with
the next tile's input copied in while it computes the current one. A plan holds the tile shape
(:func:`.variants.dw_config`), and after its first run the loaded function and the launch's packed
arguments (:class:`cuconv.launch.PackedLaunch`), so a repeated call writes five pointers and launches.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from ...compiler import load_cuda_function
from ...launch import PackedLaunch, epilogue_params, resident_blocks
from ...plan import FLOAT32_FFMA, SIXTEEN_BIT, Declined, Kernel, Plan, tf32_note
from ...registry import register
from .params import dw_geometry
from .variants import (DW_SOURCE, DwConfig, depthwise_declined, dw_config, dw_variant, plane_offsets_declined,
                       problem_axes)

__all__ = ["DepthwiseKernel", "DepthwisePlan", "DirectKernel", "DirectPlan", "aligned_operands"]


class DirectKernel(Kernel):
    """The CUDA direct kernels (``depthwise_direct``, ``smallc_direct``, ``narrowk_direct``): sm_80+,
    conv2d and conv3d (``narrowk_direct`` 2-D), fp32 multiply-adds. A subclass says why its design
    declines a problem (:meth:`declined`), picks the launch shape or says why none fits (:meth:`config`)
    and makes the plan (:meth:`plan_for`)."""

    backend = "cuda"
    spatial_dims = (2, 3)
    strategy = "native"
    #: fp32 multiply-adds for every dtype: float32 at precision "float32", and "tf32" more accurately.
    precisions = SIXTEEN_BIT | FLOAT32_FFMA

    def make_plan(self, problem, device, overrides):
        if device.cc < (8, 0):
            return Declined(f"needs sm_80+ (cp.async), the GPU is sm_{device.cc[0]}{device.cc[1]}")
        why_not = self.declined(problem)
        if why_not:
            return Declined(why_not)
        cfg = self.config_for(problem, device)
        if isinstance(cfg, str):
            return Declined(cfg)
        return self.plan_for(problem, device, cfg)

    def config_for(self, problem, device):
        """The launch shape on ``device``: :meth:`config`'s, unless a subclass fits it to the GPU."""
        return self.config(problem)

    def declined(self, problem) -> Optional[str]:  # pragma: no cover - every subclass defines it
        raise NotImplementedError

    def config(self, problem):  # pragma: no cover - every subclass defines it
        raise NotImplementedError

    def plan_for(self, problem, device, cfg):  # pragma: no cover - every subclass defines it
        raise NotImplementedError


class DepthwiseKernel(DirectKernel):
    """Direct depthwise convolution: halo tiles in shared memory, fp32 multiply-adds, fused epilogue."""

    name = "depthwise_direct"
    priority = 110

    def declined(self, problem) -> Optional[str]:
        return depthwise_declined(problem) or plane_offsets_declined(problem)

    def config(self, problem):
        return dw_config(problem)

    def plan_for(self, problem, device, cfg):
        mult = problem.out_channels // problem.channels
        return DepthwisePlan(self, problem, device, cfg,
                             f"depthwise (groups == C = {problem.channels}, multiplier {mult}): a memory-bound "
                             f"direct kernel, each input tile read once into shared memory{tf32_note(problem)}")


class DirectPlan(Plan):
    """A plan of the CUDA direct kernels (``depthwise_direct``, ``smallc_direct``, ``narrowk_direct``): a
    tile shape ``cfg`` (with ``vin`` and ``vec``, the channels of its x and epilogue accesses),
    the compiled variant ``(name, defines)`` of ``source``, and after the first run the packed launch
    (:meth:`_build`) taking x, w, bias, residual and out, whose addresses each call writes."""

    #: The kernel source under kernels_cu/ (set by each subclass).
    source = ""
    #: True where the kernel reads the filter in 16-byte vectors: a filter off that grid is copied first.
    w_vectors = False

    def __init__(self, kernel, problem, device, cfg, variant, reason: str):
        super().__init__(kernel, problem, device, reason)
        self.cfg = cfg
        self.name, self.defines = variant
        self._launch = None
        align_x, align_out = vector_alignments(problem, cfg)
        # byte alignments of the addresses the kernel's vector accesses need: x, w, out (and bias)
        self._alignments = (align_x, self.filter_alignment(), align_out)

    def filter_alignment(self) -> int:
        """The byte alignment of w that the kernel's filter loads need (a filter off it is copied first):
        16 where it reads 16-byte vectors (``w_vectors``), else 1."""
        return 16 if self.w_vectors else 1

    def compile_jobs(self):
        return ((self.source, self.defines),)

    def geometry(self):
        """The kernel's geometry struct for the problem and tile shape (set by each subclass)."""
        raise NotImplementedError

    def launch_grid(self, fn) -> int:
        """CTAs of the launch of the loaded function ``fn``: by default the persistent grid (:meth:`grid`)
        with as many CTAs per SM as the driver's occupancy allows; a kernel with one CTA per tile says so."""
        return self.grid(resident_blocks(fn, self.cfg.threads, self.cfg.smem))

    def grid(self, per_sm: int) -> int:
        """CTAs of the persistent grid: as many as the GPU runs at once (``per_sm`` on each SM), or one
        per work item (output tile) when there are fewer (docs/tuning.md#T-dw-persistent)."""
        return min(self.cfg.tiles(self.problem), per_sm * self.device.sm_count)

    def _build(self) -> PackedLaunch:
        """The loaded function and the launch's packed arguments: five pointer slots (x, w, bias, residual,
        out: each call writes them), the geometry struct and the epilogue's parameters."""
        c = self.cfg
        fn = load_cuda_function(self.source, self.device, self.defines, self.name, c.smem)
        null = np.uint64(0)
        args = (null, null, null, null, null, self.geometry(), epilogue_params(self.problem.epilogue))
        return PackedLaunch(fn, self.launch_grid(fn), c.threads, c.smem, args, slots=(0, 1, 2, 3, 4))

    def run(self, x, w, bias, residual, out):
        launch = self._launch
        if launch is None:
            launch = self._launch = self._build()
        if residual is None:  # every address on the kernel's grid (the usual call): launch as they are
            xa, wa, oa = self._alignments
            xp_, wp, op = x.data.ptr, w.data.ptr, out.data.ptr
            bp = op if bias is None else bias.data.ptr
            if not (xp_ % xa or wp % wa or op % oa or bp % oa):
                launch(xp_, wp, bp, op, op)
                return
        if w.data.ptr % self._alignments[1]:  # a fresh allocation is on every grid
            w = w.copy()
        x, bias, residual, target = aligned_operands(self.problem, self.cfg, x, bias, residual, out)
        op = target.data.ptr  # absent operands: any valid address (the kernel reads them only when flagged)
        launch(x.data.ptr, w.data.ptr, op if bias is None else bias.data.ptr,
               op if residual is None else residual.data.ptr, op)
        if target is not out:
            out[...] = target


class DepthwisePlan(DirectPlan):
    """The tile shape of one depthwise problem, and its packed launch once it has run."""

    source = DW_SOURCE

    def __init__(self, kernel, problem, device, cfg: DwConfig, reason: str):
        super().__init__(kernel, problem, device, cfg, dw_variant(problem, cfg), reason)

    def describe(self) -> str:
        c, p = self.cfg, self.problem
        T, R, S, stride, dil, _ = problem_axes(p)
        depth = f", {T} filter slices in turn" if p.nd == 3 else ""
        return (f"{self.name}: CTA tile {c.tp}x{c.tq} output pixels x {c.cb} channels ({c.threads} threads: "
                f"{c.cv} vectors of {c.vec} channels x {c.tp * c.tqg} pixel groups of {c.qt} along W), input tile "
                f"{c.in_rows}x{c.in_cols}x{c.cin} with halo in shared memory, two buffers ({c.smem} bytes with the taps, "
                f"copies of {c.vin} channels){depth}, {c.tiles(p)} tiles ({c.chunks} chunks x {c.tiles_p}x{c.tiles_q} "
                f"per plane) over a persistent grid of at most as many CTAs as the GPU holds at once")

    def geometry(self):
        return dw_geometry(self.problem, self.cfg)


def vector_alignments(problem, cfg: DwConfig):
    """``(x, out)``: the byte alignments of x's copies (``vin`` channels, or ``copy_elems`` elements for a
    config whose copies are not whole pixels' channels) and of the epilogue's accesses of out, bias and
    residual (``vec`` channels) in the depthwise design's kernels."""
    return getattr(cfg, "copy_elems", cfg.vin) * problem.itemsize, cfg.vec * problem.itemsize


def aligned_operands(problem, cfg: DwConfig, x, bias, residual, out):
    """``(x, bias, residual, target)`` for a launch of the depthwise design (CUDA or HIP): each operand
    itself when its address suits the kernel's vector accesses (x: copies of ``vin`` channels; out,
    bias, residual: ``vec``-wide epilogue accesses), else an aligned copy; ``target`` is what the
    kernel writes (``out``, or an aligned copy of it holding its values, for an in-place residual);
    ``residual`` is None when the epilogue does not read it. The caller copies ``target`` into ``out``
    when they differ, and keeps the returned arrays alive until the launch is queued."""
    align_x, align_out = vector_alignments(problem, cfg)
    if x.data.ptr % align_x:
        x = x.copy()
    target = out if out.data.ptr % align_out == 0 else out.copy()  # a fresh allocation is aligned
    if bias is not None and bias.data.ptr % align_out:
        bias = bias.copy()
    if residual is None or not problem.epilogue.loads_residual:
        residual = None
    elif residual is out:
        residual = target  # in place: the aligned copy holds the residual's values
    elif residual.data.ptr % align_out:
        residual = residual.copy()
    return x, bias, residual, target


register(DepthwiseKernel())
