"""Make tests/golden/qwen/llama-cpp-tiny-qwen.npz: llama.cpp's logits on the tiny qwen2/qwen3 models.

    python tests/golden/qwen/make_golden.py --llama-python /work/bench-env/venv/bin/python

Writes the models with tests/tiny_qwen.py (deterministic: their sha256 go into the file), then runs
llama-cpp-python in that python (a bench environment's: never a dependency of ggtool) on each prompt:
one batch from an empty F32 K/V cache (`logits_all`: every position's logits), then GREEDY_STEPS
tokens, each the argmax of the last logits fed back alone through llama.cpp's KV cache.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))
from tiny_qwen import write_tiny  # noqa: E402

PROMPTS = [[72, 101, 108, 108, 111, 44, 32, 119, 111, 114, 108, 100], [84, 258, 32, 99, 97, 116]]
GREEDY_STEPS = 8

LLAMA_RUN = """
import sys, json, numpy as np
import llama_cpp
path, prompts, steps, out = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
llm = llama_cpp.Llama(model_path=path, n_ctx=64, n_batch=64, n_ubatch=64, n_threads=1, n_threads_batch=1,
                      logits_all=True, verbose=False, type_k=0, type_v=0)
res = {}
for i, prompt in enumerate(prompts):
    llm.reset()
    llm.eval(prompt)
    res[f"prompt_logits_{i}"] = np.array(llm.scores[:len(prompt)], np.float32)   # a copy: the next eval reuses scores
    greedy, step_logits = [], []
    for _ in range(steps):
        tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        greedy.append(tok)
        llm.eval([tok])
        step_logits.append(np.array(llm.scores[llm.n_tokens - 1], np.float32))
    res[f"greedy_{i}"] = np.array(greedy, np.int32)
    res[f"step_logits_{i}"] = np.stack(step_logits)
np.savez(out, **res)
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-python", required=True)
    args = ap.parse_args()
    data = {}
    with tempfile.TemporaryDirectory() as tmp:
        for arch in ("qwen2", "qwen3"):
            model = write_tiny(Path(tmp) / f"tiny-{arch}.gguf", arch)
            data[f"{arch}_sha256"] = np.array(hashlib.sha256(model.read_bytes()).hexdigest())
            out = Path(tmp) / f"{arch}.npz"
            subprocess.run([args.llama_python, "-c", LLAMA_RUN, str(model), json.dumps(PROMPTS), str(GREEDY_STEPS),
                            str(out)], check=True)
            with np.load(out) as ref:
                data.update({f"{arch}_{k}": ref[k] for k in ref.files})
    for i, p in enumerate(PROMPTS):
        data[f"prompt_{i}"] = np.array(p, np.int32)
    np.savez_compressed(HERE / "llama-cpp-tiny-qwen.npz", **data)


if __name__ == "__main__":
    main()
