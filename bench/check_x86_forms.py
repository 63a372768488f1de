"""Which float operations each of llama.cpp's x86 builds compiles into the dots of ggtool's types, for
`--numerics llama.cpp-avx2` / `-avx512`, where no AVX-512 host is at hand to run them.

GCC (the bench environment's, 12.2) compiles llama.cpp's ``ggml-cpu/arch/x86/quants.c`` and
``repack.cpp`` once per build, dumping the optimized GIMPLE (``-fdump-tree-optimized``) and the
assembly. For each type of ggtool's registry (its ``ggml_vec_dot_<type>_<vec_dot_type>``, and the
repacked gemv/gemm of the types llama.cpp repacks) it prints, for pairs of builds, whether the
optimized GIMPLE is the same (SSA names and labels renumbered) and the float instructions each build
emits (FMA, mul, add, conversions, per function). Float results are fixed by the GIMPLE: GCC contracts
a multiply-add there (``-ffp-contract=fast``, its default for GNU C) and never reassociates float
operations without ``-ffast-math``; two builds with the same GIMPLE compute the same bits.

The builds (their flags as ggml's CMakeLists gives them):
- ``avx2``: ``GGML_NATIVE=OFF`` with ``GGML_AVX2`` (and AVX, FMA, F16C, BMI2): generic tuning;
- ``zen3``: ``-march=native`` on an AVX2 AMD EPYC (GCC: ``znver3``);
- ``zen4``: ``-march=native`` on an AVX-512 AMD EPYC as GCC 12.2 makes it (it has no ``znver4``: the
  ``znver3`` tuning with Zen 4's AVX-512 extensions added, AVX512_BF16 among them);
- ``spr``: ``-march=sapphirerapids`` (an Intel AVX-512 host; AMX left out).

GCC's znver tunings avoid chains of scalar FMAs (``avoid_fma_chains``), so the two native AMD builds
leave a loop-carried ``sumf += d * sumi`` unfused where the generic and the Intel ones fuse it.

    python bench/check_x86_forms.py --llama-cpp .../vendor/llama.cpp [--types iq4_nl,mxfp4]
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import os
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ZEN4 = ("avx512f avx512dq avx512cd avx512bw avx512vl avx512ifma avx512vbmi avx512vbmi2 avx512vnni "
        "avx512bitalg avx512vpopcntdq avx512bf16 gfni vaes vpclmulqdq").split()
BUILDS = {
    "avx2": "-msse4.2 -mf16c -mfma -mbmi2 -mavx -mavx2",
    "zen3": "-march=znver3",
    "zen4": "-march=znver3 " + " ".join(f"-m{f}" for f in ZEN4),
    "spr": "-march=sapphirerapids -mno-amx-tile -mno-amx-int8 -mno-amx-bf16",
}
PAIRS = (("avx2", "zen3"), ("zen3", "zen4"), ("zen4", "spr"), ("avx2", "zen4"))
DEFINES = ("-DGGML_BACKEND_BUILD -DGGML_BACKEND_SHARED -DGGML_SCHED_MAX_COPIES=4 -DGGML_SHARED "
           "-DGGML_USE_CPU_REPACK -DGGML_USE_LLAMAFILE -DGGML_USE_OPENMP -D_GNU_SOURCE -D_XOPEN_SOURCE=600 "
           "-Dggml_cpu_EXPORTS -O3 -DNDEBUG -fPIC -fopenmp").split()
SOURCES = {"quants": ("arch/x86/quants.c", "gcc", "-std=gnu11"),
           "repack": ("arch/x86/repack.cpp", "g++", "-std=gnu++17")}
FLOAT_OP = re.compile(r"^v?(?:f(?:n?m(?:add|sub)))\d*(?:ss|ps|sd|pd)$|^v?(?:mul|add|sub|div|sqrt|hadd|max|min)"
                      r"(?:ss|ps|sd|pd)$|^v?cvt\w+$")


def ggml_name(t) -> str:
    """GGML's spelling of a type in function names: q4_K, q8_K, iq2_xxs, tq1_0, mxfp4."""
    from ggtool import types as T
    n = T.GGMLType(t).name.lower()
    return n[:-2] + "_K" if n.endswith("_k") else n


