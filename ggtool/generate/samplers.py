"""llama.cpp's samplers (src/llama-sampler.cpp), one class each, computing what its own compute: the
same float operations in the same order, its sorts' order of equal logits, its generators' draws.

A sampler works on `Candidates`, llama.cpp's llama_token_data_array: token ids, their logits and
probabilities (float32), whether they are sorted by logit (descending) and which one is selected.
`apply` changes them, `accept` sees each token the chain keeps (the prompt's too), `reset` forgets.
`ggtool.generate.sampling` builds the chain in common_sampler's order.

Sorting: llama.cpp sorts candidates with std::partial_sort (128 or fewer wanted) or its bucket sort
(std::sort in each of 128 buckets of logit, std::partial_sort in the last one needed), neither
stable. Where the logits that matter are all distinct, any sort gives their order (numpy's, fast);
where two are equal, ggtool runs libstdc++'s steps (ggtool.generate.libstdcxx) to put them where
llama.cpp's build does.
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np

from . import libm
from .libstdcxx import MT19937, discrete, partial_sort, sort, uniform_double, uniform_float

f32 = np.float32
NEG_INF = f32(-np.inf)
_PARTIAL_SORT_MAX = 128   # llama_token_data_array_partial_sort_inplace: std::partial_sort up to here


class Candidates:
    """llama_token_data_array: `ids` (int32), `logit` and `p` (float32), `sorted`, `selected`.
    `identity` is True while the arrays hold every token in id order (index == id)."""

    __slots__ = ("ids", "logit", "p", "sorted", "selected", "identity")

    def __init__(self, logits: np.ndarray):
        self.logit = np.array(logits, np.float32)
        self.ids = np.arange(len(self.logit), dtype=np.int32)
        self.p = np.zeros(len(self.logit), np.float32)
        self.sorted, self.selected, self.identity = False, -1, True

    @classmethod
    def top(cls, logits: np.ndarray, k: int) -> Candidates:
        """Candidates(logits) after `top_k(cur, k)` (0 < k < len(logits)), made from the k it keeps
        alone: a decode step's chain, top-k first, then never builds three vocabulary-wide arrays."""
        logits = np.asarray(logits, np.float32)
        order = prefix_positions(logits, k)
        cur = cls.__new__(cls)
        cur.ids, cur.logit, cur.p = order.astype(np.int32), logits[order], np.zeros(len(order), np.float32)
        cur.sorted, cur.selected, cur.identity = True, -1, False
        return cur

    @property
    def size(self) -> int:
        return len(self.ids)

    def take(self, index) -> None:
        """Keep the candidates at `index` (an array of positions or a slice), in that order."""
        self.ids, self.logit, self.p = self.ids[index], self.logit[index], self.p[index]
        self.identity = False


# -- sorting -------------------------------------------------------------------------------------------
def _descending(logit: np.ndarray, n: int) -> np.ndarray:
    """Positions of the n largest logits, largest first (ties by position), and one more if there is
    one (to tell whether the n-th is tied with the next)."""
    size = len(logit)
    want = min(n + 1, size)
    block = 256
    blocks = size // block
    if size > 4096 and want <= blocks:
        # a lower bound of the want-th largest: the want-th largest of the blocks' maxima
        maxima = logit[:blocks * block].reshape(blocks, block).max(axis=1)
        bound = np.partition(maxima, blocks - want)[blocks - want]
        cand = np.flatnonzero(logit >= bound)
    else:
        cand = np.arange(size)
    order = cand[np.argsort(-logit[cand], kind="stable")]
    return order[:want]


def _ties(values: np.ndarray, n: int) -> bool:
    """Whether, among the first n of these descending values (and the next one), two are equal."""
    head = values[:n + 1]
    return bool(len(head) > 1 and (head[1:] == head[:-1]).any())


def sorted_prefix(cur: Candidates, n: int, need: int | None = None) -> np.ndarray:
    """The positions llama.cpp's llama_token_data_array_partial_sort_inplace(cur, n) leaves in its
    first `need` places (default n), in order."""
    return prefix_positions(cur.logit, n, need)


