"""Hopper (sm_90a) backend: ``sm90_tma`` (conv2d), ``conv3d_native`` (conv3d), ``sm90_bf16x3`` /
``conv3d_native_bf16x3`` (float32 as split bf16 parts on the same kernel), ``sm90_tf32`` /
``conv3d_native_tf32`` (float32 at precision "tf32": the operands' 16-bit view, tf32 products), and
``sm90_fold`` (few input channels: the filter's width folded into them, on the same kernel),
``sm90_patch`` (non-overlapping patches along W: the fold as a view of x and w, no pass), and
``sm90_wpack`` / ``conv3d_native_wpack`` (8-32 channels: neighbouring pixels packed into 64 channels, on the
same kernel), and ``sm90_grouped`` / ``conv3d_grouped`` (grouped convolutions: each 64-filter tile a dense
convolution over its group's channels, on the same kernel).

Modules, in the order a call uses them: :mod:`.tiles` (the pure tile policy), :mod:`.kernel`
(the kernels' plans and launches), :mod:`.params` (the parameter struct), :mod:`.tensormap`
(TMA descriptors, cuda-bindings), :mod:`.variants` (compiled variants and the CI compile list),
:mod:`.split_precision` (float32 data: the split into bf16 parts, then the kernel's float32-output
variant), :mod:`.tf32` (float32 data as tf32), :mod:`.fold` (the width fold), :mod:`.patch` (the fold as a
view), :mod:`.wpack` (the width pack), :mod:`.grouped` (grouped convolutions). Device code: kernels_cu/sm90/, kernels_cu/precision/,
kernels_cu/layout/fold_width.cu and kernels_cu/layout/gather_index.cu.
"""

from .kernel import Sm90Plan, Sm90TmaConv3d, Sm90TmaKernel  # noqa: F401  (registers the kernels)
from .split_precision import Sm90SplitBf16Conv3d, Sm90SplitBf16Kernel  # noqa: F401  (registers the kernels)
from .fold import Sm90FoldKernel  # noqa: F401  (registers the kernel)
from .patch import Sm90PatchKernel  # noqa: F401  (registers the kernel)
from .tf32 import Sm90Tf32Conv3d, Sm90Tf32Kernel  # noqa: F401  (registers the kernels)
from .wpack import Sm90WPackConv3d, Sm90WPackKernel  # noqa: F401  (registers the kernels)
from .grouped import Sm90GroupedConv3d, Sm90GroupedKernel  # noqa: F401  (registers the kernels)
from .tiles import TileConfig, choose_tile_config, tile_config  # noqa: F401
