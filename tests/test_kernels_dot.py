"""ggtool.kernels.dot (compiled Q4_0/Q8_0 x Q8_0 dot products) against the numpy oracle, in graphs
with 1..4 participants, with the repacked-weight cache, and the kernel layer's loading rules."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from conftest import ROOT, ok, write_gguf
from kernel_threads import compute_threaded
from oracle_matmul import mul_mat_exact

import ggtool
from ggtool import qtypes
from ggtool import quant as Q
from ggtool import types as T


def _weights(rng, n, k, wtype):
    return Q.quantize(rng.standard_normal((n, k)).astype(np.float32), wtype)


def _acts(rng, m, k):
    return Q.quantize_q8_0_cpu(rng.standard_normal((m, k)).astype(np.float32))


@pytest.mark.parametrize("wtype", ["q4_0", "q8_0"])
@pytest.mark.parametrize("n,k,m", [(1, 32, 1), (31, 64, 2), (33, 96, 1), (70, 256, 3), (130, 512, 16), (260, 128, 40)])
def test_dot_is_ggml_scalar_reference_bit_for_bit(wtype, n, k, m):
    rng = np.random.default_rng(n * 1000 + k + m)
    w, a = _weights(rng, n, k, wtype), _acts(rng, m, k)
    out = np.full((m, n), np.nan, np.float32)
    record = qtypes.get(wtype)
    record.mul_mat_packed_into(record.pack(w), a, out)
    assert out.tobytes() == mul_mat_exact(w, wtype, a).tobytes()


@pytest.mark.parametrize("wtype", ["q4_0", "q8_0"])
def test_dot_extreme_codes_are_exact(wtype):
    """Every code at its extreme (|sumi| at its largest) with fp16 scales of both signs."""
    k, n = 256, 40
    w = np.zeros((n, k // 32, 18 if wtype == "q4_0" else 34), np.uint8)
    w[..., 2:] = 0x00 if wtype == "q4_0" else 0x80          # codes -8 / -128
    w[::2, :, 2:] = 0xFF if wtype == "q4_0" else 0x7F      # codes 7 / 127
    w[..., :2] = np.frombuffer(np.float16(-3.5).tobytes(), np.uint8)
    a = np.zeros((2, k // 32, 34), np.uint8)
    a[..., 2:] = 0x80                                       # -128
    a[..., :2] = np.frombuffer(np.float16(0.25).tobytes(), np.uint8)
    w, a = w.reshape(n, -1), a.reshape(2, -1)
    assert Q.mul_mat_quantized(w, wtype, a).tobytes() == mul_mat_exact(w, wtype, a).tobytes()


def _mul_mat_graph(wq, wtype, x):
    ctx = ggtool.Context()
    n, k = wq.shape[0], x.shape[1]
    w = ctx.new_tensor(wtype, [k, n]).set_data(wq)
    b = ctx.new_tensor("f32", [k, x.shape[0]]).set_data(x)
    y = ggtool.ops.FUNCTIONS["mul_mat"](ctx, w, b)
    g = ggtool.Graph(ctx)
    g.expand(y)
    return g, y, w


@pytest.mark.parametrize("wtype", ["q4_0", "q8_0"])
@pytest.mark.parametrize("m", [3, 20])
def test_mul_mat_node_bit_identical_for_1_to_4_participants(wtype, m):
    """Several column tiles (N > 2 x 1024) and a partial row group: the tile grid is fixed by shapes."""
    rng = np.random.default_rng(m)
    k, n = 64, 2 * 1024 + 45
    wq = _weights(rng, n, k, wtype)
    x = rng.standard_normal((m, k)).astype(np.float32)
    g, y, _ = _mul_mat_graph(wq, wtype, x)
    ggtool.graph_compute(g, 1)
    one = y.data.copy()
    want = mul_mat_exact(wq, wtype, Q.quantize_q8_0_cpu(x))
    assert one.tobytes() == want.tobytes()
    for nth in (2, 3, 4):
        y.data[...] = 0
        compute_threaded(g, nth, force=True)
        assert y.data.tobytes() == one.tobytes(), f"{nth} participants differ from 1"


def test_mul_mat_node_on_the_pool_matches_one_process():
    rng = np.random.default_rng(5)
    wq = _weights(rng, 1500, 128, "q4_0")
    x = rng.standard_normal((2, 128)).astype(np.float32)
    g, y, _ = _mul_mat_graph(wq, "q4_0", x)
    ggtool.graph_compute(g, 1)
    one = y.data.copy()
    y.data[...] = 0
    ggtool.graph_compute(g, 2, pool=ggtool.get_pool(2))
    assert y.data.tobytes() == one.tobytes()


def test_repacked_context_weight_follows_set_data():
    rng = np.random.default_rng(6)
    w1, w2 = _weights(rng, 64, 64, "q4_0"), _weights(rng, 64, 64, "q4_0")
    x = rng.standard_normal((1, 64)).astype(np.float32)
    g, y, w = _mul_mat_graph(w1, "q4_0", x)
    act = Q.quantize_q8_0_cpu(x)
    ggtool.graph_compute(g, 1)
    assert y.data.tobytes() == mul_mat_exact(w1, "q4_0", act).tobytes()
    w.set_data(w2)                                          # the cached repack must not survive this
    ggtool.graph_compute(g, 1)
    assert y.data.tobytes() == mul_mat_exact(w2, "q4_0", act).tobytes()


def test_repacked_file_weight_is_cached_per_map(tmp_path, run):
    from ggtool.gguf_io import storage

    rng = np.random.default_rng(7)
    x = rng.standard_normal((1, 64)).astype(np.float32)
    act = Q.quantize_q8_0_cpu(x)
    path = tmp_path / "w.gguf"
    for i in range(2):                                      # a rewritten file is repacked anew
        wq = _weights(rng, 48, 64, "q4_0")
        write_gguf(path, {"w": (wq, T.Q4_0)})
        os.utime(path, ns=(i + 1, (i + 1) * 10**9))         # a distinct mtime even on coarse clocks
        got = ok(run("compute", "mul_mat(w, x)", "--tensor", f"w={path}:w", "--tensor",
                     "x=" + str(x.tolist()), "--format", "json"))
        want = mul_mat_exact(wq, "q4_0", act)
        assert np.array_equal(np.array(eval_json(got), np.float32).reshape(want.shape), want)
        derived = storage._MAPS[str(path)][2]
        assert len(derived) == 1                            # one tile of one weight, repacked once


def eval_json(text):
    import json
    return json.loads(text)


def _python(code: str, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=300)


def test_numba_is_not_imported_for_f32_work():
    r = _python("""
        import sys
        import ggtool, ggtool.quant
        from ggtool.commands import cli
        try:
            cli(["compute", "add(a, b)", "--tensor", "a=[1,2]", "--tensor", "b=[3,4]"], standalone_mode=False)
        finally:
            print("numba" in sys.modules)
    """)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["[4,6]", "False"]


def test_kernel_cache_goes_to_ggtool_cache_dir(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    env["GGTOOL_CACHE_DIR"] = str(tmp_path)
    r = _python("""
        import numpy as np
        from ggtool import quant as Q
        w = Q.quantize_q4_0(np.ones((4, 32), np.float32))
        print(Q.mul_mat_quantized(w, "q4_0", Q.quantize_q8_0_cpu(np.ones((1, 32), np.float32))).tolist())
    """, env)
    assert r.returncode == 0, r.stderr
    assert np.allclose(eval_json(r.stdout), 32, rtol=1e-3)      # 1 x 1 in 32 products, as fp16 scales give
    (kernels,) = [f for f in os.listdir(tmp_path / "numba") if not f.startswith(".")]   # named after what the code
    # depends on: see test_kernel_cache.py (beside it .pruned: test_old_kernel_folders.py)
    from ggtool.kernels import cache
    assert kernels == cache.kernel_key()         # cache.SHARED's members: test_kernel_cache.py
    assert any(f.endswith(".nbi") for _, _, fs in os.walk(tmp_path / "numba" / kernels) for f in fs)


QUANTIZED_COMPUTE = """
    import sys
    from ggtool.commands import main
    row = "[" + ",".join(["1"] * 32) + "]"
    sys.argv = ["ggtool", "compute", "mul_mat(w, x)", "--tensor", f"w=q4_0:[{row},{row}]", "--tensor", f"x=[{row}]"]
    try:
        main()
    finally:
        print("numba" in sys.modules, file=sys.stderr)
