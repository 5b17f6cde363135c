"""The on-disk kernel cache (cuconv/kernel_cache.py): damaged entries heal, writes are atomic, the
folder falls back when unusable, the size is bounded, and clear_cache empties it.

Each test gets its own cache folder and forgets what the process compiled, so every compile here
really goes through the cache. The compiled source is the small generic kernel.
"""

from __future__ import annotations

import json
import os
import threading
import warnings

import numpy as np
import pytest

import cuconv
from cuconv import compiler, kernel_cache

from conftest import nvrtc_available

pytestmark = pytest.mark.skipif(not nvrtc_available(), reason="NVRTC (cuda-bindings) not available")

SOURCE, ARCH = "generic/im2col_gemm.cu", "sm_80"


def _forget():
    kernel_cache._usable_dir.cache_clear()
    compiler._COMPILED.clear()
    compiler._module.cache_clear()


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A fresh, empty cache folder for the test."""
    folder = tmp_path / "cache"
    monkeypatch.setenv("CUCONV_CACHE_DIR", str(folder))
    monkeypatch.delenv("CUCONV_CACHE_MAX_MB", raising=False)
    _forget()
    yield folder
    _forget()


def _compile(dtype: int = 0):
    return compiler.compile_cuda(SOURCE, ARCH, {"CUCONV_DTYPE": dtype})


def _entry_files(folder):
    return sorted(p.name for p in folder.iterdir())


def test_an_entry_is_cubin_log_and_metadata(cache):
    path, report = _compile()
    assert b" "[0] == 32 and b"\x00"[0] == 0  # NVRTC's writes left CPython's one-byte objects alone
    stem = os.path.basename(path)[:-len(".cubin")]
    assert _entry_files(cache) == [f"{stem}.cubin", f"{stem}.json", f"{stem}.log"]
    meta = json.loads((cache / f"{stem}.json").read_text())
    assert meta["cubin_size"] == os.path.getsize(path)


@pytest.mark.parametrize("damage", ["overwrite_cubin", "truncate_cubin", "truncate_log", "empty_metadata",
                                    "delete_cubin", "delete_log", "garbage_metadata"])
def test_a_damaged_entry_is_compiled_again(cache, damage):
    path, report = _compile()
    good = open(path, "rb").read()
    stem = path[:-len(".cubin")]
    if damage == "overwrite_cubin":
        with open(path, "r+b") as f:
            f.write(b"\0" * 64)
    elif damage == "truncate_cubin":
        with open(path, "r+b") as f:
            f.truncate(len(good) // 2)
    elif damage == "truncate_log":
        with open(stem + ".log", "r+b") as f:
            f.truncate(10)
    elif damage == "empty_metadata":
        open(stem + ".json", "wb").close()
    elif damage == "garbage_metadata":
        open(stem + ".json", "w").write("[1, 2")
    else:
        os.unlink(stem + (".cubin" if damage == "delete_cubin" else ".log"))
    compiler._COMPILED.clear()  # a later process: only the disk remains
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        path2, report2 = _compile()
    assert any("damaged" in str(w.message) for w in caught), [str(w.message) for w in caught]
    assert path2 == path and open(path2, "rb").read() == good
    assert [(f.name, f.registers) for f in report2.functions] == [(f.name, f.registers) for f in report.functions]


def test_a_sound_entry_is_a_silent_hit(cache):
    path, _ = _compile()
    compiler._COMPILED.clear()
    mtime = os.path.getmtime(path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _compile()[0] == path
    assert os.path.getmtime(path) == mtime  # read, not rewritten


def test_threads_compiling_one_variant_agree(cache):
    results, errors = [], []

    def work():
        try:
            results.append(_compile())
        except Exception as e:  # noqa: BLE001 - the test reports any failure
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert len({r[0] for r in results}) == 1
    assert not [n for n in _entry_files(cache) if n.endswith(".tmp")]


def test_a_failed_write_leaves_no_temporary(cache, monkeypatch):
    real_replace = os.replace

    def disk_full(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(kernel_cache.os, "replace", disk_full)
    with pytest.raises(OSError, match="No space"):
        _compile()
    monkeypatch.setattr(kernel_cache.os, "replace", real_replace)
    assert [n for n in _entry_files(cache) if n.endswith(".tmp")] == []
    compiler._COMPILED.clear()
    assert os.path.getsize(_compile()[0]) > 0  # and the next attempt works


def test_an_unusable_folder_falls_back_with_a_warning(tmp_path, monkeypatch):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("CUCONV_CACHE_DIR", str(blocker / "cache"))
    _forget()
    try:
        with pytest.warns(RuntimeWarning, match="not usable"):
            path, report = _compile()
        assert os.path.getsize(path) > 0
        assert not str(path).startswith(str(blocker))
    finally:
        _forget()


def test_the_cache_is_pruned_least_recently_used_first(cache, monkeypatch):
    old_path, _ = _compile(0)
    size = sum(os.path.getsize(os.path.join(cache, n)) for n in os.listdir(cache))
    os.utime(old_path[:-len(".cubin")] + ".json", (1, 1))  # long unused
    monkeypatch.setenv("CUCONV_CACHE_MAX_MB", str(1.5 * size / 2**20))  # room for one entry, not two
    new_path, _ = _compile(1)
    assert os.path.exists(new_path) and not os.path.exists(old_path)


def test_a_bad_size_bound_is_refused(cache, monkeypatch):
    monkeypatch.setenv("CUCONV_CACHE_MAX_MB", "lots")
    with pytest.raises(ValueError, match="CUCONV_CACHE_MAX_MB"):
        kernel_cache.max_bytes()
    monkeypatch.setenv("CUCONV_CACHE_MAX_MB", "0")
    with pytest.raises(ValueError, match="CUCONV_CACHE_MAX_MB"):
        kernel_cache.max_bytes()


def test_clear_cache_empties_the_folder(cache):
    _compile(0)
    _compile(1)
    (cache / ".left.by.a.killed.process.tmp").write_bytes(b"x")
    assert cuconv.clear_cache() == 2
    assert _entry_files(cache) == []
    assert os.path.getsize(_compile(0)[0]) > 0


_CONV_SCRIPT = """
import warnings, numpy as np, cupy as cp, cuconv
x = cp.asarray(np.random.default_rng(0).standard_normal((1, 6, 6, 4)).astype(np.float32))
w = cp.asarray(np.random.default_rng(1).standard_normal((8, 3, 3, 4)).astype(np.float32))
want = cuconv.reference.conv2d(cp.asnumpy(x), cp.asnumpy(w), padding=1)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    got = cp.asnumpy(cuconv.conv2d(x, w, padding=1, kernel="generic_gpu"))
print("error", np.linalg.norm(got - want) / np.linalg.norm(want))
print("warnings", [str(c.message) for c in caught])
"""


@pytest.mark.gpu
def test_a_cubin_the_driver_refuses_is_rebuilt(cache, cp):
    """A later process finds its cached cubin replaced by bytes the driver cannot load (the metadata
    rewritten to match, so the checksum passes): it compiles it again, warns, and computes right."""
    import subprocess
    import sys
    env = dict(os.environ, CUCONV_CACHE_DIR=str(cache), PYTHONPATH=os.pathsep.join(sys.path))
    first = subprocess.run([sys.executable, "-c", _CONV_SCRIPT], capture_output=True, text=True, env=env)
    assert "error" in first.stdout, first.stderr
    for cubin in [p for p in cache.iterdir() if p.suffix == ".cubin"]:
        junk = b"not a cubin" * 100
        cubin.write_bytes(junk)
        meta_path = cubin.with_suffix(".json")
        meta = json.loads(meta_path.read_text())
        meta.update(cubin_size=len(junk), cubin_sha256=kernel_cache._digest(junk))
        meta_path.write_text(json.dumps(meta))
    second = subprocess.run([sys.executable, "-c", _CONV_SCRIPT], capture_output=True, text=True, env=env)
    assert "error" in second.stdout, second.stderr
    err = float(second.stdout.split("error")[1].split()[0])
    assert err < 1e-5
    assert "refused" in second.stdout.split("warnings")[1]


def test_line_tables_only_on_request_and_the_machine_code_is_the_same(cache, monkeypatch, tmp_path):
    """``CUCONV_LINEINFO`` adds source line tables (another cache entry); the SASS does not change."""
    import subprocess

    from conftest import find_cuobjdump
    monkeypatch.delenv("CUCONV_LINEINFO", raising=False)
    assert "-lineinfo" not in compiler._options(ARCH, {}, ())
    plain, _ = _compile()
    for off in ("0", " "):
        monkeypatch.setenv("CUCONV_LINEINFO", off)
        assert not compiler.line_info()
    monkeypatch.setenv("CUCONV_LINEINFO", "1")
    assert "-lineinfo" in compiler._options(ARCH, {}, ())
    lines, _ = _compile()
    assert lines != plain and os.path.getsize(lines) > os.path.getsize(plain)
    tool = find_cuobjdump()
    if tool is None:
        pytest.skip("cuobjdump not installed (the sass extra)")

    def sass(path):
        text = subprocess.run([tool, "-sass", path], check=True, capture_output=True, text=True).stdout
        return [ln.split("/*")[0].strip() for ln in text.splitlines() if ln.strip() and "/*" in ln]

    code = sass(plain)
    assert code and code == sass(lines)
