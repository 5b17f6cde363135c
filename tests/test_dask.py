"""cuconv.dask: the lazy block-by-block convolution of a dask array equals the single-array call.

Bit equality is asserted with the CPU kernel's matrix product replaced by a row-independent one
(:func:`_rowwise_matmul`): OpenBLAS's sgemm rounds an output row differently depending on how many
rows the product has and where the row sits among them, so with BLAS the same pixel computed in a
block of another size can differ in the last bits. Reproduce::

    python -c "import numpy as np; r=np.random.default_rng(0); a=r.standard_normal((1,30,74),'f4'); \
b=r.standard_normal((1,74,50),'f4'); print(np.array_equal(np.matmul(a,b)[:,:1], np.matmul(a[:,:1],b)))"

With the row-independent product every window, padding and epilogue term of every block must be exact
for the bits to agree. With BLAS the results are compared to the single call within float32 rounding
and to :mod:`cuconv.reference` within the library's tolerance.
"""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

da = pytest.importorskip("dask.array", reason="dask is not installed (pip install '.[dask]')")

import cuconv  # noqa: E402
import cuconv.dask as cdask  # noqa: E402
from cuconv.backends import cpu  # noqa: E402

from conftest import DTYPES, assert_close, random_array, rel_error  # noqa: E402


def _rowwise_matmul(a, b):
    """``a @ b`` (float32, stacked) summed tap by tap in order: each row's bits depend on that row only."""
    acc = np.zeros((*a.shape[:-1], b.shape[-1]), np.float32)
    for k in range(a.shape[-1]):
        acc += a[..., k:k + 1] * b[..., k:k + 1, :]
    return acc


@contextlib.contextmanager
def rowwise():
    """The CPU kernel's matmul made row-independent (see the module docstring) inside the block."""
    assert cpu.np is np  # the kernel calls np.matmul
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(np, "matmul", _rowwise_matmul)
        yield


@st.composite
def chunking(draw, n):
    """Chunk lengths summing to ``n``: one chunk, all ones, or random uneven cuts."""
    kind = draw(st.sampled_from(["one", "ones", "cuts"]))
    if kind == "one" or n <= 1:
        return (n,)
    if kind == "ones":
        return (1,) * n
    cuts = sorted(draw(st.sets(st.integers(1, n - 1), min_size=1, max_size=n - 1)))
    return tuple(b - a for a, b in zip([0, *cuts], [*cuts, n]))


@st.composite
def cases(draw, dtypes=("float32",)):
    """A valid conv2d / conv3d call with its dask chunkings."""
    nd = draw(st.sampled_from([2, 3]))
    channels_last = draw(st.booleans())
    layout = {(2, True): "NHWC", (2, False): "NCHW", (3, True): "NDHWC", (3, False): "NCDHW"}[nd, channels_last]
    groups = draw(st.sampled_from([1, 1, 2, 3]))
    C, K = groups * draw(st.integers(1, 3)), groups * draw(st.integers(1, 3))
    top = 9 if nd == 2 else 6
    spatial = tuple(draw(st.integers(1, top)) for _ in range(nd))
    filt = tuple(draw(st.integers(1, 3)) for _ in range(nd))
    stride = tuple(draw(st.integers(1, 3)) for _ in range(nd))
    dilation = tuple(draw(st.integers(1, 2)) for _ in range(nd))
    padding = draw(st.one_of(st.sampled_from(["same", "valid"]), st.integers(0, 2),
                             st.tuples(*[st.tuples(st.integers(0, 4), st.integers(0, 4))] * nd)))
    pairs = {"same": None, "valid": [(0, 0)] * nd}.get(padding) if isinstance(padding, str) else (
        [(padding, padding)] * nd if isinstance(padding, int) else padding)
    if pairs is not None and any(n + lo + hi < (f - 1) * d + 1 for n, (lo, hi), f, d in zip(spatial, pairs, filt, dilation)):
        padding = "same"  # no output pixel otherwise
    N = draw(st.integers(1, 3))
    x_chunks = [draw(chunking(N)), *[draw(chunking(n)) for n in spatial]]
    x_chunks.insert(len(x_chunks) if channels_last else 1, draw(chunking(C)))
    epilogue = dict(alpha=draw(st.sampled_from([1.0, 0.5, 0.0])), beta=draw(st.sampled_from([1.0, -0.5, 0.0])),
                    activation=draw(st.sampled_from([None, "relu", "silu", "gelu"])))
    return dict(nd=nd, layout=layout, groups=groups, C=C, K=K, N=N, spatial=spatial, filt=filt, stride=stride,
                dilation=dilation, padding=padding, x_chunks=tuple(x_chunks), epilogue=epilogue,
                bias=draw(st.booleans()), residual=draw(st.booleans()), dtype=draw(st.sampled_from(dtypes)),
                seed=draw(st.integers(0, 2**31 - 1)), res_chunks=draw(st.data()))


