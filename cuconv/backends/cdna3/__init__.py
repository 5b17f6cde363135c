"""AMD CDNA backend (gfx942 / gfx90a): ``cdna3_igemm`` (device code kernels_hip/cdna3/) and
``cdna3_depthwise`` (kernels_hip/depthwise/).

Modules: :mod:`.kernel` (the implicit GEMM's plans), :mod:`.variants` (its variant choice, names, hiprtc
loading), :mod:`.params` (its parameter struct), :mod:`.depthwise` (the depthwise kernel, which shares
the CUDA depthwise kernel's tile policy and struct). docs/rocm.md says what is verified and how.
"""

from .depthwise import Cdna3DepthwiseKernel, Cdna3DepthwisePlan  # noqa: F401  (registers the kernel)
from .kernel import Cdna3IGemmKernel, Cdna3Plan  # noqa: F401  (registers the kernel)
