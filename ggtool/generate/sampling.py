"""Picking the next token from the last position's logits: greedy (temperature 0) or sampled."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..kernels import portable_math


@dataclass(frozen=True)
class Sampling:
    """temperature 0 is greedy (argmax, the first of equal maxima, as llama.cpp's greedy sampler);
    otherwise top-k (0: all), then top-p (1.0: all), then a draw from softmax(logits / temperature)
    with numpy's PCG64 seeded by `seed` (llama.cpp's own RNG differs: equal seeds give other draws)."""

    temperature: float = 0.0
    top_k: int = 40
    top_p: float = 0.95
    seed: int | None = None

    def sampler(self):
        """A function logits -> token id (holding its own RNG)."""
        if self.temperature <= 0:
            return lambda logits: int(np.argmax(logits))
        rng = np.random.default_rng(self.seed)

        def sample(logits: np.ndarray) -> int:
            logits = np.asarray(logits, np.float64)
            order = np.argsort(-logits, kind="stable")
            if self.top_k > 0:
                order = order[:self.top_k]
            z = logits[order] / self.temperature
            p = portable_math.exp(z - z[0])      # the same probabilities on every host
            p /= p.sum()
            if self.top_p < 1.0:
                keep = int(np.searchsorted(np.cumsum(p), self.top_p)) + 1
                order, p = order[:keep], p[:keep] / p[:keep].sum()
            return int(order[rng.choice(len(order), p=p)])

        return sample
