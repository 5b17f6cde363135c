"""The benchmark's sustained pass (cuconv.bench.timing): alternation, medians, the nvidia-smi monitor.

CPU only: the timing itself is replaced, these check the bookkeeping around it.
"""
import subprocess

import pytest

from cuconv.bench import conv2d, conv3d, timing


def test_sustained_pair_alternates_and_takes_medians(monkeypatch):
    order = []
    times = {"cuconv": iter([2.0, 1.0, 3.0]), "cudnn": iter([4.0, 6.0, 5.0])}

    def fake(fn, sets, est_ms, torch_events=False):
        name = fn(0)
        order.append(name)
        assert torch_events == (name == "cudnn")  # cuDNN's events come from torch
        return {"ms": next(times[name]), "sm_mhz": 1400.0, "watts": 699.0}

    monkeypatch.setattr(timing, "SUSTAIN_ROUNDS", 3)
    monkeypatch.setattr(timing, "time_sustained", fake)
    out = timing.sustained_pair(lambda i: "cuconv", lambda i: "cudnn", sets=2, est_ms=0.3)
    assert order == ["cuconv", "cudnn"] * 3
    assert out["cuconv"] == 2.0 and out["cudnn"] == 5.0
    assert out["gpu"]["cudnn"] == {"sm_mhz": 1400.0, "watts": 699.0}


def test_sustained_pair_without_cudnn(monkeypatch):
    monkeypatch.setattr(timing, "time_sustained", lambda fn, sets, est_ms, torch_events=False: {"ms": 1.5})
    out = timing.sustained_pair(lambda i: None, None, sets=1, est_ms=1.0)
    assert out["cuconv"] == 1.5 and "cudnn" not in out


def test_gpu_monitor_without_nvidia_smi(monkeypatch):
    monkeypatch.setattr("shutil.which", lambda name: None)
    with timing.GpuMonitor() as mon:
        pass
    assert mon.result == {}


class _FakeSmi:
    def __init__(self, lines):
        self.lines = lines
        self.terminated = False

    def terminate(self):
        self.terminated = True

    def communicate(self, timeout=None):
        return ("\n".join(self.lines), "")

    def kill(self):
        pass


def test_gpu_monitor_parses_medians(monkeypatch):
    fake = _FakeSmi(["1410, 698.5, 0x0000000000000004", "1500, 690.0, 0x0000000000000004",
                     "garbage line", "1395, 700.1, 0x0000000000000000"])
    monkeypatch.setattr("shutil.which", lambda name: "/usr/bin/nvidia-smi")
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: fake)
    with timing.GpuMonitor() as mon:
        pass
    assert fake.terminated
    assert mon.result["sm_mhz"] == 1410.0 and mon.result["watts"] == 698.5
    assert mon.result["reasons"] == ["0x0000000000000000", "0x0000000000000004"]


@pytest.mark.parametrize("gpu", [{}, {"cuconv": {"sm_mhz": 1470.0, "watts": 698.0},
                                      "cudnn": {"sm_mhz": 1440.0, "watts": 689.0}}])
def test_sustained_lines(gpu):
    rec = {"name": "N2 C256", "dtype": "bfloat16", "ms": {"cuconv_sustained": 0.332, "cudnn_sustained": 0.348},
           "sustained_gpu": gpu}
    line = conv2d.sustained_line(rec)
    assert "1.05x" in line and ("1470 MHz" in line) == bool(gpu)
    rec3 = {"name": "N2 C256", "dtype": "bfloat16", "sustained": {"cuconv": 0.332, "cudnn": 0.348, "gpu": gpu}}
    assert "1.05x cuDNN" in conv3d.sustained_line(rec3)


def test_conv3d_line_prints_the_paired_ratio():
    rec = {"name": "N2 C256", "dtype": "bfloat16", "rel_error": 1e-3, "kernel": "conv3d_native",
           "ms": {"native": 0.287, "cudnn": 0.290, "auto_paired": 0.310, "cudnn_paired": 0.316},
           "tflops": {"native": 807.0, "cudnn": 800.0, "auto_paired": 749.0, "cudnn_paired": 734.0},
           "extra_mib": {"native": 0.0}, "vs_cudnn_paired": 1.007}
    text = conv3d.result_line(rec)
    assert "1.007x (median; 0.310 vs 0.316 ms)" in text
    assert "auto_paired" not in text and "cudnn_paired" not in text
