"""Property tests: layout views + cont/cpy against numpy, for random shapes, axes and thread counts.

numpy C-order arrays have axes (ne3, ne2, ne1, ne0); `ggml_order` flips them so axis k is ggml dim k.
GGML's permute(a, p0..p3) sends source dim i to position p_i, which is numpy's transpose with the
inverse permutation argsort(p).
"""

import numpy as np
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from kernel_threads import compute_threaded

import ggtool
from ggtool.ops import FUNCTIONS as F

SETTINGS = settings(max_examples=40, deadline=None)
dims = st.lists(st.integers(1, 5), min_size=4, max_size=4)
threads = st.integers(1, 4)


def ggml_order(a: np.ndarray) -> np.ndarray:
    return a.transpose(3, 2, 1, 0)


def run(ctx, out, nth):
    g = ggtool.Graph(ctx)
    g.expand(out)
    if nth == 1:
        ggtool.graph_compute(g, 1)
    else:
        compute_threaded(g, nth, force=True)
    return np.array(out.data)


def leaf(ctx, ne, seed=0):
    x = np.random.default_rng(seed).standard_normal(ne[::-1]).astype(np.float32)
    return x, ctx.new_tensor_from(x)


@SETTINGS
@given(ne=dims, perm=st.permutations([0, 1, 2, 3]), nth=threads)
def test_cont_of_permute_is_numpy_transpose(ne, perm, nth):
    ctx = ggtool.Context()
    x, a = leaf(ctx, ne)
    p = F["permute"](ctx, a, *perm)
    assert list(p.ne) == [ne[perm.index(k)] for k in range(4)]
    got = run(ctx, F["cont"](ctx, p), nth)
    want = ggml_order(np.transpose(ggml_order(x), np.argsort(perm)))
    assert np.array_equal(got, want)


@SETTINGS
@given(ne=dims, nth=threads)
def test_cont_of_transpose(ne, nth):
    ctx = ggtool.Context()
    x, a = leaf(ctx, ne)
    got = run(ctx, F["cont"](ctx, F["transpose"](ctx, a)), nth)
    assert np.array_equal(got, x.swapaxes(2, 3))


@SETTINGS
@given(ne=dims, data=st.data(), nth=threads)
def test_cont_of_view_3d_is_a_numpy_slice(ne, data, nth):
    ctx = ggtool.Context()
    x, a = leaf(ctx, ne)
    v = [data.draw(st.integers(1, n)) for n in ne[:3]]
    o = [data.draw(st.integers(0, n - k)) for n, k in zip(ne[:3], v)]
    offset = 4 * (o[0] + ne[0] * (o[1] + ne[1] * o[2]))
    view = F["view_3d"](ctx, a, v[0], v[1], v[2], a.nb[1], a.nb[2], offset)
    got = run(ctx, F["cont"](ctx, view), nth)
    want = x[:1, o[2]:o[2] + v[2], o[1]:o[1] + v[1], o[0]:o[0] + v[0]]
    assert np.array_equal(got, want)


@SETTINGS
@given(ne=dims, perm=st.permutations([0, 1, 2, 3]), nth=threads, to_f16=st.booleans())
def test_cpy_into_a_permuted_destination(ne, perm, nth, to_f16):
    """Elements go in source logical order to the destination's logical positions, whatever
    the destination's strides (here a permuted view of a packed tensor). Same-type copies with
    equal ne0 take GGML's "same indices" shortcut instead (test_ops_unit covers that)."""
    ctx = ggtool.Context()
    x, a = leaf(ctx, ne)
    dst_ne = [ne[perm.index(k)] for k in range(4)]
    assume(to_f16 or dst_ne[0] != ne[0] or dst_ne == ne)
    inv = list(np.argsort(perm))                     # permute(dst_base, inv) has the shape dst_ne
    base = ctx.new_tensor("f16" if to_f16 else "f32", [dst_ne[inv[k]] for k in range(4)])
    dst = F["permute"](ctx, base, *inv)
    assert list(dst.ne) == dst_ne
    got = run(ctx, F["cpy"](ctx, a, dst), nth)
    want = x.reshape(-1).astype(np.float16 if to_f16 else np.float32).reshape(dst_ne[::-1])
    assert np.array_equal(got, want)


