"""Make imatrix-files.json: sha256 of the whole files llama.cpp's llama-quantize writes for stories260K
with an importance matrix (the GGUF and legacy .dat of tests/golden/imatrix/, made by llama-imatrix).

    python tests/golden/quantize/make_imatrix_files.py LLAMA_QUANTIZE

llama-quantize runs in tests/golden/imatrix/ and is given the importance matrix by its bare file
name, which it records in the output (`quantize.imatrix.file`), so the test runs ggtool there too.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent.parent
IMATRIX_DIR = ROOT / "tests" / "golden" / "imatrix"
# case -> (file type, importance file, extra options)
CASES = {f"{t} gguf": (t, "stories260K-imatrix.gguf", []) for t in
         ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K_M", "Q4_K_S", "Q4_K_M", "Q5_K_M", "Q6_K")}
# llama-quantize's IQ, TQ and MXFP4 file types (stories260K's 64-wide rows: the 256-block types
# fall back to iq4_nl, the ternary ones to q4_0, and the rules of each file type choose)
CASES.update({f"{t} gguf": (t, "stories260K-imatrix.gguf", []) for t in
              ("IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ2_M", "IQ3_XXS", "IQ3_XS", "IQ3_S", "IQ3_M",
               "IQ4_XS", "TQ1_0", "TQ2_0", "MXFP4_MOE")})
# llama-quantize's options of issue 22: tensor types from a file (its path relative to the
# imatrix directory, where both tools run), COPY, the importance matrix's entries selected, layers pruned
CASES.update({"Q4_K_M gguf --tensor-type-file": ("Q4_K_M", "stories260K-imatrix.gguf",
                                                 ["--tensor-type-file", "../quantize/tensor-types.txt"]),
              "COPY gguf": ("COPY", "stories260K-imatrix.gguf", []),
              "Q4_0 gguf --exclude-weights": ("Q4_0", "stories260K-imatrix.gguf", ["--exclude-weights", "ffn_down"]),
              "IQ3_S gguf --include-weights": ("IQ3_S", "stories260K-imatrix.gguf",
                                               ["--include-weights", "attn", "--include-weights", "blk.1."]),
              "Q5_K_M gguf --exclude-weights all": ("Q5_K_M", "stories260K-imatrix.gguf", ["--exclude-weights", "blk"]),
              "IQ3_XXS gguf --prune-layers": ("IQ3_XXS", "stories260K-imatrix.gguf", ["--prune-layers", "2,4"]),
              "Q4_K_M gguf --prune-layers": ("Q4_K_M", "stories260K-imatrix.gguf", ["--prune-layers", "0"])})
CASES.update({"Q4_K_M dat": ("Q4_K_M", "stories260K-imatrix.dat", []),
              "Q5_0 dat": ("Q5_0", "stories260K-imatrix.dat", []),
              "Q4_K gguf --pure": ("Q4_K", "stories260K-imatrix.gguf", ["--pure"])})


def main(tool: str) -> None:
    model = ROOT / "fixtures" / "stories260K.gguf"
    out = {}
    with tempfile.TemporaryDirectory() as d:
        for case, (ftype, imatrix, extra) in CASES.items():
            q = Path(d) / "out.gguf"
            subprocess.run([tool, *extra, "--imatrix", imatrix, str(model), str(q), ftype, "1"], cwd=IMATRIX_DIR,
                           check=True, capture_output=True)
            out[case] = {"sha256": hashlib.sha256(q.read_bytes()).hexdigest(), "bytes": q.stat().st_size}
    (HERE / "imatrix-files.json").write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main(sys.argv[1])
