"""Choosing each next token as llama.cpp's common_sampler does: `Sampling` holds its parameters and
defaults (common/common.h), `Sampling.chain(...)` builds its chain in its order, and
`SamplerChain.sample(logits)` gives the token llama.cpp gives for the same logits and seed.

The chain (common_sampler_init): a logit bias (the user's, then -inf for the end-of-generation
tokens with ignore_eos, then the model's tokenizer.ggml.suppress_tokens), then the samplers named in
`order` (default: penalties, dry, top_n_sigma, top_k, typ_p, top_p, min_p, xtc, temperature), each
left out where its parameters disable it, then `dist`, a draw with std::mt19937 seeded by `seed`;
or, with Mirostat 1 or 2, the temperature and the Mirostat sampler. Every token of the prompt and
every token generated is accepted by the chain (the penalties count the prompt, as llama.cpp's).
Temperature 0 keeps the first of the largest logits, so with the default top-k (the largest first,
equal ones in llama.cpp's heap order) it is greedy.
"""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass, field, fields

import numpy as np

from ..errors import GGToolError
from ..kernels import portable_math
from . import samplers as S

RANDOM_SEED = 0xFFFFFFFF   # LLAMA_DEFAULT_SEED: a seed drawn at random
ORDER = ("penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature")
NAMES = frozenset(ORDER)
_F32_TINY = float(np.finfo(np.float32).tiny)
_F32_MAX = float(np.finfo(np.float32).max)
_INT32_MAX = 2**31 - 1     # llama.cpp reads its integer options as int32 (std::stoi refuses more)


class SamplingError(GGToolError):
    """A sampling parameter out of range; `field` names it (a Sampling field), `value` is what was
    given."""

    kind = "sampling"

    def __init__(self, field_name: str, value, reason: str):
        self.field, self.value, self.reason = field_name, value, reason
        super().__init__(f"{field_name} {_show(value)}: {reason}")


class LogitsError(GGToolError):
    """The model's logits cannot be sampled (NaN, +inf), do not match its vocabulary, or became
    NaN or +inf in a sampler's float arithmetic (a parameter too large or too small for it)."""

    kind = "logits"


def _show(value) -> str:
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else str(value)
    return str(value)


