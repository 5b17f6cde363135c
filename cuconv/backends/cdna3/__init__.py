"""AMD CDNA backend: ``cdna3_igemm`` (gfx942 / gfx90a), device code in kernels_hip/cdna3/.

Modules: :mod:`.kernel` (the kernel's plans), :mod:`.variants` (variant choice, names, hiprtc
loading), :mod:`.params` (the parameter struct). docs/rocm.md says what is verified and how.
"""

from .kernel import Cdna3IGemmKernel, Cdna3Plan  # noqa: F401  (registers the kernel)
