"""BF16 as a native type: GGML_FP32_TO_BF16 on its edge cases (against gguf-py's own conversion,
``gguf.quants.BF16``, and against the rounding rule worked out in float64), BF16 GGUF tensors
memory-mapped as themselves, mul_mat with BF16 weights (the compiled scalar ggml_vec_dot_bf16
against the numpy oracle, bit for bit, and a float64 reference; 1..4 participants bit-identical;
the plan's work size), get_rows, cpy/dup to and from bf16, and bf16 tensor sources."""

from __future__ import annotations

import json

import gguf
import numpy as np
import pytest
from conftest import fails, ok, write_gguf
from kernel_threads import compute_threaded
from oracle_matmul import mul_mat_bf16

import ggtool
from ggtool import quant as Q
from ggtool import types as T
from ggtool.context import Context
from ggtool.kernels import dot
from ggtool.tensor_io.inputs import Inputs
from ggtool.tensor_io.sources import parse_named_source

F = ggtool.ops.FUNCTIONS


def _gguf_bf16(x) -> np.ndarray:
    """gguf-py's fp32 -> bf16 ("same as ggml_compute_fp32_to_bf16"), as uint16 bits."""
    return np.asarray(gguf.quants.quantize(np.asarray(x, np.float32), T.BF16)).view(np.uint16)


def _widen(bits) -> np.ndarray:
    return (np.asarray(bits).astype(np.uint32) << 16).view(np.float32)


# -- fp32 <-> bf16 ----------------------------------------------------------------------------------
def _edge_floats() -> np.ndarray:
    """Every bf16 pattern (all 65536 upper halves: zeros, subnormals, normals, the largest finite,
    inf, NaNs of both signs) with lower halves at and around the ties (0x8000 is the exact half)."""
    hi = np.arange(1 << 16, dtype=np.uint32) << 16
    lows = np.array([0, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF, 0x4000, 0xC000], np.uint32)
    rnd = np.random.default_rng(0).integers(0, 1 << 16, 1 << 16, dtype=np.uint32)
    bits = np.concatenate([(hi[:, None] | lows[None, :]).reshape(-1), hi | rnd])
    return bits.view(np.float32)


def _rounding_rule(x: np.ndarray) -> np.ndarray:
    """bf16 bits of x by the rule itself, in float64: the nearer of the two bf16 values around x
    (truncation and the next one up in magnitude), the even one on a tie; the next one up of the
    largest finite is inf. NaN: the upper half, made quiet (bit 6). Independent of the bit trick."""
    u = x.view(np.uint32)
    lo = (u >> 16).astype(np.int64)
    sign, mag = lo & 0x8000, lo & 0x7FFF

    def value(m):       # magnitude of bf16 pattern m (no sign) in float64; exponent 255 as 2**128
        e, f = m >> 7, (m & 127).astype(np.float64)
        return np.where(e == 0, f / 128 * 2.0 ** -126, (1 + f / 128) * 2.0 ** (e.astype(np.float64) - 127))

    with np.errstate(invalid="ignore", over="ignore"):
        ax = np.abs(x.astype(np.float64))
        d_lo, d_hi = ax - value(mag), value(mag + 1) - ax
    up = (d_hi < d_lo) | ((d_hi == d_lo) & (mag & 1 == 1))
    out = sign | np.where(up, mag + 1, mag)
    out = np.where(np.isinf(x), lo, out)
    out = np.where(np.isnan(x), lo | 0x40, out)
    return out.astype(np.uint16)


def test_fp32_to_bf16_edge_cases_match_gguf_py_and_the_rounding_rule():
    x = _edge_floats()
    got = Q.fp32_to_bf16(x)
    assert got.dtype == np.uint16 and got.shape == x.shape
    assert np.array_equal(got, _gguf_bf16(x))
    assert np.array_equal(got, _rounding_rule(x))