def compile_build(src: Path, out: Path, flags: str, compilers: dict) -> None:
    inc = [f"-I{src / 'ggml'}", f"-I{src / 'ggml/src'}", f"-I{src / 'ggml/src/ggml-cpu'}", f"-I{src / 'ggml/include'}"]
    out.mkdir(parents=True, exist_ok=True)
    for stem, (rel, cc, std) in SOURCES.items():
        subprocess.run([compilers[cc], *DEFINES, *inc, *flags.split(), std, "-fdump-tree-optimized", "-S", "-o",
                        f"{stem}.s", str(src / "ggml/src/ggml-cpu" / rel)], cwd=out, check=True)


def gimple_functions(path: Path) -> dict[str, str]:
    """Each function of an optimized-GIMPLE dump: its float dataflow (`float_dataflow`)."""
    out, cur, lines = {}, None, []
    for line in path.read_text().splitlines() + [";; Function <end> (x)"]:
        m = re.match(r"^;; Function (\S+) ", line)
        if m:
            if cur is not None:
                out[cur] = float_dataflow(lines)
            cur, lines = m.group(1), []
        elif cur is not None:
            lines.append(line)
    return out


FLOAT_TYPE = re.compile(r"\b(?:float|double|__m128|__m256|__m512|__m128_u|__m256_u|__m512_u)\b(?!\s*\*)")
SSA = re.compile(r"(?:\b[A-Za-z_][\w.]*|(?<![\w.]))_\d+(?:\(D\))?(?![\w.])")


def float_dataflow(lines: list[str]) -> str:
    """A function's float computation as a sorted list of expression digests: each float-typed SSA
    value is its operation (the statement with its SSA names blanked) over the digests of its float
    operands, integer operands, loads and PHIs (by their constant entries) being leaves. Two builds whose integer code differs
    (instruction choice, reassociation: exact) but whose float operations and their order are the
    same give the same list; a contracted FMA, another summation order or another lane split does not."""
    defs, declared = {}, set()
    for line in lines:
        d = re.match(r"^\s+(.+?)\s+(\S+);$", line)
        if d and "=" not in line and FLOAT_TYPE.search(d.group(1)):
            declared.add(d.group(2))          # "vector(8) float _12;", "__m256 sumf;"
        st = re.match(r"^\s+(?:# )?(\S+) = (.+?);?$", line)     # a PHI ends without ";"
        if st and SSA.fullmatch(st.group(1)):
            defs[st.group(1)] = st.group(2)
    is_float = {n for n in defs if n in declared or re.sub(r"_\d+(?:\(D\))?$", "", n) in declared}
    memo: dict[str, str] = {}

    def digest(name: str) -> str:
        if name not in is_float or name not in defs:
            return "I"
        if name in memo:
            return memo[name]
        rhs = defs[name]
        if rhs.startswith("MEM"):
            h = "load"                        # its address is integer code, whatever its form
        elif rhs.startswith("PHI"):
            # a leaf: its constant entries only (the loop-carried ones are the statements that
            # compute them, digested where they are defined), so that no cycle is walked
            h = "phi:" + ",".join(sorted(a for a in re.sub(r"\(\d+\)", "", rhs[5:-1]).split(", ")
                                         if not SSA.fullmatch(a)))
        else:
            memo[name] = "cycle"              # a non-PHI cycle is not SSA; guard anyway
            ops = [digest(o) for o in SSA.findall(rhs)]
            h = hashlib.sha1(f"{SSA.sub('$', rhs)}|{'|'.join(ops)}".encode()).hexdigest()[:12]
        memo[name] = h
        return h
    return "\n".join(sorted(digest(n) for n in is_float))


