"""Compiling every kernel ahead (`ggtool kernels --compile`, ggtool.compiling.ahead_of_time): what it
marks, what it tries again, and what it does when a compile process, a marker or the cache is not
what it should be. The kernels compiled here are the cheapest (float_rows:seq_sum, ~0.1 s)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, fails, ok

from ggtool.compiling import ahead_of_time as aot
from ggtool.errors import GGToolError
from ggtool.kernels import cache

CHEAP = "float_rows:seq_sum"
TAG = sys.implementation.cache_tag


@pytest.fixture
def kernel_cache(tmp_path, monkeypatch):
    """A cache of this test's own; returns its kernel folder (made)."""
    monkeypatch.setenv("GGTOOL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
    monkeypatch.setattr(cache, "_dirs", {})
    return Path(aot.cache_folder())


def marker(folder: Path, kind: str, name: str) -> Path:
    return folder / kind / f"{name}.{TAG}"


def test_every_kernel_the_background_compiler_knows_is_listed_once():
    from ggtool.compiling import warm

    names = aot.kernel_names()
    assert len(names) == len(set(names)) and all(warm.known(n) for n in names)
    assert {"runner", "dot:q4_0", "dot:q6_K", "dot:f32", "quantize:Q8_K", "node:rope_f32", CHEAP} <= set(names)


def test_units_keep_a_family_of_dots_together_and_put_the_costliest_first():
    units = aot._units(["quantize:F16", "dot:q4_0", "dot:q6_K", "node:mm_x86", "dot:q8_0", "dot:q4_K", "dot:f32"])
    assert units[0] == ["node:mm_x86"] and units[-1] == ["quantize:F16"]
    assert ["dot:q4_0", "dot:q8_0"] in units and ["dot:q6_K", "dot:q4_K"] in units and ["dot:f32"] in units
    assert sorted(n for u in units for n in u) == sorted(["quantize:F16", "dot:q4_0", "dot:q6_K", "node:mm_x86",
                                                          "dot:q8_0", "dot:q4_K", "dot:f32"])


def test_a_kernel_compiled_ahead_is_marked_ready_and_not_compiled_again(kernel_cache):
    done, started = [], []
    states = aot.compile_kernels([CHEAP], jobs=4, on_start=lambda todo, jobs: started.append((todo, jobs)),
                                 on_done=done.append)
    assert started == [([CHEAP], 1)]                    # never more processes than units of work
    assert states == done == [aot.KernelState(CHEAP, aot.READY)]
    assert marker(kernel_cache, "ready", CHEAP).is_file()
    assert any(f.endswith(".nbi") for _, _, fs in os.walk(kernel_cache) for f in fs)     # numba's index is there
    started.clear()
    assert aot.compile_kernels([CHEAP], on_start=lambda todo, jobs: started.append((todo, jobs))) == states
    assert started == [([], 0)]                         # nothing to do: no process


def test_a_failed_kernel_is_shown_with_its_reason_and_tried_again(kernel_cache):
    failed = marker(kernel_cache, "failed", CHEAP)
    failed.write_text("TypingError: something\nmore   words\n")
    assert aot.kernel_states([CHEAP]) == [aot.KernelState(CHEAP, aot.FAILED, "TypingError: something more words")]
    assert aot.compile_kernels([CHEAP]) == [aot.KernelState(CHEAP, aot.READY)]
    assert not failed.exists()
    failed.write_bytes(b"bad\x1b[31mRED\x00\x07 " + b"x" * 10**6)
    (state,) = aot.kernel_states([CHEAP])
    assert state.state == aot.READY                     # ready wins over a stale failed marker
    marker(kernel_cache, "ready", CHEAP).unlink()
    (state,) = aot.kernel_states([CHEAP])
    assert state.state == aot.FAILED and state.why.startswith("bad [31mRED") and len(state.why) <= aot.WHY_LENGTH
    assert state.why.isprintable()


@pytest.mark.parametrize("planted", ["link", "folder"])
def test_a_ready_marker_that_is_no_plain_file_counts_for_nothing(kernel_cache, tmp_path, planted):
    ready = marker(kernel_cache, "ready", CHEAP)
    ready.parent.mkdir(exist_ok=True)
    if planted == "link":
        (tmp_path / "elsewhere").write_text("")
        os.symlink(tmp_path / "elsewhere", ready)
    else:
        ready.mkdir()
    assert aot.kernel_states([CHEAP]) == [aot.KernelState(CHEAP, aot.MISSING)]
    assert aot.compile_kernels([CHEAP]) == [aot.KernelState(CHEAP, aot.READY)]     # removed, compiled, marked
    assert ready.is_file() and not ready.is_symlink() and (tmp_path / "elsewhere").exists() == (planted == "link")


def test_a_fifo_at_a_marker_never_holds_the_compile_up(kernel_cache):
    """A FIFO planted at a ready marker (opening it for writing would wait for a reader forever) is
    removed; one planted at the failed marker of a kernel that fails is an error, never a wait."""
    ready = marker(kernel_cache, "ready", CHEAP)
    ready.parent.mkdir(exist_ok=True)
    os.mkfifo(ready)
    assert aot.kernel_states([CHEAP]) == [aot.KernelState(CHEAP, aot.MISSING)]
    assert aot.compile_kernels([CHEAP]) == [aot.KernelState(CHEAP, aot.READY)]
    os.unlink(ready)
    os.mkfifo(ready)
    t = time.monotonic()
    with pytest.raises(OSError):
        cache.touch(str(ready))
    assert time.monotonic() - t < 10


def test_a_kernel_whose_ready_mark_cannot_be_written_is_failed_with_the_reason(kernel_cache, monkeypatch):
    """In the compile process: its ready mark is not written (first_run._mark_ready says so: a folder
    that cannot be written); the failed mark says why, and the kernel is no longer wished for."""
    from ggtool.compiling import first_run

    monkeypatch.setattr(first_run, "_mark_ready", lambda name: False)
    wanted = marker(kernel_cache, "wanted", CHEAP)
    wanted.parent.mkdir(exist_ok=True)
    wanted.touch()
    state, why = aot._compile_one(CHEAP)
    assert (state, why) == (aot.FAILED, f"its ready mark cannot be written in {kernel_cache / 'ready'}")
    assert aot.kernel_states([CHEAP]) == [aot.KernelState(CHEAP, aot.FAILED, why)] and not wanted.exists()


@pytest.mark.parametrize("planted", ["fifo", "link", "folder"])
def test_a_run_that_compiles_a_kernel_marks_it_over_whatever_was_planted(kernel_cache, tmp_path, monkeypatch,
                                                                          planted):
    """A run's own compile (first_run.compile_now) and the background compiler write their marks
    through warm._mark: what was planted at the name is removed, never waited on nor followed, and
    the run goes on."""
    import ggtool.role
    from ggtool.compiling import first_run, warm

    monkeypatch.setattr(ggtool.role, "COMMAND_LINE", True)
    ready = marker(kernel_cache, "ready", CHEAP)
    ready.parent.mkdir(exist_ok=True)
    outside = tmp_path / "outside"
    outside.write_text("theirs")
    {"fifo": lambda: os.mkfifo(ready), "link": lambda: os.symlink(outside, ready), "folder": ready.mkdir}[planted]()
    monkeypatch.setattr(first_run, "_compiled", set())
    first_run.compile_now(CHEAP)
    assert ready.is_file() and not ready.is_symlink() and outside.read_text() == "theirs"
    failed = marker(kernel_cache, "failed", "float_rows:exp")
    failed.parent.mkdir(exist_ok=True)
    os.mkfifo(failed)
    assert warm._mark(str(kernel_cache), "failed", "float_rows:exp", "why\n") is True
    assert failed.read_text() == "why\n"


def test_a_name_that_is_no_kernel_is_refused(kernel_cache):
    with pytest.raises(GGToolError, match="no kernel is named 'dot:q9_9'"):
        aot.compile_kernels(["dot:q9_9"])


# Compile processes that misbehave: each reads its first unit, then...
DIES = "import sys, os; sys.stdin.readline(); os._exit(3)"
KILLED = "import sys, os, signal; sys.stdin.readline(); os.kill(os.getpid(), signal.SIGKILL)"
WRONG = ("import sys\nfor line in sys.stdin:\n    print('ready dot:nonsense'); print('garbage'); print('failed');"
         " sys.stdout.flush(); break\n")


@pytest.mark.parametrize("program, why", [(DIES, "its compile process exited with status 3"),
                                          (KILLED, "its compile process was killed by SIGKILL"),
                                          (WRONG, "its compile process exited with status 0")])
def test_a_compile_process_that_ends_before_answering_is_reported_and_nothing_hangs(kernel_cache, program, why):
    names = [CHEAP, "float_rows:exp", "quantize:F16"]
    done = []
    t, fds = time.monotonic(), _open_fds()
    states = aot.compile_kernels(names, jobs=2, on_done=done.append, program=program)
    assert time.monotonic() - t < 60
    assert _open_fds() == fds                           # every pipe of every process closed
    assert sorted(done, key=str) == sorted((aot.KernelState(n, aot.MISSING, why) for n in names), key=str)
    assert states == [aot.KernelState(n, aot.MISSING) for n in names]
    assert not (kernel_cache / "ready").exists() or os.listdir(kernel_cache / "ready") == []


def test_a_dead_compile_process_is_replaced_and_the_work_left_is_done(kernel_cache, tmp_path):
    """The first compile process dies with its unit; the one started in its place compiles the rest."""
    once = tmp_path / "died-once"
    program = (f"import os, sys\nif not os.path.exists({str(once)!r}):\n    open({str(once)!r}, 'w').close()\n"
               "    sys.stdin.readline(); os._exit(3)\n" + aot.WORKER)
    names = [CHEAP, "float_rows:exp", "quantize:F16"]
    done = []
    states = aot.compile_kernels(names, jobs=1, on_done=done.append, program=program)
    missing = [s for s in done if s.state == aot.MISSING]
    assert len(missing) == 1 and missing[0].why == "its compile process exited with status 3"
    assert sorted(s.name for s in done if s.state == aot.READY) == sorted(n for n in names if n != missing[0].name)
    assert [s.state for s in states].count(aot.READY) == 2


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_two_compiles_of_one_cache_at_once_both_end_ready(kernel_cache):
    code = f"from ggtool.compiling import ahead_of_time as a; print(a.compile_kernels([{CHEAP!r}])[0].state)"
    procs = [subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True)
             for _ in range(2)]
    assert [p.communicate(timeout=300)[0] for p in procs] == ["ready\n", "ready\n"]
    assert aot.kernel_states([CHEAP]) == [aot.KernelState(CHEAP, aot.READY)]


