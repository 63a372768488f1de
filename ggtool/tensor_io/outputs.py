"""Writing results: a tensor's values as an array in numpy order, .npy and .gguf files, and any
file (text included: the command line formats its JSON itself) replaced atomically (a FIFO or a
device is written in place, a symlink's target replaced), never left half-written.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Iterable, Iterator

import numpy as np

from .. import types as T
from ..errors import GGToolError
from ..interrupts import process_alive, signals_held
from ..tensor import Tensor

FORMATS = ("json", "npy", "gguf")
GGUF_ARCH = "ggtool"



def format_for_path(path: str) -> str | None:
    """The output format a file name asks for (.json, .npy, .gguf), or None."""
    ext = os.path.splitext(path)[1].lower().lstrip(".")
    return ext if ext in FORMATS else None


def tensor_array(t: Tensor) -> np.ndarray:
    """A tensor's values in numpy order, packed, with ggml_n_dims dimensions (trailing ne of 1 dropped:
    ne [4, 3, 1, 1] is numpy shape (3, 4); an empty dimension is kept); quantized tensors are
    dequantized to f32. A packed tensor comes as a view of its memory, not a copy: a large output
    would otherwise cost a second buffer (and its first touch) just to be written out."""
    n = max((i + 1 for i, d in enumerate(t.ne) if d != 1), default=1)
    if T.is_quantized(t.type) or t.type == T.BF16:
        arr = t.numpy()
    else:
        arr = np.ascontiguousarray(t.data)   # copies only a view that is not packed
    return arr.reshape(t.ne[:n][::-1])


# -- binary formats ---------------------------------------------------------------------------------
def write_npy(f, arr: np.ndarray) -> None:
    np.save(f, np.ascontiguousarray(arr), allow_pickle=False)


def write_gguf(path: str, tensors: list[tuple[str, Tensor]], metadata: dict[str, str] | None = None) -> None:
    """All `tensors` under their names, in their own types (quantized ones as raw blocks, bf16 as
    its bits). GGML's limits hold for what is written as for what is read: names of at most 63
    bytes, each once (a tensor has at most 4 dimensions by construction)."""
    from gguf import GGUFWriter

    from ..gguf_io.format import check_tensor_name

    names = [n for n, _ in tensors]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise GGToolError(f"cannot write GGUF: output name {dup[0]!r} is used twice")
    for n in names:
        check_tensor_name(n, "cannot write GGUF: output name")
    w = GGUFWriter(path, GGUF_ARCH)
    try:
        for key, value in (metadata or {}).items():
            w.add_string(key, value)
        for name, t in tensors:
            if T.is_quantized(t.type) and t.is_contiguous():
                raw = np.ascontiguousarray(t.data).reshape(*t.ne[1: t.n_dims][::-1], -1)
                w.add_tensor(name, raw, raw_dtype=t.type)
            elif t.type == T.BF16:    # no numpy dtype: its bits as row bytes, in logical order
                raw = np.ascontiguousarray(t.data).view(np.uint8).reshape(*t.ne[1: t.n_dims][::-1], -1)
                w.add_tensor(name, raw, raw_dtype=t.type)
            else:
                w.add_tensor(name, np.ascontiguousarray(tensor_array(t)))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
    finally:
        w.close()


# -- output files ----------------------------------------------------------------------------------
# A temporary output file: `.NAME.PID.XXXXXXXX.tmp` beside NAME, PID its writer's (tempfile's 8 random characters).
_TMP_RANDOM = r"[a-z0-9_]{8}"


def destination(path: str) -> tuple[bool, str]:
    """Where writing `path` goes: (True, path) for an existing FIFO, device or socket, written in
    place (replacing it would break whoever reads it, and as root `-o /dev/null` would replace the
    system's /dev/null); else (False, file), the regular file to replace or create: `path` itself,
    or where its symlink (or chain of them) leads, so the link stays a link. A dangling link
    creates its target, as a shell's `>` does; a directory, or a loop of links, is an error."""
    try:
        st = os.stat(path)   # follows links
    except FileNotFoundError:
        st = None            # a new file, or a dangling link: its target is created
    except OSError as e:     # a loop of links, a component that is not a directory, no permission
        raise GGToolError(f"cannot write {path}: {e.strerror or e}") from None
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise GGToolError(f"cannot write {path}: it is a directory")
    if st is not None and not stat.S_ISREG(st.st_mode):
        return True, path
    return False, os.path.realpath(path)


@contextlib.contextmanager
def atomic_path(path: str, *, replace: bool = True) -> Iterator[str]:
    """The path to write `path` through: a temporary file beside the file it names (see
    `destination`), moved over it only if the block succeeds (else removed); or, for a FIFO, a
    device or a socket, `path` itself, written in place. `replace=False`: `path` must not exist
    when the file is moved into place (OutputPathError `exists` if it does), decided atomically
    (see `atomic_paths`).

    So a failed or interrupted write never leaves a half-written file, and never clobbers the old
    one. The temporary file is `.NAME.PID.XXXXXXXX.tmp`, locked (flock) by its writer while it
    exists: those a dead writer left (SIGKILL, a crash) are removed first (`remove_stale_temporaries`).
    Making it and knowing its name hold SIGINT, SIGTERM and SIGHUP until both are done, so that a
    signal cannot leave a temporary file nobody will remove.
    """
    with atomic_paths([path], replace=replace) as (tmp,):
        yield tmp


@contextlib.contextmanager
def atomic_paths(paths: list[str], *, replace: bool = True) -> Iterator[list[str]]:
    """atomic_path for several files that appear together (a model's shards): one temporary file
    each, all moved into place only when the block succeeds.

    With `replace=False` no existing file is replaced, even one another process creates while this
    one writes: each finished temporary file is hard-linked to its name (os.link fails if the name
    exists; where the file system has no hard links, the name is first created with O_EXCL, then
    the file renamed over it). If any name is taken, the files this call already put in place are
    removed again and OutputPathError `exists` is raised: of writers racing for a new name, exactly
    one succeeds and the others say so."""
    found = [destination(p) for p in paths]
    if not replace:
        for p, (direct, _) in zip(paths, found):
            if direct:
                raise _exists(p)
    tmps: list[str | None] = [None] * len(paths)
    fds: list[int] = []
    try:
        for k, (p, (direct, target)) in enumerate(zip(paths, found)):
            if direct:
                tmps[k] = p
                continue
            directory, name = os.path.split(target)
            remove_stale_temporaries(directory, name)
            with signals_held():
                try:
                    fd, tmp = tempfile.mkstemp(prefix=f".{name}.{os.getpid()}.", suffix=".tmp", dir=directory)
                except OSError as e:
                    raise GGToolError(f"cannot write {p}: {e.strerror or e}") from None
                fds.append(fd)
                tmps[k] = tmp
                fcntl.flock(fd, fcntl.LOCK_EX)   # held until it is renamed or removed: a writer alive
        yield list(tmps)
        moves = [(p, tmp, target) for p, tmp, (direct, target) in zip(paths, tmps, found) if not direct]
        for _, tmp, target in moves:
            os.chmod(tmp, _new_file_mode(target))
        if replace:
            for _, tmp, target in moves:
                os.replace(tmp, target)   # a signal before it leaves the old file, one after it the new
        else:
            _link_all(moves)
    except BaseException:
        for (direct, _), tmp in zip(found, tmps):
            if tmp is not None and not direct:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
        raise
    finally:
        for fd in fds:
            os.close(fd)


def _exists(path: str):
    from ..gguf_io.write import OutputPathError
    return OutputPathError(path, "exists")


def _link_all(moves: list[tuple[str, str, str]]) -> None:
    """Put each finished temporary file at its new name without replacing anything (see
    atomic_paths); on a name taken, undo the ones placed and raise OutputPathError `exists`."""
    placed: list[tuple[str, os.stat_result]] = []
    try:
        for path, tmp, target in moves:
            st = os.stat(tmp)
            try:
                os.link(tmp, target, follow_symlinks=False)
            except FileExistsError:
                raise _exists(path) from None
            except OSError:                     # no hard links here: claim the name, then rename onto it
                try:
                    os.close(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
                except FileExistsError:
                    raise _exists(path) from None
                os.replace(tmp, target)
            placed.append((target, st))
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
    except BaseException:
        for target, st in placed:             # ours only: the same file we placed
            with contextlib.suppress(OSError):
                now = os.stat(target, follow_symlinks=False)
                if (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino):
                    os.unlink(target)
        raise


def install(tmp: str, path: str) -> None:
    """Move the complete file `tmp` (beside the file `destination(path)` names) over it, with the
    mode the old file had or a new one gets: what `atomic_path` does last, for a writer that keeps
    its unfinished file across runs to resume it (ggtool.evaluate)."""
    direct, target = destination(path)
    if direct:
        raise GGToolError(f"cannot write {path}: not a regular file")
    with signals_held():
        os.chmod(tmp, _new_file_mode(target))
        os.replace(tmp, target)


def remove_stale_temporaries(directory: str, name: str) -> list[str]:
    """Remove the temporary files of `name` in `directory` that their writer left when it died:
    `.NAME.PID.XXXXXXXX.tmp`, PID not alive, a regular file of this user (symlinks and anything
    else of that name are left alone, never followed), and its lock free (a live writer holds it:
    this also covers a PID reused, or one of another machine sharing the directory). Returns their
    names. One scan of the directory, before each write into it."""
    prefix = f".{name}."
    pattern = re.compile(re.escape(prefix) + r"(\d+)\." + _TMP_RANDOM + r"\.tmp")
    removed = []
    try:
        entries = [e.name for e in os.scandir(directory) if e.name.startswith(prefix)]
    except OSError:
        return removed
    for entry in entries:
        m = pattern.fullmatch(entry)
        if m is None or process_alive(int(m.group(1))):
            continue
        if _remove_if_unlocked(os.path.join(directory, entry)):
            removed.append(entry)
    return removed


def _remove_if_unlocked(path: str) -> bool:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:   # a symlink (O_NOFOLLOW), gone already, not ours to read
        return False
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:   # locked: its writer is alive
            return False
        now = os.stat(path, follow_symlinks=False)
        if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
            return False
        os.unlink(path)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def _new_file_mode(path: str) -> int:
    try:
        return os.stat(path).st_mode & 0o7777
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


@contextlib.contextmanager
def named_write_errors(path: str) -> Iterator[None]:
    """A write error (no file name of its own: a full disk, a FIFO whose reader left) names the output."""
    try:
        yield
    except OSError as e:
        if e.filename is None and e.errno is not None:
            raise OSError(e.errno, e.strerror, path) from None
        raise


class _WriteOnly:
    """A file as numpy sees a pipe: write() only. Given a real file, np.save writes with
    tofile, which needs a file position, and a FIFO or a device has none."""

    def __init__(self, f):
        self.write = f.write


def write_text_atomic(path: str, chunks: Iterable[str]) -> None:
    with named_write_errors(path), atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        for c in chunks:
            f.write(c)


def write_npy_atomic(path: str, arr: np.ndarray) -> None:
    with named_write_errors(path), atomic_path(path) as tmp, open(tmp, "wb") as f:
        write_npy(f if tmp != path else _WriteOnly(f), arr)


def write_gguf_atomic(path: str, tensors: list[tuple[str, Tensor]], metadata: dict[str, str] | None = None) -> None:
    """write_gguf to `path` through `atomic_path`; onto a FIFO or a device (no file position to
    seek to) through `copy_gguf`."""
    with named_write_errors(path), atomic_path(path) as tmp:
        if tmp != path:
            write_gguf(tmp, tensors, metadata)
        else:
            with open(path, "wb") as f:
                copy_gguf(f, tensors, metadata)


def copy_gguf(out, tensors: list[tuple[str, Tensor]], metadata: dict[str, str] | None = None) -> None:
    """write_gguf to a stream (stdout, a FIFO): to a file in a temporary directory, then copied."""
    with tempfile.TemporaryDirectory() as d:
        tmp = os.path.join(d, "out.gguf")
        write_gguf(tmp, tensors, metadata)
        with open(tmp, "rb") as f:
            shutil.copyfileobj(f, out)
        out.flush()
