"""The benchmark's command line, ceilings and results page, on the CPU (cuconv.bench).

What the machine lacks is simulated: ``sys.modules["cupy"] = None`` makes ``import cupy`` fail as on a
machine without CuPy, and a stand-in ``cupy`` whose runtime raises plays a machine without a GPU.
"""

import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from cuconv.bench import Ceilings, cli, conv2d, conv3d, environment, report

ROOT = Path(__file__).resolve().parent.parent
ENTRY_POINTS = [[], ["--suite", "resnet50"], ["--suite", "vae_unet", "--dtype", "float16"], ["--suite", "sm80"],
                ["--suite", "conv3d", "--no-sustained"], ["--quick", "--json", "out.json"]]


@pytest.mark.parametrize("argv", ENTRY_POINTS, ids=lambda a: " ".join(a) or "default")
def test_exits_2_without_cupy(argv, monkeypatch, capsys, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, "cupy", None)
    assert cli.main(argv) == environment.EXIT_UNAVAILABLE
    err = capsys.readouterr().err
    assert "CuPy is not installed" in err and "pip install" in err
    assert not (tmp_path / "out.json").exists()


class _RuntimeError(Exception):
    pass


def _fake_cupy(count=None, error=None):
    def get_device_count():
        if error is not None:
            raise error
        return count
    return types.SimpleNamespace(cuda=types.SimpleNamespace(runtime=types.SimpleNamespace(
        getDeviceCount=get_device_count)))


@pytest.mark.parametrize("argv", ENTRY_POINTS, ids=lambda a: " ".join(a) or "default")
def test_exits_2_without_a_gpu(argv, monkeypatch, capsys, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, "cupy", _fake_cupy(error=_RuntimeError("cudaErrorInsufficientDriver: "
                                                                             "CUDA driver version is insufficient")))
    assert cli.main(argv) == environment.EXIT_UNAVAILABLE
    err = capsys.readouterr().err
    assert "no GPU visible to CuPy" in err and "cudaErrorInsufficientDriver" in err


def test_exits_2_with_zero_devices(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "cupy", _fake_cupy(count=0))
    assert cli.main(["--suite", "conv3d"]) == environment.EXIT_UNAVAILABLE
    assert "0 devices" in capsys.readouterr().err


def test_python_m_entry_point_exits_2_without_cupy():
    """``python -m cuconv.bench`` itself (its __main__), in a process where CuPy cannot import."""
    code = ("import runpy, sys; sys.modules['cupy'] = None; sys.argv = ['cuconv.bench', '--suite', 'sm80']; "
            "runpy.run_module('cuconv.bench', run_name='__main__')")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT)
    assert proc.returncode == 2, proc.stderr
    assert "cuconv.bench: cannot run: CuPy is not installed" in proc.stderr


def test_importing_the_package_needs_neither_cupy_nor_matplotlib():
    code = ("import sys; sys.modules['cupy'] = None; import cuconv.bench, cuconv.bench.cli, cuconv.bench.report, "
            "cuconv.bench.plot, cuconv.models.plot; assert 'matplotlib' not in sys.modules, 'matplotlib imported'")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr


def test_plot_from_json_needs_no_cupy(monkeypatch, tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib is not installed (pip install '.[bench]')")
    import matplotlib
    matplotlib.use("Agg")
    monkeypatch.setitem(sys.modules, "cupy", None)
    png = tmp_path / "h100.png"
    assert cli.main(["--plot", str(png), "--plot-from", str(ROOT / "docs" / "bench" / "h100.json")]) == 0
    assert png.stat().st_size > 10_000


def test_torch_missing_is_named_and_optional(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)
    torch, why = environment.torch_for_cudnn()
    assert torch is None and "torch is not installed" in why and "without the cuDNN comparison" in why
    assert environment.torch_for_cudnn(disabled=True) == (None, "cuDNN comparison off (--no-torch)")


def test_command_line_and_metadata(monkeypatch):
    monkeypatch.setenv("CUCONV_SM90_CLUSTER", "2")
    meta = environment.run_metadata(["--suite", "conv3d", "--json", "a b.json"], "GPU X")
    assert meta["command"] == "CUCONV_SM90_CLUSTER=2 python -m cuconv.bench --suite conv3d --json 'a b.json'"
    assert meta["device"] == "GPU X" and meta["date"][:2] == "20" and meta["date"].endswith("+00:00")


def test_write_json_splits_suites_and_carries_metadata(tmp_path):
    common = {"date": "d", "device": "GPU X", "command": "python -m cuconv.bench", "ceilings": {}}
    cli.write_json(str(tmp_path / "run.json"), [{"name": "a"}], {"sm80": [{"name": "b"}], "conv3d": []},
                   common, {"cuconv": 20.0})
    docs = {p.name: json.loads(p.read_text()) for p in tmp_path.iterdir()}
    assert sorted(docs) == ["run.json", "run_conv3d.json", "run_sm80.json"]
    assert docs["run.json"]["suite"] == "conv2d" and docs["run_sm80.json"]["records"] == [{"name": "b"}]
    assert all(d["device"] == "GPU X" and d["command"] and d["date"] for d in docs.values())


# ---------------------------------------------------------------------------------------------- ceilings
def test_ceilings_name_their_source():
    h100 = Ceilings.for_device("NVIDIA H100 80GB HBM3", measured_gemm_tflops=700.0, measured_copy_tbps=2.9)
    assert h100.compute() == (989.4, "datasheet") and h100.memory() == (2.9, "copy")
    assert Ceilings.for_device("NVIDIA H100 PCIe").datasheet_tflops == 756.5
    unknown = Ceilings.for_device("Some GPU", measured_gemm_tflops=100.0)
    assert unknown.compute() == (100.0, "GEMM") and unknown.memory() == (None, "")
    # compute-bound (intensity 1000 FLOP/B above the ridge of ~341): the share of the datasheet peak
    frac, name = h100.fraction(1e12, 1e9, 2.0)
    assert name == "datasheet" and frac == pytest.approx(500.0 / 989.4)
    frac, name = h100.fraction(1e12, 1e10, 10.0)  # 100 FLOP/B: the share of the copy bandwidth
    assert name == "copy" and frac == pytest.approx(1.0 / 2.9)
    assert Ceilings.from_json({"ceilings": h100.to_json()}) == h100


def test_legacy_ceilings_block_reads_the_copy_and_not_the_unnamed_peak():
    c = Ceilings.from_json({"device": "NVIDIA H100 80GB HBM3 (sm_90a, 132 SMs)",
                            "ceilings": {"tflops": 760.0, "tbps": 2.95}})
    assert c.compute() == (989.4, "datasheet") and c.memory() == (2.95, "copy")
    assert c.measured_gemm_tflops is None


def test_no_recorded_h100_row_exceeds_its_roof():
    """The roof is a ceiling: every timed row of the H100 results stays under it."""
    for name in ("h100.json", "h100_conv3d.json"):
        doc = report.load_result(str(ROOT / "docs" / "bench" / name))
        c = Ceilings.from_json(doc)
        for r in doc["records"]:
            for impl, ms in r["ms"].items():
                frac, roof = c.fraction(r["flops"], r.get("bytes"), ms)
                assert roof and frac < 1.0, (name, r["name"], impl, frac, roof)


def test_result_lines_name_the_roof():
    c = Ceilings(datasheet_tflops=1000.0, datasheet_source="X", measured_copy_tbps=2.0)
    rec = {"name": "a", "dtype": "bfloat16", "flops": 1e12, "bytes": 1e9, "ms": {"cuconv": 2.0, "cudnn": 3.0}}
    assert "50.0% of datasheet" in conv2d.summary_line(rec, c) and "1.50x" in conv2d.summary_line(rec, c)
    rec = dict(rec, bytes=1e10, ms={"cuconv": 10.0})
    assert "50.0% of copy" in conv2d.summary_line(rec, c)
    rec3 = {"name": "b", "dtype": "float16", "rel_error": 1e-3, "kernel": "conv3d_native", "ms": {"native": 1.0},
            "tflops": {"native": 810.0}, "extra_mib": {"native": 0.0}}
    assert "(81% of datasheet)" in conv3d.result_line(rec3, c)


# ---------------------------------------------------------------------------------------------- report
def _write(path: Path, doc) -> None:
    path.write_text(json.dumps(doc))


def test_report_from_a_small_fixture(tmp_path):
    # Placeholder timings in the benchmark's formats, not measurements.
    _write(tmp_path / "run.json", {
        "suite": "conv2d", "date": "2030-01-02T03:04:05+00:00", "device": "GPU X (sm_90a, 132 SMs)",
        "command": "python -m cuconv.bench --suite resnet50 --json run.json",
        "ceilings": {"datasheet_tflops": 1000.0, "datasheet_source": "X", "measured_copy_tbps": 2.0},
        "records": [
            {"name": "N1 C8 4x4 K8 3x3 s1 p1", "dtype": "bfloat16", "kernel": "sm90_tma", "flops": 1e12,
             "bytes": 1e9, "ms": {"cuconv": 2.0, "cuconv_graph": 1.9, "cudnn": 3.0}, "check_ok": True},
            {"name": "N1 C8 4x4 K8 1x1 s1 p0", "dtype": "float16", "flops": 1e12, "bytes": 1e9, "ms": {},
             "check_ok": False}]})
    _write(tmp_path / "run_conv3d.json", {"records": [  # no date, device or command: from the sidecar
        {"name": "N1 C8 D3 4x4 K8 3x3x3", "shape": {"N": 1, "C": 8, "D": 3, "H": 4, "W": 4, "K": 8},
         "dtype": "bfloat16", "kernel": "conv3d_native", "flops": 5e11, "check_ok": True,
         "ms": {"native": 1.0, "qslice": 2.0, "cudnn": 1.5, "auto_paired": 1.0, "cudnn_paired": 1.2},
         "vs_cudnn_paired": 1.25}]})
    _write(tmp_path / "run_conv3d.meta.json", {"device": "GPU Y"})
    (tmp_path / "run_conv3d.log").write_text("log\n")
    _write(tmp_path / "old_sm80.json", {"rows": [
        {"label": "matmul 8192^3", "dtype": "bfloat16", "flops": 1.1e12, "bytes": 4e8,
         "ms": {"sm80_igemm": 2.0, "cupy.matmul": 1.5}, "notes": []}]})
    (tmp_path / "other.log").write_text("log\n")
    _write(tmp_path / "other.meta.json", {"command": "CUCONV_X=1 python -m cuconv.bench --quick"})

    page = report.render(str(tmp_path))
    for heading in ("## run.json: conv2d", "## run_conv3d.json: conv3d", "## old_sm80.json: sm80"):
        assert heading in page
    assert "- date: 2030-01-02T03:04:05+00:00" in page and "- device: GPU X (sm_90a, 132 SMs)" in page
    assert "- command: `python -m cuconv.bench --suite resnet50 --json run.json`" in page
    row = ("| N1 C8 4x4 K8 3x3 s1 p1 | bfloat16 | sm90_tma | 2.000 | 1.900 | 3.000 | 1.50x | 500 | 0.50 "
           "| 50% datasheet |")
    assert row in page
    assert "| N1 C8 4x4 K8 1x1 s1 p0 | float16 | - | check failed |" in page
    conv3d_part = page.split("## run_conv3d.json")[1].split("## ")[0]
    assert "- device: GPU Y" in conv3d_part and "- date: not recorded" in conv3d_part
    assert "- command: not recorded" in conv3d_part and "[run_conv3d.log](run_conv3d.log)" in conv3d_part
    assert "| 1.000 | 1.200 | 1.25x | 500 |" in conv3d_part and "qslice 2.000 ms" in conv3d_part
    assert "| matmul 8192^3 | bfloat16 | 2.000 | 1.500 (cuBLAS) | 0.75x |" in page
    assert "- [other.log](other.log): `CUCONV_X=1 python -m cuconv.bench --quick`" in page
    assert "geomean speed vs cuDNN: 1.500x over 1 rows" in page

    out = report.write_report(str(tmp_path))
    assert Path(out).read_text() == page
    assert report.main(["--dir", str(tmp_path), "--check"]) == 0
    Path(out).write_text(page + "edited by hand\n")
    assert report.main(["--dir", str(tmp_path), "--check"]) == 1
    assert cli.main(["--report", str(tmp_path)]) == 0 and Path(out).read_text() == page


def test_docs_bench_readme_is_generated_from_its_json():
    """docs/bench/README.md is what ``python -m cuconv.bench.report`` makes of docs/bench."""
    assert report.main(["--dir", str(ROOT / "docs" / "bench"), "--check"]) == 0


def test_a_full_run_with_the_gpu_work_replaced(monkeypatch, tmp_path, capsys):
    """The command line's wiring on the CPU: every suite runs (its GPU work replaced by placeholders, not
    measurements), the JSON files carry date, device, command and ceilings, and the page renders them."""
    import contextlib
    import dataclasses

    import cuconv
    from cuconv.bench import sm80, timing

    pool = types.SimpleNamespace(free_all_blocks=lambda: None)
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(get_default_memory_pool=lambda: pool))
    dev = types.SimpleNamespace(name="NVIDIA H100 80GB HBM3", describe=lambda: "NVIDIA H100 80GB HBM3 (sm_90a)")
    monkeypatch.setattr(cli, "require_gpu", lambda: dev)
    monkeypatch.setattr(cli, "torch_for_cudnn", lambda disabled=False: (None, "torch is not installed: ..."))
    monkeypatch.setattr(cli, "spin_up", lambda: None)
    monkeypatch.setattr(cli, "measure", lambda name, log: Ceilings.for_device(name, measured_copy_tbps=3.0,
                                                                               measured_gemm_tflops=700.0))
    monkeypatch.setattr(conv2d, "host_overhead_us", lambda with_torch: {"cuconv": 20.0})
    monkeypatch.setattr(conv2d, "bench_shape", lambda s, dt, **kw: {
        "name": s.name, "shape": dataclasses.asdict(s), "dtype": dt, "flops": 1e12, "bytes": 1e9, "ms": {"cuconv": 2.0},
        "notes": [], "kernel": "sm90_tma", "check_ok": True})
    monkeypatch.setattr(conv2d, "bench_sustained", lambda *a, **k: {"cuconv": 2.1, "gpu": {}})
    monkeypatch.setattr(conv3d, "bench_shape3d", lambda s, dt, **kw: {
        "name": s.name, "shape": dataclasses.asdict(s), "dtype": dt, "flops": s.flops, "ms": {"native": 1.0},
        "tflops": {"native": s.flops / 1e9}, "extra_mib": {}, "declined": {}, "kernel": "conv3d_native",
        "rel_error": 1e-3, "check_ok": True})
    monkeypatch.setattr(conv3d, "sustained3d", lambda *a, **k: {"cuconv": 1.1, "gpu": {}})
    forced = []
    monkeypatch.setattr(cuconv, "overrides", lambda **kw: forced.append(kw) or contextlib.nullcontext(),
                        raising=False)
    monkeypatch.setattr(sm80, "conv_case", lambda label, *a, **k: {
        "name": label, "dtype": "bfloat16", "flops": 1e12, "bytes": 1e9, "ms": {"sm80_igemm": 1.0}, "notes": []})
    monkeypatch.setattr(sm80, "matmul_case", lambda n, dt, runs, log: {
        "name": f"matmul {n}^3", "dtype": dt, "flops": 2 * n ** 3, "bytes": 1e9, "ms": {"sm80_igemm": 1.0},
        "notes": []})
    monkeypatch.setattr(timing, "time_calls", lambda *a, **k: pytest.fail("timed on the CPU"))

    (tmp_path / "out").mkdir()
    argv = ["--dtype", "bfloat16", "--quick", "--json", str(tmp_path / "out" / "run.json")]
    assert cli.main(argv) == 0
    printed = capsys.readouterr().out
    assert "torch is not installed" in printed and "measured copy 3.00 TB/s" in printed
    assert "% of datasheet" in printed
    assert forced == [{"sm80_subpath": "per_lane"}] * 3
    docs = {p.name: json.loads(p.read_text()) for p in (tmp_path / "out").iterdir()}
    assert sorted(docs) == ["run.json", "run_conv3d.json", "run_sm80.json"]
    for doc in docs.values():
        assert doc["device"] == "NVIDIA H100 80GB HBM3 (sm_90a)" and doc["date"]
        assert doc["command"].endswith("python -m cuconv.bench " + " ".join(argv))
        assert doc["ceilings"]["datasheet_tflops"] == 989.4 and doc["ceilings"]["measured_copy_tbps"] == 3.0
    assert len(docs["run.json"]["records"]) == len(conv2d.SUITES["resnet50"]) + len(conv2d.SUITES["vae_unet"])
    assert all("cuconv_sustained" in r["ms"] for r in docs["run.json"]["records"])
    page = report.render(str(tmp_path / "out"))
    assert page.count("- command: `") == 3 and "## run_sm80.json: sm80" in page


