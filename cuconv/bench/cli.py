"""The command line of ``python -m cuconv.bench``: parse, check what the machine has, run, write.

Exit status: 0 when every result passed its check, 1 when one failed, 2 when the benchmark cannot
run here (CuPy not installed, no GPU visible: :func:`~.environment.require_gpu` says which). Drawing
an earlier run (``--plot FILE.png --plot-from JSON``) and generating the results page (``--report``)
need neither CuPy nor a GPU.

With ``--json FILE`` the conv2d suites' records go to ``FILE`` and each other suite's to
``FILE_<suite>.json`` (e.g. ``h100.json``, ``h100_conv3d.json``, ``h100_sm80.json``); every file
carries the run's date, device, command, software versions and ceilings, which the results page
(:mod:`.report`) prints.

The networks suite (:mod:`.networks`: every conv layer of nine networks, as a forward pass runs them)
runs only when named: ``--suite networks``, or ``--network NAME`` (repeatable) for some of them;
``--layers`` prints its per-layer tables (the JSON always holds them). Its ``--plot`` chart (each
network's speed vs cuDNN) goes to ``FILE.png``, or to ``FILE_networks.png`` when a conv2d suite ran too.
The grad suite (:mod:`.grad`) also runs only when named (``--suite grad``; ``--network`` picks its
networks).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import sys
import time
from typing import List, Optional

from . import conv2d, conv3d, networks, sm80
from .ceilings import measure
from .environment import EXIT_UNAVAILABLE, Unavailable, require_gpu, run_metadata, torch_for_cudnn
from .timing import spin_up

__all__ = ["OTHER_SUITES", "ALL_SUITES", "OPT_IN_SUITES", "parser", "main", "write_json"]

#: Suites with their own module, columns and JSON file, run after the conv2d suites.
OTHER_SUITES = ("sm80", "conv3d")
#: The suites a run without ``--suite`` runs.
ALL_SUITES = tuple(conv2d.SUITES) + OTHER_SUITES
#: Suites that run only when named (own JSON file too): the networks suite takes minutes.
OPT_IN_SUITES = ("networks", "grad")
DTYPES = ("bfloat16", "float16")


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m cuconv.bench",
                                 description="cuconv's benchmark: checks each result against the reference, "
                                             "then times it against cuDNN (through torch, when installed)")
    ap.add_argument("--suite", action="append", choices=ALL_SUITES + OPT_IN_SUITES,
                    help="suite(s) to run (default: all but networks): conv2d suites resnet50 and vae_unet; sm80 "
                         "(the sm_80+ kernel and cuconv.matmul); conv3d (every conv3d strategy on video-VAE "
                         "layers); networks (every conv layer of nine networks, run only when named); grad (input and "
                         "weight gradients of networks' layers and transposed convolutions, run only when named)")
    ap.add_argument("--network", action="append", choices=list(networks.NETWORKS), metavar="NAME",
                    help="networks and grad suites: run this network (repeatable; default: all of "
                         + ", ".join(networks.NETWORKS) + " for networks, resnet50 and sd_vae_decoder for grad); "
                         "without --suite implies --suite networks")
    ap.add_argument("--layers", action="store_true", help="networks suite: print the per-layer tables")
    ap.add_argument("--layout", choices=["NHWC", "NCHW"], default="NHWC",
                    help="networks suite: the arrays' layout, for cuconv and cuDNN alike (default NHWC)")
    ap.add_argument("--dtype", action="append", choices=DTYPES + ("float32", "float64"),
                    help="dtype(s) (default: bfloat16 and float16); float32 and float64: the networks suite "
                         "only, float32 against cuDNN with TF32 on (torch's default) and off, float64 against "
                         "cuDNN's float64")
    ap.add_argument("--precision", choices=["float32", "tf32"],
                    help="networks suite, float32 arrays: cuconv's precision= (default: float32)")
    ap.add_argument("--autotune", nargs="?", const="", metavar="FILE",
                    help="networks suite: cuconv's calls under cuconv.autotune (each layer's candidate kernels "
                         "and tiles measured on its first call, the fastest run), with FILE its decision file; "
                         "cuDNN runs with its own autotuner (torch.backends.cudnn.benchmark) either way")
    ap.add_argument("--json", metavar="FILE", help="write every number to FILE (other suites: FILE_<suite>.json)")
    ap.add_argument("--quick", action="store_true", help="fewer timed runs (20) and no generic_gpu comparison")
    ap.add_argument("--runs", type=int, default=30, help="timed runs per measurement (>= 20; default 30)")
    ap.add_argument("--no-torch", action="store_true", help="skip the cuDNN comparison")
    ap.add_argument("--no-generic", action="store_true", help="skip the generic_gpu comparison")
    ap.add_argument("--generic-max-gb", type=float, default=2.0, help="skip generic_gpu above this im2col size")
    ap.add_argument("--residual", choices=["auto", "all", "none"], default="auto",
                    help="residual beta=1 vs beta=0 timing: auto = the vae_unet suite's shapes")
    ap.add_argument("--no-sustained", action="store_true",
                    help="skip the sustained (back-to-back, power-limited) timing of the shapes over 0.1 ms")
    ap.add_argument("--skip-resnet", action="store_true", help="sm80 suite: skip the forced ResNet-50 shapes")
    ap.add_argument("--plot", metavar="FILE.png", help="draw the roofline + per-shape chart (matplotlib)")
    ap.add_argument("--plot-from", metavar="JSON", help="with --plot: draw an existing --json file, run nothing")
    ap.add_argument("--report", nargs="?", const="docs/bench", metavar="DIR",
                    help="write DIR/README.md from the JSON results in DIR (default docs/bench), run nothing")
    return ap


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = parser()
    args = ap.parse_args(argv)
    if args.report:
        if not os.path.isdir(args.report):
            ap.error(f"--report: no such folder: {args.report}")
        from .report import write_report
        print(f"wrote {write_report(args.report)}")
        return 0
    if args.plot:
        try:
            import matplotlib  # noqa: F401  (missing matplotlib fails now, not after the run)
        except ImportError:
            print("cuconv.bench: --plot needs matplotlib: pip install 'cuconv[bench]'", file=sys.stderr)
            return EXIT_UNAVAILABLE
    if args.plot_from:
        if not args.plot:
            ap.error("--plot-from needs --plot FILE.png")
        if not os.path.isfile(args.plot_from):
            ap.error(f"--plot-from: no such file: {args.plot_from}")
        with open(args.plot_from) as f:
            doc = json.load(f)
        if isinstance(doc, dict) and doc.get("suite") == "networks":
            from .networks.output import plot_networks
            plot_networks(doc, args.plot)
        else:
            from .plot import plot_bench
            plot_bench(doc, args.plot)
        print(f"wrote {args.plot}")
        return 0
    if args.network:
        if args.suite and not {"networks", "grad"} & set(args.suite):
            ap.error("--network: picks networks of the networks and grad suites, which --suite leaves out: "
                     "add --suite networks or --suite grad")
        args.suite = args.suite or ["networks"]
    for wide in ("float32", "float64"):
        if wide in (args.dtype or ()) and set(args.suite or ALL_SUITES) - {"networks"}:
            ap.error(f"--dtype {wide}: the networks suite only (--suite networks or --network NAME)")
    if args.autotune is not None and set(args.suite or ALL_SUITES) != {"networks"}:
        ap.error("--autotune: the networks suite only (--suite networks or --network NAME)")
    if args.precision and "float32" not in (args.dtype or ()):
        ap.error("--precision: applies to float32 arrays: add --dtype float32")
    if args.json and not os.path.isdir(os.path.dirname(os.path.abspath(args.json))):
        ap.error(f"--json: the folder of {args.json} does not exist")  # found now, not after the run
    try:
        dev = require_gpu()
    except Unavailable as e:
        print(f"cuconv.bench: cannot run: {e}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    return _run(args, argv, dev)


def _run(args, argv: List[str], dev) -> int:
    import cupy as cp
    log = functools.partial(print, flush=True)
    suites = args.suite or list(ALL_SUITES)
    dtypes = args.dtype or list(DTYPES)
    runs = max(20, 20 if args.quick else args.runs)
    torch, why_not = torch_for_cudnn(args.no_torch)
    with_torch = torch is not None
    meta = run_metadata(argv, dev.describe())
    log(f"device: {meta['device']}; {runs} runs, median; {meta['date']}")
    if why_not:
        log(why_not)
    spin_up()
    ceilings = measure(dev.name, log=log)
    log(f"ceilings: {ceilings.describe()}")
    host = conv2d.host_overhead_us(with_torch=with_torch)
    log("host work per call (back-to-back calls of a tiny conv, microseconds): "
        + ", ".join(f"{k} {v:.1f}" for k, v in host.items()))
    t0 = time.time()
    spin_up()
    records = conv2d.run_queued([s for s in suites if s in conv2d.SUITES], dtypes, runs, with_torch=with_torch,
                                with_generic=not (args.no_generic or args.quick),
                                generic_max_gb=args.generic_max_gb, residual=args.residual, ceilings=ceilings,
                                log=log)
    others = {}
    if "sm80" in suites:
        others["sm80"] = sm80.run(dtypes, runs, with_torch=with_torch, resnet=not args.skip_resnet, log=log)
        cp.get_default_memory_pool().free_all_blocks()
    if "conv3d" in suites:
        others["conv3d"] = conv3d.run(dtypes, runs, with_torch=with_torch, sustained=not args.no_sustained,
                                      ceilings=ceilings, log=log)
    if "networks" in suites:
        others["networks"] = _run_networks(args, dtypes, torch, log)
    if "grad" in suites:
        from . import grad
        others["grad"] = grad.run(args.network, dtypes, torch=torch, log=log)
    if not args.no_sustained:  # last: a GPU at its power limit for seconds would slow the queued runs
        conv2d.run_sustained(records, with_torch=with_torch, log=log)
    for line in conv2d.geomean_lines(records):
        log(line)
    log(f"{time.time() - t0:.0f} s")
    common = dict(meta, ceilings=ceilings.to_json(), runs=runs, cudnn=why_not or "compared through torch",
                  autotune=args.autotune is not None)
    if args.json:
        write_json(args.json, records, others, common, host)
    if args.plot and records:
        from .plot import plot_bench
        plot_bench(dict(common, records=records), args.plot)
        log(f"wrote {args.plot}")
    elif args.plot and "networks" not in others:
        log("--plot draws the conv2d suites' records, and none ran: no chart written")
    if args.plot and "networks" in others:
        from .networks.output import plot_networks
        png = f"{os.path.splitext(args.plot)[0]}_networks.png" if records else args.plot
        plot_networks(dict(common, records=others["networks"]), png)
        log(f"wrote {png}")
    ok = all(r.get("check_ok") for r in records + others.get("conv3d", []) + others.get("networks", [])
             + others.get("grad", []))
    ok = ok and all(sm80.check_ok(r) for r in others.get("sm80", []))
    return 0 if ok else 1


def _run_networks(args, dtypes: List[str], torch, log) -> List[dict]:
    """The networks suite (:func:`.networks.runner.run`): the networks named by ``--network`` (default
    all), then the summary table, and with ``--layers`` every network's per-layer table."""
    from .networks.output import layer_lines, summary_lines
    from .networks.runner import run as run_networks
    import cuconv
    names = list(dict.fromkeys(args.network or networks.NETWORKS))
    tuned = args.autotune is not None
    with cuconv.autotune(path=args.autotune or None) if tuned else contextlib.nullcontext():
        recs = run_networks(names, dtypes, torch=torch, log=log, layout=args.layout, precision=args.precision)
    log("== networks: conv layers only, ms per forward pass; speed = cuDNN ms / cuconv ms"
        + ("; cuconv under cuconv.autotune" if tuned else ""))
    for line in summary_lines(recs):
        log(line)
    if args.layers:
        for rec in recs:
            for line in layer_lines(rec):
                log(line)
    return recs


def write_json(path: str, records, others, common: dict, host) -> None:
    """The conv2d records to ``path``, each other suite's to ``<path stem>_<suite>.json``."""
    root = os.path.splitext(path)[0]
    files = []
    if records:
        files.append((path, dict(common, suite="conv2d", host_us_per_call=host, records=records)))
    for name, recs in others.items():
        files.append((f"{root}_{name}.json", dict(common, suite=name, records=recs)))
    for target, doc in files:
        with open(target, "w") as f:
            json.dump(doc, f, indent=1, default=float)
        print(f"wrote {target}")

