"""The prebuilt kernel store (cuconv/prebuilt/): what the catalog holds, how a store is built, and how a
kernel-cache miss reads it instead of compiling (NVRTC, no GPU).

Each test builds a small store of light variants in a temporary folder, with its own kernel cache, and
forgets what the process compiled, so every lookup goes through the store.
"""

from __future__ import annotations

import json
import lzma
import os
import shutil
import warnings

import pytest

from cuconv import compiler, dispatch, kernel_cache, prebuilt
from cuconv.bench.networks import NETWORKS
from cuconv.overrides import Overrides
from cuconv.precompile import call_jobs
from cuconv.prebuilt import build as store_build
from cuconv.prebuilt.__main__ import main as cli
from cuconv.problem import ConvProblem, Epilogue

from conftest import nvrtc_available
from geometry import H100, problem2d

TRANSPOSE = store_build.Job("layout/transpose.cu", "sm_90a", ())
FLIP = store_build.Job("layout/flip_filter.cu", "sm_80", ())
SCATTER = store_build.Job("layout/phase_scatter.cu", "sm_90a", ())  # in no store

needs_nvrtc = pytest.mark.skipif(not nvrtc_available(), reason="needs NVRTC (cuda-bindings)")


def _forget():
    kernel_cache._usable_dir.cache_clear()
    prebuilt._load.cache_clear()
    compiler._COMPILED.clear()


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CUCONV_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(compiler, "_COMPILED", {})
    _forget()
    yield tmp_path
    _forget()


