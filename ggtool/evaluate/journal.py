"""What lets an interrupted evaluation resume (`resume=True`): beside its output file NAME, in the
directory of the file NAME names (a symlink's target, as outputs are written),

- `.NAME.ggtool-journal`: JSON lines, the run's identity (model, text tokens, sizes, numerics,
  base file read: anything that changes its numbers), then one line per finished batch of chunks
  with the sums so far and the per-token values of that batch;
- `.NAME.ggtool-partial` (when the output is a base-logits file): the file so far, its header and
  the rows of the finished batches.

Each batch's rows are written and synced before its journal line, so the journal never claims
rows the partial file lacks. The journal is locked (flock) while a run holds it: a second run on
the same output is refused. A finished run moves the partial file over NAME (tensor_io.install) and
removes the journal; a failed or interrupted one keeps both if a batch was finished, else removes
them. A run that finds a journal and is not resuming refuses to start over it.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import stat

import numpy as np

from .text import EvaluateError

FORMAT = "ggtool-evaluate-journal"
VERSION = 1
MAX_JOURNAL_BYTES = 1 << 30


def side_files(anchor: str) -> tuple[str, str]:
    """(partial, journal) paths for the output `anchor`."""
    from ..tensor_io.outputs import destination

    direct, target = destination(anchor)
    if direct:
        raise EvaluateError("an output that can be resumed must be a regular file, not a FIFO or a device",
                            kind="resume-output", file=anchor)
    d, name = os.path.split(target)
    return os.path.join(d, f".{name}.ggtool-partial"), os.path.join(d, f".{name}.ggtool-journal")


def floats_text(a: np.ndarray) -> str:
    return base64.b64encode(np.ascontiguousarray(a, "<f4").tobytes()).decode("ascii")


def floats_from(text: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(text.encode("ascii"), validate=True), "<f4").astype(np.float32)


def _open_nofollow(path: str, flags: int) -> int:
    fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
        os.close(fd)
        raise OSError(f"{path} is not a regular file of this user")
    return fd


class Journal:
    """One run's journal (see the module): `done` chunks finished, `states` the lines after the
    identity, `partial` the open partial file (or None)."""

    def __init__(self, anchor: str, identity: dict, *, resume: bool, header: bytes | None):
        self.anchor = anchor
        self.partial_path, self.path = side_files(anchor)
        self.identity = identity
        self.states: list[dict] = []
        self.done = 0
        self.partial = None
        self._fd = -1
        exists = os.path.lexists(self.path)
        if resume and not exists:
            raise EvaluateError("cannot resume: no interrupted run to continue (no " + os.path.basename(self.path) + ")",
                                kind="resume-none", file=anchor)
        if not resume and exists:
            done = self._peek_done()
            chunks = f"{done} chunk{'s' if done != 1 else ''} done"
            raise EvaluateError(f"an interrupted run left its progress ({chunks}) in {self.path}: resume it, or "
                                f"delete that file (and {os.path.basename(self.partial_path)}) to start over",
                                kind="resume-exists", file=anchor)
        try:
            if resume:
                self._reopen(header)
            else:
                self._create(header)
        except BaseException:
            if self.partial is not None:
                self.partial.close()
                self.partial = None
            self._close()
            raise

    # -- opening --------------------------------------------------------------------------------
    def _lock(self, fd: int) -> None:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise EvaluateError(f"another run is writing it (its journal {self.path} is locked)",
                                kind="resume-busy", file=self.anchor) from None

    def _create(self, header: bytes | None) -> None:
        for p in (self.partial_path,):
            if header is not None and os.path.lexists(p):     # left without a journal: nothing to resume
                os.unlink(p)
        try:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        except OSError as e:
            raise EvaluateError(f"cannot write {self.path}: {e.strerror}", kind="resume-output", file=self.anchor) from None
        self._lock(self._fd)
        self._append({"format": FORMAT, "version": VERSION, "identity": self.identity})
        if header is not None:
            fd = os.open(self.partial_path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
            self.partial = os.fdopen(fd, "r+b")
            self.partial.write(header)
            self.partial.flush()

    def _reopen(self, header: bytes | None) -> None:
        try:
            self._fd = _open_nofollow(self.path, os.O_RDWR)
        except OSError as e:
            raise EvaluateError(f"cannot resume: cannot open {self.path}: {e.strerror or e}", kind="resume-damaged",
                                file=self.anchor) from None
        self._lock(self._fd)
        lines = self._lines()
        first = lines[0] if lines else {}
        if first.get("format") != FORMAT or first.get("version") != VERSION or not isinstance(first.get("identity"), dict):
            self._damaged("its first line is not a ggtool journal's")
        theirs = first["identity"]
        differ = sorted(k for k in set(theirs) | set(self.identity) if theirs.get(k) != self.identity.get(k))
        if differ:
            raise EvaluateError("cannot resume: the interrupted run differs from this one in " + ", ".join(
                f"{k} ({_short(theirs.get(k))} then, {_short(self.identity.get(k))} now)" for k in differ),
                kind="resume-mismatch", file=self.anchor, keys=differ)
        self.states = lines[1:]
        for s in self.states:
            if not isinstance(s, dict) or not isinstance(s.get("done"), int):
                self._damaged("a line without its chunk count")
        self.done = self.states[-1]["done"] if self.states else 0
        if header is not None:
            try:
                fd = _open_nofollow(self.partial_path, os.O_RDWR)
            except OSError as e:
                raise EvaluateError(f"cannot resume: cannot open {self.partial_path}: {e.strerror or e}",
                                    kind="resume-damaged", file=self.anchor) from None
            self.partial = os.fdopen(fd, "r+b")
            size = self.states[-1]["bytes"] if self.states else len(header)
            have = os.fstat(fd).st_size
            if have < size or self.partial.read(len(header)) != header:
                self._damaged(f"{self.partial_path} does not hold what the journal says ({have} bytes, header "
                              "checked)")
            self.partial.truncate(size)
            self.partial.seek(size)

    def _lines(self) -> list:
        size = os.fstat(self._fd).st_size
        if size > MAX_JOURNAL_BYTES:
            self._damaged("it is larger than a journal can be")
        os.lseek(self._fd, 0, os.SEEK_SET)
        raw = os.read(self._fd, size) if size else b""
        text = raw.decode("utf-8", "replace")
        parts = text.split("\n")
        if parts and parts[-1] == "":
            parts.pop()
        elif parts:                      # a line cut short by the interruption: dropped, and cut off the file
            cut = len(raw) - len(parts[-1].encode("utf-8", "replace"))
            parts.pop()
            os.ftruncate(self._fd, cut)
        out = []
        for i, line in enumerate(parts):
            try:
                out.append(json.loads(line))
            except ValueError:
                self._damaged(f"line {i + 1} is not JSON")
        os.lseek(self._fd, 0, os.SEEK_END)
        return out

    def _peek_done(self) -> int:
        try:
            with open(self.path, "rb") as f:
                last = f.read(MAX_JOURNAL_BYTES).rstrip(b"\n").rsplit(b"\n", 1)[-1]
            return int(json.loads(last).get("done", 0))
        except (OSError, ValueError, AttributeError, TypeError):
            return 0

    def _damaged(self, why: str):
        raise EvaluateError(f"cannot resume: the journal {self.path} is damaged: {why}", kind="resume-damaged",
                            file=self.anchor)

    # -- running --------------------------------------------------------------------------------
    def _append(self, obj: dict) -> None:
        data = (json.dumps(obj, separators=(",", ":")) + "\n").encode("utf-8")
        os.write(self._fd, data)
        os.fsync(self._fd)

    def write_rows(self, data: bytes) -> None:
        self.partial.write(data)

    def commit(self, done: int, state: dict) -> None:
        """A batch is finished: its rows are synced, then its line is added."""
        if self.partial is not None:
            self.partial.flush()
            os.fsync(self.partial.fileno())
            state = {**state, "bytes": self.partial.tell()}
        self.done = done
        self.states.append({**state, "done": done})
        self._append(self.states[-1])

    def finish(self, expected_size: int | None = None) -> None:
        """The run is complete: the partial file becomes the output, the journal goes."""
        from ..tensor_io.outputs import install

        if self.partial is not None:
            self.partial.flush()
            os.fsync(self.partial.fileno())
            size = self.partial.tell()
            self.partial.close()
            self.partial = None
            if expected_size is not None and size != expected_size:
                raise EvaluateError(f"wrote {size} bytes where {expected_size} were due", kind="base-write",
                                    file=self.anchor)
            install(self.partial_path, self.anchor)
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        self._close()

    def abandon(self) -> bool:
        """The run failed or was stopped: keep what a resumed run needs, if a batch was finished
        (True), else remove it all."""
        keep = self.done > 0
        if self.partial is not None:
            with contextlib.suppress(OSError, ValueError):
                self.partial.close()
            self.partial = None
        if not keep:
            for p in (self.partial_path, self.path):
                with contextlib.suppress(OSError):
                    os.unlink(p)
        self._close()
        return keep

    def _close(self) -> None:
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = -1


def _short(v) -> str:
    s = json.dumps(v)
    return s if len(s) <= 40 else s[:37] + "..."
