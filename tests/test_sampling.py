"""ggtool.generate's sampler chain against llama.cpp's: the C++ library pieces it copies (std::mt19937,
the uniform and discrete distributions, std::sort's and std::partial_sort's order of equal keys:
tests/golden/sampling/libstdcxx.json, made by libstdcxx.cpp with GCC 12), glibc's expf, and llama.cpp's
own samplers' draws on fixed logits (llama-cpp-draws.json, made by make.py through llama-cpp-python's
llama_sampler_* API: 1000 seeds x 256 steps in 15 settings; here the first 64 steps of one seed per
setting, all of them in bench/check_sampling.py fixed). The golden folder's README says how."""

from __future__ import annotations

import json
import math
import sys

import numpy as np
import pytest
from conftest import ROOT, STORIES

from ggtool.generate import ORDER, Sampling, SamplingError, log_probs, parse_logit_bias
from ggtool.generate import libstdcxx as L
from ggtool.generate.libm import expf

GOLDEN = ROOT / "tests" / "golden" / "sampling"
sys.path.insert(0, str(GOLDEN))
import cases  # noqa: E402

CXX = json.loads((GOLDEN / "libstdcxx.json").read_text())
DRAWS = json.loads((GOLDEN / "llama-cpp-draws.json").read_text())


# -- the C++ library ------------------------------------------------------------------------------------
def test_mt19937_as_the_standard_requires():
    g = L.MT19937(5489)
    for _ in range(9999):
        g.next()
    assert g.next() == CXX["mt19937_5489_10000th"] == 4123659995


def test_uniform_distributions_as_libstdcxx():
    g = L.MT19937(42)
    got = [L.uniform_double(g) for _ in range(4)] + [float(L.uniform_float(g)) for _ in range(4)]
    assert got[:4] == CXX["uniform"][:4]
    assert got[4:] == [float(np.float32(x)) for x in CXX["uniform"][4:]]


def test_discrete_distribution_as_libstdcxx():
    g = L.MT19937(3)
    w = np.array([0.5, 0.25, 0.125, 0.0625, 0.0625], np.float32)
    assert [L.discrete(w, g) for _ in range(12)] == CXX["discrete"]


@pytest.mark.parametrize("case", CXX["orders"], ids=lambda c: f"{c['what']}-{c['n']}-{c['k']}-{c['levels']}")
def test_equal_logits_in_libstdcxx_order(case):
    g = L.MT19937(case["seed"])
    logits = np.array([np.float32(g.next() % case["levels"]) * np.float32(0.5) for _ in range(case["n"])], np.float32)
    keys = -logits.astype(np.float64)
    if case["what"] == "sort":
        ids = L.sort(keys, np.arange(case["n"]))[1]
    else:
        ids = L.partial_sort(keys, np.arange(case["n"]), case["k"])[1]
    assert ids.tolist()[:case["k"]] == case["ids"]
    assert not (np.diff(logits[case["ids"]]) > 0).any()            # and it is a sort


def test_expf_is_glibcs():
    """Where the C library is glibc, its own expf on values a softmax meets (bench/check_sampling.py
    expf checks every float); elsewhere, the correctly rounded value but for a few last bits."""
    import ctypes
    import ctypes.util

    x = np.concatenate([-np.geomspace(1e-8, 103.9, 20000), np.linspace(-20, 0, 20001)]).astype(np.float32)
    x = np.concatenate([x, np.float32([0, -0.0, -np.inf, -104, 1, 88.0])])
    got = expf(x)
    libc = ctypes.CDLL(ctypes.util.find_library("m"))
    libc.expf.restype, libc.expf.argtypes = ctypes.c_float, [ctypes.c_float]
    ref = np.array([libc.expf(float(v)) for v in x], np.float32)
    close = np.exp(x.astype(np.float64)).astype(np.float32)
    assert np.array_equal(got, close) or np.abs(got.view(np.int32) - close.view(np.int32)).max() <= 1
    import platform

    if platform.libc_ver()[0] == "glibc":
        assert np.array_equal(got.view(np.uint32), ref.view(np.uint32))


