"""What `quantize` must refuse, and how: data that ggml_validate_row_data refuses (every type,
IQ4_NL and importance weighting included, copied tensors too), metadata overrides that
set-metadata refuses (the same words), dry runs that say what the real run will refuse, and user
regular expressions that backtrack without end (every surface that takes one). Each case: the one
line it gives, and nothing written."""

from __future__ import annotations

import os
import time

import gguf
import numpy as np
import pytest
from conftest import STORIES, fails, ok, write_gguf

from ggtool import quant as Q
from ggtool import quantize_model as QM
from ggtool import types as T
from ggtool.gguf_io import edit as E
from ggtool.imatrix import Imatrix
from ggtool.quant.validate import F16_FIELDS, InvalidData, validate_row_data, validates
from ggtool.user_regex import RegexError, UserRegex

_G = T.GGMLType
ROOT = STORIES.parent.parent


# ------------------------------------------------------------------------------- the validator

def _f16_bits(v: float) -> int:
    return int(np.array([v], np.float16).view(np.uint16)[0])


@pytest.mark.parametrize("t", sorted(F16_FIELDS, key=int), ids=lambda t: T.type_name(t))
def test_each_f16_field_of_each_block_type_is_checked(t):
    """For every block type GGML validates by its f16 scales: inf and NaN in each field of a later
    block are found there and named; a block of zeros passes. Where gguf-py dequantizes the
    type, its values go non-finite from the field set, so the offsets are the scales'."""
    size = T.type_size(t)
    for off, name in F16_FIELDS[t]:
        for value, problem in ((np.inf, "inf"), (np.nan, "NaN"), (-np.inf, "inf")):
            raw = np.zeros((3, size), np.uint8)
            raw[2, off:off + 2] = np.frombuffer(np.uint16(_f16_bits(value)).tobytes(), np.uint8)
            assert validate_row_data(t, raw) == InvalidData(2, name, problem)
            assert validate_row_data(t, raw[:2]) is None
            if Q.can_dequantize(t) and name == "d":
                raw[2, :] = 0x11                          # every quant nonzero: d multiplies something
                raw[2, off:off + 2] = np.frombuffer(np.uint16(_f16_bits(value)).tobytes(), np.uint8)
                with np.errstate(all="ignore"):
                    assert not np.isfinite(Q.dequantize(raw[2:], t)).all(), (t, off)


def test_element_types_q8_k_mxfp4_iq1_m_and_the_rest():
    f32 = np.array([1, 2, np.nan, np.inf], np.float32)
    assert validate_row_data(_G.F32, f32) == InvalidData(2, "value", "NaN")
    assert validate_row_data(_G.F64, np.array([0, -np.inf])) == InvalidData(1, "value", "inf")
    assert validate_row_data(_G.F16, np.array([65504, np.inf], np.float16)) == InvalidData(1, "value", "inf")
    bf = Q.fp32_to_bf16(np.array([1, 3e38, np.inf, np.nan], np.float32))
    assert validate_row_data(_G.BF16, bf) == InvalidData(2, "value", "inf")
    assert validate_row_data(_G.BF16, bf[:2]) is None
    q8k = np.zeros((2, 292), np.uint8)
    q8k[1, :4] = np.frombuffer(np.float32(np.nan).tobytes(), np.uint8)
    assert validate_row_data(_G.Q8_K, q8k) == InvalidData(1, "d", "NaN")
    mx = np.zeros((2, 17), np.uint8)
    mx[1, 0] = 0xFF
    assert validate_row_data(_G.MXFP4, mx) == InvalidData(1, "e", "0xff")
    iq1m = np.zeros((2, 56), np.uint8)                 # the f16 scale's nibbles: top 4 bits of scales' 4 u16
    sc = np.zeros(4, np.uint16)
    for k, nib in enumerate((0xC, 0x0, 0xC, 0x7)):      # 0x7C0C: exponent all ones, mantissa != 0: NaN
        sc[k] = nib << 12
    iq1m[1, 48:56] = sc.view(np.uint8)
    assert validate_row_data(_G.IQ1_M, iq1m) == InvalidData(1, "d", "NaN")
    assert validate_row_data(_G.NVFP4, np.full((1, 36), 0xFF, np.uint8)) is None
    assert validate_row_data(_G.I32, np.array([1, 2], np.int32)) is None
    assert not validates(_G.Q8_1) and validate_row_data(_G.Q8_1, np.zeros(36, np.uint8)).problem == "unknown type"
    assert all(validates(t) for t in _G if t != _G.Q8_1)


