"""Built-in kernels. Importing this package registers them with :mod:`cuconv.dispatch`.

One module per kernel family; each registers its kernels at import. Device-specific modules only
touch CuPy inside ``run``, so importing them on a CPU-only machine is free.
"""

from . import conv3d_qslice, cpu, generic_gpu, hopper_tma  # noqa: F401
from . import rocm  # noqa: F401  (AMD CDNA, HIP; CuPy touched only in run)
from . import sm80  # noqa: F401  (sm_80+ cp.async + mma.sync implicit GEMM; CuPy touched only in run)