# -- llama.cpp's samplers on fixed logits ------------------------------------------------------------------
STEPS = 64


@pytest.fixture(scope="module")
def stories_vocab():
    from ggtool.tokenizer import Vocab

    return Vocab.from_gguf(STORIES)


@pytest.mark.parametrize("seed", range(len(cases.CONFIGS)), ids=lambda s: cases.CONFIGS[s]["name"])
def test_draws_equal_llama_cpps(seed, stories_vocab):
    cfg = cases.config(seed)
    n = cases.vocab_size(cfg)
    kw = {k: (tuple(map(tuple, v)) if k == "logit_bias" else v) for k, v in cfg.items() if k not in ("name", "vocab")}
    chain = Sampling(seed=seed, **kw).chain(n, vocab=stories_vocab if cfg["vocab"] == "stories" else None)
    for t in cases.PROMPT:
        chain.accept(t)
    got = [chain.sample(cases.logits(n, s)) for s in range(STEPS)]
    assert got == DRAWS["draws"][str(seed)][:STEPS]


def test_the_golden_draws_are_complete():
    assert DRAWS["steps"] == cases.STEPS == 256 and len(DRAWS["digests"]) == cases.SEEDS == 1000
    assert all(cases.digest(d) == DRAWS["digests"][s] for s, d in DRAWS["draws"].items())
    assert len({DRAWS["digests"][str(s)] for s in range(cases.SEEDS)}) > 900   # seeds differ


def test_the_chain_leaves_out_what_its_parameters_disable():
    assert Sampling(seed=1).chain(100).names == ["top-k", "top-p", "min-p", "temp-ext", "dist"]
    assert Sampling(seed=1, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0).chain(100).names == ["dist"]
    assert Sampling(seed=1, repeat_penalty=1.1, mirostat=2).chain(100).names == ["temp", "mirostat-v2"]
    assert Sampling(seed=1, ignore_eos=True).chain(100, eog_ids={2}).names[0] == "logit-bias"
    assert Sampling(seed=1, order=("temperature", "top_k")).chain(100).names == ["temp-ext", "top-k", "dist"]
    assert ORDER[0] == "penalties" and ORDER[-1] == "temperature"


def test_temperature_zero_is_greedy_and_ignore_eos_forbids_eog():
    logits = np.array([0.0, 3.0, 2.9, -1.0, 3.0], np.float32)
    # ids 1 and 4 tie: llama.cpp's top-k heap puts 4 first, and temperature 0 keeps the first
    # (llama-cpp-python's chain gives 4 for any seed; numpy's argmax would say 1)
    assert Sampling.greedy().chain(5).sample(logits) == 4
    assert Sampling(temperature=0.0, top_k=0, top_p=1.0, min_p=0.0).chain(5).sample(logits) == 1   # unsorted: the first
    chain = Sampling(seed=3, temperature=0.0, ignore_eos=True).chain(5, eog_ids={4})
    assert chain.sample(logits) == 1
    draws = {Sampling(seed=s, temperature=1.0, top_k=2).chain(5).sample(logits) for s in range(40)}
    assert draws == {1, 4}


def test_same_seed_same_draws_random_seed_reported():
    logits = np.linspace(0, 2, 50).astype(np.float32)
    a, b = Sampling(seed=11, temperature=2.0).chain(50), Sampling(seed=11, temperature=2.0).chain(50)
    assert [a.sample(logits) for _ in range(20)] == [b.sample(logits) for _ in range(20)]
    c = Sampling(seed=None).chain(50)
    assert 0 <= c.seed < 2**32 - 1 and Sampling(seed=-1).chain(50).seed != 2**32 - 1


