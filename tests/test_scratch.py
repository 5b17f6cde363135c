"""CPU checks of cuconv.scratch's bookkeeping (one buffer per device, stream and purpose; grown, reused,
least recently used dropped past MAX_BUFFERS), with a stand-in for CuPy. The GPU side is
tests/test_sm80.py::test_scratch_buffers_are_reused_per_stream_and_released."""

import sys
import types

import pytest

from cuconv import scratch


class _FakeBuffer:
    def __init__(self, nbytes, zeroed=False):
        self.nbytes = nbytes
        self.zeroed = zeroed

    def __getitem__(self, _):
        return self

    def view(self, _):
        return self

    def reshape(self, _):
        return self


@pytest.fixture
def fake_cupy(monkeypatch):
    stream = types.SimpleNamespace(ptr=0)
    fake = types.SimpleNamespace(
        dtype=lambda d: types.SimpleNamespace(itemsize=2), uint8="uint8",
        empty=lambda n, dtype=None: _FakeBuffer(n), zeros=lambda n, dtype=None: _FakeBuffer(n, zeroed=True),
        cuda=types.SimpleNamespace(runtime=types.SimpleNamespace(getDevice=lambda: 0),
                                   get_current_stream=lambda: stream))
    monkeypatch.setitem(sys.modules, "cupy", fake)
    scratch.release_scratch()
    yield stream
    scratch.release_scratch()


def test_reused_grown_and_bounded(fake_cupy):
    stream = fake_cupy
    a = scratch.scratch("x", (1000,), "bfloat16")
    assert scratch.scratch("x", (10, 10), "bfloat16") is a         # smaller request: the same buffer
    assert scratch.scratch_bytes() == 2000
    b = scratch.scratch("x", (3000,), "bfloat16")                  # larger: grown
    assert b is not a and scratch.scratch_bytes() == 6000
    scratch.scratch("w", (10,), "bfloat16")                        # another purpose: its own buffer
    assert scratch.scratch_bytes() == 6000 + 256
    for i in range(1, 3 * scratch.MAX_BUFFERS):                    # many streams: bounded
        stream.ptr = i
        scratch.scratch("x", (100,), "bfloat16")
    assert len(scratch._BUFFERS) == scratch.MAX_BUFFERS
    scratch.release_scratch()
    assert scratch.scratch_bytes() == 0


def test_zeroed_buffers_start_as_zeros(fake_cupy):
    flags = scratch.scratch("flags", (100,), "int32", zeroed=True)
    assert flags.zeroed and scratch.scratch("flags", (10,), "int32", zeroed=True) is flags  # reused as is
    assert scratch.scratch("flags", (1000,), "int32", zeroed=True).zeroed                  # grown: zeros again
    assert not scratch.scratch("other", (100,), "int32").zeroed


def test_generation_counts_every_buffer_made_replaced_or_dropped(fake_cupy):
    """``STATE.generation`` moves whenever a buffer is allocated, grown, dropped for the bound or released,
    and stays put while calls are served from the buffers there are (what a caller keeping views checks)."""
    stream, state = fake_cupy, scratch.STATE
    g = state.generation
    scratch.scratch("x", (100,), "bfloat16")
    assert state.generation == g + 1
    scratch.scratch("x", (10,), "bfloat16")
    scratch.scratch("x", (100,), "bfloat16")
    assert state.generation == g + 1                               # served from the buffer there is
    scratch.scratch("x", (1000,), "bfloat16")
    assert state.generation == g + 2                               # grown
    g = state.generation
    for i in range(1, scratch.MAX_BUFFERS + 1):                    # the last of these drops the first buffer
        stream.ptr = i
        scratch.scratch("x", (100,), "bfloat16")
    assert state.generation == g + scratch.MAX_BUFFERS + 1
    g = state.generation
    scratch.release_scratch()
    assert state.generation == g + 1
