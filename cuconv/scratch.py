"""Scratch buffers that kernels reuse from call to call: one per (device, stream, host thread, purpose).

Some paths need temporary device memory on every call (the sm80 ``pad_channels`` path's padded
copies of x and w, the Hopper split tail's partial sums and flags, the channels-last copies of a
channels-first call's operands, :mod:`cuconv.layout`). Allocating it per call costs host time, and
inside a CUDA-graph capture it turns into allocations replayed with the graph, whose replay times
then vary. So each purpose gets one buffer per device, stream and host thread, grown when a call
needs more and never shrunk. The calls one thread queues on one stream run in that order, so they
can share it; different streams get different buffers, and so do different threads (two threads
queueing on one stream, as dask's threaded scheduler does, interleave their calls). At most :data:`MAX_BUFFERS` are kept, the least recently used dropped
first (a program that cycles through many streams re-allocates rather than piling up buffers of
streams it has destroyed); a dropped buffer goes back to CuPy's pool, which hands it out again only
in the order of the stream that used it.

:func:`release_scratch` (also ``cuconv.release_scratch``) drops them (their memory goes back to
CuPy's pool, from which ``cupy.get_default_memory_pool().free_all_blocks()`` can return it).
"""

from __future__ import annotations

import math
from threading import Lock, get_ident
from collections import OrderedDict

__all__ = ["scratch", "release_scratch", "scratch_bytes", "MAX_BUFFERS", "STATE"]

#: Scratch buffers kept at once (every device, stream and purpose together).
MAX_BUFFERS = 32

_BUFFERS: "OrderedDict[tuple, object]" = OrderedDict()
#: Views of each buffer handed out, by (shape, dtype): dropped with their buffer.
_VIEWS: dict = {}
_VIEWS_PER_BUFFER = 64
_LOCK = Lock()


class _State:
    """``generation``: how many times a buffer was allocated, replaced or dropped. A caller that keeps a
    view between its calls (bypassing :func:`scratch`'s lookup) uses it as long as this number is the one
    it saw when it took the view: the view is then still of the current buffer."""

    __slots__ = ("generation",)

    def __init__(self):
        self.generation = 0


#: The buffers' :class:`_State` (read without the lock: a stale read only sends a caller to :func:`scratch`).
STATE = _State()


def scratch(purpose: str, shape, dtype, zeroed: bool = False):
    """A ``shape`` / ``dtype`` view of the current device and stream's scratch buffer for ``purpose``.

    Contents undefined (the caller's kernels write it before reading), unless ``zeroed``: then a
    newly allocated buffer starts as zeros, for state that the kernels using it put back to zero
    themselves (the Hopper split tail's flags). The view of a (buffer, shape, dtype) is made once and
    handed out again while that buffer lasts: a layer called again costs two dictionary lookups."""
    import cupy as cp
    key = (cp.cuda.runtime.getDevice(), cp.cuda.get_current_stream().ptr, get_ident(), purpose)
    with _LOCK:  # the buffers of every thread share one LRU order: a thread may drop another's
        return _scratch(cp, key, shape, dtype, zeroed)


def _scratch(cp, key, shape, dtype, zeroed):
    buf = _BUFFERS.get(key)
    views = _VIEWS.get(key)
    if buf is not None and views is not None:
        view = views.get((tuple(shape), dtype))
        if view is not None:
            _BUFFERS.move_to_end(key)
            return view
    dt = cp.dtype(dtype)
    nbytes = math.prod(shape) * dt.itemsize
    if buf is None or buf.nbytes < nbytes:
        buf = _BUFFERS[key] = (cp.zeros if zeroed else cp.empty)(max(nbytes, 256), dtype=cp.uint8)
        STATE.generation += 1
        _VIEWS.pop(key, None)  # views of the buffer it replaces
    _BUFFERS.move_to_end(key)
    while len(_BUFFERS) > MAX_BUFFERS:
        _VIEWS.pop(_BUFFERS.popitem(last=False)[0], None)
        STATE.generation += 1
    view = buf[:nbytes].view(dt).reshape(shape)
    views = _VIEWS.setdefault(key, {})
    if len(views) >= _VIEWS_PER_BUFFER:
        views.clear()
    views[(tuple(shape), dtype)] = view
    return view


def scratch_bytes() -> int:
    """Device memory held by scratch buffers now (every device and stream)."""
    with _LOCK:
        return sum(b.nbytes for b in _BUFFERS.values())


def release_scratch() -> None:
    """Drop every scratch buffer; the next call that needs one allocates it again."""
    with _LOCK:
        _BUFFERS.clear()
        _VIEWS.clear()
        STATE.generation += 1