def test_first_call_exits_2_without_a_gpu(monkeypatch, capsys):
    from cuconv.bench import first_call
    monkeypatch.setitem(sys.modules, "cupy", _fake_cupy(count=0))
    assert first_call.main(["--network", "mobilenet_v2"]) == environment.EXIT_UNAVAILABLE
    assert "0 devices" in capsys.readouterr().err


@pytest.mark.parametrize("with_store", [False, True])
def test_first_call_runs_each_mode_in_a_fresh_process_with_an_empty_cache(monkeypatch, capsys, tmp_path, with_store):
    """The parent only starts children: one per mode, each with its own (new, empty) cache folder; with a
    prebuilt store in use, each mode once with it and once with it off."""
    from cuconv import prebuilt
    from cuconv.bench import first_call
    monkeypatch.setattr(environment, "require_gpu", lambda: None)
    prebuilt._load.cache_clear()
    if with_store:
        (tmp_path / prebuilt.INDEX).write_text(json.dumps({"format": prebuilt.FORMAT, "tree_hash": "t",
                                                           "nvrtc": [13, 0], "entries": {}}))
    monkeypatch.setenv("CUCONV_PREBUILT", str(tmp_path))
    seen = []

    def fake_run(cmd, env):
        cache = env["CUCONV_CACHE_DIR"]
        fresh = [env[v] for v in ("CUCONV_CACHE_DIR", "CUPY_CACHE_DIR", "CUCONV_COMPILE_LOG")]
        assert len(set(fresh)) == 3 and not any(os.path.exists(f) for f in fresh)
        seen.append((cmd[cmd.index("--mode") + 1], env.get("CUCONV_PREBUILT"), cache, []))
        return types.SimpleNamespace(returncode=0)

    monkeypatch.setattr(first_call.subprocess, "run", fake_run)
    assert first_call.main(["--network", "resnet50"]) == 0
    prebuilt._load.cache_clear()
    stores = [str(tmp_path), "0"] if with_store else [str(tmp_path)]
    assert [(m, s) for m, s, _, _ in seen] == [(m, s) for s in stores for m in first_call.MODES]
    assert len({c for _, _, c, _ in seen}) == len(seen) and all(files == [] for *_, files in seen)
    head = capsys.readouterr().out.splitlines()[0]
    assert head.endswith(f"prebuilt store {tmp_path}: no variants (NVRTC 13.0); compiled from other kernel "
                         f"sources than these, so it serves none of them" if with_store else "no prebuilt store")


