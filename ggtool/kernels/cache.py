"""ggtool's cache on disk: where it is, which of its folders may be trusted, where compiled kernels
go, whether a kernel is in the cache yet, and filling it in the background. Light (os only): asking
costs a process nothing of numba's start-up.

The cache's root is ``$GGTOOL_CACHE_DIR`` if that is set, else ``$XDG_CACHE_HOME/ggtool`` (default
``~/.cache/ggtool``), never beside the installed package, which may not be writable. It holds
``numba/<key>/`` (compiled kernels, below) and ``packs/`` (repacked weights: ``quant.packs``).

Trust: every folder of the cache must be a real folder (not a symbolic link), the user's own, and
writable by nobody else (ggtool makes its folders with mode 0700); the root may be a symbolic link
of the user's own to such a folder. A folder that is not is never written into nor read: a link or
a file that stands where ggtool keeps a folder of its own is removed and the folder made anew; a
root that fails (or a folder in it that cannot be made so) is bypassed: one warning
(``CacheWarning``) names it and says how to mend it, and the process runs without a cache
(kernels compile into a private temporary folder, nothing is kept). Bypassed, not refused: the
cache only saves time, and a command must not fail over a folder that cannot change its results.

Compiled kernels live in ``numba/<key>``, `key` a digest of what numba's code depends on beyond
the module it is cached for (`kernel_key`): the SHARED modules (numba checks a cached kernel
against its own source file only), numba's and llvmlite's versions, and the CPU the code is
compiled for (``NUMBA_CPU_NAME``/``NUMBA_CPU_FEATURES``, else this host's CPU model and flags from
/proc/cpuinfo), with the numba settings that change the machine code; and what numba checks a
cached kernel against, which a ``ready/`` mark must follow: the kernel modules' folder, sizes and
times (`_kernel_sources`). So a cache shared between an AVX-512 and an AVX2 host (an NFS home)
holds one folder per host, and neither ever meets the other's code or ``ready/`` marks (numba
itself also keys each compiled function by its target); two checkouts or venvs of one version
have a folder each, as numba has files each.
A ``NUMBA_CACHE_DIR`` the user set wins over all of this and is used as it is. A folder no process
has used for long is removed (`prune_kernel_folders`, once a day), never one a live process holds.

A first-ever run: compiling a kernel costs 0.3-2.5 s of numba's own Python work each (~8 s for a
quantized model's forward pass), far more than the work it then does in a short run. So in ggtool's
command line (and its pool's workers), a kernel that is not in the cache yet is replaced by its
numpy twin (``twins``: the same bits), and is compiled after the command has ended, by one
background process (``warm``, started isolated: ``ggtool.isolation``) that fills the cache for the
next run: it waits for the command to exit (its stdin is a pipe the command holds), compiles the
kernels named in ``wanted/`` one by one (numba writes each cache file whole, through a rename),
marks each in ``ready/`` and exits. A lock lets one such process work on a cache at a time. A
library user's process compiles in process, as always (``use_kernel``).
"""

from __future__ import annotations

import errno
import os
import stat
import sys
import time

from .. import environment, role
from ..errors import CacheWarning

# Modules whose compiled functions other kernel modules compile into theirs: simd's vector tiles
# (into dot and dot_k), dot_base's store_group (into dot and dot_k), dot_k's scale decoding (into x86 and
# x86_kquants), x86's lanes, reductions and activation decoders (into x86_float, x86_legacy, x86_kquants),
# ggtool.qtypes' _k_quantize and _iq4nl_quantize (their searches and block ends, into _weighted_quantize
# and the records' kernels; _weighted_quantize's make_qp_quants into IQ2's), ggtool.qtypes' _kernel_base
# (its helpers, into both kernel modules of the records) and grids (tables frozen into the kernels as
# constants).
SHARED = ("simd.py", "dot_base.py", "dot_k.py", "x86.py", "../qtypes/_k_quantize.py", "../qtypes/_iq4nl_quantize.py",
          "../qtypes/_weighted_quantize.py", "../qtypes/_kernel_base.py", "../qtypes/grids.py",
          # the compiled runner's node kernels compile these modules' functions in
          "quantize.py", "dot.py", "dot_float.py", "float_rows.py", "native.py", "nodes.py")
