"""TMA descriptors (``CUtensorMap``) for the Hopper kernel, encoded with cuda-bindings.

Three descriptors per call (see kernels_cu/sm90/tma_im2col_loader.cuh for how they are read):

* activations ``x`` (N, H, W, C) or, for conv3d, (N, D, H, W, C): im2col mode (rank 4 / rank 5), one box = ``pixels`` output pixels x ``channels``
  channels of one filter tap. :func:`tma_box_params` gives the parameters, derived from the
  problem alone, so CPU tests can replay them through the NumPy box-load model
  (:func:`cuconv.models.tma.tma_im2col_box_load`).
* weights ``w`` (K, [T,] R, S, C) viewed as (K, taps, C): tiled, box {channels, 1 tap, BN filters}.
* residual ``C`` (M, K): tiled, box {64 channels, BM pixels}.

Halo tiles (stride-1 convolutions, kernels_cu/sm90/halo_loader.cuh) replace two of them:
:func:`encode_halo_x` (x as (N, D, H, W, C), tiled, one box = the window of a tile's output rows
plus the filter's halo) and :func:`encode_halo_c` (the residual as (N*O*P, Q, K), box {64, 64, rows}).
Channels-first x read as it is (the ``_cf`` variants) has :func:`encode_cf_x`: x (N, C, D, H, W) viewed as
(W, H, D, C, N), box {64 columns, 1, 1, 64 channels, 1} (one per input row of a window).

All use the 128-byte swizzle and zero out-of-bounds fill. A descriptor reaches the kernel as a
128-byte NumPy void scalar (CuPy passes NumPy scalars as raw bytes), matching the kernel's
``const __grid_constant__ TmaDescriptor`` (alignas(64) 16 x uint64) parameter.

``cuda.bindings`` is imported inside the functions: importing this module is free on machines
without CUDA.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Optional

import numpy as np

from ...models.tma import ConvBoxParams, conv_box_params
from ...problem import ConvProblem

__all__ = ["TmaBoxParams", "tma_box_params", "tma_limits_violation", "encode_im2col_x", "encode_tiled_w",
           "encode_tiled_c", "encode_halo_x", "encode_halo_c", "encode_cf_x", "DESCRIPTOR_DTYPE"]

#: NumPy layout of one CUtensorMap as a kernel argument (128 opaque bytes, 16 x uint64).
DESCRIPTOR_DTYPE = np.dtype([("opaque", np.uint64, (16,))], align=True)

# Hardware limits of cuTensorMapEncodeIm2col / the im2col copy, per tensor rank (nd + 2): the
# pixel-box corners are signed and the per-load im2col offsets unsigned, both with 16 / (rank - 2)
# bits per spatial dim (rank 4 = NHWC: 8 bits; rank 5 = NDHWC: 5 bits).
CORNER_RANGE = {4: (-128, 127), 5: (-16, 15)}
OFFSET_MAX = {4: 255, 5: 31}
ELEMENT_STRIDE_MAX = 8         # traversal (conv) stride
GLOBAL_DIM_MAX = 2 ** 32
GLOBAL_STRIDE_MAX = 2 ** 40
INT32_MAX = 2 ** 31 - 1
_DIM_NAMES = {2: ("H", "W"), 3: ("D", "H", "W")}


@dataclass(frozen=True)
class TmaBoxParams(ConvBoxParams):
    """The im2col descriptor parameters of a conv2d/conv3d problem (what :func:`encode_im2col_x` encodes).

    The convolution's box geometry (:class:`cuconv.models.tma.ConvBoxParams`: corners, element
    strides, one offset tuple per tap, ``start_coord``) plus the box size. Spatial tuples are
    ordered outermost first ((H, W) or (D, H, W)), like the problem; the driver wants them innermost
    first, which the encoder does.
    """

    pixels_per_column: int               # BM, GEMM rows per box
    channels_per_pixel: int              # BK, channels per box


def tma_box_params(problem: ConvProblem, pixels_per_column: int = 128, channels_per_pixel: int = 64) -> TmaBoxParams:
    """Descriptor parameters that make im2col box loads return rows of the implicit-GEMM A matrix.

    The geometry is :func:`cuconv.models.tma.conv_box_params` (the NumPy model's): the access window
    of base coordinates holds exactly the output pixels' window origins, and a tap is reached by the
    per-load offsets (tap index x dilation per dim), which shift the pixel read, not the traversal;
    reads outside the tensor (padding on either side) are zero-filled.
    """
    if problem.nd not in (2, 3):
        raise ValueError(f"problem: tma_box_params covers conv2d and conv3d, got conv{problem.nd}d")
    box = conv_box_params(problem)
    return TmaBoxParams(lower_corner=box.lower_corner, upper_corner=box.upper_corner,
                        element_strides=box.element_strides, tap_offsets=box.tap_offsets,
                        pixels_per_column=pixels_per_column, channels_per_pixel=channels_per_pixel)


def tma_limits_violation(problem: ConvProblem) -> Optional[str]:
    """``None`` when every descriptor of the problem is encodable, else why not (for ``check``)."""
    bp = tma_box_params(problem)
    rank = problem.nd + 2
    names = _DIM_NAMES[problem.nd]
    c_lo, c_hi = CORNER_RANGE[rank]
    for i, (lo, up) in enumerate(zip(bp.lower_corner, bp.upper_corner)):
        for what, v in (("lower", lo), ("upper", up)):
            if not c_lo <= v <= c_hi:
                return (f"TMA im2col {what} pixel-box corner along {names[i]} is {v}, outside the rank-{rank} range "
                        f"{[c_lo, c_hi]} (padding or stride/extent too large)")
    reach = max((f - 1) * d for f, d in zip(problem.filter_spatial, problem.dilation))
    if reach > OFFSET_MAX[rank]:
        return (f"TMA im2col offsets (filter tap x dilation) reach {reach}, above the rank-{rank} limit "
                f"{OFFSET_MAX[rank]}")
    if max(problem.stride) > ELEMENT_STRIDE_MAX:
        return f"stride {problem.stride} exceeds the TMA traversal stride limit {ELEMENT_STRIDE_MAX}"
    N, *spatial, C = problem.x_shape
    K = problem.out_channels
    taps = math.prod(problem.filter_spatial)
    if max(N, *spatial, C, K, taps, problem.gemm_m) > GLOBAL_DIM_MAX:
        return "a tensor dimension exceeds the TMA limit 2^32"
    if math.prod(spatial) * C * problem.itemsize >= GLOBAL_STRIDE_MAX or \
            problem.gemm_k * problem.itemsize >= GLOBAL_STRIDE_MAX:
        return "a tensor stride exceeds the TMA limit 2^40 bytes"
    if problem.gemm_m + 256 > INT32_MAX:  # the last tile's rows (BM <= 256) stay in range too
        return f"GEMM M = {problem.gemm_m} exceeds the kernel's 32-bit coordinate range"
    if max(spatial) * max(problem.stride) + max(problem.pad_lo) > 2 ** 30:
        return "spatial coordinates exceed the kernel's 32-bit coordinate range"
    return None


# --------------------------------------------------------------------------- encoding (needs CUDA)
@functools.lru_cache(maxsize=None)
def cuda_driver():
    """The ``cuda.bindings.driver`` module, initialised (imported on first use)."""
    from cuda.bindings import driver as drv
    (err,) = drv.cuInit(0)
    if int(err) != 0:
        raise RuntimeError(f"cuInit failed: {err}")
    return drv


def _data_type(driver, dtype: str):
    T = driver.CUtensorMapDataType
    return {"float16": T.CU_TENSOR_MAP_DATA_TYPE_FLOAT16, "bfloat16": T.CU_TENSOR_MAP_DATA_TYPE_BFLOAT16}[dtype]


def _as_arg(tmap) -> np.void:
    words = np.asarray([int(v) for v in tmap.opaque], dtype=np.uint64)
    arr = np.zeros((), dtype=DESCRIPTOR_DTYPE)
    arr["opaque"] = words
    return arr[()]


def _check(result, what: str):
    err, tmap = result
    if int(err) != 0:
        raise RuntimeError(f"cuconv: {what} failed: {err}")
    return _as_arg(tmap)


def _u64(driver, values):
    return [driver.cuuint64_t(int(v)) for v in values]


def _u32(driver, values):
    return [driver.cuuint32_t(int(v)) for v in values]


def _enums(driver):
    return (driver.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
            driver.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B,
            driver.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            driver.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)


def encode_im2col_x(problem: ConvProblem, ptr: int, box: Optional[TmaBoxParams] = None) -> np.void:
    """im2col descriptor of the activations at device address ``ptr`` (native NHWC / NDHWC, contiguous).

    Rank 4 for conv2d, rank 5 for conv3d; the driver takes every per-dim list innermost first.
    """
    driver = cuda_driver()
    box = box or tma_box_params(problem)
    dims = list(reversed(problem.x_shape))          # C, W, H, (D,) N
    es = problem.itemsize
    strides = []                                    # byte strides of every dim but the innermost
    acc = es
    for d in dims[:-1]:
        acc *= d
        strides.append(acc)
    inter, swz, l2, oob = _enums(driver)
    return _check(driver.cuTensorMapEncodeIm2col(
        _data_type(driver, problem.dtype), len(dims), ptr, _u64(driver, dims), _u64(driver, strides),
        [int(v) for v in reversed(box.lower_corner)], [int(v) for v in reversed(box.upper_corner)],
        driver.cuuint32_t(box.channels_per_pixel), driver.cuuint32_t(box.pixels_per_column),
        _u32(driver, [1, *reversed(box.element_strides), 1]), inter, swz, l2, oob),
        "cuTensorMapEncodeIm2col (activations)")


def encode_tiled_w(problem: ConvProblem, ptr: int, block_n: int, block_k: int = 64) -> np.void:
    """Tiled descriptor of the filters (K, [T,] R, S, C) viewed as (K, taps, C); box {BK, 1, BN}."""
    driver = cuda_driver()
    K, *filt, C = problem.w_shape
    taps = math.prod(filt)
    es = problem.itemsize
    inter, swz, l2, oob = _enums(driver)
    return _check(driver.cuTensorMapEncodeTiled(
        _data_type(driver, problem.dtype), 3, ptr, _u64(driver, [C, taps, K]),
        _u64(driver, [C * es, taps * C * es]), _u32(driver, [block_k, 1, block_n]), _u32(driver, [1, 1, 1]),
        inter, swz, l2, oob), "cuTensorMapEncodeTiled (filters)")


def encode_mn_w(problem: ConvProblem, ptr: int, mn, block_k: int = 64) -> np.void:
    """Tiled descriptor of a filter read MN-major (SM90_B_MN): the forward weight at ``ptr`` viewed as
    ``(mn.rows, mn.taps, mn.cols)`` (:class:`.params.MnFilter`; output-channel columns contiguous); box
    {64 columns, 1 tap, ``block_k`` rows}, the 128-byte swizzle. Rows past the reduction and columns past
    the view arrive as zeros."""
    driver = cuda_driver()
    inter, swz, l2, oob = _enums(driver)
    es = problem.itemsize
    return _check(driver.cuTensorMapEncodeTiled(
        _data_type(driver, problem.dtype), 3, ptr, _u64(driver, [mn.cols, mn.taps, mn.rows]),
        _u64(driver, [mn.cols * es, mn.taps * mn.cols * es]), _u32(driver, [64, 1, block_k]), _u32(driver, [1, 1, 1]),
        inter, swz, l2, oob), "cuTensorMapEncodeTiled (MN-major filter)")


def encode_tiled_c(problem: ConvProblem, ptr: int, block_m: int = 128, chunk_n: int = 64) -> np.void:
    """Tiled descriptor of the residual (M, K); box {64 channels, BM rows}."""
    driver = cuda_driver()
    M, K = problem.gemm_m, problem.out_channels
    es = problem.itemsize
    inter, swz, l2, oob = _enums(driver)
    return _check(driver.cuTensorMapEncodeTiled(
        _data_type(driver, problem.dtype), 2, ptr, _u64(driver, [K, M]), _u64(driver, [K * es]),
        _u32(driver, [chunk_n, block_m]), _u32(driver, [1, 1]), inter, swz, l2, oob), "cuTensorMapEncodeTiled (residual)")


def encode_halo_x(problem: ConvProblem, ptr: int, cols: int, rows: int, block_k: int = 64) -> np.void:
    """Tiled descriptor of the activations viewed as (N, D, H, W, C) (D = 1 for conv2d); box
    {BK channels, ``cols`` pixels, ``rows`` rows, 1, 1}: a halo tile's input window. Coordinates may
    be negative or run past the edges (padding): those pixels arrive as zeros."""
    driver = cuda_driver()
    N, *spatial, C = problem.x_shape
    D, H, W = (1,) * (3 - problem.nd) + tuple(spatial)
    es = problem.itemsize
    inter, swz, l2, oob = _enums(driver)
    return _check(driver.cuTensorMapEncodeTiled(
        _data_type(driver, problem.dtype), 5, ptr, _u64(driver, [C, W, H, D, N]),
        _u64(driver, [C * es, W * C * es, H * W * C * es, D * H * W * C * es]),
        _u32(driver, [block_k, cols, rows, 1, 1]), _u32(driver, [1, 1, 1, 1, 1]), inter, swz, l2, oob),
        "cuTensorMapEncodeTiled (activations, halo window)")


def cf_x_view(problem: ConvProblem) -> tuple:
    """``(dims, byte strides of dims 1..4)`` of a channels-first x ``(N, C, [D,] H, W)`` (contiguous) as the
    tensor map of :func:`encode_cf_x` sees it, innermost first: (W, H, D, C, N), D = 1 for conv2d, the
    tensor's own stride order. TMA asks that each stride is a multiple of 16 bytes (W a multiple of 8 16-bit
    elements, :func:`.tiles.channels_first_x_decline`)."""
    N, *spatial, C = problem.x_shape
    D, H, W = (1,) * (3 - problem.nd) + tuple(spatial)
    es = problem.itemsize
    return (W, H, D, C, N), (W * es, H * W * es, D * H * W * es, C * D * H * W * es)


def encode_cf_x(problem: ConvProblem, ptr: int, block_k: int = 64, columns: int = 64, swizzle: bool = True) -> np.void:
    """Tiled descriptor of channels-first activations (:func:`cf_x_view`); box {``columns``, 1, 1, ``block_k``
    channels, 1}: one input row of ``block_k`` channel rows. By default 64 columns (128 bytes, swizzled): a
    channels-first window row, wgmma's MN-major A block; ``swizzle`` False: a staged row of the transposing
    variant (``columns`` pixels per channel row, packed). Out-of-tensor coordinates (padding, channels past C)
    arrive as zeros."""
    driver = cuda_driver()
    dims, strides = cf_x_view(problem)
    inter, swz, l2, oob = _enums(driver)
    if not swizzle:
        swz = driver.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_NONE
    return _check(driver.cuTensorMapEncodeTiled(
        _data_type(driver, problem.dtype), 5, ptr, _u64(driver, dims), _u64(driver, strides),
        _u32(driver, [columns, 1, 1, block_k, 1]), _u32(driver, [1, 1, 1, 1, 1]), inter, swz, l2, oob),
        "cuTensorMapEncodeTiled (channels-first activations, " + ("window row)" if swizzle else "staged row)"))


def encode_halo_c(problem: ConvProblem, ptr: int, rows: int, chunk_n: int = 64) -> np.void:
    """Tiled descriptor of the residual viewed as (N*O*P, Q, K); box {64 channels, 64 columns,
    ``rows`` output rows}: the C chunk of a halo tile, in its tile-row order."""
    driver = cuda_driver()
    *planes, Q = problem.out_spatial
    rows_total = problem.batch * math.prod(planes)
    K = problem.out_channels
    es = problem.itemsize
    inter, swz, l2, oob = _enums(driver)
    return _check(driver.cuTensorMapEncodeTiled(
        _data_type(driver, problem.dtype), 3, ptr, _u64(driver, [K, Q, rows_total]), _u64(driver, [K * es, Q * K * es]),
        _u32(driver, [chunk_n, 64, rows]), _u32(driver, [1, 1, 1]), inter, swz, l2, oob),
        "cuTensorMapEncodeTiled (residual, halo tile)")


def placeholder_descriptor() -> np.void:
    """An all-zero descriptor for a kernel parameter that the variant never reads."""
    return np.zeros((), dtype=DESCRIPTOR_DTYPE)[()]
