"""NumPy models of the sm80 paths' data movement, checked against the float64 reference (CPU).

* ``pad_channels``: the pre-pass's copies of x and w (modelled here from :func:`pad_plan`), run as
  the plan's ``kernel_problem``, give the caller's convolution.
* ``grouped_mma``: the prep kernel's permutation of the weights into mma fragments, replayed through
  the mma.sync data flow, gives the grouped product.
"""

import numpy as np
import pytest

import cuconv
from cuconv.backends.sm80.pad import pad_plan
from cuconv.problem import ConvProblem


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
    plan = pad_plan(p)
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