# numba settings that change the machine code of a kernel (numba's own cache does not key them)
NUMBA_CODEGEN = ("NUMBA_CPU_NAME", "NUMBA_CPU_FEATURES", "NUMBA_OPT", "NUMBA_LOOP_VECTORIZE", "NUMBA_SLP_VECTORIZE",
                 "NUMBA_ENABLE_AVX", "NUMBA_DISABLE_INTEL_SVML", "NUMBA_BOUNDSCHECK", "NUMBA_FASTMATH")
# ggtool's folders whose modules numba compiles kernels from (``kernels.jit.njit``)
KERNEL_FOLDERS = ("kernels", "qtypes")
ROOT_ENV = environment.CACHE_DIR.name
FOLDER_MODE = 0o700


# -- the root and its folders -----------------------------------------------------------------------
def root_path() -> str:
    """Where the cache's root is (see the module docstring), whether or not it may be used."""
    base = environment.cache_dir()
    if not base:
        xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        base = os.path.join(xdg, "ggtool")
    return os.path.abspath(base)


def folder_problem(path: str, st: os.stat_result | None = None) -> str | None:
    """Why the folder at `path` may not hold a cache (None: it may): a symbolic link, not a folder,
    another user's, or writable by others."""
    if st is None:
        st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        return "is a symbolic link"
    if not stat.S_ISDIR(st.st_mode):
        return "is not a folder"
    if hasattr(os, "geteuid") and st.st_uid != os.geteuid():
        return f"belongs to another user (uid {st.st_uid})"
    if st.st_mode & 0o022:
        return f"can be written by other users (mode {stat.S_IMODE(st.st_mode):o})"
    return None


_checked: dict[str, str | None] = {}   # folder -> None (trusted) or the warning it gave, for the process's life


def _fix(path: str, problem: str) -> str:
    if problem.startswith("can be written"):
        return f"`chmod go-w {path}` to use it"
    if problem.startswith("belongs"):
        return f"set {ROOT_ENV} to a folder of your own"
    return f"remove it, or set {ROOT_ENV} to a folder of your own"


def bypass(path: str, problem: str, what: str = "ggtool's cache") -> None:
    """Say once, as a CacheWarning, that `what` is not used because folder `path` has `problem`.
    A pool worker says nothing: its caller, which asks the same, has said it."""
    message = f"{what} is not used: {path} {problem}; {_fix(path, problem)}"
    if _checked.get(path) is None:
        _checked[path] = message
        if not role.POOL_WORKER:
            say(message)


def root() -> str | None:
    """The cache's root, made if missing, or None where it may not be used (said once)."""
    path = root_path()
    if path in _checked:
        return None if _checked[path] else _resolved(path)
    try:
        os.makedirs(path, mode=FOLDER_MODE, exist_ok=True)
        real = _resolved(path)
        st = os.lstat(path)
        if stat.S_ISLNK(st.st_mode) and hasattr(os, "geteuid") and st.st_uid != os.geteuid():
            problem = f"is a symbolic link of another user's (uid {st.st_uid})"
        else:
            problem = folder_problem(real)
    except OSError as e:
        problem = f"cannot be made ({e.strerror or e})"
    if problem:
        bypass(path, problem)
        return None
    _checked[path] = None
    return real


def _resolved(path: str) -> str:
    return os.path.realpath(path)


def subfolder(parent: str, *names: str) -> str | None:
    """parent/names..., each made (mode 0700) if missing and checked; something else standing at
    one of those names (a link, a file) is removed, said once, and the folder made anew. None where
    a folder cannot be made trusted (said once). `parent` must be trusted already."""
    path = parent
    for name in names:
        path = os.path.join(path, name)
        problem = _make_trusted(path)
        if problem:
            bypass(path, problem)
            return None
        _checked[path] = None
    return path


