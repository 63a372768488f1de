"""Check ggtool's quantizers and importance-matrix reader against llama.cpp's own tools on a real model:
llama-imatrix makes an importance matrix, llama-quantize --pure --imatrix writes each type, and
ggtool requantizes every tensor it quantized (dequantized from the source as llama.cpp does, with
the importances `ggtool.imatrix` reads for it) and compares the bytes. Nothing is written to the repo.

    python bench/check_imatrix_llama.py LLAMA_BIN MODEL.gguf TEXT [--types Q4_K_S Q2_K ...] [--format gguf|dat]

LLAMA_BIN holds llama-imatrix and llama-quantize (the bench environment's build-native/bin);
MODEL is e.g. gemma-3-270m Q4_K_M (--allow-requantize is passed); TEXT any text file (4 chunks of
128 tokens are used). Tensors over 20M values (the token embeddings) are skipped. Prints, per
type, each source -> target type pair with its tensor count and how many differ.
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
from pathlib import Path

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bin")
    ap.add_argument("model")
    ap.add_argument("text")
    ap.add_argument("--types", nargs="+", default=["Q2_K", "Q3_K_S", "Q4_K_S", "Q5_K_S", "Q6_K", "Q4_0", "Q4_1",
                                                    "Q5_0", "Q5_1", "IQ4_NL"])
    ap.add_argument("--format", default="gguf", choices=("gguf", "dat"))
    args = ap.parse_args()

    from gguf import GGUFReader

    from ggtool import quant as Q
    from ggtool.imatrix import read_imatrix

    b = Path(args.bin)
    src = {t.name: t for t in GGUFReader(args.model).tensors}
    with tempfile.TemporaryDirectory() as d:
        imf = Path(d) / f"imatrix.{args.format}"
        subprocess.run([b / "llama-imatrix", "-m", args.model, "-f", args.text, "-c", "128", "--chunks", "4", "-t", "1",
                        "--no-ppl", "-o", imf, "--output-format", args.format], check=True, capture_output=True)
        im = read_imatrix(imf)
        for t in args.types:
            out = Path(d) / f"{t}.gguf"
            subprocess.run([b / "llama-quantize", "--allow-requantize", "--pure", "--imatrix", imf, args.model, out, t, "1"],
                           check=True, capture_output=True)
            stats: dict[str, list[int]] = {}
            for q in GGUFReader(out).tensors:
                s = src[q.name]
                if q.n_elements > 20_000_000 or q.tensor_type.name == "F32":
                    continue
                if q.tensor_type == s.tensor_type:
                    key, same = "copied", np.array_equal(np.asarray(q.data).reshape(-1), np.asarray(s.data).reshape(-1))
                else:
                    w = im.weights_for(q.name, tuple(int(n) for n in q.shape))
                    x = Q.dequantize(np.asarray(s.data), s.tensor_type.name.lower())
                    got = Q.quantize(x, q.tensor_type.name.lower(), imatrix=w)
                    key = f"{s.tensor_type.name}->{q.tensor_type.name}{' imatrix' if w is not None else ''}"
                    same = np.array_equal(got.reshape(-1), np.asarray(q.data).reshape(-1))
                n = stats.setdefault(key, [0, 0])
                n[0] += 1
                n[1] += not same
            print(t, ", ".join(f"{k}: {n} tensors, {bad} differ" for k, (n, bad) in stats.items()), flush=True)


if __name__ == "__main__":
    main()
