"""Issue 30 figures: decode and prompt speed at 1, 2, 4, ... threads, ggtool against llama.cpp's
`llama-bench` on the same random-weight llama model, in the same run.

    python bench/bench_scaling.py [--shape issue|small] [--ftype Q4_0|Q4_K_M] [--seed 0]
        [--threads 1,2,4,...] [--repeat 3] [--prompt 512] [--gen 128]
        [--llama-bench /work/bench-env/build-native/bin/llama-bench] [--tree DIR] [--json OUT]

The model: a llama written with gguf-py from `--seed` (F16 matrices, F32 norms, normal weights of
scale 0.02; a SentencePiece vocabulary of <unk>, <s>, </s>, the 256 byte tokens and numbered pieces,
as llama.cpp loads it), then quantized to --ftype by ggtool's own quantizer (`ggtool quantize`,
llama-quantize's bytes). Shapes: `issue` (issue 30's: n_embd 2048, 4 layers, n_ff 5632, 16/4
heads, 32000 tokens, 311M parameters) and `small` (n_embd 256, 4 layers, n_ff 704, 8/4 heads,
32000 tokens, 19M parameters: the 2-core and oversubscription model). The files are kept in
--models-dir and made again only when missing.

Both sides, for each thread count (default 1, 2, 4, ... up to the CPUs this process may use, and
that count itself):
- llama.cpp: `llama-bench -m MODEL -t T -r 1 -p PROMPT -n 0` (prompt tokens/s, one batch from an empty
  cache) and `-p 0 -n GEN -d PROMPT` (tokens/s of GEN single-token steps after PROMPT tokens in the
  cache), its defaults otherwise (F16 K/V cache, flash attention auto, weights repacked);
- ggtool: `ggtool.generate.Session` over the shipped program of the model's architecture (what
  `ggtool generate` runs: llama's, gemma3's for --model gemma-3-270m), in
  a fresh process with a worker pool of T participants: a warm-up (the prompt and one step: kernels
  loaded, graphs built), then the prompt in one batch from an empty cache (timed), then GEN greedy
  steps after it (timed), as llama-bench times them.
Thread count 0 in --threads is ggtool's default rule (`ggtool.threads.choose` for the decode step,
as `ggtool generate` applies it): the count it picked and why are printed (llama.cpp is not run
for it). --busy N starts N processes that keep a CPU busy (a Python loop each) for the whole run:
the oversubscribed case, where a pool with more participants than free cores must not collapse.

Rounds (`--repeat`) interleave the two sides, thread count by thread count, so that a change in the
machine's load affects both alike; each figure is the median of the rounds; ratios are ggtool/llama.cpp
tokens/s (higher is better, 1.0 = as fast). Which kernels llama.cpp used is printed: its system_info
line (from `llama-completion` beside llama-bench: AVX512, AMX, REPACK ...) and the repacked layouts
llama-bench's verbose load reports. --tree DIR (repeatable) runs another checkout's ggtool side too
(PYTHONPATH=DIR), in the same rounds, to compare before and after a change on the same model;
--no-llama skips llama.cpp.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LLAMA_BENCH = "/work/bench-env/build-native/bin/llama-bench"

SHAPES = {
    "issue": dict(n_embd=2048, n_layer=4, n_ff=5632, n_head=16, n_head_kv=4, n_vocab=32000),
    "small": dict(n_embd=256, n_layer=4, n_ff=704, n_head=8, n_head_kv=4, n_vocab=32000),
}
FTYPES = ("Q4_0", "Q4_K_M", "Q8_0")


# -- the model ---------------------------------------------------------------------------------------
def vocab(n_vocab: int) -> tuple[list[str], list[float], list[int]]:
    """A SentencePiece ("llama") vocabulary llama.cpp accepts: <unk>, <s>, </s>, the 256 byte tokens
    (<0x00>..<0xFF>, byte fallback), then numbered pieces; tokens, scores and types."""
    import gguf

    tokens = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256))]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL] + [gguf.TokenType.BYTE] * 256
    i = 0
    while len(tokens) < n_vocab:
        tokens.append(f"\u2581w{i}")
        types.append(gguf.TokenType.NORMAL)
        i += 1
    scores = [0.0] * 259 + [-float(k) for k in range(n_vocab - 259)]
    return tokens, scores, types


def write_f16_model(path: Path, shape: dict, seed: int) -> None:
    """A random llama of `shape` (F16 matrices, F32 norms) written with gguf-py, the same bytes for a seed."""
    import gguf
    import numpy as np

    rng = np.random.default_rng(seed)
    e, ff, nh, nkv, nv = shape["n_embd"], shape["n_ff"], shape["n_head"], shape["n_head_kv"], shape["n_vocab"]
    hd = e // nh

    def mat(rows, cols, scale=0.02):
        return (rng.standard_normal((rows, cols), dtype=np.float32) * scale).astype(np.float16)

    def norm(n):
        return (1.0 + 0.1 * rng.standard_normal(n, dtype=np.float32)).astype(np.float32)

    tmp = path.with_suffix(".tmp")
    w = gguf.GGUFWriter(str(tmp), "llama")
    w.add_name(f"random-llama-{e}")
    w.add_context_length(4096)
    w.add_embedding_length(e)
    w.add_block_count(shape["n_layer"])
    w.add_feed_forward_length(ff)
    w.add_head_count(nh)
    w.add_head_count_kv(nkv)
    w.add_rope_dimension_count(hd)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    tokens, scores, types = vocab(nv)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_tensor("token_embd.weight", mat(nv, e, 1.0))
    for il in range(shape["n_layer"]):
        b = f"blk.{il}."
        w.add_tensor(b + "attn_norm.weight", norm(e))
        w.add_tensor(b + "attn_q.weight", mat(e, e))
        w.add_tensor(b + "attn_k.weight", mat(nkv * hd, e))
        w.add_tensor(b + "attn_v.weight", mat(nkv * hd, e))
        w.add_tensor(b + "attn_output.weight", mat(e, e))
        w.add_tensor(b + "ffn_norm.weight", norm(e))
        w.add_tensor(b + "ffn_gate.weight", mat(ff, e))
        w.add_tensor(b + "ffn_up.weight", mat(ff, e))
        w.add_tensor(b + "ffn_down.weight", mat(e, ff))
    w.add_tensor("output_norm.weight", norm(e))
    w.add_tensor("output.weight", mat(nv, e))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(tmp, path)


def model_path(models_dir: Path, shape_name: str, seed: int, ftype: str) -> Path:
    """The quantized model (made now if missing: the F16 file with gguf-py, then `ggtool quantize`)."""
    models_dir.mkdir(parents=True, exist_ok=True)
    out = models_dir / f"llama-{shape_name}-s{seed}-{ftype.lower()}.gguf"
    if out.exists():
        return out
    f16 = models_dir / f"llama-{shape_name}-s{seed}-f16.gguf"
    if not f16.exists():
        print(f"writing {f16} ...", file=sys.stderr)
        write_f16_model(f16, SHAPES[shape_name], seed)
    print(f"quantizing to {out} (ggtool quantize {ftype}) ...", file=sys.stderr)
    with tempfile.TemporaryDirectory() as cwd:   # a neutral working directory: the installed ggtool's command line
        subprocess.run([sys.executable, "-m", "ggtool", "quantize", str(f16), str(out), "--type", ftype, "--quiet"],
                       check=True, cwd=cwd)
    return out


def n_params(path: Path) -> int:
    import gguf
    import numpy as np

    return sum(int(np.prod(t.shape)) for t in gguf.GGUFReader(str(path)).tensors)


# -- llama.cpp -----------------------------------------------------------------------------------------
def llama_bench(exe: str, model: Path, threads: int, args: list[str]) -> float:
    """tokens/s of one llama-bench test (-r 1, after its own warm-up run)."""
    out = subprocess.run([exe, "-m", str(model), "-t", str(threads), "-r", "1", "-o", "json", *args],
                         check=True, capture_output=True, text=True).stdout
    rows = json.loads(out)
    return float(rows[0]["avg_ts"])


def llama_kernels(exe: str, model: Path) -> dict:
    """What llama.cpp ran with: system_info (llama-completion beside llama-bench: the CPU features
    its CPU backend was built for and uses: AVX512*, AMX*, REPACK) and llama-bench's verbose report
    of the weights it repacked and into which layout."""
    info = {"system_info": None, "repacked": {}, "cpu_info": None}
    comp = Path(exe).with_name("llama-completion")
    if comp.exists():
        try:
            r = subprocess.run([str(comp), "-m", str(model), "-p", "a", "-n", "1", "-t", "1", "--no-warmup", "-no-cnv"],
                               capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
            m = re.search(r"system_info: (.*)", r.stdout + r.stderr)
            info["system_info"] = m.group(1).strip() if m else None
        except (OSError, subprocess.TimeoutExpired):
            pass
    r = subprocess.run([exe, "-m", str(model), "-t", "1", "-r", "1", "-p", "8", "-n", "0", "-v", "-o", "json"],
                       capture_output=True, text=True)
    for layout in re.findall(r"repack: repack tensor \S+ with (\S+)", r.stderr):
        info["repacked"][layout] = info["repacked"].get(layout, 0) + 1
    try:
        info["cpu_info"] = json.loads(r.stdout)[0].get("cpu_info")
    except (ValueError, IndexError, KeyError):
        pass
    return info


# -- ggtool ----------------------------------------------------------------------------------------------
SIDE_GGTOOL_MAIN = r"""
import json, sys, time
args = json.loads(sys.argv[1])
from ggtool.pool.launch import prestart
prestart(args["threads"])             # as the command line: BLAS on one thread, workers forked
import numpy as np
from ggtool.dsl import parse
from ggtool.generate import Session, shipped_program

