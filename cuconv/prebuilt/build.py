"""Building a prebuilt store: which variants (the catalog) and compiling them into a folder.

The catalog is what the automatic choice loads for the conv layers of the networks suite
(:mod:`cuconv.bench.networks`: classifiers, detection, diffusion), common stems and the video-VAE conv3d
layers of the benchmark, on model GPUs of each architecture:
every layer at the batch the suite lists and at batch 1, in each dtype, layout and fused epilogue asked
(by default bf16, fp16 and fp32; NHWC and NCHW; none, bias, bias + ReLU, bias + SiLU, and bias + residual +
ReLU, the forms a network's conv + norm + activation takes once folded). The plans are made with no
overrides in force, so the variants are those a call makes without settings. Helper kernels that take
no defines (the channels-first transpose) come with the plans that use them (:func:`cuconv.precompile.call_jobs`).

A layer of another network mostly meets the same variants: a variant is a tile, a pipeline depth, an
epilogue and a loader, not a shape. One it does not meet is compiled on its first call, as without a store.

A workload of one's own (gradients, conv3d, other shapes) adds what it uses: run it once on a GPU with
``CUCONV_COMPILE_LOG=FILE`` and build with ``--jobs-from FILE`` (:func:`logged_jobs`).

``python -m cuconv.prebuilt build`` writes the store (compiling on a thread pool; NVRTC needs no GPU).
Building a wheel after it ships the store (``pyproject.toml``: the ``cubins`` folder is a wheel artifact).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import lzma
import os
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from ..device import DeviceInfo
from . import FORMAT, INDEX, entry_key, open_store

__all__ = ["MODEL_DEVICES", "EPILOGUES", "Job", "catalog", "logged_jobs", "build"]

#: The GPUs whose choices the catalog follows, per architecture. A choice depends on the SM count
#: (tiles, split reductions) and the shared memory a block may take, so each architecture lists the
#: common parts that differ in them.
MODEL_DEVICES: Dict[str, Tuple[DeviceInfo, ...]] = {
    "sm_90a": (DeviceInfo(kind="cuda", name="H100 SXM / H200", cc=(9, 0), arch="sm_90a", sm_count=132,
                          smem_per_block_optin=232448),
               DeviceInfo(kind="cuda", name="H100 PCIe", cc=(9, 0), arch="sm_90a", sm_count=114,
                          smem_per_block_optin=232448)),
    "sm_80": (DeviceInfo(kind="cuda", name="A100", cc=(8, 0), arch="sm_80", sm_count=108,
                         smem_per_block_optin=166912),),
    "sm_86": (DeviceInfo(kind="cuda", name="A10", cc=(8, 6), arch="sm_86", sm_count=72,
                         smem_per_block_optin=101376),),
    "sm_89": (DeviceInfo(kind="cuda", name="L40S", cc=(8, 9), arch="sm_89", sm_count=142,
                         smem_per_block_optin=101376),
              DeviceInfo(kind="cuda", name="L4", cc=(8, 9), arch="sm_89", sm_count=58,
                         smem_per_block_optin=101376)),
}

#: The fused epilogues of the catalog by name: keyword arguments of :class:`cuconv.Epilogue`.
EPILOGUES: Dict[str, dict] = {
    "none": {},
    "bias": {"has_bias": True},
    "bias_relu": {"has_bias": True, "activation": "relu"},
    "bias_silu": {"has_bias": True, "activation": "silu"},
    "bias_residual_relu": {"has_bias": True, "has_residual": True, "activation": "relu"},
}

#: First layers of image networks beyond the suite's own: the few-channel kernels are specialised to C,
#: the filter and the stride, so a stem the suite does not list would otherwise compile on its first call.
#: (C, filter, stride, padding) of RGB stems (3x3 / 1 and / 2, 7x7 / 2, 4x4 / 4 patches, 6x6 / 2) and
#: grayscale ones, each to :data:`STEM_WIDTHS` filters on a 224 x 224 image (batch 32 and 1).
STEMS = ((3, 3, 1, 1), (3, 3, 2, 1), (3, 7, 2, 3), (3, 4, 4, 0), (3, 6, 2, 2), (1, 3, 1, 1), (1, 7, 2, 3))
STEM_WIDTHS = (32, 64)

#: Patch embeddings of vision transformers (``sm90_patch``): (C, patch, K) of ViT-B/16, ViT-L/16 and
#: ViT-H/14-style widths on a 224 x 224 image (batch 32 and 1).
PATCHES = ((3, 16, 768), (3, 16, 1024), (3, 32, 768), (3, 8, 384))

#: Last layers of image networks beyond the suite's own: 1x1 maps to a few channels (segmentation logits,
#: masks, an RGB map) run on ``pointwise_mma``'s single-channel-store variants, which are specialised to C
#: (rounded up to 16). (C, K) of each, on a 256 x 256 image (batch 32 and 1).
HEADS = tuple((C, K) for C in (16, 32, 48, 64, 96, 128, 192, 256) for K in (1, 3))

DEFAULT_ARCHS = ("sm_90a", "sm_80")
DEFAULT_DTYPES = ("bfloat16", "float16", "float32")
DEFAULT_LAYOUTS = ("NHWC", "NCHW")


@dataclass(frozen=True)
class Job:
    """One variant to compile: ``kernels_cu/<source>`` for ``arch`` with ``defines`` (sorted items) and
    ``extra`` NVRTC options."""

    source: str
    arch: str
    defines: Tuple[Tuple[str, object], ...]
    extra: Tuple[str, ...] = ()


def logged_jobs(path: os.PathLike) -> List[Job]:
    """The distinct variants a compile log lists (``$CUCONV_COMPILE_LOG``: a JSON line per variant a process
    used, :func:`cuconv.compiler._record_use`), in the order they first appear. A line that is not such a
    record raises ``ValueError`` naming the file and line."""
    jobs: Dict[Job, None] = {}
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                job = Job(str(rec["source"]), str(rec["arch"]), tuple(sorted(rec["defines"].items())),
                          tuple(rec.get("extra", ())))
            except (ValueError, KeyError, TypeError, AttributeError) as e:
                raise ValueError(f"{path}:{n}: not a compile log record ({e}): {line.strip()[:120]}") from None
            jobs.setdefault(job, None)
    return list(jobs)


def catalog(archs: Sequence[str] = DEFAULT_ARCHS, networks: Optional[Sequence[str]] = None,
            dtypes: Sequence[str] = DEFAULT_DTYPES, layouts: Sequence[str] = DEFAULT_LAYOUTS,
            epilogues: Sequence[str] = tuple(EPILOGUES), stems: bool = True, conv3d: bool = True) -> List[Job]:
    """The distinct variants the automatic choice loads for every conv layer of ``networks`` (default:
    all of the networks suite), with ``stems`` the first layers of :func:`stem_layers` and
    :func:`patch_layers` and the last ones of :func:`head_layers`, with ``conv3d`` those of the video-VAE
    layers of the conv3d suite (:data:`cuconv.bench.conv3d.SUITE_3D`, in the 3-D form of each layout), at
    its listed batch and at batch 1, for each dtype, layout and epilogue, on the model GPUs of each
    architecture (:data:`MODEL_DEVICES`)."""
    from ..bench.networks import NETWORKS
    from ..dispatch import select
    from ..overrides import Overrides
    from ..precompile import call_jobs
    from ..problem import ConvProblem, Epilogue

    for arch in archs:
        if arch not in MODEL_DEVICES:
            raise ValueError(f"archs: expected some of {sorted(MODEL_DEVICES)}, got {arch!r}")
    for name in networks or ():
        if name not in NETWORKS:
            raise ValueError(f"networks: expected some of {sorted(NETWORKS)}, got {name!r}")
    for name in epilogues:
        if name not in EPILOGUES:
            raise ValueError(f"epilogues: expected some of {sorted(EPILOGUES)}, got {name!r}")
    layers = [L for name in (networks or NETWORKS) for L in NETWORKS[name].layers]
    if stems:
        layers += stem_layers() + patch_layers() + head_layers()
    # (nd, batch, input, channels, filters, filter, stride, dilation, padding, groups) of every problem
    shapes = [(2, batch, (L.H, L.W), L.C, L.K, (L.R, L.S), L.stride, L.dilation, L.pad, L.groups)
              for L in layers for batch in sorted({L.N, 1})]
    if conv3d:
        from ..bench.conv3d import PADDING, SUITE_3D
        shapes += [(3, batch, (s.D, s.H, s.W), s.C, s.K, (3, 3, 3), 1, 1, PADDING, 1)
                   for s in SUITE_3D for batch in sorted({s.N, 1})]
    jobs: Dict[Job, None] = {}
    none = Overrides()
    for arch in archs:
        for dev, shape, dtype, layout, ep in itertools.product(MODEL_DEVICES[arch], shapes, dtypes, layouts,
                                                               epilogues):
            nd, batch, spatial, C, K, filt, stride, dilation, padding, groups = shape
            problem = ConvProblem.create(
                nd=nd, batch=batch, in_spatial=spatial, channels=C, out_channels=K, filter_spatial=filt,
                stride=stride, dilation=dilation, padding=padding, groups=groups, dtype=dtype,
                layout=layout if nd == 2 else _LAYOUTS_3D[layout], epilogue=Epilogue(**EPILOGUES[ep]))
            plan = select(problem, dev, overrides=none)[0]
            for source, defines in call_jobs(plan):
                jobs.setdefault(Job(source, arch, tuple(sorted(defines.items()))), None)
    return list(jobs)


#: The 3-D layout of each 2-D layout name (a conv3d layer of the catalog takes the 3-D form).
_LAYOUTS_3D = {"NHWC": "NDHWC", "NCHW": "NCDHW"}


def patch_layers() -> list:
    """The patch embeddings of :data:`PATCHES`, as networks-suite layers."""
    from ..bench.networks import Layer
    return [Layer(name=f"patch c{C} {f}x{f}/{f} -> {K}", N=32, H=224, W=224, C=C, K=K, R=f, S=f, stride=f, pad=0)
            for C, f, K in PATCHES]


def head_layers() -> list:
    """The 1x1 last layers of :data:`HEADS`, as networks-suite layers."""
    from ..bench.networks import Layer
    return [Layer(name=f"head c{C} 1x1 -> {K}", N=32, H=256, W=256, C=C, K=K, R=1, S=1, stride=1, pad=0)
            for C, K in HEADS]


def stem_layers() -> list:
    """The first layers of :data:`STEMS`, as networks-suite layers."""
    from ..bench.networks import Layer
    return [Layer(name=f"stem c{C} {f}x{f}/{stride} -> {K}", N=32, H=224, W=224, C=C, K=K, R=f, S=f, stride=stride,
                  pad=pad)
            for C, f, stride, pad in STEMS for K in STEM_WIDTHS]


def _compile(item: Tuple[Job, List[str], str]) -> Tuple[Job, str, bytes, str]:
    """(job, key, cubin, ptxas log) of one ``(job, options, key)``: NVRTC."""
    from .. import compiler
    job, opts, key = item
    cubin, log = compiler._nvrtc_compile(job.source, job.arch, opts)
    return job, key, cubin, log


def build(folder: os.PathLike, jobs: Iterable[Job], workers: Optional[int] = None, progress=None,
          reuse: bool = True) -> int:
    """Compile ``jobs`` on ``workers`` threads (default: one per CPU) into a store in ``folder``, which is
    replaced whole; return how many variants it holds. With ``reuse``, a variant the store already in
    ``folder`` holds (same kernel tree and NVRTC version, its entry sound) is copied, not compiled again.
    ``progress(done, total)`` is called after each compile.

    The options are those a call compiles with, without line tables whatever ``CUCONV_LINEINFO`` says: a
    store serves calls made without them."""
    from .. import compiler
    jobs = list(dict.fromkeys(jobs))
    if workers is not None and (not isinstance(workers, int) or isinstance(workers, bool) or workers < 1):
        raise ValueError(f"workers: expected a positive int or None, got {workers!r}")
    tree = compiler.tree_hash("cu")
    version = tuple(compiler.nvrtc_check(compiler._nvrtc().nvrtcVersion(), "version"))
    keyed = []
    for job in jobs:
        opts = compiler._options(job.arch, dict(job.defines), job.extra, lines=False)
        keyed.append((job, opts, entry_key(tree, job.source, job.arch, opts)))
    folder = Path(folder)
    old = open_store(folder) if reuse else None
    if old is not None and (old.tree_hash != tree or old.nvrtc != version):
        old = None
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    try:
        entries, todo = {}, []
        for job, opts, key in keyed:
            if key in entries:
                continue
            if old is not None and old.read(key) is not None:
                record = old.entries[key]
                shutil.copyfile(old.folder / record["file"], staging / record["file"])
                entries[key] = record
            else:
                todo.append((job, opts, key))
        n = max(1, min(len(todo), workers or os.cpu_count() or 1))
        with ThreadPoolExecutor(max_workers=n) as pool:
            for done, (job, key, cubin, log) in enumerate(pool.map(_compile, todo), 1):
                (staging / f"{key}.cubin.xz").write_bytes(lzma.compress(cubin, preset=9))
                entries[key] = {"source": job.source, "arch": job.arch, "defines": dict(job.defines),
                                "extra": list(job.extra), "file": f"{key}.cubin.xz",
                                "sha256": hashlib.sha256(cubin).hexdigest(), "log": log}
                if progress is not None:
                    progress(done, len(todo))
        index = {"format": FORMAT, "tree_hash": tree, "nvrtc": list(version), "entries": entries}
        (staging / INDEX).write_text(json.dumps(index, indent=1, sort_keys=True))
        if folder.exists():
            shutil.rmtree(folder)
        staging.rename(folder)
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    return len(entries)
