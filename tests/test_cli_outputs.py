"""Outputs keep what they replace: `compute -o` and `quantize --force` onto what is not a plain
file (a FIFO, a character device, a socket, a symlink, a directory), and the temporary files a
writer that died left beside its output."""

from __future__ import annotations

import fcntl
import os
import select
import socket
import stat
import subprocess
import sys

import numpy as np
import pytest
from conftest import ROOT, STORIES, fails, ok

from ggtool.errors import GGToolError
from ggtool.tensor_io import atomic_path, destination, remove_stale_temporaries

RELU = ("compute", "relu(x)", "--tensor", "x=[1,-2,3]")
COPY = "import sys, shutil; shutil.copyfileobj(open(sys.argv[1], 'rb'), open(sys.argv[2], 'wb'))"
FORMATS = ["json", "npy", "gguf"]


def _regular_output(run, tmp_path, fmt: str) -> bytes:
    path = tmp_path / f"plain.{fmt}"
    ok(run(*RELU, "-o", path))
    data = path.read_bytes()
    path.unlink()
    return data


def _read_all(fd: int) -> bytes:
    """Everything a FIFO's writer has put in it and closed (the read end is non-blocking)."""
    out = b""
    while True:
        select.select([fd], [], [], 10.0)
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return out
        out += chunk


@pytest.mark.parametrize("fmt", FORMATS)
def test_output_onto_a_fifo_is_written_not_replaced(run, tmp_path, fmt):
    """-o FIFO: the reader gets exactly what a file would hold (.gguf too, which needs a file
    position: it is written aside and copied), and the FIFO is still a FIFO."""
    want = _regular_output(run, tmp_path, fmt)
    fifo = tmp_path / f"out.{fmt}"
    os.mkfifo(fifo)
    r = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)   # a reader first: the writer's open does not wait
    try:
        ok(run(*RELU, "-o", fifo))
        got = _read_all(r)
    finally:
        os.close(r)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert got == want
    assert sorted(os.listdir(tmp_path)) == [fifo.name]


def _char_device(path) -> None:
    try:
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))   # a second /dev/null
    except PermissionError:
        pytest.skip("making a device node needs root")


@pytest.mark.parametrize("fmt", FORMATS)
def test_output_onto_a_character_device_is_written_not_replaced(run, tmp_path, fmt):
    """-o onto a device node (here a /dev/null of our own in tmp_path) writes into the device:
    the node stays a character device."""
    dev = tmp_path / "null.out"
    _char_device(dev)
    ok(run(*RELU, "-o", dev, "--format", fmt))
    assert stat.S_ISCHR(os.lstat(dev).st_mode)
    assert os.listdir(tmp_path) == [dev.name]


def test_quantize_force_onto_a_fifo_and_a_device_writes_into_them(run, tmp_path):
    """quantize --force onto a FIFO streams the file into it (the bytes of a plain OUTPUT); onto a
    device, into the device. Both stay what they were."""
    plain = tmp_path / "plain.gguf"
    ok(run("quantize", STORIES, plain, "--quiet"))
    fifo, dev, got = tmp_path / "q.gguf", tmp_path / "null.gguf", tmp_path / "got"
    os.mkfifo(fifo)
    fails(run("quantize", STORIES, fifo, "--quiet"), "exists (use --force")
    # a reader that drains the FIFO into a file while quantize writes (more than a pipe holds)
    reader = subprocess.Popen([sys.executable, "-c", COPY, str(fifo), str(got)])
    try:
        ok(run("quantize", STORIES, fifo, "--force", "--quiet"))
        assert reader.wait(timeout=60) == 0
    finally:
        reader.kill()
    assert got.read_bytes() == plain.read_bytes()
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    got.unlink()
    _char_device(dev)
    ok(run("quantize", STORIES, dev, "--force", "--quiet"))
    assert stat.S_ISCHR(os.lstat(dev).st_mode)
    assert sorted(os.listdir(tmp_path)) == sorted([plain.name, fifo.name, dev.name])