def _make_trusted(path: str) -> str | None:
    """Make folder `path` for `subfolder` (what stands there instead removed, said once): its problem,
    or None. A folder removed meanwhile (an old kernel folder a prune took) is made anew."""
    problem = None
    for _ in range(3):
        try:
            try:
                os.mkdir(path, FOLDER_MODE)
            except FileExistsError:
                st = os.lstat(path)
                problem = folder_problem(path, st)
                if problem in ("is a symbolic link", "is not a folder"):
                    what = f"a symbolic link to {os.readlink(path)}" if stat.S_ISLNK(st.st_mode) else "not a folder"
                    os.unlink(path)           # in a folder of ours its name is ours; a link is never followed
                    os.mkdir(path, FOLDER_MODE)
                    say(f"the cache folder {path} was {what}: removed, and the folder made anew")
                elif problem and problem.startswith("can be written") and st.st_uid == os.geteuid():
                    os.chmod(path, FOLDER_MODE)
            return folder_problem(path)
        except FileNotFoundError as e:
            problem = f"cannot be made ({e.strerror or e})"
        except OSError as e:
            return f"cannot be made ({e.strerror or e})"
    return problem


def say(message: str) -> None:
    """`message` as a CacheWarning."""
    import warnings

    warnings.warn(CacheWarning(message), stacklevel=4)


# -- the kernel cache -----------------------------------------------------------------------------------
def kernel_key(settings=None, cpuinfo: str = "/proc/cpuinfo", package: str | None = None) -> str:
    """A digest of what compiled kernels depend on beyond their own module (module docstring), and
    of what numba checks a cached kernel against (`package`: where ggtool's kernel modules are)."""
    import hashlib

    settings = environment.foreign(NUMBA_CODEGEN) if settings is None else settings
    h = hashlib.sha1()
    here = os.path.dirname(os.path.abspath(__file__))
    for name in SHARED:
        with open(os.path.join(here, name), "rb") as f:
            h.update(f.read())
    h.update(_kernel_sources(package or os.path.dirname(here)))
    h.update(_package_version("numba") + b"\0" + _package_version("llvmlite") + b"\0")
    h.update(repr([(k, settings.get(k)) for k in NUMBA_CODEGEN]).encode())
    if not settings.get("NUMBA_CPU_FEATURES"):   # else the code does not depend on this host
        h.update(host_cpu(cpuinfo).encode())
    return "kernels-" + h.hexdigest()[:12]


def _kernel_sources(package: str) -> bytes:
    """numba keeps a compiled kernel for its source file's path and checks it against the file's size
    and time: a ready mark holds for those only (another checkout or install of the same version,
    or a module rewritten, compiles anew: its marks must not say ready)."""
    out = [os.path.abspath(package)]
    for sub in KERNEL_FOLDERS:
        folder = os.path.join(package, sub)
        try:
            names = sorted(n for n in os.listdir(folder) if n.endswith(".py"))
        except OSError:
            continue
        for name in names:
            try:
                st = os.stat(os.path.join(folder, name))
            except OSError:
                continue
            out.append(f"{sub}/{name}:{st.st_size}:{st.st_mtime_ns}")
    return "\0".join(out).encode()


def _package_version(name: str) -> bytes:
    """Bytes that change with the installed version of package `name`, without importing it."""
    from importlib.machinery import PathFinder

    try:
        spec = PathFinder.find_spec(name)     # on sys.path, whatever sys.modules holds
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.origin:
        return b"-"
    folder = os.path.dirname(spec.origin)
    try:
        with open(os.path.join(folder, "_version.py"), "rb") as f:
            return f.read()
    except OSError:
        try:
            st = os.stat(spec.origin)
            return f"{spec.origin}:{st.st_size}:{st.st_mtime_ns}".encode()
        except OSError:
            return spec.origin.encode()


