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
