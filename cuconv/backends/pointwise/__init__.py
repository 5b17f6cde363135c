"""``pointwise_mma``: 1x1 convolutions (stride 1, no padding) whose reduction is short or whose output
is narrow, fp16 / bf16 on tensor cores, for sm_80+ (source kernels_cu/pointwise/). :mod:`.variants` is
the launch policy and parameter struct, :mod:`.kernel` the plan and launch."""

from . import kernel  # noqa: F401  (registers the kernel)