def host_cpu(cpuinfo: str = "/proc/cpuinfo") -> str:
    """This host's CPU as a compiler targets it: vendor, family, model and flags of the first CPU in
    /proc/cpuinfo (LLVM's host CPU name and features derive from these); elsewhere the machine."""
    keep = ("vendor_id", "cpu family", "model", "flags", "Features", "CPU implementer", "CPU part")
    found = []
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as f:
            for line in f:
                if not line.strip():
                    if found:
                        break
                    continue
                k, _, v = line.partition(":")
                if k.strip() in keep:
                    found.append(f"{k.strip()}={' '.join(v.split())}")
    except OSError:
        pass
    if not found:
        import platform

        found = [platform.machine(), platform.processor()]
    return ";".join(found)


_dirs: dict[tuple, str] = {}
_private: list[str] = []


def cache_dir() -> str:
    """Where compiled kernels are cached (see the module docstring): NUMBA_CACHE_DIR if set, else
    numba/<kernel_key()> in the root; a private temporary folder (removed at exit) where the cache
    is bypassed."""
    user = os.environ.get("NUMBA_CACHE_DIR")
    memo = (user, root_path(), *environment.foreign(NUMBA_CODEGEN).values())
    got = _dirs.get(memo)
    if got is None:
        got = _kernel_folder(user)
        _dirs[memo] = got
    return got


def _kernel_folder(user: str | None) -> str:
    if user:
        path = os.path.abspath(user)
        try:
            os.makedirs(path, mode=FOLDER_MODE, exist_ok=True)
            problem = folder_problem(os.path.realpath(path))
        except OSError as e:
            problem = f"cannot be made ({e.strerror or e})"
        if problem is None:
            if _ours(path):     # a compile process ggtool started on its own folder: held as its caller's
                _hold(path)
            return path
        bypass(path, problem, "the kernel cache NUMBA_CACHE_DIR")
    else:
        top = root()
        got = None
        for _ in range(3):      # a prune that removed the folder meanwhile: it is made anew
            got = subfolder(top, "numba", kernel_key()) if top is not None else None
            if got is None or _hold(got):
                break
        if got is not None:
            _prune_now(os.path.dirname(got), got)
            return got
    return private_folder()


# -- old kernel folders --------------------------------------------------------------------------------
# A kernel folder's key changes with a ggtool, numba or CPU that changes, another checkout or venv, a
# kernel module edited: the old folder (up to ~80 MB) is never used again, so the folders are looked
# over once a day and those no process uses are removed (`prune_kernel_folders`).
IN_USE = ".in-use"      # in a kernel folder: each process using it holds a shared lock on it; its time is the last use
PRUNED = ".pruned"      # in numba/: its time is when the kernel folders were last looked over
PRUNE_EVERY_S = 86400   # how often they are looked over
SPARE_S = 3600          # a folder used this recently is kept (a process may be about to use it)
KEEP = 4                # the folders used last (the process's own among them) are kept up to IDLE_S unused
IDLE_S = 30 * 86400     # a folder unused this long is removed
_held: dict[str, int] = {}   # kernel folder -> the fd of its IN_USE this process holds a shared lock on


def _ours(path: str) -> bool:
    """Whether `path` is a kernel folder in the cache's numba/ (a compile process ggtool started on one)."""
    return os.path.basename(path).startswith("kernels-") and \
        os.path.realpath(os.path.dirname(path)) == os.path.realpath(os.path.join(root_path(), "numba"))


def _open_in_use(folder: str, made_at: float | None = None) -> int:
    """An fd of `folder`'s IN_USE file, made if missing (its time then `made_at`, else now); anything
    else standing at its name (a link, a folder, a FIFO, a hard link to another file) is removed
    first. OSError where it cannot be opened (FileNotFoundError: the folder is gone)."""
    path = os.path.join(folder, IN_USE)
    flags = os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    for attempt in range(3):
        made = True
        try:
            try:
                fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:
                made = False
                fd = os.open(path, flags)
        except OSError as e:
            if attempt == 2 or e.errno not in (errno.ELOOP, errno.EISDIR, errno.ENOENT, errno.ENXIO):
                raise
            if e.errno != errno.ENOENT:
                remove(path)
            continue
        st = os.fstat(fd)
        if stat.S_ISREG(st.st_mode) and st.st_nlink == 1:
            if made and made_at is not None:
                os.utime(fd, (made_at, made_at))
            return fd
        os.close(fd)
        remove(path)
    raise OSError(errno.EEXIST, f"{path} is remade as fast as it is removed")