def _operands(case):
    """(x, w, bias, residual and its dask chunking, keyword arguments) of a drawn case, as NumPy."""
    nd, layout, cl = case["nd"], case["layout"], case["layout"].endswith("C")
    rng = np.random.default_rng(case["seed"])
    x_shape = (case["N"], *case["spatial"], case["C"]) if cl else (case["N"], case["C"], *case["spatial"])
    cg = case["C"] // case["groups"]
    w_shape = (case["K"], *case["filt"], cg) if cl else (case["K"], cg, *case["filt"])
    x, w = random_array(rng, x_shape, case["dtype"]), random_array(rng, w_shape, case["dtype"], 0.5)
    bias = random_array(rng, (case["K"],), case["dtype"]) if case["bias"] else None
    kw = dict(stride=case["stride"], padding=case["padding"], dilation=case["dilation"], groups=case["groups"],
              layout=layout, **case["epilogue"])
    conv = cuconv.conv2d if nd == 2 else cuconv.conv3d
    residual = res_chunks = None
    if case["residual"]:
        shape = conv(x, w, bias, **kw).shape
        residual = random_array(rng, shape, case["dtype"])
        res_chunks = tuple(case["res_chunks"].draw(chunking(n)) for n in shape)
    return x, w, bias, residual, res_chunks, kw


def _lazy(case, x, w, bias, residual, res_chunks, kw):
    dconv = cdask.conv2d if case["nd"] == 2 else cdask.conv3d
    res = None if residual is None else da.from_array(residual, chunks=res_chunks)
    return dconv(da.from_array(x, chunks=case["x_chunks"]), w, bias, residual=res, **kw)


@settings(max_examples=100, deadline=None)
@given(case=cases(dtypes=("float32", "float32", "float16", "bfloat16")))
def test_same_bits_as_the_single_call(case):
    x, w, bias, residual, res_chunks, kw = _operands(case)
    conv = cuconv.conv2d if case["nd"] == 2 else cuconv.conv3d
    with rowwise():
        single = conv(x, w, bias, residual=residual, **kw)
        lazy = _lazy(case, x, w, bias, residual, res_chunks, kw)
        assert isinstance(lazy, da.Array) and lazy.shape == single.shape and lazy.dtype == single.dtype
        got = lazy.compute(scheduler="synchronous")
    assert got.dtype == single.dtype
    assert np.array_equal(got, single), f"{case} max diff {np.abs(got.astype(np.float64) - single).max()}"


@settings(max_examples=40, deadline=None)
@given(case=cases())
def test_close_to_the_single_call_and_the_reference_with_blas(case):
    x, w, bias, residual, res_chunks, kw = _operands(case)
    conv = cuconv.conv2d if case["nd"] == 2 else cuconv.conv3d
    ref = (cuconv.reference.conv2d if case["nd"] == 2 else cuconv.reference.conv3d)(x, w, bias, residual=residual,
                                                                                      **kw)
    got = _lazy(case, x, w, bias, residual, res_chunks, kw).compute(scheduler="synchronous")
    assert rel_error(got, conv(x, w, bias, residual=residual, **kw)) <= 1e-6
    assert_close(got, ref, "float32", str(case))


@settings(max_examples=200, deadline=None)
@given(in_chunks=st.integers(1, 40).flatmap(chunking), filt=st.integers(1, 5), stride=st.integers(1, 4),
       dilation=st.integers(1, 3), lo=st.integers(0, 6), hi=st.integers(0, 6))
def test_axis_blocks_partition_the_output_with_exact_windows(in_chunks, filt, stride, dilation, lo, hi):
    size = sum(in_chunks)
    extent = (filt - 1) * dilation + 1
    out = (size + lo + hi - extent) // stride + 1
    if out < 1:
        return
    blocks = cdask.axis_blocks(in_chunks, filt, stride, dilation, lo, out)
    assert [b[0] for b in blocks] == [0, *[b[1] for b in blocks[:-1]]] and blocks[-1][1] == out
    starts = np.cumsum([0, *in_chunks])
    for o0, o1, first, last in blocks:
        assert o1 > o0
        assert (first, last) == (o0 * stride - lo, (o1 - 1) * stride - lo + extent)  # the pixels' taps, no more
        centres = np.arange(o0, o1) * stride - lo + (extent - 1) // 2
        owner = np.clip(np.searchsorted(starts, centres, side="right") - 1, 0, len(in_chunks) - 1)
        assert len(set(owner.tolist())) == 1  # one input chunk holds every centre of an output chunk


