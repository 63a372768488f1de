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
    or where `marked` is false, as an older ggtool left it: the folder's own time)."""
    path = numba / name
    (path / "ready").mkdir(parents=True)
    (path / "ready" / "dot:Q4_0.cpython-311").write_text("")
    if marked:
        (path / cache.IN_USE).write_text("")
        os.utime(path / cache.IN_USE, (now - used_ago, now - used_ago))
    os.utime(path, (now - used_ago, now - used_ago))
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