@dataclass(frozen=True)
class Sampling:
    """llama.cpp's sampling parameters (common_params_sampling), with its defaults. `seed` None, -1
    or RANDOM_SEED draws one at random; the chain reports the one it used. Checked when made: a value
    llama.cpp would misread or refuse is a SamplingError naming the field."""

    seed: int | None = None
    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    typical_p: float = 1.0
    xtc_probability: float = 0.0
    xtc_threshold: float = 0.1
    top_n_sigma: float = -1.0
    dynatemp_range: float = 0.0
    dynatemp_exponent: float = 1.0
    repeat_last_n: int = 64
    repeat_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    dry_multiplier: float = 0.0
    dry_base: float = 1.75
    dry_allowed_length: int = 2
    dry_penalty_last_n: int = 64
    dry_sequence_breakers: tuple[str, ...] = ("\n", ":", "\"", "*")
    mirostat: int = 0
    mirostat_tau: float = 5.0
    mirostat_eta: float = 0.1
    min_keep: int = 0
    logit_bias: tuple[tuple[int, float], ...] = ()
    order: tuple[str, ...] = ORDER
    ignore_eos: bool = False
    given: frozenset = field(default=frozenset(), compare=False)   # the fields a user set (the rest: the model's)

    def __post_init__(self):
        for f in fields(self):
            if f.type in ("float",):
                _check_float(f.name, getattr(self, f.name))
        if self.seed is not None and not (0 <= self.seed <= RANDOM_SEED or self.seed == -1):
            raise SamplingError("seed", self.seed, f"a seed is 0 to {RANDOM_SEED}; -1 (or {RANDOM_SEED}) draws one "
                                "at random")
        _range("temperature", self.temperature, 0.0, None)
        for name in ("top_p", "min_p", "typical_p", "xtc_probability", "xtc_threshold"):
            _range(name, getattr(self, name), 0.0, 1.0)
        for name in ("top_k", "repeat_last_n", "dry_allowed_length", "dry_penalty_last_n", "min_keep"):
            if getattr(self, name) < 0:
                raise SamplingError(name, getattr(self, name), "must be 0 or more")
            if getattr(self, name) > _INT32_MAX:
                raise SamplingError(name, getattr(self, name), f"must be at most {_INT32_MAX} (llama.cpp's int32)")
        if not self.repeat_penalty > 0 or not math.isfinite(float(np.float32(1.0) / np.float32(self.repeat_penalty))):
            raise SamplingError("repeat_penalty", self.repeat_penalty, "must be greater than 0 (1 is off)")
        for name in ("dynatemp_range", "dry_multiplier", "dry_base", "mirostat_tau", "mirostat_eta"):
            _range(name, getattr(self, name), 0.0, None)
        if self.mirostat not in (0, 1, 2):
            raise SamplingError("mirostat", self.mirostat, "is 0 (off), 1 or 2")
        for name in self.order:
            if name not in NAMES:
                raise SamplingError("order", name, f"not a sampler (known: {', '.join(ORDER)})")
        for token, bias in self.logit_bias:
            if not (math.isfinite(bias) or bias == -math.inf):
                raise SamplingError("logit_bias", bias, f"the bias of token {token} must be a number or -inf")

    @classmethod
    def greedy(cls) -> Sampling:
        """Temperature 0 (the rest llama.cpp's defaults): the most likely token each step."""
        return cls(temperature=0.0)

    def with_model_defaults(self, metadata) -> Sampling:
        """The model's general.sampling.* defaults (top_k, top_p, min_p, temp, ...) for the fields
        not in `given`, as llama.cpp's common_init_sampler_from_model; `metadata(key)` reads one."""
        from dataclasses import replace

        changes = {}
        for key, name, kind in _MODEL_KEYS:
            if name in self.given:
                continue
            value = metadata(f"general.sampling.{key}")
            if value is None or isinstance(value, bool):
                continue
            try:
                v = int(value) if kind is int else float(np.float32(value))
            except (TypeError, ValueError, OverflowError):
                continue
            changes[name] = v
        seq = None if "order" in self.given else metadata("general.sampling.sequence")
        if isinstance(seq, str) and seq:
            names = tuple(_SEQ_CHARS.get(c, c) for c in (seq.split(";") if ";" in seq else list(seq)))
            if all(n in NAMES for n in names):
                changes["order"] = names
        if not changes:
            return self
        try:
            return replace(self, **changes)
        except SamplingError as e:      # the model's value, not the caller's: name its key
            if e.field not in changes:
                raise
            key = "sequence" if e.field == "order" else next(k for k, n, _ in _MODEL_KEYS if n == e.field)
            raise SamplingError(f"general.sampling.{key}", e.value, f"{e.reason} (the model's default; "
                                "giving the option replaces it)") from None

    def chain(self, n_vocab: int, eog_ids=(), suppress_ids=(), vocab=None) -> SamplerChain:
        """The sampler chain for a vocabulary of n_vocab tokens. `eog_ids` get -inf with
        ignore_eos; `suppress_ids` always (the model's suppressed tokens); `vocab` (a
        ggtool.tokenizer.Vocab) is needed by DRY's sequence breakers."""
        return SamplerChain(self, n_vocab, eog_ids, suppress_ids, vocab)


_MODEL_KEYS = (("top_k", "top_k", int), ("top_p", "top_p", float), ("min_p", "min_p", float),
               ("xtc_probability", "xtc_probability", float), ("xtc_threshold", "xtc_threshold", float),
               ("temp", "temperature", float), ("penalty_last_n", "repeat_last_n", int),
               ("penalty_repeat", "repeat_penalty", float), ("mirostat", "mirostat", int),
               ("mirostat_tau", "mirostat_tau", float), ("mirostat_eta", "mirostat_eta", float))
_SEQ_CHARS = {"d": "dry", "k": "top_k", "y": "typ_p", "p": "top_p", "s": "top_n_sigma", "m": "min_p",
              "t": "temperature", "x": "xtc", "e": "penalties"}


def _check_float(name: str, value) -> None:
    """A float parameter as llama.cpp reads it (std::stof): finite, and a float's: not so small that
    it underflows (stof refuses those), nor larger than FLT_MAX."""
    v = float(value)
    if math.isnan(v):
        raise SamplingError(name, v, "not a number")
    if name == "top_n_sigma" and v == -1.0:
        return
    if math.isinf(v):
        raise SamplingError(name, v, "must be finite")
    if v != 0 and abs(v) < _F32_TINY:
        raise SamplingError(name, v, f"too small for the sampler's float (the least is {_F32_TINY:.3g}; "
                                     "0 is allowed)")
    if abs(v) > _F32_MAX:
        raise SamplingError(name, v, f"too large for the sampler's float (at most {_F32_MAX:.4g})")