def prefix_positions(logit: np.ndarray, n: int, need: int | None = None) -> np.ndarray:
    """`sorted_prefix` of candidates whose logits are `logit` (float32)."""
    n = min(n, len(logit))
    need = n if need is None else min(need, n)
    order = _descending(logit, need)
    if not _ties(logit[order], need):
        return order[:need]
    if n <= _PARTIAL_SORT_MAX:
        return partial_sort(-logit.astype(np.float64), np.arange(len(logit)), n)[1][:need]
    return bucket_sort(logit, n, need)


def bucket_sort(logit: np.ndarray, n: int, need: int | None = None) -> np.ndarray:
    """llama_token_data_array_partial_sort (n > 128): the logits cut into 128 buckets over [-10, 10]
    (the outer ones open), the buckets that hold the n largest taken in input order, each sorted with
    std::sort, the last with std::partial_sort to what is missing. The positions of the first `need`
    (default n): the buckets past them are not sorted at all."""
    need = n if need is None else need
    scale = f32(128 / 20.0)
    inter = f32(10.0) * scale
    with np.errstate(invalid="ignore", over="ignore"):
        x = logit * scale + inter                       # float, as the compiler leaves it (no FMA)
        # int(x): truncation; what x86 gives for a value no int holds (INT_MIN) clamps to bucket 0
        bad = ~(np.abs(x) < f32(2147483648.0))
        ib = np.clip(np.where(bad, 0, np.trunc(np.where(bad, 0, x))).astype(np.int64), 0, 127)
    histo = np.bincount(ib, minlength=128)
    have = np.cumsum(histo[::-1])                       # buckets 127, 126, ...
    last = 127 - int(np.searchsorted(have, n))          # the bucket where n is reached
    out, done = [], 0
    keys = -logit.astype(np.float64)
    for j in range(127, last - 1, -1):
        if done >= need:
            break
        pos = np.flatnonzero(ib == j)
        if not len(pos):
            continue
        if j > last:
            out.append(sort(keys[pos], pos)[1])
        else:
            out.append(partial_sort(keys[pos], pos, n - done)[1])
        done += len(pos)
    return np.concatenate(out)[:need]


def softmax(cur: Candidates, do_sort: bool) -> None:
    """llama_sampler_softmax_impl: sorted first if asked, then p = expf(logit - max) / sum (float)."""
    if do_sort and not cur.sorted:
        partial_sort_inplace(cur, cur.size)
    max_l = cur.logit[0] if cur.sorted else cur.logit.max()
    p = libm.expf(cur.logit - max_l)
    total = np.cumsum(p, dtype=np.float32)[-1]          # a running sum in float, as the loop adds
    cur.p = p / total


def partial_sort_inplace(cur: Candidates, n: int) -> None:
    cur.take(sorted_prefix(cur, n))
    cur.sorted = True


# -- the samplers --------------------------------------------------------------------------------------
class Sampler:
    name = "?"

    def apply(self, cur: Candidates) -> None:
        raise NotImplementedError

    def accept(self, token: int) -> None:
        pass

    def reset(self) -> None:
        pass


class LogitBias(Sampler):
    """llama_sampler_logit_bias: each (token, bias) added to that token's logit."""

    name = "logit-bias"

    def __init__(self, biases):
        self.biases = [(int(t), f32(b)) for t, b in biases]

    def apply(self, cur):
        search = []
        for token, bias in self.biases:
            if 0 <= token < cur.size and cur.ids[token] == token:
                cur.logit[token] += bias
            else:
                search.append((token, bias))
        seen = set()
        for token, bias in search:        # a token not in its place: the first of its biases, once
            if token in seen:
                continue
            seen.add(token)
            at = np.flatnonzero(cur.ids == token)
            if len(at):
                cur.logit[at[0]] += bias


