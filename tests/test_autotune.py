"""cuconv.autotune on the CPU: the measured choice among kernels registered for this test (each wraps the
NumPy kernel and sleeps a time that depends on its overrides), the check of every candidate's result
against the automatic choice's, the decision kept per process and in a file, and the candidates the
tuner builds from the Hopper kernels' policy (planned on the CPU, not run)."""

from __future__ import annotations

import dataclasses
import importlib
import json
import time

import numpy as np
import pytest

import cuconv
from cuconv import registry
from cuconv.overrides import Overrides
from cuconv.plan import Kernel, Plan
from cuconv.problem import ConvProblem
from geometry import H100

tuner = importlib.import_module("cuconv.autotune")

CPU_KERNEL = next(k for k in registry.registered() if k.name == "cpu")
SLOW, FAST = 4e-3, 0.0


class _Wrapped(Plan):
    """The NumPy kernel's plan, run after a sleep of ``delay`` seconds (and counted)."""

    def __init__(self, kernel, problem, device, overrides, delay, what):
        super().__init__(kernel, problem, device, f"a test kernel ({what})")
        self.inner = CPU_KERNEL.plan(problem, device, overrides)
        self.delay, self.what = delay, what

    def describe(self):
        return f"{self.kernel.name} {self.what}"

    def run(self, x, w, bias, residual, out):
        self.kernel.runs += 1
        if self.delay:
            time.sleep(self.delay)
        self.kernel.finish(self.inner, x, w, bias, residual, out)


class _TestKernel(Kernel):
    backend = "cpu"
    precisions = CPU_KERNEL.precisions
    runs = 0

    def finish(self, inner, x, w, bias, residual, out):
        inner.run(x, w, bias, residual, out)


class Tiles(_TestKernel):
    """The automatic choice: slow unless ``block_n=128`` (fast) is forced; ``halo`` is ignored."""

    name = "tune_test_tiles"
    priority = 50
    even = False  # every variant equally slow (the margin test)

    def make_plan(self, problem, device, overrides):
        fast = overrides.block_n == 128 and not self.even
        return _Wrapped(self, problem, device, overrides, FAST if fast else SLOW, f"block_n {overrides.block_n}")


class _Fixed(_TestKernel):
    """A test kernel with one fast plan whose run ends with ``finish(inner, x, w, bias, residual, out)``."""

    def __init__(self, name, priority, what, finish):
        self.name, self.priority, self.what, self._finish = name, priority, what, finish

    def make_plan(self, problem, device, overrides):
        return _Wrapped(self, problem, device, overrides, FAST, self.what)

    def finish(self, inner, x, w, bias, residual, out):
        self._finish(inner, x, w, bias, residual, out)


def _zeros(inner, x, w, bias, residual, out):
    out[...] = 0


def _raises(inner, x, w, bias, residual, out):
    raise RuntimeError("this kernel always fails")


def _correct(inner, x, w, bias, residual, out):
    inner.run(x, w, bias, residual, out)


class Unplannable(_TestKernel):
    """Declines without overrides, raises with a forced tile width."""

    name = "tune_test_unplannable"
    priority = 10

    def make_plan(self, problem, device, overrides):
        if overrides.block_n is not None:
            raise ValueError(f"no plan at block_n={overrides.block_n}")
        from cuconv.plan import Declined
        return Declined("declines the automatic point")


TEST_KERNELS = (Tiles(), _Fixed("tune_test_wrong", 40, "zeros", _zeros),
                _Fixed("tune_test_broken", 30, "raises", _raises), Unplannable())


def _changed():
    for listener in registry._LISTENERS:
        listener()


@pytest.fixture
def kernels(monkeypatch):
    """The test kernels registered (the NumPy kernel is no candidate, so the test kernels' sleeps decide),
    and no decision left from another test."""
    for k in TEST_KERNELS:
        monkeypatch.setitem(registry._REGISTRY, k.name, k)
        monkeypatch.setattr(k, "runs", 0)
    monkeypatch.setattr(CPU_KERNEL, "autotune_candidate", False)
    monkeypatch.setattr(Tiles, "even", False)
    tuner.forget()
    _changed()
    yield {k.name: k for k in TEST_KERNELS}
    monkeypatch.undo()
    tuner.forget()
    _changed()