def test_a_window_is_its_own_chunks_and_halo_slices_of_its_neighbours():
    """A window task depends on the chunks it covers whole and on one slice task per chunk it covers in
    part, holding just the rows it needs: a distributed scheduler then builds it where its own chunk is."""
    data = np.arange(40.0).reshape(20, 2)
    x = da.from_array(data, chunks=(5, 2))
    rows = [(0, 6), (4, 11), (9, 16), (14, 20), (3, 13), (6, 8)]
    y = cdask._gather(x, 0, rows)
    assert y.chunks == ((6, 7, 7, 6, 10, 2), (2,))
    np.testing.assert_array_equal(y.compute(scheduler="synchronous"), np.concatenate([data[a:b] for a, b in rows]))
    from dask.local import get_sync
    graph = dict(y.__dask_graph__())
    deps = y.dask.get_all_dependencies()
    for j, (lo, hi) in enumerate(rows):
        whole = [k for k in deps[(y.name, j, 0)] if k[0] == x.name]
        halos = [k for k in deps[(y.name, j, 0)] if k[0] != x.name]
        assert sorted(k[1] for k in whole) == [c for c in range(4) if lo <= 5 * c and 5 * c + 5 <= hi]
        for k in halos:
            assert len(deps[k]) == 1 and next(iter(deps[k]))[0] == x.name  # a slice of one chunk
        halo_rows = sum(get_sync(graph, k).shape[0] for k in halos)
        assert halo_rows == (hi - lo) - 5 * len(whole)


def test_output_chunks_follow_the_input_chunks():
    x = np.random.default_rng(0).standard_normal((4, 12, 10, 3)).astype(np.float32)
    w = np.random.default_rng(1).standard_normal((5, 3, 3, 3)).astype(np.float32)
    y = cdask.conv2d(da.from_array(x, chunks=(2, (5, 7), (3, 7), 3)), w, padding="same")
    assert y.chunks == ((2, 2), (5, 7), (3, 7), (5,))
    y = cdask.conv2d(da.from_array(x, chunks=(2, 4, 5, 3)), w, padding="same", stride=2)
    assert y.chunks == ((2, 2), (2, 2, 2), (2, 3), (5,))
    y = cdask.conv2d(da.from_array(x, chunks=(4, 1, 1, 1)), w, padding="valid", stride=3)  # chunks < halo
    assert y.chunks == ((4,), (1, 1, 1, 1), (1, 1, 1), (5,))
    assert_close(y.compute(scheduler="synchronous"), cuconv.reference.conv2d(x, w, stride=3), "float32")


def test_channel_axis_is_one_chunk_and_residual_may_be_a_plain_array():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 6, 5, 4, 7)).astype(np.float32)  # NCDHW, C = 6
    w = rng.standard_normal((4, 3, 2, 3, 1)).astype(np.float32)
    res = rng.standard_normal((2, 4, 5, 4, 7)).astype(np.float32)
    kw = dict(layout="NCDHW", groups=2, padding="same", residual=res, beta=0.5, activation="gelu")
    y = cdask.conv3d(da.from_array(x, chunks=(1, 2, 2, 3, 4)), w, **kw)
    assert y.chunks[1] == (4,)
    assert_close(y.compute(scheduler="synchronous"), cuconv.reference.conv3d(x, w, **kw), "float32")


def test_threads_scheduler_and_nothing_passed_is_modified():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((3, 9, 8, 4)).astype(np.float32)
    w = rng.standard_normal((6, 3, 3, 2)).astype(np.float32)
    b = rng.standard_normal(6).astype(np.float32)
    res = rng.standard_normal((3, 5, 5, 6)).astype(np.float32)
    copies = [a.copy() for a in (x, w, b, res)]
    kw = dict(stride=2, padding=((2, 1), (0, 3)), groups=2, residual=res, activation="silu")
    y = cdask.conv2d(da.from_array(x, chunks=(1, 3, 2, 4)), w, b, **kw).compute(scheduler="threads")
    assert_close(y, cuconv.reference.conv2d(x, w, b, **kw), "float32")
    for a, c in zip((x, w, b, res), copies):
        assert np.array_equal(a, c)


def test_distributed_client_runs_the_graph():
    distributed = pytest.importorskip("distributed", reason="distributed is not installed (pip install '.[dask]')")
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 7, 6, 5, 3)).astype(np.float32)
    w = rng.standard_normal((4, 3, 3, 1, 3)).astype(np.float32)
    b = rng.standard_normal(4).astype(np.float32)
    kw = dict(stride=(1, 2, 1), padding="same", dilation=(2, 1, 1), activation="relu")
    with distributed.Client(processes=False, n_workers=2, threads_per_worker=1, dashboard_address=None) as client:
        y = client.compute(cdask.conv3d(da.from_array(x, chunks=(1, 3, 4, 2, 3)), w, b, **kw)).result()
    assert_close(y, cuconv.reference.conv3d(x, w, b, **kw), "float32")


def test_empty_batch():
    x = da.zeros((0, 5, 5, 2), chunks=(1, 2, 2, 2), dtype=np.float32)
    y = cdask.conv2d(x, np.ones((3, 3, 3, 2), np.float32), padding="same")
    assert y.shape == (0, 5, 5, 3)
    assert y.compute(scheduler="synchronous").shape == (0, 5, 5, 3)


