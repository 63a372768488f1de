"""Repacked weights on disk (ggtool.quant.packs), distrusted: what is stored comes back whole and
equal; a tile that was changed in any way (and checked again after any write) (a flipped byte, a header made to match a truncated file,
items that point outside it, a link at its name) is refused, reported once, removed and rebuilt; a
file rewritten in place keeps no old tiles even with its mtime restored; nothing is ever written
through a planted link; the tiles stay within GGTOOL_CACHE_MAX, least recently used out first, with
processes filling and evicting at once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
import zlib
from pathlib import Path

import numpy as np
import pytest

from ggtool.errors import CacheWarning, GGToolError
from ggtool.kernels import cache
from ggtool.quant import packs

ROOT = Path(__file__).resolve().parent.parent
KEY = ("q8_0", (256, 64, 1, 1), (272, 272, 17408, 17408), 0, 0, 64)
is_root = hasattr(os, "geteuid") and os.geteuid() == 0


@pytest.fixture
def cache_root(tmp_path, monkeypatch):
    """An empty cache in tmp_path/cache, nothing of this process's earlier answers remembered, and
    files of 1 KiB and more cached."""
    root = tmp_path / "cache"
    monkeypatch.setenv("GGTOOL_CACHE_DIR", str(root))
    monkeypatch.delenv("GGTOOL_CACHE_MAX", raising=False)
    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
    monkeypatch.setattr(packs, "MIN_FILE_BYTES", 1024)
    for module, name in ((cache, "_checked"), (cache, "_dirs"), (packs, "_folders"), (packs, "_sources"), (packs, "_room"),
                         (packs, "_logs")):
        monkeypatch.setattr(module, name, {})
    monkeypatch.setattr(packs, "_reported", set())
    return root


def _model(tmp_path, name="m.gguf", size=8192, fill=1) -> str:
    path = tmp_path / name
    path.write_bytes(bytes([fill]) * size)
    return str(path)


def _packed(seed=3):
    rng = np.random.default_rng(seed)
    return (rng.integers(-128, 128, 1000, dtype=np.int8), rng.standard_normal(77).astype(np.float32),
            rng.integers(0, 1 << 30, 33, dtype=np.int32), 130, 2)


def _same(got, packed) -> bool:
    return len(got) == len(packed) and all(
        (type(a) is np.ndarray and a.dtype == b.dtype and a.tobytes() == b.tobytes()) if isinstance(b, np.ndarray) else a == b
        for a, b in zip(got, packed))


def _stored(tmp_path, key=KEY):
    """(folder, tile path, packed) of one tile stored for a model file in tmp_path."""
    where = packs.folder(_model(tmp_path))
    packed = _packed()
    packs.store(where, key, packed)
    return where, packs._tile_file(where, key), packed


def test_a_stored_tile_comes_back_equal_and_writable(cache_root, tmp_path):
    from ggtool import qtypes

    where = packs.folder(_model(tmp_path))
    assert where.startswith(str(cache_root / "packs"))
    w = np.random.default_rng(3).integers(0, 256, (130, 2 * 144), dtype=np.uint8)
    for key, packed in ((KEY, _packed()), (("q4_K", 0, 0, 130), qtypes.get("q4_K").pack(w))):
        packs.store(where, key, packed)
        got = packs.load(where, key)
        assert _same(got, packed)
        assert all(a.flags.writeable and a.flags.c_contiguous for a in got if isinstance(a, np.ndarray))
        got[0][:] = 0                      # copy-on-write: the pages written are this process's own
        assert _same(packs.load(where, key), packed)
    assert packs.load(where, ("q4_K", 0, 0, 131)) is None        # another key: none, and nothing said
    assert not [f for f in os.listdir(where) if f.endswith(".tmp")]
    assert oct(os.stat(where).st_mode & 0o777) == "0o700"


def test_a_file_rewritten_in_place_with_its_mtime_restored_gets_new_tiles(cache_root, tmp_path):
    """Before: the identity was path, size, mtime and inode, so `touch -r` kept the old tiles (a
    run computed with the old weights, exit 0). Now the ctime, which no user can set, moves."""
    path = _model(tmp_path, fill=1)
    old = packs.folder(path)
    packs.store(old, KEY, _packed())
    st = os.stat(path)
    with open(path, "r+b") as f:                  # other weights, same size, same inode
        f.write(bytes([2]) * st.st_size)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))     # touch -r
    assert os.stat(path).st_mtime_ns == st.st_mtime_ns and os.stat(path).st_ino == st.st_ino
    packs._folders.clear()                        # another process
    new = packs.folder(path)
    assert new != old and not os.path.exists(old)  # the old identity is gone with its tiles
    assert packs.load(new, KEY) is None


def _flip(path: str, at: int) -> None:
    with open(path, "r+b") as f:
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ 0x10]))


@pytest.mark.parametrize("where_", ["magic", "crc", "header", "first data byte", "middle", "last byte"])
def test_a_flipped_byte_anywhere_is_refused_reported_once_and_rebuilt(cache_root, tmp_path, where_):
    """Before: a flipped byte in a tile was used as it was (logits off by up to 30.8, exit 0)."""
    where, tile, packed = _stored(tmp_path)
    size = os.path.getsize(tile)
    at = {"magic": 0, "crc": 9, "header": 40, "first data byte": 4096, "middle": 4096 + (size - 4096) // 2,
          "last byte": size - 1}[where_]
    _flip(tile, at)
    with pytest.warns(CacheWarning, match=r"repacked weights of .*m\.gguf in the cache were refused and are rebuilt") as w:
        assert packs.load(where, KEY) is None
    assert len(w) == 1 and tile in str(w[0].message)
    assert not os.path.exists(tile)               # removed: the caller repacks and stores it anew
    packs.store(where, KEY, packed)
    assert _same(packs.load(where, KEY), packed)


class _NoCRC:
    @staticmethod
    def crc32(data, value=0):
        raise AssertionError("the CRC was computed")


def test_a_checked_tile_is_summed_again_only_once_it_was_written(cache_root, tmp_path, monkeypatch):
    """The CRC is computed at the first map of a tile as the file system describes it (inode, size,
    mtime, ctime, stored CRC) and logged; a later map of the same tile skips it, but any write to
    the tile moves its ctime (`touch -r` restores only the mtime), and the next map checks again."""
    monkeypatch.setattr(packs, "SETTLED_S", 0.0)
    where, tile, packed = _stored(tmp_path)
    time.sleep(0.05)                                     # the tile's ctime is older than its check
    assert _same(packs.load(where, KEY), packed)          # checked, and logged
    (line,) = (Path(where) / ".checked").read_text().splitlines()
    assert line.startswith(os.path.basename(tile) + " ")
    monkeypatch.setattr(packs, "_logs", {})              # another process reads the log
    monkeypatch.setattr(packs, "zlib", _NoCRC)
    assert _same(packs.load(where, KEY), packed)          # not summed again
    monkeypatch.undo()
    monkeypatch.setattr(packs, "SETTLED_S", 0.0)
    st = os.stat(tile)
    time.sleep(0.05)
    _flip(tile, 5000)
    os.utime(tile, ns=(st.st_atime_ns, st.st_mtime_ns))   # touch -r
    with pytest.warns(CacheWarning, match="does not match its checksum"):
        assert packs.load(where, KEY) is None


def test_a_check_is_logged_only_for_a_tile_that_has_settled(cache_root, tmp_path):
    """A tile written less than SETTLED_S ago is checked at every map: a write within the
    file system's clock tick could otherwise leave its ctime as it was."""
    where, _, packed = _stored(tmp_path)
    assert packs.SETTLED_S >= 1
    assert _same(packs.load(where, KEY), packed)
    assert not (Path(where) / ".checked").exists()