def test_fp32_to_bf16_named_cases():
    cases = [
        (1.0, 0x3F80), (1.00390625, 0x3F80),        # 1 + 2**-8: a tie, to the even 1.0
        (1.01171875, 0x3F82),                       # 1 + 3 * 2**-8: a tie, up to the even 1 + 2**-6
        (-2.5, 0xC020), (0.0, 0x0000), (-0.0, 0x8000),
        (3.3895314e38, 0x7F7F),                     # the largest bf16
        (3.4e38, 0x7F80),                           # rounds past it: inf
        (float("inf"), 0x7F80), (float("-inf"), 0xFF80),
        (1e-40, 0x0001), (2e-39, 0x0016),           # subnormals, kept (never flushed)
        (1.4e-45, 0x0000),                          # the smallest float32 subnormal rounds to 0
    ]
    x = np.array([v for v, _ in cases], np.float32)
    assert [int(v) for v in Q.fp32_to_bf16(x)] == [b for _, b in cases]
    nans = np.array([0x7FC00000, 0x7F800001, 0xFF812345, 0x7FFFFFFF], np.uint32).view(np.float32)
    assert [hex(v) for v in Q.fp32_to_bf16(nans)] == ["0x7fc0", "0x7fc0", "0xffc1", "0x7fff"]  # quiet, sign kept
    assert Q.fp32_to_bf16(np.float32(2.0)).shape == () and int(Q.fp32_to_bf16(np.float32(2.0))) == 0x4000


def test_bf16_to_fp32_is_exact_for_every_pattern():
    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    got = Q.bf16_to_fp32(bits)
    want = np.asarray(gguf.quants.dequantize(bits.view(np.uint8), T.BF16), np.float32)
    assert got.view(np.uint32).tolist() == want.view(np.uint32).tolist()
    assert Q.bf16_to_fp32(bits.view(np.uint8)).tobytes() == got.tobytes()          # row bytes as well
    finite = np.isfinite(got)
    assert np.array_equal(Q.fp32_to_bf16(got[finite]), bits[finite])              # round trip


# -- a BF16 GGUF, memory-mapped -------------------------------------------------------------------
def _bf16_gguf(tmp_path, n=300, k=96, seed=0):
    w = np.random.default_rng(seed).standard_normal((n, k)).astype(np.float32)
    bits = _gguf_bf16(w)
    path = tmp_path / "bf16.gguf"
    write_gguf(path, {"w": (bits.view(np.uint8), T.BF16), "wf": w})
    return path, bits


def test_bf16_gguf_tensor_joins_as_itself_memory_mapped(tmp_path):
    path, bits = _bf16_gguf(tmp_path)
    t = Inputs([], [str(path)]).tensor("w", Context())
    assert t.type == T.BF16 and T.type_name(t.type) == "bf16"
    assert t.ne == (96, 300, 1, 1) and t.nb == (2, 192, 57600, 57600)     # GGML's row size: 2 bytes a value
    assert t.storage is not None                                           # the file's map, no copy
    assert t.data.dtype == np.uint16 and np.array_equal(t.data.reshape(300, 96), bits)
    assert t.numpy().reshape(300, 96).tobytes() == _widen(bits).tobytes()


def test_inspect_graph_and_plan_show_the_bf16_leaf_and_ggml_work_size(run, tmp_path):
    path, _ = _bf16_gguf(tmp_path)
    g = json.loads(ok(run("inspect-graph", "mul_mat(w, x)", "--gguf", path, "--tensor", "x=f32[96,5]", "--json")))
    leaf = next(leaf for leaf in g["leafs"] if leaf["name"] == "w")
    assert (leaf["type"], leaf["ne"], leaf["nb"]) == ("bf16", [96, 300, 1, 1], [2, 192, 57600, 57600])
    for n in (1, 3):
        p = json.loads(ok(run("plan", "mul_mat(w, x)", "--gguf", path, "--tensor", "x=f32[96,5]",
                              "--threads", n, "--json")))
        # ggml_graph_plan: src1 is converted to BF16 (vec_dot_type), row_size(BF16, 96 * 5) bytes
        assert p["nodes"][0]["work_size"] == 2 * 96 * 5
        assert p["work_size"] == 2 * 96 * 5 + 64 * n


# -- mul_mat ------------------------------------------------------------------------------------------
def _mul_mat(w_bits, x, b_type="f32"):
    ctx = ggtool.Context()
    n, k = w_bits.shape
    w = ctx.new_tensor("bf16", [k, n]).set_data(w_bits)
    b = ctx.new_tensor(b_type, [k, x.shape[0]]).set_data(x)
    y = F["mul_mat"](ctx, w, b)
    g = ggtool.Graph(ctx)
    g.expand(y)
    return g, y