def test_blocks_entirely_in_padding():
    # stride 4 over chunks of 1 with 3 rows of padding: the first output chunk reads padding only
    x = np.random.default_rng(4).standard_normal((1, 6, 3, 2)).astype(np.float32)
    w = np.random.default_rng(5).standard_normal((2, 1, 1, 2)).astype(np.float32)
    b = np.array([0.25, -1.0], np.float32)
    kw = dict(stride=(4, 1), padding=((3, 4), (0, 0)), alpha=2.0)
    y = cdask.conv2d(da.from_array(x, chunks=(1, 1, 3, 2)), w, b, **kw)
    assert_close(y.compute(scheduler="synchronous"), cuconv.reference.conv2d(x, w, b, **kw), "float32")


def _bad_calls(x, w):
    """(description, keyword changes) of calls the single call refuses."""
    K = w.shape[0]
    return [("stride 0", dict(stride=0)), ("stride type", dict(stride=1.5)), ("padding", dict(padding="full")),
            ("padding negative", dict(padding=-1)), ("dilation", dict(dilation=(1, 2, 3))),
            ("groups", dict(groups=3)), ("layout", dict(layout="NDHWC")), ("activation", dict(activation="tanh")),
            ("alpha", dict(alpha=True)), ("beta", dict(beta="1")), ("w dtype", dict(w=w.astype(np.float16))),
            ("w rank", dict(w=w[0])), ("x dtype", dict(x=x.astype(np.float64))),
            ("bias shape", dict(bias=np.ones(K + 1, np.float32))),
            ("bias dtype", dict(bias=np.ones(K, np.float16))), ("bias scalar", dict(bias=1.0)),
            ("residual shape", dict(residual=np.ones((2, 6, 6, K + 1), np.float32))),
            ("residual dtype", dict(residual=np.ones((2, 6, 6, K), np.float16))),
            ("kernel", dict(kernel="nope")), ("output size", dict(padding="valid", dilation=4))]


@pytest.mark.parametrize("what", [c[0] for c in _bad_calls(np.zeros((1, 1, 1, 1)), np.zeros((1, 1, 1, 1)))])
def test_errors_are_the_single_calls(what):
    x = np.ones((2, 6, 6, 4), np.float32)
    w = np.ones((5, 3, 3, 4), np.float32)
    changes = dict(_bad_calls(x, w))[what]
    args = {**dict(x=x, w=w, bias=None, padding="same"), **changes}
    with pytest.raises((TypeError, ValueError)) as single:
        cuconv.conv2d(**args)
    args["x"] = da.from_array(args["x"], chunks=(1, 3, 3, 4))
    with pytest.raises(type(single.value)) as lazy:
        cdask.conv2d(**args)
    assert str(lazy.value) == str(single.value)


def test_errors_of_the_dask_path():
    x = np.ones((1, 4, 4, 2), np.float32)
    w = np.ones((3, 1, 1, 2), np.float32)
    xd = da.from_array(x, chunks=2)
    with pytest.raises(TypeError, match="x: expected a dask array"):
        cdask.conv2d(x, w)
    with pytest.raises(TypeError, match="out: not supported"):
        cdask.conv2d(xd, w, out=np.empty((1, 4, 4, 3), np.float32))
    with pytest.raises(TypeError, match=r"w: expected a NumPy or CuPy array .* pass w.compute\(\)"):
        cdask.conv2d(xd, da.from_array(w))
    with pytest.raises(TypeError, match=r"bias: .* pass bias.compute\(\)"):
        cdask.conv2d(xd, w, da.ones(3, dtype=np.float32))
    with pytest.raises(ValueError, match="residual: expected shape"):
        cdask.conv2d(xd, w, residual=da.ones((1, 4, 4, 2), dtype=np.float32))
    with pytest.raises(TypeError, match="residual: expected dtype float32"):
        cdask.conv2d(xd, w, residual=da.ones((1, 4, 4, 3), dtype=np.float16))
    with pytest.raises(ValueError, match="x: its chunk sizes are unknown"):
        cdask.conv2d(xd[xd[:, 0, 0, 0] > 0], w)
    with pytest.raises(ValueError, match="strategy: only conv3d"):
        cuconv.dask._lazy_conv(2, xd, w, None, 1, 0, 1, 1, "NHWC", None, 1.0, 1.0, None, None, None, "native")
    with pytest.raises(ValueError, match="strategy: expected one of"):
        cdask.conv3d(da.ones((1, 2, 2, 2, 2), dtype=np.float32), np.ones((1, 1, 1, 1, 2), np.float32),
                     strategy="fast")


