"""Every Python process ggtool starts is isolated (ggtool.isolation): code planted in the directory
where a user runs ggtool (numpy.py, a ggtool/ package, sitecustomize.py) never runs in the background
compiler nor in the pool's fresh workers; they work in "/", with the environment they need only."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from ggtool import isolation

ROOT = Path(__file__).resolve().parent.parent
PLANTED = ("numpy.py", "numba.py", "sitecustomize.py", "usercustomize.py", "ggtool/__init__.py", "ggtool/kernels/__init__.py")


def _plant(folder: Path, log: Path) -> None:
    """Files that, imported, append their name to `log` (an absolute path: no variable needed)."""
    for name in PLANTED:
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"open({str(log)!r}, 'a').write({name!r} + ' ran\\n')\n")


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "NUMBA_CACHE_DIR", "PYTHONSTARTUP")}
    env.update(extra)
    return env


def _ggtool() -> list[str]:
    """The installed `ggtool` command (the README's install puts it beside this Python)."""
    script = Path(sys.executable).parent / "ggtool"
    return [str(script)] if script.exists() else [sys.executable, "-I", "-c", "from ggtool.commands import console; console()"]


def test_the_command_line_runs_no_code_from_its_directory(tmp_path):
    """Before: the background compiler started as `python -m ggtool.compiling.warm` in the user's
    directory, so a ggtool/ folder (or numpy.py, sitecustomize.py) there ran in it, detached, and it
    never compiled anything. Now a first-ever quantized compute on 2 fresh-interpreter workers
    (GGTOOL_FORK=0) starts the compiler, which compiles what was wanted; nothing planted runs."""
    here, log, cache = tmp_path / "here", tmp_path / "ran.log", tmp_path / "cache"
    _plant(here, log)
    row = "[" + ",".join(["1"] * 32) + "]"
    r = subprocess.run([*_ggtool(), "compute", "mul_mat(w, x)", "-t", "2", "--tensor", f"w=q8_0:[{row},{row}]",
                        "--tensor", f"x=[{row}]"], cwd=here, capture_output=True, text=True, timeout=300,
                       env=_env(GGTOOL_CACHE_DIR=str(cache), GGTOOL_FORK="0"))
    assert r.returncode == 0 and r.stdout == "[31.996094,31.996094]\n" and r.stderr == "", r.stderr
    (kernels,) = (cache / "numba").glob("kernels-*")
    wanted = {f.name for f in (kernels / "wanted").iterdir()}
    assert wanted, "the command wanted no kernel: the compiler was never started"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not log.exists():
        ready = {f.name for f in (kernels / "ready").iterdir()} if (kernels / "ready").exists() else set()
        if wanted <= ready:
            break
        time.sleep(0.2)
    assert not log.exists(), log.read_text()
    assert wanted <= {f.name for f in (kernels / "ready").iterdir()}, "the compiler compiled nothing"


SCRIPT = """
import os
from ggtool.pool import WorkerPool
pool = WorkerPool(2)
print(pool.map(os.path.realpath, [".", "."]))
print(pool.map(os.getenv, ["GGTOOL_CACHE_MAX", "GGTOOL_CACHE_MAX"]), pool.map(os.getenv, ["SECRET_PROBE", "SECRET_PROBE"]))
pool.close()
"""


def test_the_pools_fresh_workers_run_no_code_from_the_directory_and_see_only_what_they_need(tmp_path):
    """A library's pool starts fresh interpreters. Before: they worked in the caller's directory with
    its whole environment. Now: in "/", with GGTOOL_*, numba's, BLAS's... variables only (the
    caller, participant 0, still sees its own), and nothing planted where they were started runs."""
    here, log = tmp_path / "here", tmp_path / "ran.log"
    _plant(here, log)
    script = tmp_path / "elsewhere" / "script.py"
    script.parent.mkdir()
    script.write_text(SCRIPT)
    r = subprocess.run([sys.executable, str(script)], cwd=here, capture_output=True, text=True, timeout=300,
                       env=_env(GGTOOL_CACHE_MAX="7G", SECRET_PROBE="left out"))
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [f"[{str(here)!r}, '/']", "['7G', '7G'] ['left out', None]"]
    assert not log.exists(), log.read_text()


def test_an_isolated_command_and_environment(monkeypatch):
    monkeypatch.setattr(sys, "path", ["", "relative/dir", "/abs/one", "/abs/one", *sys.path])
    for k, v in (("NUMBA_CPU_NAME", "haswell"), ("OPENBLAS_CORETYPE", "Haswell"), ("GGTOOL_CACHE_MAX", "7G"), ("LC_ALL", "C"),
                 ("PYTHONPATH", "/planted"), ("PYTHONSTARTUP", "/planted/x.py"), ("LD_PRELOAD", "/planted/x.so"), ("TOKEN", "s")):
        monkeypatch.setenv(k, v)
    argv = isolation.python_command("print(1)", "a")
    assert argv[:2] == [sys.executable, "-I"] and argv[-1] == "a" and argv[-3] == "-c"
    path = isolation.search_path()
    assert path[0] == isolation.PKG_ROOT and "" not in path and "relative/dir" not in path and path.count("/abs/one") == 1
    env = isolation.environment({"EXTRA": "2"})
    assert {k: env.get(k) for k in ("NUMBA_CPU_NAME", "OPENBLAS_CORETYPE", "GGTOOL_CACHE_MAX", "LC_ALL", "EXTRA")} == \
        {"NUMBA_CPU_NAME": "haswell", "OPENBLAS_CORETYPE": "Haswell", "GGTOOL_CACHE_MAX": "7G", "LC_ALL": "C", "EXTRA": "2"}
    assert not {"PYTHONPATH", "PYTHONSTARTUP", "LD_PRELOAD", "TOKEN"} & set(env)
    out = subprocess.run(argv[:-1] + ["x"], capture_output=True, text=True, cwd=isolation.WORKING_DIRECTORY,
                         env=env, timeout=60)
    assert out.returncode == 0 and out.stdout == "1\n", out.stderr
