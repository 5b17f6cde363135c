"""Which sm80 path serves a problem: the loader sub-path of the implicit GEMM, or a direct path.

``pointwise``    1x1 filter, stride 1, no padding: the linear loader over x viewed as ``[M][C]``.
``uniform``      ``C/groups`` a multiple of the K tile (32): one filter tap per K tile.
``grouped_mma``  grouped / depthwise convs with ``C/groups == K/groups`` in {1, 2, 4, 8, 16}, C a multiple
                 of 8: a direct kernel doing every group of a pixel per warp as block-diagonal mma.sync.
``pad_channels`` groups 1, odd C < 8, not pointwise (the stem): a pre-pass pads C to 4 or 8 (and folds
                 W-stride pixels), then the per-lane loader moves 8/16-byte copies (:mod:`.pad`).
``per_lane``     anything else: each lane decomposes its own reduction index.

The automatic choice takes the first that applies, in the order of :data:`SM80_SUBPATHS`;
``cuconv.overrides(sm80_subpath=...)`` (or ``CUCONV_SM80_SUBPATH``) forces one.
"""

from __future__ import annotations

from typing import Optional, Tuple

import numpy as np

from ...models.loader import SUBPATHS, subpath_ok
from ...problem import ConvProblem
from .variants import BLOCK_K, GROUPED_FRAG_BYTES, SMEM_BUDGET

__all__ = ["SM80_SUBPATHS", "GROUPED_CG", "GROUPED_MAX_M", "sm80_subpath_ok", "choose_subpath"]

#: Every sub-path of sm80_igemm, in the order the automatic choice tries them.
SM80_SUBPATHS = ("pointwise", "uniform", "grouped_mma", "pad_channels", "per_lane")
GROUPED_CG = (1, 2, 4, 8, 16)       # C/groups == K/groups values the grouped_mma path serves
GROUPED_MAX_M = 2**31 - 4096        # output pixels: the kernel splits pixel indices with 32-bit divisions


def _grouped_taps_fit(problem: ConvProblem) -> bool:
    """One superblock's fragment slab (taps x 2 KiB) fits the shared-memory budget."""
    return int(np.prod(problem.filter_spatial)) * GROUPED_FRAG_BYTES <= SMEM_BUDGET


_NEEDS = {"pointwise": "a 1x1 filter, stride 1 and no padding",
          "uniform": f"C/groups a multiple of {BLOCK_K}",
          "grouped_mma": (f"groups > 1, C/groups == K/groups in {GROUPED_CG}, C a multiple of 8, a filter of "
                          f"at most {SMEM_BUDGET // GROUPED_FRAG_BYTES} taps and N*P*Q <= {GROUPED_MAX_M}"),
          "pad_channels": "groups 1, an odd C below 8 and a filter that is not pointwise",
          "per_lane": "nothing"}


def sm80_subpath_ok(problem: ConvProblem, subpath: str) -> bool:
    """Whether the sm80 sub-path ``subpath`` (one of :data:`SM80_SUBPATHS`) may serve ``problem``."""
    if subpath == "grouped_mma":
        cg = problem.channels_per_group
        return (problem.groups > 1 and cg == problem.out_channels_per_group and cg in GROUPED_CG
                and problem.channels % 8 == 0 and _grouped_taps_fit(problem) and problem.gemm_m <= GROUPED_MAX_M)
    if subpath == "pad_channels":
        return (problem.groups == 1 and problem.channels % 2 == 1 and problem.channels < 8
                and not problem.is_pointwise)
    if subpath in SUBPATHS:
        return subpath_ok(problem, subpath, BLOCK_K)
    raise ValueError(f"subpath: expected one of {SM80_SUBPATHS}, got {subpath!r}")


def choose_subpath(problem: ConvProblem, forced: Optional[str] = None) -> Tuple[Optional[str], str]:
    """``(sub-path, why)`` for ``problem``, or ``(None, why not)`` when the ``forced`` one cannot serve it."""
    want = forced
    if want is not None:
        if sm80_subpath_ok(problem, want):
            return want, f"{want} (forced)"
        return None, f"forced sub-path {want!r} needs {_NEEDS[want]}, got {problem.describe()}"
    for name in SM80_SUBPATHS:
        if sm80_subpath_ok(problem, name):
            return name, name
    raise AssertionError("per_lane serves every problem")  # pragma: no cover