def test_scaling_benchmark_cli(tmp_path, capsys):
    """``python -m cuconv.bench.dask_scaling`` parses its arguments and runs its graphs on the host (--cpu)."""
    import json

    from cuconv.bench import dask_scaling
    args = dask_scaling.parser().parse_args(["--volume", "8", "6", "5", "--gpus", "1", "2", "--dtype", "float32"])
    assert (tuple(args.volume), args.gpus, args.dtype, args.filter, args.cpu) == ((8, 6, 5), [1, 2], "float32", 3, False)
    with pytest.raises(SystemExit):
        dask_scaling.main(["--filter", "2", "--cpu"])
    with pytest.raises(SystemExit, match="--source gpu"):
        dask_scaling.main(["--source", "gpu", "--cpu"])
    out = tmp_path / "scaling.json"
    argv = ["--cpu", "--volume", "9", "8", "7", "--channels", "2", "--out-channels", "3", "--depth-chunk", "4",
            "--gpus", "1", "2", "--repeats", "1", "--json", str(out)]
    assert dask_scaling.main(argv) == 0
    records = json.loads(out.read_text())["records"]
    assert [(r["library"], r["workers"]) for r in records] == [("cuconv.dask", 1), ("cuconv.dask", 2)]
    assert "speed-up on 2 host threads" in capsys.readouterr().out
    # the graph the benchmark times is the convolution: its blocks agree with the single call
    x, w = dask_scaling.volume(args, False), dask_scaling.filters(args, False)
    y = cdask.conv3d(x, w, padding="same").compute(scheduler="synchronous")
    assert_close(y, cuconv.reference.conv3d(x.compute(), w, padding="same"), "float32")


def test_blocks_restore_bfloat16_sent_as_void_or_bits():
    """distributed's CuPy serializer turns bfloat16 into a void type, and bfloat16 CuPy chunks travel as
    uint16 bits: a block views either back to bfloat16, bit for bit; other arrays pass unchanged."""
    a = random_array(np.random.default_rng(0), (3, 4), "bfloat16")
    for sent in (a.view("V2"), a.view(np.uint16)):
        back = cdask._typed(sent, "bfloat16")
        assert back.dtype == DTYPES["bfloat16"] and np.array_equal(back.view(np.uint16), a.view(np.uint16))
    f = np.ones((2, 2), np.float32)
    assert cdask._typed(f, "float32") is f and cdask._typed(None, "bfloat16") is None
    x = da.from_array(a, chunks=2)
    assert cdask._as_bits(x, "numpy", "bfloat16") is x  # NumPy chunks keep their dtype between workers


def test_scaling_benchmark_sizes_the_volume_by_gpu_memory():
    from cuconv.bench import dask_scaling
    args = dask_scaling.parser().parse_args(["--gpu-fraction", "0.75", "--volume", "1", "64", "32",
                                             "--channels", "4", "--dtype", "bfloat16"])
    plane = 64 * 32 * 4 * 2
    assert dask_scaling.depth_for(args, 1000 * plane) == 750
    assert dask_scaling.depth_for(args, 1) == 1
    for argv in (["--gpu-fraction", "0"], ["--gpu-fraction", "0.5", "--cpu"]):
        with pytest.raises(SystemExit):
            dask_scaling.main(argv)


def test_scaling_benchmark_counts_bytes_moved_between_workers():
    """``--transfers``: the bytes one worker fetched from another, by task name."""
    distributed = pytest.importorskip("distributed", reason="distributed is not installed (pip install '.[dask]')")
    from cuconv.bench import dask_scaling
    with distributed.Client(processes=False, n_workers=2, threads_per_worker=1, dashboard_address=None) as client:
        a, b = sorted(client.scheduler_info()["workers"])

        def run():
            made = client.submit(np.ones, 1000, workers=[a], key="made-here-1")
            client.submit(np.sum, made, workers=[b], key="summed-there-1").result()

        moved = dask_scaling.worker_transfers(client, run)
    assert moved == {"made-here": 8000}


def test_import_cuconv_does_not_import_dask():
    import os
    import subprocess
    import sys
    from pathlib import Path
    root = str(Path(__file__).resolve().parent.parent)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
    code = "import sys, cuconv; assert 'dask' not in sys.modules, sorted(m for m in sys.modules if 'dask' in m)"
    subprocess.run([sys.executable, "-c", code], check=True, env=env)


def test_the_extras_install_dask():
    import tomllib
    from pathlib import Path
    extras = tomllib.loads((Path(__file__).resolve().parent.parent / "pyproject.toml").read_text())[
        "project"]["optional-dependencies"]
    assert any(d.startswith("dask[array]") for d in extras["test"]) and any(d.startswith("distributed")
                                                                          for d in extras["dask"])
    assert any(d.startswith("dask-cuda") for d in extras["dask-cuda"])


