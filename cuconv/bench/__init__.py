"""cuconv's benchmark, ``python -m cuconv.bench``: each result checked against the reference, then timed.

What it measures, per shape and dtype (bf16 and fp16 by default):

* **check** -- cuconv's automatic choice against the float64 reference (:mod:`cuconv.reference`),
  by relative norm error; a shape that fails is reported, and the run exits 1.
* **time** -- CUDA events, median of >= 20 runs (``--runs``), inputs rotated past twice the L2
  (:mod:`.timing`): *queued* behind an L2-flushing memset (the main number: the GPU time of the call,
  its host work overlapped), *isolated* (host overhead included), and replayed from a CUDA graph.
  The header gives the host time per call of each library.
* **compare** -- cuDNN through ``torch.nn.functional`` (only when torch is installed; without it the
  run says so and goes on), and cuconv's forced ``generic_gpu`` path.
* **sustained** -- shapes of 0.1 ms or more called back to back for a second, at the board's power
  limit, with the SM clock and power that ``nvidia-smi`` reports (``--no-sustained`` skips it).
* **ceilings** -- the datasheet's dense peak of the device, a cuBLAS GEMM and a device copy measured
  in the run (:mod:`.ceilings`); each result's "% of roof" names the ceiling it is measured against.

Suites (``--suite``, default all): ``resnet50`` and ``vae_unet`` (:mod:`.conv2d`), ``sm80`` (the
sm_80+ kernel and ``cuconv.matmul``, :mod:`.sm80`) and ``conv3d`` (every conv3d strategy on video-VAE
layers, :mod:`.conv3d`); ``networks`` (only when named: ``--suite networks`` or ``--network NAME``)
times every conv layer of nine networks back to back and one call at a time against cuDNN
(:mod:`.networks`); ``grad`` (only when named: ``--suite grad``, networks by ``--network``) times the
input and weight gradients of networks' layers and transposed convolutions against cuDNN's backward
(:mod:`.grad`). ``--json FILE`` writes every number with the run's date, device and command;
``--plot FILE.png`` draws the roofline chart (:mod:`.plot`; ``--plot-from JSON`` redraws an earlier
file without a GPU); ``python -m cuconv.bench.report`` writes ``docs/bench/README.md`` from the JSON
files (:mod:`.report`). Without CuPy or a GPU the benchmark says which is missing and exits 2.

Modules: :mod:`.cli` (command line), :mod:`.environment` (requirements, run metadata),
:mod:`.timing`, :mod:`.ceilings`, :mod:`.conv2d`, :mod:`.conv3d`, :mod:`.sm80`, :mod:`.networks`, :mod:`.grad`,
:mod:`.plot`,
:mod:`.report`. Importing the package needs neither CuPy nor a GPU.
"""

from .ceilings import Ceilings
from .conv2d import SUITES, Shape, bench_shape, host_overhead_us

__all__ = ["Shape", "SUITES", "bench_shape", "host_overhead_us", "Ceilings"]
