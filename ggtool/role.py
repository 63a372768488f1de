"""What this process is to ggtool: set once by whoever starts it, read by the layers that behave
differently there (one home, so that no layer reads another's flag or the command line's argv).

- `COMMAND_LINE`: ggtool's own command line (ggtool.commands sets it first thing). Its process is
  ggtool's alone, so ggtool takes process-wide liberties a library must not take in its user's:
  numba loads without the optional packages ggtool has no use for and reads no config file from
  the working directory (kernels.jit), gguf-py's yaml is loaded only if used (gguf_io.reader),
  and the first memory map of a file installs a SIGBUS handler (gguf_io.storage.guard_sigbus).
- `POOL_WORKER`: a worker process of the pool (`GGTOOL_POOL_WORKER` in its environment, or forked
  by pool.fork): a pool made there (by a module a worker imports) computes in-process.
- `LIBRARY_CALLER`: a pool worker whose caller is a library's process, not ggtool's command line
  (the caller says so in its first message, `pool.wire.Init`): as its caller, it runs every kernel
  compiled (compiling at first use where the cache lacks it), not the numpy twin a command line
  runs until the background compiler has the kernel ready. Participants that decided otherwise
  compute the same bits, but the one running a twin makes every other wait.
"""

from __future__ import annotations

from . import environment

COMMAND_LINE = False
POOL_WORKER = environment.pool_worker()
LIBRARY_CALLER = False