def test_a_large_array_is_checked_in_chunks(monkeypatch):
    import ggtool.quant.validate as V
    monkeypatch.setattr(V, "CHUNK_BYTES", 1000)
    raw = np.zeros((500, 18), np.uint8)
    raw[437, 1] = 0x7C                                    # d = +inf in block 437
    assert validate_row_data(_G.Q4_0, raw) == InvalidData(437, "d", "inf")


# ------------------------------------------------------------------ quantize: data it must refuse

@pytest.mark.parametrize("qtype", ["iq4_nl", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0"])
def test_a_weight_of_1e7_is_refused_in_every_32_block_type(run, tmp_path, npy, qtype):
    """1e7 needs a scale above 65504 in every 32-value type; IQ4_NL's block was written with an
    inf scale, exit 0."""
    a = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
    a[1, 3] = 1e7
    out = tmp_path / "o.gguf"
    err = fails(run("quantize", npy(a, "big.npy"), out, "--type", qtype, "-q"))
    assert err == (f"Error: tensor 'big': the {qtype} block at index (1, 0) holds values up to 1e+07, too large for "
                   "its f16 scale (it would be inf)\n")
    assert not out.exists() and os.listdir(tmp_path) == ["big.npy"]


def test_a_value_beyond_bf16_is_refused(run, tmp_path, npy):
    a = np.ones((2, 32), np.float32)
    a[0, 9] = 3.4e38                                       # rounds to bf16's inf (largest 3.3895e38)
    out = tmp_path / "o.gguf"
    assert fails(run("quantize", npy(a, "w.npy"), out, "--type", "bf16", "-q")) == (
        "Error: tensor 'w': value 3.4e+38 at index (0, 9) is too large for bf16 (it would be inf)\n")
    assert not out.exists()


def _model(tmp_path, cols=256):
    rng = np.random.default_rng(0)
    return write_gguf(tmp_path / "m.gguf", {"blk.0.ffn_up.weight": rng.standard_normal((4, cols)).astype(np.float32)},
                      arch="llama", kv={"llama.block_count": 1})


@pytest.mark.parametrize("ftype, block", [("IQ4_NL", "(0, 0)"), ("Q4_0", "(2, 0)"), ("Q5_0", "(2, 0)"),
                                          ("Q2_K", "(0, 0)"), ("Q3_K_S", "(0, 0)"), ("Q4_K_S", "(0, 0)"),
                                          ("Q5_K_S", "(0, 0)")])
def test_an_importance_of_3e38_is_refused_naming_the_importances(tmp_path, ftype, block):
    """An importance of 3e38 (finite: the file is valid) makes the weighted scale searches NaN;
    the error says so, not that the values (about 3) are too large."""
    src = _model(tmp_path)
    w = np.ones(256, np.float32)
    w[5] = 3e38
    out = tmp_path / "q.gguf"
    opts = QM.QuantizeOptions(type=ftype, pure=True, imatrix=Imatrix("w.dat", {"blk.0.ffn_up.weight": w}))
    with pytest.raises(QM.InvalidDataError) as e:
        QM.quantize_file(src, out, opts)
    qt = T.type_name(opts.type.default)
    assert str(e.value).startswith(f"tensor 'blk.0.ffn_up.weight': the {qt} block at index {block} would have a NaN "
                                   "f16 scale (d): its importances reach 3e+38, too large to weigh its values (up to ")
    assert str(e.value).endswith("with; the importance matrix cannot be used for this tensor")
    assert (e.value.tensor, e.value.cause, e.value.field, e.value.problem) == ("blk.0.ffn_up.weight", "importances", "d", "NaN")
    assert not out.exists() and sorted(os.listdir(tmp_path)) == ["m.gguf"]
    w[5] = 3e30                                            # large, but weighable: the file is written
    opts.imatrix = Imatrix("w.dat", {"blk.0.ffn_up.weight": w})
    QM.quantize_file(src, out, opts)
    assert out.exists()


def test_a_copied_tensor_holding_nan_is_refused(run, tmp_path):
    """A 1-d norm is copied unchanged; llama.cpp's loader (check_tensors) refuses its NaN, and so
    is the output refused, not written with it."""
    norm = np.ones(64, np.float32)
    norm[3] = np.nan
    src = write_gguf(tmp_path / "m.gguf", {"output_norm.weight": norm,
                                           "blk.0.ffn_up.weight": np.ones((2, 64), np.float32)}, arch="llama")
    out = tmp_path / "q.gguf"
    assert fails(run("quantize", src, out, "-q")) == (
        "Error: tensor 'output_norm.weight' (f32, copied unchanged) holds NaN at index (3,), which GGML refuses "
        "(llama.cpp cannot load it)\n")
    assert not out.exists()


def test_a_copied_block_tensor_with_an_inf_scale_is_refused(run, tmp_path):
    raw = np.asarray(Q.quantize(np.ones((2, 64), np.float32), T.Q8_0)).reshape(2, -1).copy()
    raw[1, 34:36] = np.frombuffer(np.uint16(0x7C00).tobytes(), np.uint8)    # row 1's second block: d = inf
    src = write_gguf(tmp_path / "m.gguf", {"blk.0.ffn_up.weight": (raw, gguf.GGMLQuantizationType.Q8_0)}, arch="llama")
    out = tmp_path / "q.gguf"
    assert fails(run("quantize", src, out, "--type", "q8_0", "-q")) == (
        "Error: tensor 'blk.0.ffn_up.weight' (q8_0, copied unchanged) holds a q8_0 block at index (1, 32) whose d is "
        "inf, which GGML refuses (llama.cpp cannot load it)\n")


def test_a_float64_npy_that_overflows_float32_is_refused(run, tmp_path, npy):
    a = np.ones((2, 32), np.float64)
    a[1, 2] = 1e300
    out = tmp_path / "o.gguf"
    assert fails(run("quantize", npy(a, "w.npy"), out, "--type", "f32", "-q")) == (
        "Error: tensor 'w' (f32, copied unchanged) holds inf at index (1, 2), which GGML refuses "
        "(llama.cpp cannot load it)\n")
    assert not out.exists()


def test_a_custom_converter_is_validated_too(tmp_path):
    """The check is in the writing loop, not in the default converter: a converter writing a NaN
    scale is refused as the default one would be."""
    def nan_scales(x, src_type, dst_type, name, shape, r0, imatrix=None):
        raw = np.frombuffer(QM.convert_rows(x, src_type, dst_type, name, shape, r0), np.uint8).copy()
        raw[:2] = np.frombuffer(np.uint16(0x7E00).tobytes(), np.uint8)
        return raw.tobytes()

    out = tmp_path / "q.gguf"
    with pytest.raises(QM.InvalidDataError, match=r"the q8_0 block at index \(0, 0\) holds values up to .* "
                                                  r"\(it would be NaN\)"):
        QM.quantize_file(STORIES, out, QM.QuantizeOptions(type="Q8_0"), converter=nan_scales)
    assert not out.exists()


# --------------------------------------------------------------------- --override-kv as set-metadata

OVERRIDE_REFUSALS = [
    ("general.alignment=int:48", "Error: general.alignment: alignment 48 cannot be written (a power of two up to 65536 is)"),
    ("general.alignment=float:64", "Error: 'general.alignment' must be a UINT32 (GGML refuses any other type), not a FLOAT32"),
    ("split.count=int:2", "Error: 'split.count' is a split model's key: it would make this file a shard of a model that "
                          "has no other shards"),
    ("GGUF.version=int:2", "Error: 'GGUF.version' is gguf-py's name for a header field, not a metadata key"),
    ("general.architecture=int:5", "Error: 'general.architecture' cannot be a UINT32: llama.cpp needs it, a string, to "
                                   "load the model"),
    ("=int:5", "Error: a metadata key cannot be empty"),
    ("x=float:1e-50", "Error: metadata 'x' is FLOAT32: 1e-50 underflows it (it would be stored as 0; the smallest "
                      "positive FLOAT32 is 1.40129846e-45)"),
    ("x=int:5000000000", "Error: metadata 'x' is UINT32: 5000000000 is out of its range 0..4294967295"),
    ("a\udcff=int:1", 'Error: metadata key "a\\xff" is not UTF-8 text: gguf-py and llama.cpp read keys as UTF-8 '
                      "(gguf-py could not open the file)"),
    ("k=str:a\udcffb", "Error: metadata 'k': the string \"a\\xffb\" is not UTF-8 text (GGUF strings are UTF-8)"),
]


@pytest.mark.parametrize("kv, line", OVERRIDE_REFUSALS, ids=[k for k, _ in OVERRIDE_REFUSALS])
def test_override_kv_refuses_what_set_metadata_refuses_in_its_words(run, tmp_path, kv, line):
    out = tmp_path / "o.gguf"
    for extra in ([], ["--dry-run"]):
        assert fails(run("quantize", STORIES, out, "--override-kv", kv, *extra)) == line + "\n"
    assert not out.exists()
    key, _, rest = kv.partition("=")
    tag, _, value = rest.partition(":")
    typed = {"int": "u32", "float": "f32", "str": "str"}[tag]
    if key and key != "GGUF.version":                      # set-metadata's words for the same edit
        err = fails(run("set-metadata", STORIES, "-o", out, "--set-typed", f"{key}={typed}:{value}"))
        assert err == line + "\n", err


def test_an_alignment_override_lays_the_tensors_out_for_it(run, tmp_path):
    """llama-quantize writes general.alignment=4096 into the header but lays the data out for 32, a
    file that lies; ggtool lays it out for 4096, as set-metadata does."""
    out = tmp_path / "q.gguf"
    ok(run("quantize", STORIES, out, "--override-kv", "general.alignment=int:4096", "-q"))
    r = gguf.GGUFReader(str(out))
    assert r.alignment == 4096 and all(t.data_offset % 4096 == 0 for t in r.tensors)
    plain = tmp_path / "p.gguf"
    ok(run("quantize", STORIES, plain, "-q"))
    p = gguf.GGUFReader(str(plain))
    assert [np.asarray(t.data).tobytes() for t in r.tensors] == [np.asarray(t.data).tobytes() for t in p.tensors]
    npy_out = tmp_path / "n.gguf"                          # a .npy input too
    np.save(tmp_path / "w.npy", np.ones((2, 32), np.float32))
    ok(run("quantize", tmp_path / "w.npy", npy_out, "--override-kv", "general.alignment=int:256", "-q"))
    assert gguf.GGUFReader(str(npy_out)).tensors[0].data_offset % 256 == 0


def test_the_one_check_is_the_engines():
    """KVOverride checks itself when made (a library caller too), by set-metadata's check."""
    with pytest.raises(E.MetadataEditError) as e:
        QM.KVOverride("split.no", "int", 1)
    assert (e.value.key, e.value.reason) == ("split.no", "protected")
    with pytest.raises(E.MetadataEditError, match="underflows"):
        QM.KVOverride("x", "float", 1e-50)
    assert QM.KVOverride("x", "float", 3.4028235e38).raw()[-4:] == np.float32(3.4028235e38).tobytes()
    assert QM.KVOverride("x", "int", -64).stored == 64     # llama.cpp's (uint32_t)std::abs


# ------------------------------------------------------------------------ --dry-run says it too

def test_a_dry_run_onto_an_existing_output_refuses_as_the_run_does(run, tmp_path):
    out = tmp_path / "o.gguf"
    out.write_bytes(b"keep")
    r = run("quantize", STORIES, out, "--dry-run")
    assert r.exit_code == 1 and "token_embd.weight" in r.stdout and "would write" not in r.stdout
    assert r.stderr == f"Error: {out} exists (use --force to overwrite it)\n"
    r = run("quantize", STORIES, out, "--dry-run", "--json")
    assert r.exit_code == 1 and r.stderr == f"Error: {out} exists (use --force to overwrite it)\n"
    real = run("quantize", STORIES, out, "-q")
    assert real.exit_code == 1 and real.stderr == r.stderr and out.read_bytes() == b"keep"
    assert ok(run("quantize", STORIES, out, "--dry-run", "--force")).endswith(f"would write 277,024 bytes to {out} (dry run)\n")


def test_a_dry_run_into_a_missing_directory_refuses(run, tmp_path):
    out = tmp_path / "no" / "o.gguf"
    for extra in (["--dry-run"], []):
        r = run("quantize", STORIES, out, *extra)
        assert r.exit_code == 1 and r.stderr == f"Error: {out}: directory {out.parent} does not exist\n"


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write anywhere")
def test_a_dry_run_into_a_read_only_directory_refuses(run, tmp_path):
    d = tmp_path / "ro"
    d.mkdir()
    d.chmod(0o555)
    try:
        for extra in (["--dry-run"], []):
            r = run("quantize", STORIES, d / "o.gguf", *extra)
            assert r.exit_code == 1 and r.stderr == f"Error: {d / 'o.gguf'}: directory {d} is not writable\n"
    finally:
        d.chmod(0o755)


def test_a_fifo_or_device_output_needs_no_writable_directory(tmp_path, monkeypatch):
    """/dev/null is written in place: the directory it is in need not take a temporary file."""
    from ggtool.gguf_io.write import OutputPathError, check_output_paths

    fifo = tmp_path / "f"
    os.mkfifo(fifo)
    monkeypatch.setattr(os, "access", lambda *a, **k: False)          # no directory writable
    check_output_paths(str(STORIES), [str(fifo), "/dev/null"], True)
    with pytest.raises(OutputPathError) as e:
        check_output_paths(str(STORIES), str(tmp_path / "new.gguf"), True)
    assert e.value.reason == "not_writable"


# -------------------------------------------------------------------------- user regular expressions

CATASTROPHIC = r"(.|.)*\d$"          # 2^25 ways to fail on blk.10.attn_output.weight


def _cpu_bounded(fn):
    t0 = time.process_time()
    result = fn()
    assert time.process_time() - t0 < 3.0
    return result


def test_a_tensor_type_pattern_that_backtracks_is_refused(run, tmp_path):
    out = tmp_path / "o.gguf"
    for extra in (["--dry-run"], ["-q"]):
        err = _cpu_bounded(lambda: fails(run("quantize", STORIES, out, "--tensor-type", f"{CATASTROPHIC}=q8_0", *extra)))
        assert err == (f"Error: --tensor-type: the regular expression '{CATASTROPHIC}' took more than 1 s of CPU time on "
                       "the names it searched (it backtracks without end); simplify it, e.g. no nested or overlapping "
                       "repeats such as (a|a)* or (.*)*\n")
    assert not out.exists()


def test_a_pattern_that_only_looks_catastrophic_ends_at_once_with_a_warning(run, tmp_path):
    """(.*.*)*z$ ran for minutes with re on 48 names; regex matches it at once. It gives no tensor
    its type, which is said."""
    r = _cpu_bounded(lambda: run("quantize", STORIES, tmp_path / "o.gguf", "--tensor-type", "(.*.*)*z$=q8_0"))
    assert r.exit_code == 0
    assert r.stderr.splitlines()[0] == ("Warning: tensor-type pattern '(.*.*)*z$' gives no tensor its type (it matches "
                                        "none of the tensors quantized, or an earlier pattern matched them first)")
    assert "Warning" not in run("quantize", STORIES, tmp_path / "p.gguf", "--tensor-type", "attn_q=q8_0").stderr


def test_inspect_only_that_backtracks_is_refused(run):
    err = _cpu_bounded(lambda: fails(run("inspect", STORIES, "--only", CATASTROPHIC)))
    assert err.startswith(f"Error: --only: the regular expression '{CATASTROPHIC}' took more than 1 s of CPU time")
    assert "'(' is not a regular expression" in fails(run("inspect", STORIES, "--only", "("), code=2)


def test_inspect_graph_only_that_backtracks_is_refused(run):
    args = ["inspect-graph", "-f", ROOT / "fixtures" / "llama.gg", "--gguf", STORIES, "--tensor", "tokens=i32:[1,2]"]
    err = _cpu_bounded(lambda: fails(run(*args, "--only", CATASTROPHIC)))
    assert err.startswith(f"Error: --only: the regular expression '{CATASTROPHIC}' took more than 1 s of CPU time")
    assert fails(run(*args, "--only", "(")) == "Error: --only '(' is not a valid regular expression: missing ) at position 1\n"


def test_the_budget_is_shared_by_a_patterns_searches():
    p = UserRegex(r"(a|aa)+$", "only", budget_s=0.2)
    t0 = time.process_time()
    with pytest.raises(RegexError) as e:
        for _ in range(100):
            p.search("a" * 24 + "b")           # ~50 ms each: the budget runs out within a few
    assert time.process_time() - t0 < 1.5 and (e.value.reason, e.value.origin, e.value.kind) == ("timeout", "only", "regex-timeout")
    assert UserRegex("^blk\\.0\\.").search("blk.0.attn_q.weight") and not UserRegex("x").search("y")