@pytest.mark.parametrize("n,k,m", [(1, 1, 1), (7, 33, 2), (130, 300, 3), (257, 1000, 5), (40, 4096, 1)])
def test_dot_is_ggml_scalar_reference_bit_for_bit(n, k, m):
    rng = np.random.default_rng(n + k + m)
    w = _gguf_bf16(rng.standard_normal((n, k)) * rng.choice([1e-3, 1.0, 1e3], (n, 1)))
    a = _gguf_bf16(rng.standard_normal((m, k)))
    out = np.full((m, n), np.nan, np.float32)
    dot.dot(T.BF16, dot.pack(T.BF16, w), a, out)
    assert out.tobytes() == mul_mat_bf16(w, a).tobytes()
    assert Q.mul_mat_quantized(w.view(np.uint8), "bf16", a.view(np.uint8)).tobytes() == out.tobytes()


@pytest.mark.parametrize("rows", [1, 3])      # 2 and 6 activation rows: both ways the kernel widens weights
def test_dot_special_values_and_the_sign_of_zero(rows):
    """inf * 0 is NaN, inf + -inf is NaN, an all-zero row with negative activations sums to +0.0
    (the double sum starts at +0.0), products overflow (3e38 * 1e30 - 3e38 * 1e30 is NaN, not the
    double's 0) and underflow in float32."""
    k = 8
    w = np.zeros((6, k), np.float32)
    w[0, 0] = np.inf
    w[1, :2] = [np.inf, -np.inf]
    w[3] = 1e-30
    w[4] = 3e38
    w[5, :2] = [3e38, -3e38]
    a = np.full((1, k), -1.0, np.float32)
    a[0, 1] = 0.0
    a[0, 2:] = 1e-20
    a[0, :2] = [0.0, -1.0]
    wb = _gguf_bf16(w)
    ab = np.tile(_gguf_bf16(np.vstack([a, np.full((1, k), 1e30, np.float32)])), (rows, 1))
    out = np.empty((2 * rows, 6), np.float32)
    dot.dot(T.BF16, dot.pack(T.BF16, wb), ab, out)
    want = mul_mat_bf16(wb, ab)
    assert out.view(np.uint32).tolist() == want.view(np.uint32).tolist()
    assert np.isnan(out[0, 0]) and np.isnan(out[0, 1]) and out[0, 2] == 0 and not np.signbit(out[0, 2])
    assert np.isinf(out[1, 4]) and np.isnan(out[1, 5])


@pytest.mark.parametrize("m", [1, 4, 19])
def test_mul_mat_node_against_float64_reference(m):
    """Exact float32 products summed in double, rounded once: within half an ulp of the float64 sum
    of the same products, up to the double sum's own error. (A float32 sum would miss this bound.)"""
    rng = np.random.default_rng(m)
    n, k = 70, 2048
    w = _gguf_bf16(rng.standard_normal((n, k)))
    x = rng.standard_normal((m, k)).astype(np.float32)
    g, y = _mul_mat(w, x)
    ggtool.graph_compute(g, 1)
    got = y.data.reshape(m, n)
    assert got.tobytes() == mul_mat_bf16(w, _gguf_bf16(x)).tobytes()
    prods = _widen(_gguf_bf16(x)).astype(np.float64)[:, None, :] * _widen(w).astype(np.float64)[None]
    ref, size = prods.sum(axis=2), np.abs(prods).sum(axis=2)
    assert (np.abs(got - ref) <= np.abs(ref) * 2.0 ** -24 + k * 2.0 ** -52 * size).all()


@pytest.mark.parametrize("m", [3, 6])
def test_mul_mat_node_bit_identical_for_1_to_4_participants(m):
    """Several column tiles (N > 2 x 1024), a partial row group and k not a multiple of the k-slice."""
    rng = np.random.default_rng(5)
    n, k = 2 * 1024 + 70, 300
    w = _gguf_bf16(rng.standard_normal((n, k)))
    x = rng.standard_normal((m, k)).astype(np.float32)
    g, y = _mul_mat(w, x)
    plan = ggtool.make_plan(g, 2)
    assert plan.nodes[0].work_size == T.row_size(T.BF16, k * m) == 2 * k * m
    ggtool.graph_compute(g, 1)
    one = y.data.copy()
    assert one.reshape(m, n).tobytes() == mul_mat_bf16(w, _gguf_bf16(x)).tobytes()
    for nth in (2, 3, 4):
        y.data[...] = 0
        compute_threaded(g, nth, force=True)
        assert y.data.tobytes() == one.tobytes(), f"{nth} participants differ from 1"


