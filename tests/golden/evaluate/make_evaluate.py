"""Make this folder's data with llama.cpp's own tools (the llama-cpp-python 0.3.36 builds of the bench
environment: /work/bench-env/build-native/bin, AVX-512, and /work/bench-env/build-avx2/bin, AVX2 only):

    python tests/golden/evaluate/make_evaluate.py NATIVE_BIN AVX2_BIN GEMMA_GGUF

Every run is over fixtures/genesis.txt (as `genesis.txt`, run in fixtures/, the dataset name an
imatrix records), with an F32 KV cache and no flash attention (`-fa off -ctk f32 -ctv f32`: the
graph ggtool's programs compute) and 2 threads; see README.md for what each file holds.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent.parent
FIX = ROOT / "fixtures"
STORIES = FIX / "stories260K.gguf"
COMMON = ["-t", "2", "-fa", "off", "-ctk", "f32", "-ctv", "f32"]


def run(tool: Path, *args) -> str:
    p = subprocess.run([str(tool), *map(str, args), *COMMON], cwd=FIX, check=True, capture_output=True, text=True)
    return p.stdout + p.stderr


def lines(out: str) -> list[str]:
    """The lines llama.cpp prints its numbers on, its log prefixes (`0.05.548.280 I `, which can fall
    inside a line) cut off."""
    text = re.sub(r"\d+\.\d+\.\d+\.\d+ [IWE] ", "\n", out)
    starts = ("[1]", "Final estimate", "Mean", "Maximum", "Median", "Minimum", "Cor(", "RMS", "Same top", "99.", "95.",
              "90.", "75.", "25.", "10.", " 5.", " 1.", " 0.")
    return [line.rstrip() for line in text.splitlines() if line.startswith(starts)]


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def main() -> None:
    native, avx2, gemma = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
    record = {}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        # stories260K: perplexity, a small base file, the KL divergence of ggtool's Q4_0, imatrix files
        record["stories260K-ppl-c128"] = lines(run(native / "llama-perplexity", "-m", STORIES, "-f", "genesis.txt",
                                                   "-c", "128", "--chunks", "8"))
        base = HERE / "stories260K-base-c64.bin"
        record["stories260K-base-c64"] = lines(run(native / "llama-perplexity", "-m", STORIES, "-f", "genesis.txt",
                                                   "-c", "64", "--chunks", "4", "--kl-divergence-base", base))
        q4 = tmp / "stories-q4_0.gguf"
        subprocess.run([sys.executable, "-m", "ggtool", "quantize", str(STORIES), str(q4), "--type", "Q4_0", "--quiet"],
                       check=True, cwd=ROOT)
        record["stories260K-q4_0-sha256"] = sha(q4)
        record["stories260K-q4_0-kld-c64"] = lines(run(native / "llama-perplexity", "-m", q4, "-c", "64",
                                                       "--kl-divergence-base", base, "--kl-divergence"))
        for name, extra in (("stories260K-imatrix-c64.gguf", []),
                            ("stories260K-imatrix-c64-output.gguf", ["--process-output"])):
            run(native / "llama-imatrix", "-m", STORIES, "-f", "genesis.txt", "-c", "64", "--chunks", "4",
                "-o", HERE / name, *extra)
        merged = tmp / "merged.gguf"
        run(native / "llama-imatrix", "-m", STORIES, "--in-file", HERE / "stories260K-imatrix-c64.gguf",
            "--in-file", HERE / "stories260K-imatrix-c64-output.gguf", "-c", "64", "-o", merged)
        record["stories260K-imatrix-merged-sha256"] = sha(merged)
        # gemma-3-270m Q4_K_M: the base file and the imatrix of each build, by their sha256
        for build, bin_dir in (("avx512", native), ("avx2", avx2)):
            gbase = tmp / f"gemma-{build}.bin"
            record[f"gemma-base-c32-{build}"] = lines(run(bin_dir / "llama-perplexity", "-m", gemma, "-f",
                                                          "genesis.txt", "-c", "32", "--chunks", "4",
                                                          "--kl-divergence-base", gbase))
            record[f"gemma-base-c32-{build}-sha256"] = sha(gbase)
            gim = tmp / f"gemma-{build}.gguf"
            run(bin_dir / "llama-imatrix", "-m", gemma, "-f", "genesis.txt", "-c", "32", "--chunks", "4", "-o", gim)
            record[f"gemma-imatrix-c32-{build}-sha256"] = sha(gim)
    (HERE / "llama-cpp.json").write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
