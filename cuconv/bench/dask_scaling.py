"""cuconv.dask on one and on several GPUs, and against dask-image, on a 3-D volume from host memory.

``python -m cuconv.bench.dask_scaling`` convolves a ``(1, D, H, W, C)`` volume chunked along depth with a
``K x F x F x F x C`` filter (``padding="same"``) through :func:`cuconv.dask.conv3d` and prints the wall time
of the whole graph for each worker count of ``--gpus``: every chunk is a host array, copied to its
worker's GPU, convolved, and copied back to host memory (where a checksum of it is kept), so the time
includes the transfers a volume larger than a GPU needs. The host chunks hold a random pattern made once
per worker and chunk shape and handed out again (read-only) for every chunk of that shape, so making a
chunk costs nothing; a pipeline that reads its chunks from storage adds its read time. On a GPU the host
chunks and the buffers the results come back into are page-locked (pinned), as a streaming pipeline
keeps them: pageable copies run at a few GB/s and would time the driver's staging, not the convolution. Several GPUs run
through ``dask_cuda.LocalCUDACluster`` (one worker per GPU); one GPU runs in-process when dask-cuda is
absent. ``--gpu-fraction F`` sizes the depth ``D`` so that the input volume is ``F`` times the first GPU's
memory (``H``, ``W`` from ``--volume``); the report prints the volume against that GPU's total and free
memory, so a run with ``F > 1`` shows a volume larger than one GPU convolved from host memory.
``--dask-image`` also times ``dask_image.ndfilters.correlate`` on the same CuPy-chunked volume, one 3-D
filter per (output, input) channel pair summed over the input channels, and prints the ratio.

``--source gpu`` makes the chunks on the worker's GPU instead and reduces each result there (only a
64K-element prefix comes back): the convolutions and the halo exchange between workers without the
host bus. ``--copy-rates`` first times page-locked copies of 1 GiB between host memory and the GPUs,
one process per GPU, for each GPU count of ``--gpus``: the bus's ceiling for chunks from host memory.

``--cpu`` runs the same graphs with NumPy chunks on the host (``--gpus`` then counts threads): a check of
the pipeline on a machine without a GPU, not a measurement of cuconv's kernels. The median of
``--repeats`` runs is printed after one untimed run (kernel compiles, worker start). ``--json PATH``
writes the records.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import statistics
import sys
import threading
import time
from typing import List, Optional

DTYPES = ("float16", "bfloat16", "float32")


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m cuconv.bench.dask_scaling", description=__doc__.split("\n\n")[0])
    ap.add_argument("--volume", type=int, nargs=3, default=(256, 256, 256), metavar=("D", "H", "W"),
                    help="spatial size of the volume (default 256 256 256)")
    ap.add_argument("--channels", type=int, default=16, help="input channels C (default 16)")
    ap.add_argument("--out-channels", type=int, default=16, help="output channels K (default 16)")
    ap.add_argument("--filter", type=int, default=3, help="filter size F, odd (default 3)")
    ap.add_argument("--dtype", choices=DTYPES, default="float16")
    ap.add_argument("--gpu-fraction", type=float, metavar="F",
                    help="size the depth so the input volume is F times the first GPU's memory (overrides D)")
    ap.add_argument("--depth-chunk", type=int, default=32, help="depth of one chunk (default 32)")
    ap.add_argument("--gpus", type=int, nargs="+", default=[1, 2], help="worker counts to time (default 1 2)")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs per worker count (default 3)")
    ap.add_argument("--source", choices=("host", "gpu"), default="host",
                    help="where the chunks start and the results end: 'host' (default) page-locked host memory, "
                         "copied to a GPU and back; 'gpu' made on the worker's GPU and reduced there, which "
                         "times the convolutions and the halo exchange without the host bus")
    ap.add_argument("--dask-image", action="store_true", help="also time dask_image.ndfilters.correlate")
    ap.add_argument("--cpu", action="store_true", help="NumPy chunks on the host (a pipeline check)")
    ap.add_argument("--transfers", action="store_true",
                    help="after the timed runs on several GPUs, run the graph once more and print the bytes "
                         "the workers fetched from each other, by task")
    ap.add_argument("--copy-rates", action="store_true",
                    help="first time page-locked copies between host memory and each GPU count of --gpus, one "
                         "process per GPU (the bus's ceiling for chunks streamed from host memory)")
    ap.add_argument("--json", metavar="PATH", help="write the records as JSON")
    return ap


def check_args(args) -> None:
    """Refuse values the graphs cannot be built from (argparse has checked the types)."""
    for name in ("channels", "out_channels", "filter", "depth_chunk", "repeats"):
        if getattr(args, name) < 1:
            raise SystemExit(f"--{name.replace('_', '-')}: must be >= 1, got {getattr(args, name)}")
    if min(args.volume) < 1 or min(args.gpus) < 1:
        raise SystemExit(f"--volume and --gpus: every value must be >= 1, got {args.volume} and {args.gpus}")
    if args.gpu_fraction is not None and not args.gpu_fraction > 0:
        raise SystemExit(f"--gpu-fraction: must be > 0, got {args.gpu_fraction}")
    if args.source == "gpu" and args.cpu:
        raise SystemExit("--source gpu: makes the chunks on a GPU; it does not go with --cpu")
    if args.gpu_fraction is not None and args.cpu:
        raise SystemExit("--gpu-fraction: sizes the volume by a GPU's memory; it does not go with --cpu")
    if args.filter % 2 == 0:
        raise SystemExit(f"--filter: must be odd (dask-image centres an even filter differently), got {args.filter}")


def _itemsize(args) -> int:
    return 4 if args.dtype == "float32" else 2


def volume_bytes(args) -> int:
    """Bytes of the input volume (the output has the same size when K == C)."""
    return math.prod(args.volume) * args.channels * _itemsize(args)


def depth_for(args, memory_bytes: int) -> int:
    """The depth D that makes the input volume ``args.gpu_fraction`` times ``memory_bytes`` (at least 1)."""
    plane = args.volume[1] * args.volume[2] * args.channels * _itemsize(args)
    return max(1, int(args.gpu_fraction * memory_bytes // plane))


def _dtype(name):
    import ml_dtypes
    import numpy as np
    return ml_dtypes.bfloat16 if name == "bfloat16" else np.dtype(name)


_HOST_CHUNKS: dict = {}
_STAGING = threading.local()


def _host_buffer(shape, dtype, pinned: bool):
    """An empty host array; page-locked (``cupyx.empty_pinned``) when ``pinned``, so copies to and from a GPU
    run at the bus's speed instead of through the driver's pageable staging."""
    import numpy as np
    if not pinned:
        return np.empty(shape, dtype)
    import cupyx
    return cupyx.empty_pinned(shape, dtype)


def _pattern(shape, dtype, seed: int):
    """A NumPy array of ``shape`` and ``dtype`` tiled from 64K normal values drawn with ``seed``."""
    import numpy as np
    values = np.random.default_rng(seed).standard_normal(min(math.prod(shape), 1 << 16))
    return np.resize(values.astype(np.float32), shape).astype(dtype)


def _host_block(dtype, pinned: bool, block_info=None):
    """A chunk of the volume in host memory: a random pattern, made once per process, chunk shape and
    dtype and returned read-only for every chunk of that shape (so the timing holds no chunk making)."""
    import numpy as np
    shape = tuple(block_info[None]["chunk-shape"])
    key = (shape, np.dtype(dtype).str, pinned)
    if key not in _HOST_CHUNKS:
        chunk = _host_buffer(shape, dtype, pinned)
        chunk[...] = _pattern(shape, dtype, len(_HOST_CHUNKS))
        chunk.flags.writeable = False
        _HOST_CHUNKS[key] = chunk
    return _HOST_CHUNKS[key]


_GPU_CHUNKS: dict = {}


def _gpu_block(dtype, block_info=None):
    """A chunk made on the current GPU: a random pattern, made once per GPU, chunk shape and dtype and
    returned again for every chunk of that shape (cuconv never writes its inputs)."""
    import cupy
    import numpy as np
    shape = tuple(block_info[None]["chunk-shape"])
    key = (cupy.cuda.Device().id, shape, np.dtype(dtype).str)
    if key not in _GPU_CHUNKS:
        _GPU_CHUNKS[key] = cupy.asarray(_pattern(shape, dtype, len(_GPU_CHUNKS)))
    return _GPU_CHUNKS[key]


def _gpu_checksum(block):
    """A chunk reduced to one number from its first 64K elements, the only part copied to host memory."""
    import numpy as np
    head = block.reshape(-1)[:1 << 16].get()
    return np.full((1,) * block.ndim, float(head.astype(np.float32).sum()), np.float32)


def _checksum(block):
    """The chunk copied to host memory (a page-locked buffer per thread and chunk shape), reduced to one
    number: the copy is made, the data dropped."""
    import numpy as np
    if isinstance(block, np.ndarray):
        host = block
    else:
        buffers = _STAGING.__dict__.setdefault("buffers", {})
        key = (block.shape, block.dtype.str)
        if key not in buffers:
            buffers[key] = _host_buffer(block.shape, block.dtype, True)
        host = block.get(out=buffers[key])
    return np.full((1,) * host.ndim, float(host.reshape(-1)[:1 << 16].astype(np.float32).sum()), np.float32)


def volume(args, on_gpu: bool):
    """The lazy input: (1, D, H, W, C), chunked along depth, each chunk in host memory (page-locked when it
    goes to a GPU) and moved to its worker's GPU."""
    import dask.array as da
    import numpy as np
    dtype = _dtype(args.dtype)
    chunks = da.core.normalize_chunks((1, args.depth_chunk, *args.volume[1:], args.channels),
                                      (1, *args.volume, args.channels))
    if on_gpu and args.source == "gpu":
        import cupy
        return da.map_blocks(_gpu_block, dtype, chunks=chunks, dtype=dtype, meta=cupy.empty((0,) * 5, dtype))
    x = da.map_blocks(_host_block, dtype, on_gpu, chunks=chunks, dtype=dtype, meta=np.empty((0,) * 5, dtype))
    if on_gpu:
        import cupy
        x = x.map_blocks(cupy.asarray, dtype=x.dtype, meta=cupy.empty((0,) * 5, x.dtype))
    return x


