"""Op construction errors (GGML's asserts as ShapeError naming the op and the shapes), compute-time
errors, and values a build of GGML printed for ops the golden cases exercise only partly."""

import numpy as np
import pytest

import ggtool
from ggtool.errors import ComputeError, ShapeError
from ggtool.ops import FUNCTIONS as F

f32 = np.float32


@pytest.fixture
def ctx():
    return ggtool.Context()


def t(ctx, typ, *ne, name=""):
    x = ctx.new_tensor(typ, list(ne))
    x.name = name
    return x


def compute(ctx, out):
    g = ggtool.Graph(ctx)
    g.expand(out)
    ggtool.graph_compute(g, 1)
    return out


def from_array(ctx, arr, typ=None, name=""):
    return ctx.new_tensor_from(np.asarray(arr), typ, name)


# -- construction errors ------------------------------------------------------------------------
ERRORS = [
    ("add", lambda c: F["add"](c, t(c, "f32", 5, 6, name="A"), t(c, "f32", 4, 6, name="B")), ["add", "[4, 6, 1, 1]", "[5, 6, 1, 1]"]),
    ("mul", lambda c: F["mul"](c, t(c, "f32", 8, 4), t(c, "f32", 8, 3)), ["mul", "[8, 3, 1, 1]", "[8, 4, 1, 1]"]),
    ("mul_mat ne0", lambda c: F["mul_mat"](c, t(c, "f32", 64, 4, name="w"), t(c, "f32", 32, 2, name="x")),
     ["mul_mat", "'w' [64, 4, 1, 1]", "'x' [32, 2, 1, 1]", "ne0"]),
    ("mul_mat bcast", lambda c: F["mul_mat"](c, t(c, "f32", 8, 4, 3), t(c, "f32", 8, 2, 4)), ["mul_mat", "[8, 2, 4, 1]", "multiples"]),
    ("mul_mat transposed", lambda c: F["mul_mat"](c, F["transpose"](c, t(c, "f32", 4, 8, name="w")), t(c, "f32", 8, 2)),
     ["mul_mat", "transposed", "[8, 4, 1, 1]"]),
    ("concat dims", lambda c: F["concat"](c, t(c, "f32", 5, 3), t(c, "f32", 4, 2), 0), ["concat", "[5, 3, 1, 1]", "[4, 2, 1, 1]", "dim 1"]),
    ("concat type", lambda c: F["concat"](c, t(c, "f32", 5, 3), t(c, "i32", 5, 3), 1), ["concat", "f32", "i32"]),
    ("concat dim", lambda c: F["concat"](c, t(c, "f32", 5), t(c, "f32", 5), 4), ["concat", "dim must be 0..3"]),
    ("get_rows type", lambda c: F["get_rows"](c, t(c, "f32", 4, 8), t(c, "f32", 3)), ["get_rows", "i32", "f32"]),
    ("get_rows ne2", lambda c: F["get_rows"](c, t(c, "f32", 4, 8, 3), t(c, "i32", 3, 2)), ["get_rows", "[4, 8, 3, 1]", "[3, 2, 1, 1]"]),
    ("set_rows ne0", lambda c: F["set_rows"](c, t(c, "f32", 4, 8, name="a"), t(c, "f32", 5, 2, name="b"), t(c, "i32", 2)),
     ["set_rows", "'a' [4, 8, 1, 1]", "'b' [5, 2, 1, 1]", "ne0"]),
    ("set_rows count", lambda c: F["set_rows"](c, t(c, "f32", 4, 8), t(c, "f32", 4, 2), t(c, "i32", 3, name="c")),
     ["set_rows", "'c' [3, 1, 1, 1]", "one index per row"]),
    ("set_rows index type", lambda c: F["set_rows"](c, t(c, "f32", 4, 8), t(c, "f32", 4, 2), t(c, "f32", 2)), ["set_rows", "i32 or i64"]),
    ("set_rows b type", lambda c: F["set_rows"](c, t(c, "f32", 4, 8), t(c, "i32", 4, 2), t(c, "i32", 2)), ["set_rows", "f32 or f16"]),
    ("set_rows same tensor", lambda c: (lambda a: F["set_rows"](c, a, F["view_2d"](c, a, 4, 2, 16, 0), t(c, "i32", 2)))(
        t(c, "f32", 4, 8, name="kv")), ["set_rows", "'kv'", "read while written"]),
    ("repeat", lambda c: F["repeat"](c, t(c, "f32", 3, 2), t(c, "f32", 4, 2)), ["repeat", "[3, 2, 1, 1]", "[4, 2, 1, 1]"]),
    ("rope mode", lambda c: F["rope"](c, t(c, "f32", 8, 2, 3), t(c, "i32", 3), 8, 1), ["rope", "mode & 1"]),
    ("rope positions", lambda c: F["rope"](c, t(c, "f32", 8, 2, 3, name="q"), t(c, "i32", 4, name="p"), 8, 0),
     ["rope", "'q' [8, 2, 3, 1]", "3 tokens", "4 positions"]),
    ("rope pos type", lambda c: F["rope"](c, t(c, "f32", 8, 2, 3), t(c, "f32", 3), 8, 0), ["rope", "i32"]),
    ("soft_max_ext mask ne0", lambda c: F["soft_max_ext"](c, t(c, "f32", 8, 4), t(c, "f32", 6, 4, name="m"), 1.0, 0.0),
     ["soft_max_ext", "'m' [6, 4, 1, 1]", "ne0"]),
    ("soft_max_ext mask rows", lambda c: F["soft_max_ext"](c, t(c, "f32", 8, 4), t(c, "f32", 8, 3), 1.0, 0.0), ["soft_max_ext", "ne1"]),
    ("soft_max_ext alibi", lambda c: F["soft_max_ext"](c, t(c, "f32", 8, 4), None, 1.0, 8.0), ["soft_max_ext", "mask"]),
    ("soft_max permuted", lambda c: F["soft_max"](c, F["transpose"](c, t(c, "f32", 8, 4))), ["soft_max", "contiguous", "[4, 8, 1, 1]"]),
    ("unary permuted", lambda c: F["gelu"](c, F["permute"](c, t(c, "f32", 8, 4, 3), 1, 0, 2, 3)), ["gelu", "[4, 8, 3, 1]", "cont"]),
    ("scale not padded", lambda c: F["scale"](c, F["transpose"](c, t(c, "f32", 8, 4)), 2.0), ["scale", "padded", "[4, 8, 1, 1]"]),
    ("argmax 3d", lambda c: F["argmax"](c, t(c, "f32", 8, 4, 2)), ["argmax", "matrix", "[8, 4, 2, 1]"]),
    ("cpy count", lambda c: F["cpy"](c, t(c, "f32", 8, name="a"), t(c, "f16", 9, name="b")),
     ["cpy", "'a' [8, 1, 1, 1]", "'b' [9, 1, 1, 1]"]),
    ("cont_2d count", lambda c: F["cont_2d"](c, t(c, "f32", 8, 3), 5, 5), ["cont", "24 elements", "[5, 5, 1, 1]"]),
]