@pytest.mark.gpu
@pytest.mark.parametrize("nd", [2, 3])
def test_cupy_chunks_match_the_single_cupy_call(cp, nd):
    rng = np.random.default_rng(6)
    shape = (2, 20, 18, 16) if nd == 2 else (2, 10, 12, 9, 16)
    x = random_array(rng, shape, "float16")
    w = random_array(rng, (32, *(3,) * nd, 8), "float16", 0.25)
    b = random_array(rng, (32,), "float16")
    kw = dict(stride=2, padding="same", groups=2, activation="relu")
    conv, dconv = (cuconv.conv2d, cdask.conv2d) if nd == 2 else (cuconv.conv3d, cdask.conv3d)
    out_shape = conv(x, w, b, **kw).shape
    res = random_array(rng, out_shape, "float16")
    single = conv(cp.asarray(x), cp.asarray(w), cp.asarray(b), residual=cp.asarray(res), **kw)
    xd = da.from_array(x, chunks=(1, 7, 5, *((4,) if nd == 3 else ()), 16)).map_blocks(cp.asarray)
    rd = da.from_array(res, chunks=(2, 3, *((4,) * (nd - 1)), 32)).map_blocks(cp.asarray)
    lazy = dconv(xd, cp.asarray(w), cp.asarray(b), residual=rd, **kw)
    assert isinstance(lazy._meta, cp.ndarray)
    got = lazy.compute(scheduler="synchronous")
    assert isinstance(got, cp.ndarray)
    assert rel_error(got, single.get()) <= 2e-3  # a block may run another tile configuration than the whole
    assert_close(got, (cuconv.reference.conv2d if nd == 2 else cuconv.reference.conv3d)(x, w, b, residual=res, **kw),
                 "float16")
    assert got.dtype == DTYPES["float16"]


def _device_count(cp) -> int:
    return cp.cuda.runtime.getDeviceCount()


def _on_gpu_of_block(cp):
    """A map_blocks function that moves NumPy chunks to GPU ``block_index % device count`` (alternating)."""
    def place(block, block_info=None):
        index = sum(block_info[0]["chunk-location"])
        with cp.cuda.Device(index % _device_count(cp)):
            return cp.asarray(block)
    return place


@pytest.mark.gpu
@pytest.mark.parametrize("filt", [1, 3])
def test_chunks_on_several_gpus_in_one_process(cp, filt):
    """Chunks spread over every visible GPU of one process equal the single call. With a 1x1x1 filter (no
    halo) every block runs on its chunk's GPU, with w, bias and the residual copied there; a window that
    needs a halo is joined by dask's concatenation on the current GPU. Skipped with one GPU."""
    if _device_count(cp) < 2:
        pytest.skip(f"needs 2 GPUs, {_device_count(cp)} visible")
    rng = np.random.default_rng(8)
    x = random_array(rng, (2, 12, 20, 18, 16), "bfloat16")
    w = random_array(rng, (16, filt, filt, filt, 16), "bfloat16", 0.25)
    b = random_array(rng, (16,), "bfloat16")
    res = random_array(rng, (2, 12, 20, 18, 16), "bfloat16")
    kw = dict(padding="same", activation="relu", beta=0.5)
    single = cuconv.conv3d(cp.asarray(x), cp.asarray(w), cp.asarray(b), residual=cp.asarray(res), **kw).get()
    xd = da.from_array(x, chunks=(1, 5, 7, 18, 16)).map_blocks(_on_gpu_of_block(cp), dtype=x.dtype,
                                                               meta=cp.empty((0,) * 5, x.dtype))
    rd = da.from_array(res, chunks=(1, 5, 7, 18, 16)).map_blocks(_on_gpu_of_block(cp), dtype=x.dtype,
                                                                 meta=cp.empty((0,) * 5, x.dtype))
    lazy = cdask.conv3d(xd, cp.asarray(w), cp.asarray(b), residual=rd, **kw)
    seen = set()

    def to_host(block):
        seen.add(block.device.id)
        return block.get()

    got = lazy.map_blocks(to_host, dtype=x.dtype, meta=np.empty((0,) * 5, x.dtype)).compute(scheduler="synchronous")
    if filt == 1:
        assert seen == set(range(_device_count(cp)))
    assert rel_error(got, single) <= 2e-3
    assert_close(got, cuconv.reference.conv3d(x, w, b, residual=res, **kw), "bfloat16")