def float_ops(path: Path) -> dict[str, collections.Counter]:
    """Each function's float instructions in an assembly file, FMA forms (132/213/231) merged."""
    out: dict[str, collections.Counter] = {}
    cur = None
    for line in path.read_text().splitlines():
        m = re.match(r"^([A-Za-z_][\w.$]*):\s*$", line)
        if m and not m.group(1).startswith(".L"):
            cur = out.setdefault(m.group(1), collections.Counter())
        elif cur is not None and line.startswith("\t") and not line.startswith("\t."):
            op = line.split()[0]
            if FLOAT_OP.match(op):
                cur[re.sub(r"(m(?:add|sub))(?:132|213|231)", r"\1", op)] += 1
    return out


def functions_for(types) -> list[tuple[str, str]]:
    """(source stem, function pattern) of the dots llama.cpp runs for these types."""
    from ggtool import qtypes
    out = []
    for t in types:
        rec = qtypes.get(t)
        name, vd = ggml_name(rec.ggml_type), ggml_name(rec.vec_dot_type)
        out.append(("quants", f"ggml_vec_dot_{name}_{vd}"))
        if rec.x86_repacked:      # the gemv/gemm and the template instance they call (GIMPLE's name)
            out.append(("repack", rf"ggml_ge[mv][mv]_{name}_\d+x\d+_{vd}|\w+_lut_avx<block_{name}x\d+>"))
    return out


def main() -> int:
    sys.setrecursionlimit(100_000)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-cpp", required=True, help="llama.cpp's source (llama-cpp-python's vendor/llama.cpp)")
    ap.add_argument("--types", default="", help="comma-separated GGML types (default: every type of ggtool's "
                    "registry whose records carry llama.cpp forms)")
    ap.add_argument("--gcc", default="gcc", help="the C compiler")
    ap.add_argument("--gxx", default="g++", help="the C++ compiler (the same GCC)")
    ap.add_argument("--keep", default="", help="a folder for the dumps (default: a temporary one)")
    args = ap.parse_args()
    from ggtool import qtypes
    types = ([t.strip() for t in args.types.split(",") if t.strip()] or
             [r.ggml_type.name for r in qtypes.REGISTRY.values() if r.llama_cpp])
    src = Path(args.llama_cpp).resolve()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.keep or tmp)
        with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as ex:
            list(ex.map(lambda b: compile_build(src, root / b, BUILDS[b], {"gcc": args.gcc, "g++": args.gxx}), BUILDS))
        gimple = {b: {s: gimple_functions(next((root / b).glob(f"{s}.*.optimized"))) for s in SOURCES}
                  for b in BUILDS}
        asm = {b: {s: float_ops(root / b / f"{s}.s") for s in SOURCES} for b in BUILDS}
    print(f"{'function':58s} " + " ".join(f"{a}={b:5s}" for a, b in PAIRS) + "  float instructions where they differ")
    for stem, pat in functions_for(types):
        fns = sorted(f for f in gimple["avx2"][stem] if re.fullmatch(pat, f))
        for fn in fns:
            same = ["same " if gimple[a][stem].get(fn) == gimple[b][stem].get(fn) else "DIFF "
                    for a, b in PAIRS]
            ops = {b: asm[b][stem].get(fn) for b in BUILDS}
            note = ""
            if fn in asm["avx2"][stem] and len({tuple(sorted(o.items())) for o in ops.values() if o is not None}) > 1:
                keys = sorted(set().union(*[o for o in ops.values() if o]))
                note = "; ".join(f"{k} " + "/".join(str(ops[b][k]) for b in BUILDS) for k in keys
                                 if len({ops[b][k] for b in BUILDS}) > 1)
            print(f"{fn[:58]:58s} " + " ".join(f"{s:{len(a) + len(b) + 2}s}" for s, (a, b) in zip(same, PAIRS))
                  + (f"  ({'/'.join(BUILDS)}) {note}" if note else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
