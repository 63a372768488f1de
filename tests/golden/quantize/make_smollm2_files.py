"""Make smollm2-files.json: sha256 of the whole files llama.cpp's llama-quantize writes for SmolLM2-135M
(F16) with an importance matrix, in the IQ, TQ and MXFP4_MOE file types (see README.md).

    python tests/golden/quantize/make_smollm2_files.py LLAMA_QUANTIZE SMOLLM2_F16.gguf IMATRIX.gguf

llama-quantize runs in a scratch directory where the importance matrix is linked as
`smollm2-imatrix.gguf` and given by that bare name, which it records in the output
(`quantize.imatrix.file`); tests/test_quantize_smollm2.py runs ggtool the same way.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
IMATRIX_NAME = "smollm2-imatrix.gguf"
FILE_TYPES = ("IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ2_M", "IQ3_XXS", "IQ3_XS", "IQ3_S", "IQ3_M", "IQ4_XS",
              "TQ1_0", "TQ2_0", "MXFP4_MOE")


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 24), b""):
            h.update(chunk)
    return h.hexdigest()


def main(tool: str, model: str, imatrix: str) -> None:
    doc = {"source_sha256": sha256(Path(model)), "imatrix_sha256": sha256(Path(imatrix)), "imatrix_name": IMATRIX_NAME,
           "threads": 2, "targets": {}}
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / IMATRIX_NAME).symlink_to(Path(imatrix).resolve())
        for ftype in FILE_TYPES:
            q = Path(d) / "out.gguf"
            subprocess.run([tool, "--imatrix", IMATRIX_NAME, str(Path(model).resolve()), str(q), ftype, "2"], cwd=d,
                           check=True, capture_output=True)
            doc["targets"][ftype] = {"sha256": sha256(q), "bytes": q.stat().st_size}
            print(ftype, doc["targets"][ftype]["sha256"], flush=True)
    (HERE / "smollm2-files.json").write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main(*sys.argv[1:4])
