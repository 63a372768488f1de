"""What tests/test_qtypes_iq2.py and test_qtypes_iq3.py share: tests/golden/iquants/iquants.npz
(llama.cpp's bytes, dequantized values and dots; see its README), read once, and the checks every
IQ type gets against it."""

from __future__ import annotations

import hashlib
from functools import cache
from pathlib import Path

import numpy as np
import pytest

from ggtool import qtypes
from ggtool.errors import QuantizationError
from qtypes_checks import check_errors, check_threads, q8_k  # noqa: F401 (the checks every record gets)

HERE = Path(__file__).resolve().parent
QK_K = 256


@cache
def golden() -> dict:
    z = np.load(HERE / "golden" / "iquants" / "iquants.npz")
    k = np.load(HERE / "golden" / "kquants" / "kquants.npz")
    g = {name: z[name] for name in z.files}
    g["x"] = np.concatenate([k["x"], z["x_new"]]).astype(np.float32)
    return g


def paths(t: str) -> list[str]:
    """The golden paths of a type: each importance matrix, and none where GGML allows none."""
    return ["w0", "w1"] + ([] if qtypes.get(t).ggml_requires_imatrix else ["ref"])


def digest(*arrays) -> str:
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def check_bytes(t: str, path: str) -> None:
    """The golden rows' bytes equal GGML's; each row GGML aborts on is refused, naming the row."""
    g = golden()
    rec = qtypes.get(t)
    x, want, aborts = g["x"], g[f"{t}_{path}"], g[f"{t}_{path}_aborts"]
    qw = None if path == "ref" else g["imatrix"][int(path[1])]
    assert aborts.sum() < len(x) // 10
    got = rec.quantize(x[~aborts], qw)
    assert got.shape == want[~aborts].shape
    bad = np.flatnonzero((got != want[~aborts]).any(axis=1))
    cats = g["category"][~aborts]
    assert not bad.size, f"{t} {path}: rows differ from GGML's: {[str(cats[i]) for i in bad[:8]]}"
    for i in np.flatnonzero(aborts):
        with pytest.raises(QuantizationError, match=rf"row 0, values 0\.\.255 to {t}: GGML's quantizer aborts"):
            rec.quantize(x[i:i + 1], qw, name="w")
        two = np.stack([x[0], x[i]])          # the row is named in a bigger tensor
        with pytest.raises(QuantizationError, match=r"tensor 'w': cannot quantize row 1, values 0\.\.255"):
            rec.quantize(two, qw, name="w")


def check_tables(t: str) -> None:
    """iq2xs_init_impl / iq3xs_init_impl's grid, map and neighbour lists, as GGML built them."""
    grid, kmap, nb = qtypes.get(t).quantizer_tables()
    assert digest(grid.reshape(-1), kmap, nb) == str(golden()[f"{t}_tables_sha256"])
    for a in (grid, kmap, nb, *qtypes.get(t).grids().values()):   # built once, shared: read-only
        with pytest.raises(ValueError, match="read-only"):
            a[0] = 0


def check_dequantize(t: str) -> None:
    """GGML's dequantize_row_* of its own bytes and of random blocks (digest of the float32 bits)."""
    g = golden()
    rec = qtypes.get(t)
    b = g[f"{t}_w0"][~g[f"{t}_w0_aborts"]]
    rb = g[f"{t}_random_blocks"]
    assert digest(rec.dequantize(b), rec.dequantize(rb)) == str(g[f"{t}_dequant_sha256"])


def check_gguf_py(t: str) -> None:
    """gguf-py's dequantizer gives the same bits (every index, sign and scale pattern)."""
    import gguf

    rng = np.random.default_rng(7)
    rec = qtypes.get(t)
    b = rng.integers(0, 256, (300, rec.type_size)).astype(np.uint8)
    b[:, :2] = (rng.standard_normal(300) * 10.0 ** rng.uniform(-6, 4, 300)).astype(np.float16).view(np.uint8).reshape(300, 2)
    want = np.asarray(gguf.quants.dequantize(b, gguf.GGMLQuantizationType[t.upper()]), np.float32).reshape(300, QK_K)
    assert np.array_equal(rec.dequantize(b).view(np.uint32), want.view(np.uint32))
    # shapes: rows of several blocks keep their leading dimensions
    y = rec.dequantize(b[:12].reshape(3, 4 * rec.type_size))
    assert y.shape == (3, 4 * QK_K) and np.array_equal(y.reshape(12, QK_K).view(np.uint32), want[:12].view(np.uint32))
    with pytest.raises(QuantizationError, match=f"not a multiple of the {rec.type_size}-byte block"):
        rec.dequantize(b[0, :-1])


def check_dot(t: str, oracle) -> None:
    """The compiled dot equals GGML's generic dot (golden) and `oracle` (numpy, GGML's order), bit for bit."""
    g = golden()
    rec = qtypes.get(t)
    rb, a, want = g[f"{t}_random_blocks"], g[f"{t}_q8_k"], g[f"{t}_dot"]
    for i, w in enumerate(want):
        wr, ar = rb[4 * i:4 * i + 4].reshape(-1), a[4 * i:4 * i + 4].reshape(-1)
        got = rec.dot(wr, ar)
        assert np.float32(got).view(np.uint32) == np.float32(w).view(np.uint32), (t, i, got, w)
        assert np.float32(oracle(wr, ar)).view(np.uint32) == np.float32(w).view(np.uint32), (t, i)
    m = rec.mul_mat(rb.reshape(8, -1), a.reshape(8, -1))
    assert m.shape == (8, 8)
    assert np.array_equal(np.diagonal(m).view(np.uint32), want.view(np.uint32))
    # the K form (what the K-quant dots multiply) gives the same sums: integer scale per 16 codes
    codes, scales, d = rec.decode_k(rb.reshape(8, -1))
    assert codes.shape == (8, 4, 256) and scales.shape == (8, 4, 16) and d.shape == (8, 4)
    for i, w in enumerate(want):
        d_a, q8, _ = q8_k(a[4 * i:4 * i + 4].reshape(-1))
        prods = (codes[i].astype(np.int64) * q8).reshape(4, 16, 16).sum(-1)
        bsum = (prods * scales[i]).sum(-1)
        got = generic_sum(d[i], d_a, bsum, float(rec.dot_final))
        assert np.float32(got).view(np.uint32) == np.float32(w).view(np.uint32), (t, i)


def random_q8_k(rng, nblocks: int) -> np.ndarray:
    """Q8_K blocks: float32 d, int8 qs, their bsums (the dot reads d and qs)."""
    out = np.zeros((nblocks, 292), np.uint8)
    qs = rng.integers(-127, 128, (nblocks, QK_K)).astype(np.int8)
    out[:, :4] = (10.0 ** rng.uniform(-4, 1, nblocks)).astype(np.float32).view(np.uint8).reshape(nblocks, 4)
    out[:, 4:260] = qs.view(np.uint8)
    out[:, 260:] = qs.reshape(nblocks, 16, 16).sum(-1).astype("<i2").view(np.uint8).reshape(nblocks, 32)
    return out


def generic_sum(d_w: np.ndarray, d_a: np.ndarray, bsum: np.ndarray, final: float) -> np.float32:
    """GGML's float part: sumf += (d_w * d_a) * (float)bsum block after block, in float32, then final * sumf."""
    sumf = np.float32(0)
    for dw, da, s in zip(d_w.astype(np.float32), d_a, bsum):
        sumf = np.float32(sumf + np.float32(np.float32(dw * da) * np.float32(s)))
    return np.float32(np.float32(final) * sumf)
