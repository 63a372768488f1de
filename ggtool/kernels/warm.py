"""`python -m ggtool.kernels.warm`: the background process that fills the kernel cache (``cache``).

It waits for the command that started it to exit (end of its stdin), takes the cache's lock (or
leaves it to the process holding it), then compiles every kernel named in ``wanted/`` that is not
``ready/`` yet, by calling it on small arrays of the types the engine passes it, and marks it ready.
"""

from __future__ import annotations

import fcntl
import os
import sys

from . import cache


def _dot(type_name: str) -> None:
    import numpy as np      # here, not at the top: nothing heavier than os loads while the command runs

    from .. import types as T
    from . import dot

    t = T.parse_type(type_name)
    vdt = T.vec_dot_type(t)
    nval = max(T.block_size(t), T.block_size(vdt))
    w = np.zeros((1, nval // T.block_size(t) * T.type_size(t)), np.uint8)
    act = np.zeros((1, nval // T.block_size(vdt) * T.type_size(vdt)), np.uint8)
    ro = w.copy()
    ro.flags.writeable = False          # weights mapped from a file are read-only
    for weights in (w, ro):
        dot.dot(t, dot.pack(t, weights), act, np.empty((1, 1), np.float32))


def _quantizer(kind: str) -> None:
    import numpy as np

    from . import kquants, quantize

    if kind == "F16":
        quantize.fp32_to_fp16(np.zeros(1, np.float32), np.zeros(1, np.uint16))
        return
    kernel, nval, nbytes = {"Q4_0": (quantize.q4_0_quantize, 32, 18), "Q8_0": (quantize.q8_0_quantize, 32, 34),
                            "Q8_0_cpu": (quantize.q8_0_quantize_cpu, 32, 34), "Q8_1_cpu": (quantize.q8_1_quantize_cpu, 32, 36),
                            "Q8_K": (kquants.quantize_q8_k, 256, 292)}[kind]
    kernel(np.zeros((1, nval), np.float32), np.zeros((1, nbytes), np.uint8))


def _runner(_: str) -> None:
    from . import runner
    runner.warm()


def _node(name: str) -> None:
    from . import nodes, nodes_mm  # noqa: F401 - nodes_mm registers mul_mat's kernels
    nodes.compile_kernel(name)


def compile_kernel(name: str) -> None:
    """Compile (or load) kernel `name`: "dot:<type>", "quantize:<kind>", "runner" (the compiled graph
    runner's loop) or "node:<kernel>" (one of its node kernels) (``cache.use_kernel``)."""
    what, _, arg = name.partition(":")
    {"dot": _dot, "quantize": _quantizer, "runner": _runner, "node": _node}[what](arg)


def _pending(root: str) -> list[str]:
    tag = "." + sys.implementation.cache_tag
    try:
        names = [f[:-len(tag)] for f in os.listdir(os.path.join(root, "wanted")) if f.endswith(tag)]
    except FileNotFoundError:
        return []
    return sorted(n for n in names if not os.path.exists(cache.marker("ready", n, root)))


def main() -> None:
    sys.stdin.buffer.read()                     # until the command that started this one has exited
    root = cache.cache_dir()
    with open(os.path.join(root, "compile.lock"), "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return                              # another one compiles this cache
        for _ in range(2):                      # names wanted meanwhile are picked up once more
            for name in _pending(root):
                compile_kernel(name)
                ready = cache.marker("ready", name, root)
                os.makedirs(os.path.dirname(ready), exist_ok=True)
                open(ready, "a").close()
                os.unlink(cache.marker("wanted", name, root))


if __name__ == "__main__":
    main()