def test_first_call_kernels_only_needs_no_gpu(monkeypatch, capsys, tmp_path):
    """``--kernels-only ARCH``: the parent starts its children without asking for a GPU; a child resolves
    each layer's variants for the model GPU of ARCH (here with the compile step recorded, not run)."""
    from cuconv import compiler
    from cuconv.bench import first_call
    from cuconv.bench.networks import NETWORKS
    monkeypatch.setitem(sys.modules, "cupy", _fake_cupy(count=0))
    monkeypatch.setenv("CUCONV_PREBUILT", "0")
    cmds = []
    monkeypatch.setattr(first_call.subprocess, "run",
                        lambda cmd, env: cmds.append(cmd) or types.SimpleNamespace(returncode=0))
    assert first_call.main(["--network", "resnet50", "--kernels-only", "sm_90a"]) == 0
    assert [c[c.index("--kernels-only") + 1] for c in cmds] == ["sm_90a"] * len(first_call.MODES)
    assert capsys.readouterr().out.endswith("no prebuilt store\n")

    monkeypatch.setenv("CUCONV_CACHE_DIR", str(tmp_path))
    log = tmp_path / "compile.jsonl"
    monkeypatch.setenv("CUCONV_COMPILE_LOG", str(log))
    asked = []

    def record(source, arch, defines):  # what the compiler logs, without compiling
        asked.append((source, arch))
        compiler._record_use(source, arch, tuple(sorted(defines.items())), (), "nvrtc" if len(asked) % 2 else "store",
                             0.0)

    monkeypatch.setattr(compiler, "compile_cuda", record)
    line = first_call.kernels_of_first_pass("resnet50", "bfloat16", False, "sm_90a")
    assert line.startswith("resnet50 bfloat16       as met, no store: kernels for H100 SXM / H200 ready in")
    n = len(asked)
    assert line.endswith(f"({n} variants: {n // 2} from the store, {n - n // 2} compiled by NVRTC)")
    assert len(asked) >= len(NETWORKS["resnet50"].layers) and {a for _, a in asked} == {"sm_90a"}


