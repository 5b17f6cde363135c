"""cuconv.dask on one and on several GPUs, and against dask-image, on a 3-D volume from host memory.

``python -m cuconv.bench.dask_scaling`` convolves a ``(1, D, H, W, C)`` volume chunked along depth with a
``K x F x F x F x C`` filter (``padding="same"``) through :func:`cuconv.dask.conv3d` and prints the wall time
of the whole graph for each worker count of ``--gpus``: every chunk is made in host memory, copied to its
worker's GPU, convolved, and copied back to host memory (where a checksum of it is kept), so the time
includes the transfers a volume larger than a GPU needs. Several GPUs run through
``dask_cuda.LocalCUDACluster`` (one worker per GPU); one GPU runs in-process when dask-cuda is absent.
``--dask-image`` also times ``dask_image.ndfilters.correlate`` on the same CuPy-chunked volume, one 3-D
filter per (output, input) channel pair summed over the input channels, and prints the ratio.

``--cpu`` runs the same graphs with NumPy chunks on the host (``--gpus`` then counts threads): a check of
the pipeline on a machine without a GPU, not a measurement of cuconv's kernels. The median of
``--repeats`` runs is printed after one untimed run (kernel compiles, worker start). ``--json PATH``
writes the records.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
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
    ap.add_argument("--depth-chunk", type=int, default=32, help="depth of one chunk (default 32)")
    ap.add_argument("--gpus", type=int, nargs="+", default=[1, 2], help="worker counts to time (default 1 2)")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs per worker count (default 3)")
    ap.add_argument("--dask-image", action="store_true", help="also time dask_image.ndfilters.correlate")
    ap.add_argument("--cpu", action="store_true", help="NumPy chunks on the host (a pipeline check)")
    ap.add_argument("--json", metavar="PATH", help="write the records as JSON")
    return ap


def check_args(args) -> None:
    """Refuse values the graphs cannot be built from (argparse has checked the types)."""
    for name in ("channels", "out_channels", "filter", "depth_chunk", "repeats"):
        if getattr(args, name) < 1:
            raise SystemExit(f"--{name.replace('_', '-')}: must be >= 1, got {getattr(args, name)}")
    if min(args.volume) < 1 or min(args.gpus) < 1:
        raise SystemExit(f"--volume and --gpus: every value must be >= 1, got {args.volume} and {args.gpus}")
    if args.filter % 2 == 0:
        raise SystemExit(f"--filter: must be odd (dask-image centres an even filter differently), got {args.filter}")


def volume_bytes(args) -> int:
    """Bytes of the input volume (the output has the same size when K == C)."""
    return math.prod(args.volume) * args.channels * (4 if args.dtype == "float32" else 2)


def _dtype(name):
    import ml_dtypes
    import numpy as np
    return ml_dtypes.bfloat16 if name == "bfloat16" else np.dtype(name)


def _host_block(block, dtype, block_id=None):
    """A chunk of the volume made in host memory: a random pattern tiled over the chunk (cheap to make)."""
    import numpy as np
    pattern = np.random.default_rng(hash(block_id) % 2**32).standard_normal(min(block.size, 1 << 16))
    return np.resize(pattern.astype(np.float32), block.shape).astype(dtype)


def _checksum(block):
    """The chunk copied to host memory, reduced to one number (keeps the copy, drops the data)."""
    import numpy as np
    host = block if isinstance(block, np.ndarray) else block.get()
    return np.full((1,) * host.ndim, float(host.astype(np.float32)[..., :1].sum()), np.float32)


def volume(args, on_gpu: bool):
    """The lazy input: (1, D, H, W, C), chunked along depth, each chunk made on the host (and moved to a GPU)."""
    import dask.array as da
    import numpy as np
    shape = (1, *args.volume, args.channels)
    chunks = (1, args.depth_chunk, *args.volume[1:], args.channels)
    x = da.empty(shape, chunks=chunks, dtype=np.float32).map_blocks(_host_block, _dtype(args.dtype),
                                                                     dtype=_dtype(args.dtype))
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
    return y.map_blocks(_checksum, chunks=tuple((1,) * len(c) for c in y.chunks), dtype="float32",
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
        return _timed(lambda: client.compute(make_graph(args, True)).result(), args.repeats)


def main(argv: Optional[List[str]] = None) -> int:
    args = parser().parse_args(argv)
    check_args(args)
    if not args.cpu:
        from cuconv.device import gpu_available
        if not gpu_available():
            print("no GPU visible to CuPy: nothing to measure (--cpu checks the pipeline on the host)", file=sys.stderr)
            return 2
    where = "host threads" if args.cpu else "GPUs"
    print(f"volume (1, {', '.join(map(str, args.volume))}, {args.channels}) {args.dtype} "
          f"({volume_bytes(args) / 2**30:.2f} GiB), filter {args.out_channels}x{args.filter}^3x{args.channels}, "
          f"chunks of depth {args.depth_chunk}")
    records = []
    for workers in args.gpus:
        s = time_workers(cuconv_graph, args, workers)
        if s is not None:
            records.append({"library": "cuconv.dask", "workers": workers, "seconds": s})
            print(f"cuconv.dask  {workers} {where}: {s:8.3f} s")
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
            json.dump({"args": vars(args), "volume_bytes": volume_bytes(args), "records": records}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
