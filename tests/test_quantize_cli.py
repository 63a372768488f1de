"""`ggtool quantize`: llama.cpp's Q4_0 rules, byte identity, metadata, safety (same path, NaN, Ctrl-C)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import gguf
import numpy as np
import pytest
from conftest import write_gguf

from ggtool import quantize_model as QM
from ggtool import types as T

ROOT = Path(__file__).resolve().parent.parent
STORIES = ROOT / "fixtures" / "stories260K.gguf"
TINY = ROOT / "fixtures" / "llama-2-tiny-random.gguf"
QT = gguf.GGMLQuantizationType



def types_of(path) -> dict[str, str]:
    r = gguf.GGUFReader(str(path))
    return {t.name: t.tensor_type.name for t in r.tensors}


def run_cli(run, *args):
    return run("quantize", *args)


# --------------------------------------------------------------------------------- stories260K

@pytest.mark.parametrize("pure", [False, True])
def test_stories260k(run, tmp_path, pure):
    out = tmp_path / "q.gguf"
    r = run_cli(run, STORIES, out, "--threads", "1", *(["--pure"] if pure else []))
    assert r.exit_code == 0, r.output
    src, dst = gguf.GGUFReader(str(STORIES)), gguf.GGUFReader(str(out))
    inp = {t.name: t for t in src.tensors}
    got = {t.name: t for t in dst.tensors}
    assert set(got) == set(inp)
    for name, t in got.items():
        s = inp[name]
        if len(s.shape) == 1:
            want = "F32"
        elif name.endswith("ffn_down.weight"):           # rows of 172: F16, as llama.cpp
            want = "F16"
        elif name == "output.weight" and not pure:       # Q6_K wanted, row 64 % 256 -> Q8_0
            want = "Q8_0"
        else:
            want = "Q4_0"
        assert t.tensor_type.name == want, name
        if want == "Q4_0":   # byte-identical to gguf-py's (= llama.cpp's) Q4_0 of the same source
            assert np.array_equal(np.asarray(t.data), gguf.quants.quantize(np.asarray(s.data), QT.Q4_0)), name
        elif want == "F32":
            assert np.asarray(t.data).tobytes() == np.asarray(s.data).tobytes()
        elif want == "F16":
            assert np.array_equal(np.asarray(t.data), np.asarray(s.data).astype(np.float16))
        else:
            assert np.array_equal(np.asarray(t.data), gguf.quants.quantize(np.asarray(s.data), QT.Q8_0))
    # metadata: everything copied, file type and quantization version set (and last, as llama.cpp)
    keys = [k for k in dst.fields if not k.startswith("GGUF.")]
    assert keys[-2:] == ["general.quantization_version", "general.file_type"]
    assert dst.fields["general.file_type"].contents() == 2
    assert dst.fields["general.quantization_version"].contents() == 2
    for k, f in src.fields.items():
        if not k.startswith("GGUF."):
            assert dst.fields[k].contents() == f.contents(), k
    # llama.cpp's tensor order: non-block tensors by name, then blk.N by layer and name
    names = [t.name for t in dst.tensors]
    assert names[:3] == ["output.weight", "output_norm.weight", "token_embd.weight"]
    assert names[3] == "blk.0.attn_k.weight" and names[-1] == "blk.4.ffn_up.weight"
    # per-tensor lines like llama-quantize's, then a summary
    assert "[   1/  48]                        output.weight - [   64,   512,     1,     1], type =    f32, " \
           "converting to " in r.stderr
    assert "type =    f32, size =    0.000 MiB" in r.stderr
    assert "model size  =" in r.stderr and "quant size  =" in r.stderr and "bits per weight" in r.stderr
    assert r.stdout == ""


def test_llama2_tiny_keeps_f16_rows_of_8(run, tmp_path):
    out = tmp_path / "q.gguf"
    r = run_cli(run, TINY, out, "-t", "1", "-q")
    assert r.exit_code == 0 and r.stderr == ""
    src = {t.name: t for t in gguf.GGUFReader(str(TINY)).tensors}
    for t in gguf.GGUFReader(str(out)).tensors:
        if t.name == "blk.0.ffn_down.weight":            # the only row of 32
            assert t.tensor_type == QT.Q4_0
            x = gguf.quants.dequantize(np.asarray(src[t.name].data), src[t.name].tensor_type)
            assert np.array_equal(np.asarray(t.data), gguf.quants.quantize(x, QT.Q4_0))
        else:                                              # same type: copied byte for byte
            assert t.tensor_type == src[t.name].tensor_type, t.name
            assert np.asarray(t.data).tobytes() == np.asarray(src[t.name].data).tobytes()


def test_type_q8_0(run, tmp_path):
    out = tmp_path / "q8.gguf"
    assert run_cli(run, STORIES, out, "--type", "q8_0", "-q", "-t", "1").exit_code == 0
    ty = types_of(out)
    assert ty["output.weight"] == "Q8_0" and ty["blk.0.attn_q.weight"] == "Q8_0"
    assert ty["blk.0.ffn_down.weight"] == "F16"
    assert gguf.GGUFReader(str(out)).fields["general.file_type"].contents() == 7


@pytest.mark.parametrize("qtype, fallback, ftype", [("q4_K", "Q5_0", 15), ("Q5_K", "Q5_1", 17), ("q6_K", "Q8_0", 18)])
def test_pure_k_quant_file(run, tmp_path, qtype, fallback, ftype):
    """--pure with a K type: every eligible tensor gets it, with GGML's bytes (ggtool.quant's, pinned by
    tests/test_kquants.py); rows not a multiple of 256 fall back as llama.cpp's tensor_type_fallback."""
    from ggtool import quant as Q

    rng = np.random.default_rng(3)
    src = {"token_embd.weight": rng.standard_normal((16, 512)).astype(np.float32),
           "blk.0.attn_q.weight": rng.standard_normal((8, 576)).astype(np.float32),
           "blk.0.ffn_down.weight": rng.standard_normal((4, 100)).astype(np.float32),
           "blk.0.ffn_up.weight": rng.standard_normal((8, 768)).astype(np.float16),
           "output_norm.weight": rng.standard_normal(512).astype(np.float32)}
    write_gguf(tmp_path / "m.gguf", src, arch="llama")
    out = tmp_path / "k.gguf"
    assert run_cli(run, tmp_path / "m.gguf", out, "--type", qtype, "--pure", "-q", "-t", "2").exit_code == 0
    r = gguf.GGUFReader(str(out))
    got = {t.name: t for t in r.tensors}
    k = qtype.lower()[:2] + "_K"
    want = {"token_embd.weight": k, "blk.0.attn_q.weight": fallback.lower(), "blk.0.ffn_down.weight": "f16",
            "blk.0.ffn_up.weight": k, "output_norm.weight": "f32"}
    for name, t in want.items():
        assert got[name].tensor_type.name == t.upper(), name
        if t != "f32":
            expect = Q.quantize(src[name].astype(np.float32), t)
            assert np.array_equal(np.asarray(got[name].data).view(np.uint8).reshape(-1),
                                  np.asarray(expect).view(np.uint8).reshape(-1)), name
    assert r.fields["general.file_type"].contents() == ftype