@pytest.fixture
def nvrtc_calls(monkeypatch):
    """The sources NVRTC compiles from here on (it still compiles them)."""
    calls = []
    real = compiler._nvrtc_compile

    def counting(source_rel, arch, opts):
        calls.append((source_rel, arch))
        return real(source_rel, arch, opts)

    monkeypatch.setattr(compiler, "_nvrtc_compile", counting)
    return calls


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A store of two light variants (built once for the module)."""
    folder = tmp_path_factory.mktemp("store") / "cubins"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CUCONV_LINEINFO", "1")  # the builder leaves line tables out all the same
        assert store_build.build(folder, [TRANSPOSE, FLIP, TRANSPOSE], workers=2) == 2
    return folder


def _compile(job):
    return compiler.compile_cuda(job.source, job.arch, dict(job.defines))


# --- the key -------------------------------------------------------------------------------------------

def test_key_ignores_where_the_sources_lie_and_nothing_else():
    opts = ["--gpu-architecture=sm_90a", "-I/site-packages/cuconv/kernels_cu", "-DCUCONV_BM=128"]
    key = prebuilt.entry_key("tree", "sm90/conv_fprop_sm90.cu", "sm_90a", opts)
    assert key == prebuilt.entry_key("tree", "sm90/conv_fprop_sm90.cu", "sm_90a",
                                     [o.replace("/site-packages", "/home/me/checkout") for o in opts])
    assert key.startswith("conv_fprop_sm90-sm_90a-")
    others = [("tree2", "sm90/conv_fprop_sm90.cu", "sm_90a", opts),
              ("tree", "sm80/conv2d_fprop_sm80.cu", "sm_90a", opts),
              ("tree", "sm90/conv_fprop_sm90.cu", "sm_80", opts),
              ("tree", "sm90/conv_fprop_sm90.cu", "sm_90a", opts[:-1] + ["-DCUCONV_BM=64"]),
              ("tree", "sm90/conv_fprop_sm90.cu", "sm_90a", opts + ["-lineinfo"])]
    assert len({key} | {prebuilt.entry_key(*o) for o in others}) == 1 + len(others)


# --- which store -----------------------------------------------------------------------------------------

def test_store_folder_from_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("CUCONV_PREBUILT", raising=False)
    assert prebuilt.store_dir() == prebuilt._PACKAGE_STORE
    for off in ("0", "off", "OFF", " ", "false"):
        monkeypatch.setenv("CUCONV_PREBUILT", off)
        assert prebuilt.store_dir() is None
    monkeypatch.setenv("CUCONV_PREBUILT", str(tmp_path))
    assert prebuilt.store_dir() == tmp_path
    assert prebuilt.open_store() is None  # a folder without an index holds nothing


def test_an_unreadable_index_warns_and_holds_nothing(monkeypatch, tmp_path):
    prebuilt._load.cache_clear()
    (tmp_path / prebuilt.INDEX).write_text("{not json")
    monkeypatch.setenv("CUCONV_PREBUILT", str(tmp_path))
    with pytest.warns(RuntimeWarning, match="cannot be read"):
        assert prebuilt.open_store() is None
    (tmp_path / prebuilt.INDEX).write_text(json.dumps({"format": 99, "entries": {}}))
    with pytest.warns(RuntimeWarning, match="not of format 1"):
        assert prebuilt.open_store() is None
    prebuilt._load.cache_clear()


# --- a store built and read ------------------------------------------------------------------------------

@needs_nvrtc
def test_built_store_lists_its_variants(store):
    index = json.loads((store / prebuilt.INDEX).read_text())
    assert index["format"] == prebuilt.FORMAT and index["tree_hash"] == compiler.tree_hash("cu")
    assert len(index["nvrtc"]) == 2
    assert {(e["source"], e["arch"]) for e in index["entries"].values()} == {
        (TRANSPOSE.source, TRANSPOSE.arch), (FLIP.source, FLIP.arch)}
    for key, e in index["entries"].items():
        assert (store / e["file"]).exists() and "Compiling entry function" in e["log"]
    s = prebuilt.open_store(store)
    assert s.describe(compiler.tree_hash("cu")) == (
        f"prebuilt store {store}: 1 for sm_80, 1 for sm_90a (NVRTC {'.'.join(map(str, index['nvrtc']))})")
    assert s.describe("another tree").endswith("so it serves none of them")


@needs_nvrtc
def test_a_cache_miss_reads_the_store_instead_of_compiling(store, fresh_cache, monkeypatch, nvrtc_calls):
    # what NVRTC makes of the variant, compiled here with the store off
    monkeypatch.setenv("CUCONV_PREBUILT", "0")
    compiled_path, compiled_report = _compile(TRANSPOSE)
    with open(compiled_path, "rb") as f:
        compiled = f.read()
    assert nvrtc_calls == [(TRANSPOSE.source, TRANSPOSE.arch)]
    kernel_cache.clear_entries()
    _forget()
    # with the store: the same cubin and ptxas report, and NVRTC not called
    monkeypatch.setenv("CUCONV_PREBUILT", str(store))
    path, report = _compile(TRANSPOSE)
    assert nvrtc_calls == [(TRANSPOSE.source, TRANSPOSE.arch)]
    with open(path, "rb") as f:
        assert f.read() == compiled
    assert report.functions == compiled_report.functions and report.functions
    # it went into the kernel cache: the next process finds it there
    assert len(kernel_cache._entries()) == 1
    # a variant the store does not hold is compiled
    _compile(store_build.Job("layout/phase_scatter.cu", "sm_90a", ()))
    assert nvrtc_calls[-1] == ("layout/phase_scatter.cu", "sm_90a")


@needs_nvrtc
def test_line_tables_asked_are_compiled_past_the_store(store, fresh_cache, monkeypatch, nvrtc_calls):
    """The store holds cubins without line tables (even when built with ``CUCONV_LINEINFO`` set); a process
    that asks for them compiles its own."""
    monkeypatch.setenv("CUCONV_PREBUILT", str(store))
    monkeypatch.setenv("CUCONV_LINEINFO", "1")
    _compile(TRANSPOSE)
    assert nvrtc_calls == [(TRANSPOSE.source, TRANSPOSE.arch)]
    monkeypatch.delenv("CUCONV_LINEINFO")
    _compile(TRANSPOSE)
    assert len(nvrtc_calls) == 1


@needs_nvrtc
def test_a_refused_cubin_is_compiled_not_read_again(store, fresh_cache, monkeypatch, nvrtc_calls):
    """The driver refusing what the cache held compiles afresh (``fresh``), past the store."""
    monkeypatch.setenv("CUCONV_PREBUILT", str(store))
    _compile(TRANSPOSE)
    assert nvrtc_calls == []
    compiler._compile(TRANSPOSE.source, TRANSPOSE.arch, (), (), fresh=True)
    assert nvrtc_calls == [(TRANSPOSE.source, TRANSPOSE.arch)]


@needs_nvrtc
def test_a_damaged_entry_is_compiled_with_a_warning(store, fresh_cache, monkeypatch, nvrtc_calls, tmp_path):
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    index = json.loads((store / prebuilt.INDEX).read_text())
    for e in index["entries"].values():
        data = lzma.decompress((store / e["file"]).read_bytes())
        if e["source"] == TRANSPOSE.source:
            data = data[:-1] + bytes([data[-1] ^ 1])  # one bit changed: it decompresses, its digest differs
        (damaged / e["file"]).write_bytes(lzma.compress(data))
    (damaged / prebuilt.INDEX).write_text(json.dumps(index))
    monkeypatch.setenv("CUCONV_PREBUILT", str(damaged))
    with pytest.warns(RuntimeWarning, match="prebuilt kernel .* is damaged"):
        _compile(TRANSPOSE)
    assert nvrtc_calls == [(TRANSPOSE.source, TRANSPOSE.arch)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _compile(FLIP)  # the sound entry still serves
    assert len(nvrtc_calls) == 1


@needs_nvrtc
def test_a_store_of_other_sources_or_turned_off_serves_nothing(store, fresh_cache, monkeypatch, nvrtc_calls,
                                                               tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    index = json.loads((store / prebuilt.INDEX).read_text())
    for e in index["entries"].values():
        (other / e["file"]).write_bytes((store / e["file"]).read_bytes())
    index["tree_hash"] = "0" * 64
    (other / prebuilt.INDEX).write_text(json.dumps(index))
    monkeypatch.setenv("CUCONV_PREBUILT", str(other))
    _compile(TRANSPOSE)
    monkeypatch.setenv("CUCONV_PREBUILT", "off")
    _compile(FLIP)
    assert nvrtc_calls == [(TRANSPOSE.source, TRANSPOSE.arch), (FLIP.source, FLIP.arch)]


# --- the catalog -----------------------------------------------------------------------------------------

def _layer_problem(L, N, dtype="bfloat16", layout="NHWC"):
    return ConvProblem.create(nd=2, batch=N, in_spatial=(L.H, L.W), channels=L.C, out_channels=L.K,
                              filter_spatial=(L.R, L.S), stride=L.stride, dilation=L.dilation, padding=L.pad,
                              groups=L.groups, dtype=dtype, layout=layout)


def test_catalog_holds_every_variant_of_the_networks_first_pass():
    """Every variant that a network's layers load on an H100, at the suite's batch and at batch 1, is in the
    catalog, and nothing for another architecture."""
    jobs = store_build.catalog(archs=["sm_90a"], networks=["resnet50", "yolov8s"], dtypes=["bfloat16"],
                               layouts=["NHWC", "NCHW"], epilogues=["none"])
    assert len(jobs) == len(set(jobs)) and {j.arch for j in jobs} == {"sm_90a"}
    held = set(jobs)
    sources = set()
    for name in ("resnet50", "yolov8s"):
        for L in NETWORKS[name].layers:
            for N in (L.N, 1):
                for layout in ("NHWC", "NCHW"):
                    plan = dispatch.select(_layer_problem(L, N, layout=layout), H100, overrides=Overrides())[0]
                    for source, defines in call_jobs(plan):
                        assert store_build.Job(source, "sm_90a", tuple(sorted(defines.items()))) in held
                        sources.add(source)
    assert {"sm90/conv_fprop_sm90.cu", "layout/transpose.cu"} <= sources


def _unlisted_networks():
    """Conv layers (N-free: H, C, K, filter, stride, padding) of networks the suite does not list: ResNet-18,
    VGG-16, DenseNet-121 (growth 32) and a 2-D U-Net on one-channel 256 x 256 images."""
    resnet18 = [(224, 3, 64, 7, 2, 3)] + [(h, c, c, 3, 1, 1) for c, h in ((64, 56), (128, 28), (256, 14), (512, 7))]
    resnet18 += [t for cin, c, h in ((64, 128, 56), (128, 256, 28), (256, 512, 14))
                 for t in ((h, cin, c, 3, 2, 1), (h, cin, c, 1, 2, 0))]
    vgg16, cin = [], 3
    for c, h, n in ((64, 224, 2), (128, 112, 2), (256, 56, 3), (512, 28, 3), (512, 14, 3)):
        for _ in range(n):
            vgg16.append((h, cin, c, 3, 1, 1))
            cin = c
    densenet, c = [(224, 3, 64, 7, 2, 3)], 64
    for h, n in ((56, 6), (28, 12), (14, 24), (7, 16)):
        densenet += [t for i in range(n) for t in ((h, c + 32 * i, 128, 1, 1, 0), (h, 128, 32, 3, 1, 1))]
        c = (c + 32 * n) // 2
    unet, cin = [], 1
    for c, h in ((64, 256), (128, 128), (256, 64), (512, 32), (1024, 16)):
        unet += [(h, cin, c, 3, 1, 1), (h, c, c, 3, 1, 1)]
        cin = c
    unet += [t for c, h in ((512, 32), (256, 64), (128, 128), (64, 256)) for t in ((h, 2 * c, c, 3, 1, 1),
                                                                                    (h, c, c, 3, 1, 1))]
    unet.append((256, 64, 2, 1, 1, 0))
    return {"resnet18": resnet18, "vgg16": vgg16, "densenet121": densenet, "unet2d": unet}


@pytest.fixture(scope="module")
def default_catalog():
    return set(store_build.catalog())


@pytest.mark.parametrize("name", ["resnet18", "vgg16", "densenet121", "unet2d"])
def test_catalog_serves_networks_it_is_not_built_from(default_catalog, name):
    """A variant is a tile, a pipeline, an epilogue and a loader, not a shape: the default catalog holds what
    other networks load on an H100 too, at batches it does not list."""
    missing = set()
    for N in (1, 8, 16, 64):
        for ep in (Epilogue(), Epilogue(has_bias=True, activation="relu")):
            for H, C, K, f, stride, pad in _unlisted_networks()[name]:
                problem = ConvProblem.create(nd=2, batch=N, in_spatial=(H, H), channels=C, out_channels=K,
                                             filter_spatial=(f, f), stride=stride, dilation=1, padding=pad, groups=1,
                                             dtype="bfloat16", layout="NHWC", epilogue=ep)
                plan = dispatch.select(problem, H100, overrides=Overrides())[0]
                for source, defines in call_jobs(plan):
                    job = store_build.Job(source, "sm_90a", tuple(sorted(defines.items())))
                    if job not in default_catalog:
                        missing.add((plan.kernel.name, (N, H, C, K, f, stride)))
    assert not missing


def test_catalog_holds_the_video_vae_conv3d_layers(default_catalog):
    from cuconv.bench.conv3d import PADDING, SUITE_3D
    sources = set()
    for s3 in SUITE_3D:
        for layout in ("NDHWC", "NCDHW"):
            problem = ConvProblem.create(nd=3, batch=s3.N, in_spatial=(s3.D, s3.H, s3.W), channels=s3.C,
                                         out_channels=s3.K, filter_spatial=(3, 3, 3), stride=1, dilation=1,
                                         padding=PADDING, groups=1, dtype="float16", layout=layout)
            for source, defines in call_jobs(dispatch.select(problem, H100, overrides=Overrides())[0]):
                assert store_build.Job(source, "sm_90a", tuple(sorted(defines.items()))) in default_catalog
                sources.add(source)
    assert sources
    without = store_build.catalog(archs=["sm_90a"], networks=["resnet50"], dtypes=["float16"], layouts=["NHWC"],
                                  epilogues=["none"], stems=False, conv3d=False)
    assert set(without) < set(store_build.catalog(archs=["sm_90a"], networks=["resnet50"], dtypes=["float16"],
                                                  layouts=["NHWC"], epilogues=["none"], stems=False))


def test_catalog_follows_each_model_gpu_and_epilogue():
    one = store_build.catalog(archs=["sm_90a"], networks=["sd_unet"], dtypes=["float16"], layouts=["NHWC"],
                              epilogues=["none"])
    more = store_build.catalog(archs=["sm_90a"], networks=["sd_unet"], dtypes=["float16"], layouts=["NHWC"],
                               epilogues=["none", "bias_residual_relu"])
    assert set(one) < set(more)
    sm80 = store_build.catalog(archs=["sm_80"], networks=["sd_unet"], dtypes=["float16"], layouts=["NHWC"],
                               epilogues=["none"])
    assert sm80 and {j.arch for j in sm80} == {"sm_80"}
    assert not any(j.source.startswith("sm90/") for j in sm80)


@pytest.mark.parametrize("kwargs, match", [
    (dict(archs=["sm_70"]), "archs: expected some of"),
    (dict(networks=["alexnet"]), "networks: expected some of"),
    (dict(epilogues=["bias_tanh"]), "epilogues: expected some of"),
])
def test_catalog_names_a_bad_argument(kwargs, match):
    with pytest.raises(ValueError, match=match):
        store_build.catalog(**kwargs)


@needs_nvrtc
def test_build_keeps_what_the_store_in_its_folder_holds(store, tmp_path, nvrtc_calls):
    folder = tmp_path / "s"
    shutil.copytree(store, folder)
    assert store_build.build(folder, [TRANSPOSE, SCATTER], workers=1) == 2
    assert nvrtc_calls == [(SCATTER.source, SCATTER.arch)]  # the transpose was kept, FLIP dropped
    held = prebuilt.open_store(folder)
    assert {e["source"] for e in held.entries.values()} == {TRANSPOSE.source, SCATTER.source}
    assert all(held.read(k) is not None for k in held.entries)
    assert store_build.build(folder, [TRANSPOSE, SCATTER], reuse=False) == 2
    assert len(nvrtc_calls) == 3
    index = json.loads((folder / prebuilt.INDEX).read_text())
    index["tree_hash"] = "0" * 64  # a store of other sources keeps nothing
    (folder / prebuilt.INDEX).write_text(json.dumps(index))
    prebuilt._load.cache_clear()
    assert store_build.build(folder, [TRANSPOSE]) == 1
    assert nvrtc_calls[-1] == (TRANSPOSE.source, TRANSPOSE.arch) and len(nvrtc_calls) == 4
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s"]  # no staging folder left behind


def test_build_rejects_bad_workers(tmp_path):
    with pytest.raises(ValueError, match="workers"):
        store_build.build(tmp_path / "s", [TRANSPOSE], workers=0)


def test_call_jobs_add_the_transpose_where_a_channels_first_call_moves_operands():
    nhwc = dispatch.select(problem2d(C=64, K=64), H100)[0]
    assert call_jobs(nhwc) == tuple(nhwc.compile_jobs())
    p = problem2d(C=64, K=64)
    nchw = dispatch.select(ConvProblem.create(
        nd=2, batch=p.batch, in_spatial=p.in_spatial, channels=64, out_channels=64, filter_spatial=(3, 3),
        stride=1, dilation=1, padding=1, groups=1, dtype="bfloat16", layout="NCHW"), H100)[0]
    jobs = call_jobs(nchw)
    assert (("layout/transpose.cu", {}) in jobs) == (not nchw.reads_channels_first)


# --- the command line ------------------------------------------------------------------------------------

def test_cli_dry_run_counts_the_catalog(capsys):
    argv = ["build", "--dry-run", "--arch", "sm_90a", "--network", "resnet50", "--dtype", "bfloat16",
            "--layout", "NHWC", "--epilogue", "none"]
    assert cli(argv) == 0
    n = len(store_build.catalog(archs=["sm_90a"], networks=["resnet50"], dtypes=["bfloat16"], layouts=["NHWC"],
                                epilogues=["none"]))
    out = capsys.readouterr().out
    assert out.startswith(f"{n} variants:") and "sm90/conv_fprop_sm90.cu (sm_90a)" in out
    assert cli(["build", "--dry-run", "--network", "alexnet"]) == 2
    assert "--network: expected some of" in capsys.readouterr().err


@needs_nvrtc
def test_cli_show(store, monkeypatch, capsys, tmp_path):
    assert cli(["show", str(store)]) == 0
    assert capsys.readouterr().out.startswith(f"prebuilt store {store}: 1 for sm_80, 1 for sm_90a")
    assert cli(["show", str(tmp_path)]) == 0
    assert capsys.readouterr().out == f"no prebuilt store in {tmp_path}\n"
    monkeypatch.setenv("CUCONV_PREBUILT", "0")
    assert cli(["show"]) == 0
    assert "turns it off" in capsys.readouterr().out


# --- the compile log and stores of a workload's own variants ----------------------------------------------


@needs_nvrtc
def test_compile_log_records_each_variant_once_with_where_it_came_from(store, fresh_cache, monkeypatch, tmp_path):
    log = tmp_path / "used.jsonl"
    monkeypatch.setenv("CUCONV_COMPILE_LOG", str(log))
    monkeypatch.setenv("CUCONV_PREBUILT", str(store))
    _compile(TRANSPOSE)
    _compile(SCATTER)
    _compile(TRANSPOSE)            # this process has it: no line
    compiler._COMPILED.clear()     # as another process would: the kernel cache has it
    _compile(TRANSPOSE)
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(r["source"], r["arch"], r["via"]) for r in records] == [
        (TRANSPOSE.source, "sm_90a", "store"), (SCATTER.source, "sm_90a", "nvrtc"), (TRANSPOSE.source, "sm_90a", "cache")]
    assert all(r["defines"] == {} and r["extra"] == [] and r["seconds"] >= 0 for r in records)
    assert store_build.logged_jobs(log) == [TRANSPOSE, SCATTER]


def test_logged_jobs_keep_defines_and_name_a_bad_line(tmp_path):
    log = tmp_path / "used.jsonl"
    rec = {"source": "sm90/conv_fprop_sm90.cu", "arch": "sm_90a", "defines": {"B": 2, "A": "x"}, "extra": [],
           "via": "nvrtc", "seconds": 1.0}
    log.write_text(json.dumps(rec) + "\n\n" + json.dumps(dict(rec, via="cache")) + "\n")
    assert store_build.logged_jobs(log) == [store_build.Job("sm90/conv_fprop_sm90.cu", "sm_90a", (("A", "x"), ("B", 2)))]
    log.write_text(json.dumps(rec) + "\n" + '{"source": "a.cu"}\n')
    with pytest.raises(ValueError, match=r"used.jsonl:2: not a compile log record"):
        store_build.logged_jobs(log)


@needs_nvrtc
def test_cli_builds_a_store_of_logged_variants(tmp_path, capsys):
    log = tmp_path / "used.jsonl"
    log.write_text("".join(json.dumps({"source": j.source, "arch": j.arch, "defines": {}, "extra": [], "via": "nvrtc",
                                       "seconds": 0.5}) + "\n" for j in (SCATTER, FLIP, SCATTER)))
    out = tmp_path / "store"
    assert cli(["build", "--no-catalog", "--jobs-from", str(log), "--out", str(out), "--workers", "2"]) == 0
    assert capsys.readouterr().out.startswith("2 variants:")
    held = {(e["source"], e["arch"]) for e in prebuilt.open_store(out).entries.values()}
    assert held == {(SCATTER.source, SCATTER.arch), (FLIP.source, FLIP.arch)}
    assert cli(["build", "--no-catalog", "--out", str(out)]) == 2
    assert "no variants to build" in capsys.readouterr().err
    log.write_text("not json\n")
    assert cli(["build", "--no-catalog", "--jobs-from", str(log), "--out", str(out)]) == 2
    assert "--jobs-from: " in capsys.readouterr().err


# --- on a GPU: a store's cubins load and compute right ------------------------------------------------------

_STORE_SCRIPT = """
import json, os, sys, numpy as np, cupy as cp, ml_dtypes, cuconv
rng = np.random.default_rng(0)
errs = []
for layout, (C, K, R, stride) in [("NHWC", (64, 64, 3, 1)), ("NHWC", (3, 32, 7, 2)), ("NCHW", (32, 64, 3, 2))]:
    xs = (2, 20, 20, C) if layout == "NHWC" else (2, C, 20, 20)
    ws = (K, R, R, C) if layout == "NHWC" else (K, C, R, R)
    x = rng.standard_normal(xs).astype(ml_dtypes.bfloat16)
    w = (rng.standard_normal(ws) / (R * (C ** 0.5))).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal(K).astype(ml_dtypes.bfloat16)
    got = cp.asnumpy(cuconv.conv2d(cp.asarray(x), cp.asarray(w), cp.asarray(b), stride=stride, padding=R // 2,
                                   layout=layout, activation="relu")).astype(np.float64)
    want = cuconv.reference.conv2d(x, w, b, stride=stride, padding=R // 2, layout=layout, activation="relu")
    errs.append(float(np.linalg.norm(got - want) / np.linalg.norm(want)))
with open(os.environ["CUCONV_COMPILE_LOG"]) as f:
    via = sorted({json.loads(line)["via"] for line in f})
print(json.dumps({"errors": errs, "via": via}))
"""


@pytest.mark.gpu
def test_gpu_a_store_built_from_a_compile_log_serves_a_fresh_process(tmp_path, cp):
    """A process on this GPU logs the variants of three layers (NHWC and NCHW, a stem, fused bias + ReLU); a
    store built from that log serves them to a fresh process with an empty cache: nothing compiled by
    NVRTC, results as the reference's."""
    import subprocess
    import sys
    log = tmp_path / "used.jsonl"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), CUCONV_PREBUILT="0",
               CUCONV_CACHE_DIR=str(tmp_path / "cache1"), CUCONV_COMPILE_LOG=str(log))
    env.pop("CUCONV_LINEINFO", None)
    first = subprocess.run([sys.executable, "-c", _STORE_SCRIPT], capture_output=True, text=True, env=env)
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout.splitlines()[-1])["via"] == ["nvrtc"]
    store = tmp_path / "store"
    assert store_build.build(store, store_build.logged_jobs(log)) > 0
    env.update(CUCONV_PREBUILT=str(store), CUCONV_CACHE_DIR=str(tmp_path / "cache2"),
               CUCONV_COMPILE_LOG=str(tmp_path / "second.jsonl"))
    second = subprocess.run([sys.executable, "-c", _STORE_SCRIPT], capture_output=True, text=True, env=env)
    assert second.returncode == 0, second.stderr
    result = json.loads(second.stdout.splitlines()[-1])
    assert result["via"] == ["store"]
    assert max(result["errors"]) < 1e-2


