"""Repacked weights kept on disk between runs, in the cache's ``packs/`` (``kernels.cache``): a model
file's weights are repacked (``quant.matmul.pack_rows``) once per file, not once per process.

Why: a short run of a model pays its repack every time (gemma-3-270m: ~0.6-0.9 s, most of it the
tied Q8_0 output projection, of a ~2 s 30-token run), though the packed bytes depend only on the
file's bytes. Each packed tile is one file, mapped copy-on-write (private pages that are never
written: the page cache's, shared by every process and worker that maps it).

What a tile can be trusted for, and how:
- Its source. A file's tiles live in ``packs/<path>/<identity>/``: the identity is the file's
  device, inode, size, mtime and ctime (in ns) with a digest of the packers' sources. Rewriting a
  file in place and restoring its mtime (``touch -r``) still moves its ctime, which no user can
  set: a changed file never meets stale tiles. (A digest of the weights' bytes would read every
  weight of the file on every run, the pages a cached run otherwise never touches; the ctime costs
  nothing.) A file's older identities are removed when a new one is made.
- Its bytes. A tile is [magic, CRC-32, header (JSON: key, size, items), arrays]. Each time a process
  maps a tile, every item of the header is checked against the file's size (offsets aligned, in
  order, inside it; plain numeric dtypes; whole items). The CRC, over everything after itself, is
  checked when a process maps a tile as the file system describes it for the first time (its
  inode, size, mtime and ctime in ns, with the CRC it stores): a match is logged in the folder's
  ``.checked``, and a later map of the same description skips the CRC. Any write to a tile moves
  its ctime (no user can set it; ``touch -r`` restores only the mtime), and a check is logged only
  once the tile's ctime is SETTLED_S old, so whatever writes a tile after its check gives it a new
  description: a flipped byte is caught at the next map. Why not the CRC at every map: it cost a
  cached 8-token run 0.12 s of CPU for gemma-3-270m (313 MB of tiles) and 0.25 s for Qwen2.5-0.5B
  (587 MB), 6-10% of the run (bench/bench_packs.py, a shared 2-core machine); logged, the run costs
  what it costs without any CRC (0.99x, 1.01x). Left uncaught: damage below the file system (a
  disk's bit rot, which moves no ctime), which the model file itself, read unchecked, is as open to.
  CRC-32 (zlib, ~4 GB/s on an idle core) catches every change of up to 32 consecutive bits, so any
  flipped byte, and anything else but one time in 2**32; a cryptographic hash would add nothing
  (whoever can write the tile can write its digest) at a quarter of the speed, and a sampled one
  would miss most single flips.
- Anything that disagrees (a flipped byte, a header rewritten to match a truncated file, a tile
  that is not a plain file of the user's) is removed, repacked, stored anew and reported once per
  file and run (by the first of a pool's processes to find it: ``.refused-<caller>``), as a
  ``CacheWarning``: one `Warning:` line in the command line.
- Its writing. A tile is written to a temporary file made exclusively (``mkstemp``: O_CREAT|O_EXCL,
  never through a link) in its own folder, then renamed over its name: a reader sees all of it or
  none, and a link planted at either name is never followed. Folders are ``cache.subfolder``'s
  (real folders, the user's own, mode 0700).

Size: only files of at least MIN_FILE_BYTES are cached (where the repack costs more than the
mapping), and the tiles of every file together stay within `max_bytes()` (``GGTOOL_CACHE_MAX``,
default DEFAULT_MAX; 0: none kept), least recently used file first out; a file that alone would not
fit is not cached. A file's identity folder reserves the file's size when it is made, under a lock
(``packs/.lock``), so processes filling and evicting at once stay within the bound.

Open files: before Python 3.13 each mapped tile holds one (a 7B model maps ~1200 tiles a process,
past the soft limit of 1024 many systems set). The maps that hold one are counted; where the next
would leave fewer than FILES_SPARED to the rest of the process, the soft limit is raised to the hard
one (once), and past that a tile is not mapped: the caller repacks it in memory (the same bits), the
tile stays as it is, and the run says so once.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import json
import mmap
import os
import stat
import sys
import time
import weakref
import zlib

import numpy as np

from .. import environment, json_input
from ..errors import CacheWarning, InputError
from ..kernels.cache import remove as _remove

MIN_FILE_BYTES = 64 << 20
# The default bound of GGTOOL_CACHE_MAX: a file's tiles take 1.2-1.25x the file (gemma-3-270m: 313 MB for
# 253 MB, Qwen2.5-0.5B: 587 MB for 491 MB), so 4 GiB keep a 3B model's, or the few small models a user
# works with at once, and stay a small part of a disk.
DEFAULT_MAX = 4 << 30
RESERVE = 1.3             # a new file's folder reserves this times its size (its tiles take 1.2-1.25x)
STALE_TMP_S = 3600        # a temporary file this old is a writer's that died: removed by the next eviction
_MAGIC = b"GGTPACK2"
_PREFIX = 16              # magic, then the CRC-32 (little-endian uint64) of everything after these 16 bytes
_HEADER = 4096
_ALIGN = 64
# the sources of the packed forms: kernels' packers and the decoders they read, and every qtypes
# module (a record's K form, levels or packed form, and the grids they decode with)
_PACKERS = ("dot.py", "dot_k.py", "dot_base.py", "simd.py", "decode.py")
_USED = ".used"           # an identity folder's stamp: its mtime is its last use, its text the bytes it reserves
_REFUSED = ".refused-"     # a run (its caller's pid) has reported damage here: its pool's other processes say nothing
_CHECKED = ".checked"     # an identity folder's log of the tiles whose CRC matched, as the file system saw them
SETTLED_S = 2.0           # a check is logged only for a tile whose ctime is this old (a later write moves it past)


def max_bytes() -> int:
    """GGTOOL_CACHE_MAX in bytes (``ggtool.environment``: a number of bytes, or with K, M, G or T,
    "2G", "1.5G", "500MiB"); unset or empty: DEFAULT_MAX; 0: no repacked weights are kept."""
    value = environment.cache_max()
    return DEFAULT_MAX if value is None else value


def packer_sources() -> list[str]:
    """The files whose text the tiles' identity digests (``_PACKERS``, the qtypes modules)."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    qtypes = os.path.join(package, "qtypes")
    paths = [os.path.join(package, "kernels", name) for name in _PACKERS]
    return paths + sorted(os.path.join(qtypes, n) for n in os.listdir(qtypes) if n.endswith(".py"))


