"""TQ1_0 and TQ2_0 (ggtool.qtypes.ternary): llama.cpp's bytes on golden blocks (quant_weights
ignored, as GGML ignores them), GGML's dequantizer (and gguf-py's) and generic dot, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

import iquants_small_golden as G

TQ = ("tq1_0", "tq2_0")
F32 = np.float32


@pytest.mark.parametrize("t", TQ)
def test_bytes_are_llama_cpp(t):
    G.check_bytes(t, "ref")


@pytest.mark.parametrize("t", TQ)
def test_importance_is_ignored(t):
    G.check_weights_ignored(t)


def test_subnormal_scale_writes_zero_trits():
    """A block whose amax is an fp32 subnormal: 1/d is inf, lroundf(inf or NaN) is x86's
    0x8000000000000000, so every trit is 1 (the value 0), as llama.cpp writes it (golden rows)."""
    g = G.golden()
    i = list(g["category"]).index("tiny_1e-40")
    from ggtool import qtypes
    y = qtypes.get("tq2_0").quantize(g["x"][i:i + 1])
    assert np.array_equal(y, g["tq2_0"][i:i + 1]) and (y[0, :64] == 0x55).all()


@pytest.mark.parametrize("t", TQ)
def test_dequantize_is_ggml_and_gguf_py(t):
    G.check_dequantize(t)


def _tq1_trits(byte: int, n: int) -> int:
    return ((((byte * 3 ** n) & 0xFF) * 3) >> 8) - 1


def oracle_tq1_0(w, a):
    dy, q8, _ = G.q8_k(a)
    sumf = F32(0)
    for i, b in enumerate(w.reshape(-1, 54)):
        s = 0
        for l in range(5):
            for m in range(32):
                s += _tq1_trits(int(b[m]), l) * int(q8[i, l * 32 + m])
            for m in range(16):
                s += _tq1_trits(int(b[32 + m]), l) * int(q8[i, 160 + l * 16 + m])
        for l in range(4):
            for j in range(4):
                s += _tq1_trits(int(b[48 + j]), l) * int(q8[i, 240 + l * 4 + j])
        sumf = F32(sumf + F32(F32(s) * F32(G.f16(b[52:54]) * dy[i])))
    return sumf


def oracle_tq2_0(w, a):
    dy, q8, _ = G.q8_k(a)
    sumf = F32(0)
    for i, b in enumerate(w.reshape(-1, 66)):
        s = 0
        for j in range(0, 64, 32):
            for l in range(4):
                t = ((b[j:j + 32].astype(np.int64) >> (2 * l)) & 3) - 1
                s += int((q8[i, 4 * j + 32 * l:4 * j + 32 * l + 32] * t).sum())
        sumf = F32(sumf + F32(F32(s) * F32(dy[i] * G.f16(b[64:66]))))
    return sumf


@pytest.mark.parametrize("t,oracle", [("tq1_0", oracle_tq1_0), ("tq2_0", oracle_tq2_0)])
def test_dot_is_ggml_generic(t, oracle):
    G.check_dot(t, oracle)


@pytest.mark.parametrize("t", TQ)
def test_bad_input_is_refused(t):
    G.check_errors(t)


@pytest.mark.parametrize("t", TQ)
def test_threads_do_not_change_bytes(t):
    G.check_threads(t)


def test_fp16_rounding_is_ggmls():
    """The kernels' GGML_FP32_TO_FP16 (the float trick of ggml_compute_fp32_to_fp16) rounds to
    nearest even, overflows to inf, keeps fp16 subnormals and writes NaN as 0x7e00 with its sign:
    numpy's conversion but for NaN's payload (44M bit patterns agreed at the time of writing)."""
    from ggtool.qtypes._kernel_base import fp16_bits

    rng = np.random.default_rng(5)
    bits = np.concatenate([rng.integers(0, 1 << 32, 20000, dtype=np.uint64),
                           np.array([0, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00001, 0x477FF000,
                                     0x477FEFFF, 0x477FE000, 0x38800000, 0x33800000, 0x33000000, 0x33000001, 0x387FC000],
                                    np.uint64)]).astype(np.uint32)
    x = bits.view(F32)
    got = np.array([fp16_bits(v) for v in x], np.int64)
    with np.errstate(all="ignore"):
        want = x.astype(np.float16).view(np.uint16).astype(np.int64)
    nan = np.isnan(x)
    want[nan] = 0x7E00 | ((bits[nan].astype(np.int64) >> 16) & 0x8000)
    assert np.array_equal(got, want)