def test_output_onto_dev_null_leaves_it_a_device(run, tmp_path):
    """The system's own /dev/null (as root, replacing it would break the machine): written to,
    never replaced. Its classification is checked first, so that a regression fails here before
    anything is written."""
    if not stat.S_ISCHR(os.stat("/dev/null").st_mode):
        pytest.skip("/dev/null is not a character device here")
    assert destination("/dev/null") == (True, "/dev/null")
    ok(run(*RELU, "-o", "/dev/null", "--format", "json"))
    ok(run("quantize", STORIES, "/dev/null", "--force", "--quiet"))
    assert stat.S_ISCHR(os.lstat("/dev/null").st_mode)


def test_output_onto_a_symlink_replaces_its_target_and_keeps_the_link(run, tmp_path, monkeypatch):
    """-o LINK2 -> LINK1 -> real/out.json: the target is replaced atomically, by a temporary file
    made beside it (in real/, so that the rename stays on its file system), with its mode; the
    links stay links."""
    real = tmp_path / "real"
    real.mkdir()
    target = real / "out.json"
    target.write_text("old\n")
    target.chmod(0o640)
    (tmp_path / "link1.json").symlink_to(target)
    (tmp_path / "link2.json").symlink_to("link1.json")
    renames = []
    real_replace = os.replace
    monkeypatch.setattr(os, "replace", lambda src, dst: renames.append((src, dst)) or real_replace(src, dst))
    ok(run(*RELU, "-o", tmp_path / "link2.json"))
    assert target.read_text() == "[1,0,3]\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    assert [(os.path.dirname(s), d) for s, d in renames] == [(str(real), str(target))]
    assert os.readlink(tmp_path / "link2.json") == "link1.json"
    assert os.readlink(tmp_path / "link1.json") == str(target)
    assert sorted(os.listdir(real)) == ["out.json"]
    assert sorted(os.listdir(tmp_path)) == ["link1.json", "link2.json", "real"]


def test_quantize_force_onto_a_symlink_replaces_its_target(run, tmp_path):
    target = tmp_path / "model.gguf"
    target.write_bytes(b"old")
    (tmp_path / "link.gguf").symlink_to(target.name)
    ok(run("quantize", STORIES, tmp_path / "link.gguf", "--force", "--quiet"))
    assert os.path.islink(tmp_path / "link.gguf")
    assert target.read_bytes()[:4] == b"GGUF"
    assert sorted(os.listdir(tmp_path)) == ["link.gguf", "model.gguf"]


def test_output_onto_a_dangling_symlink_creates_its_target(run, tmp_path):
    """A link to nothing yet: its target is created, as a shell's `>` does; the link stays."""
    (tmp_path / "link.npy").symlink_to("made.npy")
    ok(run(*RELU, "-o", tmp_path / "link.npy"))
    assert os.path.islink(tmp_path / "link.npy")
    assert np.load(tmp_path / "made.npy").tolist() == [1, 0, 3]


def test_output_onto_a_loop_of_links_or_a_directory_is_a_clean_error(run, tmp_path):
    (tmp_path / "a.json").symlink_to("b.json")
    (tmp_path / "b.json").symlink_to("a.json")
    fails(run(*RELU, "-o", tmp_path / "a.json"), "cannot write", "a.json", "symbolic links")
    (tmp_path / "d.json").mkdir()
    fails(run(*RELU, "-o", tmp_path / "d.json"), "is a directory", code=2)
    fails(run("quantize", STORIES, tmp_path / "d.json", "--force"), "is a directory", code=2)
    with pytest.raises(GGToolError, match="d.json: it is a directory"), atomic_path(str(tmp_path / "d.json")):
        pass
    assert sorted(os.listdir(tmp_path)) == ["a.json", "b.json", "d.json"]


def test_output_onto_a_socket_is_a_clean_error_and_stays_a_socket(run, tmp_path):
    """A socket cannot be opened as a file: the error a shell's `>` gives, the socket untouched."""
    path = tmp_path / "s.json"
    s = socket.socket(socket.AF_UNIX)
    try:
        s.bind(str(path))
        fails(run(*RELU, "-o", path), "s.json", "No such device or address")
        assert stat.S_ISSOCK(os.lstat(path).st_mode)
    finally:
        s.close()


def test_a_fifo_whose_reader_leaves_is_a_clean_error(tmp_path):
    """The reader of a -o FIFO goes away mid-output: one `Error:` line naming the output, exit 1
    (not the quiet 141 of a closed stdout: ggtool's own stdout is fine)."""
    fifo = tmp_path / "out.json"
    os.mkfifo(fifo)
    r = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    p = subprocess.Popen([sys.executable, "-m", "ggtool", "compute", "mul_mat(a, b)", "--tensor", "a=f32[256,1024]",
                          "--tensor", "b=f32[256,1024]", "-o", str(fifo)], cwd=ROOT, stderr=subprocess.PIPE)
    try:
        select.select([r], [], [], 60.0)
        assert os.read(r, 10)   # its first bytes: ggtool has opened the FIFO and writes 4 MiB
    finally:
        os.close(r)
    _, err = p.communicate(timeout=60)
    assert (p.returncode, err.decode()) == (1, f"Error: {fifo}: Broken pipe\n")
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_stale_temporaries_of_dead_writers_are_removed_and_nothing_else(run, tmp_path):
    """Before writing NAME, the `.NAME.PID.XXXXXXXX.tmp` files of writers that died are removed:
    PID dead and the file's lock free. Kept: a live writer's (its pid alive; or, pid dead, its
    lock held, as by a writer on another machine sharing the directory), another output's, names
    that are not quite ours, a symlink of our pattern (never followed, never removed)."""
    dead, alive = _dead_pid(), os.getpid()
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    names = {
        f".out.json.{dead}.abcd_123.tmp": False,        # removed
        f".out.json.{dead}.efgh4567.tmp": False,        # removed
        f".out.json.{alive}.abcd_123.tmp": True,
        f".out.json.{dead}.locked00.tmp": True,
        f".other.json.{dead}.abcd_123.tmp": True,
        f".out.json.{dead}.abcd_123.tmp.bak": True,
        f".out.json.{dead}.short.tmp": True,
        f"out.json.{dead}.abcd_123.tmp": True,
    }
    for n in names:
        (tmp_path / n).write_text("partial")
    (tmp_path / f".out.json.{dead}.link0000.tmp").symlink_to(victim)
    locked = os.open(tmp_path / f".out.json.{dead}.locked00.tmp", os.O_RDONLY)
    fcntl.flock(locked, fcntl.LOCK_EX)
    try:
        ok(run(*RELU, "-o", tmp_path / "out.json"))
    finally:
        os.close(locked)
    kept = {n for n, keep in names.items() if keep} | {"victim", "out.json", f".out.json.{dead}.link0000.tmp"}
    assert set(os.listdir(tmp_path)) == kept
    assert victim.read_text() == "keep me"
    assert remove_stale_temporaries(str(tmp_path), "out.json") == [f".out.json.{dead}.locked00.tmp"]


def test_a_temporary_output_carries_the_writers_pid_and_is_locked(tmp_path):
    """While the block writes it, the temporary file is `.NAME.PID.XXXXXXXX.tmp` and locked: the
    stale-file clean-up of a concurrent writer leaves it alone, even were PID to look dead."""
    with atomic_path(str(tmp_path / "x.json")) as tmp:
        name = os.path.basename(tmp)
        assert name.startswith(f".x.json.{os.getpid()}.") and name.endswith(".tmp")
        fd = os.open(tmp, os.O_RDONLY)
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)
        with open(tmp, "w") as f:
            f.write("[1]\n")
    assert os.listdir(tmp_path) == ["x.json"]