def test_k_mix_file_type(run, tmp_path):
    """Q4_K_M without --pure is llama.cpp's mix (pinned tensor by tensor by test_quantize_rules.py);
    stories260K's rows of 64 and 172 take the fallbacks, which --verbose says as llama.cpp does."""
    out = tmp_path / "k.gguf"
    r = run_cli(run, STORIES, out, "--type", "Q4_K_M", "-t", "1", "--verbose")
    assert r.exit_code == 0, r.output
    ty = types_of(out)
    assert ty["blk.0.attn_q.weight"] == "Q5_0" and ty["blk.4.attn_v.weight"] == "Q8_0"
    assert ty["blk.0.ffn_down.weight"] == "F16" and ty["output.weight"] == "Q8_0"
    assert gguf.GGUFReader(str(out)).fields["general.file_type"].contents() == 15
    assert ("warning: blk.0.attn_q.weight                  - ncols     64 not divisible by 256 "
            "(required for type    q4_K) -> falling back to    q5_0") in r.stderr
    assert "(attn_v: use_more_bits(4, 5); fallback: ncols 64 not divisible by 256" in r.stderr
    assert "tensor(s) required fallback quantization" in r.stderr


def test_unknown_file_type_lists_the_valid_ones(run, tmp_path):
    r = run_cli(run, STORIES, tmp_path / "k.gguf", "--type", "q4_k_x")
    assert r.exit_code == 2 and "unknown file type 'q4_k_x'" in r.stderr
    assert "Q4_K_M" in r.stderr and "Q3_K_S" in r.stderr and "BF16" in r.stderr
    assert not (tmp_path / "k.gguf").exists()


