"""The background process that fills the kernel cache (``cache``), started isolated by the command
line (``cache._want``: ``python -I -c "...; from ggtool.compiling.warm import main; main()"`` in "/").

It waits for the command that started it to exit (end of its stdin), takes the cache's lock (or
leaves it to the process holding it), then compiles every kernel named in ``wanted/`` that is not
``ready/`` yet, by calling it on small arrays of the types the engine passes it, and marks it ready.

The queue is only file names: an entry that names no kernel (`known`: a stray file, a name
from another version of ggtool, a link) is removed and never stops the others (another Python's
entries are left to it); a kernel that fails to compile is
marked in ``failed/`` (with the error) and not tried again in this cache, so a broken one costs
one attempt, not one per run.
"""

from __future__ import annotations

import fcntl
import os
import sys

from ..kernels import cache

QUANTIZERS = ("F16", "Q4_0", "Q8_0", "Q8_0_cpu", "Q8_1_cpu", "Q8_K")


def _dot(type_name: str) -> None:
    import numpy as np  # here, not at the top: nothing heavier than os loads while the command runs

    from .. import qtypes
    from .. import types as T
    from ..kernels import dot

    t = T.parse_type(type_name)
    vdt = T.vec_dot_type(t)
    nval = max(T.block_size(t), T.block_size(vdt))
    w = np.zeros((1, nval // T.block_size(t) * T.type_size(t)), np.uint8)
    act = np.zeros((1, nval // T.block_size(vdt) * T.type_size(vdt)), np.uint8)
    ro = w.copy()
    ro.flags.writeable = False          # weights mapped from a file are read-only
    for weights in (w, ro):
        if t in qtypes.REGISTRY:        # a block type: packed in its record's form
            record = qtypes.get(t)
            record.mul_mat_packed_into(record.pack(weights), act, np.empty((1, 1), np.float32))
        else:                           # BF16, F32, F16
            dot.dot(t, dot.pack(t, weights), act, np.empty((1, 1), np.float32))


def _quantizer(kind: str) -> None:
    import numpy as np

    from ..kernels import quantize

    if kind == "F16":
        quantize.fp32_to_fp16(np.zeros(1, np.float32), np.zeros(1, np.uint16))
        return
    kernel, nval, nbytes = {"Q4_0": (quantize.q4_0_quantize, 32, 18), "Q8_0": (quantize.q8_0_quantize, 32, 34),
                            "Q8_0_cpu": (quantize.q8_0_quantize_cpu, 32, 34), "Q8_1_cpu": (quantize.q8_1_quantize_cpu, 32, 36),
                            "Q8_K": (quantize.quantize_q8_k, 256, 292)}[kind]
    kernel(np.zeros((1, nval), np.float32), np.zeros((1, nbytes), np.uint8))


def _runner(_: str) -> None:
    from ..kernels import runner
    runner.warm()


def _node(name: str) -> None:
    from ..kernels import nodes
    nodes.compile_kernel(name)


def _node_names() -> set[str]:
    from ..kernels import nodes, nodes_mm  # noqa: F401 - nodes_mm registers mul_mat's kernels
    return set(nodes.KERNELS)


def _float_rows(kind: str) -> None:
    import numpy as np

    from ..kernels import portable_math

    portable_math.compiled(kind)(np.zeros((1, 1), np.float32))


def _dot_types() -> set[str]:
    """The types whose compiled dot ``quant.matmul.mul_mat_into`` asks for: the block types' and the
    float weights' (F32/F16 in GGML's scalar order: a prompt's attention products)."""
    from .. import qtypes
    from .. import types as T

    return {T.type_name(t) for t in (T.F32, T.F16, *qtypes.DOT_TYPES)}


# What the queue may name, "<kind>:<argument>" (``cache.use_kernel``): kind -> (how to compile it, the
# arguments it takes, or None for any: the compile function refuses what it does not know).
KINDS = {"dot": (_dot, _dot_types), "quantize": (_quantizer, lambda: set(QUANTIZERS)),
         "float_rows": (_float_rows, lambda: {"exp", "seq_sum"}),
         "runner": (_runner, lambda: {""}),          # the compiled graph runner's loop and barrier
         "node": (_node, _node_names)}               # one of its node kernels


def known(name: str) -> bool:
    """Whether `name` names a kernel this version compiles."""
    kind, _, arg = name.partition(":")
    if kind not in KINDS:
        return False
    args = KINDS[kind][1]
    return args is None or arg in args()


def compile_kernel(name: str) -> bool:
    """Compile (or load) kernel `name`, one that is `known` (KeyError for any other name), and say
    whether numba kept it in the cache. It cannot where the machine code holds addresses of this
    process (every kernel under NUMBA_OPT=0): numba then warns, once a function and process, and
    compiles it anew in every process. Those warnings are this function's answer, not shown; a
    kernel that is not kept must not be marked ready (each later run would compile it in process).
    That is a setting's doing, not a kernel's: after one kernel of a process was not kept, none is
    (a later one may only reuse callees compiled, and warned about, before)."""
    import warnings

    if not known(name):
        raise KeyError(name)
    kind, _, arg = name.partition(":")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        KINDS[kind][0](arg)
    for w in seen:
        if NOT_KEPT in str(w.message):
            _not_kept[0] = True
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return not _not_kept[0]


# numba's words where it cannot keep a compiled function in its cache (numba.core.caching)
NOT_KEPT = "Cannot cache compiled function"
_not_kept = [False]     # whether a kernel this process compiled was not kept


def _pending(root: str) -> list[str]:
    """The queue's kernels not ready yet, in order. An entry of this Python that names no kernel, or
    is no plain file, or names one done already, is removed; another Python's entries are left to it."""
    tag = sys.implementation.cache_tag
    try:
        files = os.listdir(os.path.join(root, "wanted"))
    except OSError:
        return []
    names = []
    for f in files:
        path = os.path.join(root, "wanted", f)
        name, _, its_tag = f.rpartition(".")
        if its_tag != tag and its_tag.startswith(("cpython-", "pypy")) and name:
            continue
        if its_tag == tag and known(name) and cache.plain_file(path) \
                and not os.path.exists(cache.marker("ready", name, root)) \
                and not os.path.exists(cache.marker("failed", name, root)):
            names.append(name)
        else:
            cache.remove(path)
    return sorted(names)


def _mark(root: str, folder: str, name: str, text: str = "") -> bool:
    """Write kernel `name`'s marker in `folder` (holding `text`), and say whether it is there: what
    stands at its name and is no plain file (a link, a folder, a FIFO planted there) is removed
    first, and a marker that cannot be written is no error (the runs compile the kernel again)."""
    if cache.subfolder(root, folder) is None:
        return False
    path = cache.marker(folder, name, root)
    try:
        if os.path.lexists(path) and not cache.plain_file(path):
            cache.remove(path)
        cache.touch(path, text)
    except OSError:
        return False
    return True


def main() -> None:
    sys.stdin.buffer.read()                     # until the command that started this one has exited
    root = cache.cache_dir()
    if cache.bypassed():
        return
    lock_path = os.path.join(root, "compile.lock")
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError:                             # a link at its name, an unwritable cache: nothing to do
        return
    with os.fdopen(fd, "r+b") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return                              # another one compiles this cache
        for _ in range(2):                      # names wanted meanwhile are picked up once more
            for name in _pending(root):
                try:
                    kept = compile_kernel(name)
                except Exception as e:           # a kernel that does not compile here: not tried again
                    _mark(root, "failed", name, f"{type(e).__name__}: {e}\n")
                else:
                    if kept:
                        _mark(root, "ready", name)
                    else:                       # the runs keep its twin (or Python's step), as before it
                        _mark(root, "failed", name, "numba cannot keep it in the cache (NUMBA_OPT=0?)\n")
                cache.remove(cache.marker("wanted", name, root))


if __name__ == "__main__":
    main()
