"""Every ggtool.qtypes record's type computes: mul_mat with its weights is the record's dot (GGML's
generic vec_dot, bit for bit) for 1..3 participants, close to the float64 product of the dequantized
operands; get_rows is its dequantizer; a GGUF tensor of the type is used in place (memory-mapped) by
`ggtool compute`, and under `--numerics llama.cpp` it computes in GGML's order with the warning that
says so (its x86 forms are not modelled yet)."""

from __future__ import annotations

import numpy as np
import pytest

import ggtool
from ggtool import qtypes, quant
from ggtool import types as T
from kernel_threads import compute_threaded

TYPES = sorted(qtypes.REGISTRY, key=int)
NAMES = [T.type_name(t) for t in TYPES]


def _weights(t, n: int, k: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((n, k)) * rng.uniform(0.05, 2, (n, 1))).astype(np.float32)
    qw = rng.uniform(0.2, 3, k).astype(np.float32)      # every type takes an importance matrix
    return qtypes.REGISTRY[t].quantize(x, qw)


def _acts(vdt, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """x in the vec_dot_type as mul_mat converts it (the CPU's from_float), and those values as float64."""
    if vdt == T.GGMLType.Q8_K:
        a = quant.quantize_q8_k(x)
        b = a.reshape(-1, 292)
        d = np.ascontiguousarray(b[:, :4]).view(np.float32).astype(np.float64)
        vals = d * b[:, 4:260].view(np.int8)
    elif vdt == T.GGMLType.Q8_1:           # d, s (fp16), qs[32]
        a = quant.quantize_q8_1_cpu(x)
        b = a.reshape(-1, 36)
        d = np.ascontiguousarray(b[:, :2]).view(np.float16).astype(np.float64)
        vals = d * b[:, 4:].view(np.int8)
    else:
        a = quant.quantize_q8_0_cpu(x)
        b = a.reshape(-1, 34)
        d = np.ascontiguousarray(b[:, :2]).view(np.float16).astype(np.float64)
        vals = d * b[:, 2:].view(np.int8)
    return a, vals.reshape(x.shape)


@pytest.mark.parametrize("t", TYPES, ids=NAMES)
def test_mul_mat_node_is_the_records_dot_for_1_to_3_participants(t):
    rec = qtypes.REGISTRY[t]
    n, k, m = 300, 512, 3
    w = _weights(t, n, k, int(t))
    x = np.random.default_rng(5).standard_normal((m, k)).astype(np.float32)
    ctx = ggtool.Context()
    wt = ctx.new_tensor(rec.name, [k, n]).set_data(w)
    b = ctx.new_tensor("f32", [k, m]).set_data(x)
    y = ggtool.ops.FUNCTIONS["mul_mat"](ctx, wt, b)
    g = ggtool.Graph(ctx)
    g.expand(y)
    assert ggtool.make_plan(g, 2).work_size >= T.row_size(rec.vec_dot_type, k * m)   # b as vec_dot_type
    ggtool.graph_compute(g, 1)
    one = y.data.reshape(m, n).copy()
    acts, act_values = _acts(rec.vec_dot_type, x)
    want = np.array([[rec.dot(w[r], acts[i]) for r in range(n)] for i in range(m)], np.float32)
    assert one.tobytes() == want.tobytes()
    ref = act_values @ rec.dequantize(w).astype(np.float64).T
    # Q8_1's s (d * the block's sum, kept as fp16) meets Q4_1/Q5_1's min: GGML's dot is that close only
    tol = 1e-3 if rec.vec_dot_type == T.GGMLType.Q8_1 else 1e-5
    assert np.abs(one - ref).max() <= tol * np.abs(ref).max()
    for nth in (2, 3):
        y.data[...] = 0
        compute_threaded(g, nth, force=True)
        assert y.data.reshape(m, n).tobytes() == one.tobytes(), f"{nth} participants differ from 1"


@pytest.mark.parametrize("t", TYPES, ids=NAMES)
def test_get_rows_is_the_records_dequantizer(t):
    rec = qtypes.REGISTRY[t]
    w = _weights(t, 6, 512, 2)
    ctx = ggtool.Context()
    a = ctx.new_tensor(rec.name, [512, 6]).set_data(w)
    idx = ctx.new_tensor("i32", [3]).set_data(np.array([5, 0, 5], np.int32))
    y = ggtool.ops.FUNCTIONS["get_rows"](ctx, a, idx)
    g = ggtool.Graph(ctx)
    g.expand(y)
    ggtool.graph_compute(g, 2)
    assert y.type == T.F32 and y.data.reshape(3, 512).tobytes() == rec.dequantize(w[[5, 0, 5]]).tobytes()


@pytest.fixture(scope="module")
def iq_gguf(tmp_path_factory):
    """A GGUF file with one 64 x 512 weight per record type (w_<type>) and the activations."""
    import gguf

    path = tmp_path_factory.mktemp("iq") / "types.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    weights = {}
    for t in TYPES:
        q = _weights(t, 64, 512, 7)
        weights[T.type_name(t)] = q
        w.add_tensor(f"w_{T.type_name(t)}", q, raw_shape=q.shape, raw_dtype=gguf.GGMLQuantizationType(int(t)))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path, weights


def test_compute_uses_gguf_tensors_of_every_record_type_in_place(run, iq_gguf, tmp_path):
    """`ggtool compute` maps each type's tensor (no conversion prefix needed) and multiplies it as the
    library does; the help names the types it takes."""
    path, weights = iq_gguf
    x = np.random.default_rng(1).standard_normal((2, 512)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    for name in ("iq2_xxs", "iq4_nl", "mxfp4", "tq2_0"):
        out = tmp_path / f"{name}.npy"
        r = run("compute", f"mul_mat(w_{name}, x)", "--gguf", path, "--tensor", f"x={tmp_path / 'x.npy'}",
                "--threads", "2", "-o", out)
        assert r.exit_code == 0, r.output
        rec = qtypes.get(name)
        acts, _ = _acts(rec.vec_dot_type, x)
        assert np.load(out).tobytes() == rec.mul_mat(weights[name], acts).tobytes()
    r = run("compute", "--help")
    assert "iq1_s iq1_m iq2_xxs" in " ".join(r.output.split())


def test_llama_cpp_numerics_take_the_records_x86_forms_without_a_warning(run, iq_gguf, tmp_path):
    """Every record type carries llama.cpp's x86 order (tests/test_qtypes_x86.py checks its bits): under
    --numerics llama.cpp-avx2 mul_mat is that form, and compute warns of no gap."""
    path, weights = iq_gguf
    x = np.random.default_rng(2).standard_normal((3, 512)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    out = tmp_path / "y.npy"
    r = run("compute", "mul_mat(w_iq3_s, x)", "--gguf", path, "--tensor", f"x={tmp_path / 'x.npy'}",
            "--numerics", "llama.cpp-avx2", "-o", out)
    assert r.exit_code == 0, r.output
    assert "GGML's order" not in r.output
    rec = qtypes.get("iq3_s")
    acts, _ = _acts(rec.vec_dot_type, x)
    assert np.load(out).tobytes() == rec.mul_mat_x86("llama.cpp-avx2", weights["iq3_s"], acts, "vec_dot").tobytes()


@pytest.mark.parametrize("name", ["iq1_s", "iq1_m"])
def test_iq1s_k_form_is_their_generic_dot_over_wide_scales(name):
    """IQ1's K form (codes 8 grid + delta, times 1/8 at the end) against the generic dot's
    (d_w d_a)(sumi + sumi1 / 8) a block: the same bits for weights and activations over 12 decades."""
    from ggtool.quant import matmul as qm

    rec = qtypes.get(name)
    rng = np.random.default_rng(13)
    x = (rng.standard_normal((160, 512)) * 10.0 ** rng.uniform(-6, 6, (160, 1))).astype(np.float32)
    w = rec.quantize(x, rng.uniform(0.5, 2, 512).astype(np.float32))
    act = quant.quantize_q8_k((rng.standard_normal((6, 512)) * 10.0 ** rng.uniform(-6, 6, (6, 1))).astype(np.float32))
    out = np.empty((6, 160), np.float32)
    qm.mul_mat_into(rec.ggml_type, w, act, out)
    assert out.tobytes() == rec.mul_mat(w, act).tobytes()


CLASSIC = [t for t in TYPES if t in qtypes.DOT_TYPES]     # Q4_0 .. Q8_0, Q2_K .. Q6_K: qtypes.legacy, .kquant


@pytest.mark.parametrize("t", CLASSIC, ids=[T.type_name(t) for t in CLASSIC])
def test_the_classic_records_dequantize_as_gguf_py_and_quantize_as_quant(t):
    """Their dequantizers (numpy twins, compiled kernels or gguf-py's) give gguf-py's float32 bits, and
    the record's quantize is quant.quantize's bytes with and without importances."""
    import gguf.quants as gq

    rec = qtypes.REGISTRY[t]
    rng = np.random.default_rng(int(t))
    x = (rng.standard_normal((8, 512)) * rng.uniform(0.01, 3, (8, 1))).astype(np.float32)
    qw = rng.uniform(0.2, 3, 512).astype(np.float32)
    w = rec.quantize(x, qw)
    assert w.tobytes() == quant.quantize(x, rec.name, imatrix=qw).tobytes()
    assert rec.quantize(x).tobytes() == quant.quantize(x, rec.name).tobytes() == rec.quantize_ref(x).tobytes()
    got = rec.dequantize(w)
    want = np.asarray(gq.dequantize(w.reshape(-1, rec.type_size), t), np.float32).reshape(got.shape)
    assert got.view(np.uint32).tobytes() == want.view(np.uint32).tobytes()