@SETTINGS
@given(b_ne=dims, reps=st.lists(st.integers(1, 3), min_size=4, max_size=4), nth=threads,
       op=st.sampled_from(["add", "sub", "mul", "div"]))
def test_binary_ops_tile_b_like_np_tile(b_ne, reps, nth, op):
    ctx = ggtool.Context()
    a_ne = [n * r for n, r in zip(b_ne, reps)]
    x, a = leaf(ctx, a_ne, 1)
    y, b = leaf(ctx, b_ne, 2)
    got = run(ctx, F[op](ctx, a, b), nth)
    ufunc = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide}[op]
    assert np.array_equal(got, ufunc(x, np.tile(y, reps[::-1])))


@SETTINGS
@given(m=st.integers(1, 40), n=st.integers(1, 40), k32=st.integers(1, 3), b2=st.integers(1, 2), r2=st.integers(1, 3),
       r3=st.integers(1, 2), nth=threads, wtype=st.sampled_from(["f32", "f16", "q4_0", "q8_0"]), permute_b=st.booleans())
def test_mul_mat_against_numpy(m, n, k32, b2, r2, r3, nth, wtype, permute_b):
    """B @ A.T per matrix, a-matrices repeated in blocks over b's dims 2/3; b may be a permuted view."""
    from ggtool import quant

    ctx = ggtool.Context()
    K = 32 * k32
    rng = np.random.default_rng(m * 1000 + n)
    w = rng.standard_normal((1, b2, m, K)).astype(np.float32)
    x = rng.standard_normal((r3, b2 * r2, n, K)).astype(np.float32)
    a = ctx.new_tensor_from(w, wtype)
    if permute_b:  # store x with dims 1 and 2 swapped, then permute back to the same logical shape
        b = F["permute"](ctx, ctx.new_tensor_from(np.ascontiguousarray(x.swapaxes(1, 2))), 0, 2, 1, 3)
    else:
        b = ctx.new_tensor_from(x)
    assert list(b.ne) == [K, n, b2 * r2, r3]
    got = run(ctx, F["mul_mat"](ctx, a, b), nth)
    if wtype[0] == "q":  # weights as stored; activations as mul_mat converts them (CPU Q8_0)
        wv = quant.dequantize(np.ascontiguousarray(a.data), a.type).reshape(w.shape)
        xv = quant.dequantize(quant.quantize_q8_0_cpu(x), "q8_0").reshape(x.shape)
    else:
        wv, xv = (w, x) if wtype == "f32" else (w.astype(np.float16).astype(np.float32), x.astype(np.float16).astype(np.float32))
    want = np.einsum("abnk,abmk->abnm", xv.astype(np.float64), np.repeat(wv, r2, axis=1).astype(np.float64))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.sqrt(K))


@SETTINGS
@given(ne=dims, dim=st.integers(0, 3), extra=st.integers(1, 4), nth=threads)
def test_concat_is_np_concatenate(ne, dim, extra, nth):
    ctx = ggtool.Context()
    x, a = leaf(ctx, ne, 1)
    ne_b = list(ne)
    ne_b[dim] = extra
    y, b = leaf(ctx, ne_b, 2)
    got = run(ctx, F["concat"](ctx, a, b, dim), nth)
    assert np.array_equal(got, np.concatenate([x, y], axis=3 - dim))


@SETTINGS
@given(ne=dims, data=st.data(), nth=threads)
def test_get_rows_and_repeat(ne, data, nth):
    ctx = ggtool.Context()
    ne[3] = 1
    x, a = leaf(ctx, ne)
    n_idx = data.draw(st.integers(1, 6))
    idx = np.array(data.draw(st.lists(st.integers(0, ne[1] - 1), min_size=n_idx * ne[2], max_size=n_idx * ne[2])),
                   np.int32).reshape(1, 1, ne[2], n_idx)
    got = run(ctx, F["get_rows"](ctx, a, ctx.new_tensor_from(idx.reshape(ne[2], n_idx))), nth)
    want = np.stack([x[0, i2, idx[0, 0, i2]] for i2 in range(ne[2])])[None]
    assert np.array_equal(got, want)
    reps = data.draw(st.lists(st.integers(1, 3), min_size=4, max_size=4))
    shape = ctx.new_tensor("f32", [n * r for n, r in zip(ne, reps)])
    assert np.array_equal(run(ctx, F["repeat"](ctx, a, shape), nth), np.tile(x, reps[::-1]))
