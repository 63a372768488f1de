"""`quantize --imatrix`: whole files byte for byte llama-quantize's with the same importance matrix
(tests/golden/quantize/imatrix-files.json: stories260K with llama-imatrix's GGUF and legacy .dat of
tests/golden/imatrix/), and llama.cpp's rules around it: the ffn_down bump of Q4_0/Q5_0 with an
imatrix, Q2_K_S's requirement, entries missing or of another size."""

from __future__ import annotations

import hashlib
import importlib.util
import json
from pathlib import Path

import gguf
import numpy as np
import pytest
from conftest import fails, write_gguf

from ggtool import quantize_model as QM
from ggtool import types as T
from ggtool.imatrix import Imatrix, read_imatrix

ROOT = Path(__file__).resolve().parent.parent
STORIES = ROOT / "fixtures" / "stories260K.gguf"
IMATRIX_DIR = ROOT / "tests" / "golden" / "imatrix"
FILES = json.loads((ROOT / "tests" / "golden" / "quantize" / "imatrix-files.json").read_text())
_SPEC = importlib.util.spec_from_file_location("make_imatrix_files", ROOT / "tests" / "golden" / "quantize" / "make_imatrix_files.py")
MAKE = importlib.util.module_from_spec(_SPEC)      # its CASES: each case's options, as llama-quantize was given them
_SPEC.loader.exec_module(MAKE)


@pytest.mark.parametrize("case", list(FILES))
def test_file_is_llama_quantizes(run, tmp_path, monkeypatch, case):
    ftype, fmt, *_ = case.split()
    extra = MAKE.CASES[case][2]
    monkeypatch.chdir(IMATRIX_DIR)        # the name given is recorded (quantize.imatrix.file), as llama.cpp's
    out = tmp_path / "q.gguf"
    r = run("quantize", STORIES, out, "--type", ftype, "--imatrix", f"stories260K-imatrix.{fmt}", *extra, "-q", "-t", "2")
    assert r.exit_code == 0, r.output
    assert out.stat().st_size == FILES[case]["bytes"]
    assert hashlib.sha256(out.read_bytes()).hexdigest() == FILES[case]["sha256"]


def test_metadata_records_the_importance_matrix(run, tmp_path, monkeypatch):
    monkeypatch.chdir(IMATRIX_DIR)
    out = tmp_path / "q.gguf"
    r = run("quantize", STORIES, out, "--imatrix", "stories260K-imatrix.gguf", "--override-kv", "general.name=str:x", "-q")
    assert r.exit_code == 0, r.output
    f = gguf.GGUFReader(str(out)).fields
    keys = [k for k in f if not k.startswith("GGUF.")]
    # set last, in llama-quantize's order: the file type, the user's overrides, then the imatrix's keys
    assert keys[-7:] == ["general.quantization_version", "general.file_type", "general.name", "quantize.imatrix.file",
                         "quantize.imatrix.dataset", "quantize.imatrix.entries_count", "quantize.imatrix.chunks_count"]
    assert f["quantize.imatrix.file"].contents() == "stories260K-imatrix.gguf"
    assert f["general.name"].contents() == "x"


def _model(tmp_path, cols=256, layers=8):
    rng = np.random.default_rng(1)
    ts = {"token_embd.weight": rng.standard_normal((32, cols)).astype(np.float32)}
    for i in range(layers):
        ts[f"blk.{i}.ffn_down.weight"] = rng.standard_normal((8, cols)).astype(np.float32)
        ts[f"blk.{i}.attn_q.weight"] = rng.standard_normal((8, cols)).astype(np.float32)
    return write_gguf(tmp_path / "m.gguf", ts, arch="llama", kv={"llama.block_count": layers}), ts