def test_first_call_steps_count_their_time_and_new_variants(monkeypatch, tmp_path):
    from cuconv.bench import first_call
    log = tmp_path / "compile.jsonl"
    monkeypatch.setenv("CUCONV_COMPILE_LOG", str(log))
    steps, clock = [], iter([10.5, 12.0, 12.25])
    monkeypatch.setattr(first_call.time, "perf_counter", lambda: next(clock))
    log.write_text("{}\n{}\n")
    first_call._step(steps, "conv1", 10.0)
    first_call._step(steps, "layer1", 10.0)
    log.write_text("{}\n{}\n{}\n")
    first_call._step(steps, "layer2", 10.0)
    assert steps == [(0.5, "conv1", 2), (1.5, "layer1", 0), (0.25, "layer2", 1)]


def test_host_work_exits_2_without_a_gpu(monkeypatch, capsys):
    from cuconv.bench import host_work
    monkeypatch.setitem(sys.modules, "cupy", _fake_cupy(count=0))
    assert host_work.main([]) == environment.EXIT_UNAVAILABLE
    assert "0 devices" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        host_work.main(["--calls", "5"])


def test_host_work_python_only_runs_without_a_gpu(capsys):
    """``--python-only`` times the channels-last cases on NumPy operands and puts the CPU plan's run back."""
    from cuconv.backends.cpu import CPUPlan
    from cuconv.bench import host_work
    run = CPUPlan.run
    assert host_work.main(["--python-only", "--calls", "100"]) == 0
    assert CPUPlan.run is run
    printed = capsys.readouterr().out
    for label, _, _, kw in host_work.CASES:
        assert (label in printed) == ("layout" not in kw), label

