"""Importance matrices read as llama-quantize reads them (ggtool.imatrix), from llama-imatrix's own
files (golden/imatrix, README there): the values, the metadata llama-quantize records, and
llama-quantize's bytes when ggtool quantizes with them."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from ggtool import quant as Q
from ggtool.errors import ImatrixError, InputError
from ggtool.imatrix import Imatrix, read_imatrix

HERE = Path(__file__).parent
GOLD = HERE / "golden" / "imatrix"
GGUF = GOLD / "stories260K-imatrix.gguf"
DAT = GOLD / "stories260K-imatrix.dat"


def test_both_formats_read_the_same_values():
    a, b = read_imatrix(GGUF), read_imatrix(DAT)
    assert (a.legacy, b.legacy) == (False, True)
    assert sorted(a.values) == sorted(b.values) and len(a.values) == 35
    assert all(np.array_equal(a.values[k], b.values[k]) and a.values[k].dtype == np.float32 for k in a.values)
    assert a.values["blk.0.attn_q.weight"].shape == (64,)
    assert (a.datasets, a.chunk_count, a.chunk_size) == (("readme-6k.txt",), 4, 128)
    assert (b.datasets, b.chunk_count) == (("readme-6k.txt",), 4)


def test_metadata_llama_quantize_records():
    im = read_imatrix(str(GGUF))
    assert im.metadata() == {"quantize.imatrix.file": str(GGUF), "quantize.imatrix.dataset": "readme-6k.txt",
                             "quantize.imatrix.entries_count": 35, "quantize.imatrix.chunks_count": 4}
    long = Imatrix("d/" + "x" * 200, {}, ("é" * 100,), 0)
    meta = long.metadata(entries_count=3)
    assert meta["quantize.imatrix.file"] == ("d/" + "x" * 200)[:127]
    assert meta["quantize.imatrix.dataset"] == "é" * 63             # 127 bytes: the 64th é is cut in two
    assert meta["quantize.imatrix.entries_count"] == 3 and "quantize.imatrix.chunks_count" not in meta


@pytest.mark.parametrize("t", ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "IQ4_NL"))
def test_quantized_bytes_are_llama_quantizes(t):
    """llama-quantize --pure --imatrix: ggtool's bytes from the same importances, and without one."""
    from gguf import GGUFReader

    src = {x.name: np.asarray(x.data, np.float32) for x in GGUFReader(HERE.parent / "fixtures" / "stories260K.gguf").tensors}
    gold = np.load(GOLD / "llama-quantize.npz")
    for path in (GGUF, DAT, None):
        im = read_imatrix(path) if path else None
        for key in [k for k in gold.files if k.startswith(f"{t}/{'gguf' if path else 'none'}/")]:
            name = key.split("/", 2)[2]
            w = im.weights_for(name, src[name].shape[::-1]) if im else None
            assert np.array_equal(Q.quantize(src[name], t, imatrix=w), gold[key]), (key, path)


def test_weights_for_shapes_and_sizes():
    im = Imatrix("f.gguf", {"a.weight": np.arange(8, dtype=np.float32), "moe.weight": np.ones(12, np.float32)})
    assert im.weights_for("missing", (4, 4)) is None
    assert im.weights_for("a.weight", (8, 3)).shape == (8,)
    assert im.weights_for("moe.weight", (4, 5, 3)).shape == (3, 4)
    with pytest.raises(ImatrixError, match=r"f.gguf: imatrix size 8 is different from tensor size 16 for a.weight") as e:
        im.weights_for("a.weight", (16, 2))
    assert (e.value.file, e.value.tensor, e.value.kind) == ("f.gguf", "a.weight", "size")


def test_weights_for_a_tensors_four_dims_fit_its_data():
    """A Tensor's ne always has four entries (a matrix's ne[2] is 1): its importances are one row
    that quantize takes for the matrix's data, and the same for a weight of one expert."""
    x = np.random.default_rng(3).standard_normal((3, 64)).astype(np.float32)
    im = Imatrix("f.gguf", {"w": np.linspace(0.5, 2, 64, dtype=np.float32)})
    w = im.weights_for("w", (64, 3, 1, 1))
    assert w.shape == (64,)
    assert np.array_equal(Q.quantize(x, "q4_1", imatrix=w), Q.quantize(x, "q4_1", imatrix=im.values["w"]))
    assert np.array_equal(Q.quantize(x[None], "q4_1", imatrix=im.weights_for("w", (64, 3, 1))),
                          Q.quantize(x, "q4_1", imatrix=w)[None])


def test_no_experts_quantize_to_no_bytes():
    for t, row_bytes in (("q5_0", 8 * 22), ("q4_0", 8 * 18), ("q4_K", 144)):     # rows of 256
        got = Q.quantize(np.zeros((0, 3, 256), np.float32), t, imatrix=np.zeros((0, 256), np.float32))
        assert got.shape == (0, 3, row_bytes) and got.dtype == np.uint8