def test_damage_is_reported_once_per_file_and_process(cache_root, tmp_path):
    where, tile, packed = _stored(tmp_path)
    other = KEY[:-1] + (128,)
    packs.store(where, other, packed)
    for path in (tile, packs._tile_file(where, other)):
        _flip(path, 5000)
    with pytest.warns(CacheWarning) as w:
        assert packs.load(where, KEY) is None and packs.load(where, other) is None
    assert len(w) == 1


def test_damage_is_said_once_among_a_pools_processes(cache_root, tmp_path, monkeypatch):
    """Each participant maps the tiles of its own rows: damage found by the caller and by its
    workers is said by the first of them only (a `.refused-<caller>` mark in the folder)."""
    from ggtool import role

    where, tile, packed = _stored(tmp_path)
    other = KEY[:-1] + (128,)
    packs.store(where, other, packed)
    _flip(tile, 5000)
    _flip(packs._tile_file(where, other), 5000)
    with pytest.warns(CacheWarning):
        assert packs.load(where, KEY) is None                     # the caller
    monkeypatch.setattr(packs, "_reported", set())                # a worker of it
    monkeypatch.setattr(role, "POOL_WORKER", True)
    monkeypatch.setattr(os, "getppid", os.getpid)
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert packs.load(where, other) is None                   # refused, said by nobody again
    assert not os.path.exists(packs._tile_file(where, other))


