"""``smallc_direct``: dense convolution with few input channels (network stems), 2-D and 3-D, as a
direct kernel with fp32 multiply-adds for sm_80+ (source kernels_cu/smallc/). :mod:`.variants` is the
tile policy, :mod:`.params` the parameter struct, :mod:`.kernel` the plan and launch."""

from . import kernel  # noqa: F401  (registers the kernel)
