"""The Hopper kernel's split of small problems, swept: how many parts pay on which layers.

``python -m cuconv.bench.split_sweep [--network NAME ...] [--batch N] [--ways 2 4 8 16]`` takes the conv
layers of the networks suite whose automatic tiling leaves at least half of the SMs without a tile (few
output tiles; often a long reduction), and times each one on the GPU:

* as the automatic choice runs it;
* forced onto im2col tiles cut into each of ``--ways`` parts along the reduction
  (``cuconv.overrides(split_ways=N, halo=False)``; fewer parts where fewer fit, as ``explain`` says);
* through cuDNN (torch, when it is installed) on the same tensors.

Each time is the median of single calls between CUDA events with the L2 flushed before each (the GPU time
of the call, :func:`cuconv.bench.timing.time_calls`). Every split result is checked against the
automatic one, and run twice for equal bits. ``--json PATH`` writes the records. The sweep is the
measurement an automatic rule for ``split_ways`` is to be fitted to; nothing here changes a default.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import List, Optional

from .networks import NETWORKS

DEFAULT_NETWORKS = ("sd_unet", "resnet50", "sd_vae_decoder", "yolov8s")
DEFAULT_WAYS = (2, 3, 4, 6, 8, 12, 16)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m cuconv.bench.split_sweep", description=__doc__.split("\n\n")[0])
    ap.add_argument("--network", action="append", choices=sorted(NETWORKS),
                    help=f"a network of the suite (repeatable; default {', '.join(DEFAULT_NETWORKS)})")
    ap.add_argument("--batch", type=int, help="batch size of every layer instead of the network's")
    ap.add_argument("--ways", type=int, nargs="+", default=list(DEFAULT_WAYS),
                    help=f"part counts to try (2-16; default {' '.join(map(str, DEFAULT_WAYS))})")
    ap.add_argument("--dtype", choices=("bfloat16", "float16"), default="bfloat16")
    ap.add_argument("--sm-count", type=int, help="SMs to plan for (default: the GPU's)")
    ap.add_argument("--runs", type=int, default=50, help="timed calls per configuration (default 50)")
    ap.add_argument("--list", action="store_true", help="print the layers that would be swept, and stop")
    ap.add_argument("--no-torch", action="store_true", help="do not time cuDNN")
    ap.add_argument("--json", metavar="PATH", help="write the records as JSON")
    return ap


def check_args(args) -> None:
    from ..backends.sm90.tiles import SPLIT_WAYS
    bad = [w for w in args.ways if w not in SPLIT_WAYS]
    if bad:
        raise SystemExit(f"--ways: each must be one of {SPLIT_WAYS[0]}-{SPLIT_WAYS[-1]}, got {bad}")
    for name in ("batch", "sm_count", "runs"):
        v = getattr(args, name)
        if v is not None and v < 1:
            raise SystemExit(f"--{name.replace('_', '-')}: must be >= 1, got {v}")


def problem_of(layer, dtype: str):
    """The :class:`cuconv.problem.ConvProblem` of a suite layer (NHWC, no epilogue)."""
    from ..validate import conv_problem
    shape_x = (layer.N, layer.H, layer.W, layer.C)
    shape_w = (layer.K, layer.R, layer.S, layer.C // layer.groups)
    return conv_problem(2, shape_x, shape_w, dtype, "NHWC", layer.stride, layer.pad, layer.dilation, layer.groups,
                        1.0, 1.0, False, False, None)


def candidates(names, batch: Optional[int], dtype: str, sm_count: int):
    """``[(network, layer, tile config)]``: the dense layers (groups 1) whose automatic Hopper tiling has at
    most ``sm_count // 2`` tiles and at least two reduction steps, in the networks' order, each geometry
    once."""
    from ..backends.sm90.tiles import tile_config
    from ..overrides import Overrides
    seen, out = set(), []
    for name in names:
        for layer in NETWORKS[name].layers:
            if batch is not None:
                layer = dataclasses.replace(layer, N=batch)
            if layer.groups != 1 or layer.geometry in seen:
                continue
            cfg = tile_config(problem_of(layer, dtype), sm_count, Overrides())
            if 2 * cfg.num_tiles <= sm_count and cfg.k_iters >= 2:
                seen.add(layer.geometry)
                out.append((name, layer, cfg))
    return out


def sweep_layer(layer, dtype: str, ways: List[int], runs: int, torch=None) -> dict:
    """Times of one layer: automatic, each forced part count, cuDNN; checks of each split result."""
    import cupy as cp

    import cuconv
    from ..arrays import BFLOAT16
    from .timing import time_calls
    dt = BFLOAT16 if dtype == "bfloat16" else cp.float16
    x = cp.random.standard_normal((layer.N, layer.H, layer.W, layer.C), dtype=cp.float32).astype(dt)
    w = (cp.random.standard_normal((layer.K, layer.R, layer.S, layer.C), dtype=cp.float32)
         / (layer.R * layer.S * layer.C) ** 0.5).astype(dt)
    kw = dict(stride=layer.stride, padding=layer.pad, dilation=layer.dilation)
    out = cp.empty((layer.N, layer.P, layer.Q, layer.K), dtype=dt)
    rec = dict(layer=layer.name, geometry=layer.to_json(), ways={}, parts={}, rel_diff={}, same_bits={})
    rec["auto_detail"] = cuconv.explain(x, w, out=out, **kw).detail
    rec["auto_ms"] = time_calls(lambda i: cuconv.conv2d(x, w, out=out, **kw), 1, runs)
    auto = cuconv.conv2d(x, w, **kw).astype(cp.float32)
    for n in ways:
        with cuconv.overrides(split_ways=n, halo=False):
            detail = cuconv.explain(x, w, out=out, **kw).detail
            rec["parts"][n] = _parts(detail)
            rec["ways"][n] = time_calls(lambda i: cuconv.conv2d(x, w, out=out, **kw), 1, runs)
            a, b = cuconv.conv2d(x, w, **kw), cuconv.conv2d(x, w, **kw)
        rec["same_bits"][n] = bool((a.view(cp.uint16) == b.view(cp.uint16)).all())
        rec["rel_diff"][n] = float(cp.linalg.norm(a.astype(cp.float32) - auto) / cp.linalg.norm(auto))
    if torch is not None:
        tx, tw = torch.from_dlpack(x).permute(0, 3, 1, 2), torch.from_dlpack(w).permute(0, 3, 1, 2)
        rec["cudnn_ms"] = time_calls(lambda i: torch.nn.functional.conv2d(tx, tw, **kw), 1, runs, torch_events=True)
    return rec


def _parts(detail: str) -> int:
    """The part count ``explain`` names for a split tiling (1 when nothing is split)."""
    import re
    m = re.search(r"split (in two|(\d+) ways) along the reduction", detail)
    return 1 if m is None else (2 if m.group(1) == "in two" else int(m.group(2)))


def line(rec: dict) -> str:
    best = min(rec["ways"], key=rec["ways"].get) if rec["ways"] else None
    times = "  ".join(f"{n}:{ms * 1e3:6.1f}" + ("" if rec["parts"][n] == n else f"({rec['parts'][n]})")
                      for n, ms in rec["ways"].items())
    cudnn = f"  cuDNN {rec['cudnn_ms'] * 1e3:6.1f}" if "cudnn_ms" in rec else ""
    gain = f"  best {best} parts: {rec['auto_ms'] / rec['ways'][best]:.2f}x of auto" if best else ""
    return f"{rec['layer'][:34]:34s} auto {rec['auto_ms'] * 1e3:6.1f} us  parts:us {times}{cudnn}{gain}"


def main(argv: Optional[List[str]] = None) -> int:
    args = parser().parse_args(argv)
    check_args(args)
    names = args.network or list(DEFAULT_NETWORKS)
    sm_count = args.sm_count
    if sm_count is None and not args.list:
        from ..device import gpu_available, gpu_info
        if not gpu_available():
            print("no GPU visible to CuPy: nothing to time (--list prints the layers)", file=sys.stderr)
            return 2
        sm_count = gpu_info(0).sm_count
    layers = candidates(names, args.batch, args.dtype, sm_count or 132)
    print(f"{len(layers)} layers of {', '.join(names)} with at most {(sm_count or 132) // 2} tiles"
          + (f" (batch {args.batch})" if args.batch else ""))
    if args.list:
        for name, layer, cfg in layers:
            print(f"  {name:16s} {layer.describe()}: "
                  f"{cfg.num_tiles} tiles of {cfg.block_m}x{cfg.block_n}, {cfg.k_iters} reduction steps")
        return 0
    torch = None
    if not args.no_torch:
        try:
            import torch
        except ImportError:
            torch = None
    records = []
    for name, layer, cfg in layers:
        rec = sweep_layer(layer, args.dtype, args.ways, args.runs, torch)
        rec.update(network=name, tiles=cfg.num_tiles, k_iters=cfg.k_iters)
        records.append(rec)
        print(line(rec), flush=True)
        bad = [n for n in args.ways if not rec["same_bits"][n] or rec["rel_diff"][n] > 2e-2]
        if bad:
            print(f"  CHECK FAILED for parts {bad}: same bits {rec['same_bits']}, rel diff {rec['rel_diff']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "sm_count": sm_count, "records": records}, f, indent=1)
    return 0 if all(rec["same_bits"][n] and rec["rel_diff"][n] <= 2e-2 for rec in records for n in args.ways) else 1


if __name__ == "__main__":
    sys.exit(main())