def _rewrite_header(tile: str, edit, crc: bool) -> None:
    """Apply edit(header dict) to a tile's header, and recompute its CRC if `crc` (as someone
    forging a tile would)."""
    with open(tile, "r+b") as f:
        data = bytearray(f.read())
    head = json.loads(bytes(data[16:4096]).rstrip(b"\0"))
    edit(head)
    text = json.dumps(head).encode()
    data[16:4096] = text.ljust(4080, b"\0")
    if crc:
        data[8:16] = zlib.crc32(bytes(data[16:])).to_bytes(8, "little")
    with open(tile, "wb") as f:
        f.write(data)


@pytest.mark.parametrize("forged, edit, problem", [
    # Before: a header whose size was rewritten to match a truncated tile was taken (wrong results,
    # or a kernel reading past the mapped data).
    (False, "truncate", "outside its data"),
    (True, "truncate", "outside its data"),
    (True, lambda h: h["items"][0].__setitem__(0, "|O"), "unknown dtype"),
    (True, lambda h: h["items"][1].__setitem__(1, 4100), "outside its data"),               # not aligned
    (True, lambda h: h["items"][1].__setitem__(1, 4096), "outside its data"),               # overlaps the first
    (True, lambda h: h["items"][0].__setitem__(2, -64), "outside its data"),
    (True, lambda h: h["items"].__setitem__(0, "x"), "header item that cannot be read"),
    (True, lambda h: h.__setitem__("size", 1 << 40), "where its header says"),
    (True, lambda h: h.__setitem__("key", "another"), "belongs to another tensor"),
])
def test_a_header_that_disagrees_with_the_file_is_refused(cache_root, tmp_path, forged, edit, problem):
    where, tile, _ = _stored(tmp_path)
    if edit == "truncate":
        size = os.path.getsize(tile) - 128
        os.truncate(tile, size)

        def edit(h):
            h["size"] = size
    _rewrite_header(tile, edit, forged)
    with pytest.warns(CacheWarning, match=problem):
        assert packs.load(where, KEY) is None


def test_random_damage_never_comes_back_as_data(cache_root, tmp_path):
    """A seeded corpus of damage (bytes flipped anywhere, cut short, grown, the header's numbers
    changed): each tile comes back equal or is refused with a warning, never as other data or an
    exception."""
    import random
    import warnings

    rng = random.Random(29)
    where, tile, packed = _stored(tmp_path)
    good = Path(tile).read_bytes()
    refused = 0
    for _ in range(300):
        data = bytearray(good)
        kind = rng.choice(["flip", "flips", "cut", "grow", "number"])
        if kind in ("flip", "flips"):
            for _ in range(1 if kind == "flip" else rng.randint(2, 50)):
                data[rng.randrange(len(data))] ^= rng.randrange(1, 256)
        elif kind == "cut":
            del data[rng.randrange(len(data)):]
        elif kind == "grow":
            data += bytes(rng.randrange(256) for _ in range(rng.randint(1, 200)))
        else:
            digits = [k for k in range(16, 600) if chr(data[k]).isdigit()]
            data[rng.choice(digits)] = ord(str(rng.randrange(10)))
        Path(tile).write_bytes(bytes(data))
        packs._reported.clear()                   # each load as another run's
        for mark in Path(where).glob(".refused-*"):
            mark.unlink()
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            got = packs.load(where, KEY)
        if got is None:
            refused += 1
            assert len(w) == 1 and issubclass(w[0].category, CacheWarning)
        else:
            assert bytes(data) == good and _same(got, packed) and not w
    assert refused >= 290