def test_mul_mat_with_bf16_activations_converts_nothing():
    rng = np.random.default_rng(6)
    w = _gguf_bf16(rng.standard_normal((50, 64)))
    xb = _gguf_bf16(rng.standard_normal((4, 64)))
    g, y = _mul_mat(w, xb, b_type="bf16")
    assert ggtool.make_plan(g, 2).work_size == 0                     # b is already the vec_dot_type
    ggtool.graph_compute(g, 1)
    assert y.type == T.F32 and y.data.reshape(4, 50).tobytes() == mul_mat_bf16(w, xb).tobytes()


def test_mul_mat_from_the_mapped_file_on_the_command_line(run, tmp_path):
    path, bits = _bf16_gguf(tmp_path)
    x = np.random.default_rng(1).standard_normal((2, 96)).astype(np.float32)
    xs = json.dumps(x.tolist())
    out = [np.array(json.loads(ok(run("compute", "mul_mat(w, x)", "--gguf", path, "--tensor", f"x={xs}",
                                      "--threads", n))), np.float32) for n in (1, 2)]
    want = mul_mat_bf16(bits, _gguf_bf16(x))
    assert out[0].tobytes() == out[1].tobytes() == want.tobytes()


# -- get_rows, cpy, dup ---------------------------------------------------------------------------------
def test_get_rows_widens_to_f32_on_any_number_of_threads():
    rng = np.random.default_rng(2)
    bits = _gguf_bf16(rng.standard_normal((6, 40)))
    bits[1, :4] = [0x7FC0, 0xFF80, 0x8000, 0x0001]      # NaN, -inf, -0.0, the smallest subnormal
    ctx = ggtool.Context()
    a = ctx.new_tensor("bf16", [40, 6]).set_data(bits)
    idx = ctx.new_tensor("i32", [5]).set_data(np.array([5, 1, 0, 1, 3], np.int32))
    y = F["get_rows"](ctx, a, idx)
    g = ggtool.Graph(ctx)
    g.expand(y)
    want = np.asarray(gguf.quants.dequantize(bits[[5, 1, 0, 1, 3]].view(np.uint8), T.BF16), np.float32)
    for nth in (1, 3):
        y.data[...] = 0
        compute_threaded(g, nth, force=True)
        assert y.type == T.F32 and y.data.reshape(5, 40).view(np.uint32).tolist() == want.view(np.uint32).tolist()


def _copy(src_type, dst_type, values, op="cpy"):
    ctx = ggtool.Context()
    a = ctx.new_tensor(src_type, [values.shape[-1], values.shape[0]]).set_data(values)
    if op == "cpy":
        y = F["cpy"](ctx, a, ctx.new_tensor(dst_type, list(a.ne)))
    else:
        y = F["cont"](ctx, F["transpose"](ctx, a))
    g = ggtool.Graph(ctx)
    g.expand(y)
    ggtool.graph_compute(g, 1)
    return g, y


def test_cpy_between_f32_f16_bf16_goes_through_f32():
    x = _edge_floats()[::97][:640].reshape(10, 64)
    x = np.where(np.isnan(x), np.float32(1.5), x)                  # NaN payloads aside (f16 has its own)
    # f32 -> bf16: GGML_FP32_TO_BF16
    _, y = _copy("f32", "bf16", x)
    assert y.type == T.BF16 and np.array_equal(y.data.reshape(10, 64), _gguf_bf16(x))
    # bf16 -> f32: exact
    bits = _gguf_bf16(x)
    _, y = _copy("bf16", "f32", bits)
    assert y.data.reshape(10, 64).tobytes() == _widen(bits).tobytes()
    # bf16 -> f16 and f16 -> bf16: through f32, each rounding to nearest even
    _, y = _copy("bf16", "f16", bits)
    with np.errstate(over="ignore"):
        assert y.data.reshape(10, 64).tobytes() == _widen(bits).astype(np.float16).tobytes()
    h = (np.random.default_rng(3).standard_normal((10, 64)) * 1000).astype(np.float16)
    _, y = _copy("f16", "bf16", h)
    assert np.array_equal(y.data.reshape(10, 64), _gguf_bf16(h.astype(np.float32)))
    # bf16 -> q8_0: the CPU from_float of the widened values
    _, y = _copy("bf16", "q8_0", _gguf_bf16(h.astype(np.float32)))
    assert y.data.tobytes() == Q.quantize_q8_0_cpu(_widen(_gguf_bf16(h.astype(np.float32)))).tobytes()


