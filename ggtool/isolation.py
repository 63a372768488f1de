"""How ggtool starts a Python process of its own (the background kernel compiler, a pool worker that
is a fresh interpreter): isolated, so that nothing where the user happens to be can run in it.

`python -m module` puts the current directory first on sys.path (before site runs: even a
``sitecustomize.py`` there is imported), and PYTHONPATH, the user's site-packages and PYTHON*
variables steer any interpreter. So a child is `python -I -c CODE` (isolated: neither the
current directory nor PYTHONPATH nor the user site), started in the root directory ("/": nothing
can be planted there, and numba reads a ``.numba_config.yaml`` from its working directory), whose
CODE first sets sys.path to this process's own absolute entries (so it imports numpy, numba and
ggtool from where this process did: a venv, the user site, an editable checkout), with
ggtool's own root first. A relative entry ('' for "the current directory", as `python -c` and
`python -m` give) is left out: the child's directory is another.

Its environment holds only the variables named by `KEPT`/`KEPT_PREFIXES`: the system's (PATH,
HOME, the locale, TMPDIR, LD_LIBRARY_PATH for the libraries numpy and numba link), and every
variable that steers what a child computes, which must equal what this process computes:
numpy's (NPY_*, NUMPY_*), BLAS's and OpenMP's (OPENBLAS_*, GOTO*, OMP_*, GOMP_*, KMP_*, MKL_*,
BLIS_*, VECLIB_*, NUMEXPR_*), numba's and LLVM's (NUMBA_*, LLVMLITE_*) and ggtool's own
(GGTOOL_*); plus XDG_CACHE_HOME (where the caches are). Nothing else: a function given to
``WorkerPool.map`` in a fresh worker sees these variables only, "/" as its directory, and
imports from this process's sys.path.

Light (os and sys only): the command line starts these before numpy loads.
"""

from __future__ import annotations

import os
import sys

PKG_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # the folder holding ggtool/
WORKING_DIRECTORY = os.path.abspath(os.sep)

KEPT = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "LD_LIBRARY_PATH",
        "XDG_CACHE_HOME", "SYSTEMROOT")
KEPT_PREFIXES = ("LC_", "GGTOOL_", "NUMBA_", "LLVMLITE_", "NPY_", "NUMPY_", "OPENBLAS_", "GOTO", "OMP_", "GOMP_",
                 "KMP_", "MKL_", "BLIS_", "VECLIB_", "NUMEXPR_")


def environment(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment cut to what a child needs (see the module docstring), with `extra`."""
    env = {k: v for k, v in os.environ.items() if k in KEPT or k.startswith(KEPT_PREFIXES)}
    env.update(extra or {})
    return env


def search_path() -> list[str]:
    """The child's sys.path: ggtool's root, then this process's absolute entries, each once."""
    out: list[str] = []
    for p in (PKG_ROOT, *sys.path):
        if isinstance(p, str) and os.path.isabs(p) and p not in out:
            out.append(p)
    return out


def python_command(code: str, *args: str) -> list[str]:
    """argv of an isolated interpreter that runs `code` (after setting sys.path) with `args` in
    sys.argv[1:]; this interpreter's own flags (-X, -W, -B, ...) are kept."""
    import subprocess

    flags = [f for f in subprocess._args_from_interpreter_flags() if f not in ("-I", "-E", "-s", "-P")]
    boot = f"import sys; sys.path[:] = {search_path()!r}\n"
    return [sys.executable, "-I", *flags, "-c", boot + code, *args]


def popen(code: str, *args: str, env: dict[str, str] | None = None, **kwargs):
    """subprocess.Popen of `python_command(code, *args)` in WORKING_DIRECTORY with `environment(env)`."""
    import subprocess

    return subprocess.Popen(python_command(code, *args), cwd=WORKING_DIRECTORY, env=environment(env), **kwargs)