def filters(args, on_gpu: bool):
    import numpy as np
    w = np.random.default_rng(1).standard_normal((args.out_channels, *(args.filter,) * 3, args.channels))
    w = (w / math.sqrt(w[0].size)).astype(_dtype(args.dtype))
    if on_gpu:
        import cupy
        return cupy.asarray(w)
    return w


def cuconv_graph(args, on_gpu: bool):
    """Checksums of the cuconv.dask result, one per output chunk."""
    import cuconv.dask
    y = cuconv.dask.conv3d(volume(args, on_gpu), filters(args, on_gpu), padding="same")
    reduce = _gpu_checksum if on_gpu and args.source == "gpu" else _checksum
    return y.map_blocks(reduce, chunks=tuple((1,) * len(c) for c in y.chunks), dtype="float32",
                        meta=__import__("numpy").empty((0,) * 5, "float32"))


def dask_image_graph(args, on_gpu: bool):
    """Checksums of the same convolution by dask_image.ndfilters.correlate, one 3-D filter per channel pair."""
    import dask.array as da
    import numpy as np
    from dask_image import ndfilters
    x = volume(args, on_gpu)[0]                                       # (D, H, W, C)
    w = filters(args, on_gpu)                                         # (K, F, F, F, C)
    outs = []
    for k in range(args.out_channels):
        acc = None
        for c in range(args.channels):
            term = ndfilters.correlate(x[..., c], w[k, ..., c], mode="constant", cval=0.0)
            acc = term if acc is None else acc + term
        outs.append(acc)
    y = da.stack(outs, axis=-1)[None]
    return y.map_blocks(_checksum, chunks=tuple((1,) * len(c) for c in y.chunks), dtype="float32",
                        meta=np.empty((0,) * 5, "float32"))