n = args["threads"]
from ggtool.gguf_io import open_gguf
program = shipped_program(open_gguf(args["model"]).metadata("general.architecture", "llama"))   # as ggtool generate
prompt = args["prompt_ids"]
session = Session(args["model"], parse(program.read_text(), str(program)), n_ctx=len(prompt) + args["gen"] + 1)
session.prepare(len(prompt), 1)
why = None
if n == 0:                            # the default rule, as `ggtool generate` applies it
    from ggtool.plan import estimate_work
    from ggtool.threads import choose
    c = choose(estimate_work(session.graph(1)), steps=args["gen"])
    n, why = c.n, c.reason
pool = None
if n > 1:
    from ggtool.pool import get_pool
    pool = get_pool(n)
session.n_threads, session.pool = n, pool
logits = session.eval(prompt)                       # warm-up: kernels loaded, graphs built, weights repacked
session.eval([int(np.argmax(logits))])
out = {"prompt_s": [], "decode_s": [], "threads": n, "why": why}
out.update(measure(session.eval, session.reset, prompt, args["gen"], args["runs"]))
print(json.dumps(out))
"""

# Both sides' timing protocol (after their warm-up): an empty cache, the prompt in one batch, then the
# greedy steps; wall and CPU time (process_time: this process's threads; one thread's CPU time is its
# work, whatever else the machine runs).
PROTOCOL = r"""
import time