def test_a_tile_cut_shorter_than_its_header_is_refused(cache_root, tmp_path):
    where, tile, _ = _stored(tmp_path)
    os.truncate(tile, 100)
    with pytest.warns(CacheWarning, match="shorter than its header"):
        assert packs.load(where, KEY) is None


def test_a_link_at_a_tiles_name_is_refused_and_never_followed(cache_root, tmp_path):
    """Before: a link planted at a tile's (or its temporary file's) name was written through."""
    where, tile, packed = _stored(tmp_path)
    outside = tmp_path / "outside"
    outside.write_bytes(b"precious")
    os.unlink(tile)
    os.symlink(outside, tile)
    with pytest.warns(CacheWarning, match="cannot be opened"):
        assert packs.load(where, KEY) is None
    assert not os.path.lexists(tile)
    os.symlink(outside, tile)
    packs.store(where, KEY, packed)               # renamed over the link, not written through it
    assert outside.read_bytes() == b"precious" and not os.path.islink(tile)
    assert _same(packs.load(where, KEY), packed)


def test_temporary_files_are_made_exclusively(cache_root, tmp_path, monkeypatch):
    """A link at the name the temporary file would take is passed over (O_CREAT|O_EXCL), never written
    through; before, the temporary name was predictable (`<tile>.<pid>.tmp`) and followed."""
    where, tile, packed = _stored(tmp_path)
    outside = tmp_path / "outside"
    outside.write_bytes(b"precious")
    os.symlink(outside, os.path.join(where, ".planted.tmp"))
    os.symlink(outside, f"{tile}.{os.getpid()}.tmp")
    monkeypatch.setattr(tempfile, "_get_candidate_names", lambda: iter(["planted", "fresh"]))
    packs.store(where, KEY[:-1] + (1,), packed)
    assert outside.read_bytes() == b"precious"
    assert _same(packs.load(where, KEY[:-1] + (1,)), packed)


def test_a_packs_folder_that_is_a_link_is_replaced_and_nothing_is_written_outside(cache_root, tmp_path):
    """Before: a `packs/<hash>` folder that was a symbolic link was written through (168 MB outside
    the cache)."""
    path = _model(tmp_path)
    where = packs.folder(path)
    parent = os.path.dirname(where)
    os.rename(parent, str(tmp_path / "moved"))
    outside = tmp_path / "outside"
    outside.mkdir()
    os.symlink(outside, parent)
    packs._folders.clear()
    cache._checked.clear()
    with pytest.warns(CacheWarning, match=r"packs/[0-9a-f]{16} was a symbolic link to .*outside: removed, and the folder made anew"):
        where = packs.folder(path)
    packs.store(where, KEY, _packed())
    assert os.listdir(outside) == [] and not os.path.islink(parent) and os.path.isfile(packs._tile_file(where, KEY))


@pytest.mark.parametrize("how", ["group-writable", "world-writable", "another user's"])
def test_a_root_that_is_not_the_users_own_is_bypassed_with_one_warning(cache_root, tmp_path, how):
    if how == "another user's" and not is_root:
        pytest.skip("giving a folder to another user needs root")
    cache_root.mkdir()
    if how == "another user's":
        os.chown(cache_root, 12345, -1)
    else:
        os.chmod(cache_root, 0o770 if how == "group-writable" else 0o777)
    with pytest.warns(CacheWarning, match=f"ggtool's cache is not used: {cache_root} ") as w:
        assert packs.folder(_model(tmp_path)) is None
        assert packs.folder(_model(tmp_path, "n.gguf")) is None
        assert cache.bypassed() or cache.cache_dir() != str(cache_root)
    assert len(w) == 1
    assert os.listdir(cache_root) == []             # nothing written into it


def test_a_root_that_is_the_users_own_link_is_followed(cache_root, tmp_path):
    real = tmp_path / "elsewhere"
    real.mkdir(mode=0o700)
    os.symlink(real, cache_root)
    where = packs.folder(_model(tmp_path))
    assert where.startswith(str(real))


