"""Make llama-cpp-draws.json: llama.cpp's own samplers (llama-cpp-python 0.3.36's vendored llama.cpp,
through its llama_sampler_* API) on the fixed logits of cases.py, for every seed, chained as
common_sampler_init chains them. Run with the bench environment's python and library:

    LLAMA_CPP_LIB_PATH=/work/bench-env/build-native/bin /work/bench-env/venv/bin/python \
        tests/golden/sampling/make.py [--stories fixtures/stories260K.gguf] [--out FILE] [--seeds N]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import sys
from pathlib import Path

import llama_cpp as L
import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import cases  # noqa: E402

ORDER = ("penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature")
DEFAULTS = dict(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, typical_p=1.0, xtc_probability=0.0,
                xtc_threshold=0.1, top_n_sigma=-1.0, dynatemp_range=0.0, dynatemp_exponent=1.0, repeat_last_n=64,
                repeat_penalty=1.0, frequency_penalty=0.0, presence_penalty=0.0, dry_multiplier=0.0, dry_base=1.75,
                dry_allowed_length=2, dry_penalty_last_n=64, mirostat=0, mirostat_tau=5.0, mirostat_eta=0.1,
                min_keep=0, logit_bias=[])
BREAKERS = ["\n", ":", "\"", "*"]


def chain(cfg: dict, seed: int, n_vocab: int, vocab):
    """common_sampler_init's chain: every sampler added; llama.cpp leaves the disabled ones empty."""
    p = {**DEFAULTS, **{k: v for k, v in cfg.items() if k not in ("name", "vocab")}}
    c = L.llama_sampler_chain_init(L.llama_sampler_chain_default_params())
    add = lambda s: L.llama_sampler_chain_add(c, s)  # noqa: E731
    if p["logit_bias"]:
        arr = (L.llama_logit_bias * len(p["logit_bias"]))(*[L.llama_logit_bias(int(t), float(b))
                                                            for t, b in p["logit_bias"]])
        add(L.llama_sampler_init_logit_bias(n_vocab, len(p["logit_bias"]), arr))
    if p["mirostat"] == 0:
        for name in ORDER:
            if name == "penalties":
                add(L.llama_sampler_init_penalties(n_vocab, p["repeat_last_n"], p["repeat_penalty"],
                                                   p["frequency_penalty"], p["presence_penalty"]))
            elif name == "dry":
                br = (ctypes.c_char_p * len(BREAKERS))(*[b.encode() for b in BREAKERS])
                add(L.llama_sampler_init_dry(vocab, p["dry_multiplier"], p["dry_base"], p["dry_allowed_length"],
                                             p["dry_penalty_last_n"], br, len(BREAKERS)))
            elif name == "top_n_sigma":
                add(L.llama_sampler_init_top_n_sigma(p["top_n_sigma"]))
            elif name == "top_k":
                add(L.llama_sampler_init_top_k(p["top_k"]))
            elif name == "typ_p":
                add(L.llama_sampler_init_typical(p["typical_p"], p["min_keep"]))
            elif name == "top_p":
                add(L.llama_sampler_init_top_p(p["top_p"], p["min_keep"]))
            elif name == "min_p":
                add(L.llama_sampler_init_min_p(p["min_p"], p["min_keep"]))
            elif name == "xtc":
                add(L.llama_sampler_init_xtc(p["xtc_probability"], p["xtc_threshold"], p["min_keep"], seed))
            elif name == "temperature":
                add(L.llama_sampler_init_temp_ext(p["temperature"], p["dynatemp_range"], p["dynatemp_exponent"]))
        add(L.llama_sampler_init_dist(seed))
    else:
        add(L.llama_sampler_init_temp(p["temperature"]))
        if p["mirostat"] == 1:
            add(L.llama_sampler_init_mirostat(n_vocab, seed, p["mirostat_tau"], p["mirostat_eta"], 100))
        else:
            add(L.llama_sampler_init_mirostat_v2(seed, p["mirostat_tau"], p["mirostat_eta"]))
    return c


def draws(cfg: dict, seed: int, vocab) -> list[int]:
    n = cases.vocab_size(cfg)
    c = chain(cfg, seed, n, vocab)
    for t in cases.PROMPT:
        L.llama_sampler_accept(c, t)
    out = []
    data = (L.llama_token_data * n)()
    view = np.frombuffer(data, dtype=np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")]))
    for step in range(cases.STEPS):
        view["id"], view["logit"], view["p"] = np.arange(n), LOGITS[n][step], 0.0
        arr = L.llama_token_data_array(data=ctypes.cast(data, L.llama_token_data_p), size=n, selected=-1, sorted=False)
        L.llama_sampler_apply(c, ctypes.byref(arr))
        token = arr.data[arr.selected].id
        L.llama_sampler_accept(c, token)
        out.append(int(token))
    L.llama_sampler_free(c)
    return out


LOGITS: dict[int, list] = {}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--stories", default=str(HERE.parent.parent.parent / "fixtures" / "stories260K.gguf"))
    ap.add_argument("--out", default=str(HERE / "llama-cpp-draws.json"))
    ap.add_argument("--seeds", type=int, default=cases.SEEDS)
    ap.add_argument("--full", type=int, default=2 * len(cases.CONFIGS), help="seeds whose draws are kept whole")
    a = ap.parse_args()
    L.llama_backend_init()
    mp = L.llama_model_default_params()
    mp.vocab_only = True
    model = L.llama_model_load_from_file(a.stories.encode(), mp)
    vocab = L.llama_model_get_vocab(model)
    assert L.llama_vocab_n_tokens(vocab) == 512
    for cfg in cases.CONFIGS:
        n = cases.vocab_size(cfg)
        if n not in LOGITS:
            LOGITS[n] = [cases.logits(n, s) for s in range(cases.STEPS)]
    digests, full = {}, {}
    for seed in range(a.seeds):
        d = draws(cases.config(seed), seed, vocab)
        digests[str(seed)] = cases.digest(d)
        if seed < a.full:
            full[str(seed)] = d
        if seed % 50 == 0:
            print(f"seed {seed}", file=sys.stderr, flush=True)
    doc = {"made_by": f"llama-cpp-python {L.__version__} (vendored llama.cpp), tests/golden/sampling/make.py",
           "steps": cases.STEPS, "prompt": list(cases.PROMPT), "configs": [c["name"] for c in cases.CONFIGS],
           "digests": digests, "draws": full}
    Path(a.out).write_text(json.dumps(doc, separators=(",", ":")) + "\n")


if __name__ == "__main__":
    main()
