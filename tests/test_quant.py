"""ggtool.quant against GGML's golden bytes (tests/golden/{q4_0,q8_0,f16}.npz) and gguf-py."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
from oracle_matmul import mul_mat_exact

from ggtool import quant as Q
from ggtool import types as T
from ggtool.errors import QuantizationError

GOLDEN = Path(__file__).parent / "golden"
FIXTURES = Path(__file__).parent.parent / "fixtures"


@pytest.fixture(scope="module")
def q4():
    return np.load(GOLDEN / "q4_0.npz")


@pytest.fixture(scope="module")
def q8():
    return np.load(GOLDEN / "q8_0.npz")


@pytest.fixture(scope="module")
def f16():
    return np.load(GOLDEN / "f16.npz")


@pytest.fixture(autouse=True)
def _no_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        yield


@pytest.fixture(params=[1, 2], ids=["1thread", "2threads"])
def threads(request):
    Q.set_threads(request.param)
    yield request.param
    Q.set_threads(None)


def _finite_edges(z):
    ok = np.isfinite(z["edge_x"]).all(axis=1)
    return ok


# ---------------------------------------------------------------------------------------------- f16

def test_fp32_to_fp16_golden(f16):
    h = Q.fp32_to_fp16(f16["f32"]).view(np.uint16)
    bad = np.flatnonzero(h != f16["f16_bits"])
    assert bad.size == 0, [(f16["category"][i], hex(f16["f32_bits"][i]), hex(h[i])) for i in bad]


def test_fp16_to_fp32_golden(f16):
    back = Q.fp16_to_fp32(f16["f16_bits"])
    assert np.array_equal(back.view(np.uint32)[~np.isnan(back)],
                          f16["back_to_f32"].view(np.uint32)[~np.isnan(back)])
    assert np.array_equal(np.isnan(back), np.isnan(f16["back_to_f32"]))


def test_fp16_nan_sign():
    x = np.array([0x7FC00001, 0xFFFFFFFF, 0x7F800001], np.uint32).view(np.float32)
    assert Q.fp32_to_fp16(x).view(np.uint16).tolist() == [0x7E00, 0xFE00, 0x7E00]


# --------------------------------------------------------------------------------------------- Q4_0

def test_q4_0_golden_blocks(q4, threads):
    got = Q.quantize_q4_0(q4["x"])
    bad = np.flatnonzero((got != q4["q4_0"]).any(axis=1))
    assert bad.size == 0, sorted(set(q4["category"][bad]))


def test_q4_0_golden_as_one_tensor(q4):
    # the same blocks laid out as rows of 4 blocks
    x = q4["x"][:392].reshape(98, 128)
    assert np.array_equal(Q.quantize_q4_0(x), q4["q4_0"][:392].reshape(98, 72))


def test_q4_0_finite_edge_blocks(q4):
    ok = _finite_edges(q4)
    assert ok.sum() == 4
    assert np.array_equal(Q.quantize_q4_0(q4["edge_x"][ok]), q4["edge_q4_0"][ok])


def test_q4_0_dequant_golden(q4):
    assert np.array_equal(Q.dequantize_q4_0(q4["q4_0"]).view(np.uint32), q4["dequant"].view(np.uint32))
    with np.errstate(invalid="ignore"):
        got = Q.dequantize_q4_0(q4["edge_q4_0"])
    assert np.array_equal(got, q4["edge_dequant"], equal_nan=True)


def test_q4_0_spec_examples():
    x = np.arange(32, dtype=np.float32) - 10
    assert Q.quantize_q4_0(x).tobytes().hex() == "40c16c5b5b5b4a4a3a39392828281717" + "0606"
    assert Q.quantize_q4_0(np.zeros(32, np.float32)).tobytes().hex() == "0080" + "88" * 16
    assert Q.quantize_q4_0(-np.zeros(32, np.float32)).tobytes()[:2] == b"\x00\x80"
    x = np.zeros(32, np.float32)
    x[0], x[1] = -4, 4
    assert Q.quantize_q4_0(x).tobytes().hex() == "0038808f" + "88" * 14


def test_q4_0_ties_first_wins():
    rng = np.random.default_rng(1)
    x = rng.uniform(-1, 1, (512, 32)).astype(np.float32)
    i, j = rng.integers(0, 32, 512), rng.integers(0, 32, 512)
    x[np.arange(512), i] = 2.0
    x[np.arange(512), j] = np.where(j != i, -2.0, 2.0)
    import gguf
    # gguf-py uses argmax (first occurrence) too; its only known difference is the +-0 block
    assert np.array_equal(Q.quantize_q4_0(x), gguf.quants.quantize(x, gguf.GGMLQuantizationType.Q4_0))


@pytest.mark.parametrize("shape", [(1, 32), (7, 96), (3, 5, 64), (70000, 32)])
def test_q4_0_matches_gguf_py_random(shape, threads):
    import gguf
    rng = np.random.default_rng(sum(shape))
    x = (rng.standard_normal(shape) * rng.choice([1e-3, 1, 50], size=shape[:-1] + (1,))).astype(np.float32)
    got = Q.quantize_q4_0(x)
    assert got.shape == shape[:-1] + (shape[-1] // 32 * 18,)
    assert np.array_equal(got, gguf.quants.quantize(x, gguf.GGMLQuantizationType.Q4_0))


def test_q4_0_matches_gguf_py_on_stories260k():
    import gguf

    from ggtool.gguf_io import GGUFFile
    f = GGUFFile(FIXTURES / "stories260K.gguf")
    n = 0
    for name, info in f.tensors.items():
        if len(info.ne) < 2 or info.ne[0] % 32:
            continue
        x = np.asarray(f.array(name), dtype=np.float32)
        assert np.array_equal(Q.quantize_q4_0(x, name), gguf.quants.quantize(x, gguf.GGMLQuantizationType.Q4_0)), name
        n += 1
    assert n == 32


def test_q4_0_round_trip_error_bound():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((64, 256)).astype(np.float32)
    y = Q.dequantize_q4_0(Q.quantize_q4_0(x))
    amax = np.abs(x.reshape(-1, 32)).max(axis=1, keepdims=True)
    assert (np.abs((y - x).reshape(-1, 32)) <= amax / 8 * 1.0001).all()


# --------------------------------------------------------------------------------------------- Q8_0

@pytest.mark.parametrize("key,fn", [("q8_0_ref", Q.quantize_q8_0), ("q8_0_cpu", Q.quantize_q8_0_cpu)])
def test_q8_0_golden_blocks(q8, key, fn, threads):
    got = fn(q8["x"])
    bad = np.flatnonzero((got != q8[key]).any(axis=1))
    assert bad.size == 0, sorted(set(q8["category"][bad]))
    ok = _finite_edges(q8)
    assert np.array_equal(fn(q8["edge_x"][ok]), q8["edge_" + key][ok])


@pytest.mark.parametrize("kind", ["ref", "cpu"])
def test_q8_0_dequant_golden(q8, kind):
    assert np.array_equal(Q.dequantize_q8_0(q8["q8_0_" + kind]), q8["dequant_" + kind])


def test_q8_0_ref_halfway_rounds_away_from_zero():
    x = np.zeros(32, np.float32)
    x[0] = 127.0
    x[1:4] = [0.5, 2.5, -2.5]
    got = Q.quantize_q8_0(x).view(np.int8)[2:6].tolist()
    assert got == [127, 1, 3, -3]
    assert Q.quantize_q8_0_cpu(x).view(np.int8)[2:6].tolist() == [127, 0, 2, -2]


def test_q8_0_matches_gguf_py_random():
    import gguf
    rng = np.random.default_rng(5)
    x = rng.standard_normal((300, 128)).astype(np.float32)
    assert np.array_equal(Q.quantize_q8_0(x), gguf.quants.quantize(x, gguf.GGMLQuantizationType.Q8_0))


# ------------------------------------------------------------------------------------------- errors

@pytest.mark.parametrize("fn", [Q.quantize_q4_0, Q.quantize_q8_0, Q.quantize_q8_0_cpu])
@pytest.mark.parametrize("bad,word", [(np.nan, "NaN"), (np.inf, "inf"), (-np.inf, "-inf")])
def test_nonfinite_named(fn, bad, word):
    x = np.zeros((5, 64), np.float32)
    x[3, 17] = bad
    x[4, 0] = np.nan
    with pytest.raises(QuantizationError) as e:
        fn(x, name="blk.0.attn_q.weight")
    assert str(e.value) == f"tensor 'blk.0.attn_q.weight': cannot quantize {word} at index (3, 17)"


def test_nonfinite_first_index_across_chunks():
    Q.set_threads(2)
    try:
        x = np.zeros((Q.CHUNK_BLOCKS * 3, 32), np.float32)
        x[Q.CHUNK_BLOCKS * 2 + 5, 3] = np.nan
        x[Q.CHUNK_BLOCKS + 1, 31] = np.inf
        with pytest.raises(QuantizationError, match=rf"inf at index \({Q.CHUNK_BLOCKS + 1}, 31\)"):
            Q.quantize_q4_0(x, "w")
    finally:
        Q.set_threads(None)


@pytest.mark.parametrize("fn", [Q.quantize_q4_0, Q.quantize_q8_0])
def test_row_length_not_multiple_of_32(fn):
    with pytest.raises(QuantizationError, match=r"tensor 'ffn_down': row length 172 is not a multiple of 32"):
        fn(np.zeros((4, 172), np.float32), name="ffn_down")


def test_generic_quantize_errors():
    with pytest.raises(QuantizationError, match="row length 40"):
        Q.quantize(np.zeros(40, np.float32), "q4_0", name="t")
    with pytest.raises(QuantizationError, match="cannot quantize to q1_0"):
        Q.quantize(np.zeros(256, np.float32), T.GGMLType.Q1_0, name="t")
    with pytest.raises(QuantizationError, match="tensor 't': iq2_xxs needs an importance matrix"):
        Q.quantize(np.zeros(256, np.float32), T.GGMLType.IQ2_XXS, name="t")
    with pytest.raises(QuantizationError, match="row length 16 is not a multiple of 32"):
        Q.quantize(np.zeros(16, np.float32), T.GGMLType.Q5_0, name="t")


# ------------------------------------------------------------------------------ generic / convert

def test_generic_round_trips():
    rng = np.random.default_rng(7)
    x = rng.standard_normal((4, 64)).astype(np.float32)
    for t in ("f32", "f16", "q4_0", "q8_0", "bf16", "q5_0", "q4_1", "q5_1"):
        raw = Q.quantize(x, t)
        y = Q.dequantize(raw, t)
        assert y.dtype == np.float32 and y.shape == x.shape, t
        assert np.abs(y - x).max() < 0.5, t
    assert Q.quantize(x, "f16").dtype == np.float16


def test_dequantize_other_types_like_gguf_py():
    import gguf
    rng = np.random.default_rng(8)
    for t in (gguf.GGMLQuantizationType.Q4_K, gguf.GGMLQuantizationType.Q6_K, gguf.GGMLQuantizationType.Q5_0):
        _, ts = gguf.GGML_QUANT_SIZES[t]
        raw = rng.integers(0, 256, (3, 2 * ts), dtype=np.uint8)
        raw.reshape(3, 2, ts)[..., :2] = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
        with np.errstate(all="ignore"):
            assert np.array_equal(Q.dequantize(raw, t), gguf.quants.dequantize(raw, t), equal_nan=True)


def test_convert():
    x = np.array([[1.5, -2.0] * 16], np.float32)
    assert Q.convert(x, "f32", "f16", "t").dtype == np.float16
    q = Q.convert(x, "f32", "q4_0", "t")
    assert q.dtype == np.uint8 and q.shape == (1, 18)
    assert np.array_equal(Q.convert(q, "q4_0", "f32", "t"), Q.dequantize_q4_0(q))
    assert np.array_equal(Q.convert(q, "q4_0", "q4_0", "t"), q)
    assert Q.convert(np.array([1, 2, 3], np.int64), "i64", "i32", "t").dtype == np.int32
    assert Q.convert(np.array([1.0, 2.0], np.float32), "f32", "i32", "t").tolist() == [1, 2]
    assert Q.convert(np.array([1, 2], np.int32), "i32", "f32", "t").dtype == np.float32
    with pytest.raises(QuantizationError, match="not a i32 integer"):
        Q.convert(np.array([1.5], np.float32), "f32", "i32", "idx")
    with pytest.raises(QuantizationError, match="does not fit i32"):
        Q.convert(np.array([2**40], np.int64), "i64", "i32", "idx")
    with pytest.raises(QuantizationError, match="cannot quantize NaN"):
        Q.convert(np.array([np.nan] * 32, np.float32), "f32", "q8_0", "t")


# ----------------------------------------------------------------------------------------- mul_mat

def _nmse(y, ref):
    return float(((y.astype(np.float64) - ref) ** 2).sum() / (ref.astype(np.float64) ** 2).sum())


@pytest.fixture(scope="module")
def ops():
    return np.load(GOLDEN / "ops.npz"), {c["name"]: c for c in json.loads((GOLDEN / "ops.json").read_text())["cases"]}


def test_mul_mat_q4_0_golden(ops):
    z, _ = ops
    a, b, r = z["mul_mat_q4_0.a"], z["mul_mat_q4_0.b"], z["mul_mat_q4_0.result"]
    act = Q.quantize_q8_0_cpu(b.reshape(-1, b.shape[-1]))
    assert np.array_equal(act, z["mul_mat_q4_0.aux.b_q8_0_cpu"].reshape(act.shape))
    y = Q.mul_mat_quantized(a.reshape(-1, a.shape[-1]), "q4_0", act)
    assert y.shape == (5, 16) and y.dtype == np.float32
    assert _nmse(y, r.reshape(y.shape)) < 1e-10
    assert y.tobytes() == mul_mat_exact(a.reshape(-1, a.shape[-1]), "q4_0", act).tobytes()


def test_mul_mat_q4_0_q8ref_golden(ops):
    z, _ = ops
    a, b, r = z["mul_mat_q4_0_q8ref.a"], z["mul_mat_q4_0_q8ref.b"], z["mul_mat_q4_0_q8ref.result"]
    y = Q.mul_mat_quantized(a.reshape(-1, a.shape[-1]), "q4_0", b.reshape(-1, b.shape[-1]))
    assert _nmse(y, r.reshape(y.shape)) < 1e-10


def test_mul_mat_q4_0_golden_bcast(ops):
    z, _ = ops
    a, b, r = z["mul_mat_q4_0_bcast.a"], z["mul_mat_q4_0_bcast.b"], z["mul_mat_q4_0_bcast.result"]
    # a: (1, 2, 8, rb), b: (1, 4, 5, 128): b-matrix k uses a-matrix k // 2
    for k in range(4):
        act = Q.quantize_q8_0_cpu(b[0, k])
        y = Q.mul_mat_quantized(a[0, k // 2], "q4_0", act)
        assert _nmse(y, r[0, k]) < 1e-10


def test_mul_mat_q4_0_graph_cpy(ops):
    z, _ = ops
    src = z["cpy_f32_q4_0.a"]
    assert np.array_equal(Q.quantize_q4_0(src), z["cpy_f32_q4_0.result"])


def test_mul_mat_spec_example():
    i = np.arange(96)
    w = (((7 * i[:64]) % 17 - 8).astype(np.float32) * np.float32(0.1)).reshape(2, 32)
    x = (((5 * i) % 13 - 6).astype(np.float32) * np.float32(0.25)).reshape(3, 32)
    wq = Q.quantize_q4_0(w)
    assert wq.tobytes()[:4].hex() == "662ea007"
    for act in (Q.quantize_q8_0(x), Q.quantize_q8_0_cpu(x)):
        y = Q.mul_mat_quantized(wq, "q4_0", act)
        want = np.array([-1.20317614, -1.37910664, 0.193641663, 1.05794477, 2.90816736, -1.07683671], np.float32)
        assert np.allclose(y.reshape(-1), want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("wtype", ["q4_0", "q8_0"])
def test_mul_mat_fast_vs_exact_random(wtype):
    rng = np.random.default_rng(11)
    w = rng.standard_normal((300, 512)).astype(np.float32)
    x = rng.standard_normal((7, 512)).astype(np.float32)
    wq = Q.quantize(w, wtype)
    act = Q.quantize_q8_0_cpu(x)
    fast = Q.mul_mat_quantized(wq, wtype, act)
    exact = mul_mat_exact(wq, wtype, act)
    assert fast.tobytes() == exact.tobytes()          # GGML's scalar order, bit for bit
    ref = Q.dequantize_q8_0(act).astype(np.float64) @ Q.dequantize(wq, wtype).astype(np.float64).T
    assert _nmse(fast, ref) < 1e-12 and _nmse(exact, ref) < 1e-12


def test_mul_mat_shape_mismatch():
    with pytest.raises(QuantizationError, match="differ in length"):
        Q.mul_mat_quantized(np.zeros((2, 36), np.uint8), "q4_0", np.zeros((1, 34), np.uint8))


# ------------------------------------------------------------------- Q4_0 golden op / graph cases

@pytest.fixture(scope="module")
def graphs():
    return np.load(GOLDEN / "graphs.npz")


@pytest.mark.parametrize("case,key", [("mul_mat_q4_0", "a"), ("mul_mat_q4_0_bcast", "a"),
                                      ("mul_mat_q4_0_q8ref", "a"), ("get_rows_q4_0", "a")])
def test_golden_q4_0_inputs_are_our_bytes(ops, case, key):
    """Every Q4_0 tensor of the op cases was made by GGML from its f32 source: same bytes here."""
    z, _ = ops
    src, q = z[f"{case}.aux.{key}_f32_source"], z[f"{case}.{key}"]
    assert np.array_equal(Q.quantize_q4_0(src).reshape(q.shape), q)


def test_golden_q8ref_input_is_our_reference_q8_0(ops):
    z, _ = ops
    q = z["mul_mat_q4_0_q8ref.b"]
    assert np.array_equal(Q.quantize_q8_0(z["mul_mat_q4_0_q8ref.aux.b_f32_source"]).reshape(q.shape), q)


def test_golden_get_rows_q4_0(ops):
    z, _ = ops
    a, idx, r = z["get_rows_q4_0.a"], z["get_rows_q4_0.idx"].reshape(-1), z["get_rows_q4_0.result"]
    rows = Q.dequantize_q4_0(a.reshape(-1, a.shape[-1]))[idx]
    assert np.array_equal(rows.view(np.uint32), r.reshape(rows.shape).view(np.uint32))


def test_golden_graph_cpy_q4_0_mul_mat(graphs):
    w, x, y = graphs["cpy_q4_0_mul_mat.w"], graphs["cpy_q4_0_mul_mat.x"], graphs["cpy_q4_0_mul_mat.result.y"]
    wq = Q.quantize_q4_0(w.reshape(-1, 32))                       # cpy f32 -> q4_0
    got = Q.mul_mat_quantized(wq, "q4_0", Q.quantize_q8_0_cpu(x.reshape(-1, 32)))
    assert _nmse(got, y.reshape(got.shape)) < 1e-10


def test_golden_graph_q4_0_weights(graphs):
    for src, q in (("q4_0_mlp.aux.w1_f32_source", "q4_0_mlp.w1"), ("embed_rope.aux.emb_f32_source", "embed_rope.emb")):
        assert np.array_equal(Q.quantize_q4_0(graphs[src]).reshape(graphs[q].shape), graphs[q])


def test_mul_mat_is_split_invariant_and_reproducible():
    rng = np.random.default_rng(12)
    w = Q.quantize_q4_0(rng.standard_normal((40, 256)).astype(np.float32))
    act = Q.quantize_q8_0_cpu(rng.standard_normal((6, 256)).astype(np.float32))
    full = Q.mul_mat_quantized(w, "q4_0", act)
    assert Q.mul_mat_quantized(w[5:17], "q4_0", act[2:3]).tobytes() == full[2:3, 5:17].tobytes()