def _hold(folder: str) -> bool:
    """Hold a shared lock on kernel folder `folder`'s IN_USE for the rest of this process's life (no
    prune removes a folder a live process holds) and stamp its use (again at exit: `_stamp_held`).
    False where the folder was removed meanwhile, or a prune holds it alone for a second (the caller
    makes it anew); on a file system without locks it is used unheld."""
    import fcntl

    if folder in _held:
        return True
    try:
        fd = _open_in_use(folder)
    except FileNotFoundError:
        return False
    except OSError:
        return True
    try:
        for _ in range(200):    # a prune holds it alone only while it renames the folder away
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                time.sleep(0.005)
        else:                   # a prune stalled (stopped, a hung network file system): not used unheld
            os.close(fd)
            return False
        if not os.path.samestat(os.fstat(fd), os.lstat(os.path.join(folder, IN_USE))):
            os.close(fd)        # renamed away by a prune between the open and the lock
            return False
        os.utime(fd)
    except FileNotFoundError:
        os.close(fd)
        return False
    except OSError:             # no locks here (some network file systems): used unheld
        os.close(fd)
        return True
    if not _held:
        import atexit

        atexit.register(_stamp_held, os.getpid())
    _held[folder] = fd
    return True


def _stamp_held(holder: int) -> None:
    """At exit: the held folders' last use is now (a run of hours must not look idle when it ends);
    a forked child, whose copies of the fds are closed (its numbers maybe reused), stamps nothing."""
    if os.getpid() != holder:
        return
    for fd in _held.values():
        try:
            os.utime(fd)
        except OSError:
            pass


def _prune_now(numba: str, current: str) -> None:
    """Look the kernel folders in `numba` over if the last look is PRUNE_EVERY_S old (or none was);
    never fails a command."""
    stamp = os.path.join(numba, PRUNED)
    now = time.time()
    try:
        st = os.lstat(stamp)
        if stat.S_ISREG(st.st_mode) and 0 <= now - st.st_mtime < PRUNE_EVERY_S:
            return
        remove(stamp)           # made anew, never written through (a link, a hard link)
    except FileNotFoundError:
        pass
    except OSError:
        return
    try:                        # made first: the processes starting meanwhile do not look too
        os.close(os.open(stamp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o600))
        prune_kernel_folders(numba, current, now)
    except OSError:             # FileExistsError: another process looks them over now
        pass


def prune_kernel_folders(numba: str, current: str, now: float | None = None) -> list[str]:
    """Remove the kernel folders in `numba` (never `current`) that no live process holds and that
    are unused for IDLE_S, or for SPARE_S where KEEP folders were used since; the folders removed.
    A folder is renamed away while its IN_USE is locked alone, then removed: a process finds it
    whole or not at all; a rename a dead prune left is removed."""
    now = time.time() if now is None else now
    found = []
    for name in os.listdir(numba):
        path = os.path.join(numba, name)
        if name.startswith(".trash-"):
            remove(path)
            continue
        if not name.startswith("kernels-") or path == current:
            continue
        try:
            st = os.lstat(path)
        except OSError:                         # removed meanwhile (another prune)
            continue
        if not stat.S_ISDIR(st.st_mode):        # a link or a file: no folder of ours, left alone
            continue
        try:
            used = os.lstat(os.path.join(path, IN_USE)).st_mtime
        except FileNotFoundError:               # made by an older ggtool: its newest entry's time
            used = _newest(path, st.st_mtime)
        except OSError:
            continue
        found.append((used, path))
    removed = []
    for rank, (used, path) in enumerate(sorted(found, reverse=True), start=1):   # `current` is the 0th
        if now - used < SPARE_S or (rank < KEEP and now - used < IDLE_S):
            continue
        if _remove_unused(numba, path, used, now):
            removed.append(path)
    return removed