"""


def _cache_env(tmp_path, ready=()) -> dict:
    """An empty kernel cache in tmp_path, with `ready` kernels marked as compiled."""
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    env["GGTOOL_CACHE_DIR"] = str(tmp_path)
    for name in ready:
        marker = _python(f"from ggtool.kernels import cache; print(cache.marker('ready', {name!r}))", env).stdout.strip()
        os.makedirs(os.path.dirname(marker), exist_ok=True)
        open(marker, "w").close()
    return env


def test_a_first_ever_quantized_compute_imports_no_numba(tmp_path):
    """Every kernel runs its numpy twin (ggtool.kernels.cache): numba's ~0.5-1 s of start-up is left out."""
    r = _python(QUANTIZED_COMPUTE, _cache_env(tmp_path))
    assert r.returncode == 0, r.stderr
    assert r.stderr.splitlines()[-1] == "False"


def test_missing_numba_is_one_clear_error(tmp_path):
    """A quantized compute without numba, its kernel in the cache: one `Error:` line saying what to
    install, no traceback."""
    r = _python('import sys\nsys.modules["numba"] = None\n' + textwrap.dedent(QUANTIZED_COMPUTE),  # import numba -> ImportError
                _cache_env(tmp_path, ready=["dot:q4_0"]))
    assert r.returncode == 1
    assert "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()[:-1]     # the last: whether numba was imported
    assert len(lines) == 1 and lines[0].startswith("Error: ") and "numba" in lines[0], r.stderr