def test_a_kernel_numba_cannot_keep_is_failed_with_the_reason(kernel_cache, monkeypatch, run):
    """NUMBA_OPT=0: numba keeps no kernel whose code holds this process's addresses; the command says
    which and exits 1."""
    monkeypatch.setenv("NUMBA_OPT", "0")
    monkeypatch.setattr(cache, "_dirs", {})
    name = "float_rows:exp"
    wanted = Path(aot.cache_folder()) / "wanted" / f"{name}.{TAG}"
    wanted.parent.mkdir(exist_ok=True)
    wanted.touch()                                      # a run wished for it: no wish is left for what failed
    r = run("kernels", "--compile", name)
    assert r.exit_code == 1 and r.stderr.splitlines() == [
        "compiling 1 kernel for this CPU in 1 process...",
        f"{name}: failed (numba cannot keep it in the cache (NUMBA_OPT=0?))",
        f"Error: 1 of 1 kernels not ready: {name} failed (numba cannot keep it in the cache (NUMBA_OPT=0?))"]
    assert not wanted.exists()
    fails(run("kernels", "--compile", "-q", name), f"1 of 1 kernels not ready: {name} failed")
    out = ok(run("kernels", name, "--json"))
    assert json.loads(out)["kernels"] == [{"name": name, "state": "failed",
                                           "why": "numba cannot keep it in the cache (NUMBA_OPT=0?)"}]