class Penalties(Sampler):
    """llama_sampler_penalties: the last `last_n` tokens' counts; a token seen is divided by the
    repeat penalty (multiplied, if its logit is <= 0), less count * frequency and presence."""

    name = "penalties"

    def __init__(self, last_n: int, repeat: float, freq: float, present: float):
        self.last_n = max(int(last_n), 0)
        self.repeat, self.freq, self.present = f32(repeat), f32(freq), f32(present)
        self.reset()

    def reset(self):
        self.prev: deque = deque(maxlen=max(self.last_n, 1))
        self.count: dict[int, int] = {}

    def accept(self, token):
        if self.last_n == 0:
            return
        self.count[token] = self.count.get(token, 0) + 1
        if len(self.prev) >= self.last_n:
            old = self.prev[0]
            self.count[old] -= 1
            if self.count[old] == 0:
                del self.count[old]
        self.prev.append(token)

    def apply(self, cur):
        if not self.count:
            cur.sorted = False
            return
        tokens = np.fromiter(self.count, np.int64, len(self.count))
        counts = np.fromiter(self.count.values(), np.float32, len(self.count))
        if cur.identity:
            pos, keep = tokens, tokens < cur.size
            pos, counts = pos[keep], counts[keep]
        else:
            where = {t: i for i, t in enumerate(cur.ids.tolist())}
            found = [(where[t], c) for t, c in zip(tokens.tolist(), counts.tolist()) if t in where]
            pos = np.array([f for f, _ in found], np.int64)
            counts = np.array([c for _, c in found], np.float32)
        x = cur.logit[pos]
        x = np.where(x <= 0, x * self.repeat, x / self.repeat)
        x = x - (counts * self.freq + (counts > 0).astype(np.float32) * self.present)
        cur.logit[pos] = x
        cur.sorted = False


class Dry(Sampler):
    """llama_sampler_dry: a token that would extend a repetition of the last tokens (longer than
    `allowed_length`, up to a sequence breaker) loses multiplier * base^(length - allowed)."""

    name = "dry"

    def __init__(self, vocab, multiplier: float, base: float, allowed_length: int, last_n: int,
                 breakers: list[str]):
        self.multiplier, self.base = f32(multiplier), f32(base)
        self.allowed, self.last_n = int(allowed_length), max(int(last_n), 0)
        self.breakers = _dry_breakers(vocab, breakers)
        self.reset()

    def reset(self):
        self.last: deque = deque(maxlen=max(self.last_n, 1))

    def accept(self, token):
        self.last.append(token)

    def apply(self, cur):
        last = list(self.last)
        n = min(len(last), self.last_n)
        if n <= self.allowed:
            return

        def rat(i):                   # ring_buffer::rat: the i-th from the end
            return last[len(last) - 1 - i]

        rep_limit = n
        for i in range(n):
            tails = self.breakers.get(rat(i))
            if not tails:
                continue
            longest = -1
            for tail in tails:
                if longest < len(tail) <= i and all(tail[o] == rat(i - o - 1) for o in range(len(tail))):
                    longest = len(tail)
            if longest >= 0:
                rep_limit = i - longest
                break
        if rep_limit < self.allowed:
            return
        count = [0] * n
        lt = rt = 0
        top = n - 1
        for k in range(1, n):         # the Z-algorithm, backwards (as llama.cpp's)
            if k > rt:
                m = 0
                while m + k < n and rat(m) == rat(m + k):
                    m += 1
                count[top - k] = min(m, rep_limit)
                if m > 0:
                    lt, rt = k, k + m - 1
            else:
                p = k - lt
                right = rt - k + 1
                if count[top - p] < right:
                    count[top - k] = min(count[top - p], rep_limit)
                else:
                    i = rt + 1
                    while i < n and rat(i) == rat(i - k):
                        i += 1
                    count[top - k] = min(i - k, rep_limit)
                    lt, rt = k, i - 1
        longest_at: dict[int, int] = {}
        for i in range(n - 1):
            length = count[i]
            if length >= self.allowed:
                token = rat(n - 2 - i)
                if longest_at.get(token, -1) < length:
                    longest_at[token] = length
        if not longest_at:
            cur.sorted = False
            return
        max_exponent = 0
        if self.base > f32(1.000001):
            max_exponent = int(f32(88.7228391) / libm.logf(self.base))
        where = {t: i for i, t in enumerate(cur.ids.tolist())} if not cur.identity else None
        for token, length in longest_at.items():
            if any(len(t) == 0 for t in self.breakers.get(token, ())):
                continue
            i = token if where is None else where.get(token)
            if i is None or i >= cur.size:
                continue
            exp = length - self.allowed
            if max_exponent > 0 and exp > max_exponent:
                exp = max_exponent
            penalty = f32(float(self.multiplier) * math.pow(float(self.base), exp))
            cur.logit[i] = cur.logit[i] - penalty
        cur.sorted = False