@pytest.mark.gpu
@pytest.mark.parametrize("depth_chunk, stride", [(2, 2), (8, 1)])
def test_dask_cuda_cluster_of_every_gpu_equals_the_single_call(cp, depth_chunk, stride):
    """One dask-cuda worker per GPU, host chunks moved to the workers' GPUs: the result equals the single
    call. bfloat16, whose CuPy chunks and filters reach the workers through distributed's serializer as a
    void type (restored by the blocks). Depth chunks of 8 at stride 1 are cut into interior and edge calls
    whose results are joined across workers. Skipped without dask-cuda or with one GPU."""
    dask_cuda = pytest.importorskip("dask_cuda", reason="dask-cuda is not installed (pip install '.[dask-cuda]')")
    from distributed import Client, get_task_stream
    if _device_count(cp) < 2:
        pytest.skip(f"needs 2 GPUs, {_device_count(cp)} visible")
    rng = np.random.default_rng(9)
    x = random_array(rng, (1, 24, 16, 16, 8), "bfloat16")
    w = random_array(rng, (8, 3, 3, 3, 8), "bfloat16", 0.25)
    single = cuconv.conv3d(cp.asarray(x), cp.asarray(w), stride=stride, padding="same").get()
    with dask_cuda.LocalCUDACluster(n_workers=_device_count(cp), threads_per_worker=1, dashboard_address=None,
                                    protocol="tcp") as cluster, Client(cluster) as client:
        xd = da.from_array(x, chunks=(1, depth_chunk, 16, 16, 8)).map_blocks(cp.asarray, dtype=x.dtype,
                                                                             meta=cp.empty((0,) * 5, x.dtype))
        lazy = cdask.conv3d(xd, cp.asarray(w), stride=stride, padding="same")
        on_host = lazy.map_blocks(cp.asnumpy, dtype=x.dtype, meta=np.empty((0,) * 5, x.dtype))
        with get_task_stream(client) as tasks:
            got = client.compute(on_host).result()
        gpus = client.run(lambda: cp.cuda.Device(0).pci_bus_id)
    assert len(set(gpus.values())) == _device_count(cp)  # one GPU per worker
    assert {t["worker"] for t in tasks.data} == set(gpus)  # every worker ran blocks
    assert rel_error(got, single) <= 2e-3
    assert_close(got, cuconv.reference.conv3d(x, w, stride=stride, padding="same"), "bfloat16")


@pytest.mark.gpu
@pytest.mark.parametrize("nd", [2, 3])
def test_cupy_chunks_transpose_match_the_single_cupy_call(cp, nd):
    """conv_transpose on CuPy chunks: every block on the GPU, equal to the single CuPy call's result."""
    rng = np.random.default_rng(7)
    shape = (2, 9, 11, 32) if nd == 2 else (1, 6, 7, 5, 32)
    x = random_array(rng, shape, "bfloat16")
    w = random_array(rng, (32, *(3,) * nd, 16), "bfloat16", 0.25)
    b = random_array(rng, (16,), "bfloat16")
    kw = dict(stride=2, padding=1, output_padding=1, activation="relu")
    single_fn, lazy_fn = ((cuconv.conv_transpose2d, cdask.conv_transpose2d) if nd == 2 else
                          (cuconv.conv_transpose3d, cdask.conv_transpose3d))
    single = single_fn(cp.asarray(x), cp.asarray(w), cp.asarray(b), **kw)
    xd = da.from_array(x, chunks=(1, 4, 5, *((3,) if nd == 3 else ()), 32)).map_blocks(cp.asarray)
    lazy = lazy_fn(xd, cp.asarray(w), cp.asarray(b), **kw)
    assert isinstance(lazy._meta, cp.ndarray) and lazy.shape == single.shape
    got = lazy.compute(scheduler="synchronous")
    assert isinstance(got, cp.ndarray)
    assert rel_error(got, single.get()) <= 2e-3
    ref = single_fn(x.astype(np.float64), w.astype(np.float64), b.astype(np.float64), **kw)
    assert_close(got, ref, "bfloat16")


# ------------------------------------------------------------------------------- transposed convolution
@st.composite
def transpose_cases(draw):
    """A valid conv_transpose2d / 3d call (float64) with its dask chunkings."""
    nd = draw(st.sampled_from([2, 3]))
    channels_last = draw(st.booleans())
    layout = {(2, True): "NHWC", (2, False): "NCHW", (3, True): "NDHWC", (3, False): "NCDHW"}[nd, channels_last]
    groups = draw(st.sampled_from([1, 1, 2]))
    cin, cog = groups * draw(st.integers(1, 3)), draw(st.integers(1, 3))
    spatial = tuple(draw(st.integers(1, 7 if nd == 2 else 4)) for _ in range(nd))
    filt = tuple(draw(st.integers(1, 4)) for _ in range(nd))
    stride = tuple(draw(st.integers(1, 4)) for _ in range(nd))
    dilation = tuple(draw(st.integers(1, 2)) for _ in range(nd))
    pads = tuple((draw(st.integers(0, 3)), draw(st.integers(0, 3))) for _ in range(nd))
    op = tuple(draw(st.integers(0, s - 1)) for s in stride)
    size = [(i - 1) * s - lo - hi + (f - 1) * d + o + 1 for i, s, (lo, hi), f, d, o in zip(spatial, stride, pads, filt,
                                                                                            dilation, op)]
    if min(size) < 1:
        pads = ((0, 0),) * nd
    N = draw(st.integers(1, 2))
    chunks = [draw(chunking(N)), *[draw(chunking(n)) for n in spatial]]
    chunks.insert(len(chunks) if channels_last else 1, draw(chunking(cin)))
    return dict(nd=nd, layout=layout, groups=groups, cin=cin, cog=cog, N=N, spatial=spatial, filt=filt,
                stride=stride, dilation=dilation, padding=pads, output_padding=op, chunks=tuple(chunks),
                bias=draw(st.booleans()), residual=draw(st.booleans()),
                activation=draw(st.sampled_from([None, "relu", "gelu"])), alpha=draw(st.sampled_from([1.0, 0.5])),
                seed=draw(st.integers(0, 2**31 - 1)), res_chunks=draw(st.data()))