def _range(name: str, value, lo, hi) -> None:
    if lo is not None and value < lo or hi is not None and value > hi:
        where = f"from {lo:g} to {hi:g}" if hi is not None else f"{lo:g} or more"
        raise SamplingError(name, value, f"must be {where}")


class SamplerChain:
    """common_sampler: the chain for one generation. `accept(token)` for each prompt token,
    `sample(logits)` for each new one (it accepts what it returns); `seed` is the seed in use."""

    def __init__(self, sampling: Sampling, n_vocab: int, eog_ids=(), suppress_ids=(), vocab=None):
        self.sampling, self.n_vocab = sampling, n_vocab
        seed = sampling.seed
        self.seed = secrets.randbelow(RANDOM_SEED) if seed is None or seed in (-1, RANDOM_SEED) else seed
        with np.errstate(all="ignore"):    # float32 set-up as llama.cpp's (2 * tau may be inf)
            self.samplers = self._build(vocab, eog_ids, suppress_ids)

    def _build(self, vocab, eog_ids, suppress_ids) -> list[S.Sampler]:
        s, seed = self.sampling, self.seed
        chain: list[S.Sampler] = []
        bias = list(s.logit_bias)
        if s.ignore_eos:
            bias += [(t, -math.inf) for t in sorted(eog_ids)]
        bias += [(t, -math.inf) for t in suppress_ids if 0 <= t < self.n_vocab]
        if bias:
            chain.append(S.LogitBias(bias))
        if s.mirostat:
            if s.temperature != 1.0:
                chain.append(S.Temp(s.temperature))
            chain.append(S.Mirostat(self.n_vocab, seed, s.mirostat_tau, s.mirostat_eta) if s.mirostat == 1
                         else S.MirostatV2(seed, s.mirostat_tau, s.mirostat_eta))
            return chain
        for name in s.order:
            sampler = self._sampler(name, vocab)
            if sampler is not None:
                chain.append(sampler)
        chain.append(S.Dist(seed))
        return chain

    def _sampler(self, name: str, vocab) -> S.Sampler | None:
        """One sampler of the order, or None where its parameters leave it out (llama.cpp's
        "empty" samplers)."""
        s = self.sampling
        f32 = np.float32
        if name == "penalties":
            off = s.repeat_last_n == 0 or (f32(s.repeat_penalty) == 1 and f32(s.frequency_penalty) == 0
                                           and f32(s.presence_penalty) == 0)
            return None if off else S.Penalties(s.repeat_last_n, s.repeat_penalty, s.frequency_penalty,
                                                s.presence_penalty)
        if name == "dry":
            off = f32(s.dry_multiplier) == 0 or f32(s.dry_base) < 1 or s.dry_penalty_last_n == 0
            return None if off else S.Dry(vocab, s.dry_multiplier, s.dry_base, s.dry_allowed_length,
                                          s.dry_penalty_last_n, list(s.dry_sequence_breakers))
        if name == "top_n_sigma":
            return S.TopNSigma(s.top_n_sigma) if f32(s.top_n_sigma) > 0 else None
        if name == "top_k":
            return S.TopK(s.top_k) if s.top_k > 0 else None
        if name == "typ_p":
            return S.Typical(s.typical_p, s.min_keep) if f32(s.typical_p) < 1 else None
        if name == "top_p":
            return S.TopP(s.top_p, s.min_keep) if f32(s.top_p) < 1 else None
        if name == "min_p":
            return S.MinP(s.min_p, s.min_keep) if f32(s.min_p) > 0 else None
        if name == "xtc":
            off = f32(s.xtc_probability) <= 0 or f32(s.xtc_threshold) > f32(0.5)
            return None if off else S.Xtc(s.xtc_probability, s.xtc_threshold, s.min_keep, self.seed)
        if name == "temperature":
            off = f32(s.temperature) == 1 and not f32(s.dynatemp_range) > 0
            return None if off else S.TempExt(s.temperature, s.dynatemp_range, s.dynatemp_exponent)
        raise AssertionError(name)   # pragma: no cover - Sampling checks the names

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.samplers]

    def accept(self, token: int) -> None:
        for s in self.samplers:
            s.accept(token)

    def reset(self) -> None:
        for s in self.samplers:
            s.reset()

    def apply(self, logits: np.ndarray) -> S.Candidates:
        """The candidates after every sampler (the selected one is the token); nothing accepted."""
        logits = np.asarray(logits, np.float32)
        if len(logits) != self.n_vocab:
            raise LogitsError(f"the logits have {len(logits)} values, the vocabulary {self.n_vocab} tokens")
        if len(logits) and not logits.max() < np.inf:     # one pass: max is NaN where one is, +inf where one is
            if np.isnan(logits).any():
                raise LogitsError(f"the model's logits hold NaN ({int(np.isnan(logits).sum())} of {len(logits)})")
            raise LogitsError(f"the model's logits hold +inf ({int(np.isposinf(logits).sum())} of {len(logits)})")
        samplers = self.samplers
        first = samplers[0]
        if isinstance(first, S.TopK) and 0 < first.k < len(logits):
            cur = S.Candidates.top(logits, first.k)     # what the top-k sampler would leave
            _check_candidates(cur, first)
            samplers = samplers[1:]
        else:
            cur = S.Candidates(logits)
        # float arithmetic as llama.cpp's: an overflow gives an inf, no warning; what that makes of
        # the candidates is checked after each sampler (a NaN or +inf would draw nonsense)
        with np.errstate(all="ignore"):
            for s in samplers:
                s.apply(cur)
                _check_candidates(cur, s)
        if not 0 <= cur.selected < cur.size:
            raise LogitsError("no token was selected (every candidate was removed)")   # pragma: no cover
        return cur

    def sample(self, logits: np.ndarray) -> int:
        """common_sampler_sample, then common_sampler_accept: the next token."""
        cur = self.apply(logits)
        token = int(cur.ids[cur.selected])
        self.accept(token)
        return token