def _operands(layout="NHWC", seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((2, 6, 7, 4)).astype(np.float32)
    w = rng.standard_normal((8, 3, 3, 4)).astype(np.float32)
    if layout == "NCHW":
        x, w = np.ascontiguousarray(x.transpose(0, 3, 1, 2)), np.ascontiguousarray(w.transpose(0, 3, 1, 2))
    return x, w


def test_autotune_runs_the_fastest_correct_candidate(kernels):
    x, w = _operands()
    bias = np.linspace(-1, 1, 8).astype(np.float32)
    x0, w0 = x.copy(), w.copy()
    with cuconv.autotune():
        y = cuconv.conv2d(x, w, bias, padding=1, activation="relu")
        e = cuconv.explain(x, w, bias, padding=1, activation="relu")
    ref = cuconv.conv2d(x, w, bias, padding=1, activation="relu", kernel="cpu")
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)
    assert np.array_equal(x, x0) and np.array_equal(w, w0)
    t = e.tuning
    assert e.kernel == "tune_test_tiles" and t.chosen.overrides == "block_n=128"
    assert t.automatic.kernel == "tune_test_tiles" and t.automatic.overrides == ""
    assert t.chosen.us < t.automatic.us
    wrong = next(m for m in t.candidates if m.kernel == "tune_test_wrong")
    assert wrong.us is None and "differs from the automatic choice's" in wrong.error
    broken = next(m for m in t.candidates if m.kernel == "tune_test_broken")
    assert broken.us is None and "this kernel always fails" in broken.error
    unplannable = [m for m in t.candidates if m.kernel == "tune_test_unplannable"]
    assert len(unplannable) == 1 and unplannable[0].error == "ValueError: no plan at block_n=16"
    assert t.candidates[-1].error is not None
    timed = [m.us for m in t.candidates if m.us is not None]
    assert timed == sorted(timed) and t.candidates[0] == t.chosen
    assert "tune_test_tiles" not in e.skipped, "the same kernel on another tile: the tuning lines say so"
    text = str(e)
    assert "autotune: tune_test_tiles [block_n=128]" in text and "failed: RuntimeError" in text
    # halo is not read by the test kernel: its variations are the same plan, measured once
    assert not any("halo" in m.overrides for m in t.candidates)


def test_decision_is_measured_once(kernels):
    x, w = _operands()
    tiles = kernels["tune_test_tiles"]
    with cuconv.autotune():
        cuconv.conv2d(x, w, padding=1)
        after_first = tiles.runs
        for _ in range(3):
            cuconv.conv2d(x, w, padding=1)
        plan = cuconv.plan_conv2d(x, w, padding=1)
        plan(x, w)
    assert after_first > 5, "the first call measures"
    assert tiles.runs == after_first + 4, "later calls run the decision once each"
    assert plan.explanation.tuning.chosen.overrides == "block_n=128"
    # outside the block the automatic choice runs again
    assert cuconv.explain(x, w, padding=1).tuning is None


def test_margin_keeps_the_automatic_choice(kernels, monkeypatch):
    """Equally slow variants (sleeps of the same length, timed within a wide margin here so that the test
    does not depend on the host's timer): the automatic choice stays."""
    monkeypatch.setattr(Tiles, "even", True)
    monkeypatch.setattr(tuner, "MARGIN", 0.5)
    x, w = _operands()
    with cuconv.autotune():
        e = cuconv.explain(x, w, padding=1)
    assert e.tuning.chosen == e.tuning.automatic and e.plan.describe() == "tune_test_tiles block_n None"
    assert "is the fastest of" in e.tuning.describe()


def test_another_kernel_wins(kernels, monkeypatch):
    monkeypatch.setattr(Tiles, "even", True)
    other = _Fixed("tune_test_other", 20, "fast", _correct)  # fast and correct, below the automatic choice
    monkeypatch.setitem(registry._REGISTRY, other.name, other)
    _changed()
    x, w = _operands()
    with cuconv.autotune():
        y = cuconv.conv2d(x, w, padding=1)
        e = cuconv.explain(x, w, padding=1)
    np.testing.assert_allclose(y, cuconv.conv2d(x, w, padding=1, kernel="cpu"), rtol=1e-5, atol=1e-5)
    assert e.kernel == "tune_test_other" and e.tuning.chosen.overrides == ""
    assert "measured for tune_test_other" in e.skipped["tune_test_tiles"]
    assert e.declined == cuconv.explain(x, w, padding=1).declined, "the automatic choice's declines"


def test_channels_first_and_in_place_residual(kernels):
    x, w = _operands("NCHW")
    res = np.random.default_rng(3).standard_normal((2, 8, 6, 7)).astype(np.float32)
    expected = cuconv.conv2d(x, w, padding=1, layout="NCHW", residual=res, beta=0.5, kernel="cpu")
    with cuconv.autotune():
        out = res.copy()
        y = cuconv.conv2d(x, w, padding=1, layout="NCHW", residual=out, beta=0.5, out=out)
    assert y is out
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)


