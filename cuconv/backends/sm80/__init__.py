"""Portable sm_80+ backend: ``sm80_igemm`` (conv2d), ``sm80_tf32`` (float32 conv2d at precision "tf32")
and the GPU half of ``cuconv.matmul``.

Modules: :mod:`.subpaths` (which path serves a problem), :mod:`.kernel` (the kernel's plans and
the implicit-GEMM launch), :mod:`.variants` (tile configs, copy widths, compiled variants),
:mod:`.params` (parameter structs), :mod:`.tf32` (float32 as the 16-bit view, tf32 mma), :mod:`.pad` (the
channel-pad pre-pass), :mod:`.grouped`
(grouped / depthwise direct kernel), :mod:`.matmul`, :mod:`.catalog` (the CI compile list).
Device code: kernels_cu/sm80/.
"""

from .kernel import Sm80IgemmKernel, Sm80Plan, stage_a_tile  # noqa: F401  (registers the kernel)
from .subpaths import SM80_SUBPATHS, choose_subpath  # noqa: F401
from .tf32 import Sm80Tf32Kernel  # noqa: F401  (registers the kernel)