def test_output_and_embedding_options(run, tmp_path):
    out = tmp_path / "a.gguf"
    assert run_cli(run, STORIES, out, "--leave-output-tensor", "-q", "-t", "1").exit_code == 0
    assert types_of(out)["output.weight"] == "F32"
    out = tmp_path / "b.gguf"
    r = run_cli(run, STORIES, out, "--output-tensor-type", "f16", "--token-embedding-type", "q8_0", "-q", "-t", "1")
    assert r.exit_code == 0, r.output
    ty = types_of(out)
    assert ty["output.weight"] == "F16" and ty["token_embd.weight"] == "Q8_0"
    r = run_cli(run, STORIES, tmp_path / "c.gguf", "--output-tensor-type", "q8_1")
    assert r.exit_code == 2 and "cannot write tensor type 'q8_1'" in r.stderr
    # a type ggtool writes, given outright to rows its blocks do not divide (llama.cpp: no fallback there)
    r = run_cli(run, STORIES, tmp_path / "c.gguf", "--output-tensor-type", "iq2_xxs")
    assert r.exit_code == 1 and "row length 64 is not a multiple of 256 (iq2_xxs block size)" in r.stderr
    assert not (tmp_path / "c.gguf").exists()


def test_tied_embedding_rules(tmp_path):
    rng = np.random.default_rng(0)
    emb = rng.standard_normal((64, 256)).astype(np.float32)      # ne [256, 64]: row of 256
    src = write_gguf(tmp_path / "tied.gguf", {"token_embd.weight": emb,
                                              "blk.0.attn_q.weight": rng.standard_normal((64, 256)).astype(np.float32),
                                              "blk.0.attn_norm.weight": np.ones(256, np.float32)})
    plan = QM.plan_quantization(src, QM.QuantizeOptions())
    by = {t.name: t for t in plan.tensors}
    # no output.weight: token_embd is the output, and gets llama.cpp's q6_K
    assert by["token_embd.weight"].dst_type == T.GGMLType.Q6_K
    assert by["token_embd.weight"].reasons == ("tied embedding (the output)",)
    assert by["blk.0.attn_q.weight"].dst_type == T.Q4_0
    assert by["blk.0.attn_norm.weight"].dst_type == T.F32
    pure = QM.plan_quantization(src, QM.QuantizeOptions(pure=True))
    assert {t.name: t.dst_type for t in pure.tensors}["token_embd.weight"] == T.Q4_0