@functools.lru_cache(maxsize=1)
def _packers_digest() -> str:
    h = hashlib.sha1()
    for path in packer_sources():
        with open(path, "rb") as f:
            h.update(os.path.basename(path).encode() + b"\0" + f.read())
    return h.hexdigest()[:12]


def identity(st: os.stat_result) -> str:
    """What a file's tiles are made from, as far as its metadata tells: see the module docstring."""
    return f"{st.st_dev}-{st.st_ino}-{st.st_size}-{st.st_mtime_ns}-{st.st_ctime_ns}-{_packers_digest()}"


_folders: dict[str, str | None] = {}     # model path -> its folder of tiles (None: not cached)
_sources: dict[str, str] = {}            # folder of tiles -> the model file's path (for messages)
_reported: set[str] = set()              # folders whose damage was reported in this process


def folder(path: str) -> str | None:
    """The folder of `path`'s packed tiles for its current identity (made, marked used, room made
    for it), None if it is not cached; decided once a process."""
    if path in _folders:
        return _folders[path]
    got = None
    limit = max_bytes()
    try:
        st = os.stat(path)
    except OSError:
        st = None
    if st is not None and MIN_FILE_BYTES <= st.st_size and st.st_size * RESERVE <= limit:
        got = _make_folder(os.path.realpath(path), st, limit)
        if got is not None:
            _sources[got] = path
    _folders[path] = got
    return got


def packs_root() -> str | None:
    """The cache's packs/ folder (made and checked), None where the cache is bypassed."""
    from ..kernels import cache

    top = cache.root()
    if top is None:
        return None
    _forget_old_layout(top)
    return cache.subfolder(top, "packs")


def _forget_old_layout(top: str) -> None:
    """Remove the tiles earlier versions kept inside the kernel cache (numba/tiles-*/packs/)."""
    try:
        old = [os.path.join(top, "numba", d, "packs") for d in os.listdir(os.path.join(top, "numba")) if d.startswith("tiles-")]
    except OSError:
        return
    for path in old:
        if os.path.isdir(path):
            _remove(path)


