"""float32 convolution at precision ``"tf32"`` on Hopper: ``sm90_tf32`` / ``conv3d_native_tf32``.

The Hopper kernel moves bytes: TMA copies 128-byte channel rows into the shared-memory ring and the
wgmma descriptors step 32 bytes of the reduction at a time. A float32 array of C channels is, byte
for byte, a 16-bit array of 2C channels, and 32 bytes of it are the 8 floats of one tf32 wgmma
(``m64nNk8``) where they are the 16 elements of one bf16 wgmma (``m64nNk16``). So a float32
convolution at precision "tf32" is the bf16 kernel's plan for the 16-bit view of its operands, built
with ``SM90_TF32`` (kernels_cu/sm90/wgmma_mainloop.cuh: the tf32 instruction) and the float32
epilogue (float32 bias, residual and output, ``act(alpha * acc + bias + beta * residual)`` in fp32)::

    x (N, H, W, C) float32  --view-->  (N, H, W, 2C) 16-bit   (no copy)
    w (K, R, S, C) float32  --view-->  (K, R, S, 2C) 16-bit   (no copy)
    the Hopper kernel (TMA im2col boxes or halo tiles, warp-specialized wgmma, tf32 products, fp32
    accumulation) --float32 epilogue--> out (N, P, Q, K) float32

No pass over the data precedes the convolution. Each product uses the operands' top 19 bits (the
tensor cores ignore the 13 low mantissa bits: one TF32 product per term, about 1e-3 relative error
on a layer, cuDNN's default for float32 under torch). The view needs 16-byte pixel rows: C a
multiple of 4. Inputs with few channels (an RGB stem) instead have the filter's S columns folded into
their channels (kernels_cu/layout/fold_width.cu on the 16-bit view, as :mod:`.fold` does for 16-bit
data; channels padded to a multiple of 4) when the folded row fits one 32-float block, so that any C
runs there; other channel counts that are not multiples of 4 are declined (``sm90_bf16x3`` pads them).
Precision ``"float32"`` is not served here (``sm90_bf16x3`` computes it to about 4e-6).
"""

from __future__ import annotations

from ...models.fold import padded_channels
from ...plan import Declined
from ...registry import register
from .fold import FoldPlan, fold_width_problem
from ...problem import sixteen_bit_problem
from .kernel import RewritingKernel, RewritingPlan, Sm90TmaConv3d, Sm90TmaKernel

#: The Hopper kernel's channel block in 16-bit elements (32 floats): a width fold must fit one.
_BLOCK = 64

__all__ = ["Sm90Tf32Kernel", "Sm90Tf32Conv3d", "Tf32Plan"]


class Sm90Tf32Kernel(RewritingKernel):
    """conv2d of float32 data at precision "tf32" on Hopper: the 16-bit view, tf32 wgmma, float32 epilogue."""

    name = "sm90_tf32"
    backend = "cuda"
    priority = 110  # above sm90_bf16x3, which also serves "tf32" (more accurately, at about half the speed)
    spatial_dims = (2,)
    precisions = frozenset({("float32", "tf32")})

    def rewrite_plan(self, problem, device, overrides):
        view = sixteen_bit_problem(problem, 2 * problem.channels)
        how = ("float32 operands as 16-bit pairs into the Hopper kernel, one tf32 wgmma product per term "
               "(operands' 13 low mantissa bits dropped), fp32 accumulation and epilogue")
        S, cp_ = problem.filter_spatial[-1], padded_channels(view.channels)
        if problem.nd == 2 and S * cp_ <= _BLOCK and (S > 1 or view.channels % 8):
            # few channels: the filter's columns folded into them (sm90_fold's kernels on the 16-bit view)
            folded = fold_width_problem(view, cp_, "bfloat16", "NHWC")
            inner = self.inner.make_plan(folded, device, overrides, out_f32=True, tf32=True)
            if not inner:
                return Declined(f"the folded 16-bit view ({folded.channels} channels): {inner.reason}")
            return Tf32Plan(self, problem, device, FoldPlan(self, view, device, inner, ""),
                            f"{how}; the filter's {S} columns folded into the {problem.channels} channels "
                            f"(padded to {cp_ // 2})")
        if problem.channels % 4:
            return Declined(f"C={problem.channels} is not a multiple of 4 (the kernel needs 16-byte pixel rows of "
                            f"float32) and its {S} filter columns do not fold into one {_BLOCK // 2}-float block; "
                            f"sm90_bf16x3 pads the channels")
        inner = self.inner.make_plan(view, device, overrides, out_f32=True, tf32=True)
        if not inner:
            return Declined(f"the 16-bit view ({view.channels} channels): {inner.reason}")
        return Tf32Plan(self, problem, device, inner, how)


class Tf32Plan(RewritingPlan):
    """The inner Hopper plan on 16-bit views of x and w (no copies)."""

    def describe(self) -> str:
        return f"tf32 on the 16-bit view of float32 x and w, then {self.inner.describe()}"

    def run(self, x, w, bias, residual, out):
        import cupy as cp
        self.inner.run(x.view(cp.uint16), w.view(cp.uint16), bias, residual, out)


class Sm90Tf32Conv3d(Sm90Tf32Kernel):
    """conv3d of float32 data at precision "tf32" ("native" strategy): the same view on the kernel's 5-D
    boxes or halo windows."""

    name = "conv3d_native_tf32"
    priority = 105
    spatial_dims = (3,)
    strategy = "native"


register(Sm90Tf32Kernel(Sm90TmaKernel()))
register(Sm90Tf32Conv3d(Sm90TmaConv3d()))
