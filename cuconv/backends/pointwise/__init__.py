"""1x1 convolutions (stride 1, no padding) for sm_80+ (sources kernels_cu/pointwise/):
``pointwise_mma``, tensor cores for a short reduction or a narrow output, fp16 / bf16 (:mod:`.variants`
its launch policy and parameter struct, :mod:`.kernel` the plan and launch), and ``pointwise_narrow``,
fp32 multiply-adds with the filter in registers for a few outputs from a few inputs (:mod:`.narrow_variants`,
:mod:`.narrow_kernel`)."""

from . import kernel, narrow_kernel  # noqa: F401  (registers the kernels)