def _check_candidates(cur: S.Candidates, sampler: S.Sampler) -> None:
    """A LogitsError where a sampler left a NaN or +inf logit, NaN probabilities, or no token that
    can be drawn (every logit -inf)."""
    if not cur.size:
        return
    top = cur.logit.max()       # NaN where a logit is NaN, +inf where one is, -inf where all are: one pass
    if not top < np.inf or np.isnan(cur.p.max()):
        raise LogitsError(f"the {sampler.name} sampler's float arithmetic overflowed (its logits or probabilities "
                          "hold +inf or NaN): a sampling parameter too large or too small for it")
    if top == -np.inf:
        raise LogitsError(f"after the {sampler.name} sampler every token's logit is -inf: no token can be drawn")


def parse_logit_bias(text: str) -> tuple[int, float]:
    """llama.cpp's logit bias, TOKEN_ID(+/-)BIAS: "15043+1" -> (15043, 1.0), "2-inf" -> (2, -inf)."""
    import re

    m = re.fullmatch(r"\s*(\d+)\s*([+-])\s*(inf|\d+(?:\.\d*)?(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?)\s*", text)
    if m is None:
        raise SamplingError("logit_bias", text, "expected TOKEN_ID+BIAS or TOKEN_ID-BIAS, e.g. 15043+1 or 2-inf")
    token, sign, value = int(m[1]), m[2], float(m[3])
    bias = -value if sign == "-" else value
    if bias == math.inf:
        raise SamplingError("logit_bias", text, "+inf is no bias (use a number, or -inf to forbid the token)")
    _check_float("logit_bias", bias) if math.isfinite(bias) else None
    return token, bias


def log_probs(logits: np.ndarray, token: int, top: int = 0) -> tuple[float, list[tuple[int, float]]]:
    """The token's log-probability under softmax(logits) (the model's distribution, before any
    sampler), and the `top` most likely tokens with theirs (largest first, ties by id).

    exp and log are portable_math's, so the printed values have the same bits on every host: exp in
    float (its compiled form where numba is loaded: 1 ms for gemma's 262144 logits, not the 35 ms of
    float64 in numpy), the sum in double. A float32 logit is itself good to 6e-8 of its size; the
    log-sum-exp is within about 1e-7 of the exact one. The top tokens: every logit at least the
    top-th largest (np.partition, 2x faster than argpartition), then the first `top` by (logit, id)."""
    x32 = np.asarray(logits, np.float32)
    mx = x32.max()
    d = x32 - mx
    e = portable_math.compiled("exp")(d) if portable_math.use_compiled("exp", d.size) else portable_math.exp_f32(d)
    lse = float(mx) + float(portable_math.log(np.array([e.sum(dtype=np.float64)]))[0])
    x = x32.astype(np.float64)
    alts = []
    if top > 0:
        k = min(top, len(x))
        idx = np.flatnonzero(x32 >= np.partition(x32, len(x32) - k)[len(x32) - k]) if k < len(x) else np.arange(len(x))
        idx = idx[np.lexsort((idx, -x[idx]))][:k]
        alts = [(int(i), float(x[i] - lse)) for i in idx]
    return float(x[token] - lse), alts
