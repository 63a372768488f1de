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


# ggml-quants.c with accessors for its static tables (iq2xs_init_impl / iq3xs_init_impl fill them)
TABLE_ACCESS = r"""
#include "ggml-quants.c"
void iq2_tables(int type, const uint64_t ** grid, const int ** map, const uint16_t ** nb) {
    iq2xs_init_impl(type); int g = iq2_data_index(type);
    *grid = iq2_data[g].grid; *map = iq2_data[g].map; *nb = iq2_data[g].neighbours;
}
void iq3_tables(int grid_size, const uint32_t ** grid, const int ** map, const uint16_t ** nb) {
    iq3xs_init_impl(grid_size); int g = iq3_data_index(grid_size);
    *grid = iq3_data[g].grid; *map = iq3_data[g].map; *nb = iq3_data[g].neighbours;
}
"""


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


def grid_tables(lib, family: str, arg: int, points: int, npos: int, kmap_size: int):
    """GGML's (grid levels int8 (points * npos,), map int32 (kmap_size,), neighbours uint16) as
    iq2xs_init_impl(arg) ("iq2": arg the type id; IQ1_S's grid too) or iq3xs_init_impl(arg) ("iq3":
    arg the grid size) builds them, copied out of its static tables (a library with TABLE_ACCESS)."""
    grid, mp, nb = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
    getattr(lib, f"{family}_tables")(arg, ctypes.byref(grid), ctypes.byref(mp), ctypes.byref(nb))
    g = np.ctypeslib.as_array(ctypes.cast(grid, ctypes.POINTER(ctypes.c_uint8)), (points * npos,)).copy()
    m = np.ctypeslib.as_array(ctypes.cast(mp, ctypes.POINTER(ctypes.c_int32)), (kmap_size,)).copy()
    # the neighbour lists: up to the end of the last one (the largest offset's count)
    last = int(-m.min() - 1)
    first = np.ctypeslib.as_array(ctypes.cast(nb, ctypes.POINTER(ctypes.c_uint16)), (last + 1,))
    n = np.ctypeslib.as_array(ctypes.cast(nb, ctypes.POINTER(ctypes.c_uint16)), (last + 1 + int(first[last]),)).copy()
    return g.view(np.int8), m, n
