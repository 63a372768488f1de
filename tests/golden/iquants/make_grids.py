"""Write ggtool/qtypes/grids.py (every IQ/MXFP4 lookup table) from llama.cpp's own sources, never by hand.

    python tests/golden/iquants/make_grids.py GGML_DIR            # rewrite grids.py
    python tests/golden/iquants/make_grids.py GGML_DIR --check    # exit 1 if grids.py differs

GGML_DIR is the ggml folder of the llama.cpp that llama-cpp-python 0.3.36 vendors
(vendor/llama.cpp/ggml of its sdist). The dequantizers' tables come from src/ggml-common.h
(``GGML_TABLE_BEGIN(type, name, size) ... GGML_TABLE_END()``); the quantizers' point lists
(``kgrid_2bit_256/512/1024`` of iq2xs_init_impl, ``kgrid_256/512`` of iq3xs_init_impl) from
src/ggml-quants.c (``static const uint16_t NAME[N] = { ... };``). Each table is written as its
numbers in the C text's order. Checked on the way, not stored: IQ1's quantizer grid
``kgrid_1bit_2048`` (ggml-quants.c, 2 bits a value: value + 1) is ``iq1s_grid``, and
``kvalues_iq4nl`` equals ``ggtool.kernels.tables.KVALUES_IQ4NL`` (IQ4_NL/IQ4_XS's levels, kept there).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
GRIDS = ROOT / "ggtool" / "qtypes" / "grids.py"

# python name -> (source file, C name, numpy dtype, hex digits or 0 for decimal, what it is)
TABLES = {
    "KMASK_IQ2XS": ("ggml-common.h", "kmask_iq2xs", "uint8", 0, "bit j of a sign byte"),
    "KSIGNS_IQ2XS": ("ggml-common.h", "ksigns_iq2xs", "uint8", 0,
                     "7 stored sign bits -> 8 (the 8th makes the count of minus signs even)"),
    "IQ2XXS_GRID": ("ggml-common.h", "iq2xxs_grid", "uint64", 16, "IQ2_XXS's 256 points: 8 magnitudes a byte"),
    "IQ2XS_GRID": ("ggml-common.h", "iq2xs_grid", "uint64", 16, "IQ2_XS's 512 points"),
    "IQ2S_GRID": ("ggml-common.h", "iq2s_grid", "uint64", 16, "IQ2_S's 1024 points"),
    "IQ3XXS_GRID": ("ggml-common.h", "iq3xxs_grid", "uint32", 8, "IQ3_XXS's 256 points: 4 magnitudes a byte"),
    "IQ3S_GRID": ("ggml-common.h", "iq3s_grid", "uint32", 8, "IQ3_S's 512 points"),
    "KGRID_2BIT_256": ("ggml-quants.c", "kgrid_2bit_256", "uint16", 0,
                       "iq2xs_init_impl's IQ2_XXS points: 8 levels 0..3 of 2 bits each"),
    "KGRID_2BIT_512": ("ggml-quants.c", "kgrid_2bit_512", "uint16", 0, "iq2xs_init_impl's IQ2_XS points"),
    "KGRID_2BIT_1024": ("ggml-quants.c", "kgrid_2bit_1024", "uint16", 0, "iq2xs_init_impl's IQ2_S points"),
    "KGRID_3BIT_256": ("ggml-quants.c", "kgrid_256", "uint16", 0,
                       "iq3xs_init_impl's IQ3_XXS points: 4 levels 0..7 of 3 bits each"),
    "KGRID_3BIT_512": ("ggml-quants.c", "kgrid_512", "uint16", 0, "iq3xs_init_impl's IQ3_S points"),
    "IQ1S_GRID": ("ggml-common.h", "iq1s_grid", "uint64", 16,
                  "IQ1_S/IQ1_M's 2048 groups of 8 values in {-1, 0, +1}, one int8 a byte (value i in byte i)"),
    "KVALUES_MXFP4": ("ggml-common.h", "kvalues_fp4", "int8", 0,
                      "MXFP4's E2M1 levels doubled (its E8M0 scale is halved to match)"),
}


def c_table(text: str, name: str, source: str) -> list[int]:
    """The numbers of the C table `name` in `text`, in order."""
    if source == "ggml-common.h":
        m = re.search(r"GGML_TABLE_BEGIN\(\s*\w+\s*,\s*" + re.escape(name) + r"\s*,\s*(\w+)\s*\)(.*?)GGML_TABLE_END\(\)",
                      text, re.S)
    else:
        m = re.search(r"static const uint16_t " + re.escape(name) + r"\[(\w+)\]\s*=\s*\{(.*?)\};", text, re.S)
    if not m:
        sys.exit(f"{source}: table {name} not found")
    body = re.sub(r"//[^\n]*", "", m.group(2))
    values = [int(v, 0) for v in re.findall(r"-?(?:0x[0-9a-fA-F]+|\d+)", body)]
    size = m.group(1)
    if size.isdigit() and int(size) != len(values):
        sys.exit(f"{source}: {name} has {len(values)} numbers, declared {size}")
    return values


def cross_checks(texts: dict[str, str]) -> None:
    """The tables that have a second copy in llama.cpp or ggtool are the same table."""
    grid = c_table(texts["ggml-common.h"], "iq1s_grid", "ggml-common.h")
    kgrid = c_table(texts["ggml-quants.c"], "kgrid_1bit_2048", "ggml-quants.c")
    if len(grid) != 2048 or len(kgrid) != 2048:
        sys.exit(f"iq1s_grid has {len(grid)} points, kgrid_1bit_2048 {len(kgrid)}: not 2048")
    for g, k in zip(grid, kgrid):
        vals = [((g >> (8 * i)) & 0xFF) for i in range(8)]
        vals = [v - 256 if v > 127 else v for v in vals]
        if not set(vals) <= {-1, 0, 1} or k != sum((v + 1) << (2 * i) for i, v in enumerate(vals)):
            sys.exit("kgrid_1bit_2048 is not iq1s_grid")
    sys.path.insert(0, str(ROOT))
    from ggtool.kernels.tables import KVALUES_IQ4NL

    if [int(v) for v in KVALUES_IQ4NL] != c_table(texts["ggml-common.h"], "kvalues_iq4nl", "ggml-common.h"):
        sys.exit("ggtool.kernels.tables.KVALUES_IQ4NL differs from kvalues_iq4nl")


def generate(ggml_dir: Path) -> str:
    texts = {f: (ggml_dir / "src" / f).read_text() for f in ("ggml-common.h", "ggml-quants.c")}
    cross_checks(texts)
    out = [HEAD, "# Generated by tests/golden/iquants/make_grids.py (do not edit) from src/ggml-common.h and\n"
           "# src/ggml-quants.c of the llama.cpp llama-cpp-python 0.3.36 vendors\n"]
    for py, (source, cname, dtype, hexw, what) in TABLES.items():
        values = c_table(texts[source], cname, source)
        words = [format(v, f"0{hexw}x") if hexw else str(v) for v in values]
        per = 8 if hexw == 16 else 12 if hexw == 8 else 16
        lines = [" ".join(words[i:i + per]) for i in range(0, len(words), per)]
        out.append(f"\n# {cname} ({source}): {what}\n")
        out.append(f'{py} = _table("{dtype}", {16 if hexw else 10}, """\n' + "\n".join(lines) + '\n""")\n')
    return "".join(out)


HEAD = '''"""GGML's lookup tables of the IQ types (grids of points, sign tables, the quantizers' point
lists), as read-only numpy arrays, generated from llama.cpp's sources by
tests/golden/iquants/make_grids.py; none is typed by hand."""

from __future__ import annotations

import numpy as np


def _table(dtype: str, base: int, text: str) -> np.ndarray:
    a = np.array([int(w, base) for w in text.split()], dtype=dtype)
    a.flags.writeable = False
    return a


'''


def write(ggml_dir: Path, check: bool) -> int:
    new = generate(ggml_dir)
    old = GRIDS.read_text() if GRIDS.exists() else ""
    if check:
        same = new == old
        print("grids.py matches the sources" if same else "grids.py differs from the sources")
        return 0 if same else 1
    GRIDS.write_text(new)
    print(f"wrote {GRIDS} ({len(new)} bytes)")
    return 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("ggml", type=Path, help="the ggml folder (vendor/llama.cpp/ggml)")
    ap.add_argument("--check", action="store_true", help="compare, write nothing")
    a = ap.parse_args()
    sys.exit(write(a.ggml, a.check))


if __name__ == "__main__":
    main()