def test_host_work_cases_are_valid_convolutions():
    """Every case is a valid call (checked on the CPU with NumPy arrays of its shapes)."""
    import numpy as np

    import cuconv
    from cuconv.bench import host_work
    for label, xs, ws, kw in host_work.CASES:
        y = cuconv.conv2d(np.zeros(xs, np.float32), np.zeros(ws, np.float32), **kw)
        channels = y.shape[1] if kw.get("layout") == "NCHW" else y.shape[-1]
        assert y.shape[0] == xs[0] and channels == ws[0], label


@pytest.mark.parametrize("argv,message", [
    (["--dtype", "float32"], "--dtype float32: the networks suite only"),
    (["--suite", "resnet50", "--dtype", "float32"], "--dtype float32: the networks suite only"),
    (["--network", "resnet50", "--precision", "tf32"], "--precision: applies to float32 arrays"),
    (["--suite", "conv3d", "--dtype", "float64"], "--dtype float64: the networks suite only"),
    (["--network", "resnet50", "--dtype", "float64", "--precision", "tf32"], "--precision: applies to float32 arrays"),
    (["--autotune"], "--autotune: the networks suite only"),
    (["--suite", "conv3d", "--autotune", "tuned.json"], "--autotune: the networks suite only"),
])
def test_float32_options_are_checked_before_any_gpu_work(argv, message, capsys):
    from cuconv.bench import cli
    with pytest.raises(SystemExit):
        cli.main(argv)
    assert message in capsys.readouterr().err


