"""llama-perplexity's arithmetic on a row of logits, in its float widths (tools/perplexity/
perplexity.cpp, built without -march: no FMA), vectorized over the rows of a piece.

- `nll`: its log_softmax for PPL: float max, the sum of expf(l - max) in double, and
  -(logit[tok] - max - log(sum)) in double.
- `encode_full`: the base-logits row it writes for a KL divergence: scale and the smallest
  log-probability as two floats in the first four uint16, then each logit as uint16 steps of
  (max - min) / 65535 above min, where min is at most 16 nats below the max (llama.cpp's floor:
  anything lower is stored as 0); and the nll, computed there in float.
- `kld_full`: its KL divergence of a row against such a base row, with the sums it keeps.
- `encode_top_k` / `kld_top_k`: ggtool's base rows that keep each row's K largest
  log-probabilities and the mass of the rest exactly (docs/evaluate.md).

expf is taken as float64 exp rounded to float32 (correctly rounded; glibc's expf is within 0.502
ulp), the double sums as numpy sums them (pairwise, not in sequence): both differences are far below
what llama-perplexity prints.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

F32, F64 = np.float32, np.float64
FLOOR_NATS = F32(16)           # llama.cpp's: log-probabilities more than 16 nats below the top are dropped


def _expf(x: np.ndarray) -> np.ndarray:
    return np.exp(x.astype(F64)).astype(F32)


def _max_and_sum(logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row: the float max, and sum_i expf(l_i - max) accumulated in double."""
    m = logits.max(axis=1)
    s = np.empty(len(logits), F64)
    for r in range(len(logits)):           # a row at a time: no (rows, n_vocab) float64 temporary
        s[r] = _expf(logits[r] - m[r]).sum(dtype=F64)
    return m, s


def nll(logits: np.ndarray, next_tokens: np.ndarray) -> np.ndarray:
    """-log p(next token) per row, as llama-perplexity's PPL (float64)."""
    m, s = _max_and_sum(logits)
    picked = logits[np.arange(len(logits)), next_tokens]
    return -((picked - m).astype(F64) - np.log(s))


