"""Which kernel serves depthwise problems on a model AMD device, and why ``cdna3_depthwise`` declines
what it declines (CPU only: plans, no launch).

* On gfx942 and gfx90a, ``dispatch.select`` picks ``cdna3_depthwise`` for depthwise conv2d and conv3d
  (every dtype, odd C, channel multipliers), ahead of ``cdna3_igemm``; dense and grouped convolutions
  still go to ``cdna3_igemm``, and CUDA devices never get the HIP kernel.
* Its plan is the CUDA kernel's policy: the tile of ``dw_config``, the variant of ``dw_variant``.
* It declines, with the reason: a non-CDNA device, a tile over the workgroup's LDS (64 KiB, or what
  the device reports), an input plane over one buffer resource (4 GiB), a grid over 2**32 work-items.
"""

from __future__ import annotations

import dataclasses

import pytest

from cuconv import dispatch
from cuconv.backends.cdna3.depthwise import LDS_LIMIT, Cdna3DepthwiseKernel, hip_dw_config
from cuconv.backends.cdna3.kernel import Cdna3IGemmKernel
from cuconv.backends.depthwise.variants import dw_variant
from cuconv.device import DeviceInfo
from cuconv.overrides import Overrides

from geometry import A100, H100, problem2d, problem3d

MI300 = DeviceInfo(kind="hip", index=0, name="MI300X", arch="gfx942:sramecc+:xnack-", sm_count=304,
                   smem_per_block_optin=65536)
MI250 = DeviceInfo(kind="hip", index=0, name="MI250X", arch="gfx90a", sm_count=110)
RDNA3 = DeviceInfo(kind="hip", index=0, name="RX 7900 XTX", arch="gfx1100", sm_count=96)

DEPTHWISE = {
    "3x3_bf16": problem2d(N=2, H=14, W=14, C=64, K=64, groups=64),
    "3x3_s2_f16": problem2d(N=4, H=56, W=56, C=144, K=144, stride=2, groups=144, dtype="float16"),
    "7x7_f32": problem2d(N=2, H=28, W=28, C=96, K=96, R=7, S=7, padding=3, groups=96, dtype="float32"),
    "odd_c": problem2d(C=7, K=7, groups=7),
    "mult2": problem2d(C=32, K=64, groups=32),
    "mult3_dil2": problem2d(C=5, K=15, groups=5, dilation=2, padding=2, dtype="float32"),
    "conv3d": problem3d(C=32, K=32, groups=32),
}


@pytest.mark.parametrize("device", [MI300, MI250], ids=["gfx942", "gfx90a"])
@pytest.mark.parametrize("key", sorted(DEPTHWISE))
def test_depthwise_problems_pick_cdna3_depthwise(key, device):
    p = DEPTHWISE[key]
    plan, why = dispatch.select(p, device)
    assert why.kernel == "cdna3_depthwise", str(why)
    cfg = hip_dw_config(p, MI300)
    name, defines = dw_variant(p, cfg)
    assert plan.cfg == cfg and plan.name == name and plan.defines == defines
    assert plan.grid * cfg.threads < 2**32 and cfg.smem <= LDS_LIMIT
    assert "memory-bound" in why.reason and "not run on AMD hardware" in why.reason
    assert name in why.detail and f"{cfg.smem} bytes" in why.detail
    if p.nd == 3:
        assert "3 filter slices" in why.detail


def test_priority_above_the_implicit_gemm():
    assert Cdna3DepthwiseKernel.priority > Cdna3IGemmKernel.priority
    assert Cdna3DepthwiseKernel.backend == "hip" and Cdna3DepthwiseKernel.spatial_dims == (2, 3)


def test_other_convolutions_keep_their_kernel():
    dense, grouped = problem2d(C=64, K=64), problem2d(C=64, K=64, groups=16)
    for p in (dense, grouped):
        plan, why = dispatch.select(p, MI300)
        assert why.kernel == "cdna3_igemm", str(why)
        assert "not depthwise" in why.declined["cdna3_depthwise"]
    assert "4 channels per group" in why.declined["cdna3_depthwise"]
    for dev in (H100, A100):  # a CUDA device gets a CUDA depthwise kernel
        _, why = dispatch.select(DEPTHWISE["3x3_bf16"], dev)
        assert why.kernel in ("depthwise_direct", "depthwise_diag") and "runs on hip" in why.declined["cdna3_depthwise"]


def test_declines_other_amd_architectures():
    answer = Cdna3DepthwiseKernel().plan(DEPTHWISE["3x3_bf16"], RDNA3, Overrides())
    assert not answer and "gfx942" in answer.reason and "gfx1100" in answer.reason


def test_tiles_are_sized_for_the_lds():
    # EfficientNet-B0's 5x5 stride-2 layer and MobileNetV2's 3x3 stride-2 C=192: tiles within 64 KiB
    for p in (problem2d(N=32, H=56, W=56, C=144, K=144, R=5, S=5, stride=2, padding=2, groups=144),
              problem2d(N=32, H=28, W=28, C=192, K=192, stride=2, groups=192),
              problem2d(N=32, H=112, W=112, C=96, K=96, stride=2, groups=96, dtype="float32")):
        plan = Cdna3DepthwiseKernel().plan(p, MI300, Overrides())
        assert plan and plan.cfg.smem <= LDS_LIMIT, getattr(plan, "reason", "")
    # a device that reports less LDS per workgroup gets smaller tiles
    small = dataclasses.replace(MI300, smem_per_block_optin=32768)
    p7 = DEPTHWISE["7x7_f32"]
    assert Cdna3DepthwiseKernel().plan(p7, small, Overrides()).cfg.smem <= 32768


def test_declines_a_filter_whose_smallest_tile_is_over_the_lds():
    p = problem2d(N=1, H=300, W=300, C=64, K=64, R=31, S=31, dilation=9, padding=135, groups=64)
    answer = Cdna3DepthwiseKernel().plan(p, MI300, Overrides())
    assert not answer and "shared memory" in answer.reason and str(LDS_LIMIT) in answer.reason


def test_declines_a_plane_over_one_buffer_resource():
    p = problem2d(N=1, H=32768, W=32768, C=4096, K=4096, groups=4096)
    answer = Cdna3DepthwiseKernel().plan(p, MI300, Overrides())
    assert not answer and "4 GiB" in answer.reason and str(32768 * 32768 * 4096 * 2) in answer.reason


def test_declines_a_grid_over_32_bits_of_work_items():
    p = problem2d(N=4096, H=1024, W=1024, C=64, K=64, groups=64)
    cfg = hip_dw_config(p, MI300)
    blocks = p.batch * cfg.tiles_p * cfg.tiles_q * cfg.chunks
    assert blocks < 2**31 and blocks * cfg.threads > 2**32 - 1  # dw_config's 1-D grid bound passes
    answer = Cdna3DepthwiseKernel().plan(p, MI300, Overrides())
    assert not answer and "2**32 - 1 work-items" in answer.reason