@settings(max_examples=80, deadline=None)
@given(case=transpose_cases())
def test_transpose_equals_the_single_call(case):
    """Random chunkings, strides, dilations, paddings, output_padding, groups, layouts, epilogue: the lazy
    transposed convolution equals the single call (float64, to summation-order rounding)."""
    nd, cl = case["nd"], case["layout"].endswith("C")
    rng = np.random.default_rng(case["seed"])
    x_shape = (case["N"], *case["spatial"], case["cin"]) if cl else (case["N"], case["cin"], *case["spatial"])
    w_shape = (case["cin"], *case["filt"], case["cog"]) if cl else (case["cin"], case["cog"], *case["filt"])
    x, w = rng.standard_normal(x_shape), rng.standard_normal(w_shape)
    bias = rng.standard_normal(case["cog"] * case["groups"]) if case["bias"] else None
    kw = dict(stride=case["stride"], padding=case["padding"], output_padding=case["output_padding"],
              dilation=case["dilation"], groups=case["groups"], layout=case["layout"], activation=case["activation"],
              alpha=case["alpha"])
    single_fn = cuconv.conv_transpose2d if nd == 2 else cuconv.conv_transpose3d
    lazy_fn = cdask.conv_transpose2d if nd == 2 else cdask.conv_transpose3d
    residual = res = None
    if case["residual"]:
        residual = rng.standard_normal(single_fn(x, w, bias, **kw).shape)
        res = da.from_array(residual, chunks=tuple(case["res_chunks"].draw(chunking(n)) for n in residual.shape))
    single = single_fn(x, w, bias, residual=residual, beta=-0.5, **kw)
    lazy = lazy_fn(da.from_array(x, chunks=case["chunks"]), w, bias, residual=res, beta=-0.5, **kw)
    assert isinstance(lazy, da.Array) and lazy.shape == single.shape
    got = lazy.compute(scheduler="synchronous")
    assert np.allclose(got, single, rtol=1e-12, atol=1e-12), (case, np.abs(got - single).max())


@settings(max_examples=200, deadline=None)
@given(in_chunks=st.integers(1, 30).flatmap(chunking), filt=st.integers(1, 5), stride=st.integers(1, 5),
       dilation=st.integers(1, 3), lo=st.integers(0, 6), hi=st.integers(0, 6), op=st.integers(0, 4))
def test_transpose_axis_blocks_cover_every_contribution(in_chunks, filt, stride, dilation, lo, hi, op):
    """The output chunks partition the output; each reads every input row whose taps reach it; the
    block's forward geometry is valid (padding >= 0 behind)."""
    size, extent = sum(in_chunks), (filt - 1) * dilation
    op = op % stride
    out = (size - 1) * stride - lo - hi + extent + op + 1
    if out < 1:
        return
    blocks = cdask.transpose_axis_blocks(in_chunks, filt, stride, dilation, lo, out)
    assert [b[0] for b in blocks] == [0, *[b[1] for b in blocks[:-1]]] and blocks[-1][1] == out
    for y0, y1, i0, i1, pad, extra in blocks:
        assert y1 > y0 and 0 <= i0 <= i1 <= size and pad >= 0 and extra >= 0 and i1 - i0 + extra >= 1
        reaching = {i for i in range(size) for f in range(filt) if y0 <= i * stride - lo + f * dilation < y1}
        assert reaching <= set(range(i0, i1))
        assert (i1 - i0 + extra - 1) * stride + extent + 1 - (y1 - y0) - pad >= 0


def test_transpose_errors():
    x = da.zeros((1, 4, 4, 2), chunks=2)
    w = np.zeros((2, 3, 3, 2))
    with pytest.raises(TypeError, match="out: not supported"):
        cdask.conv_transpose2d(x, w, out=np.zeros((1, 6, 6, 2)))
    with pytest.raises(TypeError, match="x: expected a dask array"):
        cdask.conv_transpose2d(np.zeros((1, 4, 4, 2)), w)
    with pytest.raises(ValueError, match="padding: a transposed convolution takes ints"):
        cdask.conv_transpose2d(x, w, padding="same")
    with pytest.raises(ValueError, match="w: a transposed convolution's weight"):
        cdask.conv_transpose2d(x, np.zeros((3, 3, 3, 2)))