def test_cpy_work_size_follows_ggml_graph_plan():
    """A float row per task where cpy goes between f16 and bf16 (through f32), none for f32 <-> bf16."""
    for src, dst, want in (("f16", "bf16", 4 * 64 * 3), ("bf16", "f16", 4 * 64 * 3), ("f32", "bf16", 0),
                           ("bf16", "f32", 0), ("bf16", "q8_0", 4 * 64 * 3)):
        ctx = ggtool.Context()
        a = ctx.new_tensor(src, [64, 10])
        g = ggtool.Graph(ctx)
        g.expand(F["cpy"](ctx, a, ctx.new_tensor(dst, [64, 10])))
        assert ggtool.make_plan(g, 3).nodes[0].work_size == want, (src, dst)


def test_cont_of_a_transposed_bf16_tensor_repeat_and_concat():
    bits = _gguf_bf16(np.arange(12, dtype=np.float32).reshape(3, 4) + 0.5)
    _, y = _copy("bf16", None, bits, op="cont")
    assert y.type == T.BF16 and np.array_equal(y.data.reshape(4, 3), bits.T)
    ctx = ggtool.Context()
    a = ctx.new_tensor("bf16", [4, 3]).set_data(bits)
    r = F["repeat"](ctx, a, ctx.new_tensor("f32", [8, 6]))
    g = ggtool.Graph(ctx)
    g.expand(r)
    ggtool.graph_compute(g, 1)
    assert r.type == T.BF16 and np.array_equal(r.data.reshape(6, 8), np.tile(bits, (2, 2)))
    c = F["concat"](ctx, a, a, 0)
    g = ggtool.Graph(ctx)
    g.expand(c)
    ggtool.graph_compute(g, 1)
    assert c.type == T.BF16 and np.array_equal(c.data.reshape(3, 8), np.concatenate([bits, bits], axis=1))


def test_ops_without_a_bf16_kernel_refuse_it():
    ctx = ggtool.Context()
    a = ctx.new_tensor("bf16", [4, 3])
    g = ggtool.Graph(ctx)
    g.expand(F["soft_max"](ctx, a))
    with pytest.raises(ggtool.GGToolError, match="soft_max: a '.*' is bf16; GGML computes it for f32 only"):
        ggtool.graph_compute(g, 1)


# -- sources, outputs ------------------------------------------------------------------------------------
def test_bf16_sources_from_json_npy_gguf_and_shape(tmp_path, npy):
    path, bits = _bf16_gguf(tmp_path)
    x = np.array([[1.0, 1.00390625, -2.5], [1e-40, 3.3895314e38, -0.0]], np.float32)
    p = npy(x)
    env = Inputs([parse_named_source(o) for o in (f"j=bf16:{json.dumps(x.tolist())}", f"n=bf16:{p}",
                                                   f"g=bf16:{path}:wf", "z=bf16[3,2]", f"f=f32:{path}:w")], [])
    ctx = Context()
    for name, want in (("j", _gguf_bf16(x)), ("n", _gguf_bf16(x)), ("g", bits), ("z", np.zeros((2, 3), np.uint16))):
        t = env.tensor(name, ctx)
        assert t.type == T.BF16 and np.array_equal(t.data.reshape(want.shape), want), name
    t = env.tensor("f", ctx)                                   # and back to f32 on request
    assert t.type == T.F32 and t.numpy().reshape(300, 96).tobytes() == _widen(bits).tobytes()


def test_a_value_too_large_for_bf16_is_refused(run):
    fails(run("compute", "x", "--tensor", "x=bf16:[1, 3.4e38]"), "--tensor x: element [1] = 3.4e+38 is too large for bf16")


def test_bf16_result_is_written_as_bf16_gguf_and_printed_as_f32(run, tmp_path):
    out = tmp_path / "o.gguf"
    ok(run("compute", "dup(x)", "--tensor", "x=bf16:[[1, 2.5, -3], [0.1, 7, 1e-3]]", "-o", out))
    t = gguf.GGUFReader(str(out)).tensors[0]
    want = _gguf_bf16(np.array([[1, 2.5, -3], [0.1, 7, 1e-3]], np.float32))
    assert t.tensor_type == T.BF16 and np.array_equal(np.asarray(t.data).view(np.uint16).reshape(2, 3), want)
    printed = json.loads(ok(run("compute", "x", "--tensor", f"x={out}:result")))
    assert np.array(printed, np.float32).tobytes() == _widen(want).tobytes()