def measure(eval_, reset, prompt, gen, runs):
    import numpy as np     # here: ggtool's side readies BLAS (prestart) before numpy loads
    out = {"prompt_s": [], "decode_s": [], "prompt_cpu": [], "decode_cpu": []}
    for _ in range(runs):
        reset()
        t, c = time.perf_counter(), time.process_time()
        logits = eval_(prompt)
        out["prompt_s"].append(time.perf_counter() - t)
        out["prompt_cpu"].append(time.process_time() - c)
        t, c = time.perf_counter(), time.process_time()
        for _ in range(gen):
            logits = eval_([int(np.argmax(logits))])
        out["decode_s"].append(time.perf_counter() - t)
        out["decode_cpu"].append(time.process_time() - c)
    return out
"""

# llama.cpp through llama-cpp-python (--llama-python, the library of --llama-bench's build): its own
# defaults (F16 K/V cache), a 512-token batch, the same protocol as ggtool's side.
LLAMA_SIDE = PROTOCOL + r"""
import json, sys
args = json.loads(sys.argv[1])
import llama_cpp
import numpy as np
n, prompt = args["threads"], args["prompt_ids"]
llm = llama_cpp.Llama(args["model"], n_ctx=len(prompt) + args["gen"] + 1, n_batch=512, n_ubatch=512, n_threads=n,
                      n_threads_batch=n, verbose=False)
