"""CPU (CI) checks of the sm_80+ kernels: NVRTC compiles for sm_80 and sm_90a with zero spills, the
SASS holds tensor-core MMAs (HMMA) and asynchronous global->shared copies (LDGSTS), the variant
choice, and the NumPy path of ``cuconv.matmul``. No GPU needed.
"""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import cuconv
from cuconv.backends import sm80
from cuconv.launch import fast_divisor
from cuconv.problem import ConvProblem

from conftest import find_cuobjdump, nvrtc_available


needs_nvrtc = pytest.mark.skipif(not nvrtc_available(), reason="NVRTC (cuda-bindings + nvidia-cuda-nvrtc) not installed")


def _problem(c, k, filt, pad, groups=1, stride=1, dtype="bfloat16"):
    return ConvProblem.create(nd=2, batch=2, in_spatial=(16, 16), channels=c, out_channels=k, filter_spatial=filt,
                              stride=stride, dilation=1, padding=pad, groups=groups, dtype=dtype, layout="NHWC")


@needs_nvrtc
@pytest.mark.parametrize("source,defines,arch", sm80.COMPILE_VARIANTS,
                         ids=[f"{d['CUCONV_KERNEL_NAME']}-{a}" for _, d, a in sm80.COMPILE_VARIANTS])
def test_compiles_without_spills_and_uses_tensor_cores(source, defines, arch):
    from cuconv.compiler import compile_cuda
    cubin, report = compile_cuda(source, arch, defines)
    main = report.function(defines["CUCONV_KERNEL_NAME"])
    assert report.spills == 0 and main.stack_frame == 0, report.log
    tool = find_cuobjdump()
    if tool is None:
        pytest.skip("cuobjdump not found (pip install nvidia-cuda-cuobjdump)")
    sass = subprocess.run([tool, "--dump-sass", cubin], capture_output=True, text=True, check=True).stdout
    if source == sm80.PAD_SOURCE:  # the channel-pad pre-pass: no MMA
        assert "HMMA" not in sass
        return
    assert "HMMA.16816.F32" in sass, "no m16n8k16 tensor-core MMA in the SASS"
    if source == sm80.GROUPED_SOURCE:  # fragments from registers / ld.shared, no ldmatrix or cp.async
        assert "LDG.E.128" in sass, "the grouped_mma loads are 16-byte"
        return
    assert "LDSM" in sass, "no ldmatrix in the SASS"
    if defines["CUCONV_VEC_A"] > 1 or defines["CUCONV_VEC_B"] > 1:
        assert "LDGSTS" in sass, "no cp.async (LDGSTS) in the SASS"


def test_subpath_choice_and_forcing():
    assert sm80.choose_subpath(_problem(64, 64, (1, 1), 0))[0] == "pointwise"
    assert sm80.choose_subpath(_problem(64, 64, (3, 3), 1))[0] == "uniform"
    assert sm80.choose_subpath(_problem(3, 64, (7, 7), 3, stride=2))[0] == "pad_channels"
    assert sm80.choose_subpath(_problem(6, 64, (3, 3), 1))[0] == "per_lane"          # even C: 4-byte copies
    assert sm80.choose_subpath(_problem(3, 64, (1, 1), 0))[0] == "pointwise"
    assert sm80.choose_subpath(_problem(128, 128, (3, 3), 1, groups=32))[0] == "grouped_mma"
    assert sm80.choose_subpath(_problem(64, 64, (3, 3), 1, groups=64))[0] == "grouped_mma"   # depthwise
    assert sm80.choose_subpath(_problem(128, 256, (3, 3), 1, groups=32))[0] == "per_lane"  # Cg != Kg
    assert sm80.choose_subpath(_problem(12, 12, (3, 3), 1, groups=3))[0] == "per_lane"     # C % 8 != 0
    assert sm80.choose_subpath(_problem(8, 8, (7, 7), 3, groups=8))[0] == "grouped_mma"
    with sm80.forced_subpath("grouped_mma"):
        sub, why = sm80.choose_subpath(_problem(64, 64, (3, 3), 1))
        assert sub is None and "grouped_mma" in why and "groups > 1" in why
    with sm80.forced_subpath("pad_channels"):
        assert sm80.choose_subpath(_problem(64, 64, (3, 3), 1))[0] is None
        assert sm80.choose_subpath(_problem(5, 8, (3, 3), 1))[0] == "pad_channels"
    with sm80.forced_subpath("per_lane"):
        assert sm80.choose_subpath(_problem(64, 64, (1, 1), 0))[0] == "per_lane"
    with sm80.forced_subpath("uniform"):
        sub, why = sm80.choose_subpath(_problem(3, 64, (3, 3), 1))
        assert sub is None and "uniform" in why
    with pytest.raises(ValueError, match="subpath"):
        with sm80.forced_subpath("bogus"):
            pass


