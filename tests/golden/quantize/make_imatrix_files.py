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
