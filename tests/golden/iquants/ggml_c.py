"""What make_iquants.py and make_iquants_small.py share: llama.cpp's quantizer C compiled into a
shared library they call through ctypes, and the importance matrices both feed it.

The C is ggml/src/ggml-quants.c (directly, or through a wrapper that includes it) and
ggml/src/ggml-cpu/quants.c (the generic dots), compiled with ``gcc -O2 -DNDEBUG`` (x86-64
baseline: no FMA, no F16C, as llama.cpp builds ggml-base) with the caller's stubs for the few ggml
symbols they reference; the CPU's fp16 table (``ggml_table_f32_f16``) is filled from numpy's exact
conversion."""

from __future__ import annotations

import ctypes
import subprocess
from pathlib import Path

import numpy as np


def compile_ggml(ggml_dir: str, tmp: Path, stubs: str, wrapper: str | None = None) -> ctypes.CDLL:
    """The library of `wrapper` (C text that includes ggml-quants.c; None: ggml-quants.c itself),
    ggml-cpu/quants.c and `stubs`, built in `tmp` and loaded."""
    g = Path(ggml_dir)
    (tmp / "stubs.c").write_text(stubs)
    if wrapper is None:
        quants = g / "src/ggml-quants.c"
    else:
        quants = tmp / "wrapper.c"
        quants.write_text(wrapper)
    so = tmp / "libggmliq.so"
    subprocess.run(["gcc", "-O2", "-DNDEBUG", "-shared", "-fPIC", "-I", g / "src", "-I", g / "include",
                    "-I", g / "src/ggml-cpu", quants, g / "src/ggml-cpu/quants.c", tmp / "stubs.c",
                    "-o", so, "-lm"], check=True)
    lib = ctypes.CDLL(str(so))
    table = (ctypes.c_float * (1 << 16)).in_dll(lib, "ggml_table_f32_f16")
    f16 = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)
    ctypes.memmove(table, f16.ctypes.data, f16.nbytes)
    return lib


def weights(rng, n: int) -> np.ndarray:
    """Two importance matrices for rows of n: random positive (10^U(-3, 3)), and the same with a quarter zero."""
    pos = (10.0 ** rng.uniform(-3, 3, n)).astype(np.float32)
    zer = pos.copy()
    zer[rng.random(n) < 0.25] = 0
    return np.stack([pos, zer])
