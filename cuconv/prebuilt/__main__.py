"""``python -m cuconv.prebuilt``: build a prebuilt kernel store, or show what one holds.

    python -m cuconv.prebuilt build                      # the default catalog into cuconv/prebuilt/cubins/
    python -m cuconv.prebuilt build --arch sm_90a --network resnet50 --dtype bfloat16 --out /shared/cuconv-cubins
    python -m cuconv.prebuilt build --dry-run            # count the catalog's variants, compile nothing
    CUCONV_COMPILE_LOG=used.jsonl python train.py         # on a GPU: log the variants a workload uses...
    python -m cuconv.prebuilt build --jobs-from used.jsonl   # ...and add them to the store
    python -m cuconv.prebuilt show [FOLDER]              # the store in use (or FOLDER): variants, archs, NVRTC

A store outside the package serves when ``CUCONV_PREBUILT`` names its folder.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path
from typing import List, Optional

from . import _PACKAGE_STORE, open_store, store_dir
from .build import (DEFAULT_ARCHS, DEFAULT_DTYPES, DEFAULT_LAYOUTS, EPILOGUES, MODEL_DEVICES, build, catalog,
                    logged_jobs)


def _build(args) -> int:
    from ..bench.networks import NETWORKS
    for name in args.network or ():
        if name not in NETWORKS:
            print(f"--network: expected some of {', '.join(NETWORKS)}, got {name!r}", file=sys.stderr)
            return 2
    jobs = [] if args.no_catalog else catalog(
        archs=args.arch or DEFAULT_ARCHS, networks=args.network, dtypes=args.dtype or DEFAULT_DTYPES,
        layouts=args.layout or DEFAULT_LAYOUTS, epilogues=args.epilogue or tuple(EPILOGUES))
    for log in args.jobs_from or ():
        try:
            jobs += logged_jobs(log)
        except (OSError, ValueError) as e:
            print(f"--jobs-from: {e}", file=sys.stderr)
            return 2
    jobs = list(dict.fromkeys(jobs))
    if not jobs:
        print("no variants to build (--no-catalog without --jobs-from)", file=sys.stderr)
        return 2
    per_source = Counter(f"{j.source} ({j.arch})" for j in jobs)
    print(f"{len(jobs)} variants:")
    for what, n in sorted(per_source.items()):
        print(f"  {n:4d}  {what}")
    if args.dry_run:
        return 0
    from ..compiler import CompileError
    start = time.perf_counter()
    compiled = [0]

    def progress(done, total):
        compiled[0] = done
        if done % 10 == 0 or done == total:
            print(f"  compiled {done}/{total} ({time.perf_counter() - start:.0f} s)", flush=True)

    try:
        n = build(args.out, jobs, workers=args.workers, progress=progress, reuse=not args.fresh)
    except (CompileError, ImportError, OSError) as e:
        print(f"python -m cuconv.prebuilt build: {e}", file=sys.stderr)
        return 1
    size = sum(p.stat().st_size for p in Path(args.out).iterdir())
    print(f"{n} variants in {args.out} ({size / 2**20:.1f} MiB; {compiled[0]} compiled, {n - compiled[0]} kept "
          f"from the store that was there), {time.perf_counter() - start:.0f} s")
    return 0


def _show(args) -> int:
    folder = Path(args.folder) if args.folder else store_dir()
    if folder is None:
        print("no prebuilt store: CUCONV_PREBUILT turns it off")
        return 0
    store = open_store(folder)
    if store is None:
        print(f"no prebuilt store in {folder}")
        return 0
    try:
        from ..compiler import tree_hash
        tree = tree_hash("cu")
    except FileNotFoundError:
        tree = None
    print(store.describe(tree))
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m cuconv.prebuilt", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="compile the catalog's variants into a store")
    b.add_argument("--arch", action="append", choices=sorted(MODEL_DEVICES),
                   help=f"an architecture (repeatable; default: {' '.join(DEFAULT_ARCHS)})")
    b.add_argument("--network", action="append",
                   help="a network of the networks suite (repeatable; default: all of them)")
    b.add_argument("--dtype", action="append", choices=["bfloat16", "float16", "float32"],
                   help=f"repeatable; default: {' '.join(DEFAULT_DTYPES)}")
    b.add_argument("--layout", action="append", choices=["NHWC", "NCHW"],
                   help=f"repeatable; default: {' '.join(DEFAULT_LAYOUTS)}")
    b.add_argument("--epilogue", action="append", choices=list(EPILOGUES),
                   help="a fused epilogue (repeatable; default: all of them)")
    b.add_argument("--jobs-from", action="append", metavar="LOG",
                   help="also the variants a compile log lists (a run with CUCONV_COMPILE_LOG=LOG; repeatable)")
    b.add_argument("--no-catalog", action="store_true", help="only the variants of --jobs-from")
    b.add_argument("--out", default=str(_PACKAGE_STORE),
                   help="the store's folder, replaced whole (default: the package's, %(default)s)")
    b.add_argument("--workers", type=int, help="compile threads (default: one per CPU)")
    b.add_argument("--fresh", action="store_true",
                   help="compile every variant, even those the store in --out already holds")
    b.add_argument("--dry-run", action="store_true", help="list the variants, compile nothing")
    s = sub.add_parser("show", help="what a store holds")
    s.add_argument("folder", nargs="?", help="default: the store in use")
    args = ap.parse_args(argv)
    if args.command == "build":
        if args.workers is not None and args.workers < 1:
            ap.error("--workers: expected a positive number")
        return _build(args)
    return _show(args)


if __name__ == "__main__":
    sys.exit(main())