def test_rules_table():
    def ch(name, ne, src=T.F32, **kw):
        mix = QM.new_mix(QM.QuantizeOptions(), QM.ModelInfo(**kw), [name, "output.weight"])
        return mix.choose(name, ne, src).type

    assert ch("blk.0.attn_norm.weight", (64, 1)) == T.F32  # n_dims 1
    assert ch("blk.0.ffn_norm.weight", (64, 64)) == T.F32
    assert ch("blk.0.ffn_gate_inp.weight", (64, 8)) == T.F32
    assert ch("blk.0.attn_q.bias", (64, 64)) == T.F32
    assert ch("blk.0.attn_q.weight", (64, 64), T.F16) == T.Q4_0
    assert ch("blk.0.attn_q.weight", (72, 64)) == T.F16
    assert ch("blk.0.attn_v.weight", (64, 64), n_expert=8) == T.Q8_0
    assert ch("output.weight", (64, 64), arch="falcon") == T.Q8_0
    assert ch("output.weight", (4096, 64)) == T.GGMLType.Q6_K
    assert ch("output.weight", (64, 64), T.Q8_0) == T.Q8_0   # -> copied


# ---------------------------------------------------------------------------------------- safety

def test_same_path_refused(run, tmp_path):
    p = tmp_path / "m.gguf"
    p.write_bytes(STORIES.read_bytes())
    r = run_cli(run, p, p)
    assert r.exit_code == 1 and "same file" in r.stderr
    link = tmp_path / "link.gguf"
    os.symlink(p, link)
    r = run_cli(run, p, link, "--force")
    assert r.exit_code == 1 and "same file" in r.stderr
    assert p.read_bytes() == STORIES.read_bytes()


def test_existing_output_needs_force(run, tmp_path):
    out = tmp_path / "o.gguf"
    out.write_bytes(b"keep me")
    r = run_cli(run, STORIES, out, "-q")
    assert r.exit_code == 1 and "--force" in r.stderr and out.read_bytes() == b"keep me"
    r = run_cli(run, STORIES, out, "-q", "--force", "-t", "1")
    assert r.exit_code == 0 and out.read_bytes()[:4] == b"GGUF"
    assert sorted(os.listdir(tmp_path)) == ["o.gguf"]


def test_force_has_no_short_alias(run, tmp_path):
    """-f is --file in compute, inspect-graph and plan; quantize only spells it --force."""
    out = tmp_path / "o.gguf"
    out.write_bytes(b"keep me")
    r = run_cli(run, STORIES, out, "-q", "-f", "-t", "1")
    assert r.exit_code == 2 and "-f" in r.stderr and out.read_bytes() == b"keep me"
    assert "-f," not in run_cli(run, "--help").stdout


def test_api_refuses_existing_output_and_same_path(tmp_path):
    """run_quantization itself checks the paths, so quantize_file (no CLI) is covered too."""
    out = tmp_path / "o.gguf"
    out.write_bytes(b"keep me")
    with pytest.raises(QM.OutputPathError) as e:
        QM.quantize_file(STORIES, out, QM.QuantizeOptions(threads=1))
    assert (e.value.path, e.value.reason) == (str(out), "exists") and "--" not in str(e.value)
    assert out.read_bytes() == b"keep me"
    p = tmp_path / "m.gguf"
    p.write_bytes(STORIES.read_bytes())
    with pytest.raises(QM.OutputPathError, match="same file") as e:
        QM.quantize_file(p, p, QM.QuantizeOptions(threads=1), force=True)
    assert e.value.reason == "same_as_input"
    assert p.read_bytes() == STORIES.read_bytes()
    assert sorted(os.listdir(tmp_path)) == ["m.gguf", "o.gguf"]


def test_paths_checked_once(run, tmp_path, monkeypatch):
    from ggtool.quantize_model import write as QW

    calls = []
    real = QW.check_output_paths
    monkeypatch.setattr(QW, "check_output_paths", lambda *a: (calls.append(a), real(*a))[1])
    assert run_cli(run, STORIES, tmp_path / "a.gguf", "-q", "-t", "1").exit_code == 0
    assert len(calls) == 1
    QM.quantize_file(STORIES, tmp_path / "b.gguf", QM.QuantizeOptions(threads=1))
    assert len(calls) == 2