def _dry_breakers(vocab, breakers: list[str]) -> dict[int, list[list[int]]]:
    """get_overlapping_token_sequences for each breaker (at most 40 bytes, tails of at most 20
    tokens): token -> the token tails that, after it, complete a breaker ([] when it holds one)."""
    out: dict[int, list[list[int]]] = {}
    if vocab is None:
        return out
    words = [vocab.detokenize([t], unparse_special=True).encode("utf-8", "surrogatepass")
             for t in range(vocab.n_tokens)]
    for text in breakers:
        s = text.encode("utf-8")[:40]
        if not s:
            continue
        for tid, word in enumerate(words):
            if s in word:
                out.setdefault(tid, [])
                if [] not in out[tid]:
                    out[tid].append([])
                continue
            pos = word.find(s[:1])
            while pos != -1:
                i = 1
                match = True
                while i < len(s) and i + pos < len(word):
                    if word[pos + i] != s[i]:
                        match = False
                        break
                    i += 1
                if match:
                    tail = vocab.tokenize(s[i:].decode("utf-8", "replace"), False, False)[:20]
                    tails = out.setdefault(tid, [])
                    if tail not in tails:
                        tails.append(tail)
                pos = word.find(s[:1], pos + 1)
    return out


class TopNSigma(Sampler):
    """llama_sampler_top_n_sigma: logits below max - n * std (of the finite ones) go to -inf."""

    name = "top-n-sigma"

    def __init__(self, n: float):
        self.n = f32(n)

    def apply(self, cur):
        if cur.size <= 1:
            return
        x = cur.logit
        valid = x[x != NEG_INF]
        mx = max(cur.logit[0], valid.max()) if len(valid) else cur.logit[0]
        total = np.cumsum(valid, dtype=np.float32)[-1] if len(valid) else f32(0)
        mean = total / f32(len(valid)) if len(valid) else f32(0)
        acc = f32(0)
        for d in (valid - mean).tolist():   # acc += pow(d, 2): the square in double, the sum in float
            acc = f32(float(acc) + d * d)
        std = np.sqrt(acc / f32(len(valid))) if len(valid) else f32(0)
        cur.logit = np.where(x < mx - self.n * std, NEG_INF, x)


class TopK(Sampler):
    name = "top-k"

    def __init__(self, k: int):
        self.k = int(k)

    def apply(self, cur):
        top_k(cur, self.k)


def top_k(cur: Candidates, k: int) -> None:
    """llama_sampler_top_k_impl."""
    if k <= 0:
        return
    k = min(k, cur.size)
    if not cur.sorted:
        partial_sort_inplace(cur, k)
    cur.take(slice(0, k))


class Typical(Sampler):
    """llama_sampler_typical: the tokens whose surprise is nearest the entropy, until their
    probabilities pass p."""

    name = "typical"

    def __init__(self, p: float, min_keep: int):
        self.p, self.min_keep = f32(p), int(min_keep)

    def apply(self, cur):
        softmax(cur, True)
        logp = libm.logf_array(cur.p)
        entropy = f32(0)
        for term in (-cur.p * logp).tolist():
            entropy = f32(entropy + f32(term))
        shifted = np.abs(-logp - entropy)
        order = sort(shifted.astype(np.float64), np.arange(cur.size))[1]
        cum, last = f32(0), len(order)
        for i, idx in enumerate(order.tolist()):
            cum = f32(cum + cur.p[idx])
            if cum > self.p and (self.min_keep == 0 or i >= self.min_keep - 1):
                last = i + 1
                break
        cur.take(order[:last])
        cur.sorted = False


