"""Depthwise (channel-wise) convolution for sm_80+ (sources kernels_cu/depthwise/): ``depthwise_direct``,
a direct memory-bound kernel, 2-D and 3-D (:mod:`.variants` its tile policy, :mod:`.params` the
parameter struct, :mod:`.kernel` the plan and launch), and ``depthwise_mma``, wide filters on tensor
cores (:mod:`.mma_variants`, :mod:`.mma`), and ``depthwise_diag``, narrow filters on tensor cores
(:mod:`.diag_variants`, :mod:`.diag`)."""

from . import diag, kernel, mma  # noqa: F401  (registers the kernels)
