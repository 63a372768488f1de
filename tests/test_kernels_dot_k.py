"""Q5_0, Q4_K, Q5_K and Q6_K mul_mat (compiled dots, Q8_0 / Q8_K activations) against a float64
reference (gguf-py's dequantized weights times the dequantized activations), and bit-identical for
1..4 participants; Q8_K quantization against its numpy oracle."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from kernel_threads import compute_threaded
from oracle_matmul import BLOCKS, dequantize_q8_k, quantize_q8_k, random_blocks

import ggtool
from ggtool import qtypes
from ggtool import quant as Q
from ggtool import types as T
from ggtool.errors import QuantizationError
from ggtool.kernels import dot, simd
from ggtool.kernels.dot_base import GROUP, interleave_into

BLOCK = [t for t in BLOCKS if t not in ("q4_0", "q8_0")]   # the K-quants and Q4_1/Q5_0/Q5_1 (dot.py has its own tests)


def _acts(t: str, x: np.ndarray) -> np.ndarray:
    return {"q5_0": Q.quantize_q8_0_cpu, "q4_1": Q.quantize_q8_1_cpu, "q5_1": Q.quantize_q8_1_cpu}.get(t, Q.quantize_q8_k)(x)


def _dequantized_acts(t: str, a: np.ndarray) -> np.ndarray:
    if t == "q5_0":
        return Q.dequantize_q8_0(a).astype(np.float64)
    if t in ("q4_1", "q5_1"):   # Q8_1: fp16 d, fp16 s, int8 qs
        b = a.reshape(-1, 36)
        d = b[:, :2].copy().view(np.float16).astype(np.float64)
        return (b[:, 4:].view(np.int8) * d).reshape(a.shape[0], -1)
    return dequantize_q8_k(a)


def test_every_dot_type_has_its_packed_dot():
    """The float types' dots by type (BF16, and F32/F16: mul_mat's float weights, kernels.dot_float);
    every classic block type's record names a packed form of kernels.dot, and no form is unused."""
    assert set(dot.DOTS) == {T.BF16, T.F32, T.F16}
    classic = {"q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q2_K", "q3_K", "q4_K", "q5_K", "q6_K", "bf16"}
    assert {T.type_name(t) for t in qtypes.DOT_TYPES} == classic     # GGML's 32- and 256-value types
    forms = {qtypes.get(t).packed_form for t in qtypes.DOT_TYPES if t != T.BF16}
    assert forms == set(dot.FORMS)


@pytest.mark.parametrize("t", [T.F32, T.F16], ids=["f32", "f16"])
def test_float_weights_writable_or_read_only_take_one_compiled_form(t):
    """numba compiles a function anew for read-only arrays: a file's weights are read-only, the KV
    cache's and a context's are not. The F32/F16 dots view every weight read-only, so a first-ever
    run compiles one form (F32's cost ~7 s CPU to compile with both, ~4.5 s with one) and both give
    the same bits."""
    from ggtool.kernels import dot_float

    rng = np.random.default_rng(5)
    dtype = np.float32 if t == T.F32 else np.float16
    w = rng.standard_normal((40, 48)).astype(dtype)
    ro = w.copy()
    ro.flags.writeable = False
    act = rng.standard_normal((3, 48)).astype(dtype)
    outs = []
    for weights in (w, ro):
        packed = dot.pack(t, weights.view(np.uint8))
        assert not packed[0].flags.writeable and weights.flags.writeable == (weights is w)
        outs.append(np.empty((3, 40), np.float32))
        dot.dot(t, packed, act.view(np.uint8), outs[-1])
    assert outs[0].tobytes() == outs[1].tobytes()
    sigs = dot_float._dot.signatures
    assert sigs and all(not sig[0].mutable for sig in sigs)


@pytest.mark.parametrize("finite", [True, False])
def test_q8_k_is_ggml_reference(finite):
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((40, 512)) * rng.choice([1e-30, 1.0, 1e30], (40, 1))).astype(np.float32)
    x[5] = 0.0
    x[6, 7] = -x[6].__abs__().max() * 1.5          # the signed max is negative
    x[7, :2] = [3.0, -3.0]                         # a tie in |x|: the first one wins
    x[7, 2:] = 0.5
    if finite:
        assert Q.quantize_q8_k(x).tobytes() == quantize_q8_k(x).tobytes()
    else:
        x[9, 300] = np.nan
        with pytest.raises(QuantizationError, match=r"NaN at index \(9, 300\)"):
            Q.quantize_q8_k(x)


@pytest.mark.parametrize("t", BLOCK)
@pytest.mark.parametrize("n,k,m", [(1, 256, 1), (130, 512, 3), (70, 1024, 17)])
def test_dot_matches_float64_reference(t, n, k, m):
    w = random_blocks(t, n, k, n + k + m)
    x = np.random.default_rng(m).standard_normal((m, k)).astype(np.float32)
    a = _acts(t, x)
    got = Q.mul_mat_quantized(w, t, a)
    ref = _dequantized_acts(t, a) @ gguf.quants.dequantize(w, T.parse_type(t)).astype(np.float64).T
    assert got.shape == (m, n)
    # Q8_1's s = fp16(d * sum(qs)) carries the min term of Q4_1/Q5_1 at fp16 precision, as in GGML
    tol = 1e-3 if t in ("q4_1", "q5_1") else 2e-6
    assert np.abs(got - ref).max() <= tol * np.abs(ref).max()