@pytest.mark.parametrize("make, fragments", [e[1:] for e in ERRORS], ids=[e[0] for e in ERRORS])
def test_construction_errors(ctx, make, fragments):
    with pytest.raises(ShapeError) as e:
        make(ctx)
    for f in fragments:
        assert f in str(e.value), f"{f!r} not in {str(e.value)!r}"


def test_compute_errors_name_the_node(ctx):
    a = from_array(ctx, np.ones((2, 4), f32))
    idx = from_array(ctx, np.array([0, 5], np.int32))
    with pytest.raises(ComputeError, match=r"GET_ROWS.*index 5 is outside 0..1"):
        compute(ctx, F["get_rows"](ctx, a, idx))
    h = from_array(ctx, np.ones((2, 4), np.float16))
    with pytest.raises(ComputeError, match=r"'node_0' \(SUB\).*f16"):
        compute(ctx, F["sub"](ctx, h, h))
    rows = F["set_rows"](ctx, from_array(ctx, np.ones((3, 4), f32), name="kv"), a, from_array(ctx, np.array([0, 3], np.int32)))
    with pytest.raises(ComputeError, match=r"SET_ROWS.*index 3 is outside 0..2 \(the rows of 'kv'\)"):
        compute(ctx, rows)
    w = from_array(ctx, np.ones((2, 32), f32))
    with pytest.raises(ComputeError, match=r"MUL_MAT.*f16"):
        compute(ctx, F["mul_mat"](ctx, w, from_array(ctx, np.ones((3, 32), np.float16))))