def _timed(run, repeats: int) -> float:
    run()  # untimed: kernel compiles, worker start-up, first allocations
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def time_workers(make_graph, args, workers: int, log=print) -> Optional[float]:
    """Median seconds of the graph on ``workers`` GPUs (threads with ``--cpu``), or None when not possible."""
    if args.cpu:
        return _timed(lambda: make_graph(args, False).compute(scheduler="threads", num_workers=workers),
                      args.repeats)
    import cupy
    if cupy.cuda.runtime.getDeviceCount() < workers:
        log(f"  {workers} GPUs: skipped, {cupy.cuda.runtime.getDeviceCount()} visible")
        return None
    try:
        from dask_cuda import LocalCUDACluster
        from distributed import Client
    except ImportError:
        if workers > 1:
            log(f"  {workers} GPUs: skipped, dask-cuda is not installed (pip install 'cuconv[dask-cuda]')")
            return None
        return _timed(lambda: make_graph(args, True).compute(scheduler="threads", num_workers=1), args.repeats)
    with LocalCUDACluster(CUDA_VISIBLE_DEVICES=list(range(workers)), n_workers=workers, threads_per_worker=1,
                          dashboard_address=None) as cluster, Client(cluster) as client:
        seconds = _timed(lambda: client.compute(make_graph(args, True)).result(), args.repeats)
        if args.transfers and workers > 1:
            moved = worker_transfers(client, lambda: client.compute(make_graph(args, True)).result())
            total = sum(moved.values())
            log(f"  {workers} GPUs: the workers fetched {total / 2**20:.1f} MiB from each other in one run ("
                + ", ".join(f"{name} {nbytes / 2**20:.1f} MiB" for name, nbytes in moved.most_common()) + ")")
        return seconds


