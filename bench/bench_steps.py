"""Issue 30's diagnosis: where a decode step's time goes, step by step and participant by participant.

    python bench/bench_steps.py [--model PATH | --shape issue|small] [--threads 1,2] [--context 64] [--steps 64]

A decode step of the model (the bench_scaling model by default: bench_scaling's --shape and files) is
run `--steps` times after `--context` tokens, with a worker pool of T participants. Each participant
runs the compiled steps one at a time (the runner's loop over a one-step program, the barrier called
apart), timing each step's kernel and its wait at the barrier; the table sums them by op and src0
shape, in microseconds a decode step, for every participant: `kernel` is the work a participant did,
`wait` the time it spent at the barrier after it (another was still working), so that the kernels'
speed-up with T and the steps that leave a participant waiting show side by side. The loop returns to
Python between steps (~10 us a step on a 2-core machine, counted in `kernel`), so the totals are
above a real step's: `step` gives the real one (the same decode steps run as ggtool runs them).

The one-step loop (a node without a compiled kernel runs its forward, as the runner does) replaces
`ggtool.runner.participate` in this process and in the workers it forks (the pool is closed and its
workers forked again after the patch): it is a measurement, not a way to run. Its waits are larger
than a real step's (each participant's Python between steps), its kernel times are the real ones.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_scaling import SHAPES, model_path  # noqa: E402


def step_by_step(out_dir: str):
    """A replacement for runner.participate that runs each step alone and records its kernel and
    barrier times into out_dir/<pid>.json (per bound program and step)."""
    import numpy as np

    from ggtool import runner
    from ggtool.kernels import runner as kr

    times: dict = {}
    calls: collections.Counter = collections.Counter()

    def participate(bound, nodes, ith, nth, work, sync, progress=None):
        for prologue in bound.prologues:
            prologue()
        runner.deal_from(bound, sync, nth)     # else each participant computes every unit of a dealt step
        steps = bound.steps.copy()
        flags = steps[:, kr.S_FLAGS].copy()
        steps[:, kr.S_FLAGS] &= ~kr.BARRIER
        wdata = int(work.wdata.ctypes.data)
        for s in range(len(steps)):
            t0 = time.perf_counter_ns()
            r = kr.run(steps[s:s + 1], bound.rows, bound.frows, ith, nth, wdata, sync.addr, sync.at_node,
                       kr.new_state(), sync.spin_ns, time.monotonic_ns() + 10**10)
            node = nodes[int(steps[s, kr.S_NODE])]
            if r == kr.PYTHON:                   # a node without a compiled kernel: its forward, as participate runs it
                alone = flags[s] & kr.ONLY0
                with np.errstate(all="ignore"):
                    runner.run_node(int(steps[s, kr.S_NODE]), node, 0 if alone else ith, 1 if alone else nth, work)
            elif r != kr.DONE:
                raise RuntimeError(f"step {s} of node {node.name} answered {r}")
            t1 = time.perf_counter_ns()
            if flags[s] & kr.BARRIER and nth > 1:
                sync.barrier()
            t2 = time.perf_counter_ns()
            src = node.src[0] if node.src and node.src[0] is not None else None
            key = f"{id(bound)}:{s}"
            k, w, _ = times.get(key, (0, 0, None))
            times[key] = (k + t1 - t0, w + t2 - t1, [node.op, list(src.ne) if src is not None else None])
        calls[id(bound)] += 1
        with open(os.path.join(out_dir, f"{os.getpid()}.json"), "w") as f:
            json.dump({"ith": ith, "nth": nth, "calls": {str(b): n for b, n in calls.items()}, "times": times}, f)
        return None

    runner.participate = participate


def table(out_dir: str, n: int) -> list[tuple]:
    """Per participant: (op, src0 ne) -> (steps, kernel us, wait us) a decode step, from the most
    called program (the decode step's) of each process."""
    per = {}
    for name in os.listdir(out_dir):
        with open(os.path.join(out_dir, name)) as f:
            d = json.load(f)
        if d["nth"] != n:
            continue
        bound = max(d["calls"], key=lambda b: d["calls"][b])
        calls = d["calls"][bound]
        rows = collections.defaultdict(lambda: [0, 0.0, 0.0])
        for key, (k, w, what) in d["times"].items():
            if key.split(":")[0] == bound:
                r = rows[(what[0], str(what[1]))]
                r[0] += 1
                r[1] += k / calls / 1e3
                r[2] += w / calls / 1e3
        per[d["ith"]] = rows
    return [per[i] for i in sorted(per)]


SIDE = r"""
import json, sys, time
args = json.loads(sys.argv[1])
sys.path.insert(0, args["bench"])
from ggtool.pool.launch import prestart
prestart(args["threads"])
import numpy as np
from ggtool.dsl import parse
from ggtool.generate import Session, shipped_program
from ggtool.gguf_io import open_gguf
n = args["threads"]
program = shipped_program(open_gguf(args["model"]).metadata("general.architecture", "llama"))
session = Session(args["model"], parse(program.read_text(), str(program)), n_ctx=args["context"] + 2 * args["steps"] + 8)
session.prepare(args["context"], 1)
if n > 1:
    from ggtool.pool import get_pool
    session.pool = get_pool(n)
session.n_threads = n
prompt = list(range(1, args["context"] + 1))
def decode(k, logits):
    for _ in range(k):
        logits = session.eval([int(np.argmax(logits))])
    return logits
logits = decode(4, session.eval(prompt))                  # warm-up: kernels loaded, graphs built
t = time.perf_counter()
logits = decode(args["steps"], logits)
step = (time.perf_counter() - t) / args["steps"]
session.reset()
if args["out"]:
    from bench_steps import step_by_step
    step_by_step(args["out"])
    if n > 1:
        from ggtool.pool import close_pool
        close_pool()                      # workers forked anew, after the patch
        from ggtool.pool import get_pool
        session.pool = get_pool(n)
    decode(args["steps"], decode(4, session.eval(prompt)))
print(json.dumps({"step_ms": step * 1e3}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="issue")
    ap.add_argument("--ftype", default="Q4_0")
    ap.add_argument("--models-dir", type=Path, default=Path(tempfile.gettempdir()) / "ggtool-bench-scaling")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--context", type=int, default=64)
    ap.add_argument("--steps", type=int, default=64)
    a = ap.parse_args()
    model = a.model or model_path(a.models_dir, a.shape, 0, a.ftype)
    import subprocess

    for n in [int(t) for t in a.threads.split(",")]:
        with tempfile.TemporaryDirectory() as out:
            arg = {"model": str(model), "threads": n, "context": a.context, "steps": a.steps, "out": out,
                   "bench": str(Path(__file__).resolve().parent)}
            r = subprocess.run([sys.executable, "-c", SIDE, json.dumps(arg)], capture_output=True, text=True,
                               cwd=tempfile.gettempdir())
            if r.returncode:
                raise SystemExit(f"failed at {n} threads:\n{r.stderr[-3000:]}")
            step = json.loads(r.stdout.strip().splitlines()[-1])["step_ms"]
            parts = table(out, n)
        print(f"\n{n} thread(s): a decode step {step:.2f} ms ({1e3 / step:.1f} tokens/s); per step, us:")
        head = f"{'op':>10} {'src0 ne':>22} {'steps':>5}" + "".join(f" {f'k{i}':>8} {f'w{i}':>8}" for i in range(n))
        print(head)
        keys = sorted(parts[0], key=lambda k: -parts[0][k][1])
        for key in keys:
            print(f"{key[0]:>10} {key[1]:>22} {parts[0][key][0]:5d}"
                  + "".join(f" {p[key][1]:8.1f} {p[key][2]:8.1f}" for p in parts))
        print(f"{'total':>10} {'':>22} {'':>5}" + "".join(f" {sum(r[1] for r in p.values()):8.1f} "
                                                           f"{sum(r[2] for r in p.values()):8.1f}" for p in parts))


if __name__ == "__main__":
    main()