class TopP(Sampler):
    """llama_sampler_top_p: the most likely tokens until their probabilities reach p."""

    name = "top-p"

    def __init__(self, p: float, min_keep: int):
        self.p, self.min_keep = f32(p), int(min_keep)

    def apply(self, cur):
        softmax(cur, False)
        if cur.sorted:
            last = self._last(np.cumsum(cur.p, dtype=np.float32))
            cur.take(slice(0, cur.size if last is None else last))
            return
        order, last = None, None
        if cur.size > 1024:                              # an adaptive top-k first: the 256 most likely
            order = sorted_prefix(cur, 256)
            last = self._last(np.cumsum(cur.p[order], dtype=np.float32))
        if last is None:
            # all of them sorted (llama.cpp: std::partial_sort or the bucket sort of every token).
            # Where the running sum reaches p depends on the values alone (equal logits, equal
            # probabilities), so it is found in numpy's order, and only the tokens kept are put in
            # llama.cpp's order
            fast = _descending(cur.logit, cur.size)
            last = self._last(np.cumsum(cur.p[fast], dtype=np.float32)) or cur.size
            order = sorted_prefix(cur, cur.size, last)
        cur.take(order[:last])
        cur.sorted = True

    def _last(self, cum: np.ndarray):
        """The first i whose running sum reaches p with at least min_keep kept, + 1 (None if none)."""
        hit = np.flatnonzero((cum >= self.p) & (np.arange(1, len(cum) + 1) >= self.min_keep))
        return int(hit[0]) + 1 if len(hit) else None


class MinP(Sampler):
    """llama_sampler_min_p: the tokens whose logit is at least the largest + log(p)."""

    name = "min-p"

    def __init__(self, p: float, min_keep: int):
        self.p, self.min_keep = f32(p), int(min_keep)

    def apply(self, cur):
        if not cur.size:
            return
        if not cur.sorted:
            mx = max(f32(-np.finfo(np.float32).max), cur.logit.max())
            keep = np.flatnonzero(cur.logit >= mx + libm.logf(self.p))
            if len(keep) and len(keep) >= self.min_keep:
                cur.take(keep)
                return
            partial_sort_inplace(cur, cur.size)
        floor = cur.logit[0] + libm.logf(self.p)
        below = np.flatnonzero((cur.logit[1:] < floor) & (np.arange(1, cur.size) >= self.min_keep))
        cur.take(slice(0, int(below[0]) + 1 if len(below) else cur.size))


class Xtc(Sampler):
    """llama_sampler_xtc: with chance `probability`, the tokens above `threshold` but the least of
    them are removed. Its own std::mt19937, seeded as the chain's."""

    name = "xtc"

    def __init__(self, probability: float, threshold: float, min_keep: int, seed: int):
        self.probability, self.threshold, self.min_keep = f32(probability), f32(threshold), int(min_keep)
        self.seed_value = seed
        self.rng = MT19937(seed)

    def reset(self):
        self.rng.seed(self.seed_value)

    def apply(self, cur):
        if cur.size < 2:
            return
        if uniform_float(self.rng) > self.probability:
            return
        softmax(cur, True)
        above = cur.p >= self.threshold
        pos_last = 0
        for i in range(cur.size):
            if not above[i]:
                break
            pos_last = i
        if cur.size - pos_last >= self.min_keep and pos_last > 0:
            cur.take(slice(pos_last, cur.size))


def temp_impl(cur: Candidates, temp) -> None:
    """llama_sampler_temp_impl: logit / temp; temp <= 0 keeps only the first largest logit."""
    if not cur.size:
        return
    if temp <= 0:
        best = int(np.argmax(cur.logit))
        keep = cur.logit[best]
        cur.logit = np.full(cur.size, NEG_INF, np.float32)
        cur.logit[best] = keep
        return
    cur.logit = cur.logit / f32(temp)


class Temp(Sampler):
    name = "temp"

    def __init__(self, temp: float):
        self.temp = f32(temp)

    def apply(self, cur):
        temp_impl(cur, self.temp)


class TempExt(Sampler):
    """llama_sampler_temp_ext: the temperature, or with delta > 0 one between temp - delta and temp +
    delta chosen by the candidates' entropy (dynamic temperature)."""

    name = "temp-ext"

    def __init__(self, temp: float, delta: float, exponent: float):
        self.temp, self.delta, self.exponent = f32(temp), f32(delta), f32(exponent)

    def apply(self, cur):
        if not self.delta > 0:
            temp_impl(cur, self.temp)
            return
        lo = max(f32(0), self.temp - self.delta)
        hi = self.temp + self.delta
        if cur.size <= 1:
            return
        max_entropy = -libm.logf(f32(1) / f32(cur.size))
        softmax(cur, True)
        entropy = f32(0)
        for prob in cur.p.tolist():
            if prob > 0:
                entropy = f32(entropy - f32(f32(prob) * libm.logf(prob)))
        norm = entropy / max_entropy
        dyn = lo + (hi - lo) * libm.powf(norm, self.exponent)
        temp_impl(cur, dyn)
        top = float(cur.logit[0])
        p = [math.exp(float(x) - top) for x in cur.logit.tolist()]
        total = 0.0
        for v in p:
            total += v
        cur.p = (np.array(p, np.float32).astype(np.float64) / total).astype(np.float32)


