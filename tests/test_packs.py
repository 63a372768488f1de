"""Repacked weights on disk (ggtool.quant.packs): what is stored comes back whole and equal, a tile
that is not whole or belongs to another key is ignored, and a file's identity keys its folder."""

from __future__ import annotations

import os

import numpy as np

from ggtool import types as T
from ggtool.kernels import dot
from ggtool.quant import packs


def _packed():
    rng = np.random.default_rng(3)
    w = rng.integers(0, 256, (130, 2 * 144), dtype=np.uint8)
    return dot.pack(T.GGMLType.Q4_K, w)


def test_a_stored_tile_comes_back_equal_and_writable(tmp_path):
    where, key, packed = str(tmp_path / "f" / "ident"), ("Q4_K", 0, 0, 130), _packed()
    packs.store(where, key, packed)
    got = packs.load(where, key)
    assert len(got) == len(packed)
    for a, b in zip(got, packed):
        if isinstance(b, np.ndarray):
            assert type(a) is np.ndarray and a.dtype == b.dtype and a.flags.writeable and a.flags.c_contiguous
            assert np.array_equal(a.view(np.uint8), b.view(np.uint8))
        else:
            assert a == b
    assert packs.load(where, ("Q4_K", 0, 0, 131)) is None
    assert not [f for f in os.listdir(where) if f.endswith(".tmp")]


def test_a_tile_cut_short_is_ignored(tmp_path):
    where, key = str(tmp_path / "f" / "ident"), ("k",)
    packs.store(where, key, _packed())
    (path,) = [os.path.join(where, f) for f in os.listdir(where)]
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - 64)
    assert packs.load(where, key) is None


def test_a_new_identity_of_a_file_replaces_the_old_ones(tmp_path):
    base = tmp_path / "f"
    packs.store(str(base / "old"), ("k",), _packed())
    packs.store(str(base / "new"), ("k",), _packed())
    assert os.listdir(base) == ["new"]


def test_only_large_files_are_cached(tmp_path):
    small = tmp_path / "small.gguf"
    small.write_bytes(b"\0" * 1024)
    assert packs.folder(str(small)) is None
    assert packs.MIN_FILE_BYTES >= 1 << 20
