"""Issue 29 figures: what checking the repacked weights on disk costs (ggtool.quant.packs).

    python bench/bench_packs.py [--runs 5] [--models gemma,qwen] [--tokens 8] [--other PYTHON]

For each model (gemma-3-270m Q4_K_M and Qwen2.5-Coder-0.5B, from $BENCH_MODELS, default
/work/bench-env/models/):
- its tiles: how many, their bytes against the file's, and the seconds one process spends mapping
  and checking them all (packs.load) against mapping them with the CRC left out (the check's cost
  alone), and CRC-32's speed on them;
- a cached `ggtool generate --gguf MODEL --prompt ... -n N -t 1`, a whole process: as shipped (the
  CRC of a tile computed once, then logged), with the CRC computed at every map ("CRC always"),
  and with no CRC at all (the same code, the CRC taken as the stored value), in the same rounds,
  interleaved: median wall and CPU seconds, the CPU seconds spent in packs.load (mapping and
  checking the tiles: the steadier figure of the check's cost), and the ratios;
- --other PYTHON: the same cached run by another checkout's `ggtool` (a Python whose `import ggtool`
  is that checkout, e.g. main before this change), in the same rounds too.

Every variant has its cache warmed first (two runs, the background compiler waited for). On a
machine shared with other work, the CPU seconds are the steadier figure.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODELS = {"gemma": "gemma-3-270m-q4_k_m.gguf", "qwen": "qwen2.5-coder-0.5b.gguf"}
PROMPT = "The quick brown fox jumps over the lazy dog. Once upon a time"
UNCHECKED = """
import zlib
from types import SimpleNamespace
import ggtool.quant.packs as P
checked = P._check
def without_crc(m, key, crc=True):
    stored = int.from_bytes(bytes(m[8:16]), "little")
    P.zlib = SimpleNamespace(crc32=lambda data, value=0: stored)
    try:
        return checked(m, key)
    finally:
        P.zlib = zlib
P._check = without_crc
"""
EVERY_MAP = """
import ggtool.quant.packs as P
P._checked_before = lambda where, signature: False
"""
TIMED = """
import atexit, os, time
import ggtool.quant.packs as P
spent = [0.0, 0]
loading = P.load
def timed_load(where, key):
    t = time.process_time()
    try:
        return loading(where, key)
    finally:
        spent[0] += time.process_time() - t
        spent[1] += 1
P.load = timed_load
def report():
    with open(os.environ["BENCH_LOAD_LOG"], "a") as f:
        f.write(f"{spent[0]} {spent[1]}\\n")