def _copy_rate(device: int, duplex: bool, start, rates) -> None:
    """In a process of its own: GB/s of 1 GiB page-locked copies to GPU ``device`` and back, one after the
    other on one stream, or both at once on two streams (``duplex``), timed from ``start`` (a barrier)."""
    import cupy
    import cupyx
    import numpy as np
    cupy.cuda.Device(device).use()
    n = 1 << 30
    host_in, host_out = cupyx.empty_pinned((n,), np.uint8), cupyx.empty_pinned((n,), np.uint8)
    host_in[...] = 1
    dev_in, dev_out = cupy.empty((n,), np.uint8), cupy.empty((n,), np.uint8)
    up, down = cupy.cuda.Stream(non_blocking=True), cupy.cuda.Stream(non_blocking=True)

    def both_ways():
        dev_in.set(host_in, stream=up)
        dev_out.get(stream=down if duplex else up, out=host_out)
        up.synchronize()
        down.synchronize()
    both_ways()
    start.wait()
    t0 = time.perf_counter()
    for _ in range(8):
        both_ways()
    rates.put(16 * n / (time.perf_counter() - t0) / 1e9)


def copy_rates(gpus: int, duplex: bool) -> List[float]:
    """GB/s (host to GPU plus GPU to host) of each of the first ``gpus`` GPUs, all copying at once."""
    import multiprocessing
    ctx = multiprocessing.get_context("spawn")
    start, rates = ctx.Barrier(gpus), ctx.Queue()
    procs = [ctx.Process(target=_copy_rate, args=(d, duplex, start, rates)) for d in range(gpus)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    return [rates.get() for _ in procs]


def worker_transfers(client, run) -> "collections.Counter":
    """Bytes the workers of ``client`` fetched from each other while ``run()`` ran, by task name (the
    key's name without its token): which results crossed between workers, and how much of them."""
    client.run(lambda dask_worker: dask_worker.transfer_incoming_log.clear())
    run()
    moved = collections.Counter()
    for entries in client.run(lambda dask_worker: list(dask_worker.transfer_incoming_log)).values():
        for entry in entries:
            for key, nbytes in entry["keys"].items():
                name = key[0] if isinstance(key, tuple) else str(key)
                moved[name.rsplit("-", 1)[0]] += nbytes
    return moved


def main(argv: Optional[List[str]] = None) -> int:
    args = parser().parse_args(argv)
    check_args(args)
    if not args.cpu:
        from cuconv.device import gpu_available
        if not gpu_available():
            print("no GPU visible to CuPy: nothing to measure (--cpu checks the pipeline on the host)", file=sys.stderr)
            return 2
    where = "host threads" if args.cpu else "GPUs"
    memory = {}
    if not args.cpu:
        import cupy
        free, total = cupy.cuda.runtime.memGetInfo()
        memory = {"device": cupy.cuda.runtime.getDeviceProperties(0)["name"].decode(), "gpu_total_bytes": total,
                  "gpu_free_bytes": free}
        if args.gpu_fraction is not None:
            args.volume = [depth_for(args, total), *args.volume[1:]]
    print(f"volume (1, {', '.join(map(str, args.volume))}, {args.channels}) {args.dtype} "
          f"({volume_bytes(args) / 2**30:.2f} GiB), filter {args.out_channels}x{args.filter}^3x{args.channels}, "
          f"chunks of depth {args.depth_chunk}")
    if memory:
        print(f"GPU 0: {memory['device']}, {memory['gpu_total_bytes'] / 2**30:.2f} GiB total, "
              f"{memory['gpu_free_bytes'] / 2**30:.2f} GiB free; the input volume is "
              f"{volume_bytes(args) / memory['gpu_total_bytes']:.2f}x its total and "
              f"{volume_bytes(args) / memory['gpu_free_bytes']:.2f}x its free memory")
    records, copies = [], []
    if args.copy_rates and not args.cpu:
        import cupy
        for duplex in (False, True):
            for gpus in args.gpus:
                if gpus > cupy.cuda.runtime.getDeviceCount():
                    continue
                rates, how = copy_rates(gpus, duplex), "both ways at once" if duplex else "one way at a time"
                copies.append({"copy": how, "gpus": gpus, "gb_per_s": rates})
                print(f"page-locked copies, {how}, {gpus} GPUs: {sum(rates):.1f} GB/s "
                      f"({', '.join(f'{r:.1f}' for r in rates)} per GPU)")
    for workers in args.gpus:
        s = time_workers(cuconv_graph, args, workers)
        if s is not None:
            records.append({"library": "cuconv.dask", "workers": workers, "seconds": s})
            print(f"cuconv.dask  {workers} {where}: {s:8.3f} s  ({volume_bytes(args) / s / 1e9:.1f} GB/s of input)")
    if args.dask_image:
        try:
            import dask_image  # noqa: F401
        except ImportError:
            print("dask-image: skipped, not installed (pip install dask-image)")
        else:
            s = time_workers(dask_image_graph, args, 1)
            if s is not None:
                records.append({"library": "dask-image", "workers": 1, "seconds": s})
                print(f"dask-image   1 {where}: {s:8.3f} s")
    one = {r["library"]: r["seconds"] for r in records if r["workers"] == 1}
    for r in records:
        if r["library"] == "cuconv.dask" and r["workers"] > 1 and "cuconv.dask" in one:
            print(f"speed-up on {r['workers']} {where}: {one['cuconv.dask'] / r['seconds']:.2f}x")
    if "dask-image" in one and "cuconv.dask" in one:
        print(f"cuconv.dask vs dask-image on 1: {one['dask-image'] / one['cuconv.dask']:.1f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "volume_bytes": volume_bytes(args), **memory, "records": records,
                       "copy_rates": copies}, f, indent=1)
    return 0


if __name__ == "__main__":
    # run through the importable module, so the graphs' functions pickle by reference to it for the workers
    # (by value from __main__ they would carry copies of this module's per-process caches)
    from cuconv.bench import dask_scaling
    sys.exit(dask_scaling.main())
