"""`numerics="x86"`: mul_mat, soft_max and rope summed as llama.cpp's x86-64 build sums them
(ggtool.kernels.x86), bit for bit against the numpy oracle of that build (tests/llamacpp_x86.py,
which reproduces llama.cpp's gemma logits exactly), and bit-identical for 1..N participants, in
threads and in the worker pool."""

from __future__ import annotations

from pathlib import Path

import gguf
import llamacpp_x86 as oracle
import numpy as np
import pytest
from conftest import write_gguf
from kernel_threads import compute_threaded
from oracle_matmul import random_blocks

import ggtool
from ggtool.errors import GGToolError
from ggtool.ops import FUNCTIONS as F

f32 = np.float32
BLOCK = ("q8_0", "q5_0", "q4_0", "q4_K", "q6_K")


def _mul_mat(t, w, x):
    ctx = ggtool.Context()
    a = ctx.new_tensor(t, [x.shape[1], w.shape[0]]).set_data(w)
    b = ctx.new_tensor("f32", [x.shape[1], x.shape[0]]).set_data(x)
    y = F["mul_mat"](ctx, a, b)
    g = ggtool.Graph(ctx)
    g.expand(y)
    return g, y


@pytest.mark.parametrize("t", BLOCK)
@pytest.mark.parametrize("m", [1, 3, 8, 13])
def test_quantized_mul_mat_is_the_oracle_bit_for_bit(t, m):
    """Q8_0/Q5_0 (tinyBLAS lanes), Q4_0 (repacked), Q6_K (AVX2 dot below 8 rows, tiled from 8), Q4_K
    (gemm rows in fours, gemv for the rest); 1070 rows (1072 for the repacked Q4_0 and Q4_K: rows in
    eights): a second column tile and a partial group of decoded rows."""
    n, k = (1072 if t in ("q4_0", "q4_K") else 1070), 512
    w = random_blocks(t, n, k, m)
    x = np.random.default_rng(m).standard_normal((m, k)).astype(f32)
    g, y = _mul_mat(t, w, x)
    ggtool.graph_compute(g, 1, numerics="x86")
    got = y.numpy().reshape(m, n)
    assert got.tobytes() == oracle.mul_mat(t.upper(), w, x).tobytes()
    ggtool.graph_compute(g, 1)                                       # the default order differs somewhere
    assert y.numpy().tobytes() != got.tobytes() or (t, m) in {("q8_0", 1), ("q5_0", 1)}
    for nth in (2, 3):
        y.data[...] = 0
        compute_threaded(g, nth, force=True, numerics="x86")
        assert y.numpy().reshape(m, n).tobytes() == got.tobytes(), f"{nth} participants"


def test_q4_0_weights_llama_cpp_does_not_repack_sum_in_tinyblas_lanes():
    """Q4_0 weights llama.cpp leaves unpacked (rows not in eights) sum as tinyBLAS_Q0 sums them."""
    w = random_blocks("q4_0", 1070, 256, 7)
    x = np.random.default_rng(7).standard_normal((3, 256)).astype(f32)
    g, y = _mul_mat("q4_0", w, x)
    ggtool.graph_compute(g, 1, numerics="x86")
    assert y.numpy().reshape(3, 1070).tobytes() == oracle.mul_mat("Q4_0", w, x, repacked=False).tobytes()
    assert oracle.mul_mat("Q4_0", w, x, repacked=False).tobytes() != oracle.mul_mat("Q4_0", w, x).tobytes()


def _gap_graph():
    rng = np.random.default_rng(3)
    ctx = ggtool.Context()
    w = ctx.new_tensor("f16", [32, 8]).set_data(rng.standard_normal((8, 32)).astype(np.float16))
    q = ctx.new_tensor("q4_0", [32, 8]).set_data(random_blocks("q4_0", 8, 32, 3))
    x = ctx.new_tensor("f32", [32, 2]).set_data(rng.standard_normal((2, 32)).astype(f32))
    a = F["mul_mat"](ctx, w, x)
    b = F["silu"](ctx, a)
    c = F["mul_mat"](ctx, q, x)
    d = F["gelu"](ctx, c)
    e = F["mul_mat"](ctx, w, x)
    for t, name in ((a, "a"), (b, "b"), (c, "c"), (d, "d"), (e, "e")):
        t.name = name
    g = ggtool.Graph(ctx)
    g.expand(F["add"](ctx, F["add"](ctx, b, d), e))
    return g


