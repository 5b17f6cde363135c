"""Layers of the networks suite, each timed as the automatic choice runs it and under alternatives.

Two questions, one tool:

* ``python -m cuconv.bench.layer_ab --split-ways 2 4 8 16``: the Hopper kernel's split of small problems
  forced to N parts (``cuconv.overrides(split_ways=N, halo=False)``) against its automatic rule
  (docs/tuning.md T-split-small). The layers are those whose automatic tiling leaves at
  least half of the SMs without a tile (few output tiles, often a long reduction).
* ``python -m cuconv.bench.layer_ab --wider-split 128 160 192 256 [--parts 2 3]``: layers whose unsplit
  tiles fit one wave of the SMs with long reductions, unsplit (``cuconv.overrides(split=False)``) and as
  tiles of each width cut into each part count along the reduction (``block_n=BN, block_m=128,
  split_ways=N, halo=False``), against the automatic rule (docs/tuning.md T-split-wider).
* ``python -m cuconv.bench.layer_ab --kernel sm90_fold``: a kernel that the automatic choice does not
  take (``kernel=NAME``). The layers are those it accepts.

``--network NAME`` (repeatable) picks the networks, ``--batch N`` replaces their batch. Every layer is
also timed through cuDNN (torch, when it is installed) on the same tensors. Each time is the median of
single calls between CUDA events with the L2 flushed before each (the GPU time of a call,
:func:`cuconv.bench.timing.time_calls`). Every alternative's result is checked against the automatic
one (relative difference) and run twice for equal bits. ``--json PATH`` writes the records. These
are the measurements that a default is changed on; the tool changes none.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
from typing import List, Optional

from .networks import NETWORKS

DEFAULT_NETWORKS = ("sd_unet", "resnet50", "sd_vae_decoder", "yolov8s")
#: The relative difference from the automatic result an alternative may show (16-bit rounding of a
#: differently ordered fp32 sum is far below it; a wrong result is far above).
MAX_REL_DIFF = 2e-2


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m cuconv.bench.layer_ab", description=__doc__.split("\n\n")[0])
    what = ap.add_mutually_exclusive_group(required=True)
    what.add_argument("--split-ways", type=int, nargs="+", metavar="N",
                      help="part counts (2-16) of the Hopper split of small problems")
    what.add_argument("--wider-split", type=int, nargs="+", metavar="BN",
                      help="tile widths to cut in two along the reduction, on layers filling one partial wave")
    what.add_argument("--kernel", help="a kernel to force on every layer it accepts (cuconv.kernels())")
    ap.add_argument("--parts", type=int, nargs="+", default=[2], metavar="N",
                    help="--wider-split: part counts of the wider tiles (default 2)")
    ap.add_argument("--network", action="append", choices=sorted(NETWORKS),
                    help=f"a network of the suite (repeatable; default {', '.join(DEFAULT_NETWORKS)})")
    ap.add_argument("--batch", type=int, help="batch size of every layer instead of the network's")
    ap.add_argument("--dtype", choices=("bfloat16", "float16"), default="bfloat16")
    ap.add_argument("--sm-count", type=int, help="SMs to plan the layer choice for (default: the GPU's)")
    ap.add_argument("--runs", type=int, default=50, help="timed calls per configuration (default 50)")
    ap.add_argument("--list", action="store_true", help="print the layers that would be timed, and stop")
    ap.add_argument("--no-torch", action="store_true", help="do not time cuDNN")
    ap.add_argument("--json", metavar="PATH", help="write the records as JSON")
    return ap


def check_args(args) -> None:
    from ..backends.sm90.tiles import SPLIT_WAYS, STAGES
    from ..dispatch import kernels
    bad = [w for w in args.split_ways or () if w not in SPLIT_WAYS]
    if bad:
        raise SystemExit(f"--split-ways: each must be one of {SPLIT_WAYS[0]}-{SPLIT_WAYS[-1]}, got {bad}")
    bad = [b for b in getattr(args, "wider_split", None) or () if b not in STAGES]
    if bad:
        raise SystemExit(f"--wider-split: each must be one of {sorted(STAGES)}, got {bad}")
    bad = [w for w in getattr(args, "parts", None) or () if w not in SPLIT_WAYS]
    if bad:
        raise SystemExit(f"--parts: each must be one of {SPLIT_WAYS[0]}-{SPLIT_WAYS[-1]}, got {bad}")
    names = [k.name for k in kernels()]
    if args.kernel is not None and args.kernel not in names:
        raise SystemExit(f"--kernel: expected one of {names}, got {args.kernel!r}")
    for name in ("batch", "sm_count", "runs"):
        v = getattr(args, name)
        if v is not None and v < 1:
            raise SystemExit(f"--{name.replace('_', '-')}: must be >= 1, got {v}")


def configurations(args) -> List[tuple]:
    """``[(label, overrides, kernel)]``: the alternatives each layer is timed under."""
    if args.split_ways:
        return [(f"{n} parts", dict(split_ways=n, halo=False), None) for n in args.split_ways]
    if getattr(args, "wider_split", None):
        return [("unsplit", dict(split=False), None)] + [
            (f"{bn} in {n}", dict(block_n=bn, block_m=128, split_ways=n, halo=False), None)
            for bn in args.wider_split for n in getattr(args, "parts", None) or (2,)]
    return [(args.kernel, {}, args.kernel)]


def problem_of(layer, dtype: str):
    """The :class:`cuconv.problem.ConvProblem` of a suite layer (NHWC, no epilogue)."""
    from ..validate import conv_problem
    shape_x = (layer.N, layer.H, layer.W, layer.C)
    shape_w = (layer.K, layer.R, layer.S, layer.C // layer.groups)
    return conv_problem(2, shape_x, shape_w, dtype, "NHWC", layer.stride, layer.pad, layer.dilation, layer.groups,
                        1.0, 1.0, False, False, None)


def hopper(sm_count: int):
    """The device the layer choice is planned for: a Hopper GPU of ``sm_count`` SMs."""
    from ..device import DeviceInfo
    return DeviceInfo(kind="cuda", index=0, name="Hopper", cc=(9, 0), arch="sm_90a", sm_count=sm_count,
                      smem_per_block_optin=232448)


def _unsplit_tiling(layer, dtype: str, sm_count: int, max_tiles: int, min_k_iters: int):
    """Why a dense layer's automatic tiling with no split has at most ``max_tiles`` tiles of at least
    ``min_k_iters`` reduction steps, or None (a grouped layer, or other tiles)."""
    from ..backends.sm90.tiles import tile_config
    from ..overrides import Overrides
    if layer.groups != 1:
        return None
    cfg = tile_config(problem_of(layer, dtype), sm_count, Overrides(split=False))
    if cfg.num_tiles <= max_tiles and cfg.k_iters >= min_k_iters:
        return f"{cfg.num_tiles} tiles of {cfg.block_m}x{cfg.block_n}, {cfg.k_iters} reduction steps"
    return None


def few_tiles(layer, dtype: str, sm_count: int):
    """Why a layer is a small problem for the split (its automatic tiling with no split), or None when it is
    not: dense, at most ``sm_count // 2`` tiles, at least two reduction steps."""
    return _unsplit_tiling(layer, dtype, sm_count, sm_count // 2, 2)


def partial_wave(layer, dtype: str, sm_count: int):
    """Why a layer's unsplit tiles fit one wave (at most ``sm_count``) with a long reduction (at least 24
    steps), or None: the layers the wider split may take."""
    return _unsplit_tiling(layer, dtype, sm_count, sm_count, 24)


def accepted_by(kernel_name: str):
    """A layer filter: why ``kernel_name`` would run the layer (its plan), or None when it declines."""
    from ..dispatch import kernels
    from ..overrides import Overrides
    kernel = next(k for k in kernels() if k.name == kernel_name)

    def why(layer, dtype: str, sm_count: int):
        plan = kernel.plan(problem_of(layer, dtype), hopper(sm_count), Overrides())
        return plan.describe() if plan else None
    return why


def layers(names, batch: Optional[int], dtype: str, sm_count: int, select):
    """``[(network, layer, why)]``: the layers of the networks that ``select(layer, dtype, sm_count)`` gives a
    reason for, in the networks' order, each geometry once."""
    seen, out = set(), []
    for name in names:
        for layer in NETWORKS[name].layers:
            if batch is not None:
                layer = dataclasses.replace(layer, N=batch)
            if layer.geometry in seen:
                continue
            why = select(layer, dtype, sm_count)
            if why:
                seen.add(layer.geometry)
                out.append((name, layer, why))
    return out


def time_layer(layer, dtype: str, configs, runs: int, torch=None) -> dict:
    """Times of one layer: automatic, under each configuration, cuDNN; checks of each alternative."""
    import cupy as cp

    import cuconv
    from ..arrays import BFLOAT16
    from .timing import time_calls
    dt = BFLOAT16 if dtype == "bfloat16" else cp.float16
    cg = layer.C // layer.groups
    x = cp.random.standard_normal((layer.N, layer.H, layer.W, layer.C), dtype=cp.float32).astype(dt)
    w = (cp.random.standard_normal((layer.K, layer.R, layer.S, cg), dtype=cp.float32)
         / (layer.R * layer.S * cg) ** 0.5).astype(dt)
    kw = dict(stride=layer.stride, padding=layer.pad, dilation=layer.dilation, groups=layer.groups)
    out = cp.empty((layer.N, layer.P, layer.Q, layer.K), dtype=dt)
    rec = dict(layer=layer.name, geometry=layer.to_json(), ms={}, detail={}, rel_diff={}, same_bits={})
    rec["auto_detail"] = cuconv.explain(x, w, out=out, **kw).detail
    rec["auto_ms"] = time_calls(lambda i: cuconv.conv2d(x, w, out=out, **kw), 1, runs)
    auto = cuconv.conv2d(x, w, **kw).astype(cp.float32)
    for label, overrides, kernel in configs:
        with cuconv.overrides(**overrides):
            rec["detail"][label] = cuconv.explain(x, w, out=out, kernel=kernel, **kw).detail
            rec["ms"][label] = time_calls(lambda i: cuconv.conv2d(x, w, out=out, kernel=kernel, **kw), 1, runs)
            a, b = cuconv.conv2d(x, w, kernel=kernel, **kw), cuconv.conv2d(x, w, kernel=kernel, **kw)
        rec["same_bits"][label] = bool((a.view(cp.uint16) == b.view(cp.uint16)).all())
        rec["rel_diff"][label] = float(cp.linalg.norm(a.astype(cp.float32) - auto) / cp.linalg.norm(auto))
    if torch is not None:
        tx, tw = torch.from_dlpack(x).permute(0, 3, 1, 2), torch.from_dlpack(w).permute(0, 3, 1, 2)
        rec["cudnn_ms"] = time_calls(lambda i: torch.nn.functional.conv2d(tx, tw, **kw), 1, runs, torch_events=True)
    return rec


def parts(detail: str) -> int:
    """The part count ``explain`` names for a split tiling (1 when nothing is split)."""
    m = re.search(r"split (in two|(\d+) ways) along the reduction", detail)
    return 1 if m is None else (2 if m.group(1) == "in two" else int(m.group(2)))


def line(rec: dict) -> str:
    """One layer's report: its automatic time, each alternative's (a split's actual part count in
    parentheses where fewer fit), cuDNN's, and the best alternative against the automatic choice."""
    def label_text(label):
        m = re.fullmatch(r"(\d+) parts", label)
        if m and parts(rec["detail"][label]) != int(m.group(1)):
            return f"{label}({parts(rec['detail'][label])})"
        return label
    best = min(rec["ms"], key=rec["ms"].get) if rec["ms"] else None
    times = "  ".join(f"{label_text(label)} {ms * 1e3:.1f}" for label, ms in rec["ms"].items())
    cudnn = f"  cuDNN {rec['cudnn_ms'] * 1e3:.1f}" if "cudnn_ms" in rec else ""
    gain = f"  best: {best}, {rec['auto_ms'] / rec['ms'][best]:.2f}x the automatic" if best else ""
    return f"{rec['layer'][:34]:34s} auto {rec['auto_ms'] * 1e3:.1f} us | {times}{cudnn}{gain}"


def checks_pass(rec: dict) -> bool:
    return all(rec["same_bits"][k] and rec["rel_diff"][k] <= MAX_REL_DIFF for k in rec["ms"])


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
    sm_count = sm_count or 132
    if args.split_ways:
        select, what = few_tiles, f"with at most {sm_count // 2} tiles"
    elif args.wider_split:
        select, what = partial_wave, f"fitting one wave of {sm_count} SMs"
    else:
        select, what = accepted_by(args.kernel), f"that {args.kernel} accepts"
    chosen = layers(names, args.batch, args.dtype, sm_count, select)
    print(f"{len(chosen)} layers of {', '.join(names)} {what}" + (f" (batch {args.batch})" if args.batch else ""))
    if args.list:
        for name, layer, why in chosen:
            print(f"  {name:16s} {layer.describe()}: {why[:110]}")
        return 0
    torch = None
    if not args.no_torch:
        try:
            import torch
        except ImportError:
            torch = None
    records = []
    for name, layer, _ in chosen:
        rec = time_layer(layer, args.dtype, configurations(args), args.runs, torch)
        rec["network"] = name
        records.append(rec)
        print(line(rec), flush=True)
        if not checks_pass(rec):
            print(f"  CHECK FAILED: same bits {rec['same_bits']}, relative difference {rec['rel_diff']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "sm_count": sm_count, "records": records}, f, indent=1)
    return 0 if all(checks_pass(rec) for rec in records) else 1


if __name__ == "__main__":
    sys.exit(main())
