"""Hostile inputs against memory safety: every tensor access stays inside its tensor, by construction.

One test per hostile class (views reaching outside, writes through them, rows past the end,
malformed parameters, overlapping cpy, a mapped file truncated under us), then a seeded random
corpus of views: each is refused when made, or every byte any op reads or writes through it lies
inside its root tensor.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
from conftest import STORIES, fails, ok

import ggtool
from ggtool.errors import ComputeError, ShapeError
from ggtool.ops import FUNCTIONS
from ggtool.pool.shm import list_segments

try:
    from numpy.lib.array_utils import byte_bounds
except ImportError:  # numpy < 2
    from numpy import byte_bounds

A4x4 = "a=[[1,2,3,4],[5,6,7,8],[9,10,11,12],[13,14,15,16]]"


def test_view_with_a_negative_stride_is_refused(run):
    """It crashed with SIGSEGV (-4000), or read the bytes before the tensor (smaller strides)."""
    fails(run("compute", "abs(view_3d(a,4,1,8,-4000,16,0))", "--tensor", "a=f32[4,8]"),
          "line 1, column 5", "nb=[4, -4000, 16, 128]", "between 0 and 2^63-1")
    fails(run("compute", "abs(view_2d(a,4,2,-16,16))", "--tensor", A4x4), "nb=[4, -16, -32, -32]")


def test_view_whose_strides_reach_past_its_tensor_is_refused(run):
    """GGML asserts only that the packed size fits from the offset: rows 2-3 of this view were read
    past the end of 'a' (the pool's zeros, or another input), with exit 0."""
    fails(run("compute", "abs(view_2d(a,4,4,32,0))", "--tensor", A4x4),
          "byte strides nb [4, 32, 128, 128] at offset 0 reaches byte 112 of 'a', which has 64 bytes")
    fails(run("compute", "abs(view_4d(a,2,2,2,2,8,16,40,0))", "--tensor", A4x4), "reaches byte 72 of 'a'")
    # the same strides inside the tensor are a view like any other
    assert ok(run("compute", "abs(view_2d(a,4,2,32,0))", "--tensor", A4x4)) == "[[1,2,3,4],[9,10,11,12]]\n"


def test_view_of_a_view_is_checked_against_the_root(run):
    fails(run("compute", "abs(view_1d(view_1d(a,8,32),4,24))", "--tensor", A4x4),
          "view of 16 bytes at offset 56 runs past the end of 'a' (64 bytes)")


def test_writes_through_an_outside_view_are_refused_and_leave_every_input_alone(run):
    """clamp and cpy write into their destination: a view with a negative stride, or past its
    tensor's end, is refused and no other input is overwritten."""
    fails(run("compute", "clamp(view_2d(a,4,2,-16,16), 0, 1)", "--tensor", A4x4, "--tensor", "b=[1,2,3,4]"),
          "nb=[4, -16")
    fails(run("compute", "cpy(b, view_2d(a,4,2,48,32))", "--tensor", A4x4, "--tensor", "b=[[0,0,0,0],[0,0,0,0]]"),
          "reaches byte 96 of 'a'")
    out = ok(run("compute", "c = cpy(b, view_2d(a,2,2,32,8))", "--output", "c", "--output", "a",
                 "--tensor", A4x4, "--tensor", "b=[[-1,-2],[-3,-4]]"))
    assert out == '{"c":[[-1,-2],[-3,-4]],"a":[[1,2,-1,-2],[5,6,7,8],[9,10,-3,-4],[13,14,15,16]]}\n'


@pytest.mark.parametrize("program, message", [
    ("abs(view_1d(a,18446744073709551616,0))", "integer '18446744073709551616' is out of range (int64"),
    ("abs(view_2d(a,4,2,4611686018427387904,0))", "nb=[4, 4611686018427387904, 9223372036854775808"),
    ("abs(view_1d(a,-4,0))", "up to 4 non-negative dimensions"),
    ("abs(view_1d(a,4,-8))", "offset must be >= 0, got -8"),
    ("diag_mask_inf(a, 4294967296)", "diag_mask_inf: parameter 0 = 4294967296 does not fit GGML's int32 op_params"),
    ("new_tensor_4d(f32, 4294967296, 4294967296, 4294967296, 1)", "more than GGML's sizes (int64) can count"),
    ("soft_max_ext(a, null, 1e39, 0.0)", "soft_max: parameter 0 = 1e+39 does not fit GGML's float32 op_params"),
    ("clamp(a, -1e40, 2)", "clamp: parameter 0 = -1e+40 does not fit GGML's float32 op_params (it would be inf)"),
])
def test_parameters_beyond_ggml_integers_are_clear_errors(run, program, message):
    """They were `Error: internal error: ValueError ...` or OverflowError tracebacks. The DSL keeps its
    numbers in int64; a stride it computes from them (nb2 = nb1 * ne1) can still leave it."""
    fails(run("compute", program, "--tensor", A4x4), message)


def test_float_parameters_are_kept_only_where_float32_holds_them():
    """A finite float that float32 cannot hold was stored as inf behind a numpy RuntimeWarning (exit
    0, the scale silently infinite); a NaN parameter is refused; an infinity given as such (a clamp's
    open bound, as GGML's -INFINITY) and a value that rounds to FLT_MAX are kept."""
    ctx = ggtool.Context()
    a = ctx.new_tensor_from(np.arange(4, dtype=np.float32), name="a")
    with pytest.raises(ShapeError, match="clamp: parameter 1 is NaN"):
        FUNCTIONS["clamp"](ctx, a, 0.0, float("nan"))
    c = FUNCTIONS["clamp"](ctx, a, float("-inf"), 3.4028235e38)
    assert c.param_f32(0) == float("-inf") and c.param_f32(1) == float(np.finfo(np.float32).max)


@pytest.mark.parametrize("ne, offset, message", [
    ([2**64], 0, "ne=[18446744073709551616, 1, 1, 1]: up to 4 non-negative dimensions, each below 2^63"),
    ([4], 2**64, "view offset 18446744073709551616 into 'a' is not between 0 and 2^63-1"),
])
def test_the_engine_refuses_what_int64_cannot_hold(ne, offset, message):
    """The library takes Python ints of any size: the checks are the engine's, not the DSL's."""
    ctx = ggtool.Context()
    a = ctx.new_tensor_from(np.zeros(16, np.float32), name="a")
    with pytest.raises(ShapeError, match=re.escape(message)):
        FUNCTIONS["view_1d"](ctx, a, *ne, offset)


def test_a_row_walk_that_would_leave_its_tensor_is_refused_at_compute(run):
    """The view is inside 'a' (rows at nb2 = 16), but GGML's unary kernels step rows by nb1 = 1000:
    GGML reads whatever lies there; ggtool refuses to."""
    fails(run("compute", "abs(view_3d(a,4,1,3,1000,16,0))", "--tensor", A4x4),
          "(ABS) failed: GGML's row walk (row i at i*nb1) of 'a (view)' reaches byte 2016 of 'a', which has 64 bytes")


def test_overlapping_cpy_is_refused(run):
    """Source and destination sharing bytes in different layouts gave different results for 1 and 2
    threads (GGML's threads race on them)."""
    for threads in ("1", "2"):
        fails(run("compute", "cpy(view_1d(a,4000,0), view_1d(a,4000,384))", "--tensor", "a=f32[8000]",
                  "--threads", threads), "cpy: a 'a (view)' and b 'a (view)' overlap in 'a'", "cont(a)")
    fails(run("compute", "cpy(transpose(a), a)", "--tensor", A4x4), "overlap in 'a'")


def test_cpy_within_one_tensor_without_overlap_is_the_same_for_any_thread_count(run):
    a = np.arange(8000, dtype=np.float32)
    want = a.copy()
    want[4000:] = a[:4000]
    outs = {ok(run("compute", "c = cpy(view_1d(a,4000,0), view_1d(a,4000,16000))", "--output", "c", "--output", "a",
                   "--tensor", f"a={a.tolist()}", "--threads", t)) for t in ("1", "2")}
    assert len(outs) == 1
    assert np.array_equal(np.array(json.loads(outs.pop())["a"], np.float32), want)
    assert ok(run("compute", "cpy(a, a)", "--tensor", "a=[1,2]")) == "[1,2]\n"   # each element onto itself


# -- a memory-mapped file truncated under us ---------------------------------------------------------------
def test_maps_are_verified_once_per_file():
    """A GGUF's tensors each carry a storage of their own, equal by file: a compute checks each file
    once (one stat), not once per tensor (236 per step of gemma-3's one-token graph)."""
    class Counted:
        calls: list = []

        def __init__(self, path):
            self.path = path

        def __eq__(self, other):
            return isinstance(other, Counted) and other.path == self.path

        def __hash__(self):
            return hash(self.path)

        def verify(self):
            Counted.calls.append(self.path)

    from ggtool import compute  # (not an attribute of ggtool until something imports it)

    ctx = ggtool.Context()
    g = ggtool.Graph(ctx)
    for path in ("a.gguf", "a.gguf", "b.gguf"):
        g.expand(ctx.new_tensor("f32", [4], storage=Counted(path), data_offset=0))
    compute.verify_maps(g)
    assert sorted(Counted.calls) == ["a.gguf", "b.gguf"]


def test_a_frozen_graphs_maps_are_found_once_and_verified_at_every_compute(monkeypatch):
    """A frozen graph (a decode step's) keeps its leafs: the files it reads are found once, and
    each is still verified at every compute (a file that shrank after the first is refused)."""
    class Shrinking:
        size = 8

        def __eq__(self, other):
            return isinstance(other, Shrinking)

        def __hash__(self):
            return 1

        def verify(self):
            if Shrinking.size < 8:
                raise ggtool.InputError("model.gguf shrank")

    from ggtool import compute

    walks = []
    maps_read = compute.maps_read
    monkeypatch.setattr(compute, "maps_read", lambda graph: walks.append(graph) or maps_read(graph))
    ctx = ggtool.Context()
    g = ggtool.Graph(ctx)
    for _ in range(3):
        g.expand(ctx.new_tensor("f32", [4], storage=Shrinking(), data_offset=0))
    compute.verify_maps(g)              # not frozen: walked at every compute
    compute.freeze(g)
    compute.verify_maps(g)
    compute.verify_maps(g)
    assert walks == [g, g]
    Shrinking.size = 4
    with pytest.raises(ggtool.InputError, match="shrank"):
        compute.verify_maps(g)


_TRUNCATE = textwrap.dedent("""
    import os, sys
    import ggtool, ggtool.compute
    from ggtool import role
    from ggtool.gguf_io import open_gguf
    from ggtool.ops import FUNCTIONS
    path, n, when = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    # as the command line sets it; a frozen graph's case as a library: no SIGBUS guard, so only
    # verify_maps can make its truncation one error (a skipped check would end it with SIGBUS)
    role.COMMAND_LINE = not when.endswith("-frozen")
    g = open_gguf(path)
    info = g.tensors["token_embd.weight"]
    ctx = ggtool.Context()
    w = ctx.new_tensor(info.type, info.ne, storage=g.storage(), data_offset=info.offset)
    w.name = "w"
    graph = ggtool.Graph(ctx).expand(FUNCTIONS["scale"](ctx, w, 2.0))
    pool = ggtool.get_pool(n) if n > 1 else None
    if when.endswith("-frozen"):          # a decode step's graph: its maps found once, verified each time
        (pool.freeze if pool is not None else ggtool.compute.freeze)(graph)
        when = when[:-len("-frozen")]
    if when == "before-map":
        os.truncate(path, 4096)
    elif when == "removed":
        os.unlink(path)
    elif when == "replaced":              # another file of the same size put in its place
        data = bytearray(open(path, "rb").read())
        data[-4096:] = bytes(4096)
        with open(path + ".new", "wb") as f:
            f.write(data)
        os.replace(path + ".new", path)
    else:
        ggtool.graph_compute(graph, n, pool=pool)       # every participant has mapped the file
        os.truncate(path, 4096)
    if when == "during":                  # as if it shrank between the check and the reads
        ggtool.compute.verify_maps = lambda graph: None
    try:
        ggtool.graph_compute(graph, n, pool=pool)
    except ggtool.GGToolError as e:
        print("Error:", e, file=sys.stderr)
        sys.exit(1)
""")


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("when", ["before-map", "after-map", "after-map-frozen", "during", "replaced", "removed"])
def test_a_mapped_file_truncated_while_in_use_is_one_clean_error(tmp_path, threads, when):
    """No SIGBUS (exit 135, nothing said), for any thread count (the caller computes its share
    too): one line names the file, and no shared memory is left behind. A file replaced by another
    of the same size before it was mapped is refused too: its tensors' offsets and types were read
    from the earlier one (a worker mapped the new file and computed with its bytes)."""
    path = tmp_path / "model.gguf"
    shutil.copy(STORIES, path)
    p = subprocess.Popen([sys.executable, "-c", _TRUNCATE, str(path), str(threads), when],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 1, err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), err
    # the file's size when opened travels with its storage: a participant that maps it only after
    # the truncation still tells a shrunk file from a short one
    if when == "before-map":
        assert f"{path} shrank from 1185376 to 4096 bytes since it was opened" in lines[0]
    elif when == "replaced":
        assert f"{path} changed since it was opened (rewritten or replaced while in use?)" in lines[0]
    elif when == "removed":
        assert f"{path} can no longer be read (No such file or directory)" in lines[0]
    else:
        assert re.search(f"{re.escape(str(path))} shrank from 1185376 to 4096 bytes "
                         "(while memory-mapped|since it was opened)", lines[0]), lines[0]
    assert [s for s in list_segments() if s.startswith(f"ggtool_{p.pid}_")] == []


# -- a seeded corpus of random views ---------------------------------------------------------------------
def _random_layout(rng: random.Random):
    ne = [rng.choice([0, 1, 1, 2, 3, 4, 5, 7, 16]) for _ in range(4)]
    nb = [rng.choice([-64, -4, 0, 4, 8, 12, 16, 20, 28, 64, 100, 256, 2**62, 2**63, 2**64])
          for _ in range(3)]
    offset = rng.choice([0, 0, 4, 8, 12, 60, 124, 128, 252, 2**63, 2**64])
    return ne, nb, offset


def test_random_views_never_reach_outside_their_tensor():
    """500 seeded views of a 64-float tensor, lying beside another: each is refused with a ShapeError
    when made, or its bytes, and every byte an op reads or writes through it, are inside its root,
    and the tensor beside it is never touched."""
    rng = random.Random(19)
    outcomes = {"refused": 0, "computed": 0, "refused at compute": 0}
    for _ in range(500):
        ctx = ggtool.Context()
        a = ctx.new_tensor_from(np.arange(64, dtype=np.float32).reshape(4, 16), name="a")
        b = ctx.new_tensor_from(np.full(16, 7, np.float32), name="b")
        ne, nb, offset = _random_layout(rng)
        try:
            v = FUNCTIONS["view_4d"](ctx, a, *ne, *nb, offset)
        except ShapeError:
            outcomes["refused"] += 1
            continue
        lo, hi = byte_bounds(a.data)
        if v.nelements:
            vlo, vhi = byte_bounds(v.data)
            assert lo <= vlo and vhi <= hi, (ne, nb, offset)
        for name, args in (("abs", ()), ("clamp", (0.0, 10.0)), ("sum_rows", ()), ("cont", ())):
            try:
                op = FUNCTIONS[name](ctx, v, *args)
            except ShapeError:   # GGML's own asserts (e.g. packed rows for abs)
                outcomes["refused"] += 1
                continue
            try:
                ggtool.graph_compute(ggtool.Graph(ctx).expand(op), 1)
            except ComputeError as e:
                assert "reaches byte" in str(e) or "GGML computes it" in str(e), str(e)
                outcomes["refused at compute"] += 1
            else:
                outcomes["computed"] += 1
        assert np.array_equal(b.data.ravel(), np.full(16, 7, np.float32)), (ne, nb, offset)
    assert all(outcomes.values()), outcomes   # the corpus exercises every outcome


@pytest.mark.parametrize("threads", ["1", "2"])
def test_the_command_line_survives_its_model_truncated_mid_compute(tmp_path, threads):
    """The real `ggtool compute` (its guard installed by the command line): the file is truncated
    once the process has mapped its data (a second map of it: the header's is the first), while a
    long graph keeps reading it. Whether the compute's check or a read then meets the loss, it ends
    in one line naming the file."""
    from conftest import write_gguf

    path = tmp_path / "big.gguf"
    write_gguf(path, {"w": np.ones((64, 4096), np.float32)})
    program = "s = scale(w, 1.0); for i in range(1500): s = add(s, scale(w, 1.0)); end; sum(s)"
    p = subprocess.Popen([sys.executable, "-m", "ggtool", "compute", program, "--gguf", str(path),
                          "--threads", threads, "--graph-size", "8192"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while _maps(p.pid).count(str(path)) < 2:
            assert p.poll() is None and time.monotonic() < deadline, "the model was never mapped"
            time.sleep(0.005)
        os.truncate(path, 4096)
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 1 and out == "", err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and "Traceback" not in err, err
    # a worker that maps the file only after the truncation (a first-ever run's) says "since it was opened"
    assert re.search(f"{re.escape(str(path))} shrank from [0-9]+ to 4096 bytes (while memory-mapped|since it was opened)",
                     lines[0]), lines[0]
    assert [s for s in list_segments() if s.startswith(f"ggtool_{p.pid}_")] == []


def _maps(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/maps") as f:
            return f.read()
    except OSError:
        return ""