def test_moe_experts_take_their_own_importances():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((3, 4, 64)).astype(np.float32)
    w = rng.uniform(0.1, 5, (3, 64)).astype(np.float32)
    got = Q.quantize(x, "q5_0", imatrix=w)
    assert np.array_equal(got, np.stack([Q.quantize(x[e], "q5_0", imatrix=w[e]) for e in range(3)]))


def _dat(entries, tail=b""):
    b = struct.pack("<i", len(entries))
    for name, ncall, vals in entries:
        n = name.encode()
        b += struct.pack("<i", len(n)) + n + struct.pack("<ii", ncall, len(vals)) + np.asarray(vals, "<f4").tobytes()
    return b + tail


def test_legacy_values_are_sums_over_ncall(tmp_path):
    p = tmp_path / "m.dat"
    p.write_bytes(_dat([("b", 4, [2.0, 6.0]), ("a", 0, [3.0])], struct.pack("<ii", 7, 2) + b"ds"))
    im = read_imatrix(p)
    assert list(im.values) == ["a", "b"] and im.values["b"].tolist() == [0.5, 1.5] and im.values["a"].tolist() == [3.0]
    assert (im.datasets, im.chunk_count, im.legacy) == (("ds",), 7, True)
    p.write_bytes(_dat([("b", 4, [2.0])]))                         # no trailing chunk count and dataset
    assert (read_imatrix(p).datasets, read_imatrix(p).chunk_count) == ((), 0)


@pytest.mark.parametrize("data, kind, fragment", [
    (b"", "format", "no data"),
    (struct.pack("<i", 0), "format", "no data"),
    (_dat([("w.weight", 1, [1.0, 2.0])])[:-3], "truncated", "2 values of entry 'w.weight'"),
    (_dat([("w.weight", 1, [1.0])])[:10], "truncated", "name of entry 1"),
    (_dat([("w.weight", 1, [1.0, float("nan")])]), "values", "entry 'w.weight' holds nan at index 1"),
    (_dat([("w.weight", 1, [])]), "format", "entry 'w.weight' has 0 values"),
])
def test_legacy_defects_name_file_and_entry(tmp_path, data, kind, fragment):
    p = tmp_path / "bad.dat"
    p.write_bytes(data)
    with pytest.raises(ImatrixError, match=fragment) as e:
        read_imatrix(p)
    assert e.value.kind == kind and e.value.file == str(p) and str(e.value).startswith(f"{p}: ")
    assert isinstance(e.value, InputError)


def _gguf(path, tensors, meta=True, counts_type=np.float32):
    import gguf

    w = gguf.GGUFWriter(str(path), "llama")
    if meta:
        w.add_array("imatrix.datasets", ["d"])
        w.add_uint32("imatrix.chunk_count", 2)
        w.add_uint32("imatrix.chunk_size", 64)
    for name, arr in tensors.items():
        w.add_tensor(name, np.asarray(arr, counts_type if name.endswith(".counts") else np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_gguf_counts_per_expert(tmp_path):
    """sums / lround(count) per expert; 1 for an expert that saw no token."""
    p = tmp_path / "moe.gguf"
    _gguf(p, {"e.weight.in_sum2": [2.0, 4.0, 9.0, 9.0, 3.0, 6.0], "e.weight.counts": [1.6, 0.2, 2.5]})
    v = read_imatrix(p).values["e.weight"]
    assert v.tolist() == [1.0, 2.0, 1.0, 1.0, 1.0, 2.0]


def test_gguf_counts_lround_cannot_hold_mean_no_tokens(tmp_path):
    """A count lround cannot make a long of (NaN, inf, 1e30: x86's conversion gives LONG_MIN, not
    above 0) leaves its expert's importances 1, without numpy's cast warning."""
    p = tmp_path / "lies.gguf"
    _gguf(p, {"e.weight.in_sum2": [4.0] * 5, "e.weight.counts": [1e30, -1e30, np.nan, np.inf, 2.0]})
    assert read_imatrix(p).values["e.weight"].tolist() == [1.0, 1.0, 1.0, 1.0, 2.0]


@pytest.mark.parametrize("tensors, meta, kind, fragment", [
    ({"a.in_sum2": [1.0], "a.counts": [1.0]}, False, "metadata", "missing imatrix metadata"),
    ({"a.in_sum2": [1.0]}, True, "format", "mismatched sums and counts for a"),
    ({"a.in_sum2": [np.inf], "a.counts": [1.0]}, True, "values", "entry 'a' holds inf"),
])
def test_gguf_defects(tmp_path, tensors, meta, kind, fragment):
    p = tmp_path / "bad.gguf"
    _gguf(p, tensors, meta)
    with pytest.raises(ImatrixError, match=fragment) as e:
        read_imatrix(p)
    assert e.value.kind == kind and e.value.file == str(p)


def test_truncated_gguf_is_an_imatrix_error(tmp_path):
    p = tmp_path / "cut.gguf"
    p.write_bytes(GGUF.read_bytes()[:3000])
    with pytest.raises(ImatrixError) as e:
        read_imatrix(p)
    assert e.value.file == str(p) and e.value.kind == "format"
