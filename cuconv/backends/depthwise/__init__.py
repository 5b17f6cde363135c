"""``depthwise_direct``: depthwise (channel-wise) convolution, 2-D and 3-D, as a direct memory-bound
kernel for sm_80+ (source kernels_cu/depthwise/). :mod:`.variants` is the tile policy,
:mod:`.params` the parameter struct, :mod:`.kernel` the plan and launch."""

from . import kernel  # noqa: F401  (registers the kernel)