def test_q4_0_with_an_imatrix_bumps_the_first_ffn_down(tmp_path):
    src, ts = _model(tmp_path, cols=64)
    w = Imatrix("w.dat", {n: np.linspace(0.5, 2, 64, dtype=np.float32) for n in ts})
    plan = QM.plan_quantization(src, QM.QuantizeOptions(type="Q4_0", imatrix=w))
    by = {t.name: t for t in plan.tensors}
    assert by["blk.0.ffn_down.weight"].dst_type == T.GGMLType.Q4_1          # layer 0 < 8/8
    assert by["blk.0.ffn_down.weight"].reasons == ("ffn_down: imatrix, layer 0 < 8/8",)
    assert by["blk.1.ffn_down.weight"].dst_type == T.Q4_0
    assert np.array_equal(by["blk.1.attn_q.weight"].imatrix, w.values["blk.1.attn_q.weight"])
    assert QM.plan_quantization(src, QM.QuantizeOptions(type="Q4_0")).tensors[1].dst_type == T.Q4_0


def test_q2_k_s_needs_an_importance_matrix(run, tmp_path):
    src, ts = _model(tmp_path)
    out = tmp_path / "q.gguf"
    fails(run("quantize", src, out, "--type", "q2_k_s"),
          "file type Q2_K_S needs an importance matrix: tensor 'blk.0.attn_q.weight' (q2_K)")
    assert not out.exists()
    # a dry run shows the plan (as llama-quantize's completes), then refuses as the real run does
    r = run("quantize", src, out, "--type", "Q2_K_S", "--dry-run")
    assert r.exit_code == 1 and not out.exists() and "blk.0.attn_q.weight" in r.stdout
    assert r.stderr.splitlines() == ["Error: file type Q2_K_S needs an importance matrix: tensor 'blk.0.attn_q.weight' "
                                     "(q2_K) would be garbage without one (llama.cpp refuses it); give one with "
                                     "--imatrix FILE (made by ggtool imatrix or llama-imatrix)"]
    assert "would write" not in r.stdout
    # one entry missing: that tensor cannot be quantized (llama.cpp: "Missing importance matrix for tensor")
    w = {n: np.ones(256, np.float32) for n in ts if n != "blk.3.ffn_down.weight"}
    with pytest.raises(QM.ImatrixRequiredError) as e:
        QM.plan_quantization(src, QM.QuantizeOptions(type="Q2_K_S", imatrix=Imatrix("w", w)))
    assert (e.value.tensor, e.value.missing_entry) == ("blk.3.ffn_down.weight", True)
    w["blk.3.ffn_down.weight"] = np.ones(256, np.float32)
    plan = QM.plan_quantization(src, QM.QuantizeOptions(type="Q2_K_S", imatrix=Imatrix("w", w)))
    assert {t.name: t.dst_type for t in plan.tensors}["blk.0.ffn_down.weight"] == T.GGMLType.Q4_K   # layer 0 < 8/8


def test_missing_entries_warn_and_other_sizes_fail(run, tmp_path):
    src, ts = _model(tmp_path, cols=64)
    w = {n: np.ones(64, np.float32) for n in ts if n != "blk.2.attn_q.weight"}
    plan = QM.plan_quantization(src, QM.QuantizeOptions(type="Q4_0", imatrix=Imatrix("w", w)))
    assert plan.warnings == ["did not find importance weights for blk.2.attn_q.weight; quantized without"]
    w["blk.2.attn_q.weight"] = np.ones(32, np.float32)
    with pytest.raises(Exception, match="imatrix size 32 is different from tensor size 64 for blk.2.attn_q.weight"):
        QM.plan_quantization(src, QM.QuantizeOptions(type="Q4_0", imatrix=Imatrix("w", w)))
    # the token embedding of another size is quantized without, with a warning (llama.cpp's exception)
    w["blk.2.attn_q.weight"], w["token_embd.weight"] = np.ones(64, np.float32), np.ones(8, np.float32)
    plan = QM.plan_quantization(src, QM.QuantizeOptions(type="Q4_0", imatrix=Imatrix("w", w)))
    assert "token_embd.weight: the importance matrix's entry has another size" in plan.warnings[0]
    bad = tmp_path / "bad.dat"
    bad.write_bytes(b"\x05\x00\x00\x00")
    fails(run("quantize", src, tmp_path / "q.gguf", "--imatrix", bad), f"--imatrix {bad}:")


def test_the_imatrix_reader_is_the_one_quantize_uses():
    assert read_imatrix(IMATRIX_DIR / "stories260K-imatrix.gguf").values.keys() == \
        read_imatrix(IMATRIX_DIR / "stories260K-imatrix.dat").values.keys()