def _make_folder(real: str, st: os.stat_result, limit: int) -> str | None:
    from ..kernels import cache

    base = packs_root()
    if base is None:
        return None
    name = hashlib.sha1(real.encode()).hexdigest()[:16]
    ident = hashlib.sha1(identity(st).encode()).hexdigest()[:16]
    try:
        with _Lock(base):
            parent = cache.subfolder(base, name)
            if parent is None:
                return None
            where = os.path.join(parent, ident)
            if not os.path.isdir(where) or os.path.islink(where):
                for old in os.listdir(parent):           # the file's older identities
                    if old != ident:
                        _remove(os.path.join(parent, old))
                reserve = int(st.st_size * RESERVE)
                if not _evict(base, keep=where, need=reserve, limit=limit):
                    return None
                if cache.subfolder(parent, ident) is None:
                    return None
                _write_stamp(where, reserve)
            elif cache.subfolder(parent, ident) is None:
                return None
            elif _reserved(where):
                os.utime(os.path.join(where, _USED))      # used now: the last to go
            else:
                _write_stamp(where, int(st.st_size * RESERVE))
            _room[where] = [_reserved(where), _folder_bytes(where)]
            return where
    except OSError:     # an unwritable cache: the tiles are repacked in memory, as without one
        return None


_room: dict[str, list[int]] = {}   # folder of tiles -> [bytes it has reserved, bytes it holds as this process counts]


def _reserved(where: str) -> int:
    """The bytes identity folder `where` has reserved (its stamp's text; 0 if none can be read)."""
    try:
        with open(os.path.join(where, _USED), "rb") as s:
            return int(s.read(32) or 0)
    except (OSError, ValueError):
        return 0


def _folder_bytes(where: str) -> int:
    total = 0
    for f in os.listdir(where):
        try:
            total += os.lstat(os.path.join(where, f)).st_size
        except OSError:
            pass
    return total