def test_the_command_lists_compiles_and_says_so_on_stderr(kernel_cache, run):
    r = run("kernels", "seq_sum")
    assert ok(r) == f"{CHEAP}  missing\n"
    r = run("kernels", "--compile", "seq_sum")
    assert ok(r) == ""
    lines = r.stderr.splitlines()
    assert lines[0] == "compiling 1 kernel for this CPU in 1 process..."
    assert lines[-1].startswith("1 of 1 kernels ready (") and lines[-1].endswith(f" in {kernel_cache}")
    assert ok(run("kernels", "seq_sum")) == f"{CHEAP}  ready\n"
    r = run("kernels", "--compile", "-q", "seq_sum")
    assert ok(r) == "" and r.stderr == ""
    doc = json.loads(ok(run("kernels", "--json")))
    assert doc["cache"] == str(kernel_cache) and len(doc["kernels"]) == len(aot.kernel_names())
    assert {k["name"]: k["state"] for k in doc["kernels"]}[CHEAP] == "ready"


def test_the_command_refuses_a_pattern_that_names_no_kernel(kernel_cache, run):
    fails(run("kernels", "nothing-like-it"), "no kernel name contains 'nothing-like-it'")
    fails(run("kernels", "--jobs", "0"), "--jobs", code=2)


def test_a_cache_that_cannot_be_used_is_one_line_and_nothing_compiles(tmp_path):
    root = tmp_path / "cache"
    root.mkdir()
    os.chmod(root, 0o777)
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    env["GGTOOL_CACHE_DIR"] = str(root)
    r = subprocess.run([sys.executable, "-m", "ggtool", "kernels", "--compile", "seq_sum"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and r.stdout == "" and "Traceback" not in r.stderr
    warning, error = r.stderr.splitlines()
    assert warning.startswith(f"Warning: ggtool's cache is not used: {root} ")
    assert error == f"Error: ggtool's cache at {root} cannot be used (the warning above says why): compiled kernels" \
                    " would not be kept"
    assert os.listdir(root) == []
    env["NUMBA_CACHE_DIR"] = str(root)
    env["GGTOOL_CACHE_DIR"] = str(tmp_path / "unused")
    r = subprocess.run([sys.executable, "-m", "ggtool", "kernels", "seq_sum"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and r.stdout == "" and r.stderr.splitlines()[-1] == (
        f"Error: the kernel cache NUMBA_CACHE_DIR at {root} cannot be used (the warning above says why): compiled"
        " kernels would not be kept")
    assert os.listdir(root) == []


def test_an_interrupted_compile_ends_at_once_and_leaves_no_compile_process(tmp_path):
    """Ctrl-C while the compile processes work: "Interrupted.", 130, and none of them is left."""
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    env["GGTOOL_CACHE_DIR"] = str(tmp_path / "cache")
    p = subprocess.Popen([sys.executable, "-m", "ggtool", "kernels", "--compile", "dot:", "-j", "2"], cwd=ROOT,
                         env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    try:
        assert p.stderr.readline().startswith("compiling ")
        time.sleep(0.5)
        p.send_signal(signal.SIGINT)
        t = time.monotonic()
        assert p.wait(timeout=30) == 130
        assert time.monotonic() - t < 10                # killed, not waited for: a compile takes longer
        assert p.stderr.read() == "Interrupted.\n"
        assert _compile_processes(tmp_path) == []
    finally:
        for pid in [p.pid] + _compile_processes(tmp_path):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        p.wait()
        p.stderr.close()


def _compile_processes(tmp_path) -> list[int]:
    """The live processes whose environment names this test's cache (the compile processes)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if str(tmp_path).encode() in f.read():
                    found.append(int(pid))
        except OSError:
            pass
    return found


def test_a_module_planted_in_the_working_directory_is_never_imported(tmp_path):
    """`ggtool kernels --compile` from a folder holding a numpy.py: neither the command nor its
    compile processes (isolated, in "/") import it."""
    here = tmp_path / "here"
    here.mkdir()
    (here / "numpy.py").write_text("raise SystemExit('the planted numpy.py was imported')\n")
    env = {k: v for k, v in os.environ.items() if k not in ("NUMBA_CACHE_DIR", "PYTHONPATH")}
    env["GGTOOL_CACHE_DIR"] = str(tmp_path / "cache")
    code = "import sys; sys.argv = ['ggtool', 'kernels', '--compile', 'quantize:F16']; from ggtool.commands import main; main()"
    r = subprocess.run([sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(ROOT)!r}); " + code],
                       cwd=here, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "numpy.py was imported" not in r.stderr, r.stderr
    assert r.stderr.splitlines()[-1].startswith("1 of 1 kernels ready (")