atexit.register(report)
"""
CLI = "import sys\nsys.argv[0] = 'ggtool'\nfrom ggtool.commands import console\nconsole()\n"


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def generate(python: str, prelude: str, model: str, cache: str, tokens: int) -> tuple[float, float, float]:
    """Wall and CPU seconds of one run, and the CPU seconds it spent in packs.load (0 for another checkout)."""
    log = os.path.join(os.path.dirname(cache), "load.log")
    env = dict(os.environ, GGTOOL_CACHE_DIR=cache, BENCH_LOAD_LOG=log)
    env.pop("NUMBA_CACHE_DIR", None)
    if python == sys.executable:
        prelude = TIMED + prelude
    cmd = [python, "-c", prelude + CLI, "generate", "--gguf", model, "--prompt", PROMPT, "-n", str(tokens), "-t", "1"]
    if os.path.exists(log):
        os.unlink(log)
    t, c = time.perf_counter(), _cpu()
    subprocess.run(cmd, env=env, check=True, cwd="/", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    took, cpu = time.perf_counter() - t, _cpu() - c
    loads = float(open(log).read().split()[0]) if os.path.exists(log) else 0.0
    wait_for_compiler(cache)
    return took, cpu, loads


def wait_for_compiler(cache: str, timeout: float = 600.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        tag = sys.implementation.cache_tag
        if not [f for d, _, fs in os.walk(cache) if os.path.basename(d) == "wanted" for f in fs if f.endswith(tag)]:
            return
        time.sleep(0.2)


def tiles(model: str, cache: str) -> None:
    """Map and check every tile of `model` in this process, with and without the CRC."""
    os.environ["GGTOOL_CACHE_DIR"] = cache
    import mmap
    import zlib

    import numpy as np

    import ggtool.quant.packs as P

    where = P.folder(model)
    names = sorted(f for f in os.listdir(where) if f.endswith(".pack"))
    size = sum(os.path.getsize(os.path.join(where, f)) for f in names)

    def load_all() -> float:
        t = time.perf_counter()
        for f in names:
            with open(os.path.join(where, f), "rb") as fh:      # mapped as packs.load maps a tile
                m = np.frombuffer(mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_COPY), np.uint8)
            import json
            key = json.loads(bytes(m[16:4096]).rstrip(b"\0"))["key"]
            problem, _ = P._check(m, _Key(key), crc=True)
            assert problem is None, problem
        return time.perf_counter() - t

    load_all()    # pages in
    checked = statistics.median(load_all() for _ in range(5))
    stored = {}
    real = P._check

    def unchecked(m, key, crc=True):
        stored["v"] = int.from_bytes(bytes(m[8:16]), "little")
        P.zlib = type("Z", (), {"crc32": staticmethod(lambda data, value=0: stored["v"])})
        try:
            return real(m, key)
        finally:
            P.zlib = zlib
    P._check = unchecked
    bare = statistics.median(load_all() for _ in range(5))
    P._check = real
    print(f"  tiles: {len(names)} files, {size / 1e6:.1f} MB for a {os.path.getsize(model) / 1e6:.1f} MB file "
          f"({size / os.path.getsize(model):.2f}x); mapped and checked {checked:.3f} s, without the CRC {bare:.3f} s: "
          f"the CRC costs {checked - bare:.3f} s ({size / 1e9 / max(checked - bare, 1e-9):.1f} GB/s)")


class _Key:
    """A key whose repr is the stored one (the tile names its own key)."""

    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return self.text


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--models", default="gemma,qwen")
    ap.add_argument("--tokens", type=int, default=8)
    ap.add_argument("--other", default="", help="a Python whose ggtool is another checkout, measured alike")
    ap.add_argument("--tiles-of", nargs=2, metavar=("MODEL", "CACHE"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.tiles_of:
        tiles(*a.tiles_of)
        return
    folder = Path(os.environ.get("BENCH_MODELS", "/work/bench-env/models"))
    variants = {"shipped": (sys.executable, ""), "CRC always": (sys.executable, EVERY_MAP), "no CRC": (sys.executable, UNCHECKED)}
    if a.other:
        variants["other"] = (a.other, "")
    for name in a.models.split(","):
        model = str(folder / MODELS[name])
        with tempfile.TemporaryDirectory() as tmp:
            caches = {v: os.path.join(tmp, "other" if v == "other" else "this") for v in variants}
            for v, (python, prelude) in variants.items():
                for _ in range(2):
                    generate(python, prelude, model, caches[v], a.tokens)
            print(f"{name}: {MODELS[name]}, {a.tokens} tokens, -t 1, {a.runs} rounds")
            subprocess.run([sys.executable, __file__, "--tiles-of", model, caches["shipped"]], check=True)
            times: dict[str, list[tuple[float, float, float]]] = {v: [] for v in variants}
            for _ in range(a.runs):
                for v, (python, prelude) in variants.items():
                    times[v].append(generate(python, prelude, model, caches[v], a.tokens))
            med = {v: tuple(statistics.median(x[k] for x in ts) for k in range(3)) for v, ts in times.items()}
            for v, (wall, cpu, loads) in med.items():
                print(f"  {v:10s} wall {wall:.2f} s  cpu {cpu:.2f} s (in packs.load {loads:.3f} s, {loads / cpu:.1%})   "
                      f"shipped/{v}: wall {med['shipped'][0] / wall:.3f}x  cpu {med['shipped'][1] / cpu:.3f}x")


if __name__ == "__main__":
    main()