def test_top_k_first_keeps_what_the_top_k_sampler_keeps():
    """A chain whose first sampler is top-k makes its candidates from the k it keeps alone
    (Candidates.top): the same ids, logits, order and flags as Candidates(logits) after top_k, for
    logits with ties (llama.cpp's sort order of equal logits decides), -inf and any k; and all -inf
    after it is refused naming top-k."""
    from ggtool.generate import LogitsError
    from ggtool.generate import samplers as S

    rng = np.random.default_rng(3)
    for trial in range(300):
        n = int(rng.integers(2, 6000))
        logits = rng.integers(-4, 5, n).astype(np.float32) if trial % 2 else rng.standard_normal(n).astype(np.float32)
        logits[rng.random(n) < 0.1] = -np.inf
        k = int(rng.integers(1, n))
        full = S.Candidates(logits)
        S.top_k(full, k)
        top = S.Candidates.top(logits, k)
        assert top.ids.dtype == full.ids.dtype and top.logit.dtype == full.logit.dtype
        for a in ("ids", "logit", "p"):
            assert getattr(top, a).tobytes() == getattr(full, a).tobytes(), (trial, a)
        assert (top.sorted, top.selected, top.identity) == (full.sorted, full.selected, full.identity)
    with pytest.raises(LogitsError, match="after the top-k sampler every token's logit is -inf"):
        Sampling(seed=1, top_k=2).chain(4).sample(np.full(4, -np.inf, np.float32))


def test_nan_logits_and_a_mismatched_vocabulary_are_refused():
    from ggtool.generate import LogitsError

    with pytest.raises(LogitsError, match="NaN"):
        Sampling(seed=1).chain(3).sample(np.array([0, np.nan, 1], np.float32))
    with pytest.raises(LogitsError, match="the logits have 4 values, the vocabulary 3 tokens"):
        Sampling(seed=1).chain(3).sample(np.zeros(4, np.float32))


# -- parameters ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kw, fragment", [
    ({"temperature": math.nan}, "temperature nan: not a number"),
    ({"temperature": 1e-320}, "too small for the sampler's float"),
    ({"temperature": 1e39}, "too large for the sampler's float"),
    ({"temperature": -1.0}, "must be 0 or more"),
    ({"top_p": 2.0}, "top_p 2.0: must be from 0 to 1"),
    ({"top_p": math.nan}, "top_p nan: not a number"),
    ({"min_p": math.nan}, "min_p nan"),
    ({"seed": -5}, "seed -5: a seed is 0 to 4294967295"),
    ({"seed": 2**32}, "a seed is 0 to 4294967295"),
    ({"top_k": -1}, "top_k -1: must be 0 or more"),
    ({"repeat_penalty": 0.0}, "must be greater than 0"),
    ({"repeat_penalty": 1e-39}, "too small"),
    ({"mirostat": 3}, "is 0 (off), 1 or 2"),
    ({"order": ("top_k", "nucleus")}, "order nucleus: not a sampler"),
    ({"frequency_penalty": math.inf}, "must be finite"),
    # the rest of the hostile values (issue 29.7: NaN, negative, huge, denormal, each field)
    ({"temperature": math.inf}, "temperature inf: must be finite"),
    ({"temperature": 1e-40}, "too small for the sampler's float"),      # a float32 denormal
    ({"top_p": -0.1}, "top_p -0.1: must be from 0 to 1"),
    ({"top_p": math.inf}, "top_p inf: must be finite"),
    ({"top_k": 2**31}, "top_k 2147483648: must be at most 2147483647"),
    ({"top_k": 10**30}, "must be at most 2147483647"),
    ({"min_p": -1.0}, "min_p -1.0: must be from 0 to 1"),
    ({"min_p": 1.5}, "min_p 1.5: must be from 0 to 1"),
    ({"min_p": math.inf}, "min_p inf: must be finite"),
    ({"repeat_penalty": math.nan}, "repeat_penalty nan: not a number"),
    ({"repeat_penalty": -1.0}, "must be greater than 0"),
    ({"repeat_penalty": math.inf}, "repeat_penalty inf: must be finite"),
    ({"repeat_penalty": 1e39}, "too large for the sampler's float"),
    ({"repeat_last_n": -1}, "repeat_last_n -1: must be 0 or more"),
    ({"repeat_last_n": 2**40}, "must be at most 2147483647"),
    ({"presence_penalty": -math.inf}, "must be finite"),
    ({"typical_p": math.nan}, "typical_p nan: not a number"),
    ({"typical_p": 1.5}, "must be from 0 to 1"),
    ({"xtc_probability": 2.0}, "must be from 0 to 1"),
    ({"xtc_threshold": math.nan}, "not a number"),
    ({"dynatemp_range": -1.0}, "must be 0 or more"),
    ({"dynatemp_exponent": math.nan}, "not a number"),
    ({"top_n_sigma": math.nan}, "not a number"),
    ({"top_n_sigma": math.inf}, "must be finite"),
    ({"mirostat": -1}, "is 0 (off), 1 or 2"),
    ({"mirostat_eta": math.nan}, "not a number"),
    ({"mirostat_tau": math.inf}, "must be finite"),
    ({"dry_multiplier": math.nan}, "not a number"),
    ({"dry_base": math.inf}, "must be finite"),
    ({"dry_allowed_length": 2**40}, "must be at most 2147483647"),
    ({"dry_penalty_last_n": -1}, "must be 0 or more"),
    ({"min_keep": 2**40}, "must be at most 2147483647"),
    ({"seed": -2}, "a seed is 0 to 4294967295"),
    ({"seed": 2**64}, "a seed is 0 to 4294967295"),
])
def test_bad_parameters_name_the_field(kw, fragment):
    with pytest.raises(SamplingError) as e:
        Sampling(**kw)
    assert fragment in str(e.value) and e.value.field == next(iter(kw))


