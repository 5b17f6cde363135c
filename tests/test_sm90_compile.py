"""Every compiled variant of the Hopper kernel (cuconv.backends.sm90.variants.COMPILE_VARIANTS) builds
for sm_90a with NVRTC on the CPU, and its SASS holds what the design says; the list covers every
variant the tile policy can choose.

Per variant: no spills and no stack frame; ptxas honoured ``setmaxnreg`` (no C7508) and did not
serialise the wgmmas (no C7519); the SASS has HGMMA, one commit group per ring slot (only the last
wgmma of a slot sets the scoreboard, no empty wgmma closing a group), the TMA loads of its kind
(im2col boxes, or the 5-D tiled halo window), and multicast filter loads plus cluster barriers
exactly in the CTA-pair variants. cuobjdump comes from PATH or the nvidia-cuda-cuobjdump wheel.
"""

from __future__ import annotations

import dataclasses
import itertools
import subprocess

import pytest

from cuconv.backends.sm90.tiles import TileConfig, tile_config
from cuconv.backends.sm90.variants import ARCH, COMPILE_VARIANTS, SOURCE, defines, kernel_name
from cuconv.overrides import Overrides
from cuconv.problem import Epilogue

from conftest import find_cuobjdump, nvrtc_available
from geometry import problem2d, problem3d


@pytest.mark.skipif(not nvrtc_available(), reason="NVRTC (cuda-bindings) not available")
@pytest.mark.parametrize("source,defines_,arch", COMPILE_VARIANTS, ids=lambda v: str(v))
def test_sm90_variant_compiles_without_spills_and_uses_hgmma_tma(source, defines_, arch):
    from cuconv.compiler import compile_cuda
    path, report = compile_cuda(source, arch, defines_)
    assert report.functions, report.log
    # the entry point is the name the host loads (variants.kernel_name of the same choices)
    cfg = TileConfig(block_m=defines_["SM90_BM"], block_n=defines_["SM90_BN"], block_k=64,
                     stages=defines_["SM90_STAGES"], m_tiles=1, n_tiles=1, grid=1, cluster=defines_["SM90_CLUSTER"],
                     halo=bool(defines_["SM90_HALO"]), pingpong=bool(defines_["SM90_PINGPONG"]),
                     a_cf=bool(defines_.get("SM90_A_CF")), a_xpose=bool(defines_.get("SM90_A_XPOSE")))
    name = kernel_name(cfg, bool(defines_["SM90_HAS_RESIDUAL"]), defines_["SM90_NDIM"],
                       bool(defines_.get("SM90_NCHW_OUT")), bool(defines_.get("SM90_OUT_F32")),
                       bool(defines_.get("SM90_TF32")), bool(defines_.get("SM90_XSPLIT")),
                       bool(defines_.get("SM90_PHASE_OUT")), bool(defines_.get("SM90_B_MN")),
                       bool(defines_.get("SM90_NARROW_OUT")))
    assert [f.name for f in report.functions] == [name], report.log
    assert report.spills == 0 and all(f.stack_frame == 0 for f in report.functions), report.log
    assert "C7508" not in report.log, "setmaxnreg ignored by ptxas:\n" + report.log
    assert "C7519" not in report.log and "serialized" not in report.log, "wgmma serialised by ptxas:\n" + report.log
    exe = find_cuobjdump()
    if exe is None:
        pytest.skip("cuobjdump not found (pip install nvidia-cuda-cuobjdump)")
    sass = subprocess.run([exe, "-sass", path], capture_output=True, text=True, check=True).stdout
    assert "HGMMA" in sass, "no wgmma (HGMMA) in the SASS"
    # each ring slot's wgmmas are one commit group: only the last of a group sets the scoreboard
    # (gsb0), and there is no empty wgmma closing a group. A branch between a slot's wgmmas makes each
    # one its own group, and wait_group 1 then drains the slot.
    hgmma = [line for line in sass.splitlines() if "HGMMA" in line]
    assert "HGMMA.64x8x16" not in sass, "ptxas closed a wgmma group with an empty wgmma"
    assert sum("gsb0" in line for line in hgmma) < len(hgmma), "every wgmma is its own commit group"
    if defines_["SM90_HALO"]:  # halo tiles: the window is a tiled 5-D box, no im2col box at all
        assert "UTMALDG.5D" in sass and "IM2COL" not in sass, "halo variant without its 5-D tiled window load"
    else:
        assert "UTMALDG" in sass and "IM2COL" in sass, "no TMA im2col load (UTMALDG...IM2COL) in the SASS"
    if defines_.get("SM90_A_XPOSE"):  # staged rows transposed by ldmatrix.trans + stmatrix into the windows
        assert "LDSM.16.MT88.4" in sass and "STSM.16.M88.4" in sass, \
            "transposing variant without its ldmatrix.trans / stmatrix transpose"
    if defines_.get("SM90_B_MN"):  # the filter as 64 x 64 tiled boxes of a (rows, taps, columns) view, each
        # box's tap read from the table (a read-only global load)
        assert "UTMALDG.3D" in sass and "LDG.E.CONSTANT" in sass, \
            "MN-major filter variant without its 3-D tiled filter boxes at taps read from the table"
    if defines_["SM90_CLUSTER"] > 1:
        assert "UTMALDG.3D.MULTICAST" in sass, "cluster variant without a multicast filter load"
        assert "UCGABAR" in sass, "cluster variant without a cluster barrier"
    else:
        assert "MULTICAST" not in sass


