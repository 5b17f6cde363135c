"""The roofline's ceilings, each named by where it comes from: the datasheet, or measured at run time.

* **datasheet** -- the vendor's dense (no sparsity) bf16/fp16 tensor-core peak of the device
  (:data:`DATASHEET`; H100 SXM: 989.4 TFLOP/s) and its memory bandwidth. No kernel exceeds it, so it
  is the compute roof wherever the device is in the table.
* **measured GEMM** -- a large ``cupy.matmul`` (cuBLAS, fp16, 8192^3) timed in the run itself, at the
  run's clocks: what a tuned dense GEMM reaches there. A convolution can beat it (cuBLAS is not at
  the datasheet peak either), so it is printed and stored beside the roof, and is the compute roof
  only on a device the table does not know.
* **measured copy** -- a large device-to-device copy timed in the run (bytes read + written per
  second): the memory roof.

A result's "% of roof" says which ceiling it is measured against: ``datasheet`` or ``GEMM`` for
compute-bound shapes, ``copy`` (or ``datasheet HBM``) for memory-bound ones, decided by the shape's
arithmetic intensity against the ridge point. The JSON holds
``{"datasheet_tflops", "datasheet_tbps", "datasheet_source", "measured_gemm_tflops", "measured_copy_tbps"}``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Optional, Tuple

__all__ = ["DATASHEET", "Ceilings", "datasheet_for", "measure_gemm_tflops", "measure_copy_tbps", "measure"]

#: (device-name fragments, label, dense bf16/fp16 TFLOP/s, memory TB/s) from NVIDIA's datasheets;
#: the first entry whose fragments all occur in the device name applies.
DATASHEET = (
    (("H100", "PCIe"), "H100 PCIe", 756.5, 2.0),
    (("H100", "NVL"), "H100 NVL", 835.5, 3.9),
    (("H100",), "H100 SXM", 989.4, 3.35),
    (("H200", "NVL"), "H200 NVL", 835.5, 4.8),
    (("H200",), "H200 SXM", 989.4, 4.8),
    (("A100",), "A100", 312.0, None),
)

#: The GEMM and copy sizes measured at run time.
GEMM_N = 8192
COPY_BYTES = 512 * 2 ** 20


@dataclass(frozen=True)
class Ceilings:
    """The ceilings of one run; a value is ``None`` where it is unknown or was not measured."""

    datasheet_tflops: Optional[float] = None
    datasheet_tbps: Optional[float] = None
    datasheet_source: str = ""
    measured_gemm_tflops: Optional[float] = None
    measured_copy_tbps: Optional[float] = None

    @classmethod
    def for_device(cls, device_name: str, **measured) -> "Ceilings":
        """The datasheet entry of ``device_name`` (when :data:`DATASHEET` has one) plus ``measured``."""
        entry = datasheet_for(device_name)
        if entry is None:
            return cls(**measured)
        label, tflops, tbps = entry
        return cls(datasheet_tflops=tflops, datasheet_tbps=tbps, datasheet_source=label, **measured)

    @classmethod
    def from_json(cls, doc: dict) -> "Ceilings":
        """The ceilings of a result file: its ``ceilings`` block, the datasheet of its ``device``.

        A ``"tbps"`` key (a copy bandwidth measured outside the run) reads as the measured copy; a
        bare ``"tflops"`` key, whose source the file does not name, is not used.
        """
        block = doc.get("ceilings") if isinstance(doc, dict) else None
        block = block if isinstance(block, dict) else {}
        device = doc.get("device") if isinstance(doc, dict) else None
        base = cls.for_device(device) if isinstance(device, str) else cls()

        def num(key):
            v = block.get(key)
            return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None

        return cls(datasheet_tflops=num("datasheet_tflops") or base.datasheet_tflops,
                   datasheet_tbps=num("datasheet_tbps") or base.datasheet_tbps,
                   datasheet_source=str(block.get("datasheet_source") or base.datasheet_source),
                   measured_gemm_tflops=num("measured_gemm_tflops"),
                   measured_copy_tbps=num("measured_copy_tbps") or num("tbps"))

    def to_json(self) -> dict:
        return asdict(self)

    def compute(self) -> Tuple[Optional[float], str]:
        """The compute roof (TFLOP/s) and its name: the datasheet peak, else the measured GEMM."""
        if self.datasheet_tflops:
            return self.datasheet_tflops, "datasheet"
        if self.measured_gemm_tflops:
            return self.measured_gemm_tflops, "GEMM"
        return None, ""

    def memory(self) -> Tuple[Optional[float], str]:
        """The memory roof (TB/s) and its name: the measured copy, else the datasheet bandwidth."""
        if self.measured_copy_tbps:
            return self.measured_copy_tbps, "copy"
        if self.datasheet_tbps:
            return self.datasheet_tbps, "datasheet HBM"
        return None, ""

    def fraction(self, flops: Optional[float], nbytes: Optional[float], ms: float) -> Tuple[Optional[float], str]:
        """(achieved / roof, roof name) of a call of ``flops`` and ``nbytes`` (minimum traffic) taking
        ``ms``: against the memory roof below the ridge point, the compute roof above it."""
        peak, peak_name = self.compute()
        bw, bw_name = self.memory()
        if not ms or not flops:
            return None, ""
        tflops = flops / (ms * 1e-3) / 1e12
        if nbytes and bw and (peak is None or flops / nbytes < peak / bw):
            return nbytes / (ms * 1e-3) / 1e12 / bw, bw_name
        return (tflops / peak, peak_name) if peak else (None, "")

    def describe(self) -> str:
        parts = []
        if self.datasheet_tflops:
            parts.append(f"datasheet {self.datasheet_tflops:g} TFLOP/s dense bf16/fp16 ({self.datasheet_source})")
        if self.measured_gemm_tflops:
            parts.append(f"measured GEMM {self.measured_gemm_tflops:.1f} TFLOP/s (cuBLAS fp16 {GEMM_N}^3)")
        if self.measured_copy_tbps:
            parts.append(f"measured copy {self.measured_copy_tbps:.2f} TB/s")
        elif self.datasheet_tbps:
            parts.append(f"datasheet memory {self.datasheet_tbps:g} TB/s")
        return "; ".join(parts) or "no ceilings known"


def datasheet_for(device_name: str) -> Optional[Tuple[str, float, Optional[float]]]:
    """(label, dense bf16/fp16 TFLOP/s, memory TB/s) of the first :data:`DATASHEET` entry matching."""
    for fragments, label, tflops, tbps in DATASHEET:
        if all(f in device_name for f in fragments):
            return label, tflops, tbps
    return None


def measure_gemm_tflops(n: int = GEMM_N, runs: int = 20) -> float:
    """TFLOP/s of ``cupy.matmul`` (cuBLAS) on fp16 ``n x n`` matrices: median of ``runs`` calls."""
    import cupy as cp

    from .timing import time_calls
    a = cp.random.standard_normal((n, n), dtype=cp.float32).astype(cp.float16)
    b = cp.random.standard_normal((n, n), dtype=cp.float32).astype(cp.float16)
    out = cp.empty((n, n), dtype=cp.float16)
    ms = time_calls(lambda i: cp.matmul(a, b, out=out), 1, runs, queued=False)
    return 2.0 * n ** 3 / (ms * 1e-3) / 1e12


def measure_copy_tbps(nbytes: int = COPY_BYTES, runs: int = 20) -> float:
    """TB/s of a device-to-device ``cudaMemcpyAsync`` of ``nbytes``, counting bytes read and written."""
    import cupy as cp

    from .timing import time_calls
    src = cp.ones(nbytes, dtype=cp.uint8)
    dst = cp.empty(nbytes, dtype=cp.uint8)
    ms = time_calls(lambda i: dst.data.copy_from_device_async(src.data, nbytes), 1, runs, queued=False)
    return 2.0 * nbytes / (ms * 1e-3) / 1e12


def measure(device_name: str, log=print) -> Ceilings:
    """The device's datasheet ceilings with the GEMM and copy measured on it (a failed measurement is
    logged and left ``None``)."""
    measured = {}
    for key, fn in (("measured_gemm_tflops", measure_gemm_tflops), ("measured_copy_tbps", measure_copy_tbps)):
        try:
            measured[key] = fn()
        except Exception as e:  # a ceiling explains the numbers; the benchmark runs without it
            log(f"ceiling not measured ({key}): {type(e).__name__}: {e}")
    return Ceilings.for_device(device_name, **measured)
