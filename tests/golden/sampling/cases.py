"""The fixed-logits cases of tests/golden/sampling/ (README.md): each seed's sampler settings and the
logits of each step, made from Python's own `random` (its random() stream is stable across
versions), with numpy and the standard library only, so that make.py (llama.cpp's samplers, through
llama-cpp-python) and ggtool's test read the same cases.
"""

from __future__ import annotations

import hashlib
import random

import numpy as np

SEEDS = 1000
STEPS = 256
PROMPT = (1, 5, 9, 5, 7, 5, 11, 13)   # accepted before the first step (the penalties count them)

# Sampling fields (ggtool.generate.Sampling's names) per configuration; "vocab" is the logits' size
# ("stories" is stories260K's 512 tokens, whose vocabulary DRY reads). Seed s uses CONFIGS[s % len].
CONFIGS = [
    {"name": "defaults", "vocab": 2048},
    {"name": "temp 1.2, no top-k/top-p/min-p", "vocab": 2048, "temperature": 1.2, "top_k": 0, "top_p": 1.0, "min_p": 0.0},
    {"name": "penalties", "vocab": 2048, "repeat_penalty": 1.3, "frequency_penalty": 0.2, "presence_penalty": 0.3,
     "repeat_last_n": 32},
    {"name": "top-p 0.9 over all (bucket sort)", "vocab": 2048, "top_k": 0, "top_p": 0.9, "min_p": 0.0},
    {"name": "top-k 200 (bucket sort), top-p 0.98, temp 1", "vocab": 2048, "top_k": 200, "top_p": 0.98, "temperature": 1.0},
    {"name": "typical 0.9", "vocab": 2048, "top_k": 100, "typical_p": 0.9},
    {"name": "xtc", "vocab": 2048, "top_k": 0, "min_p": 0.02, "xtc_probability": 0.5, "xtc_threshold": 0.1},
    {"name": "top-n-sigma 1.5", "vocab": 2048, "top_k": 0, "top_n_sigma": 1.5},
    {"name": "mirostat 2", "vocab": 2048, "mirostat": 2},
    {"name": "mirostat 1", "vocab": 2048, "mirostat": 1},
    {"name": "temp 0 (greedy)", "vocab": 2048, "temperature": 0.0},
    {"name": "dynamic temperature", "vocab": 2048, "dynatemp_range": 0.5, "dynatemp_exponent": 1.2},
    {"name": "dry", "vocab": "stories", "dry_multiplier": 0.8, "repeat_penalty": 1.1},
    {"name": "logit bias", "vocab": 2048, "logit_bias": [[3, 2.5], [17, -1.0], [40, float("-inf")]]},
    {"name": "top-k 1000, min-p 0.01, temp 1.5", "vocab": 2048, "top_k": 1000, "min_p": 0.01, "top_p": 1.0,
     "temperature": 1.5},
]


def config(seed: int) -> dict:
    return CONFIGS[seed % len(CONFIGS)]


def vocab_size(cfg: dict) -> int:
    return 512 if cfg["vocab"] == "stories" else int(cfg["vocab"])


def logits(n_vocab: int, step: int) -> np.ndarray:
    """Step `step`'s logits: values in [-8, 8) on a grid of 1/8 (so many are equal, as the sorts'
    order of equal logits is part of what is checked), a few tokens raised by 6 to 10 (a peak)."""
    r = random.Random(1000003 * n_vocab + step)
    x = np.array([round((r.random() * 16.0 - 8.0) * 8.0) / 8.0 for _ in range(n_vocab)], np.float32)
    for _ in range(1 + step % 5):
        x[int(r.random() * n_vocab)] += np.float32(6 + int(r.random() * 5))
    return x


def digest(draws) -> str:
    return hashlib.sha256(",".join(str(int(t)) for t in draws).encode()).hexdigest()[:16]
