"""What tests/test_qtypes_iq1.py, _iq4xs, _ternary and _mxfp4 share: tests/golden/iquants/iquants_small.npz
(llama.cpp's bytes, dequantized values and generic dots for IQ1_S, IQ1_M, IQ4_XS, TQ1_0, TQ2_0 and
MXFP4; see its README), read once; the checks every one of these types gets; and numpy oracles
of GGML's generic dots (ggml-cpu/quants.c ``ggml_vec_dot_*_generic``: integer parts in int64,
the float32 steps one by one in GGML's order), written apart from ggtool's compiled kernels."""

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
F32 = np.float32


@cache
def golden() -> dict:
    z = np.load(HERE / "golden" / "iquants" / "iquants_small.npz")
    return {k: z[k] for k in z.files}


def paths(t: str) -> list[str]:
    """The golden paths of a type: "ref" (no quant_weights) where GGML takes none, "w0"/"w1" (the
    two importance matrices) where the importance changes the bytes."""
    g = golden()
    return (["ref"] if t in g else []) + (["w0", "w1"] if f"{t}_w" in g else [])


def sha256(a: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()


def vec_dot_key(t: str) -> str:
    return "q8_K" if qtypes.get(t).vec_dot_type.name == "Q8_K" else "q8_0"


def check_bytes(t: str, path: str) -> None:
    """The golden rows' bytes equal llama.cpp's; the rows llama.cpp aborts on are refused, named."""
    g = golden()
    rec = qtypes.get(t)
    x, cats = g["x"], g["category"]
    if path == "ref":
        want, aborts, qw = g[t], g[f"{t}_aborts"], None
    else:
        k = int(path[1])
        want, aborts, qw = g[f"{t}_w"][k], g[f"{t}_w_aborts"][k], g["imatrix"][k]
    got = rec.quantize(x[~aborts], qw)
    bad = np.flatnonzero((got != want[~aborts]).any(axis=1))
    assert not bad.size, f"{t} {path}: rows differ from llama.cpp's: {[str(c) for c in cats[~aborts][bad[:8]]]}"
    for i in np.flatnonzero(aborts):
        with pytest.raises(QuantizationError, match=rf"tensor 'w': cannot quantize row 1, values 0\.\.255 to {t}: "
                                                    "GGML's quantizer aborts"):
            rec.quantize(np.stack([x[0], x[i]]), qw, name="w")


def check_dequantize(t: str) -> None:
    """GGML's dequantize_row_* (golden digests of its float32 bits) of its own bytes and of random
    blocks, and gguf-py's dequantizer, bit for bit (NaN and inf where an fp16 scale overflowed)."""
    import gguf

    g = golden()
    rec = qtypes.get(t)
    main = g[t] if t in g else g[f"{t}_w"][0]
    got = rec.dequantize(main)
    assert sha256(got) == str(g[f"{t}_dequantized_sha256"])
    rb = g[f"{t}_random_blocks"]
    assert sha256(rec.dequantize(rb)) == str(g[f"{t}_random_dequantized_sha256"])
    gtype = gguf.GGMLQuantizationType[t.upper()]
    for b in (main, rb):
        with np.errstate(all="ignore"):
            want = np.asarray(gguf.quants.dequantize(b, gtype), np.float32)
        assert np.array_equal(rec.dequantize(b).view(np.uint32), want.reshape(b.shape[0], -1).view(np.uint32))
    assert rec.dequantize(rb[:6].reshape(2, 3, -1)).shape == (2, 3, rb.shape[1] // rec.type_size * rec.block_size)
    with pytest.raises(QuantizationError, match=f"not a multiple of the {rec.type_size}-byte block"):
        rec.dequantize(rb[0, :-1])


def check_dot(t: str, oracle) -> None:
    """The compiled dot equals llama.cpp's generic dot (golden: rows of 1 and of 16 blocks, and
    random blocks) and `oracle`, bit for bit; mul_mat gives the same numbers."""
    g = golden()
    rec = qtypes.get(t)
    vk = vec_dot_key(t)
    main = g[t] if t in g else g[f"{t}_w"][0]
    act = g[vk]
    nb = main.shape[1] // rec.type_size                       # blocks a row of 256
    wide = main[:len(main) // 16 * 16].reshape(-1, 16 * main.shape[1])
    awide = act[:len(wide) * 16].reshape(len(wide), -1)
    cases = [(main, act, g[f"{t}_dot"]), (wide, awide, g[f"{t}_dot_wide"]),
             (g[f"{t}_random_blocks"], g[f"random_{vk}"], g[f"{t}_random_dot"])]
    for w, a, want in cases:
        got = np.array([rec.dot(w[i], a[i]) for i in range(len(w))], F32)
        with np.errstate(all="ignore"):       # golden rows with fp16 scales of inf: inf and NaN, as in GGML
            ref = np.array([oracle(w[i], a[i]) for i in range(len(w))], F32)
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), (t, np.flatnonzero(got != want)[:5])
        assert np.array_equal(ref.view(np.uint32), want.view(np.uint32)), (t, np.flatnonzero(ref != want)[:5])
        m = rec.mul_mat(w[:6], a[:5])
        assert m.shape == (5, 6)
        assert np.array_equal(np.diagonal(m[:, :5]).view(np.uint32), want[:5].view(np.uint32))
        assert np.float32(m[3, 1]).view(np.uint32) == np.float32(rec.dot(w[1], a[3])).view(np.uint32)
    assert nb >= 1


def check_weights_ignored(t: str) -> None:
    """A type whose GGML quantizer ignores quant_weights writes the same bytes with and without,
    and its reference row (quantize_row_*_ref) is that path."""
    g = golden()
    rec = qtypes.get(t)
    x = g["x"][:40]
    plain = rec.quantize(x)
    assert np.array_equal(rec.quantize(x, g["imatrix"][0]), plain)
    assert np.array_equal(rec.quantize_ref(x), plain)


# -- activations ------------------------------------------------------------------------------------------
def q8_0(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(d float32 (nb,), qs int64 (nb, 32)) of a row of Q8_0 blocks."""
    b = a.reshape(-1, 34)
    return np.ascontiguousarray(b[:, :2]).view(np.float16)[:, 0].astype(F32), b[:, 2:].view(np.int8).astype(np.int64)


def f16(b: np.ndarray) -> F32:
    return F32(np.ascontiguousarray(b).view(np.float16)[0])
