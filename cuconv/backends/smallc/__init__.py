"""Dense convolution with few input channels (network stems), 2-D and 3-D, for sm_80+ (sources
kernels_cu/smallc/): ``smallc_direct``, a direct kernel with fp32 multiply-adds for short windows
(:mod:`.variants` its tile policy, :mod:`.kernel` the plan and launch), and ``smallc_mma``, tensor cores
fed from the input tile for long ones (:mod:`.mma_variants`, :mod:`.mma`). :mod:`.params` holds both
parameter structs."""

from . import kernel, mma  # noqa: F401  (registers the kernels)