def _plain_new_file_mode(path) -> int:
    with open(path, "w"):
        pass
    return os.stat(path).st_mode & 0o7777


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o002])
def test_output_mode_matches_a_plain_new_file(run, tmp_path, umask):
    old = os.umask(umask)
    try:
        want = _plain_new_file_mode(tmp_path / "plain")
        out = tmp_path / "q.gguf"
        assert run_cli(run, STORIES, out, "-q", "-t", "1").exit_code == 0
        assert os.stat(out).st_mode & 0o7777 == want
        api = tmp_path / "api.gguf"
        QM.quantize_file(STORIES, api, QM.QuantizeOptions(threads=1))
        assert os.stat(api).st_mode & 0o7777 == want
    finally:
        os.umask(old)
    if umask == 0o022:
        assert want == 0o644


def test_nan_is_an_error_and_leaves_nothing(run, tmp_path):
    w = np.zeros((8, 64), np.float32)
    w[3, 17] = np.nan
    src = write_gguf(tmp_path / "nan.gguf", {"blk.0.attn_q.weight": w})
    out = tmp_path / "out" / "q.gguf"
    out.parent.mkdir()
    r = run_cli(run, src, out, "-t", "1")
    assert r.exit_code == 1
    assert r.stderr.strip().splitlines()[-1] == \
        "Error: tensor 'blk.0.attn_q.weight': cannot quantize NaN at index (3, 17)"
    assert os.listdir(out.parent) == []


def test_f16_overflow_in_a_fallback_tensor_is_an_error(run, tmp_path):
    # rows of 33 cannot be q4_0, so llama.cpp's rules give the tensor f16, where 70000 is inf;
    # llama-quantize refuses it too ("quantized data validation failed"), ggtool says where
    w = np.ones((2, 33), np.float32)
    w[1, 5] = 70000
    src = write_gguf(tmp_path / "big.gguf", {"blk.0.ffn_up.weight": w}, arch="llama")
    out = tmp_path / "q.gguf"
    r = run_cli(run, src, out, "-q")
    assert r.exit_code == 1 and r.stderr.startswith(
        "Error: tensor 'blk.0.ffn_up.weight': value 70000 at index (1, 5) is too large for f16 (it would be inf); "
        "its rows of 33 are not a multiple of 32")
    assert not out.exists()
    w[1, 5] = 65504                          # the largest f16 is kept
    src = write_gguf(tmp_path / "max.gguf", {"blk.0.ffn_up.weight": w}, arch="llama")
    assert run_cli(run, src, out, "-q").exit_code == 0
    assert float(gguf.GGUFReader(str(out)).tensors[0].data[1, 5]) == 65504


def test_nan_in_an_f16_fallback_tensor_is_an_error(run, tmp_path):
    w = np.ones((2, 33), np.float32)
    w[0, 7] = -np.inf
    src = write_gguf(tmp_path / "inf.gguf", {"blk.0.ffn_up.weight": w}, arch="llama")
    r = run_cli(run, src, tmp_path / "q.gguf", "-q")
    assert r.stderr == "Error: tensor 'blk.0.ffn_up.weight': cannot quantize -inf at index (0, 7)\n"


def test_q4_0_scale_overflow_is_an_error(run, tmp_path):
    # a block reaching 600000 has the scale 600000/8 = 75000: inf in f16
    w = np.ones((2, 64), np.float32)
    w[1, 40] = 600000
    src = write_gguf(tmp_path / "big.gguf", {"blk.0.ffn_up.weight": w}, arch="llama")
    r = run_cli(run, src, tmp_path / "q.gguf", "-q", "--pure")
    assert r.stderr == ("Error: tensor 'blk.0.ffn_up.weight': the q4_0 block at index (1, 32) holds values up to "
                        "600000, too large for its f16 scale (it would be inf)\n")