class Dist(Sampler):
    """llama_sampler_dist: p = expf(logit - max) summed in double, and the first token whose running
    sum reaches sum * u, u a uniform double of std::mt19937(seed)."""

    name = "dist"

    def __init__(self, seed: int):
        self.seed_value = seed
        self.rng = MT19937(seed)

    def reset(self):
        self.rng.seed(self.seed_value)

    def apply(self, cur):
        if cur.size == 0:
            cur.selected = -1
            return
        if cur.size == 1:
            uniform_double(self.rng)                   # one draw per output, as the backend's
            cur.p = np.ones(1, np.float32)
            cur.selected = 0
            return
        max_l = cur.logit[0] if cur.sorted else cur.logit.max()
        p = libm.expf(cur.logit - max_l)
        run = np.cumsum(p.astype(np.float64))
        total = float(run[-1])
        target = total * uniform_double(self.rng)
        hit = int(np.searchsorted(run, target, side="left")) if target == target else cur.size
        cur.selected = hit if hit < cur.size else cur.size - 1
        cur.p = p   # llama.cpp divides them by the sum here; nothing reads them after the draw


class Mirostat(Sampler):
    """llama_sampler_mirostat (v1): k from the estimated Zipf exponent and mu, then a draw among the
    k most likely (std::discrete_distribution); mu follows the surprise towards tau."""

    name = "mirostat"

    def __init__(self, n_vocab: int, seed: int, tau: float, eta: float, m: int = 100):
        self.n_vocab, self.seed_value = int(n_vocab), seed
        self.tau, self.eta, self.m = f32(tau), f32(eta), int(m)
        self.reset()

    def reset(self):
        self.mu = f32(2) * self.tau
        self.rng = MT19937(self.seed_value)

    def apply(self, cur):
        softmax(cur, True)
        s_ti_bi, s_ti_sq = f32(0), f32(0)
        p = cur.p
        for i in range(min(self.m - 1, cur.size - 1)):
            t_i = libm.logf(f32(i + 2) / f32(i + 1))
            b_i = libm.logf(p[i] / p[i + 1])
            s_ti_bi = f32(s_ti_bi + f32(t_i * b_i))
            s_ti_sq = f32(s_ti_sq + f32(t_i * t_i))
        with np.errstate(all="ignore"):
            s_hat = s_ti_bi / s_ti_sq
            eps = s_hat - f32(1)
            k = libm.powf((eps * libm.powf(2, self.mu)) / (f32(1) - libm.powf(f32(self.n_vocab), -eps)), f32(1) / s_hat)
        top_k(cur, max(_c_int(k), 1))
        softmax(cur, True)
        idx = discrete(cur.p, self.rng)
        cur.selected = idx
        self.mu = self.mu - self.eta * (-libm.log2f(cur.p[idx]) - self.tau)


class MirostatV2(Sampler):
    """llama_sampler_mirostat_v2: the tokens whose surprise is at most mu, then a draw among them."""

    name = "mirostat-v2"

    def __init__(self, seed: int, tau: float, eta: float):
        self.seed_value, self.tau, self.eta = seed, f32(tau), f32(eta)
        self.reset()

    def reset(self):
        self.mu = f32(2) * self.tau
        self.rng = MT19937(self.seed_value)

    def apply(self, cur):
        softmax(cur, True)
        n = cur.size
        for i, prob in enumerate(cur.p.tolist()):
            if -libm.log2f(prob) > self.mu:
                n = i
                break
        cur.take(slice(0, max(n, 1)))
        softmax(cur, True)
        idx = discrete(cur.p, self.rng)
        cur.selected = idx
        self.mu = self.mu - self.eta * (-libm.log2f(cur.p[idx]) - self.tau)


def _c_int(x) -> int:
    """A float converted to int as x86 does: truncated; NaN or out of range gives INT_MIN."""
    x = float(x)
    if not (-2147483649.0 < x < 2147483648.0):
        return -2147483648
    return int(x)