def _newest(folder: str, since: float) -> float:
    """The latest time among `folder`'s own entries (numba's index folders, ready/), at least `since`."""
    try:
        names = os.listdir(folder)
    except OSError:
        return since
    for name in names:
        try:
            since = max(since, os.lstat(os.path.join(folder, name)).st_mtime)
        except OSError:
            pass
    return since


def _remove_unused(numba: str, folder: str, used: float, now: float) -> bool:
    import fcntl

    try:
        fd = _open_in_use(folder, made_at=used)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)      # fails while a live process holds it
        st = os.fstat(fd)
        if not os.path.samestat(st, os.lstat(os.path.join(folder, IN_USE))):
            return False        # another prune took the folder meanwhile, and a process may have made it anew
        if now - st.st_mtime < SPARE_S:                     # used since it was looked at
            return False
        trash = os.path.join(numba, f".trash-{os.path.basename(folder)}-{os.getpid()}")
        os.rename(folder, trash)
    except OSError:
        return False
    finally:
        os.close(fd)
    remove(trash)
    return True


def remove(path: str) -> None:
    """Remove what is at `path` in a folder of ours, whatever it is (a folder with all it holds; a
    link, never what it points to); nothing there, or what cannot be removed, is no error."""
    try:
        if os.path.isdir(path) and not os.path.islink(path):
            import shutil

            shutil.rmtree(path, ignore_errors=True)
        else:
            os.unlink(path)
    except OSError:
        pass


def private_folder() -> str:
    """A temporary folder of this process's own (0700), removed when it exits."""
    if not _private:
        import atexit
        import shutil
        import tempfile

        _private.append(tempfile.mkdtemp(prefix="ggtool-cache-"))
        atexit.register(shutil.rmtree, _private[0], True)
    return _private[0]


def bypassed() -> bool:
    """Whether the kernel cache is this process's private temporary folder (nothing is kept)."""
    return bool(_private) and cache_dir() == _private[0]


def marker(folder: str, name: str, root: str | None = None) -> str:
    """The file saying kernel `name` is wanted / ready in this Python's cache."""
    return os.path.join(root or cache_dir(), folder, f"{name}.{sys.implementation.cache_tag}")


def plain_file(path: str) -> bool:
    """Whether `path` is a regular file, not through a symbolic link: what a marker must be to count."""
    return os.path.isfile(path) and not os.path.islink(path)


def touch(path: str, text: str = "") -> None:
    """Write the file `path` holding `text` (made, or emptied first): never through a symbolic link,
    and a FIFO planted there is an error, never a wait for its reader."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0)
                 | getattr(os, "O_CLOEXEC", 0), 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


COMPILER = "from ggtool.compiling.warm import main; main()"    # the background compiler's program
_decided: dict[str, bool] = {}   # kernel name -> compiled (True) or twin (False), for the process's life
_compiler = None                 # the background compile process this process started


def use_kernel(name: str) -> bool:
    """Whether this process runs the compiled kernel `name` (else its numpy twin): yes where it
    is in the cache already or where the process is a library user's (or a worker of its pool:
    role.LIBRARY_CALLER); decided once a process. Where the cache is bypassed, the command line
    runs the twin and wishes for nothing."""
    got = _decided.get(name)
    if got is None:
        if not role.COMMAND_LINE and (not role.POOL_WORKER or role.LIBRARY_CALLER):
            got = True
        else:
            root = cache_dir()
            ready = marker("ready", name, root)
            got = not bypassed() and plain_file(ready)
            if not got and not bypassed():
                _want(name, root)
        _decided[name] = got
    return got


def _want(name: str, root: str) -> None:
    global _compiler
    try:
        if subfolder(root, "wanted") is None:
            return
        touch(marker("wanted", name, root))
        if role.COMMAND_LINE and _compiler is None:
            import subprocess

            from .. import isolation

            # a process of its own, not an import: the compiler sits above the type records (it packs a
            # row of a type to compile its dot), this module below them
            _compiler = isolation.popen(COMPILER, env={"NUMBA_CACHE_DIR": root},
                                        stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                        start_new_session=True)   # a Ctrl-C of the command is not its
    except OSError:     # an unwritable cache: the twin still runs; nothing is compiled for next time
        pass
