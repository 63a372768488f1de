"""Make this folder's data with llama.cpp's own tools (the llama-cpp-python 0.3.36 build of the bench
environment, /work/bench-env/build-native/bin, or any LLAMA_BIN folder holding llama-imatrix and
llama-quantize):

    python tests/golden/imatrix/make_imatrix.py LLAMA_BIN

1. stories260K-imatrix.gguf and .dat: llama-imatrix over fixtures/stories260K.gguf and the first
   6000 bytes of README.md (as `readme-6k.txt`, the dataset name recorded), `-c 128 --chunks 4 -t 1
   --no-ppl`, once per --output-format.
2. llama-quantize.npz: `llama-quantize --pure [--imatrix F] stories260K.gguf out.gguf TYPE 1` for TYPE
   in Q4_0 Q4_1 Q5_0 Q5_1 IQ4_NL, without an imatrix and with the GGUF one (the .dat holds the same
   values, bit for bit, so llama-quantize writes the same bytes from it), and the bytes it wrote for
   blk.0.attn_q.weight, blk.1.ffn_up.weight and blk.4.attn_v.weight (key `TYPE/IMATRIX/TENSOR`,
   IMATRIX none or gguf).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent.parent
TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "IQ4_NL")
TENSORS = ("blk.0.attn_q.weight", "blk.1.ffn_up.weight", "blk.4.attn_v.weight")


def main() -> None:
    from gguf import GGUFReader

    bin_dir = Path(sys.argv[1])
    model = ROOT / "fixtures" / "stories260K.gguf"
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        (tmp / "readme-6k.txt").write_bytes((ROOT / "README.md").read_bytes()[:6000])
        for fmt in ("gguf", "dat"):
            subprocess.run([bin_dir / "llama-imatrix", "-m", model, "-f", "readme-6k.txt", "-c", "128", "--chunks", "4",
                            "-t", "1", "--no-ppl", "-o", HERE / f"stories260K-imatrix.{fmt}", "--output-format", fmt],
                           cwd=tmp, check=True, capture_output=True)
        out = {}
        for t in TYPES:
            for fmt in ("none", "gguf"):
                args = [] if fmt == "none" else ["--imatrix", HERE / f"stories260K-imatrix.{fmt}"]
                q = tmp / f"{t}-{fmt}.gguf"
                subprocess.run([bin_dir / "llama-quantize", "--pure", *args, model, q, t, "1"], check=True,
                               capture_output=True)
                tensors = {x.name: x for x in GGUFReader(q).tensors}
                for name in TENSORS:
                    out[f"{t}/{fmt}/{name}"] = np.array(tensors[name].data, np.uint8)
    np.savez_compressed(HERE / "llama-quantize.npz", **out)


if __name__ == "__main__":
    main()
