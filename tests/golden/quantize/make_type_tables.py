"""Make type-tables.json: the type llama.cpp's llama-quantize gives each tensor, per file type.

Run with llama.cpp's own tool (never a dependency of ggtool; see README.md):

    python tests/golden/quantize/make_type_tables.py LLAMA_QUANTIZE gemma3=GEMMA_F16.gguf,GEMMA_IMATRIX.gguf \
        smollm2=SMOLLM2_F16.gguf,SMOLLM2_IMATRIX.gguf

For each model and each case (a file type, or a file type with options), `llama-quantize --dry-run`
prints one line per tensor; the type of a converted tensor is in parentheses at its end, a copied
one keeps its source type. The tensors' order is llama.cpp's (the order it writes them). A case
"FTYPE --imatrix" is run with the model's importance matrix (after the comma): some rules look at
whether one is given (IQ3_XXS's attn_v and ffn_down, IQ4_NL/IQ4_XS's and Q4_0/Q5_0's ffn_down).
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path

FILE_TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q2_K_S", "Q3_K_S", "Q3_K_M", "Q3_K_L", "Q4_K_S", "Q4_K_M",
              "Q5_K_S", "Q5_K_M", "Q6_K", "IQ4_NL", "F16", "BF16", "F32",
              "IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ2_M", "IQ3_XXS", "IQ3_XS", "IQ3_S", "IQ3_M", "IQ4_XS",
              "TQ1_0", "TQ2_0", "MXFP4_MOE", "COPY"]
# file types whose rules look at whether an importance matrix is given: again with one
IMATRIX_CASES = ["IQ3_XXS", "IQ4_NL", "IQ4_XS", "Q4_0", "Q5_0", "IQ2_M"]
# file type plus llama-quantize options: the options' rules, pinned the same way
OPTION_CASES = {
    "Q4_K_M --pure": ["--pure"],
    "Q3_K_M --pure": ["--pure"],
    "Q4_K_M --leave-output-tensor": ["--leave-output-tensor"],
    "Q5_K_M --output-tensor-type q4_0": ["--output-tensor-type", "q4_0"],
    "Q4_K_S --token-embedding-type q5_1": ["--token-embedding-type", "q5_1"],
    "Q4_K_M --tensor-type ffn_(up|gate)=q8_0 --tensor-type blk\\.1\\.=q2_K": [
        "--tensor-type", "ffn_(up|gate)=q8_0", "--tensor-type", "blk\\.1\\.=q2_K"],
    "Q4_K_M --override-kv gemma3.block_count=int:16": ["--override-kv", "gemma3.block_count=int:16"],
    "Q4_K_M --override-kv llama.block_count=int:16": ["--override-kv", "llama.block_count=int:16"],
}
LINE = re.compile(r"^\[\s*\d+/\s*\d+\] (\S+)\s+- \[[^\]]*\], type =\s+(\S+), size = .*?(?:\((\S+)\))?$")


def types_of(tool: str, model: str, ftype: str, options: list[str]) -> list[tuple[str, str]]:
    out = subprocess.run([tool, "--dry-run", *options, model, ftype], capture_output=True, text=True, check=True)
    rows = []
    for line in (out.stdout + out.stderr).splitlines():
        m = LINE.match(line.strip())
        if m:
            rows.append((m.group(1), m.group(3) or m.group(2)))
    if not rows:
        raise SystemExit(f"no tensor lines from {tool} for {model} {ftype}")
    return rows


def model_info(path: str, names: list[str]) -> dict:
    """What the rules read of the source (its metadata, each tensor's ne and type), by gguf-py."""
    import gguf

    r = gguf.GGUFReader(path)
    arch = r.fields["general.architecture"].contents()
    meta = {k: r.fields[k].contents() for k in r.fields
            if k == "general.architecture" or (k.startswith(arch + ".") and ("count" in k or "layers" in k))}
    by = {t.name: t for t in r.tensors}
    return {"metadata": meta, "names": names, "ne": [[int(n) for n in by[n].shape] for n in names],
            "src_types": " ".join(by[n].tensor_type.name.lower() for n in names)}


def main(tool: str, models: list[str]) -> None:
    doc = {}
    for spec in models:
        key, paths = spec.split("=", 1)
        path, _, imatrix = paths.partition(",")
        tables, names = {}, None
        cases = {f: (f, []) for f in FILE_TYPES}
        arch = model_info(path, [])["metadata"]["general.architecture"]
        cases.update({c: (c.split()[0], o) for c, o in OPTION_CASES.items()
                      if "--override-kv" not in o or o[o.index("--override-kv") + 1].startswith(arch + ".")})
        if imatrix:
            cases.update({f"{f} --imatrix": (f, ["--imatrix", imatrix]) for f in IMATRIX_CASES})
        for case, (ftype, options) in cases.items():
            rows = types_of(tool, path, ftype, options)
            if names is None:
                names = [n for n, _ in rows]
            assert [n for n, _ in rows] == names, case
            tables[case] = " ".join(t for _, t in rows)
        doc[key] = {"source_sha256": hashlib.sha256(Path(path).read_bytes()).hexdigest(),
                    **model_info(path, names), "tables": tables}
    out = Path(__file__).with_name("type-tables.json")
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