@pytest.mark.parametrize("kw, accepted, sampler", [
    ({"temperature": 1.5e-38, "top_k": 0, "top_p": 1.0, "min_p": 0.0}, (), "temp-ext"),   # logits / T: inf
    ({"repeat_penalty": 1.2e-38}, (0, 1, 2), "penalties"),                              # a seen logit / X: inf
    ({"presence_penalty": -3e38}, (0, 1, 2), "temp-ext"),                                # 3e38 / 0.8: inf
    ({"logit_bias": ((7, 3e38),)}, (), "temp-ext"),
])
def test_float_overflow_in_a_sampler_is_refused_not_drawn_from(kw, accepted, sampler):
    """Values each in range whose arithmetic overflows float (llama.cpp would draw from NaN
    probabilities): one LogitsError naming the sampler, and no numpy warning on the way."""
    import warnings

    from ggtool.generate import LogitsError

    logits = (np.random.default_rng(0).standard_normal(64) * 10).astype(np.float32)
    chain = Sampling(seed=1, **kw).chain(64)
    for t in accepted:
        chain.accept(t)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(LogitsError, match=f"the {sampler} sampler's float arithmetic overflowed"):
            chain.sample(logits)


def test_overflow_to_minus_inf_is_llama_cpps_and_silent():
    """A huge repeat penalty sends a seen negative logit to -inf and a positive one to about 0, as
    llama.cpp's float arithmetic does: a valid draw, no warning."""
    import warnings

    logits = np.array([-1.0, 9.0, 8.5, 8.0, -2.0], np.float32)
    draws = []
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for seed in range(30):
            chain = Sampling(seed=seed, repeat_penalty=3e38, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0).chain(5)
            chain.accept(0)
            chain.accept(1)
            draws.append(chain.sample(logits))
    assert 0 not in draws and 1 not in draws and {2, 3} <= set(draws)


def test_no_token_left_and_plus_inf_logits_are_refused():
    from ggtool.generate import LogitsError

    every = tuple((t, -math.inf) for t in range(4))
    with pytest.raises(LogitsError, match="after the logit-bias sampler every token's logit is -inf"):
        Sampling(seed=1, logit_bias=every).chain(4).sample(np.zeros(4, np.float32))
    with pytest.raises(LogitsError, match=r"the model's logits hold \+inf \(1 of 3\)"):
        Sampling(seed=1).chain(3).sample(np.array([0, np.inf, 1], np.float32))