def _make_room(where: str, need: int) -> bool:
    """Whether `need` more bytes may be written into folder `where`: within what it reserved, or
    after reserving more (under the lock, evicting the least recently used others)."""
    room = _room.get(where)
    if room is None:
        return False
    if room[1] + need > room[0]:
        base = os.path.dirname(os.path.dirname(where))
        try:
            with _Lock(base):
                if not os.path.isdir(where):          # evicted meanwhile by another process
                    return False
                used = _folder_bytes(where)
                limit = max_bytes()
                want = max(used + need, room[0] + room[0] // 8)   # an eighth more: not a lock per tile
                if not _evict(base, keep=where, need=want, limit=limit):
                    want = used + need
                    if not _evict(base, keep=where, need=want, limit=limit):
                        return False
                _write_stamp(where, want)
                room[:] = [want, used]
        except OSError:
            return False
    room[1] += need
    return True


class _Lock:
    """packs/.lock, exclusively (flock), never through a link: one process at a time makes room."""

    def __init__(self, base: str):
        self.path = os.path.join(base, ".lock")

    def __enter__(self):
        import fcntl

        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        os.close(self.fd)


def _write_stamp(where: str, reserve: int) -> None:
    _write_exclusive(where, _USED, [str(reserve).encode()])


def usage(base: str) -> list[tuple[float, int, str]]:
    """(last use, bytes, folder) of every identity folder under packs/ `base`: its bytes the larger
    of its files' and what it reserved; removing temporary files of writers long gone."""
    out = []
    now = time.time()
    for name in sorted(os.listdir(base)):
        parent = os.path.join(base, name)
        if name.startswith(".") or os.path.islink(parent) or not os.path.isdir(parent):
            continue
        for ident in os.listdir(parent):
            where = os.path.join(parent, ident)
            if os.path.islink(where) or not os.path.isdir(where):
                _remove(where)
                continue
            size, reserved, used = 0, 0, 0.0
            for f in os.listdir(where):
                try:
                    fst = os.lstat(os.path.join(where, f))
                except OSError:
                    continue
                if (f.endswith(".tmp") or f.startswith(_REFUSED)) and now - fst.st_mtime > STALE_TMP_S:
                    _remove(os.path.join(where, f))
                    continue
                size += fst.st_size
                if f == _USED:
                    used, reserved = fst.st_mtime, _reserved(where)
            out.append((used, max(size, reserved), where))
    return out


def _evict(base: str, keep: str, need: int, limit: int) -> bool:
    """Remove the least recently used identity folders (never `keep`) until `need` more bytes fit
    within `limit`; whether they do."""
    folders = sorted(usage(base))
    total = sum(size for _, size, where in folders if where != keep)
    for _, size, where in folders:
        if total + need <= limit:
            break
        if where != keep:
            _remove(where)
            total -= size
            parent = os.path.dirname(where)
            if parent != os.path.dirname(keep) and not os.listdir(parent):
                _remove(parent)
    return total + need <= limit


def _tile_file(where: str, key) -> str:
    return os.path.join(where, hashlib.sha1(repr(key).encode()).hexdigest()[:20] + ".pack")


def load(where: str, key) -> tuple | None:
    """The packed tuple stored for `key`, mapped and checked; None if there is none, or if it is
    damaged (then it is removed and reported: the caller repacks and stores it anew), or if this
    process can open no more files (`_out_of_files`: the tile is kept, the caller repacks it)."""
    path = _tile_file(where, key)
    if not _room_for_a_map():
        return _out_of_files(where, f"{_held[0]} tiles are mapped, each holding an open file, and {FILES_SPARED} of "
                                    f"this process's limit of {_soft_limit()} open files are left to the rest")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as e:   # a link at its name (ELOOP), unreadable
        if e.errno in _NO_MORE_FILES:
            return _again_with_more_files(where, key, e)
        return _damaged(where, path, f"cannot be opened: {e.strerror or e}")
    with os.fdopen(fd, "rb"):      # closes fd (the map keeps its own where _MAP_KEEPS_NO_FD is empty)
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or (hasattr(os, "geteuid") and st.st_uid != os.geteuid()):
            return _damaged(where, path, "is not a plain file of the user's")
        if st.st_size < _HEADER:
            return _damaged(where, path, f"is {st.st_size} bytes, shorter than its header")
        try:        # copy-on-write, as np.memmap's mode "c" (without its subclass: ~24 us less a tile)
            mapped = mmap.mmap(fd, 0, access=mmap.ACCESS_COPY, **_MAP_KEEPS_NO_FD)
        except OSError as e:
            if e.errno in _NO_MORE_FILES:
                return _again_with_more_files(where, key, e)
            return _damaged(where, path, f"cannot be mapped: {e.strerror or e}")
        except ValueError:      # emptied since its size was read
            return _damaged(where, path, "cannot be mapped: it is empty")
        if not _MAP_KEEPS_NO_FD:
            _held[0] += 1
            weakref.finalize(mapped, _release).atexit = False      # nothing to count at exit
        m = np.frombuffer(mapped, np.uint8)
    seen = _signature(path, st, m)
    known = _checked_before(where, seen)
    problem, items = _check(m, key, crc=not known)
    if problem:
        return _damaged(where, path, problem)
    if not known and time.time() - st.st_ctime > SETTLED_S:
        _remember(where, seen)
    return tuple(m[o:o + n].view(dt).view(np.ndarray) if dt is not None else n for dt, o, n in items)


# Each map of a tile holds a file descriptor where Python's mmap keeps one (before 3.13, or without
# trackfd=False): gemma-3-270m maps 418 tiles in each process, a 7B model ~1200, past the soft limit
# of open files many systems set (1024). Out of descriptors, a cached run failed with "Too many
# open files", after removing as damaged the tiles it could not open. Now the maps that hold one
# are counted (`_held`) and stop FILES_SPARED short of the limit (raised once to the hard limit
# first): the other tiles are repacked in memory, which the run says once.
_MAP_KEEPS_NO_FD = {"trackfd": False} if sys.version_info >= (3, 13) and os.name == "posix" else {}
_NO_MORE_FILES = (errno.EMFILE, errno.ENFILE)
FILES_SPARED = 256           # open files left to the rest of the process (the model, the pool, the output)
_held = [0]                  # maps of this process that hold an open file
_files_raised = [False]
_files_told = [False]


def _again_with_more_files(where: str, key, e: OSError) -> tuple | None:
    """`load` out of open files (EMFILE, ENFILE: not the tile's fault, it is kept): once more with the
    limit raised, where it rises, else None (the caller repacks in memory; said once)."""
    return load(where, key) if _more_files() else _out_of_files(where, e.strerror or str(e), stacklevel=4)


def _release() -> None:
    _held[0] -= 1


def _soft_limit() -> int:
    """This process's limit of open files (2**62 where it has none, or where it cannot be read)."""
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, ValueError, OSError):
        return 1 << 62
    return 1 << 62 if soft == resource.RLIM_INFINITY else soft


