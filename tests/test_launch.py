"""The host side of the kernel ABI (cuconv/launch.py): the fast divisor, the 3-D geometry every
parameter struct starts from, and constants read from the kernel headers."""

import functools

import numpy as np
import pytest

from cuconv.launch import fast_divisor, geometry3d, header_constants

from geometry import problem2d, problem3d


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


def test_fast_divisor_values():
    assert fast_divisor(1) == (1, 0) and fast_divisor(56) == (((1 << 32) * 8) // 56 + 1, 6)


def test_geometry3d_pads_conv2d_with_a_unit_depth():
    g = geometry3d(problem2d(N=2, H=9, W=11, R=3, S=5, stride=(2, 1), dilation=(1, 2), padding=((1, 2), (3, 0))))
    assert (g.D, g.O, g.T) == (1, 1, 1) and (g.H, g.W, g.R, g.S) == (9, 11, 3, 5)
    assert g.stride == (1, 2, 1) and g.dilation == (1, 1, 2) and g.pad == (0, 1, 3)
    p3 = problem3d(D=6, H=9, W=11, T=3, R=3, S=3, stride=(2, 1, 1), padding=((1, 0), (1, 1), (0, 0)))
    g3 = geometry3d(p3)
    assert (g3.D, g3.H, g3.W) == (6, 9, 11) and (g3.O, g3.P, g3.Q) == p3.out_spatial and g3.pad == (1, 1, 0)


def test_header_constants_are_the_sources_defines():
    """The host reads the Hopper shared-memory budget from kernels_cu/sm90/budget.cuh."""
    from pathlib import Path
    consts = header_constants("sm90/budget.cuh")
    text = (Path(__file__).resolve().parents[1] / "kernels_cu" / "sm90" / "budget.cuh").read_text()
    assert consts and all(f"#define {name}" in text for name in consts)
    assert consts["SM90_SMEM_LIMIT"] == 227 * 1024 and consts["SM90_BLOCK_K"] == 64


def _capture(launch, driver):
    """Send ``launch``'s driver calls to ``driver`` (taking cuLaunchKernel's eleven arguments, as CuPy's
    ``driver.launchKernel``), with the arguments the record binds once (function, grid, block, shared
    memory) in front of the per-launch ones."""
    launch._launch_kernel = functools.partial(driver, *launch._launch_kernel.args)


def test_packed_launch_lays_out_every_argument_and_rewrites_only_the_slots():
    """PackedLaunch's argument table (read back through its void* entries): each argument's bytes, the
    pointer slots side by side, every other argument 64-byte aligned; a call writes its pointers into
    the slots and leaves every other byte as packed (no GPU: the driver's launch is captured)."""
    import ctypes
    from types import SimpleNamespace

    from cuconv.launch import PackedLaunch, c_struct

    struct_arg = c_struct([("a", np.int32), ("b", np.float32), ("c", np.int64)], dict(a=7, b=1.5, c=-3))
    big = np.frombuffer(bytes(range(128)), np.uint8).view(np.void(128))[0]  # a 128-byte blob (a tensor map)
    args = (np.uint64(0), struct_arg, np.uint64(0), big, np.uint64(0), np.int32(5))
    launch = PackedLaunch(SimpleNamespace(kernel=SimpleNamespace(ptr=1234)), (3, 2), 128, 4096, args, slots=(0, 2, 4))
    launched = []
    _capture(launch, lambda *a: launched.append(a))
    launch._current_stream = lambda: SimpleNamespace(ptr=99)

    def table():
        return [ctypes.string_at(launch._table[i], len(np.asarray(a).tobytes())) for i, a in enumerate(args)]

    packed = table()
    assert packed[1] == np.asarray(struct_arg).tobytes() and packed[3] == bytes(range(128))
    assert packed[5] == np.int32(5).tobytes()
    assert launch._table[1] % 64 == 0 and launch._table[3] % 64 == 0 and launch._table[5] % 64 == 0
    assert [launch._table[i] - launch._table[0] for i in (2, 4)] == [8, 16]
    pointers = (0x7F0000001000, 0x7F0000002010, 2**64 - 16)
    launch(*pointers)
    after = table()
    assert [int.from_bytes(after[i], "little") for i in (0, 2, 4)] == list(pointers)
    assert [after[i] for i in (1, 3, 5)] == [packed[i] for i in (1, 3, 5)]
    (call,) = launched
    assert call == (1234, 3, 2, 1, 128, 1, 1, 4096, 99, launch._table_ptr, 0)
    with pytest.raises(ValueError, match="slots"):
        PackedLaunch(SimpleNamespace(kernel=SimpleNamespace(ptr=0)), 1, 32, 0, args, slots=(2, 0))
    with pytest.raises(ValueError, match="slots: argument 1"):
        PackedLaunch(SimpleNamespace(kernel=SimpleNamespace(ptr=0)), 1, 32, 0, args, slots=(1,))


def test_packed_launch_from_several_threads_launches_each_threads_pointers():
    """Threads launching one record at once: each launch reads its own pointers, although the driver
    reads them after the GIL is released (the captured launch sleeps before reading, as another thread
    may run while CuPy's launchKernel waits in the driver)."""
    import ctypes
    import threading
    import time
    from types import SimpleNamespace

    from cuconv.launch import PackedLaunch

    launch = PackedLaunch(SimpleNamespace(kernel=SimpleNamespace(ptr=1)), 1, 32, 0,
                          (np.uint64(0), np.uint64(0), np.int32(3)), slots=(0, 1))
    seen, errors = [], []

    def driver(f, gx, gy, gz, bx, by, bz, smem, stream, table, extra):
        time.sleep(0.0002)  # the GIL is free: another thread may write the slots now
        params = ctypes.cast(table, ctypes.POINTER(ctypes.c_void_p))
        seen.append((stream, ctypes.c_uint64.from_address(params[0]).value,
                     ctypes.c_uint64.from_address(params[1]).value))

    _capture(launch, driver)

    def worker(t):
        try:
            for i in range(50):
                launch.on_stream(t, 1000 * t + i, 2000 * t + i)
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(1, 5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(seen) == 200
    for stream, a, b in seen:
        assert a // 1000 == stream and b - a == 1000 * stream, (stream, a, b)


def test_a_threads_first_launch_binds_a_context_and_launches_again(monkeypatch):
    """A launch from a thread with no current context fails with CUDA_ERROR_INVALID_CONTEXT: the record
    binds the current device's context and launches once more; any other failure is raised as it is."""
    from types import SimpleNamespace

    from cuconv import launch as launch_mod
    from cuconv.launch import PackedLaunch

    class DriverError(RuntimeError):
        def __init__(self, status):
            super().__init__(f"status {status}")
            self.status = status

    record = PackedLaunch(SimpleNamespace(kernel=SimpleNamespace(ptr=1)), 1, 32, 0, (np.uint64(0),), slots=(0,))
    calls, bound = [], []
    failures = [launch_mod.CUDA_ERROR_INVALID_CONTEXT]

    def driver(*a):
        calls.append(a)
        if failures:
            raise DriverError(failures.pop(0))

    _capture(record, driver)
    monkeypatch.setattr(launch_mod, "bind_current_context", lambda: bound.append(True))
    record.on_stream(7, 0x1000)
    assert len(calls) == 2 and bound == [True] and calls[0] == calls[1]
    failures.append(700)  # CUDA_ERROR_ILLEGAL_ADDRESS: not for the context to mend
    with pytest.raises(DriverError, match="status 700"):
        record.on_stream(7, 0x1000)
    assert bound == [True]


def test_launch_records_keep_the_most_recently_used():
    from cuconv.launch import LaunchRecords
    records = LaunchRecords(2)
    records.put("a", 1)
    records.put("b", 2)
    assert records.get("a") == 1  # now the most recently used
    records.put("c", 3)            # drops b
    assert records.get("b") is None and records.get("a") == 1 and records.get("c") == 3 and len(records) == 2


def test_launch_records_answer_the_latest_key_and_keep_the_lru_order():
    """A key asked again (the latest get or put) is answered without the LRU's bookkeeping; the order of
    use stays right for every other key (what is dropped next)."""
    from cuconv.launch import LaunchRecords
    records = LaunchRecords(2)
    assert records.get(None) is None and records.get("a") is None
    records.put("a", 1)
    assert records.get("a") == 1 and records.get("a") == 1
    records.put("b", 2)
    assert records.get("a") == 1 and records.get("a") == 1  # a is the most recently used again
    records.put("c", 3)                                      # drops b
    assert records.get("b") is None and records.get("c") == 3 and records.get("a") == 1
    records.put("d", 4)                                      # drops c
    assert records.get("c") is None and records.get("a") == 1 and records.get("d") == 4 and len(records) == 2


def test_current_stream_looks_cupy_up_once(monkeypatch):
    """``launch.current_stream()`` is CuPy's current stream; after the first call the module's name is
    CuPy's function itself (no import per launch)."""
    import cupy.cuda

    from cuconv import launch
    stream = object()
    monkeypatch.setattr(cupy.cuda, "get_current_stream", lambda: stream)
    monkeypatch.setattr(launch, "current_stream", launch._current_stream_first_use)  # as in a fresh process
    assert launch.current_stream() is stream
    assert launch.current_stream is cupy.cuda.get_current_stream