def test_a_models_bad_default_names_its_key():
    """general.sampling.* out of range: the key is named, not an option the user never gave; an
    option given replaces the model's value, bad or not."""
    with pytest.raises(SamplingError, match=r"general.sampling.top_p 2.0: must be from 0 to 1 \(the model's default"):
        Sampling(seed=1).with_model_defaults({"general.sampling.top_p": 2.0}.get)
    with pytest.raises(SamplingError, match="general.sampling.penalty_last_n -1: must be 0 or more"):
        Sampling(seed=1).with_model_defaults({"general.sampling.penalty_last_n": -1}.get)
    s = Sampling(seed=1, top_p=0.5, given=frozenset({"top_p"})).with_model_defaults({"general.sampling.top_p": 2.0}.get)
    assert s.top_p == 0.5


def test_logit_bias_as_llama_cpp_writes_it():
    assert parse_logit_bias("15043+1") == (15043, 1.0) and parse_logit_bias("2-inf") == (2, -math.inf)
    assert parse_logit_bias(" 7-0.5 ") == (7, -0.5)
    for bad in ("x", "1+", "1+inf", "-1+2", "1*2"):
        with pytest.raises(SamplingError):
            parse_logit_bias(bad)


def test_the_models_defaults_where_none_is_given():
    """general.sampling.* (common_init_sampler_from_model): the model's top_k, temp, ... unless the
    caller gave the field."""
    meta = {"general.sampling.top_k": 20, "general.sampling.temp": 0.6, "general.sampling.sequence": "kpt"}
    s = Sampling(seed=1, top_k=33, given=frozenset({"top_k"})).with_model_defaults(meta.get)
    assert (s.top_k, s.temperature, s.order) == (33, float(np.float32(0.6)), ("top_k", "top_p", "temperature"))
    assert Sampling().with_model_defaults({}.get) == Sampling()


def test_log_probs_are_the_models_softmax(monkeypatch):
    x = np.array([1.0, 2.0, 3.0, 3.0], np.float32)
    lp, top = log_probs(x, 1, 3)
    x64 = x.astype(np.float64)
    ref = np.log(np.exp(x64 - x64.max()) / np.exp(x64 - x64.max()).sum())
    assert math.isclose(lp, ref[1], abs_tol=2e-7)          # exp in float, summed in double
    assert [t for t, _ in top] == [2, 3, 1] and math.isclose(top[0][1], ref[2], abs_tol=2e-7)
    # a gemma-sized row: near the exact value, the same bits with numba's compiled exp or without
    big = (np.random.default_rng(3).standard_normal(262144) * 6).astype(np.float32)
    b64 = big.astype(np.float64)
    exact = b64[17] - (b64.max() + math.log(np.exp(b64 - b64.max()).sum()))
    from ggtool.kernels import portable_math

    forms = []
    for compiled in (True, False):
        monkeypatch.setattr(portable_math, "use_compiled", lambda name, size, c=compiled: c)
        forms.append(log_probs(big, 17, 2))
    assert forms[0] == forms[1] and math.isclose(forms[0][0], exact, abs_tol=2e-7)
    # ties at the cut: the lowest ids among equal logits, whatever order a partition leaves them in
    tied = np.zeros(1000, np.float32)
    tied[[900, 3]] = 1.0
    assert [t for t, _ in log_probs(tied, 0, 5)[1]] == [3, 900, 0, 1, 2]


# -- stop strings --------------------------------------------------------------------------------------
def test_stop_strings_release_only_what_cannot_become_one():
    from ggtool.generate import TextStream

    t = TextStream(["\n\n", "END"])
    assert [t.feed(p) for p in (b"Hi", b" E", b"N", b"x\n", b"\n more")] == ["Hi", " ", "", "ENx", ""]
    assert t.stopped == "\n\n" and t.text == "Hi ENx" and t.finish() == ""
    t = TextStream(["abc"])
    assert [t.feed(p) for p in (b"xab", b"\xe2\x82", b"\xac", b"ab")] == ["x", "", "ab\u20ac", ""]
    assert t.finish() == "ab" and t.stopped is None and t.text == "xab\u20acab"