def _tuned_file(tmp_path):
    """(path, x, w, its content) of a decision file written by one tuned call."""
    path = tmp_path / "tuned.json"
    x, w = _operands()
    with cuconv.autotune(path=path):
        cuconv.conv2d(x, w, padding=1)
    return path, x, w, json.loads(path.read_text())


def test_decision_file_is_written_and_read(kernels, tmp_path):
    path, x, w, data = _tuned_file(tmp_path)
    assert data["format"] == 1 and len(data["entries"]) == 1
    entry = next(iter(data["entries"].values()))
    assert entry["kernel"] == "tune_test_tiles" and entry["overrides"] == {"block_n": 128}
    tuner.forget()
    tiles = kernels["tune_test_tiles"]
    runs = tiles.runs
    with cuconv.autotune(path=str(path)):
        y = cuconv.conv2d(x, w, padding=1)
        e = cuconv.explain(x, w, padding=1)
    assert tiles.runs == runs + 1, "a decision read from the file is not measured again"
    assert e.tuning.source == str(path) and e.tuning.chosen.overrides == "block_n=128"
    assert e.plan.describe() == "tune_test_tiles block_n 128"
    np.testing.assert_allclose(y, cuconv.conv2d(x, w, padding=1, kernel="cpu"), rtol=1e-5, atol=1e-5)
    # another problem is added to the same file
    with cuconv.autotune(path=path):
        cuconv.conv2d(x, w, padding=0)
    assert len(json.loads(path.read_text())["entries"]) == 2


def test_stale_file_entry_is_measured_again(kernels, tmp_path):
    path, x, w, data = _tuned_file(tmp_path)
    for entry in data["entries"].values():
        entry["kernel"] = "no_such_kernel"
    path.write_text(json.dumps(data))
    tuner.forget()
    with cuconv.autotune(path=path):
        e = cuconv.explain(x, w, padding=1)
    assert e.tuning.source == "measured" and e.tuning.chosen.overrides == "block_n=128"
    assert next(iter(json.loads(path.read_text())["entries"].values()))["kernel"] == "tune_test_tiles"


def test_no_measuring_during_graph_capture(kernels, monkeypatch):
    """A problem without a decision cannot be measured while its stream captures a CUDA graph (stood in
    for here): the call says so; one decided before the capture runs its decision."""
    x, w = _operands()
    with cuconv.autotune():
        cuconv.conv2d(x, w, padding=1)
        monkeypatch.setattr(tuner, "_capturing", lambda device: True)
        assert cuconv.explain(x, w, padding=1).tuning.chosen.overrides == "block_n=128"
        with pytest.raises(RuntimeError, match="cannot be measured while a CUDA graph is being captured"):
            cuconv.conv2d(x, w, padding=0)


def test_arguments_are_checked(tmp_path):
    with pytest.raises(TypeError, match="enabled"):
        with cuconv.autotune("yes"):
            pass
    with pytest.raises(TypeError, match="path"):
        with cuconv.autotune(path=3):
            pass
    with pytest.raises(ValueError, match="path: expected a file"):
        with cuconv.autotune(path=tmp_path):
            pass
    bad = tmp_path / "bad.json"
    bad.write_text("not json")
    x, w = _operands()
    tuner.forget()
    with pytest.raises(ValueError, match="not an autotune file"):
        with cuconv.autotune(path=bad):
            cuconv.conv2d(x, w, padding=1)
    tuner.forget()


def test_switch_and_file_from_the_environment(kernels, cuconv_env, monkeypatch, tmp_path):
    from cuconv.overrides import current_overrides
    with cuconv_env("CUCONV_AUTOTUNE", "1"):
        assert current_overrides().autotune is True
        with cuconv.autotune(False):
            assert current_overrides().autotune is False
        monkeypatch.setenv("CUCONV_AUTOTUNE_FILE", str(tmp_path / "env.json"))
        x, w = _operands()
        assert cuconv.explain(x, w, padding=1).tuning.chosen.overrides == "block_n=128"
    assert len(json.loads((tmp_path / "env.json").read_text())["entries"]) == 1
    assert current_overrides().autotune is None
    with cuconv_env("CUCONV_AUTOTUNE", "yes"):
        with pytest.raises(ValueError, match="CUCONV_AUTOTUNE"):
            current_overrides()


def _problem(N, H, W, C, K, R, stride=1, pad=None, groups=1, layout="NHWC", dtype="float16"):
    return ConvProblem.create(nd=2, batch=N, in_spatial=(H, W), channels=C, out_channels=K, filter_spatial=(R, R),
                              stride=stride, dilation=1, padding=R // 2 if pad is None else pad, groups=groups,
                              dtype=dtype, layout=layout)


