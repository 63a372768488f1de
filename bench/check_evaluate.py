"""`ggtool perplexity` and `ggtool imatrix` against llama-perplexity and llama-imatrix, in one run, on
real models (docs/evaluate.md has the figures). Nothing is written to the repository.

    python bench/check_evaluate.py LLAMA_BIN --pair BASE.gguf QUANT.gguf [--pair ...] [--ctx 128 512]
        [--chunks 8 4] [--text fixtures/genesis.txt] [--threads 2] [--numerics llama.cpp]
        [--imatrix MODEL.gguf ...] [--quant-types Q4_K_M IQ4_NL Q2_K] [--top-k 32] [--avx2-bin DIR]

LLAMA_BIN holds llama-perplexity, llama-imatrix and llama-quantize (the bench environment's
build-native/bin). Every llama.cpp run has `-fa off -ctk f32 -ctv f32` (the graph ggtool computes)
and the same thread count as ggtool's. For each --pair and context (with --chunks chunks), both
tools write the BASE model's base-logits file and report PPL; then both read each file with QUANT:

- PPL, and every KL-divergence line llama-perplexity prints, side by side: equal, or the largest
  difference in units of the last digit printed;
- whether the two base files are byte-identical; each tool's statistics from the other's file;
- wall seconds, tokens/s and peak RSS of each run (on a shared machine: read the ratios);
- with --top-k K, ggtool's top-K base file: its size, and its mean KLD against the full file's.

For each --imatrix model: both tools' importance matrices (first context, its chunks): entries,
counts, the largest relative in_sum2 difference, byte identity; then `ggtool quantize` of the model
with each (copied to one path, so the recorded file name is the same) to each --quant-types, and
whether the outputs are byte-identical.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
NUM = r"-?\d+\.\d+"


def timed(cmd: list, cwd=None) -> tuple[str, float, int]:
    """(stdout + stderr, wall seconds, peak RSS in KiB) of one command (GNU time's %M)."""
    t = time.perf_counter()
    p = subprocess.run(["/usr/bin/time", "-f", "__RSS__ %M", *map(str, cmd)], cwd=cwd, capture_output=True, text=True,
                       errors="replace")
    wall = time.perf_counter() - t
    out = p.stdout + p.stderr
    if p.returncode:
        sys.exit(f"failed ({p.returncode}): {' '.join(map(str, cmd))}\n{out[-3000:]}")
    rss = int(re.findall(r"__RSS__ (\d+)", out)[-1])
    return out, wall, rss


def numbers(out: str) -> dict[str, str]:
    """The lines llama.cpp (and ggtool, which prints the same) gives its figures on, by label."""
    text = re.sub(r"\d+\.\d+\.\d+\.\d+ [IWE] ", "\n", out)
    got = {}
    for line in text.splitlines():
        m = re.match(r"Final estimate: PPL = (" + NUM + r") \+/- (" + NUM + ")", line)
        if m:
            got["PPL"] = line.strip()
        elif ":" in line and re.match(r"^(Mean|Maximum|Median|Minimum|Cor|RMS|Same top|\s?\d+\.\d%)", line):
            got[line.split(":")[0].strip()] = line.strip()
    return got


def digits_apart(a: str, b: str) -> float:
    """The largest difference between the numbers of two lines, in units of b's last printed digit."""
    na, nb = re.findall(NUM, a), re.findall(NUM, b)
    if len(na) != len(nb):
        return float("inf")
    worst = 0.0
    for x, y in zip(na, nb):
        worst = max(worst, abs(float(x) - float(y)) / 10 ** -len(y.split(".")[1]))
    return round(worst, 3)


def sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bin")
    ap.add_argument("--pair", nargs=2, action="append", default=[], metavar=("BASE", "QUANT"))
    ap.add_argument("--ctx", nargs="+", type=int, default=[128, 512])
    ap.add_argument("--chunks", nargs="+", type=int, default=[8, 4])
    ap.add_argument("--text", default=str(ROOT / "fixtures" / "genesis.txt"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--numerics", default="llama.cpp")
    ap.add_argument("--imatrix", nargs="*", default=[])
    ap.add_argument("--quant-types", nargs="+", default=["Q4_K_M", "IQ4_NL", "Q2_K"])
    ap.add_argument("--top-k", type=int, default=None)
    ap.add_argument("--json", metavar="FILE", help="also write every figure to FILE")
    args = ap.parse_args()
    b = Path(args.bin)
    lc = ["-t", args.threads, "-fa", "off", "-ctk", "f32", "-ctv", "f32"]
    gg = [sys.executable, "-m", "ggtool"]
    gt = ["--threads", args.threads, "--numerics", args.numerics, "-q"]
    report = {"pairs": [], "imatrix": []}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        text = tmp / "text.txt"
        shutil.copy(args.text, text)
        for base_model, quant in args.pair:
            for ctx, chunks in zip(args.ctx, args.chunks):
                row = {"base": base_model, "quant": quant, "ctx": ctx, "chunks": chunks}
                lb, gb = tmp / "llama.bin", tmp / "ggtool.bin"
                common = ["-c", ctx, "--chunks", chunks]
                out_l, wall_l, rss_l = timed([b / "llama-perplexity", "-m", base_model, "-f", text, *common,
                                              "--kl-divergence-base", lb, *lc])
                out_g, wall_g, rss_g = timed([*gg, "perplexity", "--gguf", base_model, "-f", text, *common,
                                              "--kl-divergence-base", gb, "--force", *gt])
                n_tok = ctx * chunks
                row["ppl_base"] = {"llama": numbers(out_l).get("PPL"), "ggtool": numbers(out_g).get("PPL"),
                                   "digits_apart": digits_apart(numbers(out_g)["PPL"], numbers(out_l)["PPL"]),
                                   "llama_tok_s": n_tok / wall_l, "ggtool_tok_s": n_tok / wall_g,
                                   "speed_ratio": wall_l / wall_g, "rss_kib": {"llama": rss_l, "ggtool": rss_g}}
                row["base_files_identical"] = sha(lb) == sha(gb)
                row["base_bytes"] = lb.stat().st_size
                if args.top_k:
                    tk = tmp / "topk.bin"
                    timed([*gg, "perplexity", "--gguf", base_model, "-f", text, *common, "--kl-divergence-base", tk,
                           "--kl-top-k", args.top_k, "--force", *gt])
                    row["top_k"] = {"k": args.top_k, "bytes": tk.stat().st_size,
                                    "fraction_of_full": tk.stat().st_size / lb.stat().st_size}
                runs = {}
                for reader, base_file in (("llama", lb), ("ggtool", gb), ("llama-on-ggtool", gb),
                                          ("ggtool-on-llama", lb)):
                    if reader.startswith("llama"):
                        out, wall, rss = timed([b / "llama-perplexity", "-m", quant, "-c", ctx,
                                                "--kl-divergence-base", base_file, "--kl-divergence", *lc])
                    else:
                        out, wall, rss = timed([*gg, "perplexity", "--gguf", quant, "--kl-divergence-base", base_file,
                                                "--kl-divergence", *gt])
                    runs[reader] = (numbers(out), wall, rss)
                ref = runs["llama"][0]
                for reader in ("ggtool", "llama-on-ggtool", "ggtool-on-llama"):
                    mine = runs[reader][0]
                    apart = {k: digits_apart(mine.get(k, ""), v) for k, v in ref.items()}
                    row[f"kld_{reader}"] = {"equal_lines": sum(1 for v in apart.values() if v == 0),
                                            "lines": len(apart), "within_1_digit": sum(1 for v in apart.values()
                                                                                      if v <= 1),
                                            "worst": max(apart.items(), key=lambda kv: kv[1]) if apart else None}
                row["kld_llama"] = {k: ref[k] for k in ("Mean PPL(Q)", "Mean PPL(base)", "Mean    KLD", "Same top p")
                                    if k in ref}
                row["kld_ggtool"]["lines_shown"] = {k: runs["ggtool"][0].get(k) for k in row["kld_llama"]}
                row["kld_speed"] = {"llama_s": runs["llama"][1], "ggtool_s": runs["ggtool"][1],
                                    "rss_kib": {"llama": runs["llama"][2], "ggtool": runs["ggtool"][2]}}
                if args.top_k:
                    out, _, _ = timed([*gg, "perplexity", "--gguf", quant, "--kl-divergence-base", tk,
                                       "--kl-divergence", *gt, "--json"])
                    rec = json.loads(out[out.index("{"):out.rindex("}") + 1])
                    full = float(re.findall(NUM, runs["ggtool"][0]["Mean    KLD"])[0])
                    row["top_k"].update(kld=rec["kld"]["mean"], kld_full=full, difference=full - rec["kld"]["mean"],
                                        bound=rec["kld"]["top_k"]["bound_mean"], rest=rec["kld"]["top_k"]["rest_mean"])
                print(json.dumps(row, indent=1), flush=True)
                report["pairs"].append(row)
        for model in args.imatrix:
            ctx, chunks = args.ctx[0], args.chunks[0]
            li, gi = tmp / "llama-imatrix.gguf", tmp / "ggtool-imatrix.gguf"
            _, wall_l, _ = timed([b / "llama-imatrix", "-m", model, "-f", text, "-c", ctx, "--chunks", chunks, "-o",
                                  li, *lc])
            _, wall_g, _ = timed([*gg, "imatrix", "--gguf", model, "-f", text, "-c", ctx, "--chunks", chunks, "-o", gi,
                                  "--force", *gt])
            from ggtool.imatrix import read_imatrix_sums

            a, g = read_imatrix_sums(li, ctx), read_imatrix_sums(gi, ctx)
            rel = max(float(np.max(np.abs(a.sums[k] - g.sums[k]) / np.maximum(np.abs(a.sums[k]), 1e-30)))
                      for k in a.sums)
            row = {"model": model, "ctx": ctx, "chunks": chunks, "entries": [len(a.sums), len(g.sums)],
                   "same_names": sorted(a.sums) == sorted(g.sums),
                   "counts_equal": all(np.array_equal(a.counts[k], g.counts[k]) for k in a.sums),
                   "max_rel_in_sum2": rel, "identical": sha(li) == sha(gi),
                   "seconds": {"llama": wall_l, "ggtool": wall_g}, "quantized_identical": {}}
            im = tmp / "imatrix.gguf"
            for t in args.quant_types:
                outs = []
                for src in (li, gi):
                    shutil.copy(src, im)
                    q = tmp / f"q-{t}-{src.stem}.gguf"
                    timed([*gg, "quantize", model, q, "--type", t, "--imatrix", im, "--allow-requantize", "--force",
                           "--quiet"])
                    outs.append(sha(q))
                row["quantized_identical"][t] = outs[0] == outs[1]
            print(json.dumps(row, indent=1), flush=True)
            report["imatrix"].append(row)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
