"""Workers launched before the command line's imports (ggtool.pool.launch): which command lines
launch them, the pool adopts them, and one nobody adopts dies with its process."""

import os
import subprocess
import sys
import time

import pytest

from ggtool.pool.launch import threads_asked

needs_two_cpus = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="prestart launches at most one worker per CPU")


@pytest.mark.parametrize("argv, env, n", [
    (["compute", "add(a, b)", "--threads", "3"], None, 3),
    (["compute", "add(a, b)", "-t", "2"], None, 2),
    (["compute", "--threads=4", "x"], None, 4),
    (["compute", "-t2", "x"], None, 2),
    (["compute", "x"], "2", 2),                         # GGTOOL_THREADS
    (["compute", "x", "-t", "3"], "2", 3),              # the option wins, as in click
    (["compute", "x"], None, 0),                        # the default is decided by the graph's size
    (["plan", "x", "-t", "2"], None, 0),                # plan computes nothing
    (["compute", "--help", "-t", "2"], None, 0),
    (["compute", "x", "-t", "two"], None, 0),           # click's to judge
    (["compute", "--", "-t", "2"], None, 0),
    ([], None, 0),
])
def test_which_command_lines_launch_workers(monkeypatch, argv, env, n):
    if env is None:
        monkeypatch.delenv("GGTOOL_THREADS", raising=False)
    else:
        monkeypatch.setenv("GGTOOL_THREADS", env)
    assert threads_asked(argv) == n


def _run(code: str) -> str:
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout


@needs_two_cpus
def test_the_pool_adopts_the_prestarted_worker():
    out = _run("from ggtool.pool import launch; launch.prestart(['compute', '-t', '2']); "
               "pid = launch._PRESTARTED[0].proc.pid; import ggtool; pool = ggtool.get_pool(2); "
               "print(pool.map(abs, [-1, -2]), pool.pids == [pid], launch._PRESTARTED)")
    assert out.split() == ["[1,", "2]", "True", "[]"]


@needs_two_cpus
def test_a_worker_nobody_adopts_ends_with_its_process():
    pid = int(_run("from ggtool.pool import launch; launch.prestart(['compute', '-t', '2']); "
                   "print(launch._PRESTARTED[0].proc.pid)"))
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


@needs_two_cpus
@pytest.mark.parametrize("argv, preload", [
    (["compute", "-f", "m.gg", "--gguf", "model.gguf", "-t", "2"], True),
    (["compute", "mul_mat(w, x)", "--tensor", "w=model.gguf:w", "-t", "2"], True),
    (["compute", "add(a, b)", "--tensor", "a=a.npy", "-t", "2"], False),
])
def test_workers_for_a_gguf_model_load_the_kernels_while_they_wait(argv, preload):
    """They are told to (GGTOOL_WORKER_PRELOAD) and do: numba's LLVM library is mapped before
    anything was asked of them."""
    code = ("import sys, time; from ggtool.pool import launch; launch.prestart(sys.argv[1:]); "
            "pid = launch._PRESTARTED[0].proc.pid; print(pid, flush=True); "
            "deadline = time.monotonic() + 30\n"
            "while time.monotonic() < deadline and 'llvmlite' not in open(f'/proc/{pid}/maps').read(): time.sleep(0.05)\n"
            "print('llvmlite' in open(f'/proc/{pid}/maps').read())")
    if not preload:
        code = code.replace("time.monotonic() + 30", "time.monotonic() + 1")
    r = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=90)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[1] == str(preload)