def row_width(n_vocab: int) -> int:
    """uint16 values per base row: two floats, the vocabulary, padded to an even count."""
    return 2 * ((n_vocab + 1) // 2) + 4


def encode_full(logits: np.ndarray, next_tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(rows of uint16 as llama-perplexity writes them, their nll in its float arithmetic)."""
    n_rows, n_vocab = logits.shape
    out = np.zeros((n_rows, row_width(n_vocab)), np.uint16)
    m, s = _max_and_sum(logits)
    lo = np.maximum(logits.min(axis=1), m - FLOOR_NATS)
    lse = np.log(s).astype(F32)
    min_log_prob = (lo - m) - lse
    scale = (m - lo) / F32(65535)
    head = out[:, :4].view(F32)
    head[:, 0], head[:, 1] = scale, min_log_prob
    for r in range(n_rows):
        if scale[r]:
            row = logits[r]
            q = np.rint((F32(1) / scale[r]) * (row - lo[r])).astype(np.int64).astype(np.uint16)
            out[r, 4:4 + n_vocab] = np.where(row > lo[r], q, np.uint16(0))
    picked = logits[np.arange(n_rows), next_tokens]
    return out, ((m + lse) - picked).astype(F64)


def decode_full(rows: np.ndarray, n_vocab: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(scale, min log-prob, uint16 values) of base rows."""
    head = np.ascontiguousarray(rows[:, :4]).view(F32)
    return head[:, 0], head[:, 1], rows[:, 4:4 + n_vocab]


@dataclass
class KLDSums:
    """llama-perplexity's kl_divergence_result: what it sums over the scored tokens, and the
    per-token KL divergences and probability differences (float32) for its percentiles."""

    sum_nll: float = 0.0
    sum_nll2: float = 0.0
    sum_nll_base: float = 0.0
    sum_nll_base2: float = 0.0
    sum_nll_nll_base: float = 0.0
    sum_kld: float = 0.0
    sum_kld2: float = 0.0
    sum_p_diff: float = 0.0
    sum_p_diff2: float = 0.0
    sum_p_diff4: float = 0.0
    max_p_diff: float = 0.0
    n_same_top: int = 0
    count: int = 0
    sum_bound: float = 0.0       # top-K files: the sum of each token's bound on what the rest's mass hides
    sum_rest: float = 0.0        # top-K files: the sum of the rest's mass
    kld: list = field(default_factory=list)      # float32 arrays, one per piece
    p_diff: list = field(default_factory=list)

    def add(self, nll_q, nll_base, kld, p_diff, same_top, bound=None, rest=None) -> None:
        """One piece's rows: nll (float32) of the model and the base, their KL divergences
        (float64), probability differences (float32) and whether their argmax agree."""
        nq, nb = nll_q.astype(F64), nll_base.astype(F64)
        self.sum_nll += float(nq.sum())
        self.sum_nll2 += float((nll_q * nll_q).astype(F64).sum())
        self.sum_nll_base += float(nb.sum())
        self.sum_nll_base2 += float((nll_base * nll_base).astype(F64).sum())
        self.sum_nll_nll_base += float((nll_q * nll_base).astype(F64).sum())
        self.sum_kld += float(kld.sum())
        self.sum_kld2 += float((kld * kld).sum())
        pd = p_diff.astype(F64)
        pd2 = (p_diff * p_diff).astype(F64)
        self.sum_p_diff += float(pd.sum())
        self.sum_p_diff2 += float(pd2.sum())
        self.sum_p_diff4 += float((pd2 * pd2).sum())
        if len(p_diff):
            self.max_p_diff = max(self.max_p_diff, float(np.abs(p_diff).max()))
        self.n_same_top += int(np.count_nonzero(same_top))
        self.count += len(kld)
        if bound is not None:
            self.sum_bound += float(bound.sum())
            self.sum_rest += float(rest.sum())
        self.kld.append(kld.astype(F32))
        self.p_diff.append(p_diff.astype(F32))


def _q_side(logits: np.ndarray, next_tokens: np.ndarray):
    """The evaluated model's side of a KLD row: argmax (the first), float max + log-sum-exp, nll (float32)."""
    m, s = _max_and_sum(logits)
    imax = logits.argmax(axis=1)
    lse = np.log(s).astype(F32)
    picked = logits[np.arange(len(logits)), next_tokens]
    nll_q = (m + lse) - picked
    return imax, m + lse, nll_q


def kld_full(logits: np.ndarray, next_tokens: np.ndarray, base_rows: np.ndarray, sums: KLDSums) -> None:
    """The KL divergence of each row against llama.cpp base rows, added to `sums` (its arithmetic:
    base log-probabilities scale*v + min in float, those above -16 counted)."""
    n_rows, n_vocab = logits.shape
    scale, min_lp, values = decode_full(base_rows, n_vocab)
    imax, top, nll_q = _q_side(logits, next_tokens)
    idx = np.arange(n_rows)
    nll_base = -(scale * values[idx, next_tokens].astype(F32) + min_lp)
    kld = np.empty(n_rows, F64)
    imax_base = np.empty(n_rows, np.int64)
    for r in range(n_rows):
        lp = scale[r] * values[r].astype(F32) + min_lp[r]           # float, as llama.cpp
        imax_base[r] = int(lp.argmax())
        keep = lp > F32(-16)
        lpk = lp[keep]
        kld[r] = (_expf(lpk) * ((lpk - logits[r][keep]) + top[r])).astype(F64).sum()
    p_diff = _expf(-nll_q) - _expf(-nll_base)
    sums.add(nll_q, nll_base, kld, p_diff, imax == imax_base)


def encode_top_k(logits: np.ndarray, next_tokens: np.ndarray, k: int):
    """ggtool's top-K base rows: (ids int32 (rows, k), log-probabilities float32 (rows, k), both by
    decreasing probability; log of the rest's mass, float32 (-inf where nothing is left); the next
    token's log-probability, float32), and the rows' nll in llama-perplexity's float arithmetic."""
    n_rows, n_vocab = logits.shape
    m, s = _max_and_sum(logits)
    lse = np.log(s)
    ids = np.argpartition(-logits, k - 1, axis=1)[:, :k] if k < n_vocab else np.tile(np.arange(n_vocab), (n_rows, 1))
    top = np.take_along_axis(logits, ids, 1)
    order = np.argsort(-top, axis=1, kind="stable")
    ids = np.take_along_axis(ids, order, 1).astype(np.int32)
    top = np.take_along_axis(top, order, 1)
    lp = ((top - m[:, None]).astype(F64) - lse[:, None])
    rest = np.empty(n_rows, F64)
    for r in range(n_rows):          # the rest's mass summed directly: 1 - sum(top) would cancel
        e = _expf(logits[r] - m[r]).astype(F64)
        e[ids[r]] = 0
        rest[r] = e.sum() / s[r]
    with np.errstate(divide="ignore"):
        log_rest = np.log(rest).astype(F32)
    picked = logits[np.arange(n_rows), next_tokens]
    lp_next = ((picked - m).astype(F64) - lse).astype(F32)
    nll_f = ((m + lse.astype(F32)) - picked).astype(F64)
    return ids, lp.astype(F32), log_rest, lp_next, nll_f


def kld_top_k(logits: np.ndarray, next_tokens: np.ndarray, ids, lp, log_rest, lp_next, sums: KLDSums) -> None:
    """KL(base || model) per row from top-K base rows: the K kept tokens exactly, the rest as one
    outcome (its mass against the model's mass on the same tokens), a lower bound on the full
    divergence; and per row an upper bound on what the rest hides (docs/evaluate.md)."""
    n_rows, n_vocab = logits.shape
    imax, top_q, nll_q = _q_side(logits, next_tokens)
    lq_all_k = (np.take_along_axis(logits, ids.astype(np.int64), 1) - top_q[:, None]).astype(F64)
    p = np.exp(lp.astype(F64))
    kld = (p * (lp.astype(F64) - lq_all_k)).sum(axis=1)
    rest = np.exp(log_rest.astype(F64))
    bound = np.zeros(n_rows, F64)
    for r in range(n_rows):
        if rest[r] <= 0:
            continue
        lq = (logits[r] - top_q[r]).astype(F64)
        tail = np.ones(n_vocab, bool)
        tail[ids[r]] = False
        lq_tail = lq[tail]
        q_rest = np.exp(lq_tail).sum()
        if q_rest <= 0:
            kld[r] = np.inf
            bound[r] = 0
            continue
        kld[r] += rest[r] * (np.log(rest[r]) - np.log(q_rest))
        # the rest's own divergence is at most log max(P'/Q') <= log(min(1, p_K/rest)) - log(min Q')
        log_p_max = min(0.0, float(lp[r, -1]) - float(np.log(rest[r])))
        bound[r] = rest[r] * (log_p_max - (lq_tail.min() - np.log(q_rest)))
    nll_base = -lp_next
    p_diff = _expf(-nll_q) - _expf(-nll_base)
    sums.add(nll_q, nll_base.astype(F32), kld, p_diff, imax == ids[:, 0], bound, rest)
