"""Portable sm_80+ backend: ``sm80_igemm`` (conv2d) and the GPU half of ``cuconv.matmul``.

Modules: :mod:`.subpaths` (which path serves a problem), :mod:`.kernel` (the kernel's plans and
the implicit-GEMM launch), :mod:`.variants` (tile configs, copy widths, compiled variants),
:mod:`.params` (parameter structs), :mod:`.pad` (the channel-pad pre-pass), :mod:`.grouped`
(grouped / depthwise direct kernel), :mod:`.matmul`, :mod:`.catalog` (the CI compile list).
Device code: kernels_cu/sm80/.
"""

from .kernel import Sm80IgemmKernel, Sm80Plan, stage_a_tile  # noqa: F401  (registers the kernel)
from .subpaths import SM80_SUBPATHS, choose_subpath  # noqa: F401
