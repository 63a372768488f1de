"""The reference run of bench_coldstart.py and bench_memory.py: llama.cpp (llama-cpp-python, from the
bench environment, never a dependency of ggtool) loads a GGUF and evaluates a batch of tokens with
logits for every one of them, as `ggtool compute -f ggtool/programs/<arch>.gg` does; timed and measured by
the caller as a whole process.

    /work/bench-env/venv/bin/python bench/llama_cpp_run.py MODEL.gguf --threads T --tokens 1,2,3 | --token-file T.npy
"""

from __future__ import annotations

import argparse

import llama_cpp


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--tokens", default="")
    ap.add_argument("--token-file", default="")
    a = ap.parse_args()
    if a.token_file:
        import numpy as np
        tokens = [int(t) for t in np.load(a.token_file)]
    else:
        tokens = [int(t) for t in a.tokens.split(",")]
    n = len(tokens)
    llm = llama_cpp.Llama(a.model, n_ctx=max(n, 32), n_batch=n, n_ubatch=n, n_threads=a.threads,
                          n_threads_batch=a.threads, logits_all=True, verbose=False)
    llm.eval(tokens)
    assert llm.scores[:n].shape[0] == n


if __name__ == "__main__":
    main()
