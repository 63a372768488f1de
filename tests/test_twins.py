"""The numpy twins (ggtool.kernels.twins) give the compiled kernels' bits: activation quantizers and
every quantized dot, on both sides of the block and row-group edges."""

from __future__ import annotations

import numpy as np
import pytest

from ggtool import qtypes
from ggtool import quant as Q
from ggtool import types as T
from ggtool.kernels import quantize, twins

TYPES = ("Q4_0", "Q8_0", "Q5_0", "Q4_1", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")


def _scaled(rng, n, k):
    x = (rng.standard_normal((n, k)) * rng.choice([1e-8, 1e-3, 1.0, 100.0], (n, 1))).astype(np.float32)
    x[0] = 0
    return x


@pytest.mark.parametrize("n", [1, 7, 300])
def test_q8_0_and_q8_1_cpu_twins_give_the_kernels_bytes(n):
    x = _scaled(np.random.default_rng(n), n, 32)
    for kernel, twin, nbytes in ((quantize.q8_0_quantize_cpu, twins.q8_0_quantize_cpu, 34),
                                 (quantize.q8_1_quantize_cpu, twins.q8_1_quantize_cpu, 36)):
        a, b = np.zeros((n, nbytes), np.uint8), np.zeros((n, nbytes), np.uint8)
        assert kernel(x, a) == twin(x, b) == -1
        assert np.array_equal(a, b)
    x[-1, 3] = np.inf
    assert twins.q8_0_quantize_cpu(x, a[:, :34]) == quantize.q8_0_quantize_cpu(x, np.zeros((n, 34), np.uint8))


@pytest.mark.parametrize("n", [1, 7, 300])
def test_q8_k_twin_gives_the_kernels_bytes(n):
    x = _scaled(np.random.default_rng(n), n, 256)
    if n > 1:                                     # a tie of magnitudes: the first one gives the sign
        x[1, 5] = -np.abs(x[1]).max()
        x[1, 9] = -x[1, 5]
    a, b = np.zeros((n, 292), np.uint8), np.zeros((n, 292), np.uint8)
    assert quantize.quantize_q8_k(x, a) == twins.quantize_q8_k(x, b) == -1
    assert np.array_equal(a, b)
    x[-1, 3] = np.nan
    assert twins.quantize_q8_k(x, b) == quantize.quantize_q8_k(x, a) == (n - 1) * 256 + 3


def _weights(name, wf):
    if name == "Q4_0":
        return Q.quantize_q4_0(wf)
    if name == "Q8_0":
        return Q.quantize_q8_0(wf)
    return Q.quantize(wf, name)


@pytest.mark.parametrize("name", TYPES)
def test_dot_twin_gives_the_kernels_bits(name):
    t = T.parse_type(name)
    vdt = T.vec_dot_type(t)
    rng = np.random.default_rng(len(name))
    act_of = {T.GGMLType.Q8_K: Q.quantize_q8_k, T.GGMLType.Q8_1: Q.quantize_q8_1_cpu}.get(vdt, Q.quantize_q8_0_cpu)
    for n, m in ((1, 1), (130, 5), (300, 9)):          # a partial row group, several activation tiles
        wf = rng.standard_normal((n, 512)).astype(np.float32)
        wf[0] = np.abs(wf[0])                          # Q4_0: a negative scale in every block
        w = _weights(name, wf)
        x = rng.standard_normal((m, 512)).astype(np.float32)
        x[0] = 0                                       # so sums of -0.0 terms: the result is +0.0
        act = act_of(x)
        a, b = np.empty((m, n), np.float32), np.empty((m, n), np.float32)
        record = qtypes.get(t)
        record.mul_mat_packed_into(record.pack(w), act, a)
        record.mul_mat_twin(w, act, b)
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32)), (name, n, m)


def test_dot_twin_decodes_weights_a_slice_of_rows_at_a_time():
    rng = np.random.default_rng(5)
    w = Q.quantize_q8_0(rng.standard_normal((2 * twins.ROWS + 3, 64)).astype(np.float32))
    act = Q.quantize_q8_0_cpu(rng.standard_normal((2, 64)).astype(np.float32))
    a, b = np.empty((2, w.shape[0]), np.float32), np.empty((2, w.shape[0]), np.float32)
    record = qtypes.get(T.Q8_0)
    record.mul_mat_packed_into(record.pack(w), act, a)
    record.mul_mat_twin(w, act, b)
    assert np.array_equal(a.view(np.uint32), b.view(np.uint32))


@pytest.mark.parametrize("n", [1, 7, 300])
def test_q4_0_q8_0_and_fp16_twins_give_the_kernels_bytes(n):
    x = _scaled(np.random.default_rng(n + 1), n, 32)
    x[-1, :2] = [-3.0, 3.0]                      # a tie of magnitudes: the first one gives the sign
    for kernel, twin, nbytes in ((quantize.q4_0_quantize, twins.q4_0_quantize, 18),
                                 (quantize.q8_0_quantize, twins.q8_0_quantize, 34)):
        a, b = np.zeros((n, nbytes), np.uint8), np.zeros((n, nbytes), np.uint8)
        assert kernel(x, a) == twin(x, b) == -1
        assert np.array_equal(a, b)
        bad = x.copy()
        bad[-1, 7] = -np.inf
        assert twin(bad, b) == kernel(bad, a) == (n - 1) * 32 + 7
    f = np.concatenate([x.reshape(-1), np.float32([np.nan, -np.nan, 7e4, -1e-7, 6e-8])])
    a, b = np.zeros(f.size, np.uint16), np.zeros(f.size, np.uint16)
    quantize.fp32_to_fp16(f, a)
    twins.fp32_to_fp16(f, b)
    assert np.array_equal(a, b)
