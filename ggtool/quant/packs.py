"""Repacked weights kept on disk between runs, beside the kernel cache: a model file's weights are
repacked (``kernels.dot.pack``) once per file, not once per process.

Why: a short run of a model pays its repack every time (gemma-3-270m: ~0.6-0.9 s, most of it the
tied Q8_0 output projection, of a ~2 s 30-token run), though the packed bytes depend only on the
file's bytes. Each packed tile is one file, mapped copy-on-write (private pages that are never
written: the page cache's, shared by every process and worker that maps it).

Safety: a tile is keyed by the model file's identity (absolute path, size, mtime in ns, inode) and
the tensor's type, shape, offset and tile, and by a digest of the packers' sources, so a changed
file or packer never meets stale bytes; it is written to a temporary file and renamed, so a reader
sees all of it or none; a tile whose size disagrees with its header is ignored (and repacked).
Only files of at least MIN_FILE_BYTES are cached (where the repack costs more than the mapping),
and a file's older identities are removed when a new one is written.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil

import numpy as np

MIN_FILE_BYTES = 64 << 20
_HEADER = 4096
_ALIGN = 64
_PACKERS = ("dot.py", "dot_k.py", "dot_base.py", "simd.py")


def _packers_digest() -> str:
    h = hashlib.sha1()
    here = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "kernels")
    for name in _PACKERS:
        with open(os.path.join(here, name), "rb") as f:
            h.update(f.read())
    return h.hexdigest()[:12]


_folders: dict[str, str | None] = {}     # model path -> its folder of tiles (None: not cached)


def folder(path: str) -> str | None:
    """The folder of `path`'s packed tiles for its current identity, None if it is not cached."""
    if path in _folders:
        return _folders[path]
    from ..kernels import cache
    try:
        st = os.stat(path)
    except OSError:
        st = None
    got = None
    if st is not None and st.st_size >= MIN_FILE_BYTES:
        ident = f"{st.st_size}-{st.st_mtime_ns}-{st.st_ino}-{_packers_digest()}"
        base = os.path.join(cache.cache_dir(), "packs", hashlib.sha1(path.encode()).hexdigest()[:16])
        got = os.path.join(base, hashlib.sha1(ident.encode()).hexdigest()[:16])
    _folders[path] = got
    return got


def _tile_file(where: str, key) -> str:
    return os.path.join(where, hashlib.sha1(repr(key).encode()).hexdigest()[:20] + ".pack")


def load(where: str, key) -> tuple | None:
    """The packed tuple stored for `key`, mapped; None if there is none (or it is not whole)."""
    path = _tile_file(where, key)
    try:
        m = np.memmap(path, dtype=np.uint8, mode="c")
    except (OSError, ValueError):
        return None
    try:
        head = json.loads(bytes(m[:_HEADER]).rstrip(b"\0"))
        if head["key"] != repr(key) or head["size"] != len(m):
            return None
        return tuple(m[o:o + n].view(dt).view(np.ndarray) if dt is not None else n for dt, o, n in head["items"])
    except (ValueError, KeyError, TypeError):
        return None


def store(where: str, key, packed: tuple) -> None:
    """Write `packed` (arrays and ints) for `key`; any failure leaves no file (the cache is optional)."""
    items, off = [], _HEADER
    for x in packed:
        if isinstance(x, np.ndarray):
            items.append((x.dtype.str, off, x.nbytes))
            off += -(-x.nbytes // _ALIGN) * _ALIGN
        else:
            items.append((None, 0, int(x)))
    head = json.dumps({"key": repr(key), "size": off, "items": items}).encode()
    if len(head) > _HEADER:
        return
    path = _tile_file(where, key)
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        if not os.path.isdir(where):
            parent = os.path.dirname(where)
            if os.path.isdir(parent):            # the file's older identities
                shutil.rmtree(parent, ignore_errors=True)
            os.makedirs(where, exist_ok=True)
        with open(tmp, "wb") as f:
            f.write(head.ljust(_HEADER, b"\0"))
            for x, (dt, o, n) in zip(packed, items):
                if dt is not None:
                    f.seek(o)
                    f.write(np.ascontiguousarray(x).view(np.uint8).reshape(-1).data)
            f.truncate(off)
        os.replace(tmp, path)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass
