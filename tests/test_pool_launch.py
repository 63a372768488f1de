"""How the command line's workers start (ggtool.pool.launch, ggtool.pool.fork): forked from the
command line's own process where it is safe, prestarted fresh interpreters where fork is not
possible, fresh interpreters for a library user's pool; which command lines prestart, the pool
adopts a prestarted worker, and one nobody adopts dies with its process."""

import os
import subprocess
import sys
import time

import pytest

from ggtool.commands import threads_asked

needs_two_cpus = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="prestart launches at most one worker per CPU")
linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="workers are forked on Linux only")


@pytest.mark.parametrize("argv, env, n", [
    (["compute", "add(a, b)", "--threads", "3"], None, 3),
    (["compute", "add(a, b)", "-t", "2"], None, 2),
    (["compute", "--threads=4", "x"], None, 4),
    (["compute", "-t2", "x"], None, 2),
    (["compute", "x"], "2", 2),                         # GGTOOL_THREADS
    (["compute", "x", "-t", "3"], "2", 3),              # the option wins, as in click
    (["compute", "x"], None, 0),                        # the default is decided by the graph's size
    (["generate", "--gguf", "m.gguf", "-t", "2"], None, 2),   # generate keeps its pool for every step
    (["generate", "--gguf", "m.gguf"], None, 0),
    (["plan", "x", "-t", "2"], None, None),             # plan computes nothing: no prestart
    (["compute", "--help", "-t", "2"], None, 0),
    (["compute", "x", "-t", "two"], None, 0),           # click's to judge
    (["compute", "--", "-t", "2"], None, 0),
    ([], None, None),
])
def test_which_command_lines_launch_workers(monkeypatch, argv, env, n):
    """The command line's look-ahead (before click loads) gives prestart the thread count of a
    `compute` or `generate` (0: none given), and nothing for another command."""
    if env is None:
        monkeypatch.delenv("GGTOOL_THREADS", raising=False)
    else:
        monkeypatch.setenv("GGTOOL_THREADS", env)
    assert threads_asked(argv) == n


def _run(code: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.endswith("_NUM_THREADS")}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 0, r.stderr
    return r.stdout


# prestart as on a system where the command line cannot fork its workers (or told not to)
NO_FORK = "import os; os.environ['GGTOOL_FORK'] = '0'; from ggtool.pool import launch; "
# a process's command line (a forked worker's is its caller's), and its descriptors as (fd, target) pairs
WORKER_INFO = """
def cmdline(pid):
    return open(f"/proc/{pid}/cmdline", "rb").read()
def fds(pid):
    return sorted((int(fd), os.readlink(f"/proc/{pid}/fd/{fd}")) for fd in os.listdir(f"/proc/{pid}/fd"))
"""


@needs_two_cpus
def test_the_pool_adopts_the_prestarted_worker():
    """GGTOOL_FORK=0 (or no fork on this system): an explicit --threads launches fresh interpreters
    first thing, the pool adopts them, and the command line's BLAS is on one thread all the same."""
    out = _run(NO_FORK + "launch.prestart(2); "
               "pid = launch._PRESTARTED[0].proc.pid; import ggtool; pool = ggtool.get_pool(2); "
               "print(pool.map(abs, [-1, -2]), pool.pids == [pid], launch._PRESTARTED, os.environ['OPENBLAS_NUM_THREADS'])")
    assert out.split() == ["[1,", "2]", "True", "[]", "1"]


@needs_two_cpus
def test_a_worker_nobody_adopts_ends_with_its_process():
    pid = int(_run(NO_FORK + "launch.prestart(2); print(launch._PRESTARTED[0].proc.pid)"))
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        with open(f"/proc/{pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "Z":   # exited, not yet reaped (not our child)
                return
        time.sleep(0.05)
    pytest.fail(f"the prestarted worker {pid} outlived its process")


@linux
def test_the_command_line_forks_its_workers_with_nothing_of_its_own():
    """After prestart (a `compute` command line), the process runs BLAS on one thread and its pool
    forks its workers: the same command line as the caller, named ggtool-worker, stdin from
    /dev/null, stdout on stderr, and none of the caller's other descriptors (an open file here, and
    the other worker's ends)."""
    out = _run("import os, sys\n" + WORKER_INFO + """
from ggtool.pool import launch
launch.prestart(0)
assert launch._PRESTARTED == [] and os.environ["OPENBLAS_NUM_THREADS"] == "1"
import numpy as np
import ggtool
held = open(sys.executable, "rb")
with ggtool.WorkerPool(3) as pool:
    assert pool.map(abs, [-1, -2, -3]) == [1, 2, 3]
    for pid in pool.pids:
        assert cmdline(pid) == cmdline(os.getpid()), cmdline(pid)
        assert open(f"/proc/{pid}/comm").read().strip() == "ggtool-worker"
        f = dict(fds(pid))
        assert f[0] == os.devnull and f[1] == f[2] == os.readlink("/proc/self/fd/2"), f
        kinds = sorted(t.split(":")[0] for fd, t in f.items() if fd > 2 and not t.startswith("/dev/shm/ggtool_"))
        assert kinds == ["anon_inode", "pipe", "socket"], f     # its bell, life pipe and socket (and segments)
    ctx = ggtool.Context()
    w = np.arange(64 * 48, dtype=np.float32).reshape(48, 64) % 7
    a = ctx.new_tensor("f32", [64, 48]).set_data(w)
    b = ctx.new_tensor("f32", [64, 32]).set_data(np.ones((32, 64), np.float32))
    y = ggtool.ops.FUNCTIONS["mul_mat"](ctx, a, b)
    ggtool.graph_compute(ggtool.Graph(ctx).expand(y), 3, pool=pool)
    print(np.array_equal(y.numpy().reshape(32, 48), np.ones((32, 64), np.float32) @ w.T))
""")
    assert out.split() == ["True"]


@linux
def test_a_forked_worker_that_dies_is_reported_and_replaced():
    """A forked worker killed from outside: the caller, waiting for its reply, reports how it died
    (its exit status, reaped through a pidfd), and the next use forks a new one."""
    out = _run("import os, signal, threading, time\n" + WORKER_INFO + """
from ggtool.pool import launch
launch.prestart(0)
import ggtool
pool = ggtool.WorkerPool(2)
assert pool.map(abs, [-1, -2]) == [1, 2]
(pid,) = pool.pids
assert cmdline(pid) == cmdline(os.getpid())
threading.Timer(0.5, os.kill, (pid, signal.SIGKILL)).start()
try:
    pool.map(time.sleep, [0, 30])
except ggtool.GGToolError as e:
    print(str(e) == f"worker 1 (pid {pid}) died (killed by SIGKILL) during pool.map")
while len(os.listdir("/proc/self/task")) > 1:      # the timer thread's last steps
    time.sleep(0.001)
print(pool.map(abs, [-1, -2]) == [1, 2], pool.pids != [pid], cmdline(pool.pids[0]) == cmdline(os.getpid()))
pool.close()
""")
    assert out.split() == ["True", "True", "True", "True"]


@linux
def test_workers_are_fresh_interpreters_without_prestart_or_once_the_command_line_has_a_thread():
    """A library user's process (never prestarted) is not forked from, nor one with a second thread
    (a numba or BLAS thread counts: the kernel's count of the process's threads is checked)."""
    out = _run("import os\n" + WORKER_INFO + """
import ggtool
with ggtool.WorkerPool(2) as pool:
    ok = pool.map(abs, [-1, -2]) == [1, 2]          # ready: past its exec
    print(cmdline(pool.pids[0]) == cmdline(os.getpid()), ok)
""")
    assert out.split() == ["False", "True"]
    out = _run("import os, threading, time\n" + WORKER_INFO + """
from ggtool.pool import launch
launch.prestart(0)
import ggtool
stop = threading.Event()
t = threading.Thread(target=stop.wait)
t.start()
with ggtool.WorkerPool(2) as pool:
    ok = pool.map(abs, [-1, -2]) == [1, 2]
    print(cmdline(pool.pids[0]) == cmdline(os.getpid()), ok)
stop.set()
t.join()
while len(os.listdir("/proc/self/task")) > 1:      # the thread's last steps, after join returned
    time.sleep(0.001)
with ggtool.WorkerPool(2) as pool:                  # one thread again: forked
    ok = pool.map(abs, [-1, -2]) == [1, 2]
    print(cmdline(pool.pids[0]) == cmdline(os.getpid()), ok)
""")
    assert out.split() == ["False", "True", "True", "True"]


def _maps_llvmlite(pid: int, within: float) -> bool:
    """Whether process pid maps numba's LLVM library within `within` seconds."""
    deadline = time.monotonic() + within
    while True:
        with open(f"/proc/{pid}/maps") as f:
            if "llvmlite" in f.read():
                return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


def test_workers_load_the_kernels_when_told_to_and_only_then():
    """A worker loads nothing it was not asked for; `preload_kernels` has it load numba and the
    kernels in the background, before any quantized node (the command line asks once it has seen
    quantized inputs: Inputs.quantized)."""
    import ggtool

    with ggtool.WorkerPool(2) as pool:
        (pid,) = pool.pids
        assert not _maps_llvmlite(pid, 1.0)
        pool.preload_kernels()
        pool.preload_kernels()                      # twice: still one load, and no reply to wait for
        assert _maps_llvmlite(pid, 30.0)
        assert pool.map(abs, [-1, -2], n_threads=2) == [1, 2]    # the message stream is intact
    pool.preload_kernels()                          # closed: nothing to do


def test_inputs_know_whether_quantized_tensors_may_be_used(tmp_path):
    import numpy as np
    from conftest import write_gguf

    from ggtool.quant import quantize_q4_0
    from ggtool.tensor_io import Inputs, parse_source

    np.save(tmp_path / "a.npy", np.ones((2, 32), np.float32))
    f32 = write_gguf(tmp_path / "f32.gguf", {"w": np.ones((2, 32), np.float32)})
    q4 = write_gguf(tmp_path / "q4.gguf", {"w": (quantize_q4_0(np.ones((2, 32), np.float32)), 2)})
    a = str(tmp_path / "a.npy")
    assert not Inputs([parse_source("a", a)], [str(f32)]).quantized()
    assert Inputs([parse_source("a", a)], [str(q4)]).quantized()
    assert Inputs([parse_source("a", "q4_0:" + a)], []).quantized()
    assert Inputs([parse_source("w", f"{q4}:w")], []).quantized()
    assert not Inputs([parse_source("w", f"f32:{q4}:w")], []).quantized()