#: Problems whose tile choices span the policy: narrow and wide N, short and tall M, halo and im2col,
#: conv2d and conv3d.
_PROBLEMS = [(problem2d, dict(N=2, H=9, W=11, C=16, K=16)),
             (problem2d, dict(N=64, H=56, W=56, C=64, K=64, R=1, S=1, padding=0)),
             (problem2d, dict(N=4, H=64, W=64, C=64, K=256)), (problem2d, dict(N=8, H=64, W=64, C=64, K=320)),
             (problem2d, dict(N=2, H=20, W=416, C=64, K=96)), (problem2d, dict(N=4, H=120, W=208, C=96, K=192)),
             (problem2d, dict(N=64, H=14, W=14, C=1024, K=256, R=1, S=1, padding=0)),
             (problem3d, dict(N=2, D=10, H=20, W=130, C=64, K=96, padding=((0, 0), (1, 1), (1, 1)))),
             (problem3d, dict(N=1, D=6, H=32, W=64, C=64, K=128))]
_SETTINGS = [Overrides(), Overrides(halo=True), Overrides(halo=False), Overrides(cluster=2),
             Overrides(halo=True, pingpong=True), Overrides(halo=True, cluster=2)] + [
    Overrides(block_n=bn, block_m=bm, halo=halo)
    for bn, bm, halo in itertools.product((64, 96, 128, 160, 192, 256), (128, 192, 256), (False, True))] + [
    Overrides(halo=True, pingpong=True, block_n=bn) for bn in (64, 96, 128, 160, 192, 256)]


@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_compile_list_covers_every_chosen_variant(dtype, residual):
    """Whatever the policy picks (automatic or forced) is in the list the compile test builds."""
    listed = {tuple(sorted(d.items())) for s, d, a in COMPILE_VARIANTS if s == SOURCE and a == ARCH}
    ep = Epilogue(has_residual=True) if residual else Epilogue()
    seen = set()
    for (make, kw), o in itertools.product(_PROBLEMS, _SETTINGS):
        p = make(dtype=dtype, epilogue=ep, **kw)
        cfg = tile_config(p, 132, o)
        key = tuple(sorted(defines(cfg, dtype, residual, p.nd).items()))
        assert key in listed, (p.describe(), o, cfg)
        seen.add((cfg.halo, cfg.pingpong, cfg.cluster))
    want = {(False, False, 1), (True, False, 1), (False, False, 2), (True, False, 2)}
    assert want | ({(True, True, 1)} if not residual else set()) <= seen, seen


@pytest.mark.parametrize("residual", [False, True])
def test_compile_list_covers_the_float32_variants(residual):
    """The float32-output variants that the split-bf16 plans (bf16 parts) and the tf32 plans (the 16-bit
    view of float32 operands: twice the channels) pick under every setting are in the compile list."""
    listed = {tuple(sorted(d.items())) for s, d, a in COMPILE_VARIANTS if s == SOURCE and a == ARCH}
    ep = Epilogue(has_residual=True) if residual else Epilogue()
    for (make, kw), o in itertools.product(_PROBLEMS, _SETTINGS):
        p = make(dtype="bfloat16", epilogue=ep, **kw)
        split = tile_config(dataclasses.replace(p, channels=3 * p.channels), 132, o, out_f32=True)
        # tf32: tiles chosen as without a residual (its consumers read it; no C ring)
        tf32 = tile_config(dataclasses.replace(p, channels=2 * p.channels, epilogue=Epilogue()), 132, o)
        for cfg, kind in ((split, dict(f32=True)), (tf32, dict(tf32=True))):
            key = tuple(sorted(defines(cfg, "bfloat16", residual, p.nd, **kind).items()))
            assert key in listed, (p.describe(), o, cfg, kind)
