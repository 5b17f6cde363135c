"""``depthwise_direct``: depthwise convolution (``groups == C``, any channel multiplier), conv2d and
conv3d, NHWC / NDHWC, fp16 / bf16 / fp32, on every sm_80+ NVIDIA GPU.

A depthwise layer does R*S (*T) multiply-adds per output element, far too few to feed tensor cores
from an implicit GEMM whose reduction is one channel wide; its speed is set by how fast it moves its
input and output. The kernel (kernels_cu/depthwise/depthwise_fprop.cu) reads each input tile with its
halo into shared memory once and computes from there with fp32 multiply-adds (docs/architecture.md,
"Depthwise").

A plan holds the tile shape (:func:`.variants.dw_config`), and after its first run the loaded function
and the launch's packed arguments (:class:`cuconv.launch.PackedLaunch`), so a repeated call writes five
pointers and launches.
"""

from __future__ import annotations

import numpy as np

from ...compiler import load_cuda_function
from ...launch import PackedLaunch, epilogue_params
from ...plan import Declined, Kernel, Plan
from ...registry import register
from .params import dw_geometry
from .variants import DW_SOURCE, DwConfig, dw_config, dw_variant, problem_axes

__all__ = ["DepthwiseKernel", "DepthwisePlan"]


class DepthwiseKernel(Kernel):
    """Direct depthwise convolution: halo tiles in shared memory, fp32 multiply-adds, fused epilogue."""

    name = "depthwise_direct"
    backend = "cuda"
    priority = 110
    spatial_dims = (2, 3)
    strategy = "native"

    def make_plan(self, problem, device, overrides):
        if device.cc < (8, 0):
            return Declined(f"needs sm_80+ (cp.async), the GPU is sm_{device.cc[0]}{device.cc[1]}")
        if problem.groups != problem.channels:
            return Declined(f"not depthwise: groups {problem.groups} != C {problem.channels} "
                            f"({problem.channels_per_group} channels per group)")
        extent = max(problem.batch * int(np.prod(problem.in_spatial)) * problem.channels,
                     problem.gemm_m * problem.out_channels)
        if max(*problem.in_spatial, problem.out_channels, problem.batch) >= 2**31 or extent >= 2**62:
            return Declined(f"an extent exceeds the kernel's index range ({extent} elements)")
        cfg = dw_config(problem)
        if isinstance(cfg, str):
            return Declined(cfg)
        mult = problem.out_channels // problem.channels
        return DepthwisePlan(self, problem, device, cfg,
                             f"depthwise (groups == C = {problem.channels}, multiplier {mult}): a memory-bound "
                             f"direct kernel, each input tile read once into shared memory")


class DepthwisePlan(Plan):
    """The tile shape of one depthwise problem, and its packed launch once it has run."""

    def __init__(self, kernel, problem, device, cfg: DwConfig, reason: str):
        super().__init__(kernel, problem, device, reason)
        self.cfg = cfg
        self.name, self.defines = dw_variant(problem, cfg)
        self._launch = None
        #: Bytes of alignment each operand's address needs for the vector accesses (x: input copies;
        #: out / residual / bias: VEC-wide epilogue accesses).
        self._align_x = cfg.vin * problem.itemsize
        self._align_out = cfg.vec * problem.itemsize

    def describe(self) -> str:
        c, p = self.cfg, self.problem
        T, R, S, stride, dil, _ = problem_axes(p)
        depth = f", {T} filter slices in turn" if p.nd == 3 else ""
        return (f"{self.name}: CTA tile {c.tp}x{c.tq} output pixels x {c.cb} channels ({c.threads} threads: "
                f"{c.cv} vectors of {c.vec} channels x {c.tp * c.tqg} pixel groups of {c.qt} along W), input tile "
                f"{c.in_rows}x{c.in_cols}x{c.cin} with halo in shared memory ({c.smem} bytes, copies of {c.vin} "
                f"channels){depth}, grid {c.chunks} chunks x {c.tiles_p}x{c.tiles_q} tiles per plane")

    def compile_jobs(self):
        return ((DW_SOURCE, self.defines),)

    def _build(self):
        p, c = self.problem, self.cfg
        fn = load_cuda_function(DW_SOURCE, self.device, self.defines, self.name, c.smem)
        grid = p.batch * (p.out_spatial[0] if p.nd == 3 else 1) * c.tiles_p * c.tiles_q * c.chunks
        null = np.uint64(0)
        args = (null, null, null, null, null, dw_geometry(p, c), epilogue_params(p.epilogue))
        return PackedLaunch(fn, grid, c.threads, c.smem, args, slots=(0, 1, 2, 3, 4))

    def run(self, x, w, bias, residual, out):
        launch = self._launch
        if launch is None:
            launch = self._launch = self._build()
        ax, ao = self._align_x, self._align_out
        xp = x.data.ptr
        if xp % ax:
            x = x.copy()
            xp = x.data.ptr
        op = out.data.ptr
        target = out
        if op % ao:
            target = out.copy()  # aligned (a fresh allocation); holds the residual when it is `out`
            op = target.data.ptr
        bp = rp = op  # absent operands: any valid address (the kernel reads them only when flagged)
        if bias is not None:
            if bias.data.ptr % ao:
                bias = bias.copy()
            bp = bias.data.ptr
        if residual is not None and self.problem.epilogue.loads_residual:
            if residual is out:
                rp = op
            else:
                if residual.data.ptr % ao:
                    residual = residual.copy()
                rp = residual.data.ptr
        launch(xp, w.data.ptr, bp, rp, op)
        if target is not out:
            out[...] = target
        del x, bias, residual  # copies (if any) stay alive until the launch is queued


register(DepthwiseKernel())
