"""Shared segments for contexts (process-wide): where a context's pool goes so workers can see it.

`share_context` moves a context's pool into a POSIX shared-memory segment (`pool.shm`) and keeps a
registry of those segments, so that each is unlinked exactly when nothing needs it any more: the
context is garbage-collected, its pool grows out of it, a worker pool that used it closes, or at exit.

Only the bytes a tensor can read move (`shared_ranges`): the data of every tensor as it points now
(leafs, and nodes where they compute: their own memory in context mode, the compute buffer when the
graph allocator placed them) and the work and compute buffers. The rest of the segment (tensor
headers, which nothing reads, and the own memory of nodes that compute in a compute buffer) is
never written, so it costs no memory.
"""

from __future__ import annotations

import atexit
import os
import threading
import weakref

from ..context import OBJ_WORK_BUFFER
from ..errors import GGToolError
from ..interrupts import signals_held
from . import shm
from .shm import SharedMemoryError

_SEGMENTS: dict[int, tuple] = {}   # id(ctx) -> (weakref to ctx, Segment)
_SEG_LOCK = threading.RLock()


def _ctx_gone(key: int, seg: shm.Segment, ref) -> None:
    seg.unlink()
    ent = _SEGMENTS.get(key)
    if ent is not None and ent[0] is ref:
        _SEGMENTS.pop(key, None)


def share_context(ctx) -> shm.Segment:
    """The shared segment holding `ctx`'s pool, moving the pool there first if needed.

    The segment lives as long as the context keeps that buffer; it is unlinked when the context is
    garbage-collected, when its pool grows out of it, when a pool that used it is closed, and at exit.
    """
    with _SEG_LOCK:
        key = id(ctx)
        ent = _SEGMENTS.get(key)
        if ent is not None:
            ref, seg = ent
            if ref() is ctx and seg.linked and ctx.buffer is seg.array:
                return seg
            _SEGMENTS.pop(key, None)
            if ref() is ctx:
                seg.unlink()   # the pool grew into a private buffer: this copy is stale
        need = ctx.used_mem
        ranges = shared_ranges(ctx)
        moved = sum(b - a for a, b in ranges)
        try:
            st = os.statvfs("/dev/shm")
            free = st.f_bavail * st.f_frsize
        except OSError:  # pragma: no cover
            free = None
        if free is not None and moved > free:
            raise SharedMemoryError(moved, free)
        # The new segment is unlinked unless it ends up in the registry, with the context moved
        # into it: a Ctrl-C or SIGTERM during the copy (seconds for a large context) stops it there,
        # and one during the two steps that must go together is held until they are done.
        seg, registered = None, False
        try:
            with signals_held():
                seg = shm.Segment(max(len(ctx.buffer), need, 1))
            seg.fill(ctx.buffer[:need], ranges)   # what tensors can read and is not zero yet: inputs, earlier results
            with signals_held():
                ctx.adopt(seg.array)
                ref = weakref.ref(ctx, lambda r, k=key, s=seg: _ctx_gone(k, s, r))
                _SEGMENTS[key] = (ref, seg)
                registered = True
        except BaseException:
            if seg is not None and not registered:
                seg.unlink()
            raise
        return seg


def shared_ranges(ctx, gap: int = 1 << 16) -> list[tuple[int, int]]:
    """The byte ranges [start, end) of `ctx`'s pool that go into its shared segment: the data of
    every tensor whose data is in the pool, where it points now (a node bound to a compute buffer
    by the graph allocator points into that buffer, and its own memory is left out), and every work
    and compute buffer. Sorted, page-aligned, merged where less than `gap` bytes apart (a madvise
    and a copy per range), clipped to the used pool. Tensor headers are left out: nothing reads
    them (they are zero in the pool)."""
    page = shm.PAGE
    used = ctx.used_mem
    spans = []
    for t in ctx.tensors:
        off = t.data_offset
        if t.storage is None and off is not None:
            n = t.nbytes
            if n:
                spans.append((off, off + n))
    spans.extend((offs, offs + size) for offs, size, kind in ctx.objects if kind == OBJ_WORK_BUFFER and size)
    spans.sort()
    out: list[list[int]] = []
    for a, b in spans:
        a, b = a // page * page, min(used, -(-b // page) * page)
        if a >= b:
            continue
        if out and a <= out[-1][1] + gap:
            if b > out[-1][1]:
                out[-1][1] = b
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def live_segments() -> set[str]:
    return {seg.name for _, seg in list(_SEGMENTS.values()) if seg.linked}


def segment_size(name: str) -> int:
    for _, seg in list(_SEGMENTS.values()):
        if seg.name == name:
            return seg.size
    raise GGToolError(f"shared segment {name} is gone")  # pragma: no cover


def release_segments(names) -> None:
    with _SEG_LOCK:
        for key, (_ref, seg) in list(_SEGMENTS.items()):
            if seg.name in names:
                seg.unlink()
                _SEGMENTS.pop(key, None)


@atexit.register
def _release_all_segments() -> None:
    release_segments({seg.name for _, seg in list(_SEGMENTS.values())})