def test_max_bytes_reads_sizes_and_refuses_anything_else(monkeypatch):
    monkeypatch.delenv("GGTOOL_CACHE_MAX", raising=False)
    assert packs.max_bytes() == packs.DEFAULT_MAX == 4 << 30
    for text, n in (("0", 0), ("123", 123), ("2G", 2 << 30), ("1.5g", 3 << 29), ("500MiB", 500 << 20), ("64 K", 64 << 10),
                    ("1TB", 1 << 40)):
        monkeypatch.setenv("GGTOOL_CACHE_MAX", text)
        assert packs.max_bytes() == n, text
    for text in ("abc", "-1", "nan", "inf", "2X", "1e30"):
        monkeypatch.setenv("GGTOOL_CACHE_MAX", text)
        with pytest.raises(GGToolError, match=f"GGTOOL_CACHE_MAX must be a size such as 2G, 512M or a number of bytes, got '{text}'"):
            packs.max_bytes()


def test_cache_max_zero_keeps_nothing_and_a_file_that_cannot_fit_is_not_cached(cache_root, tmp_path, monkeypatch):
    monkeypatch.setenv("GGTOOL_CACHE_MAX", "0")
    assert packs.folder(_model(tmp_path)) is None
    monkeypatch.setenv("GGTOOL_CACHE_MAX", "8K")
    assert packs.folder(_model(tmp_path, "big.gguf", size=8192)) is None     # 8 KiB x RESERVE > 8 KiB
    assert packs.folder(_model(tmp_path, "small.gguf", size=4096)) is not None


def test_the_least_recently_used_file_goes_first(cache_root, tmp_path, monkeypatch):
    """Before: tiles grew without bound (561 MB for a 490 MB model, per path)."""
    monkeypatch.setenv("GGTOOL_CACHE_MAX", str(int(2.5 * 8192 * packs.RESERVE)))
    made = {}
    for k, name in enumerate(("a", "b", "c")):
        made[name] = packs.folder(_model(tmp_path, f"{name}.gguf"))
        packs.store(made[name], KEY, _packed())
        os.utime(os.path.join(made[name], ".used"), (1000 + k, 1000 + k))     # a, then b, then c
        if name == "b":                                     # a is used again: b is now the oldest
            os.utime(os.path.join(made["a"], ".used"), (2000, 2000))
    assert os.path.isdir(made["a"]) and not os.path.exists(made["b"]) and os.path.isdir(made["c"])
    assert sum(size for _, size, _ in packs.usage(str(cache_root / "packs"))) <= packs.max_bytes()


FILLER = """
import os, sys, time, warnings
import numpy as np                         # first: its own ImportWarning of an AVX2 host's settings
warnings.simplefilter("error")             # a warning of the cache here is a failure
from ggtool.quant import packs
packs.MIN_FILE_BYTES = 1024
models, rounds, go = sys.argv[1].split(","), int(sys.argv[2]), sys.argv[3]
while not os.path.exists(go):
    time.sleep(0.001)
for r in range(rounds):
    for m in models:
        packs._folders.clear()
        where = packs.folder(m)
        if where is None:
            continue
        for t in range(4):
            key = ("t", t, r % 2)
            got = packs.load(where, key)
            if got is None:
                packs.store(where, key, (np.full(2048 - 64, t, np.uint8), t))
            elif got[1] != t or not (got[0] == t).all():
                sys.exit(f"tile {key} of {m} came back wrong")
print("ok")
"""


def test_processes_filling_and_evicting_at_once_stay_within_the_bound(cache_root, tmp_path):
    """Two processes open, fill and evict the tiles of five files at once, with room for two: each
    gets its tiles back whole or not at all, no warning, the bound holds, nothing is left behind."""
    models = [_model(tmp_path, f"m{k}.gguf", size=8192, fill=k) for k in range(5)]
    limit = int(2.2 * 8192 * packs.RESERVE)
    env = {**os.environ, "GGTOOL_CACHE_DIR": str(cache_root), "GGTOOL_CACHE_MAX": str(limit)}
    go = tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, "-c", FILLER, ",".join(models[::step]), "6", str(go)], env=env, cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for step in (1, -1)]
    go.touch()
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert all(o.strip() == "ok" for o, _ in outs), outs
    base = str(cache_root / "packs")
    assert sum(size for _, size, _ in packs.usage(base)) <= limit
    left = [f for _, _, fs in os.walk(base) for f in fs]
    assert left and not [f for f in left if f.endswith(".tmp")]


OPEN_FILES = """
import os, resource, sys, warnings
import numpy as np
from ggtool.quant import packs
packs.MIN_FILE_BYTES = 1024
model, n, soft, hard = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
where = packs.folder(model)
tiles = [np.full(1000, k % 251, np.uint8) for k in range(n)]
for k in range(n):
    packs.store(where, ("t", k), (tiles[k], k))
def seen(k):
    st = os.stat(packs._tile_file(where, ("t", k)))
    return st.st_ino, st.st_mtime_ns
before = [seen(k) for k in range(n)]
resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
with warnings.catch_warnings(record=True) as said:
    warnings.simplefilter("always")
    got = [packs.load(where, ("t", k)) for k in range(n)]         # all held: each map stays
    for k, g in enumerate(got):
        if g is None:                                             # as quant.matmul.weight_pack does
            packs.store(where, ("t", k), (tiles[k], k))
wrong = [k for k, g in enumerate(got) if g is not None and not (g[1] == k and (g[0] == tiles[k]).all())]
kept = sum(seen(k) == before[k] for k in range(n))               # there, and not written again
with open(os.path.join(os.path.dirname(model), "after.txt"), "w") as f:     # files left to open
    f.write("ok")
print(sum(g is not None for g in got), len(wrong), kept, resource.getrlimit(resource.RLIMIT_NOFILE)[0],
      int(bool(getattr(packs, "_MAP_KEEPS_NO_FD", {}))), "|".join(str(w.message) for w in said))
"""


