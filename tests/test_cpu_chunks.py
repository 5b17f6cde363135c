"""The CPU kernel in chunks (cuconv/backends/cpu.py): the same result whatever the chunking, and its
temporaries bounded by CHUNK_BYTES."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import cuconv
from cuconv.backends import cpu


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 3), h=st.integers(1, 12), w=st.integers(1, 12), c=st.integers(1, 6), k=st.integers(1, 6),
       f=st.integers(1, 4), stride=st.integers(1, 3), dilation=st.integers(1, 2),
       pads=st.tuples(*[st.integers(0, 4)] * 4), chunk=st.sampled_from([1, 300, 5000, 1 << 20]),
       act=st.sampled_from([None, "relu", "gelu"]), seed=st.integers(0, 2**31 - 1))
def test_chunked_result_matches_reference(n, h, w, c, k, f, stride, dilation, pads, chunk, act, seed):
    padding = ((pads[0], pads[1]), (pads[2], pads[3]))
    extent = (f - 1) * dilation + 1
    if h + pads[0] + pads[1] < extent or w + pads[2] + pads[3] < extent:
        return
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, h, w, c)).astype(np.float32)
    wt = rng.standard_normal((k, f, f, c)).astype(np.float32)
    kw = dict(stride=stride, dilation=dilation, padding=padding, activation=act)
    ref = cuconv.reference.conv2d(x, wt, **kw)
    res = rng.standard_normal(ref.shape).astype(np.float32)
    ref = cuconv.reference.conv2d(x, wt, residual=res, **kw)
    saved, cpu.CHUNK_BYTES = cpu.CHUNK_BYTES, chunk
    try:
        got = cuconv.conv2d(x, wt, residual=res, **kw)
    finally:
        cpu.CHUNK_BYTES = saved
    err = np.linalg.norm(got - ref) / max(np.linalg.norm(ref), 1e-30)
    assert err < 1e-5, err


def test_conv3d_chunks_along_depth(monkeypatch):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 7, 5, 6, 3)).astype(np.float32)
    w = rng.standard_normal((4, 3, 2, 3, 3)).astype(np.float32)
    ref = cuconv.reference.conv3d(x, w, padding=((2, 1), (0, 1), (1, 1)), stride=(2, 1, 1))
    monkeypatch.setattr(cpu, "CHUNK_BYTES", 500)
    assert "chunks" in cuconv.explain(x, w, padding=((2, 1), (0, 1), (1, 1)), stride=(2, 1, 1)).detail
    got = cuconv.conv3d(x, w, padding=((2, 1), (0, 1), (1, 1)), stride=(2, 1, 1))
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 1e-5


@pytest.mark.parametrize("f", [1, 3, 7])
def test_temporaries_stay_within_the_chunk_budget(monkeypatch, f):
    monkeypatch.setattr(cpu, "CHUNK_BYTES", 8 << 20)
    x = np.ones((4, 32, 32, 64), np.float16)            # 0.5 MiB input, im2col of up to 49x that in float32
    w = np.full((64, f, f, 64), 0.01, np.float16)
    out = np.empty((4, 32, 32, 64), np.float16)
    tracemalloc.start()
    cuconv.conv2d(x, w, padding="same", out=out)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 1.5 * (8 << 20) + (1 << 20), peak
    assert np.isfinite(out.astype(np.float32)).all()
