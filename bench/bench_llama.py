"""Issue 5 figures: the 16-token llama forward pass of fixtures/stories260K.gguf, timed in one run.

    python bench/bench_llama.py [--runs N]

Three implementations of the same forward pass (sequence 1 of tests/golden/llama, 16 tokens), each
checked against llama.cpp's logits before it is timed:

- numpy: a plain float32 numpy forward (below), weights already loaded as numpy arrays (same BLAS);
- engine: ggtool/programs/llama.gg through the Python API: `compute` alone on a built graph (steady state,
  what a caller that keeps the graph pays), and parse + build + compute (a fresh graph each time);
  1 thread in-process, 2 threads on a `WorkerPool` (two processes; the pool is started once);
- CLI: `python -m ggtool compute -f ggtool/programs/llama.gg ... -o logits.npy` in a fresh process, with
  `--threads 1` and `--threads 2`, against the numpy forward run the same way in a fresh process
  (`python bench/bench_llama.py --numpy-cli`, which loads the GGUF with gguf-py and writes the .npy).

Ratios are ggtool time / numpy time (lower is better; 1.0 = as fast as numpy). The implementations
are timed in interleaved rounds, so a change in the machine's load affects them alike.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
PROGRAM = ROOT / "ggtool" / "programs" / "llama.gg"
STORIES = ROOT / "fixtures" / "stories260K.gguf"
GOLDEN = ROOT / "tests" / "golden" / "llama" / "stories260K-logits.npz"


# -- the plain numpy forward pass ------------------------------------------------------------------------------
def load_model(path) -> tuple[dict, dict]:
    """(hyperparameters, weights as float32 numpy arrays in numpy order: a matrix is [out, in])."""
    import gguf

    reader = gguf.GGUFReader(str(path))

    def meta(key, default=None):
        f = reader.fields.get(key)
        return default if f is None else f.contents()

    arch = meta("general.architecture")
    n_embd, n_head = meta(f"{arch}.embedding_length"), meta(f"{arch}.attention.head_count")
    head_dim = meta(f"{arch}.attention.key_length", n_embd // n_head)
    hp = {"n_layer": meta(f"{arch}.block_count"), "n_head": n_head,
          "n_head_kv": meta(f"{arch}.attention.head_count_kv", n_head), "head_dim": head_dim,
          "n_rot": meta(f"{arch}.rope.dimension_count", head_dim),
          "eps": meta(f"{arch}.attention.layer_norm_rms_epsilon"),
          "freq_base": meta(f"{arch}.rope.freq_base", 10000.0)}
    weights = {t.name: np.asarray(t.data, dtype=np.float32).reshape([int(n) for n in reversed(t.shape)])
               for t in reader.tensors}
    return hp, weights


def numpy_forward(hp: dict, w: dict, tokens) -> np.ndarray:
    """logits [n_tokens, n_vocab] in float32, the steps of tests/golden/llama/README.md."""
    f32 = np.float32
    T, H, Hkv, D, n_rot = len(tokens), hp["n_head"], hp["n_head_kv"], hp["head_dim"], hp["n_rot"]
    eps = f32(hp["eps"])

    def rms_norm(x, g):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * g

    pos = np.arange(T, dtype=f32)[:, None]
    inv = f32(hp["freq_base"]) ** (-np.arange(0, n_rot, 2, dtype=f32) / f32(n_rot))
    cos, sin = np.cos(pos * inv)[:, None, :], np.sin(pos * inv)[:, None, :]   # [T, 1, n_rot/2]

    def rope(x):                               # x [T, heads, D]: rotate adjacent pairs (mode 0)
        y = x.copy()
        x0, x1 = x[..., 0:n_rot:2], x[..., 1:n_rot:2]
        y[..., 0:n_rot:2] = x0 * cos - x1 * sin
        y[..., 1:n_rot:2] = x0 * sin + x1 * cos
        return y

    mask = np.triu(np.full((T, T), -np.inf, dtype=f32), 1)
    x = w["token_embd.weight"][np.asarray(tokens)]
    for il in range(hp["n_layer"]):
        b = f"blk.{il}."
        h = rms_norm(x, w[b + "attn_norm.weight"])
        q = rope((h @ w[b + "attn_q.weight"].T).reshape(T, H, D))
        k = rope((h @ w[b + "attn_k.weight"].T).reshape(T, Hkv, D))
        v = (h @ w[b + "attn_v.weight"].T).reshape(T, Hkv, D)
        k, v = np.repeat(k, H // Hkv, axis=1), np.repeat(v, H // Hkv, axis=1)   # query head j: kv head j // g
        att = np.einsum("thd,shd->hts", q, k) * f32(1 / np.sqrt(D)) + mask
        att = np.exp(att - att.max(axis=-1, keepdims=True))
        att /= att.sum(axis=-1, keepdims=True)
        o = np.einsum("hts,shd->thd", att, v).reshape(T, H * D)
        x = x + o @ w[b + "attn_output.weight"].T
        h = rms_norm(x, w[b + "ffn_norm.weight"])
        g = h @ w[b + "ffn_gate.weight"].T
        x = x + ((g / (1 + np.exp(-g))) * (h @ w[b + "ffn_up.weight"].T)) @ w[b + "ffn_down.weight"].T
    return (rms_norm(x, w["output_norm.weight"]) @ w["output.weight"].T).astype(f32)


# -- timing ----------------------------------------------------------------------------------------------------
def interleaved(fns: dict, runs: int, pick=min) -> dict:
    """Time every fn `runs` times in rounds (one call of each per round, so a change in the machine's
    load hits all of them alike) after one warm-up round; `pick` (min or median) of each."""
    times = {k: [] for k in fns}
    for r in range(runs + 1):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            if r:
                times[k].append(time.perf_counter() - t0)
    return {k: pick(v) for k, v in times.items()}


def command(cmd: list[str]):
    return lambda: subprocess.run(cmd, check=True, capture_output=True, cwd=ROOT)


def check(logits: np.ndarray, ref: np.ndarray, what: str) -> None:
    diff = float(np.abs(logits - ref).max())
    same = bool((logits.argmax(1) == ref.argmax(1)).all())
    print(f"  {what:<28} max |diff| vs llama.cpp {diff:.2e}, argmax {'same' if same else 'DIFFERENT'}")
    assert diff <= 1e-3 and same, what


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=20, help="timed repetitions (in-process: best of; CLI: median of "
                    "a quarter as many)")
    ap.add_argument("--numpy-cli", nargs=2, metavar=("TOKENS_JSON", "OUT_NPY"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.numpy_cli:                         # the numpy forward as a command, for the CLI comparison
        hp, w = load_model(STORIES)
        np.save(args.numpy_cli[1], numpy_forward(hp, w, json.loads(args.numpy_cli[0])))
        return

    import ggtool
    from ggtool.dsl import build, parse
    from ggtool.pool import WorkerPool
    from ggtool.tensor_io import Inputs, parse_source

    z = np.load(GOLDEN)
    tokens, ref = z["tokens_1"], z["logits_1"]
    tokens_json = json.dumps([int(t) for t in tokens]).replace(" ", "")
    T = len(tokens)
    print(f"llama forward pass, {STORIES.name}, {T} tokens")

    hp, w = load_model(STORIES)
    check(numpy_forward(hp, w, tokens), ref, "numpy")
    source = PROGRAM.read_text()

    def fresh():
        inputs = Inputs([parse_source("tokens", "i32:" + tokens_json)], [str(STORIES)])
        return build(parse(source, str(PROGRAM)), ggtool.Context(), inputs)

    built = fresh()
    logits = built.outputs[0][1]
    ggtool.graph_compute(built.graph, 1)
    check(logits.numpy().reshape(T, -1), ref, "engine, 1 thread")
    pool = WorkerPool(2)
    try:
        ggtool.graph_compute(built.graph, 2, pool=pool)
        check(logits.numpy().reshape(T, -1), ref, "engine, 2 threads (pool)")

        runs = args.runs
        t = interleaved({"np": lambda: numpy_forward(hp, w, tokens),
                         "c1": lambda: ggtool.graph_compute(built.graph, 1),
                         "c2": lambda: ggtool.graph_compute(built.graph, 2, pool=pool),
                         "b1": lambda: ggtool.graph_compute(fresh().graph, 1),
                         "b2": lambda: ggtool.graph_compute(fresh().graph, 2, pool=pool)}, runs)
        t_np, t_c1, t_c2, t_b1, t_b2 = t["np"], t["c1"], t["c2"], t["b1"], t["b2"]
    finally:
        pool.close()

    cli = [sys.executable, "-m", "ggtool", "compute", "-f", str(PROGRAM), "--gguf", str(STORIES),
           "--tensor", "tokens=i32:" + tokens_json, "-o", "/tmp/bench_llama_logits.npy"]
    cli_runs = max(3, runs // 4)
    for n in (1, 2):
        command(cli + ["--threads", str(n)])()
        check(np.load("/tmp/bench_llama_logits.npy"), ref, f"CLI, --threads {n}")
    numpy_cli = [sys.executable, str(Path(__file__).resolve()), "--numpy-cli", tokens_json, "/tmp/bench_llama_numpy.npy"]
    command(numpy_cli)()
    check(np.load("/tmp/bench_llama_numpy.npy"), ref, "numpy script")
    t = interleaved({"np": command(numpy_cli), "1": command(cli + ["--threads", "1"]),
                     "2": command(cli + ["--threads", "2"])}, cli_runs, pick=statistics.median)
    t_npcli, t_cli1, t_cli2 = t["np"], t["1"], t["2"]

    print()
    print(f"in-process, best of {runs} (interleaved):")
    print(f"  numpy forward (weights loaded)          {t_np * 1e3:8.2f} ms")
    for what, t in (("engine compute, 1 thread", t_c1), ("engine compute, 2 threads (pool)", t_c2),
                    ("engine parse+build+compute, 1 thread", t_b1),
                    ("engine parse+build+compute, 2 threads", t_b2)):
        print(f"  {what:<40}{t * 1e3:8.2f} ms   ratio {t / t_np:6.2f}x numpy")
    print(f"  2 threads / 1 thread (compute)          {t_c2 / t_c1:8.2f}x")
    print(f"fresh process, median of {cli_runs} (interleaved):")
    print(f"  numpy script (import, load GGUF, forward, save)  {t_npcli * 1e3:8.1f} ms")
    for what, t in (("ggtool compute --threads 1", t_cli1),
                    ("ggtool compute --threads 2 (worker pool)",
                     t_cli2)):
        print(f"  {what:<49}{t * 1e3:8.1f} ms   ratio {t / t_npcli:5.2f}x numpy script")


if __name__ == "__main__":
    main()