n_vocab = llm.n_vocab()
def eval_(ids):
    llm.eval(ids)
    return np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(n_vocab,)).copy()
eval_([int(np.argmax(eval_(prompt)))])              # warm-up
out = measure(eval_, llm.reset, prompt, args["gen"], args["runs"])
out["system_info"] = llama_cpp.llama_print_system_info().decode()
print(json.dumps(out))
"""


SIDE_GGTOOL = None     # PROTOCOL + SIDE_GGTOOL_MAIN, below


def llama_python_side(python: str, lib: str, model: Path, threads: int, prompt_ids: list[int], gen: int) -> dict:
    """One llama-cpp-python process's timings (wall and CPU) at `threads`."""
    env = dict(os.environ, LLAMA_CPP_LIB_PATH=lib)
    arg = json.dumps({"model": str(model), "threads": threads, "prompt_ids": prompt_ids, "gen": gen, "runs": 1})
    with tempfile.TemporaryDirectory() as cwd:
        r = subprocess.run([python, "-c", LLAMA_SIDE, arg], capture_output=True, text=True, env=env, cwd=cwd)
    if r.returncode:
        raise SystemExit(f"llama-cpp-python side failed ({r.returncode}) at {threads} threads:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def ggtool_side(model: Path, threads: int, prompt_ids: list[int], gen: int, runs: int, tree: Path | None) -> dict:
    """One ggtool process's timings at `threads` participants (0: the default rule's count, reported
    with its reason)."""
    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(tree), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    arg = json.dumps({"model": str(model), "threads": threads, "prompt_ids": prompt_ids, "gen": gen, "runs": runs})
    with tempfile.TemporaryDirectory() as cwd:   # a neutral working directory
        r = subprocess.run([sys.executable, "-c", SIDE_GGTOOL, arg], capture_output=True, text=True, env=env, cwd=cwd)
    if r.returncode:
        raise SystemExit(f"ggtool side failed ({r.returncode}) at {threads} threads:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


# -- the run ---------------------------------------------------------------------------------------------
SIDE_GGTOOL = PROTOCOL + SIDE_GGTOOL_MAIN


def default_threads_list() -> list[int]:
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    out, t = [], 1
    while t < cpus:
        out.append(t)
        t *= 2
    return out + [cpus]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="issue")
    ap.add_argument("--ftype", choices=FTYPES, default="Q4_0")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--model", type=Path, help="a GGUF llama model to use instead of the random one")
    ap.add_argument("--models-dir", type=Path, default=Path(tempfile.gettempdir()) / "ggtool-bench-scaling")
    ap.add_argument("--threads", help="comma list (default: 1, 2, 4, ... up to the CPUs)")
    ap.add_argument("--repeat", type=int, default=3, help="interleaved rounds; medians shown")
    ap.add_argument("--prompt", type=int, default=512, help="prompt tokens (and the depth of the decode test)")
    ap.add_argument("--gen", type=int, default=128, help="decode steps timed")
    ap.add_argument("--llama-bench", default=LLAMA_BENCH)
    ap.add_argument("--no-llama", action="store_true", help="ggtool alone")
    ap.add_argument("--llama-python", help="time llama.cpp through llama-cpp-python in this Python instead of "
                    "llama-bench (the library of --llama-bench's build; wall and CPU time, ggtool's protocol)")
    ap.add_argument("--tree", type=Path, action="append", default=[],
                    help="another checkout's ggtool, measured in the same rounds (PYTHONPATH=TREE; repeatable)")
    ap.add_argument("--json", type=Path, help="write the record here too")
    ap.add_argument("--busy", type=int, default=0, help="processes keeping a CPU busy meanwhile (oversubscription)")
    a = ap.parse_args()

    import numpy as np

    threads = [int(t) for t in a.threads.split(",")] if a.threads else default_threads_list()
    model = a.model or model_path(a.models_dir, a.shape, a.seed, a.ftype)
    use_llama = not a.no_llama and os.access(a.llama_bench, os.X_OK)
    if not a.no_llama and not use_llama:
        print(f"no llama-bench at {a.llama_bench}: ggtool alone", file=sys.stderr)
    rng = np.random.default_rng(a.seed + 1)
    prompt_ids = [1, *(int(t) for t in rng.integers(259, 32000 if a.model is None else 259 + 1000, a.prompt - 1))]

    record = {"model": str(model), "shape": None if a.model else dict(SHAPES[a.shape], name=a.shape),
              "ftype": None if a.model else a.ftype, "params": n_params(model), "prompt": a.prompt, "gen": a.gen,
              "threads": threads, "repeat": a.repeat, "cpus": os.cpu_count(), "machine": platform.processor() or platform.machine(),
              "loadavg_before": os.getloadavg(), "trees": [str(ROOT), *map(str, a.tree)], "rounds": []}
    if use_llama:
        record["llama_cpp"] = llama_kernels(a.llama_bench, model)
    record["busy"] = a.busy
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(a.busy)]
    try:
        run_rounds(a, record, model, threads, prompt_ids, use_llama)
    finally:
        for p in busy:
            p.kill()
            p.wait()
    report(a, record, model, threads, use_llama)


