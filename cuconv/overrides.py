"""Run-time overrides of the kernels' automatic choices: one frozen :class:`Overrides` value.

Every automatic decision a backend makes (the Hopper kernel's tile width, height, CTA pairs, split
tail, halo tiles and ping-pong warpgroups; the sm80 kernel's loader sub-path) is a pure function of
``(problem, device, overrides)``. The overrides in force come from, in order:

1. the innermost ``with cuconv.overrides(...)`` block of the current thread / async task;
2. the process's environment, read once: ``CUCONV_SM90_BN``, ``CUCONV_SM90_BM``,
   ``CUCONV_SM90_CLUSTER``, ``CUCONV_SM90_SPLIT``, ``CUCONV_SM90_HALO``, ``CUCONV_SM90_PINGPONG``,
   ``CUCONV_SM90_CF_X``, ``CUCONV_SM90_XPOSE_X`` (``auto``, ``0`` or ``1`` for the last five's switches), ``CUCONV_SM90_SPLIT_WAYS``,
   ``CUCONV_SM80_SUBPATH``, ``CUCONV_STACKED_PHASES`` and ``CUCONV_AUTOTUNE`` (switches).

The dispatcher keys its plans on the :class:`Overrides` value, so a forced variant never meets a
plan made under other settings. Overrides are for tests and tuning; the defaults are the tuned rules
(docs/tuning.md).

>>> import cuconv
>>> with cuconv.overrides(block_n=128, halo=False):      # doctest: +SKIP
...     print(cuconv.explain(x, w, padding=1).detail)
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import os
from dataclasses import dataclass
from typing import Optional

from .problem import cached_fields_hash, fields_state

__all__ = ["Overrides", "overrides", "current_overrides", "active_overrides", "reread_environment"]

_SWITCH_WORDS = {"auto": None, "": None, "0": False, "1": True}
#: The fields that are switches (True, False or None).
SWITCHES = ("split", "halo", "pingpong", "x_channels_first", "x_transpose", "stacked_phases", "autotune")


def _choices():
    """The values each field accepts, from the backends that own them (imported on first use only)."""
    from .backends.sm80.subpaths import SM80_SUBPATHS
    from .backends.sm90.tiles import NARROW_BLOCK_N, PINGPONG_BLOCK_MS, SPLIT_WAYS, STAGES
    return {"block_n": (NARROW_BLOCK_N,) + tuple(sorted(STAGES)), "block_m": PINGPONG_BLOCK_MS, "cluster": (1, 2),
            "split_ways": SPLIT_WAYS, "sm80_subpath": SM80_SUBPATHS}


@dataclass(frozen=True)
class Overrides:
    """What the automatic choices are forced to; ``None`` everywhere means fully automatic.

    Attributes
    ----------
    block_n : int or None
        Hopper tile width (64, 96, 128, 160, 192 or 256; 16: the narrow variant, 16-bit output of any K
        stored value by value, which the automatic choice takes for K <= 16 and a filter of several taps).
    block_m : int or None
        Hopper tile height (128, 192, 256; 64 for ping-pong tiles) where that variant exists.
    cluster : int or None
        Hopper CTAs per cluster sharing the filter tile by multicast (1 or 2; None = 1).
    split : bool or None
        Hopper split tail: True splits every tile of the last wave the SMs can take twice, False never.
    split_ways : int or None
        Hopper split reduction of small problems: every tile cut into this many parts (2-16) along the
        reduction, each on its own SM, the last adding the others' fp32 sums in a fixed order; lowered
        to ``SMs // tiles`` parts where fewer fit (none where fewer than two do). None: the automatic
        rule (docs/tuning.md T-split-small).
    halo : bool or None
        Hopper halo tiles: True wherever the problem allows them, False never.
    pingpong : bool or None
        Hopper ping-pong warpgroups on halo tiles without a residual: True wherever possible, False never.
    x_channels_first : bool or None
        Hopper kernel reading an NCHW / NCDHW x as it is (windows of 64-pixel channel rows): None or True
        wherever it applies (:func:`cuconv.backends.sm90.tiles.channels_first_x_decline`), False never (x is
        moved to channels-last first).
    x_transpose : bool or None
        How the Hopper kernel reads an NCHW / NCDHW x where it does (``x_channels_first``): staged rows
        transposed in shared memory into channels-last windows (``_xp`` variants,
        :func:`cuconv.backends.sm90.tiles.transposed_x_decline`). None: where the windows of channel rows
        decline; True: in their place too; False: never.
    sm80_subpath : str or None
        The sm80 kernel's path: "pointwise", "uniform", "grouped_mma", "pad_channels" or "per_lane".
    stacked_phases : bool or None
        Strided input gradients and transposed convolutions as one convolution over the stacked output
        phases (:mod:`cuconv.subpixel`) where it applies: True; the phase split: False. None: stacked on
        a GPU (2-2.1x faster per call on the grad suite's transposed convolutions), the phase split on
        the CPU (where the stacked filter's zero taps cost more than the calls they save).
    autotune : bool or None
        True: :func:`cuconv.conv2d` / :func:`cuconv.conv3d` (and :func:`cuconv.explain`,
        :func:`cuconv.plan_conv2d`) time the candidate kernels and tiles of each new problem on its device
        and run the fastest (:mod:`cuconv.autotune`); None or False: the automatic rules. The other
        fields set here still hold while it measures. :func:`cuconv.autotune` is the usual way in.
    """

    block_n: Optional[int] = None
    block_m: Optional[int] = None
    cluster: Optional[int] = None
    split: Optional[bool] = None
    split_ways: Optional[int] = None
    halo: Optional[bool] = None
    pingpong: Optional[bool] = None
    x_channels_first: Optional[bool] = None
    x_transpose: Optional[bool] = None
    sm80_subpath: Optional[str] = None
    stacked_phases: Optional[bool] = None
    autotune: Optional[bool] = None

    __hash__ = cached_fields_hash  # part of the plan memo's key on every call: hashed once
    __getstate__ = fields_state

    def __post_init__(self):
        choices = _choices()
        for name, allowed in choices.items():
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or v not in allowed):
                raise ValueError(f"{name}: expected one of {list(allowed)} or None, got {v!r}")
        for name in SWITCHES:
            v = getattr(self, name)
            if v not in (None, True, False) or (v is not None and not isinstance(v, bool)):
                raise ValueError(f"{name}: expected True, False or None, got {v!r}")

    def describe(self) -> str:
        """The fields that are set, as ``name=value`` (empty when everything is automatic)."""
        return ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in dataclasses.fields(self)
                         if getattr(self, f.name) is not None)


def _env_int(name: str, field: str, choices) -> Optional[int]:
    raw = os.environ.get(name, "auto").strip()
    if raw in ("", "auto"):
        return None
    if raw.isdigit() and int(raw) in choices[field]:
        return int(raw)
    raise ValueError(f"{name}: expected 'auto' or one of {list(choices[field])}, got {raw!r}")


def _env_switch(name: str) -> Optional[bool]:
    raw = os.environ.get(name, "auto").strip()
    if raw not in _SWITCH_WORDS:
        raise ValueError(f"{name}: expected 'auto', '0' or '1', got {raw!r}")
    return _SWITCH_WORDS[raw]


@functools.lru_cache(maxsize=None)
def env_overrides() -> Overrides:
    """The overrides of the process's ``CUCONV_SM90_*``, ``CUCONV_SM80_SUBPATH``, ``CUCONV_STACKED_PHASES``
    and ``CUCONV_AUTOTUNE`` variables (read once)."""
    choices = _choices()
    cluster = _env_int("CUCONV_SM90_CLUSTER", "cluster", choices)
    subpath = os.environ.get("CUCONV_SM80_SUBPATH", "").strip()
    if subpath in ("", "auto"):
        subpath = None
    elif subpath not in choices["sm80_subpath"]:
        raise ValueError(f"CUCONV_SM80_SUBPATH: expected 'auto' or one of {list(choices['sm80_subpath'])}, "
                         f"got {subpath!r}")
    return Overrides(block_n=_env_int("CUCONV_SM90_BN", "block_n", choices),
                     block_m=_env_int("CUCONV_SM90_BM", "block_m", choices),
                     cluster=None if cluster == 1 else cluster,
                     split=_env_switch("CUCONV_SM90_SPLIT"),
                     split_ways=_env_int("CUCONV_SM90_SPLIT_WAYS", "split_ways", choices),
                     halo=_env_switch("CUCONV_SM90_HALO"),
                     pingpong=_env_switch("CUCONV_SM90_PINGPONG"),
                     x_channels_first=_env_switch("CUCONV_SM90_CF_X"),
                     x_transpose=_env_switch("CUCONV_SM90_XPOSE_X"), sm80_subpath=subpath,
                     stacked_phases=_env_switch("CUCONV_STACKED_PHASES"), autotune=_env_switch("CUCONV_AUTOTUNE"))


_ACTIVE: contextvars.ContextVar = contextvars.ContextVar("cuconv_overrides", default=None)

#: The :class:`Overrides` of the innermost :func:`overrides` block, or None outside every block (the
#: environment's then hold): what a call memo keys (cheap to hash where no block is open). A memo keyed
#: so registers its clearing with :func:`on_environment_read`.
active_overrides = _ACTIVE.get

_ENVIRONMENT_LISTENERS: list = []


def on_environment_read(listener) -> None:
    """Call ``listener()`` whenever :func:`reread_environment` reads the environment's overrides again."""
    _ENVIRONMENT_LISTENERS.append(listener)


def reread_environment() -> None:
    """Read the ``CUCONV_*`` override variables again on the next call that plans (they are read once per
    process otherwise), and drop what the call memos keep of plans made under the old reading."""
    env_overrides.cache_clear()
    for listener in _ENVIRONMENT_LISTENERS:
        listener()


def current_overrides() -> Overrides:
    """The overrides in force: the innermost :func:`overrides` block, else the environment's."""
    active = _ACTIVE.get()
    return active if active is not None else env_overrides()


_KEEP = object()


@contextlib.contextmanager
def overrides(*, block_n=_KEEP, block_m=_KEEP, cluster=_KEEP, split=_KEEP, split_ways=_KEEP, halo=_KEEP,
              pingpong=_KEEP, x_channels_first=_KEEP, x_transpose=_KEEP, sm80_subpath=_KEEP, stacked_phases=_KEEP,
              autotune=_KEEP):
    """Force automatic choices inside a ``with`` block (see :class:`Overrides` for each field).

    A field not passed keeps the value in force around the block; ``None`` (or ``"auto"``) makes it
    automatic again. Yields the :class:`Overrides` in force inside the block. Raises ValueError
    naming the field for a value it does not accept.
    """
    given = dict(block_n=block_n, block_m=block_m, cluster=cluster, split=split, split_ways=split_ways, halo=halo,
                 pingpong=pingpong, x_channels_first=x_channels_first, x_transpose=x_transpose,
                 sm80_subpath=sm80_subpath, stacked_phases=stacked_phases, autotune=autotune)
    changes = {k: (None if v == "auto" else v) for k, v in given.items() if v is not _KEEP}
    value = dataclasses.replace(current_overrides(), **changes)
    token = _ACTIVE.set(value)
    try:
        yield value
    finally:
        _ACTIVE.reset(token)