def _room_for_a_map() -> bool:
    """Whether one more map leaves FILES_SPARED open files to the rest of the process (raising the
    limit, once, where it would not)."""
    if _MAP_KEEPS_NO_FD or _held[0] + FILES_SPARED < _soft_limit():
        return True
    return _more_files() and _held[0] + FILES_SPARED < _soft_limit()


def _more_files() -> bool:
    """Raise this process's soft limit of open files to its hard limit (at most 2**20), once; whether
    it rose. The pool's workers, started after, inherit it."""
    if _files_raised[0]:
        return False
    _files_raised[0] = True
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        want = 1 << 20 if hard == resource.RLIM_INFINITY else min(hard, 1 << 20)
        if soft != resource.RLIM_INFINITY and want > soft:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            return True
    except (ImportError, ValueError, OSError):
        pass
    return False


def _out_of_files(where: str, why: str, stacklevel: int = 3) -> None:
    """No tile is mapped past the limit of open files: the caller repacks in memory (slower, the same
    bits), and the run says so once (its first process to find it)."""
    if not _files_told[0]:
        _files_told[0] = True
        if not _first_in_run(where, "-files"):
            return None
        import warnings

        warnings.warn(CacheWarning(f"some repacked weights are repacked in memory, not mapped from the cache: {why} "
                                   "(raise the limit of open files: ulimit -n)"), stacklevel=stacklevel)
    return None


def _signature(path: str, st: os.stat_result, m: np.ndarray) -> str:
    """A tile as the file system describes it (any write moves its ctime), with its stored CRC."""
    crc = bytes(m[len(_MAGIC):_PREFIX]).hex()
    return f"{os.path.basename(path)} {st.st_ino} {st.st_size} {st.st_mtime_ns} {st.st_ctime_ns} {crc}"


_logs: dict[str, tuple[int, set[str]]] = {}    # folder -> (its log's size when read, the signatures in it)