def run_rounds(a, record, model, threads, prompt_ids, use_llama) -> None:
    t0 = time.time()
    for r in range(a.repeat):
        for t in threads:
            row = {"round": r, "threads": t, "loadavg": os.getloadavg()[0]}
            if use_llama and t > 0 and a.llama_python:
                g = llama_python_side(a.llama_python, str(Path(a.llama_bench).parent), model, t, prompt_ids, a.gen)
                row["llama_prompt_tps"], row["llama_decode_tps"] = a.prompt / g["prompt_s"][0], a.gen / g["decode_s"][0]
                row["llama_prompt_cpu_tps"] = a.prompt / g["prompt_cpu"][0]
                row["llama_decode_cpu_tps"] = a.gen / g["decode_cpu"][0]
            elif use_llama and t > 0:
                row["llama_prompt_tps"] = llama_bench(a.llama_bench, model, t, ["-p", str(a.prompt), "-n", "0"])
                row["llama_decode_tps"] = llama_bench(a.llama_bench, model, t, ["-p", "0", "-n", str(a.gen),
                                                                                 "-d", str(a.prompt)])
            for k, tree in enumerate([None, *a.tree]):
                g = ggtool_side(model, t, prompt_ids, a.gen, 1, tree)
                sfx = "" if tree is None else f"_{k}"
                row[f"ggtool{sfx}_prompt_tps"] = a.prompt / g["prompt_s"][0]
                row[f"ggtool{sfx}_decode_tps"] = a.gen / g["decode_s"][0]
                row[f"ggtool{sfx}_prompt_cpu_tps"] = a.prompt / g["prompt_cpu"][0]
                row[f"ggtool{sfx}_decode_cpu_tps"] = a.gen / g["decode_cpu"][0]
                if t == 0:
                    row[f"ggtool{sfx}_chose"], row[f"ggtool{sfx}_why"] = g["threads"], g["why"]
            record["rounds"].append(row)
            print(json.dumps(row), file=sys.stderr)
    record["seconds"] = time.time() - t0
    record["loadavg_after"] = os.getloadavg()


def report(a, record, model, threads, use_llama) -> None:
    summary = []
    for t in threads:
        rows = [x for x in record["rounds"] if x["threads"] == t]
        s = {"threads": t}
        for k in rows[0]:
            if k.endswith("_tps"):
                s[k] = statistics.median(x[k] for x in rows)
            elif k.endswith(("_chose", "_why")):
                s[k] = [x[k] for x in rows]
        if use_llama and t > 0:
            s["prompt_ratio"] = s["ggtool_prompt_tps"] / s["llama_prompt_tps"]
            s["decode_ratio"] = s["ggtool_decode_tps"] / s["llama_decode_tps"]
        summary.append(s)
    record["summary"] = summary

    what = f"{a.shape} random llama, {a.ftype}" if a.model is None else str(model)
    print(f"{what}: {record['params'] / 1e6:.0f}M parameters; prompt {a.prompt} tokens, decode {a.gen} tokens after "
          f"{a.prompt}; median of {a.repeat} interleaved rounds; {os.cpu_count()} CPUs, load "
          f"{record['loadavg_before'][0]:.1f} -> {record['loadavg_after'][0]:.1f}"
          f"{f'; {a.busy} busy processes meanwhile' if a.busy else ''}")
    if use_llama:
        info = record["llama_cpp"]
        print(f"llama.cpp ({a.llama_bench}): {info.get('cpu_info')}; system_info: {info.get('system_info')}")
        print(f"llama.cpp repacked: {', '.join(f'{n} tensors as {k}' for k, n in info['repacked'].items()) or 'nothing'}")
    head = f"{'threads':>7s} {'decode ggtool':>14s} {'llama.cpp':>10s} {'ratio':>6s}   {'prompt ggtool':>14s} {'llama.cpp':>10s} {'ratio':>6s}"
    print(head)
    for s in summary:
        ref = use_llama and s["threads"] > 0
        line = f"{s['threads'] or 'default':>7} {s['ggtool_decode_tps']:14.1f} "
        line += f"{s['llama_decode_tps']:10.1f} {s['decode_ratio']:5.2f}x   " if ref else f"{'':10s} {'':6s}   "
        line += f"{s['ggtool_prompt_tps']:14.1f} "
        line += f"{s['llama_prompt_tps']:10.1f} {s['prompt_ratio']:5.2f}x" if ref else ""
        print(line)
        if "ggtool_chose" in s:
            print(f"{'':7s} the default chose {'/'.join(map(str, sorted(set(s['ggtool_chose']))))}: {s['ggtool_why'][0]}")
    for k, tree in enumerate(a.tree, 1):
        print(f"tree {k} ({tree}):")
        for s in summary:
            ref = use_llama and s["threads"] > 0
            line = f"{s['threads'] or 'default':>7} {s[f'ggtool_{k}_decode_tps']:14.1f} "
            line += (f"{'':10s} {s[f'ggtool_{k}_decode_tps'] / s['llama_decode_tps']:5.2f}x   " if ref
                     else f"{'':10s} {'':6s}   ")
            line += f"{s[f'ggtool_{k}_prompt_tps']:14.1f} "
            line += f"{'':10s} {s[f'ggtool_{k}_prompt_tps'] / s['llama_prompt_tps']:5.2f}x" if ref else ""
            print(line)
    one = next((s for s in summary if s["threads"] == 1), None)
    if one is not None and "llama_decode_cpu_tps" in one:    # one thread: CPU time is the work, whatever the load
        print(f"one thread, tokens per CPU second: decode ggtool {one['ggtool_decode_cpu_tps']:.1f}, llama.cpp "
              f"{one['llama_decode_cpu_tps']:.1f} ({one['ggtool_decode_cpu_tps'] / one['llama_decode_cpu_tps']:.2f}x); "
              f"prompt {one['ggtool_prompt_cpu_tps']:.1f} / {one['llama_prompt_cpu_tps']:.1f} "
              f"({one['ggtool_prompt_cpu_tps'] / one['llama_prompt_cpu_tps']:.2f}x)")
        for k, tree in enumerate(a.tree, 1):
            print(f"  tree {k}: decode {one[f'ggtool_{k}_decode_cpu_tps']:.1f} "
                  f"({one[f'ggtool_{k}_decode_cpu_tps'] / one['llama_decode_cpu_tps']:.2f}x), prompt "
                  f"{one[f'ggtool_{k}_prompt_cpu_tps']:.1f} ({one[f'ggtool_{k}_prompt_cpu_tps'] / one['llama_prompt_cpu_tps']:.2f}x)")
    counted = sorted((s for s in summary if s["threads"] > 0), key=lambda s: s["threads"])
    if len(counted) > 1:
        first, last = counted[0], counted[-1]      # the fewest threads to the most, in any --threads order
        msg = f"scaling {first['threads']} -> {last['threads']} threads: decode ggtool {last['ggtool_decode_tps'] / first['ggtool_decode_tps']:.2f}x"
        if use_llama:
            msg += f", llama.cpp {last['llama_decode_tps'] / first['llama_decode_tps']:.2f}x"
        print(msg)
    if a.json:
        a.json.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