def test_requantizing_is_refused_unless_allowed(run, tmp_path):
    q8 = tmp_path / "q8.gguf"
    assert run_cli(run, STORIES, q8, "--type", "q8_0", "-q", "-t", "1").exit_code == 0
    out = tmp_path / "q4.gguf"
    for extra in ([], ["--dry-run"]):
        r = run_cli(run, q8, out, *extra)
        assert r.exit_code == 1 and r.stdout == "" and r.stderr == (
            "Error: tensor 'token_embd.weight' is already quantized (q8_0): requantizing it to q4_0 adds a second "
            "rounding error to the first (31 tensors of this model would be requantized); --allow-requantize "
            "does it anyway\n")
        assert not out.exists()
    assert run_cli(run, q8, out, "-q", "-t", "1", "--allow-requantize").exit_code == 0
    assert types_of(out)["blk.0.attn_q.weight"] == "Q4_0"
    with pytest.raises(QM.RequantizeError):
        QM.plan_quantization(q8, QM.QuantizeOptions())
    # a tensor that keeps its type is copied, not requantized: a Q4_0 file quantizes to Q4_0 freely
    again = tmp_path / "again.gguf"
    assert run_cli(run, out, again, "-q", "-t", "1").exit_code == 0
    assert types_of(again) == types_of(out)


def test_error_mid_file_leaves_no_partial_output(tmp_path):
    out = tmp_path / "q.gguf"
    calls = []

    def boom(*a, **k):
        calls.append(1)
        if len(calls) == 5:
            raise KeyboardInterrupt
        return QM.convert_rows(*a, **k)

    with pytest.raises(KeyboardInterrupt):
        QM.quantize_file(STORIES, out, QM.QuantizeOptions(threads=1), converter=boom)
    assert len(calls) == 5 and os.listdir(tmp_path) == []


def test_ctrl_c_exits_130_without_files(tmp_path):
    out = tmp_path / "q.gguf"
    code = (
        "import functools, time, ggtool.quantize_model as QM\n"
        "def slow(*a, **k):\n"
        "    time.sleep(0.2)\n"
        "    return QM.convert_rows(*a, **k)\n"
        "QM.run_quantization = functools.partial(QM.run_quantization, converter=slow)\n"
        "from ggtool.commands import main\n"
        "main()\n"
    )
    p = subprocess.Popen([sys.executable, "-c", code, "quantize", str(STORIES), str(out), "-t", "1"],
                         stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    # wait for the first converted tensor line, then interrupt
    line = p.stderr.readline()
    deadline = time.time() + 20
    while "converting" not in line and time.time() < deadline:
        line = p.stderr.readline()
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=30)
    assert p.returncode == 130, err
    assert "Traceback" not in err
    assert os.listdir(tmp_path) == []


def test_dry_run_writes_nothing(run, tmp_path):
    out = tmp_path / "q.gguf"
    r = run_cli(run, STORIES, out, "--dry-run")
    assert r.exit_code == 0 and not out.exists()
    lines = r.stdout.splitlines()
    assert lines[0].startswith("[   1/  48]") and "converting to q8_0" in lines[0]
    assert any(ln.startswith("quant size") for ln in lines) and "dry run" in lines[-1]


def test_dry_run_size_is_exact(run, tmp_path):
    out = tmp_path / "q.gguf"
    r = run_cli(run, STORIES, out, "--dry-run")
    want = int(r.stdout.splitlines()[-1].split()[2].replace(",", ""))
    assert run_cli(run, STORIES, out, "-q", "-t", "1").exit_code == 0
    assert out.stat().st_size == want


# ------------------------------------------------------------------------------------- npy / pool

def test_npy_input(run, tmp_path):
    x = np.random.default_rng(2).standard_normal((48, 96)).astype(np.float32)
    np.save(tmp_path / "w.npy", x)
    out = tmp_path / "w.gguf"
    r = run_cli(run, tmp_path / "w.npy", out, "--name", "blk.0.ffn_up.weight", "-q")
    assert r.exit_code == 0, r.output
    t = gguf.GGUFReader(str(out)).tensors[0]
    assert t.name == "blk.0.ffn_up.weight" and t.tensor_type == QT.Q4_0
    assert np.array_equal(np.asarray(t.data), gguf.quants.quantize(x, QT.Q4_0))