def _checked_before(where: str, signature: str) -> bool:
    """Whether a tile with this signature had its CRC checked (the folder's log of checks, _CHECKED)."""
    size, seen = _logs.get(where, (-1, set()))
    if signature in seen:
        return True
    try:
        fd = os.open(os.path.join(where, _CHECKED), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    with os.fdopen(fd, "rb") as f:
        now = os.fstat(f.fileno()).st_size
        if now != size:           # another process has added to it: read it again
            seen = set(f.read(1 << 24).decode("ascii", "replace").splitlines())
            _logs[where] = (now, seen)
    return signature in seen


def _remember(where: str, signature: str) -> None:
    """Add a tile whose CRC matched to its folder's log (appended: processes may add at once)."""
    try:
        fd = os.open(os.path.join(where, _CHECKED), os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600)
    except OSError:
        return
    try:
        os.write(fd, (signature + "\n").encode())
    except OSError:
        pass
    finally:
        os.close(fd)


def _check(m: np.ndarray, key, crc: bool = True) -> tuple[str | None, list]:
    """(None, items) if mapped tile `m` is whole and is `key`'s, else (what is wrong, []); its CRC
    is computed if `crc`."""
    if bytes(m[:len(_MAGIC)]) != _MAGIC:
        return "has no tile header", []
    try:
        head = json_input.loads(bytes(m[_PREFIX:_HEADER]).rstrip(b"\0").decode())
        size, items = head["size"], head["items"]
        if head["key"] != repr(key):
            return "belongs to another tensor", []
    except (ValueError, KeyError, TypeError, UnicodeDecodeError, InputError):
        return "has a header that cannot be read", []
    if size != len(m):
        return f"is {len(m)} bytes where its header says {size}", []
    if not isinstance(items, list):
        return "has a header that cannot be read", []
    end, checked = _HEADER, []
    for item in items:
        problem = _check_item(item, end, len(m))
        if problem:
            return problem, []
        dt, o, n = item
        if dt is not None:
            end = o + n
        checked.append((np.dtype(dt) if dt is not None else None, o, n))
    stored = int.from_bytes(bytes(m[len(_MAGIC):_PREFIX]), "little")
    if crc and zlib.crc32(m[_PREFIX:]) != stored:
        return "does not match its checksum", []
    return None, checked


def _check_item(item, end: int, size: int) -> str | None:
    """What is wrong with a header item (dtype, offset, bytes) that must start at or after `end`
    in a file of `size` bytes, or None."""
    if not (isinstance(item, list) and len(item) == 3 and all(type(x) is int for x in item[1:])):
        return "has a header item that cannot be read"
    dt, o, n = item
    if dt is None:
        return None
    try:
        dtype = np.dtype(dt)
    except TypeError:
        return f"has an unknown dtype {dt!r}"
    if dtype.kind not in "biuf" or dtype.hasobject or dtype.shape:
        return f"has an unknown dtype {dt!r}"
    if o < end or o % _ALIGN or n < 0 or n % dtype.itemsize or o + n > size:
        return f"has an array at bytes {o}..{o + n} outside its data ({size} bytes)"
    return None


def _damaged(where: str, path: str, problem: str) -> None:
    """Remove tile `path`, and say once for its folder in this run that it was damaged: once in this
    process, and once among a pool's processes (the first to create ``.refused-<caller's pid>``)."""
    _remove(path)
    if where not in _reported:
        _reported.add(where)
        if not _first_in_run(where):
            return None               # another process of this run has said it
        import warnings

        source = _sources.get(where, where)
        warnings.warn(CacheWarning(f"repacked weights of {source} in the cache were refused and are rebuilt: "
                                   f"{path} {problem}"), stacklevel=3)
    return None


def _first_in_run(where: str, what: str = "") -> bool:
    """Whether this process is the first of its run (a caller and its pool's workers) to say `what`
    of folder `where`: the first to create ``.refused-<caller's pid>-<its start><what>`` there (or
    one that cannot tell)."""
    from .. import role

    caller = os.getppid() if role.POOL_WORKER else os.getpid()
    try:
        os.close(os.open(os.path.join(where, f"{_REFUSED}{caller}-{_started(caller)}{what}"),
                         os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
    except FileExistsError:
        return False
    except OSError:
        pass
    return True


def _started(pid: int) -> str:
    """When process `pid` started (clock ticks since boot, /proc), so that a reused pid is another run."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[19].decode()
    except (OSError, IndexError):
        return "0"


def store(where: str, key, packed: tuple) -> None:
    """Write `packed` (arrays and ints) for `key`; any failure leaves no file (the cache is optional).
    A tile already there is left as it is: `load` removes a damaged one before its caller repacks, so
    one still there was not mapped for want of open files (rewriting it each run would move its
    ctime, and its CRC would be computed again at the next map)."""
    try:
        if stat.S_ISREG(os.lstat(_tile_file(where, key)).st_mode):     # a link planted there is renamed over
            return
    except OSError:
        pass
    items, off = [], _HEADER
    for x in packed:
        if isinstance(x, np.ndarray):
            items.append((x.dtype.str, off, x.nbytes))
            off += -(-x.nbytes // _ALIGN) * _ALIGN
        else:
            items.append((None, 0, int(x)))
    head = json.dumps({"key": repr(key), "size": off, "items": items}).encode()
    if len(head) > _HEADER - _PREFIX:
        return
    if not _make_room(where, off):
        return
    chunks = [head.ljust(_HEADER - _PREFIX, b"\0")]
    at = _HEADER
    for x, (dt, o, n) in zip(packed, items):
        if dt is not None:
            chunks.append(b"\0" * (o - at))
            chunks.append(np.ascontiguousarray(x).view(np.uint8).reshape(-1).data)
            at = o + n
    chunks.append(b"\0" * (off - at))
    crc = 0
    for c in chunks:
        crc = zlib.crc32(c, crc)
    _write_exclusive(where, os.path.basename(_tile_file(where, key)), [_MAGIC + crc.to_bytes(8, "little"), *chunks])


def _write_exclusive(where: str, name: str, chunks) -> None:
    """Write `chunks` to a temporary file made exclusively in `where`, then rename it to `name`;
    any failure leaves no file."""
    import tempfile

    try:
        fd, tmp = tempfile.mkstemp(dir=where, prefix=".", suffix=".tmp")
    except OSError:
        return
    try:
        with os.fdopen(fd, "wb") as f:
            for c in chunks:
                f.write(c)
        os.replace(tmp, os.path.join(where, name))
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass
