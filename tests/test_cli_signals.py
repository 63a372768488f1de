"""The command line in shell pipelines, each case in a real process: a reader that closes the pipe
early (exit 141, nothing said), SIGTERM and SIGHUP (exit 143 and 129, one line, like Ctrl-C's 130),
`timeout`, a signal at any moment from ggtool's first line to its last (the imports, a finalizer,
the exit), a caller killed by SIGKILL, alone or with its workers. Every case checks the exit
status, stderr, /dev/shm and the processes left behind.

Each ggtool runs in a session of its own (start_new_session), so "left behind" is exact: no process
of that session (its workers) may outlive it, and no segment named after its
pid may stay in /dev/shm. Signals are sent once the compute is provably under way (the context is
in shared memory and a worker has since been busy), never after a fixed sleep.
"""

from __future__ import annotations

import os
import select
import shutil
import signal
import subprocess
import sys
import time

import pytest
from conftest import ROOT, STORIES

from ggtool.interrupts import ENDING_SIGNALS
from ggtool.pool import shm
from ggtool.pool.worker import NAME

PY = [sys.executable, "-m", "ggtool"]

# Long (3000 products of 65536-long rows: over 10 s on one core) but made of short nodes (a few ms
# each), so that a signal is acted on at once; its context is ~130 MB.
SLOW = ["compute", "s = mul_mat(a, b); for i in range(3000): s = add(s, mul_mat(a, b)); end; sum(s)",
        "--tensor", "a=f32[65536,64]", "--tensor", "b=f32[65536,64]", "--graph-size", "8192"]
# Its output is 4 MiB in every format, far more than a pipe holds.
BIG = ["compute", "mul_mat(a, b)", "--tensor", "a=f32[256,1024]", "--tensor", "b=f32[256,1024]"]

# `ggtool quantize ARGS` with every piece slowed down, so that it can be caught mid-way
SLOW_QUANTIZE = """
import functools, sys, time, ggtool.quantize_model as QM
def slow(*a, **k):
    time.sleep(0.05)
    return QM.convert_rows(*a, **k)
QM.run_quantization = functools.partial(QM.run_quantization, converter=slow)   # the public collaborator
sys.argv[1:1] = ["quantize"]
from ggtool.commands import main
main()
"""

MESSAGES = {signal.SIGINT: "Interrupted.", signal.SIGTERM: "Terminated.", signal.SIGHUP: "Hangup."}
WAIT = 60.0     # bound on any wait for a process to get somewhere (a loaded 2-core machine)


_started: list[subprocess.Popen] = []


def popen(cmd: list[str], **kw) -> subprocess.Popen:
    """`cmd` in a session of its own (its pid is the session's id), stdout and stderr piped by
    default; whatever a failed test leaves running is stopped after it (`_stop_leftovers`)."""
    kw.setdefault("stdout", subprocess.PIPE)
    kw.setdefault("stderr", subprocess.PIPE)
    p = subprocess.Popen(cmd, cwd=ROOT, start_new_session=True, **kw)
    _started.append(p)
    return p


def start(args, code: str | None = None, **kw) -> subprocess.Popen:
    """ggtool ARGS (or Python `code` with ARGS as its argv) in a session of its own."""
    return popen([sys.executable, "-c", code, *args] if code else [*PY, *args], **kw)


@pytest.fixture(autouse=True)
def _stop_leftovers():
    """After each test, nothing of its processes may keep running, even when it failed half-way:
    the process it started is killed (its workers follow it, and unlink its segments); what is
    still there 10 s later is killed with its whole session."""
    _started.clear()
    yield
    for p in _started:
        if p.poll() is None:
            p.kill()
            p.wait()
        end = time.monotonic() + 10.0
        while session(p.pid) and time.monotonic() < end:
            time.sleep(0.05)
        if session(p.pid):
            os.killpg(p.pid, signal.SIGKILL)
        for f in (p.stdout, p.stderr):
            if f is not None:
                f.close()


def _stat(pid: int) -> list[str] | None:
    """/proc/PID/stat after the command name: [state, ppid, pgrp, session, ..., utime, stime, ...]."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def session(sid: int) -> list[int]:
    """Live (not zombie) processes of session `sid`."""
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            st = _stat(int(d))
            if st is not None and int(st[3]) == sid and st[0] != "Z":
                out.append(int(d))
    return out


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def workers(sid: int) -> list[int]:
    return [p for p in session(sid) if _comm(p) == NAME]


def segments(pid: int) -> list[str]:
    return [n for n in shm.list_segments() if n.startswith(f"{shm.PREFIX}{pid}_")]


def wait_for(what, timeout: float = WAIT, message: str = ""):
    end = time.monotonic() + timeout
    while True:
        got = what()
        if got or time.monotonic() > end:
            assert got, message or f"gave up waiting for {what}"
            return got
        time.sleep(0.02)


def cpu_ticks(pid: int) -> int:
    st = _stat(pid)
    return int(st[11]) + int(st[12]) if st else 0


def wait_computing(pid: int, sid: int) -> list[int]:
    """Wait until ggtool `pid` computes on its pool: its context is in shared memory (a second
    segment after the pool's own) and a worker has since used 0.3 s of CPU. Returns the workers."""
    wait_for(lambda: len(segments(pid)) >= 2, message="the compute did not start")
    ws = wait_for(lambda: workers(sid), message="no worker process")
    t0 = {w: cpu_ticks(w) for w in ws}
    wait_for(lambda: any(cpu_ticks(w) - t0[w] >= 30 for w in ws), message="the workers are not computing")
    return ws


def finish(p: subprocess.Popen, timeout: float = WAIT) -> tuple[int, str]:
    """(exit status, stderr) once the process has ended (within `timeout`); its pipes are read to
    their end, so whatever outlived it with them open (a worker) is gone too."""
    _, err = p.communicate(timeout=timeout)
    return p.returncode, (err or b"").decode()


def assert_nothing_left(sid: int, pid: int | None = None, caller_stopped_them: bool = True) -> None:
    """No process of the session, no segment of the ggtool process `pid` (default: the session's).
    Workers are stopped and reaped by the caller before it exits (`caller_stopped_them`): none may
    be there even a moment after; otherwise (a SIGKILLed caller) they may take a little while."""
    if caller_stopped_them:
        assert workers(sid) == [], "workers outlived the caller"
    end = time.monotonic() + 10.0
    while session(sid) and time.monotonic() < end:
        time.sleep(0.02)
    assert session(sid) == [], "processes left behind"
    assert segments(sid if pid is None else pid) == [], "segments left in /dev/shm"


def closed_pipe() -> int:
    """The write end of a pipe whose reader is already gone (as `| true` leaves it)."""
    r, w = os.pipe()
    os.close(r)
    return w


# -- a reader that stops early ------------------------------------------------------------------------
@pytest.mark.parametrize("threads", ["1", "2"])
@pytest.mark.parametrize("fmt", ["json", "npy", "gguf"])
def test_reader_closing_the_pipe_early_ends_quietly(fmt, threads):
    """`ggtool compute ... | head -c 10`: 141, nothing on stderr, the pool (--threads 2) gone."""
    p = start([*BIG, "--format", fmt, "--threads", threads])
    head = p.stdout.read(10)
    p.stdout.close()
    rc, err = finish(p)
    assert len(head) == 10
    assert (rc, err) == (141, "")
    assert_nothing_left(p.pid)


@pytest.mark.parametrize("args", [
    ["compute", "mul_mat(a, b)", "--tensor", "a=[[1,2]]", "--tensor", "b=[[3,4]]"],
    ["compute", "relu(x)", "--tensor", "x=[1,2]", "--format", "npy"],
    ["inspect-graph", "relu(x)", "--tensor", "x=f32[4]"],
    ["inspect-graph", "relu(x)", "--tensor", "x=f32[4]", "--json"],
    ["plan", "relu(x)", "--tensor", "x=f32[4]"],
    ["ops"],
    ["inspect", str(STORIES)],
    ["compare", str(STORIES), str(STORIES), "--json"],
    ["quantize", str(STORIES), "unused.gguf", "--dry-run"],
    ["--help"],
    ["--version"],
    ["plan", "--help"],
], ids=lambda a: " ".join(a[:2]))
def test_every_command_ends_quietly_on_a_closed_stdout(args):
    """Even a line's worth of output fails on a pipe nobody reads: every command, every format,
    the group's own --help/--version, end with 141 and say nothing."""
    w = closed_pipe()
    try:
        p = start(args, stdout=w)
    finally:
        os.close(w)
    rc, err = finish(p)
    assert (rc, err) == (141, "")
    assert_nothing_left(p.pid)


class _ShortWriter:
    """A raw stream that takes at most `step` bytes per write, as a pipe does when its reader
    leaves mid-write (and as stdout's raw layer under PYTHONUNBUFFERED passes on)."""

    def __init__(self, step: int):
        self.step, self.data = step, bytearray()

    def write(self, b) -> int:
        n = min(self.step, len(b))
        self.data += bytes(b[:n])
        return n

    def flush(self) -> None:
        pass


def test_binary_stdout_writes_the_rest_of_a_short_write():
    """A short write is followed by another for the rest (which, on a pipe whose reader left,
    raises EPIPE): never a .npy cut short with exit 0."""
    from ggtool.commands._common import _ByteWriter

    raw = _ShortWriter(1000)
    data = bytes(range(256)) * 40
    assert _ByteWriter(raw).write(data) == len(data)
    assert bytes(raw.data) == data


@pytest.mark.parametrize("unbuffered", ["1", ""])
def test_stdout_is_buffered_under_pythonunbuffered(unbuffered):
    """PYTHONUNBUFFERED gives stdout a raw byte layer whose short writes TextIOWrapper ignores;
    the command line puts a buffered one under it (writes all or raises), text still written through."""
    code = ("import sys; from ggtool.commands import buffered_stdout; buffered_stdout(); "
            "print(type(sys.stdout.buffer).__name__, sys.stdout.write_through)")
    env = {**os.environ, "PYTHONUNBUFFERED": unbuffered}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    assert out.split()[0] == "BufferedWriter"
    assert out.split()[1] == ("True" if unbuffered else "False")


def test_closed_stderr_while_the_pool_starts():
    """`-v` reports each load on stderr while the workers start: a closed stderr ends it there,
    with no worker and no segment left."""
    w = closed_pipe()
    try:
        p = start([*BIG, "-v", "--threads", "2"], stdout=subprocess.DEVNULL, stderr=w)
    finally:
        os.close(w)
    assert finish(p)[0] == 141
    assert_nothing_left(p.pid)


def test_closed_stderr_mid_quantize_removes_the_output(tmp_path):
    """`ggtool quantize ... 2>&1 | head -1`: the per-tensor lines go to a reader that left after
    the first; the next one ends the command with 141 and no file, temporary or not."""
    p = start([str(STORIES), str(tmp_path / "q.gguf"), "-t", "2"], code=SLOW_QUANTIZE, stdout=subprocess.DEVNULL)
    first = p.stderr.readline()
    p.stderr.close()
    assert b"converting" in first or b"size =" in first, first
    assert finish(p)[0] == 141
    assert os.listdir(tmp_path) == []
    assert_nothing_left(p.pid)


# -- SIGTERM, SIGHUP, timeout -------------------------------------------------------------------------
@pytest.mark.parametrize("sig, to_group", [(signal.SIGTERM, False), (signal.SIGTERM, True),
                                           (signal.SIGHUP, True)],
                         ids=["SIGTERM-caller", "SIGTERM-group", "SIGHUP-group"])
def test_signal_mid_compute(sig, to_group):
    """`kill PID`, or a signal to the whole process group (a closed terminal's SIGHUP): the workers
    stopped, the segments unlinked by ggtool, 128 + sig, one line."""
    p = start([*SLOW, "--threads", "2"], stdout=subprocess.DEVNULL)
    ws = wait_computing(p.pid, p.pid)
    t0 = time.monotonic()
    (os.killpg if to_group else os.kill)(p.pid, sig)
    rc, err = finish(p)
    took = time.monotonic() - t0
    assert rc == 128 + sig, err
    assert err == MESSAGES[sig] + "\n"
    assert took < 15.0 and ws
    assert_nothing_left(p.pid)


def _child_of(pid: int) -> int | None:
    """The (first) process whose parent is `pid`."""
    for q in session(pid):
        st = _stat(q)
        if st is not None and int(st[1]) == pid:
            return q
    return None


@pytest.mark.skipif(shutil.which("timeout") is None, reason="needs coreutils' timeout")
def test_timeout_mid_compute():
    """`timeout N ggtool compute ...` as it expires: timeout's own SIGALRM makes it act exactly as
    on expiry (SIGTERM to ggtool, then to the group), deterministically mid-compute."""
    p = popen(["timeout", "300", *PY, *SLOW, "--threads", "2"], stdout=subprocess.DEVNULL)
    ggtool = wait_for(lambda: _child_of(p.pid))
    wait_computing(ggtool, p.pid)
    os.kill(p.pid, signal.SIGALRM)
    rc, err = finish(p)
    assert rc == 124
    assert err == "Terminated.\n"
    assert_nothing_left(p.pid, ggtool)


@pytest.mark.skipif(shutil.which("timeout") is None, reason="needs coreutils' timeout")
def test_timeout_real_expiry():
    """The plain use, with a real deadline: wherever it lands (the pool starting, the inputs
    loading, the compute), the outcome is the same."""
    p = popen(["timeout", "2", *PY, *SLOW, "--threads", "2"], stdout=subprocess.DEVNULL)
    ggtool = wait_for(lambda: _child_of(p.pid))
    rc, err = finish(p)
    assert rc == 124
    assert err in ("Terminated.\n", "")   # "": it expired before Python had got to ggtool's code
    assert_nothing_left(p.pid, ggtool)


# the caller holds SIGTERM back (as while it imports: interrupts._defer) for longer than its workers'
# grace: they end first, on the same signal
HELD_PAST_THE_GRACE = """
import sys
import ggtool.interrupts as I
I.IMPORT_GRACE = 60.0
I._importing = lambda frame: True
sys.argv[1:1] = ["compute"]
from ggtool.commands import main
main()
"""


def test_a_worker_ended_by_the_signal_its_caller_holds_back_is_the_signal_not_a_death():
    """CI saw `timeout 2 ggtool compute ...` print "Error: worker 1 (pid ...) died (exited on SIGTERM)"
    before "Terminated.": the caller held the signal back while it imported (a first-ever run compiles
    mid-compute) and its worker, given the same signal, ended itself when its grace was over. The
    caller now ends on the signal it has pending: 143 and its one line."""
    from ggtool.pool.worker import TERM_GRACE

    p = start([*SLOW[1:], "--threads", "2"], code=HELD_PAST_THE_GRACE, stdout=subprocess.DEVNULL)
    ws = wait_computing(p.pid, p.pid)
    t0 = time.monotonic()
    os.killpg(p.pid, signal.SIGTERM)      # the caller and its worker, as `timeout` or a terminal does
    rc, err = finish(p)
    assert (rc, err) == (143, "Terminated.\n")
    assert TERM_GRACE <= time.monotonic() - t0 < TERM_GRACE + 10 and ws
    assert_nothing_left(p.pid)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
def test_signal_mid_quantize(tmp_path, sig):
    """quantize on two threads: 128 + sig, the temporary output removed, one line at the end."""
    p = start([str(STORIES), str(tmp_path / "q.gguf"), "-t", "2"], code=SLOW_QUANTIZE, stdout=subprocess.DEVNULL)
    line = p.stderr.readline()
    wait_for(lambda: any(n.endswith(".tmp") for n in os.listdir(tmp_path)), message="no temporary output")
    assert b"converting" in line or b"size =" in line, line
    os.kill(p.pid, sig)
    rc, err = finish(p)
    assert rc == 128 + sig
    assert err.splitlines()[-1] == MESSAGES[sig]
    assert "Traceback" not in err
    assert os.listdir(tmp_path) == []
    assert_nothing_left(p.pid)


# Signals at the awkward moments, placed exactly by wrapping the function that runs at that moment.
AT_SPAWN = """
import os, signal, sys, time
if {forked}:                      # as `ggtool` does, first thing: workers forked from this process
    from ggtool.pool import launch
    launch.prestart(3)
import ggtool.pool.caller as C
from ggtool.pool.fork import ForkedProcess
real = C.spawn
def spawn(ctl, slot):
    w = real(ctl, slot)
    assert isinstance(w.proc, ForkedProcess) == {forked}
    end = time.monotonic() + 10   # until the new worker's Python is up (it catches SIGINT): importing
    while time.monotonic() < end:
        with open(f"/proc/{{w.pid}}/status") as f:
            caught = next(int(line.split()[1], 16) for line in f if line.startswith("SigCgt"))
        if caught & (1 << (signal.SIGINT - 1)):
            break
        time.sleep(0.002)
    os.killpg(0, {sig})           # like a terminal or `timeout`: the whole process group
    return w
C.spawn = spawn
sys.argv[1:1] = ["compute"]
from ggtool.commands import main
main()
"""

AT_RENAME = """
import os, signal
real = os.replace
def replace(src, dst):
    if {before}:
        signal.raise_signal(signal.SIGTERM)   # handled at the next line: the rename is not made
    real(src, dst)
    signal.raise_signal(signal.SIGTERM)       # the rename is made, then the signal lands
os.replace = replace
import sys; sys.argv[1:1] = ["compute"]
from ggtool.commands import main
main()
"""


@pytest.mark.parametrize("forked", [False, True], ids=["interpreter", "forked"])
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
def test_signal_to_the_group_while_the_pool_starts(sig, forked):
    """A signal to the whole group as the first of two workers starts: the new worker, still
    importing (or, forked, still closing the caller's descriptors), is unharmed (it starts with the
    signals blocked: no KeyboardInterrupt traceback from it); the caller stops the worker, unlinks
    its segment and exits 128 + sig with its one line."""
    p = start(["mul_mat(a, b)", "--tensor", "a=[[1,2]]", "--tensor", "b=[[3,4]]", "--threads", "3"],
              code=AT_SPAWN.format(sig=int(sig), forked=forked))
    rc, err = finish(p)
    assert (rc, err) == (128 + sig, MESSAGES[sig] + "\n")
    assert_nothing_left(p.pid)


@pytest.mark.parametrize("before", [True, False], ids=["before-rename", "after-rename"])
def test_sigterm_while_the_output_is_renamed(tmp_path, before):
    """-o FILE is a temporary file renamed over FILE: a SIGTERM just before the rename leaves the old
    file, one just after it the new one; never a temporary file, always 143."""
    out = tmp_path / "y.json"
    out.write_text("old\n")
    p = start(["relu(x)", "--tensor", "x=[1,-2]", "-o", str(out)], code=AT_RENAME.format(before=before))
    rc, err = finish(p)
    assert (rc, err) == (143, "Terminated.\n")
    assert os.listdir(tmp_path) == ["y.json"]
    assert out.read_text() == ("old\n" if before else "[1,0]\n")
    assert_nothing_left(p.pid)


def test_sigterm_to_a_worker_alone():
    """A SIGTERM for one worker only (`kill WORKER`): its caller did not get it, so after a grace
    period the worker ends itself, and the caller reports a worker that died: exit 1, one line."""
    from ggtool.pool.worker import TERM_GRACE

    p = start([*SLOW, "--threads", "2"], stdout=subprocess.DEVNULL)
    (w,) = wait_computing(p.pid, p.pid)
    t0 = time.monotonic()
    os.kill(w, signal.SIGTERM)
    rc, err = finish(p)
    assert rc == 1 and time.monotonic() - t0 >= TERM_GRACE
    assert err.startswith(f"Error: worker 1 (pid {w}) died (exited on SIGTERM) while computing node "), err
    assert len(err.splitlines()) == 1
    assert_nothing_left(p.pid)


def test_sigkill_of_the_caller_leaves_nothing():
    """SIGKILL cannot be handled: the workers see their life pipe close, unlink the segments the
    caller had no chance to (shm.remove_orphans), and exit."""
    p = start([*SLOW, "--threads", "2"], stdout=subprocess.DEVNULL)
    ws = wait_computing(p.pid, p.pid)
    os.kill(p.pid, signal.SIGKILL)
    rc, err = finish(p)
    assert rc == -signal.SIGKILL
    assert ws and "Traceback" not in err
    assert_nothing_left(p.pid, caller_stopped_them=False)


def test_a_second_signal_while_ending_is_not_raised():
    """The first signal raises Interrupted; another one soon after (Ctrl-C pressed twice, `timeout`
    signalling the child and then its group) must not cut the clean-up short."""
    code = ("import signal\n"
            "from ggtool.commands import Interrupted, install_signal_handlers\n"
            "install_signal_handlers()\n"
            "try:\n"
            "    signal.raise_signal(signal.SIGTERM)\n"
            "except Interrupted as e:\n"
            "    print(e.signum, flush=True)\n"
            "signal.raise_signal(signal.SIGINT)\n"
            "signal.raise_signal(signal.SIGHUP)\n"
            "print('cleaned up')\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=WAIT)
    assert (r.returncode, r.stdout, r.stderr) == (0, "15\ncleaned up\n", "")


@pytest.mark.skipif(shutil.which("nohup") is None, reason="needs coreutils' nohup")
def test_nohup_keeps_sighup_ignored():
    """`nohup ggtool ...`: the terminal's SIGHUP stays ignored (the compute goes on); SIGTERM still
    ends it the usual way."""
    p = popen(["nohup", *PY, *SLOW, "--threads", "2"], stdout=subprocess.DEVNULL)
    ws = wait_computing(p.pid, p.pid)
    os.killpg(p.pid, signal.SIGHUP)
    t0 = {w: cpu_ticks(w) for w in ws}
    wait_for(lambda: any(cpu_ticks(w) - t0[w] >= 30 for w in ws), message="the compute stopped on SIGHUP")
    assert p.poll() is None
    os.kill(p.pid, signal.SIGTERM)
    rc, err = finish(p)
    assert (rc, err) == (143, "Terminated.\n")
    assert_nothing_left(p.pid)


# -- from the first line to the last ------------------------------------------------------------------
TINY = ["compute", "mul_mat(a, b)", "--tensor", "a=[[1,2]]", "--tensor", "b=[[3,4]]", "--threads", "2"]
PF_EXITING = 0x4   # /proc/PID/stat flags: the process has called exit (the kernel is tearing it down)


# `ggtool` as its console script runs it, saying on a pipe when its main() starts its work: as it
# calls launch.prestart, before anything heavy is imported (and after it has installed its handlers)
AT_FIRST_LINE = """
import os, sys
import ggtool.pool.launch as L
fd, real = int(sys.argv.pop(1)), L.prestart
def prestart(n_threads):
    os.write(fd, b".")
    real(n_threads)
L.prestart = prestart
from ggtool.commands import console
console()
"""


def start_at_first_line(args: list[str], **kw) -> subprocess.Popen:
    """ggtool ARGS, returned as its main() starts its work (the Python interpreter has started,
    ggtool's package is loaded, the imports of numpy, click and the commands are to come)."""
    r, w = os.pipe()
    try:
        p = start([str(w), *args], code=AT_FIRST_LINE, pass_fds=(w,), **kw)
    finally:
        os.close(w)
    try:
        select.select([r], [], [], WAIT)
        assert os.read(r, 1) == b".", "ggtool never started"
    finally:
        os.close(r)
    return p


@pytest.mark.parametrize("fork", ["1", "0"], ids=["forked-worker", "interpreter-worker"])
def test_a_signal_at_any_moment_ends_ggtool_cleanly(tmp_path, fork):
    """SIGINT, SIGTERM, SIGHUP to the whole group 0 to 150 ms after ggtool's main() has started:
    in the imports, as the worker starts (forked; or launched first thing, GGTOOL_FORK=0), during
    the compute, the write, the exit. Every time 128 + the signal, its one line, no worker, no
    segment, no temporary file (a signal after the rename leaves the new output)."""
    out = tmp_path / "y.json"
    n = 12
    for i in range(n):
        sig = ENDING_SIGNALS[i % 3]
        delay = 0.15 * i / (n - 1)
        p = start_at_first_line([*TINY, "-o", str(out)], env={**os.environ, "GGTOOL_FORK": fork})
        time.sleep(delay)
        st = _stat(p.pid)
        if st is None or st[0] == "Z" or int(st[6]) & PF_EXITING:   # over already (a fast machine)
            assert finish(p) == (0, "")
            continue
        os.killpg(p.pid, sig)
        rc, err = finish(p)
        where = f"{sig.name} {delay * 1000:.0f} ms after ggtool's main() started"
        assert (rc, err) == (128 + sig, MESSAGES[sig] + "\n"), where
        assert_nothing_left(p.pid)
        assert [f for f in os.listdir(tmp_path) if f != out.name] == [], where


# a signal raised as `import click` starts (ggtool.__main__ imports it after installing its handlers)
IN_AN_IMPORT = """
import signal, sys

class Finder:
    def find_spec(self, name, path=None, target=None):
        if name == "click":
            signal.raise_signal({sig})
        return None

sys.meta_path.insert(0, Finder())
sys.argv[1:] = sys.argv[1:]
from ggtool.__main__ import main
main()
"""


@pytest.mark.parametrize("sig", ENDING_SIGNALS, ids=lambda s: s.name)
def test_a_signal_in_the_middle_of_an_import_is_one_line(sig):
    """A signal while ggtool is still importing (here exactly as click starts to load, after the
    prestarted worker of GGTOOL_FORK=0 --threads 2 was launched): no KeyboardInterrupt traceback
    from inside the import machinery; the worker stopped, 128 + sig, one line."""
    p = start(TINY, code=IN_AN_IMPORT.format(sig=int(sig)), env={**os.environ, "GGTOOL_FORK": "0"})
    rc, err = finish(p)
    assert (rc, err) == (128 + sig, MESSAGES[sig] + "\n")
    assert_nothing_left(p.pid)


# a signal while the running command imports, inside an import that a C extension makes and that
# prints and replaces whatever it raises (as numpy's import_array does in numba's or numpy.linalg's
# extensions: "numpy._core.multiarray failed to import")
IN_AN_EXTENSIONS_IMPORT = """
import importlib.abc, importlib.util, signal, sys, time, traceback
import ggtool.commands.compute as C

class Loader(importlib.abc.Loader):
    def create_module(self, spec):
        return None
    def exec_module(self, module):
        if module.__name__ == "ext":
            try:
                import inner
            except BaseException:
                traceback.print_exc()
                raise ImportError("ext failed to import")
        else:
            signal.raise_signal({sig})
            time.sleep(0.05)

class Finder:
    def find_spec(self, name, path=None, target=None):
        if name in ("ext", "inner"):
            return importlib.util.spec_from_loader(name, Loader())
        return None

sys.meta_path.insert(0, Finder())
real = C.write_outputs
def write_outputs(*a, **k):
    import ext
    return real(*a, **k)
C.write_outputs = write_outputs
from ggtool.__main__ import main
main()
"""


@pytest.mark.parametrize("sig", ENDING_SIGNALS, ids=lambda s: s.name)
def test_a_signal_while_the_command_imports_is_raised_after_the_import(tmp_path, sig):
    """A signal while the running command imports a module is raised once the import is over: raised
    inside it, an extension's import would print the traceback and fail with an ImportError (CI saw
    `numpy._core.multiarray failed to import` and a traceback for a SIGHUP 68 ms into a compute)."""
    out = tmp_path / "y.json"
    p = start([*TINY, "-o", str(out)], code=IN_AN_EXTENSIONS_IMPORT.format(sig=int(sig)))
    rc, err = finish(p)
    assert (rc, err) == (128 + sig, MESSAGES[sig] + "\n")
    assert [f for f in os.listdir(tmp_path) if f != out.name] == []
    assert_nothing_left(p.pid)


# an import that does not end: the signal is raised inside it once the grace is over
IMPORT_NEVER_ENDS = """
import importlib.abc, importlib.util, signal, sys, time
import ggtool.interrupts as I
I.IMPORT_GRACE = 0.2
I.install()

class Loader(importlib.abc.Loader):
    def create_module(self, spec):
        return None
    def exec_module(self, module):
        signal.raise_signal(signal.SIGTERM)
        global t0
        t0 = time.monotonic()
        while True:
            time.sleep(0.01)

class Finder:
    def find_spec(self, name, path=None, target=None):
        return importlib.util.spec_from_loader(name, Loader()) if name == "stuck" else None

sys.meta_path.insert(0, Finder())
try:
    import stuck
except I.Interrupted as e:
    print(e.signum, round(time.monotonic() - t0, 1))
"""


def test_a_signal_in_an_import_that_never_ends_is_raised_after_the_grace():
    p = popen([sys.executable, "-c", IMPORT_NEVER_ENDS])
    out, err = p.communicate(timeout=WAIT)
    signum, waited = out.decode().split()
    assert (p.returncode, int(signum), err) == (0, signal.SIGTERM, b"")
    assert 0.2 <= float(waited) < 1.5


# SIGTERM as the command is over: from an exit handler (the last clean-ups run there)
AT_EXIT = """
import atexit, os, signal, sys
atexit.register(lambda: os.kill(os.getpid(), signal.SIGTERM))
from ggtool.__main__ import main
main()
"""


def test_a_signal_while_ending_is_not_lost(tmp_path):
    """A signal after the command has done its work, while it exits: the output is complete, and
    the exit status still says what happened (143, its line), as it would for a C tool."""
    out = tmp_path / "y.json"
    p = start([*TINY, "-o", str(out)], code=AT_EXIT)
    rc, err = finish(p)
    assert (rc, err) == (143, "Terminated.\n")
    assert out.read_text() == "[11]\n"
    assert os.listdir(tmp_path) == ["y.json"]
    assert_nothing_left(p.pid)


# SIGINT raised inside a finalizer (__del__), which cannot pass an exception on
IN_A_FINALIZER = """
import signal, sys
import ggtool.commands.compute as C
real = C.write_outputs
class Garbage:
    def __del__(self):
        signal.raise_signal(signal.SIGINT)
def write_outputs(*a, **k):
    Garbage()
    return real(*a, **k)
C.write_outputs = write_outputs
from ggtool.__main__ import main
main()
"""


def test_a_signal_lost_in_a_finalizer_still_sets_the_exit_status(tmp_path):
    """Interrupted raised inside a finalizer is swallowed by Python (which prints `Exception
    ignored in ...` and a traceback): nothing printed but the one line, and exit 130."""
    out = tmp_path / "y.json"
    p = start([*TINY, "-o", str(out)], code=IN_A_FINALIZER)
    rc, err = finish(p)
    assert (rc, err) == (130, "Interrupted.\n")
    assert_nothing_left(p.pid)


# -- what SIGKILL leaves, and who removes it ---------------------------------------------------------
def test_sigkill_of_the_whole_group_leaves_segments_the_next_pool_removes():
    """SIGKILL of caller and workers together (stopped first, so that none runs another
    instruction: no worker is left to unlink the segments): they stay in /dev/shm until the next
    pool of any ggtool process starts, which removes the segments of dead creators."""
    p = start([*SLOW, "--threads", "2"], stdout=subprocess.DEVNULL)
    wait_computing(p.pid, p.pid)
    os.killpg(p.pid, signal.SIGSTOP)
    os.killpg(p.pid, signal.SIGKILL)
    finish(p)
    wait_for(lambda: not session(p.pid), message="the killed processes are still there")
    left = segments(p.pid)
    assert len(left) >= 2
    q = start(TINY)
    assert finish(q) == (0, "")
    assert segments(p.pid) == []


def test_a_caller_killed_mid_write_leaves_a_temporary_the_next_run_removes(tmp_path):
    """quantize SIGKILLed while it writes (a crash, the OOM killer): its `.q.gguf.PID.XXXXXXXX.tmp`
    stays (nothing can run in a process SIGKILL ends); the next write of q.gguf removes it."""
    out = tmp_path / "q.gguf"
    p = start([str(STORIES), str(out), "-t", "2"], code=SLOW_QUANTIZE, stdout=subprocess.DEVNULL)
    tmp = wait_for(lambda: [n for n in os.listdir(tmp_path) if n.endswith(".tmp")], message="no temporary output")
    assert tmp[0].startswith(f".q.gguf.{p.pid}.")
    os.kill(p.pid, signal.SIGKILL)
    assert finish(p)[0] == -signal.SIGKILL
    assert os.listdir(tmp_path) == tmp
    q = start(["quantize", str(STORIES), str(out), "--quiet"])
    assert finish(q) == (0, "")
    assert os.listdir(tmp_path) == ["q.gguf"]


# an object whose __init__ the signal cuts short, and whose __del__ then fails (llvmlite's OutputString)
CUT_SHORT = """
import os, signal, sys, time
import ggtool.interrupts as I
I.install()

class Half:
    def __init__(self):
        self._ptr = 1
        signal.raise_signal(signal.SIGTERM)
        time.sleep(0.05)
        self._owned = True
    def __del__(self):
        if self._owned:
            pass

try:
    Half()
except I.Interrupted as e:
    code = I.report(e.signum)
sys.stderr.flush()
os._exit(code)
"""


def test_a_finalizer_failing_after_the_signal_prints_nothing():
    """An object the signal cut short in its __init__ fails in its __del__ as the exception unwinds:
    after `Terminated.` nothing more is printed (CI saw llvmlite's `OutputString.__del__` report
    "no attribute '_owned'" once, a SIGTERM landing while numba loaded a kernel)."""
    r = subprocess.run([sys.executable, "-c", CUT_SHORT], capture_output=True, text=True, timeout=60)
    assert (r.returncode, r.stderr) == (128 + signal.SIGTERM, "Terminated.\n")