def test_llama_cpp_gaps_name_nothing_where_every_node_has_llama_cpps_form():
    """Every weight type mul_mat takes (the float types and every qtypes record), and silu, have their
    llama.cpp x86 form: no gaps."""
    from ggtool import qtypes
    from ggtool import types as T
    from ggtool.ops import llama_cpp_gaps, matmul

    assert {T.F32, T.F16, T.BF16} <= set(matmul.X86_FLOAT)
    assert all(set(r.llama_cpp) == set(qtypes.X86_BUILDS) for r in qtypes.REGISTRY.values())
    assert set(r.x86_repacked for r in qtypes.REGISTRY.values()) == {(), qtypes.X86_BUILDS, ("llama.cpp-avx512",)}
    assert llama_cpp_gaps(_gap_graph().nodes) == []


def test_llama_cpp_gaps_group_uncovered_nodes_by_op_and_weight_type(monkeypatch):
    """ggtool.ops.llama_cpp_gaps: mul_mat with weights of no llama.cpp order, per weight type, and the
    unary ops without llama.cpp's form, in order of first appearance; covered nodes (q4_0 weights, gelu)
    are not named. (Every type has its form today: f16's and silu's are taken away here.)"""
    from ggtool.ops import llama_cpp_gaps, matmul, unary

    monkeypatch.setattr(matmul, "X86_FLOAT", tuple(t for t in matmul.X86_FLOAT if t != ggtool.types.F16))
    monkeypatch.setattr(unary, "X86_UNMODELLED", ("SILU",))
    gaps = llama_cpp_gaps(_gap_graph().nodes)
    assert [(gap.op, gap.weight_type, [n.name for n in gap.nodes]) for gap in gaps] == [
        ("MUL_MAT", "f16", ["a", "e"]), ("SILU", None, ["b"])]


def test_q4_k_weights_llama_cpp_does_not_repack_take_its_vec_dot():
    """Unpacked Q4_K (rows not in eights) takes ggml_vec_dot_q4_K_q8_K in llama.cpp (not the repacked
    kernels): --numerics x86 has that order too, and it sums otherwise than the default's."""
    from ggtool.ops.matmul import without_x86_order

    x = np.random.default_rng(8).standard_normal((3, 256)).astype(f32)
    g, _ = _mul_mat("q4_K", random_blocks("q4_K", 16, 256, 8), x)
    assert without_x86_order(g.nodes) == []
    g, y = _mul_mat("q4_K", random_blocks("q4_K", 12, 256, 8), x)
    assert without_x86_order(g.nodes) == []
    ggtool.graph_compute(g, 1, numerics="x86")
    got = y.numpy().tobytes()
    ggtool.graph_compute(g, 1)
    assert y.numpy().tobytes() != got


def test_q4_k_gemm_rows_follow_the_whole_matrix_across_row_tiles():
    """262 activation rows: the first 260 go through the gemm's order, the last 2 through the gemv's,
    also in the second tile of rows (rows 256..261)."""
    n, k, m = 40, 256, 262
    w = random_blocks("q4_K", n, k, 5)
    x = np.random.default_rng(5).standard_normal((m, k)).astype(f32)
    g, y = _mul_mat("q4_K", w, x)
    ggtool.graph_compute(g, 1, numerics="x86")
    assert y.numpy().reshape(m, n).tobytes() == oracle.mul_mat("Q4_K", w, x).tobytes()


# the F32 lanes and the soft_max's expf are where llama.cpp's two x86 builds differ
BUILDS = [("x86", True), ("llama.cpp-avx512", True), ("llama.cpp-avx2", False)]


@pytest.mark.parametrize("numerics,wide", BUILDS)
@pytest.mark.parametrize("k", [256, 200, 13])
def test_f32_mul_mat_tinyblas_when_b_is_contiguous_vec_dot_when_not(k, numerics, wide):
    """llamafile's sgemm takes a contiguous b whose k is a multiple of its lanes (16, AVX2 8: 256 for
    both, 200 for AVX2 only); else, and for a strided b, ggml_vec_dot_f32 (its tail as GCC compiled it)."""
    rng = np.random.default_rng(k)
    A = rng.standard_normal((12, k)).astype(f32)
    X = rng.standard_normal((5, k + 3)).astype(f32)
    ctx = ggtool.Context()
    a = ctx.new_tensor("f32", [k, 12]).set_data(A)
    full = ctx.new_tensor("f32", [k + 3, 5]).set_data(X)
    packed = ctx.new_tensor("f32", [k, 5]).set_data(np.ascontiguousarray(X[:, :k]))
    strided = F["view_2d"](ctx, full, k, 5, full.nb[1], 0)          # rows k + 3 apart: not contiguous
    y1, y2 = F["mul_mat"](ctx, a, packed), F["mul_mat"](ctx, a, strided)
    g = ggtool.Graph(ctx)
    g.expand(y1)
    g.expand(y2)
    ggtool.graph_compute(g, 1, numerics=numerics)
    B = np.ascontiguousarray(X[:, :k])
    tiny = k % (16 if wide else 8) == 0
    assert y1.numpy().tobytes() == (oracle.sgemm_f32 if tiny else oracle.vec_dot_f32)(A, B, wide).tobytes()
    assert y2.numpy().tobytes() == oracle.vec_dot_f32(A, B, wide).tobytes()


def test_the_two_builds_f32_lanes_differ():
    """The oracles of the two builds are not the same function: on these sums they part."""
    rng = np.random.default_rng(5)
    A, B = rng.standard_normal((16, 200)).astype(f32), rng.standard_normal((16, 200)).astype(f32)
    assert oracle.sgemm_f32(A, B).tobytes() != oracle.sgemm_f32(A, B, False).tobytes()
    assert oracle.vec_dot_f32(A, B).tobytes() != oracle.vec_dot_f32(A, B, False).tobytes()


@pytest.mark.parametrize("numerics,wide", BUILDS)
def test_soft_max_is_ggml_v_expf_in_chunks_of_16_or_8(numerics, wide):
    """AVX-512: 16-value chunks; AVX2: its own expf on 8-value chunks (rows 4 and 5 reach the
    scaled tails of the polynomial: exp of below -87, where 2^n is no longer a normal float)."""
    rng = np.random.default_rng(2)
    n, rows = 37, 6                                    # 37: two whole chunks and a partial one
    x = (rng.standard_normal((rows, n)) * 4).astype(f32)
    x[4:] = np.linspace(0, -110 / 0.125, n, dtype=f32)   # x * 0.125 down to -110
    mask = np.zeros((rows, n), f32)
    mask[np.triu_indices(rows, 1)] = -np.inf
    ctx = ggtool.Context()
    a = ctx.new_tensor("f32", [n, rows]).set_data(x)
    mk = ctx.new_tensor("f32", [n, rows]).set_data(mask)
    y = F["soft_max_ext"](ctx, a, mk, 0.125, 0.0)
    g = ggtool.Graph(ctx)
    g.expand(y)
    ggtool.graph_compute(g, 1, numerics=numerics)
    want = oracle.soft_max_rows(((x * f32(0.125)).astype(f32) + mask).astype(f32), wide=wide)
    assert y.numpy().tobytes() == want.tobytes()
    tail = ((x * f32(0.125)).astype(f32) < -88) & ((x * f32(0.125)).astype(f32) > -103)
    assert tail.sum() >= 4 and (y.numpy().reshape(rows, n)[tail] > 0).all()   # subnormal, not zero


SOFTMAX_REF = Path(__file__).parent / "golden" / "llama" / "softmax-tails.npz"


@pytest.mark.parametrize("numerics,build", [("llama.cpp-avx512", "avx512"), ("llama.cpp-avx2", "avx2")])
@pytest.mark.parametrize("n", [13, 37])
def test_soft_max_rows_are_llama_cpps_attention_rows(numerics, build, n):
    """A row whose length is no multiple of the lanes is taken as attention meets it in llama.cpp,
    in a KV cache of 256 cells (the rest masked): against llama.cpp's own ggml_soft_max_ext on such
    rows (golden, both builds), and the numpy oracle too. ggml_soft_max_ext on the bare row differs
    in the last bit (its last values through the C library's expf), as docs/engine.md says."""
    z = np.load(SOFTMAX_REF)
    x, want = z[f"x_{n}"], z[f"y_kv_{n}_{build}"]
    ctx = ggtool.Context()
    y = F["soft_max"](ctx, ctx.new_tensor("f32", [n, x.shape[0]]).set_data(x))
    g = ggtool.Graph(ctx)
    g.expand(y)
    ggtool.graph_compute(g, 1, numerics=numerics)
    assert y.numpy().tobytes() == want.tobytes()
    assert oracle.soft_max_rows(x, wide=build == "avx512").tobytes() == want.tobytes()
    assert y.numpy().tobytes() != z[f"y_{n}_{build}"].tobytes()


@pytest.mark.parametrize("wide", [True, False])
def test_expf_oracles_tails(wide):
    """Each build's expf, ggtool's compiled lane against the numpy oracle, over the whole range the
    soft_max meets (and the -inf of a masked cell)."""
    from ggtool.kernels import x86

    xs = np.concatenate([-np.geomspace(1e-6, 200, 4000), [0.0, -np.inf]]).astype(f32)
    got = np.empty((1, xs.size), f32)
    x86.soft_max_rows(xs[None], got, x86.EXPF, wide)    # softmax: exp(x - 0) / sum
    want = (oracle.v_expf if wide else oracle.v_expf_avx2)(xs)
    total = np.float64(0)
    step = 16 if wide else 8
    for i in range(0, xs.size, step):
        c = np.zeros(step, f32)
        c[: min(step, xs.size - i)] = want[i:i + step]
        total += np.float64(oracle.reduce16(c) if wide else oracle.h8(c))
    assert got.tobytes() == (want * f32(1.0 / total)).astype(f32).tobytes()


@pytest.mark.parametrize("mode", [0, 2])
def test_rope_is_the_c_librarys_cosf_and_two_fmas(mode):
    if oracle.LIBM is None:
        pytest.skip("no C library cosf/sinf to compare with")
    rng = np.random.default_rng(mode)
    ne0, heads, toks, n_dims = 64, 3, 9, 48
    x = rng.standard_normal((toks, heads, ne0)).astype(f32)
    pos = np.array([0, 1, 2, 3, 100, 5000, 7, 8, 70000], np.int32)
    ctx = ggtool.Context()
    a = ctx.new_tensor("f32", [ne0, heads, toks]).set_data(x)
    p = ctx.new_tensor("i32", [toks]).set_data(pos)
    y = F["rope_ext"](ctx, a, p, None, n_dims, mode, 0, 10000.0, 0.5, 0.0, 1.0, 0.0, 0.0)
    g = ggtool.Graph(ctx)
    g.expand(y)
    ggtool.graph_compute(g, 1, numerics="x86")
    cos, sin = oracle.rope_cache(pos, ne0, n_dims, 10000.0, 0.5, 1.0)
    half = n_dims // 2
    c, s = cos[:, None, :half], sin[:, None, :half]
    j0, j1 = (slice(0, half), slice(half, n_dims)) if mode == 2 else (slice(0, n_dims, 2), slice(1, n_dims, 2))
    want = x.copy()
    want[..., j0] = oracle.fma(x[..., j0], c, -(x[..., j1] * s).astype(f32))
    want[..., j1] = oracle.fma(x[..., j0], s, (x[..., j1] * c).astype(f32))
    assert y.numpy().tobytes() == want.tobytes()


def test_the_pool_computes_in_the_plans_numerics():
    """The numerics travel with the graph to the workers; the same graph in the other numerics is
    sent again, not taken from the workers' cache."""
    n, k, m = 300, 512, 9
    w = random_blocks("q6_K", n, k, 1)
    x = np.random.default_rng(1).standard_normal((m, k)).astype(f32)
    g, y = _mul_mat("q6_K", w, x)
    want = {}
    for numerics in ("x86", "ggml"):
        ggtool.graph_compute(g, 1, numerics=numerics)
        want[numerics] = y.numpy().tobytes()
    assert want["x86"] != want["ggml"]
    with ggtool.WorkerPool(2) as pool:
        for numerics in ("ggml", "x86", "ggml", "x86"):
            y.data[...] = 0
            ggtool.graph_compute(g, 2, pool=pool, numerics=numerics)
            assert y.numpy().tobytes() == want[numerics], numerics


@pytest.mark.parametrize("name", ["llama.cpp", "x86", "llama.cpp-avx2"])
def test_a_given_plan_with_a_name_to_resolve_computes_in_the_build_it_names(name):
    """Plan.numerics is public, and a plan can be made before the compute: its name is resolved as
    the argument is, so the kernels (and the pool's workers) never see "llama.cpp", whose lanes
    `numerics.wide` cannot tell (F32 lanes differ between the two builds at k = 200)."""
    from ggtool.kernels.numerics import host_flags, llama_cpp_variant, resolve
    from ggtool.plan import make_plan

    if name == "llama.cpp" and llama_cpp_variant(host_flags()) is None:
        pytest.skip("this CPU has no llama.cpp x86 build ggtool follows")
    rng = np.random.default_rng(7)
    A, X = rng.standard_normal((12, 200)).astype(f32), rng.standard_normal((5, 200)).astype(f32)
    g, y = _mul_mat("f32", A, X)
    ggtool.graph_compute(g, 1, numerics=name)
    want = y.numpy().tobytes()
    y.data[...] = 0
    plan = make_plan(g, 1)
    plan.numerics = name
    ggtool.graph_compute(g, 1, plan=plan)
    assert plan.numerics == resolve(name, host_flags())
    assert y.numpy().tobytes() == want


def test_unknown_numerics_is_one_clear_error():
    g, _ = _mul_mat("q8_0", random_blocks("q8_0", 4, 32, 0), np.ones((1, 32), f32))
    with pytest.raises(GGToolError, match="numerics must be one of ggml, llama.cpp, llama.cpp-avx2, llama.cpp-avx512, x86, not 'avx'"):
        ggtool.graph_compute(g, 1, numerics="avx")


def test_cli_numerics_x86_same_bytes_on_1_and_2_threads(run, npy, tmp_path):
    w = random_blocks("q5_0", 70, 64, 3)
    x = np.random.default_rng(3).standard_normal((4, 64)).astype(f32)
    src = write_gguf(tmp_path / "w.gguf", {"w": (w, gguf.GGMLQuantizationType.Q5_0)})
    outs = []
    for threads in ("1", "2"):
        out = tmp_path / f"y{threads}.npy"
        r = run("compute", "mul_mat(w, x)", "--gguf", str(src), "--tensor", f"x={npy(x)}", "--numerics", "x86",
                "--threads", threads, "-o", str(out))
        assert r.exit_code == 0, r.output
        outs.append(np.load(out))
    assert outs[0].tobytes() == outs[1].tobytes() == oracle.mul_mat("Q5_0", w, x).tobytes()
    r = run("compute", "mul_mat(w, x)", "--gguf", str(src), "--tensor", f"x={npy(x)}", "--numerics", "avx")
    assert r.exit_code == 2 and "'avx' is not one of 'ggml', 'llama.cpp', 'llama.cpp-avx2', 'llama.cpp-avx512', 'x86'" in r.output


def test_cli_numerics_x86_warns_of_weights_it_has_no_order_for(run, npy, monkeypatch):
    """Weights of no llama.cpp order under --numerics x86 sum in GGML's order: said once on stderr, the
    result as by default; weights it covers say nothing. (Every type has its order today: f16's is
    taken away here.)"""
    from ggtool.ops import matmul

    x = npy(np.random.default_rng(5).standard_normal((3, 64)).astype(f32), "x.npy")
    w = npy(np.random.default_rng(4).standard_normal((7, 64)).astype(f32), "w.npy")
    prog = "y = mul_mat(w, x); z = mul_mat(w, x); add(y, z)"
    covered = run("compute", prog, "--tensor", f"w=f16:{w}", "--tensor", f"x={x}", "--numerics", "x86")
    assert covered.exit_code == 0 and covered.stderr == "", covered.output
    monkeypatch.setattr(matmul, "X86_FLOAT", tuple(t for t in matmul.X86_FLOAT if t != ggtool.types.F16))
    monkeypatch.setattr(matmul, "x86_covered", lambda: "f32, q8_0")
    r = run("compute", prog, "--tensor", f"w=f16:{w}", "--tensor", f"x={x}", "--numerics", "x86")
    assert r.exit_code == 0, r.output
    assert r.stderr == ("Warning: --numerics x86 follows llama.cpp's order for mul_mat with f32, q8_0 weights, "
                        "soft_max, rope, gelu and silu; 2 mul_mat nodes with f16 weights (first: 'y') compute in "
                        "GGML's order and may differ from llama.cpp's in the last bits\n")
    default = run("compute", prog, "--tensor", f"w=f16:{w}", "--tensor", f"x={x}")
    assert default.stderr == "" and default.stdout == r.stdout
    assert covered.stdout != r.stdout       # f16's llama.cpp order (tinyBLAS) sums otherwise


def test_gelu_uses_the_x86_builds_table():
    """llama.cpp's build contracts 1 + A*x*x in GGML's gelu table to an FMA: one fp16 entry
    (x = -1.999) differs from the reference table."""
    from ggtool.ops import unary

    x = np.array([-1.999, -1.0, 0.5, 3.0, 11.0, -12.0], np.float16).astype(f32)
    ctx = ggtool.Context()
    a = ctx.new_tensor("f32", [len(x)]).set_data(x)
    y = F["gelu"](ctx, a)
    g = ggtool.Graph(ctx)
    g.expand(y)
    table = oracle.gelu_table()
    want = np.where(x >= 10, x, np.where(x <= -10, f32(0), table[x.astype(np.float16).view(np.uint16)]))
    ggtool.graph_compute(g, 1, numerics="x86")
    assert y.numpy().tobytes() == want.astype(f32).tobytes()
    ggtool.graph_compute(g, 1)
    got = y.numpy().reshape(-1)
    assert got[0] != want[0] and got[1:].tobytes() == want[1:].astype(f32).tobytes()
    assert unary.gelu_table("x86").tobytes() == table.astype(f32).tobytes()
    ref = unary.gelu_table()
    assert np.flatnonzero(ref.view(np.uint32) != table.view(np.uint32)).tolist() == [np.float16(-1.999).view(np.uint16)]


def test_soft_max_alibi_mask_is_one_fma():
    """With ALiBi (max_bias > 0) the slope times the mask is added to x*scale in one FMA."""
    rng = np.random.default_rng(7)
    n, rows, heads = 20, 3, 4
    x = (rng.standard_normal((heads, rows, n)) * 3).astype(f32)
    mask = (rng.standard_normal((rows, n)) * 5).astype(f32)
    ctx = ggtool.Context()
    a = ctx.new_tensor("f32", [n, rows, heads]).set_data(x)
    mk = ctx.new_tensor("f32", [n, rows]).set_data(mask)
    y = F["soft_max_ext"](ctx, a, mk, 0.3, 8.0)
    g = ggtool.Graph(ctx)
    g.expand(y)
    ggtool.graph_compute(g, 1, numerics="x86")
    from ggtool.ops.softmax import _alibi_slopes

    slope = _alibi_slopes(np.arange(rows * heads), rows, heads, f32(8.0)).reshape(heads, rows, 1)
    w = oracle.fma(np.broadcast_to(slope, x.shape), np.broadcast_to(mask, x.shape), (x * f32(0.3)).astype(f32))
    assert y.numpy().tobytes() == oracle.soft_max_rows(w.reshape(-1, n)).tobytes()


# -- which build "llama.cpp" is ------------------------------------------------------------------------
AVX2_CPU = {"sse4_2", "avx", "avx2", "fma", "f16c"}


@pytest.mark.parametrize("flags,want", [
    (AVX2_CPU | {"avx512f", "avx512dq", "avx512bw", "avx512vl"}, "llama.cpp-avx512"),
    (AVX2_CPU | {"avx512f", "avx512dq"}, "llama.cpp-avx512"),   # BW and VL change no sum ggtool follows
    (AVX2_CPU, "llama.cpp-avx2"),
    (AVX2_CPU - {"fma"}, None), ({"sse4_2", "avx"}, None), (set(), None)])
def test_llama_cpp_is_the_build_this_cpus_flags_make(flags, want):
    from ggtool.kernels.numerics import NumericsError, llama_cpp_variant, resolve

    assert llama_cpp_variant(flags) == want
    if want is not None:
        assert resolve("llama.cpp", flags) == want
        return
    with pytest.raises(NumericsError, match="neither AVX-512 .* nor AVX2") as e:
        resolve("llama.cpp", flags)
    assert e.value.kind == "no-llama-cpp-build" and e.value.name == "llama.cpp"


def test_avx512f_without_dq_is_neither_build():
    """-march=native on AVX-512F without AVX512DQ (Xeon Phi) compiles tinyBLAS<16, __m512> and
    ggml_vec_dot_f32's 16 lanes (`__AVX512F__`) but the AVX2 soft_max and expf (`__AVX512F__ &&
    __AVX512DQ__`, vec.cpp): a mix of the two builds, which ggtool does not follow; not AVX2."""
    from ggtool.kernels.numerics import NumericsError, llama_cpp_variant, resolve

    flags = AVX2_CPU | {"avx512f", "avx512cd", "avx512er", "avx512pf"}
    assert llama_cpp_variant(flags) is None
    with pytest.raises(NumericsError, match="avx512f without avx512dq") as e:
        resolve("llama.cpp", flags)
    assert e.value.kind == "no-llama-cpp-build"


def test_amx_is_neither_build():
    """On AMX (Sapphire Rapids and later: amx_int8 with avx512_vnni) -march=native defines
    __AMX_INT8__, and ggml-cpu's first extra buffer type is then AMX's (ggml-cpu.cpp): its tile
    kernels take Q4_0, Q8_0, Q4_K and Q6_K weights, another order than the repacked and tinyBLAS
    kernels ggtool follows."""
    from ggtool.kernels.numerics import NumericsError, llama_cpp_variant, resolve

    avx512 = AVX2_CPU | {"avx512f", "avx512dq", "avx512bw", "avx512vl", "avx512_vnni"}
    assert llama_cpp_variant(avx512 | {"amx_tile"}) == "llama.cpp-avx512"      # no amx_int8: no AMX kernels
    flags = avx512 | {"amx_tile", "amx_int8", "amx_bf16"}
    assert llama_cpp_variant(flags) is None
    with pytest.raises(NumericsError, match="amx_int8") as e:
        resolve("llama.cpp", flags)
    assert e.value.kind == "no-llama-cpp-build"
    assert resolve("llama.cpp-avx512", flags) == "llama.cpp-avx512"


def test_named_builds_and_the_x86_alias_whatever_the_cpu():
    from ggtool.kernels.numerics import resolve

    for flags in (set(), AVX2_CPU):
        assert [resolve(n, flags) for n in ("ggml", "x86", "llama.cpp-avx512", "llama.cpp-avx2")] == [
            "ggml", "llama.cpp-avx512", "llama.cpp-avx512", "llama.cpp-avx2"]


def test_host_flags_are_the_first_flags_line(tmp_path, monkeypatch):
    from ggtool.kernels.numerics import host_flags

    monkeypatch.delenv("GGTOOL_CPU_FLAGS", raising=False)     # (a run acting as another host sets it)

    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu avx2 fma\nbugs\t: x\n\nprocessor\t: 1\nflags\t: fpu\n")
    assert host_flags(str(cpuinfo)) == {"fpu", "avx2", "fma"}
    assert host_flags(str(tmp_path / "none")) == frozenset()


def test_no_llama_cpp_build_is_worded_with_the_flag_that_names_one():
    from ggtool.commands.wording import cli_message
    from ggtool.kernels.numerics import NumericsError

    assert cli_message(NumericsError("llama.cpp", frozenset())).endswith(
        "the two llama.cpp x86 builds ggtool follows: name one, --numerics llama.cpp-avx2 or --numerics llama.cpp-avx512")


def test_cli_verbose_says_which_build_llama_cpp_is(run):
    from ggtool.kernels.numerics import host_flags, llama_cpp_variant

    picked = llama_cpp_variant(host_flags())
    if picked is None:
        pytest.skip("this CPU has no llama.cpp x86 build ggtool follows")
    r = run("compute", "add(x, x)", "--tensor", "x=[1.5]", "--numerics", "llama.cpp", "-v")
    assert r.exit_code == 0 and f"numerics llama.cpp: {picked} (this CPU's llama.cpp build)" in r.stderr
    r = run("compute", "add(x, x)", "--tensor", "x=[1.5]", "--numerics", "llama.cpp-avx2", "-v")
    assert r.exit_code == 0 and "numerics llama" not in r.stderr


TYPES_GOLD = Path(__file__).parent / "golden" / "llama" / "llama-cpp-types.npz"


def _types_cases():
    with np.load(TYPES_GOLD) as z:
        n = sum(f.startswith("op_") for f in z.files)
        return [(i, str(z[f"op_{i}"]), str(z[f"case_{i}"]) if f"case_{i}" in z.files else "") for i in range(n)]


@pytest.mark.parametrize("build", ["avx512", "avx2"])
def test_every_weight_type_and_silu_are_llama_cpps_own(build):
    """llama.cpp's own mul_mat (every weight type: tinyBLAS, tinyBLAS_Q0, the repacked gemm/gemv, the
    tiled K-quant kernel, the vec_dots; 1, 2, 5 and 9 activation rows; weight rows in eights and not;
    F32/F16/BF16 rows of 172 and 8, which tinyBLAS refuses), silu and swiglu (ggml_v_silu, tails in
    the C library's expf), run through ctypes in each x86 build (tests/golden/llama/make_llama_cpp_types.py):
    --numerics llama.cpp-<build> gives every value, bit for bit."""
    numerics = f"llama.cpp-{build}"
    bad = []
    with np.load(TYPES_GOLD) as z:
        for i, op, case in _types_cases():
            ctx = ggtool.Context()
            ref = z[f"y_{build}_{i}"]
            if op == "mul_mat":
                t, k, n, m = case.split()
                w = z[f"w_{t}_{k}_{n}"]
                x = z[f"x_{m}_{k}"]
                data = w.view(np.float32) if t == "f32" else w.view(np.float16) if t == "f16" else w
                a = ctx.new_tensor(t, [int(k), int(n)]).set_data(data)
                b = ctx.new_tensor("f32", [int(k), int(m)]).set_data(x)
                y = F["mul_mat"](ctx, a, b)
            else:
                x = z[f"x_{i}"]
                a = ctx.new_tensor("f32", [x.shape[1], x.shape[0]]).set_data(x)
                y = F["silu"](ctx, a)
                if op == "swiglu":
                    y = F["mul"](ctx, y, ctx.new_tensor("f32", [x.shape[1], x.shape[0]]).set_data(z[f"g_{i}"]))
            g = ggtool.Graph(ctx)
            g.expand(y)
            ggtool.graph_compute(g, 1, numerics=numerics)
            got = y.numpy().reshape(ref.shape)
            if got.tobytes() != ref.tobytes():
                bad.append((op, case, int((got != ref).sum())))
    assert not bad, bad