def test_copy_widths_follow_channels_and_alignment():
    assert sm80.conv_variant(_problem(3, 64, (7, 7), 3), "per_lane")[2]["CUCONV_VEC_A"] == 1
    assert sm80.conv_variant(_problem(6, 64, (3, 3), 1), "per_lane")[2]["CUCONV_VEC_A"] == 2
    assert sm80.conv_variant(_problem(128, 128, (3, 3), 1, groups=32), "per_lane")[2]["CUCONV_VEC_A"] == 4
    assert sm80.conv_variant(_problem(64, 64, (3, 3), 1), "uniform")[2]["CUCONV_VEC_A"] == 8
    # a base pointer only 2-byte aligned forces 2-byte copies
    assert sm80.conv_variant(_problem(64, 64, (3, 3), 1), "uniform", x_ptr=2)[2]["CUCONV_VEC_A"] == 1
    name = sm80.conv_variant(_problem(64, 256, (3, 3), 1), "uniform")[0]
    assert name == "conv2d_fprop_sm80_uniform_bf16_128x256x32_s4_w2x4_va8_vb8"


def test_new_paths_variants_and_explain_text():
    p = _problem(128, 128, (3, 3), 1, groups=32)
    name, sbs, d = sm80.grouped_variant(p)
    assert sbs == 1 and name == "conv2d_fprop_sm80_grouped_mma_bf16_sb1_o4" and d["CUCONV_OCTETS"] == 4
    assert d["CUCONV_GM_MIN_BLOCKS"] == 2
    assert 49 * sbs * sm80.GROUPED_FRAG_BYTES <= sm80.SMEM_BUDGET
    assert fast_divisor(1) == (1, 0) and fast_divisor(56) == (((1 << 32) * 8) // 56 + 1, 6)
    assert sm80.padded_channels(_problem(3, 64, (7, 7), 3)) == 4
    assert sm80.padded_channels(_problem(5, 64, (7, 7), 3)) == 8
    k = sm80.Sm80IgemmKernel()
    detail = k.describe(_problem(3, 64, (7, 7), 3, stride=2), None)
    assert "pad_channels" in detail and "3 -> 4" in detail and "per_lane" in detail and "va8" in detail
    assert "folded 2 pixels -> 1 of 8 channels" in detail
    assert "grouped_mma" in k.describe(p, None) and "32 groups of 4" in k.describe(p, None)
    g = sm80.grouped_geometry(p, 8)
    assert g["C"] == 128 and g["Cg"] == 4 and g["out_vec"] == 8 and g["M"] == 2 * 16 * 16
    with pytest.raises(ValueError, match="subpath"):
        sm80.sm80_subpath_ok(p, "bogus")


@pytest.mark.parametrize("d", [1, 2, 3, 7, 56, 112, 3136, 12544, 2**20 + 1, 2**31 - 1])
def test_fast_divisor_divides_every_31_bit_index(d):
    """kernels_cu/common/fast_div.cuh's splits (pixel and tap indices): (umulhi(x, mul) + x) >> shr == x // d."""
    mul, shr = fast_divisor(d)
    assert 0 < mul < 2**32
    rng = np.random.default_rng(d)
    xs = np.concatenate([np.arange(0, min(4 * d + 5, 50000)), rng.integers(0, 2**31, 20000), [2**31 - 1, 2**31 - 1 - d]])
    xs = [int(v) for v in xs if v < 2**31]
    assert all(((((x * mul) >> 32) + x) >> shr) == x // d for x in xs)
    with pytest.raises(ValueError, match="d"):
        fast_divisor(0)


def pad_plan_model(x, w, plan):
    """NumPy model of the pad_channels pre-pass: the copies of x and w that the kernel reads."""
    N, H, W, C = x.shape
    K, R, S, _ = w.shape
    xp = np.zeros((N, H, plan.width, plan.cp))
    cols = np.arange(plan.width) - plan.pad_w
    keep = (cols >= 0) & (cols < W)
    xp[:, :, keep, :C] = x[:, :, cols[keep], :]
    if plan.fold > 1:
        wp = np.zeros((K, R, plan.taps_w, plan.cp))
        wp[:, :, :S, :C] = w
    else:
        wp = np.zeros((K, R * S, plan.cp))
        wp[:, :, :C] = w.reshape(K, R * S, C)
    wp = np.concatenate([wp.reshape(K, -1), np.zeros((K, plan.w_ld - wp[0].size))], axis=1)
    return xp, wp


@pytest.mark.parametrize("c,hw,filt,stride,pad,dil", [
    (3, (20, 20), (7, 7), 2, 3, 1),        # the stem: folded 2 -> 1, 8 channels
    (3, (17, 13), (3, 5), (1, 2), ((1, 0), (2, 1)), 1),
    (1, (16, 16), (4, 4), 4, 0, 1),        # a 4x4 stride-4 patchify: folded 4 -> 1
    (5, (15, 12), (3, 3), 2, 1, 1),        # C 5 -> 8, folded 2 -> 1 of 16 channels
    (3, (15, 15), (7, 7), 1, 3, 1),        # stride 1: channels only, filter rows padded to 8
    (3, (18, 18), (3, 3), 2, 1, 2),        # W dilation: no folding
    (7, (12, 12), (1, 3), (1, 3), (0, 1), 1),
])
def test_pad_plan_reproduces_the_conv(c, hw, filt, stride, pad, dil):
    """The conv the pad_channels kernel runs (``plan.kernel_problem``) on the pre-pass's copies equals
    the caller's conv: checked with the float64 reference on a NumPy model of the copies."""
    rng = np.random.default_rng(c + hw[0])
    p = ConvProblem.create(nd=2, batch=2, in_spatial=hw, channels=c, out_channels=6, filter_spatial=filt,
                           stride=stride, dilation=dil, padding=pad, groups=1, dtype="bfloat16", layout="NHWC")
    plan = sm80.pad_plan(p)
    kp = plan.kernel_problem
    x = rng.standard_normal((2, *hw, c))
    w = rng.standard_normal((6, *filt, c))
    xp, wp = pad_plan_model(x, w, plan)
    assert kp.out_spatial == p.out_spatial and kp.groups == 1 and wp.shape == (6, plan.w_ld)
    assert plan.w_ld % 8 == 0 and kp.channels % 4 == 0 and kp.gemm_k <= plan.w_ld
    assert (plan.fold > 1) == (p.stride[1] > 1 and dil == 1 and p.stride[1] <= filt[1])
    folded_x = xp.reshape(2, hw[0], plan.width // plan.fold, kp.channels)
    folded_w = wp[:, :kp.gemm_k].reshape(6, *kp.filter_spatial, kp.channels)
    kpad = tuple(zip(kp.pad_lo, kp.pad_hi))
    got = cuconv.reference.conv2d(folded_x, folded_w, stride=kp.stride, padding=kpad, dilation=kp.dilation)
    want = cuconv.reference.conv2d(x, w, stride=p.stride, padding=tuple(zip(p.pad_lo, p.pad_hi)), dilation=dil)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def grouped_frags_model(w, C, Cg):
    """NumPy model of the grouped_mma prep kernel: the mma A fragments of every (tap, superblock)."""
    K, taps = w.shape[0], int(np.prod(w.shape[1:-1]))
    wf = w.reshape(K, taps, Cg)
    n_super = -(-C // 32)
    out = np.zeros((taps, n_super, 4, 32, 4, 2), dtype=w.dtype)
    for tap in range(taps):
        for sb in range(n_super):
            for f in range(4):
                mt, ks = f >> 1, f & 1
                for lane in range(32):
                    g, t = lane >> 2, lane & 3
                    for a in range(4):
                        rho = g + 8 * (a & 1)
                        oc = sb * 32 + 4 * (rho & 7) + 2 * mt + (rho >> 3)
                        for h in range(2):
                            k = 2 * t + h + 8 * (a >> 1)
                            ic = sb * 32 + 8 * ((k & 7) >> 1) + 4 * ks + 2 * (k >> 3) + (k & 1)
                            if oc < C and ic < C and oc // Cg == ic // Cg:
                                out[tap, sb, f, lane, a, h] = wf[oc, tap, ic % Cg]
    return out


@pytest.mark.parametrize("C,Cg", [(32, 4), (40, 8), (16, 1), (64, 16)])
def test_grouped_fragment_permutation_reproduces_the_grouped_conv(C, Cg):
    """Replay the kernel's mma data flow in NumPy: B fragments from 16-byte lane loads, A from the
    fragment model, D mapped back to (pixel, channel); must equal the grouped 1-tap product."""
    rng = np.random.default_rng(C + Cg)
    w = rng.standard_normal((C, 1, 1, Cg))
    x = rng.standard_normal((8, C))                      # 8 pixels (one mma N), one tap
    fr = grouped_frags_model(w, C, Cg)
    want = np.zeros((8, C))
    for o in range(C):
        g0 = (o // Cg) * Cg
        want[:, o] = x[:, g0:g0 + Cg] @ w[o, 0, 0]
    got = np.full((8, C), np.nan)
    n_super = fr.shape[1]
    xp = np.zeros((8, n_super * 32))
    xp[:, :C] = x
    for sb in range(n_super):
        acc = np.zeros((2, 32, 4))                        # [mt][lane][d]
        for mt in range(2):
            for ks in range(2):
                A = np.zeros((16, 16))
                B = np.zeros((16, 8))
                for lane in range(32):
                    g, t = lane >> 2, lane & 3
                    for a in range(4):
                        for h in range(2):
                            A[g + 8 * (a & 1), 2 * t + h + 8 * (a >> 1)] = fr[0, sb, 2 * mt + ks, lane, a, h]
                    chans = xp[g, sb * 32 + 8 * t: sb * 32 + 8 * t + 8]   # the lane's 16-byte load
                    B[2 * t:2 * t + 2, g] = chans[4 * ks:4 * ks + 2]       # b0 (k = 2t, 2t+1)
                    B[2 * t + 8:2 * t + 10, g] = chans[4 * ks + 2:4 * ks + 4]  # b1 (k = 2t+8, 2t+9)
                D = A @ B
                for lane in range(32):
                    g, t = lane >> 2, lane & 3
                    acc[mt, lane] += [D[g, 2 * t], D[g, 2 * t + 1], D[g + 8, 2 * t], D[g + 8, 2 * t + 1]]
        for lane in range(32):
            g, t = lane >> 2, lane & 3
            c = sb * 32 + 4 * g
            if c >= C:
                continue
            for pp in range(2):
                got[2 * t + pp, c:c + 4] = [acc[0, lane, pp], acc[0, lane, 2 + pp], acc[1, lane, pp],
                                            acc[1, lane, 2 + pp]]
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_tile_budgets():
    for cfg in sm80.CONFIGS.values():
        assert cfg.smem_bytes(row_table=True) <= 99 * 1024
        assert (cfg.bm // cfg.warps_m) % 16 == 0 and (cfg.bn // cfg.warps_n) % 16 == 0


def test_import_is_cpu_only():
    code = "import sys, cuconv, cuconv.backends.sm80; print('cupy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env=dict(os.environ, PYTHONPATH=str(Path(cuconv.__file__).parent.parent)))
    assert out.stdout.strip() == "False"


# ----------------------------------------------------------------------------- matmul on the CPU
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("m,n,k", [(1, 1, 1), (7, 13, 5), (33, 17, 64)])
def test_matmul_numpy(dtype, m, n, k):
    rng = np.random.default_rng(m + n + k)
    a = rng.standard_normal((m, k)).astype(dtype)
    b = rng.standard_normal((k, n)).astype(dtype)
    bias = rng.standard_normal(n).astype(dtype)
    r = rng.standard_normal((m, n)).astype(dtype)
    got = cuconv.matmul(a, b, bias=bias, residual=r, alpha=0.5, beta=-1.0, activation="silu")
    v = 0.5 * (a.astype(np.float64) @ b.astype(np.float64)) + bias - r.astype(np.float64)
    ref = v / (1 + np.exp(-v))
    assert got.dtype == dtype and got.shape == (m, n)
    tol = 1e-5 if dtype == np.float32 else 2e-3
    assert np.linalg.norm(got.astype(np.float64) - ref) <= tol * np.linalg.norm(ref)
    out = r.copy()
    res = cuconv.matmul(a, b, residual=out, out=out)
    assert res is out
    np.testing.assert_allclose(out.astype(np.float64), a.astype(np.float64) @ b.astype(np.float64) + r,
                               rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("kwargs,exc,match", [
    (dict(a=np.ones((2, 3), np.float32), b=np.ones((4, 2), np.float32)), ValueError, "b: expected 3 rows"),
    (dict(a=np.ones((2, 3, 1), np.float32), b=np.ones((3, 2), np.float32)), ValueError, "a: expected a 2-D"),
    (dict(a=np.ones((2, 3), np.float32), b=np.ones((3, 2), np.float16)), TypeError, "b: expected dtype float32"),
    (dict(a=np.ones((2, 3), np.int32), b=np.ones((3, 2), np.int32)), TypeError, "a: expected dtype"),
    (dict(a=np.ones((2, 3), np.float32), b=np.ones((3, 2), np.float32), bias=np.ones(3, np.float32)),
     ValueError, r"bias: expected shape \(2,\)"),
    (dict(a=np.ones((2, 3), np.float32), b=np.ones((3, 2), np.float32), activation="tanh"), ValueError, "activation"),
    (dict(a=np.ones((2, 3), np.float32), b=np.ones((3, 2), np.float32), alpha="x"), TypeError, "alpha"),
    (dict(a=[[1.0]], b=np.ones((1, 1), np.float32)), TypeError, "a: expected a NumPy or CuPy array"),
])
def test_matmul_validation(kwargs, exc, match):
    a, b = kwargs.pop("a"), kwargs.pop("b")
    with pytest.raises(exc, match=match):
        cuconv.matmul(a, b, **kwargs)


def test_forcing_a_subpath_never_shows_a_stale_explanation():
    """The selection memo's key carries the kernels' settings (the forced sub-path), so an explanation
    memoised under one forced sub-path is not returned under another (or under none)."""
    from cuconv import dispatch
    from cuconv.device import DeviceInfo
    dev = DeviceInfo(kind="cuda", index=0, name="A100 (model)", cc=(8, 0), arch="sm_80", sm_count=108,
                     smem_per_block_optin=166912)
    p = ConvProblem.create(nd=2, batch=1, in_spatial=(4, 4), channels=64, out_channels=64, filter_spatial=(1, 1),
                           stride=1, dilation=1, padding=0, groups=1, dtype="bfloat16", layout="NHWC")
    with sm80.forced_subpath("per_lane"):
        _, forced = dispatch.select(p, dev, forced="sm80_igemm")
    _, auto = dispatch.select(p, dev, forced="sm80_igemm")
    assert "per_lane" in forced.detail and "pointwise" in auto.detail, (forced.detail, auto.detail)
