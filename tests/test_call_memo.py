"""Repeated calls (cuconv/api.py ``_signature``): a call whose signature was validated and planned before
reuses that work, and still computes from its own arrays and refuses what a first call would refuse.
CPU (NumPy) arrays: the GPU takes the same path."""

from __future__ import annotations

import numpy as np
import pytest

import cuconv
from cuconv import api

from conftest import random_array


def _operands(seed, shape=(2, 7, 6, 8), k=8, groups=1):
    rng = np.random.default_rng(seed)
    x = random_array(rng, shape, "float32")
    w = random_array(rng, (k, 3, 3, shape[-1] // groups), "float32")
    return x, w


def test_repeated_calls_compute_from_their_own_arrays():
    api._CALLS.clear()
    for seed in range(4):
        x, w = _operands(seed)
        bias = np.full((8,), 0.5 * seed, np.float32)
        got = cuconv.conv2d(x, w, bias, padding=1, activation="relu")
        want = cuconv.reference.conv2d(x, w, bias, padding=1, activation="relu")
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    assert len(api._CALLS) == 1


def test_in_place_residual_and_out_on_repeated_calls():
    x, w = _operands(7)
    for _ in range(3):
        r = np.ones((2, 7, 6, 8), np.float32)
        want = cuconv.reference.conv2d(x, w, residual=r, padding=1, beta=2.0)
        got = cuconv.conv2d(x, w, residual=r, out=r, padding=1, beta=2.0)
        assert got is r
        np.testing.assert_allclose(r, want, rtol=1e-4, atol=1e-4)


def test_nchw_and_strided_inputs_repeat():
    x, w = _operands(9)
    xc = np.ascontiguousarray(np.moveaxis(x, -1, 1))
    wc = np.ascontiguousarray(np.moveaxis(w, -1, 1))
    want = np.moveaxis(cuconv.reference.conv2d(x, w, padding=1), -1, 1)
    for _ in range(2):
        np.testing.assert_allclose(cuconv.conv2d(xc, wc, padding=1, layout="NCHW"), want, rtol=1e-4, atol=1e-4)
    big = np.zeros((2, 7, 6, 16), np.float32)
    big[..., :8] = x
    for _ in range(2):  # a strided view: keyed by its strides, made contiguous on every call
        np.testing.assert_allclose(cuconv.conv2d(big[..., :8], w, padding=1), cuconv.reference.conv2d(x, w, padding=1),
                                   rtol=1e-4, atol=1e-4)


def test_what_a_first_call_refuses_is_refused_after_a_good_one():
    x, w = _operands(3)
    cuconv.conv2d(x, w, padding=1, alpha=1)
    with pytest.raises(TypeError, match="alpha"):
        cuconv.conv2d(x, w, padding=1, alpha=True)
    out = np.empty((2, 7, 6, 8), np.float32)
    cuconv.conv2d(x, w, padding=1, out=out)
    out.flags.writeable = False
    with pytest.raises(ValueError, match="out: expected a writeable array"):
        cuconv.conv2d(x, w, padding=1, out=out)
    with pytest.raises(TypeError, match="w: expected dtype float32"):
        cuconv.conv2d(x, w.astype(np.float16), padding=1)
    with pytest.raises(ValueError, match="layout"):
        cuconv.conv2d(x, w, padding=1, layout=["NHWC"])


def test_overrides_are_part_of_the_signature():
    x, w = _operands(4)
    api._CALLS.clear()
    cuconv.conv2d(x, w, padding=1)
    with cuconv.overrides(block_n=64):
        cuconv.conv2d(x, w, padding=1)
    assert len(api._CALLS) == 2


def test_arguments_the_key_cannot_vouch_for_take_the_full_path():
    x, w = _operands(5)
    api._CALLS.clear()
    cuconv.conv2d(x, w, padding=1, groups=np.int64(1))
    cuconv.conv2d(x, w, padding=(1, np.int64(1)))
    cuconv.conv2d(x, w, padding=[1, np.int64(1)])
    assert len(api._CALLS) == 0


def test_tuples_of_ints_are_keyed_and_still_validated():
    """Geometry written as tuples (``stride=(2, 2)``, ``padding=((1, 0), (0, 1))``, torch's habit) or lists
    is memoised like ints (a list under the key of the tuple it equals); a sequence holding a value
    validation refuses is refused after a good call."""
    x, w = _operands(6)
    api._CALLS.clear()
    for _ in range(2):
        for kw in (dict(stride=(2, 1), padding=(1, 1), dilation=(1, 1)), dict(padding=((1, 0), (0, 1))),
                   dict(stride=[2, 1], padding=[1, 1], dilation=[1, 1]), dict(padding=[[1, 0], (0, 1)])):
            got = cuconv.conv2d(x, w, **kw)
            np.testing.assert_allclose(got, cuconv.reference.conv2d(x, w, **kw), rtol=1e-4, atol=1e-4)
    assert len(api._CALLS) == 2
    with pytest.raises(TypeError, match="stride"):
        cuconv.conv2d(x, w, stride=(2, True), padding=(1, 1), dilation=(1, 1))
    with pytest.raises(TypeError, match="padding"):
        cuconv.conv2d(x, w, padding=((1, 0), (0, 1.0)))
    with pytest.raises(ValueError, match="stride"):
        cuconv.conv2d(x, w, stride=[2, 1, 1], padding=[1, 1], dilation=[1, 1])
    with pytest.raises(ValueError, match="padding"):
        cuconv.conv2d(x, w, padding=((1, 0), (0, -1)))



def _operands_of(xp, dtype, seed, nchw=False):
    rng = np.random.default_rng(seed)
    x = random_array(rng, (2, 9, 10, 16), dtype)
    w = random_array(rng, (32, 3, 3, 16), dtype, scale=0.25)
    b = random_array(rng, (32,), dtype)
    r = random_array(rng, (2, 9, 10, 32), dtype)
    if nchw:
        x, w, r = (np.ascontiguousarray(np.moveaxis(a, -1, 1)) for a in (x, w, r))
    return [xp.asarray(a) for a in (x, w, b, r)], (x, w, b, r)


TERMS = ["plain", "bias", "residual", "out", "residual_in_place", "out_strided", "x_strided"]
REPLAYED = ("plain", "bias", "residual", "out", "residual_in_place")


def _repeat(xp, layout, terms, dtype):
    """A signature called three times with fresh operands (and a fresh ``out``): each result against the
    float64 reference; returns the signature's memo entry."""
    from conftest import TOLERANCE
    nchw = layout == "NCHW"
    api._CALLS.clear()
    for seed in range(3):
        (x, w, b, r), (xh, wh, bh, rh) = _operands_of(xp, dtype, 10 + seed, nchw)
        kw, ref_kw = dict(padding=1, layout=layout), dict(padding=1, layout=layout)
        if terms == "bias":
            kw["bias"], ref_kw["bias"] = b, bh
        if terms in ("residual", "residual_in_place"):
            kw.update(residual=r, beta=0.5)
            ref_kw.update(residual=rh, beta=0.5)
        if terms == "residual_in_place":
            kw["out"] = r
        if terms == "out":
            kw["out"] = xp.empty_like(r)
        if terms == "out_strided":
            kw["out"] = xp.zeros(r.shape[:-1] + (2 * r.shape[-1],), r.dtype)[..., ::2]
        if terms == "x_strided":
            x = xp.stack([x, x], axis=-1)[..., 0]  # a strided view holding x
        want = cuconv.reference.conv2d(
            xh.astype(np.float64), wh.astype(np.float64),
            **{k: (v.astype(np.float64) if isinstance(v, np.ndarray) else v) for k, v in ref_kw.items()})
        got = cuconv.conv2d(x, w, **kw)
        if "out" in kw:
            assert got is kw["out"]
        got = got if xp is np else xp.asnumpy(got)
        err = np.linalg.norm(got.astype(np.float64) - want) / np.linalg.norm(want)
        assert err < TOLERANCE[dtype], (seed, err)
    (known,) = api._CALLS.values()
    return known


@pytest.mark.parametrize("terms", TERMS)
def test_cpu_repeats_replay_where_nothing_is_left_to_decide(terms):
    """NumPy: a repeated channels-last call replays its run unless out is strided (the result is copied
    into it) or x is strided (copied before the run); every result is right."""
    known = _repeat(np, "NHWC", terms, "float32")
    assert (known.replay is not None) == (terms in REPLAYED), terms


def test_cpu_channels_first_repeats_take_the_general_path():
    known = _repeat(np, "NCHW", "plain", "float32")
    assert known.replay is None  # the CPU kernel writes channels-last: the result is moved after the run


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
@pytest.mark.parametrize("terms", TERMS)
def test_gpu_repeats_match_the_reference(cp, layout, terms):
    """CuPy: as on the CPU; a channels-first call replays where its kernel writes channels-first, a strided
    x included (the replay's move of x and w takes any strides)."""
    known = _repeat(cp, layout, terms, "float16")
    if layout == "NHWC":
        replays = terms in REPLAYED
    else:
        replays = (terms in REPLAYED or terms == "x_strided") and known.plan.writes_channels_first
    assert (known.replay is not None) == replays, (terms, layout, known.plan)


def _overlap_case(xp, seed):
    rng = np.random.default_rng(seed)
    x = random_array(rng, (2, 9, 10, 16), "float32")
    w = random_array(rng, (16, 3, 3, 16), "float32", scale=0.25)
    r = random_array(rng, (2, 9, 10, 16), "float32")
    return x, w, r


@pytest.mark.parametrize("how", ["out_is_x", "out_is_x_with_residual_out", "residual_is_x", "out_is_w_image"])
def test_out_sharing_memory_with_an_input_gets_the_reference_result(how):
    """``out`` that is (or overlaps) an array the kernel reads: the result is written apart and copied into
    out, on the first call of the signature and on its repeats (the replay hands such calls back)."""
    _check_overlap(np, how)


@pytest.mark.gpu
@pytest.mark.parametrize("how", ["out_is_x", "out_is_x_with_residual_out", "residual_is_x", "out_is_w_image"])
def test_gpu_out_sharing_memory_with_an_input_gets_the_reference_result(cp, how):
    _check_overlap(cp, how)


def _check_overlap(xp, how):
    api._CALLS.clear()
    for seed in range(3):
        x, w, r = _overlap_case(xp, 30 + seed)
        if how == "out_is_x":
            want = cuconv.reference.conv2d(x, w, padding=1)
            xd = xp.asarray(x)
            got = cuconv.conv2d(xd, xp.asarray(w), padding=1, out=xd)
        elif how == "out_is_x_with_residual_out":  # in place over x, x also the residual
            want = cuconv.reference.conv2d(x, w, padding=1, residual=x, beta=0.5)
            xd = xp.asarray(x)
            got = cuconv.conv2d(xd, xp.asarray(w), padding=1, residual=xd, beta=0.5, out=xd)
        elif how == "residual_is_x":  # the residual is an input, out a separate array
            want = cuconv.reference.conv2d(x, w, padding=1, residual=x)
            xd = xp.asarray(x)
            got = cuconv.conv2d(xd, xp.asarray(w), padding=1, residual=xd, out=xp.empty_like(xd))
        else:  # out is a view of a buffer whose tail holds w (a 1x1 filter, out the first part)
            xs = x[:, :1, :2]  # (2, 1, 2, 16) -> out (2, 1, 2, 16): 64 values; w 16x16 = 256 values
            wf = w[:, 1, 1]
            want = cuconv.reference.conv2d(xs, wf[:, None, None, :])
            buf = xp.zeros(64 + 256, np.float32)
            buf[64:] = xp.asarray(wf).ravel()
            wd = buf[64:].reshape(16, 1, 1, 16)
            out = buf[:64].reshape(2, 1, 2, 16)
            buf2 = xp.zeros(64 + 256, np.float32)  # out overlapping w: w is read from the same buffer
            buf2[:256] = xp.asarray(wf).ravel()
            wd2, out2 = buf2[:256].reshape(16, 1, 1, 16), buf2[192:256].reshape(2, 1, 2, 16)
            got = cuconv.conv2d(xp.asarray(xs), wd, out=out)
            got2 = cuconv.conv2d(xp.asarray(xs), wd2, out=out2)
            np.testing.assert_allclose(got2 if xp is np else xp.asnumpy(got2), want, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(got if xp is np else xp.asnumpy(got), want, rtol=1e-4, atol=1e-4)


def test_kernel_writes_out_only_where_out_meets_no_read():
    """residual_and_output: the kernel writes into a contiguous out unless an array it reads shares
    out's memory; without out it writes a new array."""
    x = np.zeros((4, 8), np.float32)
    out = np.zeros((4, 8), np.float32)

    def target(out_user, reads):
        return api.residual_and_output(np, None, None, out_user, out_user, False, (4, 8), np.float32,
                                       reads=reads)[1]
    assert target(out, (x, None)) is out
    assert target(out, (out[1:],)) is not out
    new = target(None, (out,))  # a new result array: nothing to keep apart
    assert new is not out and not np.may_share_memory(new, out)


def _check_out_is_an_input_elsewhere(xp):
    rng = np.random.default_rng(41)
    dtype = np.float32 if xp is np else np.float16
    a = rng.standard_normal((96, 64)).astype(dtype)
    b = (rng.standard_normal((64, 64)) / 8).astype(dtype)
    want = a.astype(np.float64) @ b.astype(np.float64)
    ad = xp.array(a)
    got = cuconv.matmul(ad, xp.asarray(b), out=ad)  # out is a: the product is written apart, then copied
    got = got if xp is np else xp.asnumpy(got)
    assert np.linalg.norm(got - want) <= 2e-3 * np.linalg.norm(want)
    x = rng.standard_normal((2, 9, 10, 16)).astype(dtype)
    w = (rng.standard_normal((16, 3, 3, 16)) / 12).astype(dtype)
    want = cuconv.conv_transpose2d(x.astype(np.float64), w.astype(np.float64), padding=1)  # float64 on the CPU
    for _ in range(3):  # the first call of the signature and its repeats
        xd = xp.array(x)
        got = cuconv.conv_transpose2d(xd, xp.asarray(w), padding=1, out=xd)
        assert got is xd
        got = got if xp is np else xp.asnumpy(got)
        assert np.linalg.norm(got - want) <= 2e-3 * np.linalg.norm(want)


def test_matmul_and_transposed_convolution_into_an_input():
    """``matmul(a, b, out=a)`` and ``conv_transpose2d(x, w, padding=1, out=x)``: the reference's result."""
    _check_out_is_an_input_elsewhere(np)


@pytest.mark.gpu
def test_gpu_matmul_and_transposed_convolution_into_an_input(cp):
    _check_out_is_an_input_elsewhere(cp)


@pytest.mark.gpu
@pytest.mark.parametrize("layer", ["dense", "depthwise", "nchw"])
def test_gpu_threads_calling_one_layer_get_their_own_results(cp, layer):
    """Host threads calling one layer at once (as dask's threaded scheduler does): they share its plan,
    launch records and argument tables; every result has the bits of the same call made alone."""
    import threading
    rng = np.random.default_rng(5)
    kw = dict(padding=1)
    if layer == "depthwise":
        xs, ws, kw = (2, 12, 12, 64), (64, 3, 3, 1), dict(padding=1, groups=64)
    elif layer == "nchw":
        xs, ws, kw = (2, 64, 12, 12), (64, 64, 3, 3), dict(padding=1, layout="NCHW")
    else:
        xs, ws = (2, 12, 12, 64), (64, 3, 3, 64)
    w = cp.asarray(random_array(rng, ws, "float16", scale=0.1))
    inputs = [cp.asarray(random_array(rng, xs, "float16")) for _ in range(6)]
    alone = [cuconv.conv2d(x, w, **kw) for x in inputs]
    cp.cuda.Device().synchronize()
    bad, errors = [], []

    def worker(i):
        try:
            for _ in range(30):
                y = cuconv.conv2d(inputs[i], w, **kw)
                cp.cuda.get_current_stream().synchronize()
                if not bool((y.view(cp.uint16) == alone[i].view(cp.uint16)).all()):
                    bad.append(i)
        except Exception as e:  # a thread's failure fails the test (pytest only warns of it)
            errors.append(f"thread {i}: {type(e).__name__}: {e}")

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(inputs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert not bad, f"threads {sorted(set(bad))} got another thread's result"


def test_replay_runs_on_its_arrays_device_whatever_device_is_current():
    """The replay's GPU branch with a stand-in array library: where another GPU is current, the output is
    allocated and the plan runs inside that GPU's context; on the arrays' GPU no context is entered."""
    import contextlib
    from types import SimpleNamespace

    current = [0]
    log = []

    @contextlib.contextmanager
    def device(i):
        before, current[0] = current[0], i
        log.append(("enter", i))
        try:
            yield
        finally:
            current[0] = before

    def new(shape, dtype):
        log.append(("new", current[0]))
        return np.empty(shape, dtype)

    fake = SimpleNamespace(ndarray=new, cuda=SimpleNamespace(runtime=SimpleNamespace(getDevice=lambda: current[0]),
                                                             Device=device))
    plan = SimpleNamespace(run=lambda x, w, bias, residual, out: log.append(("run", current[0])))
    replay = api._Replay(plan, None, (1, 2), np.float32, fake, 1)
    y = replay(None, None, None, None, None)
    assert y.shape == (1, 2) and log == [("enter", 1), ("new", 1), ("run", 1)] and current[0] == 0
    log.clear()
    current[0] = 1
    replay(None, None, None, None, None)
    assert log == [("new", 1), ("run", 1)]