def _open_files(tmp_path, n, soft, hard):
    import resource

    if resource.getrlimit(resource.RLIMIT_NOFILE)[1] < max(soft, hard):
        pytest.skip("this machine's hard limit of open files is lower than the test's")
    done = subprocess.run([sys.executable, "-c", OPEN_FILES, _model(tmp_path), str(n), str(soft), str(hard)],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    mapped, wrong, kept, limit, keeps_no_fd, said = done.stdout.rstrip("\n").split(" ", 5)
    return int(mapped), int(wrong), int(kept), int(limit), keeps_no_fd == "1", said


def test_more_tiles_than_the_soft_limit_of_open_files_are_all_mapped(cache_root, tmp_path):
    """Before: each mapped tile held an open file (Python's mmap keeps one before 3.13), so a model of
    more tiles than the soft limit (1024 on many systems; a 7B model has ~1200) failed its cached runs
    with "Too many open files", after removing as damaged the tiles it could not open. Now the soft
    limit is raised to the hard one where the maps need it, and every tile comes back, unsaid."""
    mapped, wrong, kept, limit, keeps_no_fd, said = _open_files(tmp_path, 700, 500, 4000)
    assert (mapped, wrong, kept, said) == (700, 0, 700, "")
    assert limit == 4000 or keeps_no_fd           # raised only where a map holds a file


def test_past_the_hard_limit_tiles_are_repacked_in_memory_not_removed(cache_root, tmp_path):
    """With no higher limit to raise to, maps stop FILES_SPARED open files short of it: the rest
    come back as None (the caller repacks them in memory), no tile is removed or written again, the
    process can still open files (it writes one after), and it says so once."""
    mapped, wrong, kept, limit, keeps_no_fd, said = _open_files(tmp_path, 700, 500, 500)
    assert (wrong, kept, limit) == (0, 700, 500)
    if keeps_no_fd:                               # Python 3.13+: a map holds no file
        assert (mapped, said) == (700, "")
    else:
        assert 0 < mapped <= 500 - packs.FILES_SPARED
        assert said.count("repacked in memory, not mapped from the cache") == 1 and "ulimit -n" in said, said


# -- the command line -------------------------------------------------------------------------------
CLI = """
import sys
import ggtool.quant.packs as P
P.MIN_FILE_BYTES = 0
sys.argv = ["ggtool", *sys.argv[1:]]
from ggtool.commands import console
console()
"""


@pytest.fixture(scope="module")
def kernels(tmp_path_factory):
    """A kernel cache with Q8_0's dot and activation quantizer compiled and marked ready, shared by
    the command lines below (NUMBA_CACHE_DIR), so that they use the compiled kernels and their packs."""
    where = tmp_path_factory.mktemp("kernels")
    env = {**os.environ, "NUMBA_CACHE_DIR": str(where)}
    r = subprocess.run([sys.executable, "-c", textwrap.dedent("""
        from ggtool.compiling import warm
        from ggtool.kernels import cache
        for name in ("dot:q8_0", "quantize:Q8_0_cpu"):
            warm.compile_kernel(name)
            cache.subfolder(cache.cache_dir(), "ready")
            cache.touch(cache.marker("ready", name))
    """)], env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    return str(where)


def _weights(path, seed: int):
    from conftest import write_gguf

    from ggtool import quant as Q

    w = np.random.default_rng(seed).standard_normal((64, 256)).astype(np.float32)
    write_gguf(path, {"w": (Q.quantize_q8_0(w), 8)})        # 8: GGML_TYPE_Q8_0


def _compute(model, cache_dir, kernels, **env):
    env = {**os.environ, "GGTOOL_CACHE_DIR": str(cache_dir), "NUMBA_CACHE_DIR": kernels, **env}
    x = "[" + ",".join(str((k % 7) - 3) for k in range(256)) + "]"
    return subprocess.run([sys.executable, "-c", CLI, "compute", "mul_mat(w, x)", "--gguf", str(model), "--tensor", f"x={x}"],
                          env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_the_command_line_never_computes_with_old_or_damaged_tiles(tmp_path, kernels):
    """End to end: a file rewritten in place with `touch -r` computes with its new weights; a
    flipped byte in a tile is one `Warning:` line, the right result and exit 0; the run after is
    silent."""
    model = tmp_path / "m.gguf"
    _weights(model, 1)
    first = _compute(model, tmp_path / "c", kernels)
    assert first.returncode == 0 and first.stderr == "", first.stderr
    tiles = [os.path.join(d, f) for d, _, fs in os.walk(tmp_path / "c" / "packs") for f in fs if f.endswith(".pack")]
    assert tiles                                   # the compute went through the packs
    st = os.stat(model)
    _weights(model, 2)
    os.utime(model, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.stat(model).st_size == st.st_size
    second = _compute(model, tmp_path / "c", kernels)
    fresh = _compute(model, tmp_path / "none", kernels, GGTOOL_CACHE_MAX="0")
    assert second.returncode == 0 and second.stdout == fresh.stdout != first.stdout
    tiles = [os.path.join(d, f) for d, _, fs in os.walk(tmp_path / "c" / "packs") for f in fs if f.endswith(".pack")]
    for tile in tiles:
        _flip(tile, os.path.getsize(tile) // 2)
    third = _compute(model, tmp_path / "c", kernels)
    assert third.returncode == 0 and third.stdout == fresh.stdout
    lines = third.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"Warning: repacked weights of {model} in the cache were refused "
                                                   "and are rebuilt: ") and lines[0].endswith("does not match its checksum")
    fourth = _compute(model, tmp_path / "c", kernels)
    assert fourth.returncode == 0 and fourth.stdout == fresh.stdout and fourth.stderr == ""


def test_a_bad_cache_max_is_one_error_line(tmp_path, kernels):
    model = tmp_path / "m.gguf"
    _weights(model, 1)
    r = _compute(model, tmp_path / "c", kernels, GGTOOL_CACHE_MAX="lots")
    assert r.returncode == 1 and r.stdout == ""
    (line,) = r.stderr.splitlines()
    assert line == "Error: GGTOOL_CACHE_MAX must be a size such as 2G, 512M or a number of bytes, got 'lots'"


def test_the_tiles_identity_covers_every_packer_and_record_source():
    """A change to any code a packed form comes from (kernels' packers and decoders, a qtypes record's
    K form or levels, the grids) makes new tiles: those files are the digest's."""
    names = {os.path.relpath(p, os.path.dirname(os.path.dirname(packs.__file__))) for p in packs.packer_sources()}
    assert {"kernels/dot.py", "kernels/dot_k.py", "kernels/decode.py", "kernels/simd.py", "qtypes/__init__.py",
            "qtypes/iq2.py", "qtypes/iq4nl.py", "qtypes/grids.py", "qtypes/kquant.py"} <= names
    assert all(os.path.isfile(p) for p in packs.packer_sources())