# -- values printed by GGML ----------------------------------------------------------------------------
X8 = np.array([-3, -0.5, 0.25, 2, 1, 0, -1, 12], f32)


def run1(ctx, name, x, *args):
    return np.array(compute(ctx, F[name](ctx, from_array(ctx, x), *args)).data).reshape(-1)


def test_gelu_is_the_fp16_table_with_clamps(ctx):
    want = np.array([-0.00363731384, -0.154296875, 0.149658203, 1.95507812, 0.841308594, 0, -0.158813477, 12], f32)
    assert np.array_equal(run1(ctx, "gelu", X8), want)
    assert run1(ctx, "gelu", np.array([-10.0, 10.0, 9.99], f32)).tolist() == [0.0, 10.0, np.float16(9.99).item()]


def test_silu(ctx):
    want = np.array([-0.142277613, -0.188770339, 0.140544131, 1.76159406, 0.731058598, 0, -0.268941432, 11.9999256], f32)
    np.testing.assert_allclose(run1(ctx, "silu", X8), want, rtol=2e-7)


def test_small_unaries(ctx):
    x = np.array([-2, -0.0, 0, 3, np.nan], f32)
    assert np.array_equal(run1(ctx, "relu", x), [0, 0, 0, 3, 0])
    assert np.array_equal(run1(ctx, "sgn", x), [-1, 0, 0, 1, 0])
    assert np.array_equal(run1(ctx, "step", x), [0, 0, 0, 1, 0])
    assert np.array_equal(run1(ctx, "neg", x[:4]), [2, 0, 0, -3])
    np.testing.assert_allclose(run1(ctx, "elu", x[:4]), [np.expm1(f32(-2)), 0, 0, 3], rtol=1e-7)


def test_reductions(ctx):
    x = np.array([[-3, -0.5, 0.25, 2], [1, 0, -1, 12]], f32)
    assert run1(ctx, "sum_rows", x).tolist() == [-1.25, 12]
    assert run1(ctx, "mean", x).tolist() == [-0.3125, 3]
    assert run1(ctx, "sum", x).tolist() == [10.75]
    assert run1(ctx, "argmax", np.array([[1, 5, 5, 2], [-np.inf] * 4], f32)).tolist() == [2, 3]


def test_norms(ctx):
    x = np.array([[-3, -0.5, 0.25, 2], [1, 0, -1, 12]], f32)
    want = [-1.49525416, -0.104320064, 0.312960178, 1.28661406, -0.381384969, -0.572077453, -0.762769938, 1.7162323]
    np.testing.assert_allclose(run1(ctx, "norm", x, 1e-5), want, rtol=1e-6)
    want = [-1.64445269, -0.274075449, 0.137037724, 1.09630179, 0.165521175, 0, -0.165521175, 1.9862541]
    np.testing.assert_allclose(run1(ctx, "rms_norm", x, 1e-6), want, rtol=1e-6)


def test_soft_max_and_diag_mask(ctx):
    np.testing.assert_allclose(run1(ctx, "soft_max", X8[:4]), [0.005336578, 0.0650128275, 0.137632161, 0.792018414], rtol=1e-6)
    m = run1(ctx, "diag_mask_inf", np.zeros((3, 3), f32), 0).reshape(3, 3)
    assert np.array_equal(m, [[0, -np.inf, -np.inf], [0, 0, -np.inf], [0, 0, 0]])


def _ggml_max(row) -> np.float32:
    """ggml_vec_max_f32, one value at a time: max = (max > x ? max : x) from -inf."""
    m = f32(-np.inf)
    for v in row:
        m = m if m > v else v
    return m


