"""Where compiled kernels are cached, whether a kernel is in the cache yet, and filling the cache in
the background: light (os only), so asking costs a process nothing of numba's start-up.

The cache lives in ``$GGTOOL_CACHE_DIR/numba`` if that is set, else ``$XDG_CACHE_HOME/ggtool/numba``
(default ``~/.cache/ggtool/numba``), in a subfolder named after a digest of the SHARED modules
(``_tiles_key``), never beside the installed package, which may not be writable. A
``NUMBA_CACHE_DIR`` the user set wins over all of these.

A first-ever run: compiling a kernel costs 0.3-2.5 s of numba's own Python work each (~8 s for a
quantized model's forward pass), far more than the work it then does in a short run. So in ggtool's
command line (and its pool's workers), a kernel that is not in the cache yet is replaced by its
numpy twin (``twins``: the same bits), and is compiled after the command has ended, by one
background process (``python -m ggtool.kernels.warm``) that fills the cache for the next run: it
waits for the command to exit (its stdin is a pipe the command holds), compiles the kernels named
in ``wanted/`` one by one (numba writes each cache file whole, through a rename), marks each in
``ready/`` and exits. A lock lets one such process work on a cache at a time. A library user's
process compiles in process, as always (``use_kernel``).
"""

from __future__ import annotations

import os
import subprocess
import sys

from .. import environment, role

# Modules whose compiled functions other kernel modules compile into theirs: simd's vector tiles
# (into dot and dot_k), dot_base's store_group (into dot and dot_k), dot_k's scale decoding (into x86),
# ggtool.kquants' blocks and legacy (their searches and block ends, into kquants.legacy and .weighted).
SHARED = ("simd.py", "dot_base.py", "dot_k.py", "../kquants/blocks.py", "../kquants/legacy.py")


def cache_dir() -> str:
    """Where compiled kernels are cached (see the module docstring)."""
    if os.environ.get("NUMBA_CACHE_DIR"):
        return os.environ["NUMBA_CACHE_DIR"]
    base = environment.cache_dir()
    if not base:
        xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        base = os.path.join(xdg, "ggtool")
    return os.path.join(base, "numba", _tiles_key())


def _tiles_key() -> str:
    """A digest of the SHARED modules. numba checks a cached kernel against its own source file
    only: a changed shared module gets a cache directory of its own instead of stale kernels."""
    import hashlib

    h = hashlib.sha1()
    here = os.path.dirname(os.path.abspath(__file__))
    for name in SHARED:
        with open(os.path.join(here, name), "rb") as f:
            h.update(f.read())
    return "tiles-" + h.hexdigest()[:12]


def marker(folder: str, name: str, root: str | None = None) -> str:
    """The file saying kernel `name` is wanted / ready in this Python's cache."""
    return os.path.join(root or cache_dir(), folder, f"{name}.{sys.implementation.cache_tag}")


_decided: dict[str, bool] = {}   # kernel name -> compiled (True) or twin (False), for the process's life
_compiler = None                 # the background compile process this process started


def use_kernel(name: str) -> bool:
    """Whether this process runs the compiled kernel `name` (else its numpy twin): yes where it
    is in the cache already or where the process is a library user's; decided once a process."""
    got = _decided.get(name)
    if got is None:
        got = _decided[name] = not (role.COMMAND_LINE or role.POOL_WORKER) \
            or os.path.exists(marker("ready", name))
        if not got:
            _want(name)
    return got


def _want(name: str) -> None:
    global _compiler
    try:
        path = marker("wanted", name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        open(path, "a").close()
        if role.COMMAND_LINE and _compiler is None:
            env = dict(os.environ, NUMBA_CACHE_DIR=cache_dir())
            _compiler = subprocess.Popen([sys.executable, "-m", "ggtool.kernels.warm"], stdin=subprocess.PIPE,
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                                         start_new_session=True)   # a Ctrl-C of the command is not its
    except OSError:     # an unwritable cache: the twin still runs; nothing is compiled for next time
        pass