def test_threads_give_identical_bytes(run, tmp_path):
    rng = np.random.default_rng(4)
    big = rng.standard_normal((2048, 1536)).astype(np.float32)      # 12+12 MiB f32: pieces on 2 threads
    src = write_gguf(tmp_path / "big.gguf", {"blk.0.ffn_up.weight": big,
                                             "blk.0.ffn_down.weight": (gguf.quants.quantize(big, QT.Q8_0), QT.Q8_0)})
    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    assert run_cli(run, src, a, "-q", "-t", "1", "--allow-requantize").exit_code == 0
    r = run_cli(run, src, b, "-q", "-t", "2", "--allow-requantize")
    assert r.exit_code == 0, r.output
    assert a.read_bytes() == b.read_bytes()
    t = {t.name: t for t in gguf.GGUFReader(str(b)).tensors}
    assert np.array_equal(np.asarray(t["blk.0.ffn_up.weight"].data), gguf.quants.quantize(big, QT.Q4_0))
    x = gguf.quants.dequantize(gguf.quants.quantize(big, QT.Q8_0), QT.Q8_0)
    assert np.array_equal(np.asarray(t["blk.0.ffn_down.weight"].data), gguf.quants.quantize(x, QT.Q4_0))


def test_nan_index_in_a_piece_converted_on_a_thread(tmp_path):
    big = np.zeros((2048, 2048), np.float32)
    big[1900, 5] = np.inf
    src = write_gguf(tmp_path / "big.gguf", {"blk.0.ffn_up.weight": big})
    with pytest.raises(Exception, match=r"cannot quantize inf at index \(1900, 5\)"):
        QM.quantize_file(src, tmp_path / "o.gguf", QM.QuantizeOptions(threads=2))
    assert sorted(os.listdir(tmp_path)) == ["big.gguf"]


@pytest.mark.parametrize("qtype", ["q4_K", "q5_K", "q6_K"])
def test_k_quant_scale_overflow_is_an_error(run, tmp_path, qtype):
    """A K-quant block whose f16 super-block scale would be inf is refused, as q4_0's is (llama.cpp's
    ggml_validate_row_data refuses the file), and nothing is written."""
    w = np.full((2, 256), 1e10, np.float32)   # a scale near 1e10 / 4096: inf in f16 (largest 65504)
    w[:, ::2] = -1e10
    src = write_gguf(tmp_path / "big.gguf", {"blk.0.ffn_up.weight": w}, arch="llama")
    out = tmp_path / "q.gguf"
    r = run_cli(run, src, out, "-q", "--pure", "--type", qtype)
    assert r.exit_code == 1 and not out.exists()
    assert r.stderr.startswith(f"Error: tensor 'blk.0.ffn_up.weight': the {qtype} block at index (0, 0) holds values up to")
    assert "too large for its f16 scale (it would be inf)" in r.stderr


# ---------------------------------------------------------------------------- llama-quantize's options

def test_tensor_type_and_override_kv(run, tmp_path):
    out = tmp_path / "q.gguf"
    r = run_cli(run, STORIES, out, "--tensor-type", "FFN_UP=q8_0", "--tensor-type", "attn_q=f16",
                "--override-kv", "general.name=str:renamed", "--override-kv", "llama.context_length=int:-64",
                "--override-kv", "x.flag=bool:true", "-q", "-t", "1")
    assert r.exit_code == 0, r.output
    ty = types_of(out)
    assert ty["blk.0.ffn_up.weight"] == "Q8_0" and ty["blk.2.attn_q.weight"] == "F16"
    assert ty["blk.0.attn_k.weight"] == "Q4_0"
    f = gguf.GGUFReader(str(out)).fields
    keys = [k for k in f if not k.startswith("GGUF.")]
    # set last, each removed from where it was, as llama.cpp's gguf_set_val does; int is UINT32 of |value|
    assert keys[-3:] == ["general.name", "llama.context_length", "x.flag"]
    assert f["general.name"].contents() == "renamed" and f["llama.context_length"].contents() == 64
    assert f["llama.context_length"].types == [gguf.GGUFValueType.UINT32] and f["x.flag"].contents() is True
    r = run_cli(run, STORIES, out, "--override-kv", "general.name=text:x", "--force")
    assert r.exit_code == 2 and "TYPE must be int, float, bool or str" in r.stderr
    r = run_cli(run, STORIES, out, "--tensor-type", "ffn_up", "--force")
    assert r.exit_code == 2 and "expected PATTERN=TYPE" in r.stderr


def test_dry_run_json(run, tmp_path):
    out = tmp_path / "q.gguf"
    r = run_cli(run, STORIES, out, "--type", "Q5_K_M", "--dry-run", "--json")
    assert r.exit_code == 0 and not out.exists()
    doc = json.loads(r.stdout)
    assert doc["file_type"] == "Q5_K_M" and doc["general.file_type"] == 17 and doc["outputs"] == [str(out)]
    by = {t["name"]: t for t in doc["tensors"]}
    assert by["blk.0.attn_q.weight"]["type"] == "q5_1"
    assert by["blk.0.attn_q.weight"]["fallback"].startswith("ncols 64 not divisible by 256")
    assert by["blk.4.ffn_down.weight"]["reasons"] == ["ffn_down: use_more_bits(4, 5)"]
    assert doc["n_fallback"] == sum(t["fallback"] is not None for t in doc["tensors"])
    assert run_cli(run, STORIES, out, "--type", "Q5_K_M", "-q", "-t", "1").exit_code == 0
    assert out.stat().st_size == doc["file_bytes"]
    r = run_cli(run, STORIES, tmp_path / "x.gguf", "--json")
    assert r.exit_code == 2 and "--json describes the plan: use it with --dry-run" in r.stderr


@pytest.mark.parametrize("ftype, want", [("F16", "F16"), ("BF16", "BF16"), ("F32", "F32")])
def test_float_file_types(run, tmp_path, ftype, want):
    """F16/BF16/F32 files: every eligible tensor gets the type, GGML's rounding (the K-quant source of
    gemma is pinned whole by test_quantize_llama.py); no rule nor fallback applies."""
    from ggtool import quant as Q

    out = tmp_path / "f.gguf"
    assert run_cli(run, STORIES, out, "--type", ftype.lower(), "-q", "-t", "1").exit_code == 0
    src = {t.name: t for t in gguf.GGUFReader(str(STORIES)).tensors}
    r = gguf.GGUFReader(str(out))
    for t in r.tensors:
        if len(src[t.name].shape) == 1:
            assert t.tensor_type.name == "F32"
            continue
        assert t.tensor_type.name == want, t.name
        expect = Q.quantize(np.asarray(src[t.name].data, np.float32), want.lower())
        assert np.asarray(t.data).tobytes() == np.ascontiguousarray(expect).tobytes(), t.name
    assert r.fields["general.file_type"].contents() == {"F16": 1, "BF16": 32, "F32": 0}[ftype]


def test_moe_rows_take_their_experts_importances():
    """A 3-d weight's rows quantized in pieces: each expert's rows take its own importances, as
    llama.cpp's chunks stop at expert boundaries."""
    from ggtool import quant as Q

    rng = np.random.default_rng(5)
    x = rng.standard_normal((3, 4, 64)).astype(np.float32)          # 3 experts of 4 rows
    w = rng.uniform(0.1, 2, (3, 64)).astype(np.float32)
    want = b"".join(np.ascontiguousarray(Q.quantize(x[e], "q4_0", imatrix=w[e])).tobytes() for e in range(3))
    rows = x.reshape(12, 64)
    got = QM.convert_rows(rows[2:11], T.F32, T.Q4_0, "blk.0.ffn_up_exps.weight", (3, 4, 64), 2, imatrix=w)
    assert got == want[2 * 36: 11 * 36]