@pytest.mark.parametrize("n", [7, 64, 200])
def test_soft_max_row_max_is_ggmls_in_order_max(n):
    """A row's max as GGML takes it, whatever numpy's SIMD max does with NaNs: NaNs early, late and
    last; the row's NaN bits as GGML's loop leaves them."""
    from ggtool.ops.softmax import row_max

    rng = np.random.default_rng(n)
    nans = np.array([0x7FC00011, 0xFFC00022, 0x7FC00033], np.uint32).view(f32)
    w = rng.standard_normal((8, n)).astype(f32)
    w[0, 0] = nans[0]
    w[1, [1, n - 1]] = nans[:2]
    w[2, [0, n // 2, n - 3]] = nans
    w[3, :] = nans[2]
    w[4, -1] = nans[0]
    w[5, :] = -np.inf
    w[6, [n // 3, n // 2]] = [np.inf, nans[1]]
    got = row_max(w)[:, 0]
    want = np.array([_ggml_max(r) for r in w], f32)
    assert got.view(np.uint32).tolist() == want.view(np.uint32).tolist()
    assert np.isnan(got[[1, 3, 4]]).all() and not np.isnan(got[[0, 2, 5, 6, 7]]).any()


def test_soft_max_row_with_a_nan_is_that_nan(ctx):
    """A NaN anywhere but last: the max is of the values after it, the sum NaN, every output that
    NaN's bits (a row of NaN in, the first NaN's payload out, whatever numpy's max picks)."""
    x = np.arange(130, dtype=f32) / 10
    x[[5, 90]] = np.array([0x7FC00011, 0x7FC00022], np.uint32).view(f32)
    y = run1(ctx, "soft_max", x)
    assert set(y.view(np.uint32)[[i for i in range(130) if i != 90]].tolist()) == {0x7FC00011}
    assert y.view(np.uint32)[90] == 0x7FC00022


def test_rope_spec_example(ctx):
    x = from_array(ctx, np.tile(np.array([1, 2, 3, 4], f32), (2, 1, 1)))     # 2 tokens, 1 head
    pos = from_array(ctx, np.array([0, 3], np.int32))
    out = np.array(compute(ctx, F["rope"](ctx, x, pos, 4, 0)).data).reshape(2, 4)
    assert out[0].tolist() == [1, 2, 3, 4]
    np.testing.assert_allclose(out[1], [-1.27223253, -1.83886504, 2.87866807, 4.08818674], rtol=1e-6)


def test_mul_mat_q4_0_spec_example(ctx):
    i = np.arange(64)
    w = from_array(ctx, (((7 * i) % 17 - 8) * 0.1).astype(f32).reshape(2, 32))
    wq = F["cpy"](ctx, w, t(ctx, "q4_0", 32, 2))
    x = from_array(ctx, (((5 * np.arange(96)) % 13 - 6) * 0.25).astype(f32).reshape(3, 32))
    y = compute(ctx, F["mul_mat"](ctx, wq, x))
    assert bytes(wq.data.reshape(-1)[:4]) == bytes([0x66, 0x2E, 0xA0, 0x07])
    np.testing.assert_allclose(np.array(y.data).reshape(-1),
                               [-1.20317614, -1.37910664, 0.193641663, 1.05794477, 2.90816736, -1.07683671], rtol=1e-6)


def test_clamp_writes_into_a(ctx):
    a = from_array(ctx, np.array([-2, 0.5, 3], f32), name="a")
    c = F["clamp"](ctx, a, -1, 1)
    assert (c.name, c.view_src, c.op_desc) == ("a (view)", a, "CLAMP")
    compute(ctx, c)
    assert a.data.reshape(-1).tolist() == [-1, 0.5, 1]


def test_cpy_names_and_views(ctx):
    a, b = t(ctx, "f32", 4, name="src"), t(ctx, "f16", 4, name="dst")
    assert F["cpy"](ctx, a, b).name == "dst (copy of src)"
    c = F["cpy"](ctx, a, t(ctx, "f16", 4))
    assert (c.name, c.type, c.op) == ("src (copy)", ggtool.GGMLType.F16, "CPY")
    assert F["cont"](ctx, a).name == "src (cont)" and F["dup"](ctx, a).name == ""


def test_cpy_quantized_round_trip_and_new_tensor(ctx):
    x = np.linspace(-1, 1, 64, dtype=f32).reshape(2, 32)
    q = F["cpy"](ctx, from_array(ctx, x), F["new_tensor_2d"](ctx, "q8_0", 32, 2))
    back = compute(ctx, F["cpy"](ctx, q, F["new_tensor_2d"](ctx, "f32", 32, 2)))
    assert np.abs(np.array(back.data).reshape(2, 32) - x).max() < 1 / 127
    z = F["new_tensor_3d"](ctx, "f32", 2, 3, 4)
    assert (z.op, z.ne, float(np.abs(z.data).sum())) == ("NONE", (2, 3, 4, 1), 0.0)


def test_get_rows_f16_and_i32(ctx):
    idx = from_array(ctx, np.array([2, 0, 2], np.int32))
    h = from_array(ctx, np.arange(12, dtype=np.float16).reshape(3, 4))
    r = compute(ctx, F["get_rows"](ctx, h, idx))
    assert r.type == ggtool.GGMLType.F32 and r.data.reshape(3, 4)[:, 0].tolist() == [8, 0, 8]
    i = compute(ctx, F["get_rows"](ctx, from_array(ctx, np.arange(12, dtype=np.int32).reshape(3, 4)), idx))
    assert i.type == ggtool.GGMLType.I32 and i.data.reshape(3, 4)[:, 3].tolist() == [11, 3, 11]


def test_set_rows_converts_to_the_destination_type(ctx):
    """f32 rows into f16 (rounded as cpy rounds them) and f16 rows into f32 (widened, with the plan's
    f32 row of work per thread); the result is a view of a, named as ggml_view_tensor names it."""
    x = np.array([[0.1, 1 / 3, 65519.0, -2.5]], f32)
    h = from_array(ctx, np.zeros((3, 4), np.float16), name="h")
    r = compute(ctx, F["set_rows"](ctx, h, from_array(ctx, x), from_array(ctx, np.array([1], np.int64))))
    assert r.name == "h (view)" and r.view_src is h
    assert h.data.reshape(3, 4).tolist() == [[0] * 4, x.astype(np.float16)[0].tolist(), [0] * 4]
    a = from_array(ctx, np.zeros((2, 4), f32))
    s = F["set_rows"](ctx, a, from_array(ctx, x.astype(np.float16)), from_array(ctx, np.array([0], np.int32)))
    g = ggtool.Graph(ctx)
    g.expand(s)
    assert ggtool.make_plan(g, 2).work_size >= 4 * 4
    ggtool.graph_compute(g, 1)
    assert a.data.reshape(2, 4)[0].tolist() == x.astype(np.float16).astype(f32)[0].tolist()


def test_set_rows_broadcasts_the_indices_over_a_transposed_cache(ctx):
    """llama.cpp's transposed V cache: one-element rows of a strided view (the first 4 of 6 cells),
    b a permuted view of [n_embd, n_tokens] values, the indices broadcast over ne2: element j of
    token t lands at cell idx[t] of column j; the f16 destination (the general path) agrees."""
    v = np.arange(1, 7, dtype=f32).reshape(2, 3)                 # 2 tokens of 3 elements
    for dtype in (f32, np.float16):
        full = from_array(ctx, np.zeros((3, 6), dtype), name="vt")  # [6 cells, 3 columns]
        nb = full.nb
        a = F["view_3d"](ctx, full, 1, 4, 3, nb[0], nb[1], 0)     # [1, 4, 3]: the first 4 cells
        b = F["permute"](ctx, F["reshape_3d"](ctx, from_array(ctx, v), 1, 3, 2), 0, 2, 1, 3)   # [1, 2, 3]
        r = compute(ctx, F["set_rows"](ctx, a, b, from_array(ctx, np.array([3, 1], np.int32))))
        assert r.view_src is full and tuple(r.ne) == (1, 4, 3, 1)
        want = np.zeros((3, 6), f32)
        want[:, 3], want[:, 1] = v[0], v[1]
        assert full.data.reshape(3, 6).astype(f32).tolist() == want.tolist()


def test_set_rows_copies_f16_rows_into_f16_bit_for_bit(ctx):
    """f16 rows into an f16 tensor are a memcpy in GGML: a NaN's payload survives (no round trip
    through f32 and GGML_FP32_TO_FP16, which makes every NaN 0x7e00)."""
    bits = np.array([[0x7C01, 0xFD23, 0x3C00, 0x8000]], np.uint16)
    h = from_array(ctx, np.zeros((2, 4), np.float16), name="h")
    compute(ctx, F["set_rows"](ctx, h, from_array(ctx, bits.view(np.float16)), from_array(ctx, np.array([1], np.int32))))
    assert h.data.reshape(2, 4).view(np.uint16)[1].tolist() == bits[0].tolist()


def test_set_rows_broadcasts_indices_over_dims_2_and_3(ctx):
    """dst[:, c[i, i02 % ne11, i03 % ne12], i02, i03] = b[:, i, i02, i03] with i64 indices, into a
    view whose rows are not adjacent (every other row of a bigger tensor)."""
    rng = np.random.default_rng(0)
    big = np.zeros((2, 2, 10, 4), f32)
    b = rng.standard_normal((2, 2, 3, 4)).astype(f32)                 # ne [4, 3, 2, 2]
    idx = np.array([[[4, 0, 2]], [[1, 3, 0]]], np.int64)               # ne [3, 1, 2]
    whole = from_array(ctx, big, name="big")
    a = F["view_4d"](ctx, whole, 4, 5, 2, 2, 2 * whole.nb[1], whole.nb[2], whole.nb[3], 0)
    compute(ctx, F["set_rows"](ctx, a, from_array(ctx, b), from_array(ctx, idx)))
    want = big.copy()
    for i3 in range(2):
        for i2 in range(2):
            for i in range(3):
                want[i3, i2, 2 * idx[i3 % 2, i2 % 1, i]] = b[i3, i2, i]
    assert np.array_equal(whole.data.reshape(want.shape), want)


def test_add_quantized_a_requantizes(ctx):
    x = np.linspace(-1, 1, 64, dtype=f32).reshape(2, 32)
    q = compute(ctx, F["cpy"](ctx, from_array(ctx, x), t(ctx, "q8_0", 32, 2)))
    s = compute(ctx, F["add"](ctx, q, from_array(ctx, np.full((2, 32), 0.5, f32))))
    assert s.type == ggtool.GGMLType.Q8_0
    from ggtool import quant
    np.testing.assert_allclose(quant.dequantize(np.ascontiguousarray(s.data), s.type).reshape(2, 32), x + 0.5, atol=0.02)


def test_same_type_copy_takes_ggmls_same_indices_shortcut(ctx):
    """GGML copies row (i1, i2, i3) of a to row (i1, i2, i3) of a non-contiguous destination of the
    same type and ne0 even when dims 1..3 differ; where that leaves the destination (GGML writes past
    it) ggtool raises instead."""
    x = np.arange(12, dtype=f32).reshape(3, 4)                          # ne [4, 3]
    base = t(ctx, "f32", 4, 6)
    every_other_row = F["view_3d"](ctx, base, 4, 1, 3, 16, 32, 0)       # ne [4, 1, 3], not contiguous
    compute(ctx, F["cpy"](ctx, from_array(ctx, x), every_other_row))
    rows = base.data.reshape(6, 4)
    assert np.array_equal(rows[:3], x) and not rows[3:].any()           # linear order would fill rows 0, 2, 4
    src = F["view_2d"](ctx, from_array(ctx, np.zeros((3, 8), f32)), 4, 3, 32, 0)   # ne [4, 3] with gaps
    dst = F["view_3d"](ctx, t(ctx, "f32", 4, 12), 4, 1, 3, 64, 16, 0)             # ne [4, 1, 3]: 48 bytes
    with pytest.raises(ComputeError, match="same indices"):
        compute(ctx, F["cpy"](ctx, src, dst))