def test_grad_suite_options_and_results_page(tmp_path, capsys):
    """``--suite grad`` is opt-in and takes ``--network``; ``--network`` with another suite is an error;
    a grad result file gets its own table on the results page."""
    from cuconv.bench import cli, report
    args = cli.parser().parse_args(["--suite", "grad", "--network", "resnet50"])
    assert args.suite == ["grad"] and args.network == ["resnet50"]
    with pytest.raises(SystemExit):
        cli.main(["--suite", "resnet50", "--network", "resnet50"])
    assert "--network: picks networks of the networks and grad suites" in capsys.readouterr().err
    doc = dict(suite="grad", date="2026-01-01", device="test GPU", command="python -m cuconv.bench --suite grad",
               records=[dict(network="resnet50", title="ResNet-50", batch=32, grad="dw", dtype="bfloat16",
                             ms=dict(cuconv=2.0, cudnn=1.5), layers=[], check_ok=True),
                        dict(name="up2x2", describe="C64 8x8 -> C32 2x2 s2 p0", grad="transpose", dtype="bfloat16",
                             ms=dict(cuconv=0.5, cudnn=0.1), check_ok=False)])
    (tmp_path / "g.json").write_text(json.dumps(doc))
    page = report.render(str(tmp_path))
    assert "## g.json: grad" in page
    assert "| ResNet-50, N=32: every layer | weight | bfloat16 | 1.500 | 2.000 | 0.75x |" in page
    assert "transposed conv" in page and "0.20x" in page


@pytest.mark.parametrize("flag,path", [(None, None), ("", None), ("tuned.json", "tuned.json")])
def test_networks_suite_runs_under_autotune_when_asked(monkeypatch, flag, path):
    """``--autotune [FILE]``: the networks suite's cuconv calls run inside ``cuconv.autotune(path=FILE)``;
    without it the overrides in force are left as they are."""
    import importlib
    import os

    from cuconv.bench.networks import runner
    from cuconv.overrides import current_overrides
    tuner = importlib.import_module("cuconv.autotune")
    seen = {}

    def fake_run(names, dtypes, **kw):
        seen["autotune"], seen["path"] = current_overrides().autotune, tuner._PATH.get()
        return []

    monkeypatch.setattr(runner, "run", fake_run)
    args = types.SimpleNamespace(network=["resnet50"], layout="NHWC", precision=None, layers=False, autotune=flag)
    cli._run_networks(args, ["float16"], None, lambda *a: None)
    assert seen["autotune"] is (None if flag is None else True)
    assert seen["path"] == (os.path.abspath(path) if path else None)
