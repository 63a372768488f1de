"""Old kernel folders (ggtool.kernels.cache: `prune_kernel_folders`): a folder no live process holds
and nobody used for long is removed, whole, never through a link, and never one a process is
using or about to use; what stands at its marker's name is never followed."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from ggtool.kernels import cache

ROOT = Path(__file__).resolve().parent.parent
DAY = 86400


def _folder(numba: Path, name: str, used_ago: float | None, now: float, marked: bool = True) -> Path:
    """A kernel folder holding a file, last used `used_ago` seconds before `now` (its IN_USE's time,
    or where `marked` is false, as an older ggtool left it: its entries' times)."""
    path = numba / name
    (path / "ready").mkdir(parents=True)
    (path / "ready" / "dot:Q4_0.cpython-311").write_text("")
    if marked:
        (path / cache.IN_USE).write_text("")
    for entry in (path / cache.IN_USE, path / "ready", path):
        if entry.exists():
            os.utime(entry, (now - used_ago, now - used_ago))
    return path


def test_folders_unused_for_long_or_beyond_the_last_used_are_removed_and_nothing_else(tmp_path):
    numba, outside = tmp_path / "numba", tmp_path / "outside"
    now = time.time()
    current = _folder(numba, "kernels-current", 0, now)
    old = _folder(numba, "kernels-old", 40 * DAY, now)
    unmarked = _folder(numba, "kernels-unmarked", 35 * DAY, now, marked=False)
    recent = _folder(numba, "kernels-recent", 600, now)                  # used 10 minutes ago: kept
    by_age = [_folder(numba, f"kernels-h{h}", h * 3600, now) for h in (2, 3, 4, 5)]
    (outside / "kernels-x").mkdir(parents=True)
    os.utime(outside / "kernels-x", (now - 50 * DAY, now - 50 * DAY))
    os.symlink(outside / "kernels-x", numba / "kernels-link")             # not a folder of ours
    (numba / "kernels-file").write_text("mine")
    (numba / "notes").mkdir()
    os.utime(numba / "notes", (now - 50 * DAY, now - 50 * DAY))
    (numba / ".trash-kernels-gone-123" / "sub").mkdir(parents=True)       # a dead prune's
    removed = cache.prune_kernel_folders(str(numba), str(current), now)
    # kept: the current one, one used within SPARE_S, and the 2 used last after it (KEEP = 4 with the current)
    assert cache.KEEP == 4
    assert sorted(removed) == sorted(map(str, [old, unmarked, by_age[2], by_age[3]]))
    assert sorted(os.listdir(numba)) == sorted(["kernels-current", "kernels-recent", "kernels-h2", "kernels-h3",
                                                "kernels-link", "kernels-file", "notes"])
    assert (outside / "kernels-x").is_dir() and (numba / "kernels-file").read_text() == "mine"
    assert (current / "ready").is_dir() and (recent / "ready").is_dir()
    assert cache.prune_kernel_folders(str(numba), str(current), now) == []


HOLD = """
import sys
from ggtool.kernels import cache
print(cache._hold(sys.argv[1]), flush=True)
sys.stdin.read()
"""


def test_a_folder_a_live_process_holds_is_never_removed_and_is_once_it_exits(tmp_path):
    numba = tmp_path / "numba"
    now = time.time()
    current = _folder(numba, "kernels-current", 0, now)
    held = _folder(numba, "kernels-held", 40 * DAY, now)
    p = subprocess.Popen([sys.executable, "-c", HOLD, str(held)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True, cwd=ROOT)
    try:
        assert p.stdout.readline() == "True\n"
        later = time.time() + 40 * DAY      # its holder stamped its use now: look from long after
        assert cache.prune_kernel_folders(str(numba), str(current), later) == []
        assert (held / "ready").is_dir()
    finally:
        p.stdin.close()
        assert p.wait(timeout=60) == 0
    assert cache.prune_kernel_folders(str(numba), str(current), later) == [str(held)]
    assert not held.exists() and sorted(os.listdir(numba)) == ["kernels-current"]


def test_a_process_starting_to_use_a_folder_a_prune_removes_makes_it_anew(tmp_path, monkeypatch):
    """The prune holds the folder's IN_USE alone while it renames the folder away: a process that
    opened it meanwhile waits, finds it gone and makes the folder anew (`cache_dir`)."""
    monkeypatch.setenv("GGTOOL_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
    monkeypatch.setattr(cache, "_dirs", {})
    monkeypatch.setattr(cache, "_checked", {})
    monkeypatch.setattr(cache, "_held", {})
    folder = tmp_path / "numba" / cache.kernel_key()
    folder.mkdir(parents=True, mode=0o700)
    os.chmod(tmp_path, 0o700)
    os.chmod(tmp_path / "numba", 0o700)
    fd = cache._open_in_use(str(folder))
    fcntl.flock(fd, fcntl.LOCK_EX)             # as a prune, before its rename
    got = []
    t = threading.Thread(target=lambda: got.append(cache._kernel_folder(None)))
    t.start()
    time.sleep(0.2)
    assert t.is_alive() and not got            # waiting for the lock
    os.rename(folder, tmp_path / "numba" / ".trash-x")
    os.close(fd)
    t.join(timeout=30)
    assert got == [str(folder)]
    assert folder.is_dir() and not (folder / "ready").exists()
    assert os.path.samestat(os.fstat(cache._held[str(folder)]), os.stat(folder / cache.IN_USE))
    os.close(cache._held.pop(str(folder)))


@pytest.mark.parametrize("what", ["link", "hard link", "folder", "fifo"])
def test_whatever_stands_at_a_folders_in_use_name_is_replaced_never_followed(tmp_path, what):
    folder = tmp_path / "kernels-k"
    folder.mkdir()
    target = tmp_path / "precious"
    target.write_text("keep")
    os.utime(target, (1e9, 1e9))
    at = folder / cache.IN_USE
    {"link": lambda: os.symlink(target, at), "hard link": lambda: os.link(target, at),
     "folder": lambda: (at / "inside").mkdir(parents=True), "fifo": lambda: os.mkfifo(at)}[what]()
    held = {}
    try:
        import unittest.mock

        with unittest.mock.patch.object(cache, "_held", held):
            assert cache._hold(str(folder)) is True
        assert at.is_file() and not at.is_symlink() and os.stat(at).st_nlink == 1
        assert target.read_text() == "keep" and os.stat(target).st_mtime == 1e9
        assert os.path.samestat(os.fstat(held[str(folder)]), os.stat(at))
    finally:
        for fd in held.values():
            os.close(fd)


def test_the_folders_are_looked_over_once_a_day(tmp_path):
    numba = tmp_path / "numba"
    now = time.time()
    current = _folder(numba, "kernels-current", 0, now)
    old = _folder(numba, "kernels-old", 40 * DAY, now)
    stamp = numba / cache.PRUNED
    stamp.write_text("")
    cache._prune_now(str(numba), str(current))
    assert old.is_dir()                                   # looked over within the day
    os.utime(stamp, (now - 2 * DAY, now - 2 * DAY))
    cache._prune_now(str(numba), str(current))
    assert not old.exists() and now - 60 < os.stat(stamp).st_mtime
    old = _folder(numba, "kernels-old", 40 * DAY, now)
    stamp.unlink()
    os.mkfifo(stamp)                                      # planted: replaced, never waited on
    cache._prune_now(str(numba), str(current))
    assert stamp.is_file() and not old.exists()


PRUNE = """
import sys
from ggtool.kernels import cache
print(len(cache.prune_kernel_folders(sys.argv[1], sys.argv[2])))
"""


def test_prunes_at_once_remove_each_folder_once_and_leave_nothing_behind(tmp_path):
    numba = tmp_path / "numba"
    now = time.time()
    current = _folder(numba, "kernels-current", 0, now)
    for i in range(24):
        _folder(numba, f"kernels-{i:02d}", 40 * DAY, now)
        for j in range(20):
            (numba / f"kernels-{i:02d}" / f"f{j}.nbc").write_bytes(b"x" * 4096)
    procs = [subprocess.Popen([sys.executable, "-c", PRUNE, str(numba), str(current)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, cwd=ROOT) for _ in range(4)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 and err == "" for p, (_, err) in zip(procs, outs)), outs
    assert sum(int(out) for out, _ in outs) == 24
    assert sorted(os.listdir(numba)) == ["kernels-current"]


USE = """
from ggtool.kernels import cache
print(cache.cache_dir())
"""


def test_a_process_using_the_cache_removes_old_folders_and_holds_its_own(tmp_path):
    """End to end: a process using ggtool's kernel cache looks the folders over (once a day) and
    stamps its own; a NUMBA_CACHE_DIR of the user's gets nothing of this written into it."""
    top = tmp_path / "cache"
    numba = top / "numba"
    now = time.time()
    old = _folder(numba, "kernels-old", 40 * DAY, now)
    for p in (top, numba):
        os.chmod(p, 0o700)
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    env["GGTOOL_CACHE_DIR"] = str(top)
    r = subprocess.run([sys.executable, "-c", USE], capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    mine = Path(r.stdout.strip())
    assert mine.parent == numba and (mine / cache.IN_USE).is_file() and (numba / cache.PRUNED).is_file()
    assert not old.exists() and sorted(os.listdir(numba)) == sorted([mine.name, cache.PRUNED])
    user = tmp_path / "users"
    old = _folder(numba, "kernels-old", 40 * DAY, now)
    os.utime(numba / cache.PRUNED, (now - 2 * DAY, now - 2 * DAY))
    r = subprocess.run([sys.executable, "-c", USE], capture_output=True, text=True, cwd=ROOT, timeout=120,
                       env={**env, "NUMBA_CACHE_DIR": str(user)})
    assert r.returncode == 0 and r.stdout.strip() == str(user), r.stderr
    assert os.listdir(user) == [] and old.is_dir()



def test_a_folder_a_process_makes_anew_while_two_prunes_take_the_old_one_is_kept(tmp_path, monkeypatch):
    """Prune B opens the old folder's IN_USE; prune A takes the folder; a process makes it anew and
    holds it; B's lock on the old file then succeeds, and B must see it no longer names the folder."""
    numba = tmp_path / "numba"
    now = time.time()
    current = _folder(numba, "kernels-current", 0, now)
    old = _folder(numba, "kernels-old", 40 * DAY, now)
    real = cache._open_in_use
    held = []

    def meanwhile(folder, made_at=None):
        fd = real(folder, made_at)
        if not held:
            held.append(None)
            assert cache.prune_kernel_folders(str(numba), str(current), now) == [str(old)]     # prune A
            os.makedirs(old / "ready")                                                          # a process
            mine = real(str(old))
            fcntl.flock(mine, fcntl.LOCK_SH)
            held[0] = mine
        return fd

    monkeypatch.setattr(cache, "_open_in_use", meanwhile)
    try:
        assert cache.prune_kernel_folders(str(numba), str(current), now) == []                 # prune B
        assert (old / "ready").is_dir() and os.path.samestat(os.fstat(held[0]), os.stat(old / cache.IN_USE))
    finally:
        if held and held[0] is not None:
            os.close(held[0])


def test_a_folder_a_prune_takes_between_its_checks_is_made_anew_not_bypassed(tmp_path, monkeypatch):
    monkeypatch.setenv("GGTOOL_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
    for name, value in (("_dirs", {}), ("_checked", {}), ("_held", {}), ("_private", [])):
        monkeypatch.setattr(cache, name, value)
    os.chmod(tmp_path, 0o700)
    folder = tmp_path / "numba" / cache.kernel_key()
    folder.mkdir(parents=True, mode=0o700)
    os.chmod(tmp_path / "numba", 0o700)
    real, taken = os.lstat, []

    def lstat(path, *args, **kwargs):
        if str(path) == str(folder) and not taken:           # right after mkdir found it there
            taken.append(os.rename(folder, tmp_path / "numba" / ".trash-x"))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(os, "lstat", lstat)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")                      # no "cache is not used" warning
        got = cache.cache_dir()
    monkeypatch.setattr(os, "lstat", real)
    assert taken and got == str(folder) and not cache.bypassed() and folder.is_dir()
    os.close(cache._held.pop(str(folder)))


def test_the_look_stamp_is_never_written_through_a_link_or_hard_link(tmp_path):
    numba = tmp_path / "numba"
    now = time.time()
    current = _folder(numba, "kernels-current", 0, now)
    precious = tmp_path / "precious"
    for make in (os.link, os.symlink):
        precious.write_text("keep")
        os.utime(precious, (now - 3 * DAY, now - 3 * DAY))
        make(precious, numba / cache.PRUNED)
        cache._prune_now(str(numba), str(current))
        st = os.lstat(numba / cache.PRUNED)
        assert precious.read_text() == "keep" and st.st_nlink == 1 and not (numba / cache.PRUNED).is_symlink()
        (numba / cache.PRUNED).unlink()


def test_the_stamp_is_made_before_the_look_and_a_stamp_from_the_future_is_stale(tmp_path, monkeypatch):
    numba = tmp_path / "numba"
    now = time.time()
    current = _folder(numba, "kernels-current", 0, now)
    seen = []
    monkeypatch.setattr(cache, "prune_kernel_folders", lambda *a: seen.append((numba / cache.PRUNED).is_file()))
    (numba / cache.PRUNED).write_text("")
    os.utime(numba / cache.PRUNED, (now + 2 * DAY, now + 2 * DAY))   # a clock that was ahead
    cache._prune_now(str(numba), str(current))
    assert seen == [True] and os.stat(numba / cache.PRUNED).st_mtime <= time.time()


def test_a_prune_takes_no_folder_used_since_it_looked(tmp_path):
    numba = tmp_path / "numba"
    now = time.time()
    folder = _folder(numba, "kernels-used", 0, now)           # its IN_USE stamped now
    assert not cache._remove_unused(str(numba), str(folder), now - 40 * DAY, now) and folder.is_dir()


def test_a_folder_an_older_ggtool_still_writes_into_is_kept(tmp_path):
    numba = tmp_path / "numba"
    now = time.time()
    current = _folder(numba, "kernels-current", 0, now)
    older = _folder(numba, "kernels-older", 40 * DAY, now, marked=False)
    os.utime(older / "ready", (now - 600, now - 600))          # a kernel it compiled 10 minutes ago
    assert cache.prune_kernel_folders(str(numba), str(current), now) == [] and older.is_dir()


def test_a_prune_that_holds_a_folder_for_long_leaves_it_unheld_by_nobody(tmp_path):
    """A stalled prune (stopped, a hung file system) holding IN_USE alone: the process gives up
    after a second (the caller makes the folder anew) rather than use it unheld or wait for ever."""
    folder = tmp_path / "kernels-k"
    folder.mkdir()
    fd = cache._open_in_use(str(folder))
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        import unittest.mock

        with unittest.mock.patch.object(cache, "_held", {}):
            t0 = time.monotonic()
            assert cache._hold(str(folder)) is False and not cache._held
            assert time.monotonic() - t0 < 10
    finally:
        os.close(fd)


STAMPED = """
import os, sys
from ggtool.kernels import cache
print(cache._hold(sys.argv[1]), os.stat(os.path.join(sys.argv[1], cache.IN_USE)).st_mtime, flush=True)
sys.stdin.read()
"""


def test_a_holder_stamps_its_folder_when_it_starts_and_when_it_ends(tmp_path):
    numba = tmp_path / "numba"
    now = time.time()
    folder = _folder(numba, "kernels-k", 40 * DAY, now)
    p = subprocess.Popen([sys.executable, "-c", STAMPED, str(folder)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True, cwd=ROOT)
    try:
        ok, stamped = p.stdout.readline().split()
        assert ok == "True" and float(stamped) > now - 60
        os.utime(folder / cache.IN_USE, (now - 40 * DAY, now - 40 * DAY))   # a run of 40 days
    finally:
        p.stdin.close()
        assert p.wait(timeout=60) == 0
    assert os.stat(folder / cache.IN_USE).st_mtime > now - 60


COMPILER = """
import os, sys
from ggtool.kernels import cache
print(cache.cache_dir(), flush=True)
sys.stdin.read()
"""


def test_a_compile_process_ggtool_starts_on_its_folder_holds_it_too(tmp_path):
    """`ggtool kernels --compile` and the background compiler get NUMBA_CACHE_DIR set to a folder of
    the cache: they hold it as their caller does, so no prune takes it while they write into it."""
    top = tmp_path / "cache"
    numba = top / "numba"
    now = time.time()
    current = _folder(numba, "kernels-current", 0, now)
    theirs = _folder(numba, "kernels-theirs", 40 * DAY, now)
    for p in (top, numba):
        os.chmod(p, 0o700)
    env = {**os.environ, "GGTOOL_CACHE_DIR": str(top), "NUMBA_CACHE_DIR": str(theirs)}
    p = subprocess.Popen([sys.executable, "-c", COMPILER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True, cwd=ROOT, env=env)
    try:
        assert p.stdout.readline().strip() == str(theirs)
        assert cache.prune_kernel_folders(str(numba), str(current), time.time() + 40 * DAY) == []
        assert theirs.is_dir()
    finally:
        p.stdin.close()
        assert p.wait(timeout=60) == 0


FORKED = """
import os, sys
from ggtool.kernels import cache
folder, other = sys.argv[1], sys.argv[2]
assert cache._hold(folder)
pid = os.fork()
if pid == 0:                                  # a forked worker: its copy of the fd closed, the number reused
    os.close(cache._held[folder])
    assert os.open(other, os.O_RDWR) == cache._held[folder]
    sys.exit(0)                               # its exit handlers run
os.waitpid(pid, 0)
print(os.stat(other).st_mtime)
"""


def test_a_forked_child_of_a_holder_stamps_nothing_at_its_exit(tmp_path):
    folder = tmp_path / "kernels-k"
    folder.mkdir()
    other = tmp_path / "other"
    other.write_text("")
    os.utime(other, (1e9, 1e9))
    r = subprocess.run([sys.executable, "-c", FORKED, str(folder), str(other)], capture_output=True, text=True,
                       cwd=ROOT, timeout=60)
    assert r.returncode == 0 and float(r.stdout) == 1e9, r.stderr
