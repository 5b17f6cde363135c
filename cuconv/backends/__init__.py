"""The built-in kernels, one module or package per family; importing this package registers them.

``cpu`` (NumPy), ``generic_gpu`` (im2col + cuBLAS, the CUDA fallback), ``sm90`` (Hopper: ``sm90_tma``,
``conv3d_native``), ``conv3d_qslice`` (conv3d as slices of the Hopper kernel), ``sm80`` (portable
sm_80+: ``sm80_igemm``), ``depthwise`` (sm_80+: ``depthwise_direct``), ``smallc`` (sm_80+: ``smallc_direct``,
few input channels), ``narrowk`` (sm_80+: ``narrowk_direct``, few output channels), ``pointwise`` (sm_80+:
``pointwise_mma``, 1x1 layers with few input or output channels), ``cdna3`` (AMD: ``cdna3_igemm``,
``cdna3_depthwise``). Device-specific code touches CuPy only
inside ``Plan.run``, so importing them on a CPU-only machine is free.
"""

from . import cdna3, conv3d_qslice, cpu, depthwise, generic_gpu, narrowk, pointwise, sm80, sm90, smallc  # noqa: F401
