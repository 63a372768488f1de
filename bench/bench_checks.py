"""Issue 19 figures: what the safety checks cost. This checkout against another (the code before the
checks), timed in the same run, in interleaved rounds, the same way for both.

    git worktree add /tmp/before 8ae83fe          # the code before issue 19
    python bench/bench_checks.py --before /tmp/before --runs 11

- llama: ggtool/programs/llama.gg on fixtures/stories260K.gguf, 512 tokens, `ggtool compute --threads 1
  -o logits.npy --time`: the whole process's wall time and ggtool's own build and compute phases
  (the views' checks run as the graph is built, the walks' as it computes), median of the rounds.
- chain: bench_alloc's 21 f32 mul_mats of 2048x2048 by 512 rows summed, `--threads 2 -o y.npy`.

Each checkout runs as `python -m ggtool` from a folder of links (its `ggtool/` with `commands/` as
`ggtool/commands`, as installed) on PYTHONPATH, so that neither pays for an entry-point script the
other does not. The target: after / before <= 1.03 for each figure.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_alloc import N_PRODUCTS, PROGRAM, STORIES, chain_program, interleaved, subprocess_env, wait_idle  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def as_installed(checkout: Path, into: Path) -> Path:
    """A folder whose `ggtool` package is the checkout's, `commands/` included (links only)."""
    pkg = into / "ggtool"
    pkg.mkdir(parents=True)
    for entry in (checkout / "ggtool").iterdir():
        if entry.name != "__pycache__":
            (pkg / entry.name).symlink_to(entry)
    (pkg / "commands").symlink_to(checkout / "commands")
    return into


def commands(checkouts: dict, d: str, args_of) -> dict:
    """{name: (command, env)} running `args_of(name)` under each checkout's ggtool."""
    out = {}
    for name, checkout in checkouts.items():
        env = subprocess_env(os.path.join(d, "pycache"))
        env["PYTHONPATH"] = str(as_installed(Path(checkout).resolve(), Path(d) / name))
        out[name] = ([sys.executable, "-m", "ggtool", *args_of(name)], env)
    return out


def report(title: str, t: dict, phases=()) -> None:
    print(f"\n== {title}")
    before, after = t["before"], t["after"]
    print(f"  wall     before {before[0]:7.3f} s   after {after[0]:7.3f} s   after/before {after[0] / before[0]:.3f}"
          " (target <= 1.03)")
    for p in phases:
        b, a = before[2].get(p, 0.0), after[2].get(p, 0.0)
        ratio = f"{a / b:.3f}" if b else "-"
        print(f"  {p:<8} before {b * 1e3:7.1f} ms  after {a * 1e3:7.1f} ms  after/before {ratio}")


def _program(checkout) -> Path:
    """The checkout's llama.gg: ggtool/programs/ now, fixtures/ in older trees."""
    new = Path(checkout) / "ggtool" / "programs" / PROGRAM.name
    return new if new.exists() else Path(checkout) / "fixtures" / PROGRAM.name


def llama(checkouts: dict, runs: int, n_tokens: int = 512) -> None:
    with tempfile.TemporaryDirectory() as d:
        tokens = os.path.join(d, "tokens.npy")
        np.save(tokens, np.concatenate([[1], (np.arange(n_tokens - 1) * 37 + 3) % 500 + 2]).astype(np.int32))
        cmds = commands(checkouts, d, lambda name: [   # each checkout's own program (the DSL grows)
            "compute", "-f", str(_program(checkouts[name])), "--gguf", str(STORIES),
            "--tensor", f"tokens={tokens}",
            "--threads", "1", "--time", "-o", os.path.join(d, f"{name}.npy")])
        wait_idle()
        t = interleaved(cmds, runs, d)
        same = np.load(os.path.join(d, "before.npy")).tobytes() == np.load(os.path.join(d, "after.npy")).tobytes()
    report(f"llama.gg on stories260K, {n_tokens} tokens, --threads 1, median of {runs} (logits identical: {same})",
           t, ("build", "compute"))


def chain(checkouts: dict, runs: int) -> None:
    with tempfile.TemporaryDirectory() as d:
        rng = np.random.default_rng(0)
        w, x = os.path.join(d, "w.npy"), os.path.join(d, "x.npy")
        np.save(w, rng.standard_normal((2048, 2048), dtype=np.float32))
        np.save(x, rng.standard_normal((512, 2048), dtype=np.float32))
        prog = os.path.join(d, "chain.gg")
        Path(prog).write_text(chain_program())
        cmds = commands(checkouts, d, lambda name: [
            "compute", "-f", prog, "--tensor", f"w={w}", "--tensor", f"x={x}", "--threads", "2", "--time",
            "-o", os.path.join(d, f"{name}.npy")])
        wait_idle()
        t = interleaved(cmds, runs, d)
        same = np.load(os.path.join(d, "before.npy")).tobytes() == np.load(os.path.join(d, "after.npy")).tobytes()
    report(f"the chain: {N_PRODUCTS + 1} f32 mul_mats summed, --threads 2, median of {runs} (results identical: {same})",
           t, ("build", "compute"))


FIGURES = {"llama": llama, "chain": chain}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("figures", nargs="*", metavar="FIGURE", help=f"{', '.join(FIGURES)} (default: all)")
    ap.add_argument("--before", required=True, metavar="DIR", help="a checkout of the code before the checks")
    ap.add_argument("--runs", type=int, default=9, help="timed rounds (median); a warm-up round is not counted")
    args = ap.parse_args()
    checkouts = {"before": args.before, "after": str(ROOT)}
    for name in args.figures or FIGURES:
        FIGURES[name](checkouts, args.runs)


if __name__ == "__main__":
    main()