@pytest.mark.parametrize("problem", [
    _problem(16, 80, 80, 64, 64, 3),                          # YOLOv8s 3x3 at 80x80
    _problem(32, 14, 14, 1024, 2048, 1, stride=2, pad=0),     # ResNet-50 layer4 downsample
    _problem(32, 56, 56, 144, 144, 3, groups=144),            # MobileNetV2 depthwise
    _problem(1, 256, 256, 512, 512, 3, layout="NCHW"),        # SD VAE decoder 3x3, NCHW arrays
], ids=["3x3", "1x1-s2", "depthwise", "nchw"])
def test_hopper_candidates(problem):
    """The candidates of real Hopper problems (planned on the CPU): the automatic choice among them, no
    plan twice, no fallback im2col kernel, and tile variations of the Hopper kernel where it runs."""
    from cuconv import dispatch
    base = Overrides()
    auto_plan, _ = dispatch.select(problem, H100, overrides=base)
    rnd = tuner._Round(problem, H100, None, base, tuner.MAX_CANDIDATES)
    rnd.add(base)
    for point in tuner._variations(base):
        rnd.add(point)
    idents = [tuner._identity(c["plan"].kernel, c["plan"]) for c in rnd.order]
    assert len(idents) == len(set(idents))
    assert tuner._identity(auto_plan.kernel, auto_plan) in idents
    names = {c["kernel"] for c in rnd.order}
    assert "generic_gpu" not in names and all(c["error"] is None for c in rnd.order)
    assert 2 <= len(rnd.order) <= tuner.MAX_CANDIDATES
    if auto_plan.kernel.name == "sm90_tma":
        assert any(c["point"].block_n is not None for c in rnd.order if c["kernel"] == "sm90_tma")


def test_variations_leave_the_callers_fields():
    points = tuner._variations(Overrides(block_n=128))
    assert points and all(p.block_n == 128 for p in points)
    assert all(sum(getattr(p, f.name) is not None for f in dataclasses.fields(p)) == 2 for p in points)
    assert not any(p.autotune or p.stacked_phases is not None for p in points)


class _FakeCuda:
    """A stand-in for ``cupy.cuda``'s events: each event reads a clock the test advances."""

    def __init__(self):
        self.clock = 0.0
        self.log = []

    def Event(self):
        cuda = self

        class Event:
            def record(self):
                self.t = cuda.clock
                cuda.log.append("record")

            def synchronize(self):
                pass

        return Event()

    def get_elapsed_time(self, a, b):
        return (b.t - a.t) * 1e3  # ms


class _FakeCupy:
    uint8 = np.uint8

    def __init__(self):
        self.cuda = _FakeCuda()

    def empty(self, n, dtype):
        fake = self

        class Buffer:
            def fill(self, v):
                fake.cuda.clock += 1e-5   # a memset: 10 us of GPU time
                fake.cuda.log.append("fill")

        return Buffer()


def test_gpu_rounds_hold_the_queue_for_the_host_work():
    """On a GPU a round is the GPU time between two events, behind enough memsets to cover the host's work
    of issuing its calls (measured with a stand-in for CuPy whose memsets and calls advance a clock)."""
    ops = object.__new__(tuner._Operands)
    ops.xp = _FakeCupy()
    ops._hold_buffer, ops._fill_seconds, ops.fills = None, None, 8

    def run():
        time.sleep(5e-4)              # 0.5 ms of host work per call ...
        ops.xp.cuda.clock += 5e-6     # ... for 5 us of GPU work

    first = ops.seconds(run, 4)
    assert first == pytest.approx(20e-6)
    assert ops._fill_seconds == pytest.approx(1e-5)
    assert ops.fills >= min(tuner.MAX_FILLS, 1.5 * 2e-3 / 1e-5), "the next rounds hold the queue for 1.5x the host work"
    ops.xp.cuda.log.clear()
    ops.seconds(run, 4)
    assert ops.xp.cuda.log[:ops.fills] == ["fill"] * ops.fills and ops.xp.cuda.log[ops.fills] == "record"


def test_bfloat16_results_are_compared_through_their_bits():
    """A bfloat16 result is widened exactly (its bits shifted into a float32), then compared with the
    first result within :data:`cuconv.autotune.AGREEMENT`."""
    import ml_dtypes
    ops = object.__new__(tuner._Operands)
    ops.xp, ops.reference = np, None
    ops.problem = _problem(1, 4, 4, 8, 8, 1, dtype="bfloat16")
    first = np.random.default_rng(1).standard_normal((4, 8)).astype(ml_dtypes.bfloat16)
    ops.check(first)
    assert np.array_equal(ops.reference, first.astype(np.float32))
    ops.check(first)
    with pytest.raises(ValueError, match="differs from the automatic choice's by"):
        ops.check((first.astype(np.float32) * 1.1).astype(ml_dtypes.bfloat16))