@needs_nvrtc
def test_explain_says_where_the_variants_come_from(store, fresh_cache, monkeypatch):
    """An explanation's ``variants`` line: NVRTC on the first call, then this process, the kernel cache (a new
    process), or the prebuilt store."""
    from cuconv.precompile import call_jobs as jobs_of
    monkeypatch.setenv("CUCONV_PREBUILT", "0")
    e = dispatch.select(problem2d(C=16, K=16, groups=16), H100)[1]  # depthwise: one variant
    (source, defines), = jobs_of(e.plan)
    assert e.variants == "kernel variants: 1 (1 compiled by NVRTC on the first call (about a second each))"
    assert e.variants in str(e)
    compiler.compile_cuda(source, "sm_90a", defines)
    assert e.variants == "kernel variants: 1 (1 loaded by this process)"
    compiler._COMPILED.clear()
    assert e.variants == "kernel variants: 1 (1 in the kernel cache)"
    kernel_cache.clear_entries()
    own = fresh_cache / "own-store"
    store_build.build(own, [store_build.Job(source, "sm_90a", tuple(sorted(defines.items())))])
    monkeypatch.setenv("CUCONV_PREBUILT", str(own))
    assert e.variants == "kernel variants: 1 (1 in the prebuilt store)"
    nchw = dispatch.select(ConvProblem.create(nd=2, batch=2, in_spatial=(9, 11), channels=64, out_channels=64,
                                              filter_spatial=(3, 3), stride=1, dilation=1, padding=1, groups=1,
                                              dtype="bfloat16", layout="NCHW"), H100)[1]
    n = len(jobs_of(nchw.plan))
    assert nchw.variants.startswith(f"kernel variants: {n} (")
    import numpy as np
    import cuconv
    assert cuconv.explain(np.zeros((1, 5, 5, 4), np.float32), np.zeros((4, 3, 3, 4), np.float32)).variants == ""