@pytest.mark.parametrize("t", BLOCK)
def test_mul_mat_node_bit_identical_for_1_to_4_participants(t):
    n, k, m = 2 * 1024 + 70, 512, 3
    w = random_blocks(t, n, k, 9)
    x = np.random.default_rng(1).standard_normal((m, k)).astype(np.float32)
    ctx = ggtool.Context()
    wt = ctx.new_tensor(t, [k, n]).set_data(w)
    b = ctx.new_tensor("f32", [k, m]).set_data(x)
    y = ggtool.ops.FUNCTIONS["mul_mat"](ctx, wt, b)
    g = ggtool.Graph(ctx)
    g.expand(y)
    plan = ggtool.make_plan(g, 2)
    vdt = T.vec_dot_type(T.parse_type(t))
    assert plan.work_size >= T.row_size(vdt, k * m)             # GGML's work size: b as vec_dot_type
    ggtool.graph_compute(g, 1)
    one = y.data.copy()
    assert one.reshape(m, n).tobytes() == Q.mul_mat_quantized(w, t, _acts(t, x)).tobytes()
    for nth in (2, 3, 4):
        y.data[...] = 0
        compute_threaded(g, nth, force=True)
        assert y.data.tobytes() == one.tobytes(), f"{nth} participants differ from 1"


def test_q8_1_is_q8_0_cpu_plus_the_scaled_sum():
    x = np.random.default_rng(4).standard_normal((50, 64)).astype(np.float32)
    x[3] = 0
    got = Q.quantize_q8_1_cpu(x).reshape(-1, 36)
    q8 = Q.quantize_q8_0_cpu(x).reshape(-1, 34)
    assert got[:, :2].tobytes() == q8[:, :2].tobytes() and got[:, 4:].tobytes() == q8[:, 2:].tobytes()
    blocks = x.reshape(-1, 32)
    d = np.abs(blocks).max(axis=1) / np.float32(127)                       # the unrounded float32 d
    s = (d * q8[:, 2:].view(np.int8).astype(np.int32).sum(axis=1).astype(np.float32)).astype(np.float16)
    assert got[:, 2:4].copy().view(np.float16).reshape(-1).tobytes() == s.tobytes()


def test_unsupported_weight_type_is_one_clear_error():
    with pytest.raises(QuantizationError, match="no quantized dot product for nvfp4"):
        Q.mul_mat_quantized(np.zeros((2, 36), np.uint8), "nvfp4", np.zeros((1, 68), np.uint8))
    with pytest.raises(QuantizationError, match=r"weight rows of 36 bytes \(iq4_nl\) and activation rows of 34"):
        Q.mul_mat_quantized(np.zeros((2, 36), np.uint8), "iq4_nl", np.zeros((1, 34), np.uint8))


def test_q8_1_has_ggml_block_size_in_plans():
    """gguf-py's table still says 40 bytes (float d, s); GGML's block_q8_1 is 36 (two fp16, 32 codes)."""
    assert T.type_size(T.GGMLType.Q8_1) == 36 and T.row_size(T.GGMLType.Q8_1, 64) == 72


@pytest.mark.parametrize("t", BLOCK)
def test_get_rows_dequantizes_as_ggml(t):
    """get_rows of a block type: the picked rows dequantized to f32 (GGML's to_float, which gguf-py's
    dequantize reproduces), for every type mul_mat takes natively."""
    w = random_blocks(t, 6, 512, 2)
    ctx = ggtool.Context()
    a = ctx.new_tensor(t, [512, 6]).set_data(w)
    idx = ctx.new_tensor("i32", [3]).set_data(np.array([5, 0, 5], np.int32))
    y = ggtool.ops.FUNCTIONS["get_rows"](ctx, a, idx)
    g = ggtool.Graph(ctx)
    g.expand(y)
    ggtool.graph_compute(g, 1)
    want = gguf.quants.dequantize(w[[5, 0, 5]], T.parse_type(t))
    assert y.type == T.F32 and y.data.reshape(3, 512).tobytes() == np.asarray(want, np.float32).tobytes()


@pytest.mark.parametrize("case", ["quads", "nibble_slice", "pairs", "pairs_int32", "scales_int32"])
def test_interleave_into_moves_whole_units_to_the_bytewise_layout(case):
    """The packers' unit moves (a quad as one u32, a pair as one u16) put every byte where the
    element-wise transposition of ``simd``'s layout does, from strided rows and wider dtypes too."""
    rng = np.random.default_rng(len(case))
    n, nb, C, L = 2 * GROUP, 3, GROUP // simd.L, simd.L
    if case == "nibble_slice":       # Q4_0's nibble bytes, read in place from 18-byte blocks
        rows = rng.integers(0, 256, (n, nb, 18), dtype=np.uint8)[:, :, 2:18].reshape(n, nb, 4, 4)
    elif case == "quads":
        rows = rng.integers(-128, 128, (n, nb, 8, 4), dtype=np.int8)
    elif case == "pairs":
        rows = rng.integers(-128, 128, (n, nb, 8, 2), dtype=np.int8)
    elif case == "pairs_int32":      # mins decoded as int32: cast element by element
        rows = rng.integers(-128, 128, (n, nb, 8, 2)).astype(np.int32)
    else:
        rows = rng.integers(-128, 128, (n, nb, 16)).astype(np.int32)
    unit = rows.shape[3:]
    dst = np.zeros((3, nb, C, rows.shape[2], L, *unit), np.uint8 if rows.dtype == np.uint8 else np.int8)
    interleave_into(dst, 1, rows)
    want = np.zeros_like(dst)
    axes = (0, 3, 1, 4, 2, 5) if unit else (0, 3, 1, 4, 2)
    want[1:3] = rows.reshape(2, C, L, nb, rows.shape[2], *unit).transpose(axes)
    assert np.array_equal(dst, want) and not dst[0].any()
