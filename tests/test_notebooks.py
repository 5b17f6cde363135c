"""The notebooks of docs/notebooks execute top to bottom without a cell error (CPU; GPU cells skip).

Each notebook runs in a fresh ``python3`` kernel of *this* interpreter (whatever kernelspec named
``python3`` is installed elsewhere), from its own folder, with the checkout first on ``PYTHONPATH`` so
the kernel imports the cuconv under test. Skipped when nbclient / nbformat / ipykernel / matplotlib
are missing (``pip install '.[docs]'``). Notebooks are stored with outputs cleared: CI executes them.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK_DIR = ROOT / "docs" / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))
CELL_TIMEOUT_S = 300


def test_notebooks_exist():
    names = [p.name for p in NOTEBOOKS]
    for expected in ("01_implicit_gemm_and_im2col.ipynb", "02_using_cuconv.ipynb", "03_performance.ipynb", "04_dask_volumes.ipynb",
                     "05_training.ipynb"):
        assert expected in names, f"docs/notebooks/{expected} is missing (found {names})"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_stored_without_outputs(path):
    nb = json.loads(path.read_text())
    dirty = [i for i, c in enumerate(nb["cells"]) if c["cell_type"] == "code"
             and (c.get("outputs") or c.get("execution_count") is not None)]
    assert not dirty, f"{path.name}: cells {dirty} carry outputs; clear them before committing"


def _native_kernel_manager():
    """A KernelManager for ``python3`` that always launches ``sys.executable -m ipykernel_launcher``."""
    from ipykernel.kernelspec import RESOURCES, get_kernel_dict
    from jupyter_client.kernelspec import KernelSpec, KernelSpecManager
    from jupyter_client.manager import KernelManager

    class NativeSpecs(KernelSpecManager):
        def get_kernel_spec(self, kernel_name):
            if kernel_name == "python3":
                return KernelSpec(resource_dir=RESOURCES, **get_kernel_dict())
            return super().get_kernel_spec(kernel_name)

    return KernelManager(kernel_name="python3", kernel_spec_manager=NativeSpecs())


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_executes(path, monkeypatch):
    for mod in ("nbclient", "nbformat", "ipykernel", "matplotlib"):
        pytest.importorskip(mod, reason=f"{mod} is not installed (pip install '.[docs]')")
    import nbformat
    from nbclient import NotebookClient

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    nb = nbformat.read(path, as_version=4)
    km = _native_kernel_manager()
    client = NotebookClient(nb, km=km, timeout=CELL_TIMEOUT_S, allow_errors=False,
                            resources={"metadata": {"path": str(path.parent)}})
    t0 = time.perf_counter()
    try:
        client.execute()  # raises CellExecutionError (with the cell and traceback) on the first failing cell
    finally:
        if km.has_kernel:  # the client does not shut down a kernel manager it was handed
            km.shutdown_kernel(now=True)
    print(f"{path.name}: executed in {time.perf_counter() - t0:.1f} s")


def test_bench_plot_from_json(tmp_path):
    """``python -m cuconv.bench --plot PNG --plot-from JSON`` draws a file in cuconv.bench's format (CPU)."""
    pytest.importorskip("matplotlib", reason="matplotlib is not installed (pip install '.[docs]')")
    import matplotlib
    matplotlib.use("Agg")
    from cuconv.bench import cli, plot

    # A fixture in the shape of bench's --json output; the timings are placeholders, not measurements.
    doc = {"device": "fixture", "ceilings": {"datasheet_tflops": 900.0, "datasheet_source": "fixture",
                                             "measured_gemm_tflops": 700.0, "measured_copy_tbps": 3.0},
           "records": [
               {"name": "a", "dtype": "bfloat16", "flops": 2e12, "bytes": 4e9, "ms": {"cuconv": 4.0, "cudnn": 5.0}},
               {"name": "b", "dtype": "float16", "flops": 1e12, "bytes": 1e9, "ms": {}, "check_ok": False},
               {"name": "c", "dtype": "bfloat16", "flops": 1e12, "bytes": 1e9,
                "ms": {"cuconv": 2.0, "generic": 10.0, "cuconv_beta1": 2.1}}]}
    src = tmp_path / "bench.json"
    src.write_text(json.dumps(doc))
    recs = plot.load_bench_records(str(src))
    assert [r["ms"] for r in recs] == [d["ms"] for d in doc["records"]]
    png = tmp_path / "chart.png"
    assert cli.main(["--plot", str(png), "--plot-from", str(src)]) == 0
    assert png.stat().st_size > 10_000
    empty = tmp_path / "roofline.png"
    plot.plot_bench(None, str(empty))  # no records: ceilings only
    assert empty.stat().st_size > 5_000


def test_roofline_labels_name_their_source():
    """The roof's labels say which ceiling each line is: datasheet, measured GEMM, measured copy."""
    pytest.importorskip("matplotlib", reason="matplotlib is not installed (pip install '.[docs]')")
    import matplotlib
    matplotlib.use("Agg")
    from cuconv.bench import Ceilings, plot

    ax = plot.plot_roofline(ceilings=Ceilings.for_device("NVIDIA H100 80GB HBM3", measured_gemm_tflops=700.0,
                                                         measured_copy_tbps=2.9))
    texts = [t.get_text() for t in ax.texts]
    assert any("989.4 TFLOP/s" in t and "datasheet, H100 SXM" in t for t in texts), texts
    assert any("700 TFLOP/s (measured)" in t for t in texts), texts
    assert any("2.90 TB/s (measured copy)" in t for t in texts), texts
    ax = plot.plot_roofline()  # no ceilings given: the H100 SXM datasheet's, named as such
    texts = [t.get_text() for t in ax.texts]
    assert any("3.35 TB/s (datasheet, H100 SXM)" in t for t in texts), texts
