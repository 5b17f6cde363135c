"""``narrowk_direct``: dense conv2d with few output channels (K <= 8) and many input channels (the
last convolution of a decoder or UNet, prediction heads), a direct kernel with fp32 multiply-adds and
the reduction spread over lanes, for sm_80+ (source kernels_cu/narrowk/). :mod:`.variants` is the
launch policy and parameter struct, :mod:`.kernel` the plan and launch."""

from . import kernel  # noqa: F401  (registers the kernel)
