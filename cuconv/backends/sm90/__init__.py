"""Hopper (sm_90a) backend: ``sm90_tma`` (conv2d) and ``conv3d_native`` (conv3d).

Modules, in the order a call uses them: :mod:`.tiles` (the pure tile policy), :mod:`.kernel`
(the kernels' plans and launches), :mod:`.params` (the parameter struct), :mod:`.tensormap`
(TMA descriptors, cuda-bindings), :mod:`.variants` (compiled variants and the CI compile list).
Device code: kernels_cu/sm90/.
"""

from .kernel import Sm90Plan, Sm90TmaConv3d, Sm90TmaKernel  # noqa: F401  (registers the kernels)
from .tiles import TileConfig, choose_tile_config, tile_config  # noqa: F401
