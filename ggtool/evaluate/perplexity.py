"""llama-perplexity's perplexity and KL divergence, chunk after chunk (docs/evaluate.md).

`Perplexity(model, ...)` is one run: iterate it for a `ChunkReport` per chunk (the running PPL, and
in KL-divergence mode the running row llama-perplexity prints), then read `.result`, a record
(plain dict) of the final figures. Three modes, as llama-perplexity has them:

- perplexity of a text (`tokens`): the mean over chunks of -log p(next token) at positions
  n_ctx/2 .. n_ctx-2, PPL = exp(mean) with its +/- ;
- the same, writing a base-logits file (`write_base`; llama.cpp's format, or ggtool's top-K one
  with `top_k`);
- KL divergence against a base file (`read_base`): its chunks and tokens, llama-perplexity's
  statistics (or, from a top-K file, its KL divergence implied by the K largest probabilities and
  the rest's mass, with a bound on the difference).

Memory: one piece's logits at a time (never a chunk's), and per scored token two floats (the KL
divergence and the probability difference, for the percentiles).
"""

from __future__ import annotations

import hashlib
import math
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from . import logprobs as lp
from .basefile import BaseFile, new_header, top_k_row_bytes
from .journal import Journal, floats_from, floats_text
from .schedule import Schedule
from .text import EvaluateError, need_tokens

_SCALARS = ("sum_nll", "sum_nll2", "sum_nll_base", "sum_nll_base2", "sum_nll_nll_base", "sum_kld", "sum_kld2",
            "sum_p_diff", "sum_p_diff2", "sum_p_diff4", "max_p_diff", "sum_bound", "sum_rest")


@dataclass
class ChunkReport:
    """After chunk `index` (1-based, llama.cpp's [i]) of `n_chunk`: the running PPL (of the model
    evaluated, in KL-divergence mode too), the seconds since the run began, and in KL-divergence
    mode `kld`: llama-perplexity's row for it (PPL and its +/-, ln(PPL(Q)/PPL(base)), KL
    divergence, RMS of the probability difference and "same top p", each with its +/-)."""

    index: int
    n_chunk: int
    ppl: float
    seconds: float
    kld: dict | None = None


def mean_and_uncertainty(s: float, s2: float, count: int) -> tuple[float, float]:
    """llama-perplexity's: the mean and its standard error (0 below 11 values)."""
    if count < 1:
        return 0.0, 0.0
    f = s / count
    df = s2 / count - f * f
    return f, (math.sqrt(df / (count - 1)) if df > 0 and count > 10 else 0.0)


def covariance(a: float, b: float, ab: float, count: int) -> float:
    if count < 10:
        return 0.0
    return (ab / count - (a / count) * (b / count)) / (count - 1)


def percentile(values: np.ndarray, fraction: float) -> float:
    """llama-perplexity's percentile of sorted float32 values, in float32."""
    f = np.float32(fraction)
    if f <= 0:
        return float(values[0])
    if f >= 1:
        return float(values[-1])
    p = f * np.float32(len(values) - 1)
    ip = int(p)
    p = np.float32(p - np.float32(ip))
    return float((np.float32(1) - p) * values[ip] + p * values[min(ip + 1, len(values) - 1)])


def median(values: np.ndarray) -> float:
    n = len(values)
    if n % 2 == 0:
        return float(np.float32(0.5) * (values[n // 2] + values[n // 2 - 1]))
    return float(values[n // 2])


def file_identity(path: str) -> dict:
    st = os.stat(path)
    return {"path": os.path.abspath(path), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


class Perplexity:
    """One run (see the module). `model` is a chunks.Model of n_ctx cells; `tokens` the text's (or
    None with `read_base`, whose tokens are used); `n_chunks` at most this many chunks; `schedule`
    llama.cpp's batch sizes (its n_ctx must be the model's); `write_base` a path to write the base
    file to (`top_k`: ggtool's top-K format); `read_base` an open BaseFile; `anchor` the output
    whose journal lets the run resume (`resume`), None for none; `text_file` names the text in errors."""

    def __init__(self, model, *, tokens: np.ndarray | None = None, n_chunks: int | None = None,
                 schedule: Schedule | None = None, write_base: str | None = None, top_k: int | None = None,
                 read_base: BaseFile | None = None, anchor: str | None = None, resume: bool = False,
                 text_file: str | None = None):
        self.model, self.read_base, self.top_k = model, read_base, top_k
        n_ctx = model.n_ctx
        if read_base is not None:
            h = read_base.header
            if h.n_vocab != model.n_vocab:
                raise EvaluateError(f"the base logits are for a vocabulary of {h.n_vocab} tokens, the model has "
                                    f"{model.n_vocab}", kind="base-vocab", file=read_base.path)
            if h.n_ctx != n_ctx:
                raise EvaluateError(f"the base logits were computed with a context of {h.n_ctx}, not {n_ctx}",
                                    kind="base-ctx", file=read_base.path, n_ctx=h.n_ctx)
            if tokens is not None and not np.array_equal(tokens[: h.n_chunk * n_ctx], read_base.tokens):
                raise EvaluateError("the text's tokens are not those the base logits were computed on",
                                    kind="base-tokens", file=read_base.path)
            tokens, n_max = read_base.tokens, h.n_chunk
        else:
            need_tokens(len(tokens), n_ctx, text_file)
            n_max = len(tokens) // n_ctx
        self.tokens = tokens
        self.n_chunk = n_max if n_chunks is None else max(1, min(n_chunks, n_max))
        self.schedule = schedule or Schedule(n_ctx)
        if self.schedule.n_ctx != n_ctx:
            raise EvaluateError(f"the schedule's n_ctx {self.schedule.n_ctx} is not the model's {n_ctx}", kind="bad-size")
        if top_k is not None and not 1 <= top_k < model.n_vocab:
            raise EvaluateError(f"K must be 1 to {model.n_vocab - 1} (the vocabulary's size less one), not {top_k}",
                                kind="bad-top-k")
        self.first = n_ctx // 2
        self.header = None
        if write_base is not None:
            self.header = new_header(n_ctx, model.n_vocab, self.n_chunk, top_k)
        self.mode = "kld" if read_base is not None else ("base" if write_base is not None else "ppl")
        self.anchor = write_base if write_base is not None else anchor
        self.resume = resume
        self.result: dict | None = None
        self.nll = self.nll2 = 0.0
        self.count = 0
        self.kld = lp.KLDSums()
        self.seconds = 0.0
        self.evaluated = 0
        self._journal: Journal | None = None

    def first_graph(self):
        """The graph of the run's first evaluation (for the thread rule)."""
        return self.model.first_graph(self.schedule.groups(self.n_chunk), self.first)

    # -- identity (what a resumed run must share) -----------------------------------------------------
    def identity(self) -> dict:
        m, s = self.model, self.schedule
        ident = {"mode": self.mode, "model": file_identity(m.path), "program": m.program_digest,
                 "numerics": m.numerics, "n_ctx": m.n_ctx, "n_chunk": self.n_chunk, "n_batch": s.n_batch,
                 "n_ubatch": s.n_ubatch, "top_k": self.top_k,
                 "tokens": hashlib.sha256(np.ascontiguousarray(self.tokens, "<i4").tobytes()).hexdigest()}
        if self.read_base is not None:
            ident["base"] = file_identity(self.read_base.path)
        return ident

    # -- the run --------------------------------------------------------------------------------------
    def open(self) -> None:
        """Open the output's journal now (iterating does it otherwise): a run that cannot start
        there (a journal left over, another run on it, a resumed run that differs) fails before it
        says anything."""
        if self.anchor is not None and self._journal is None:
            head = self.header.header_bytes(self.tokens) if self.header is not None else None
            self._journal = Journal(self.anchor, self.identity(), resume=self.resume, header=head)
            self._restore(self._journal)

    def __iter__(self) -> Iterator[ChunkReport]:
        self.open()
        journal = self._journal
        ok = False
        try:
            yield from self._run(journal)
            ok = True
        finally:
            if journal is not None:
                if ok:
                    journal.finish(self.header.size if self.header is not None else None)
                else:
                    journal.abandon()

    def _restore(self, journal: Journal) -> None:
        for st in journal.states:
            try:
                if "kld" in st:
                    self.kld.kld.append(floats_from(st["kld"]))
                    self.kld.p_diff.append(floats_from(st["p_diff"]))
            except (ValueError, TypeError):
                journal._damaged("a line's values cannot be read")
        if journal.states:
            st = journal.states[-1]
            try:
                self.nll, self.nll2 = float.fromhex(st["nll"]), float.fromhex(st["nll2"])
                self.count = int(st["count"])
                self.seconds = float(st["seconds"])
                if "sums" in st:
                    for k in _SCALARS:
                        setattr(self.kld, k, float.fromhex(st["sums"][k]))
                    self.kld.n_same_top, self.kld.count = int(st["sums"]["n_same_top"]), int(st["sums"]["count"])
            except (KeyError, ValueError, TypeError):
                journal._damaged("a line without its sums")
            n_kld = sum(len(a) for a in self.kld.kld)
            if self.mode == "kld" and n_kld != self.kld.count:
                journal._damaged("its values do not add up")

    def _run(self, journal: Journal | None) -> Iterator[ChunkReport]:
        model, n_ctx, first = self.model, self.model.n_ctx, self.first
        done = journal.done if journal is not None else 0
        groups = [g for g in self.schedule.groups(self.n_chunk) if g.chunks.stop > done]
        if groups and groups[0].chunks.start != done:
            raise EvaluateError(f"cannot resume: the journal stops inside a batch of chunks (after {done})",
                                kind="resume-damaged", file=self.anchor)
        start = time.perf_counter() - self.seconds
        for group in groups:
            kld_from = len(self.kld.kld)
            for piece in model.pieces(self.tokens, [group], first):
                keep = piece.positions < n_ctx - 1            # the last position predicts nothing here
                positions, logits = piece.positions[keep], piece.logits[keep]
                if len(positions):
                    base = piece.chunk * n_ctx
                    next_tokens = self.tokens[base + positions + 1]
                    self._score(piece.chunk, positions - first, logits, next_tokens, journal)
                if piece.positions[-1] == n_ctx - 1:          # the chunk's last piece
                    self.evaluated += n_ctx
                    self.seconds = time.perf_counter() - start
                    if journal is not None and piece.chunk == group.chunks[-1]:   # the batch is done: kept
                        journal.commit(group.chunks.stop, self._state(kld_from))
                    yield self._report(piece.chunk)
        self.seconds = time.perf_counter() - start
        self.result = self._final()

    def _score(self, chunk: int, rows: np.ndarray, logits: np.ndarray, next_tokens: np.ndarray, journal) -> None:
        if self.mode == "ppl":
            v = lp.nll(logits, next_tokens)
        elif self.mode == "base":
            if self.top_k is None:
                enc, v = lp.encode_full(logits, next_tokens)
                journal.write_rows(enc.tobytes())
            else:
                ids, lps, rest, nxt, v = lp.encode_top_k(logits, next_tokens, self.top_k)
                journal.write_rows(top_k_row_bytes(ids, lps, rest, nxt))
        else:
            base = self.read_base.rows(chunk, int(rows[0]), len(rows))
            if self.read_base.header.kind == "full":
                lp.kld_full(logits, next_tokens, base, self.kld)
            else:
                lp.kld_top_k(logits, next_tokens, *base, self.kld)
            return
        self.nll += float(v.sum())
        self.nll2 += float((v * v).sum())
        self.count += len(v)

    def _report(self, chunk: int) -> ChunkReport:
        if self.mode != "kld":
            return ChunkReport(chunk + 1, self.n_chunk, math.exp(self.nll / self.count), self.seconds)
        k = self.kld
        log_ppl = mean_and_uncertainty(k.sum_nll, k.sum_nll2, k.count)
        ppl = math.exp(log_ppl[0])
        base = mean_and_uncertainty(k.sum_nll_base, k.sum_nll_base2, k.count)
        cov = covariance(k.sum_nll, k.sum_nll_base, k.sum_nll_nll_base, k.count)
        ratio_unc = math.sqrt(max(0.0, log_ppl[1] ** 2 + base[1] ** 2 - 2 * cov))
        kl = mean_and_uncertainty(k.sum_kld, k.sum_kld2, k.count)
        mse = mean_and_uncertainty(k.sum_p_diff2, k.sum_p_diff4, k.count)
        rms = math.sqrt(mse[0])
        top = k.n_same_top / k.count
        row = {"ppl": ppl, "ppl_unc": ppl * log_ppl[1], "ln_ratio": log_ppl[0] - base[0], "ln_ratio_unc": ratio_unc,
               "kld": kl[0], "kld_unc": kl[1], "rms_dp": rms, "rms_dp_unc": (0.5 / rms * mse[1]) if rms else 0.0,
               "same_top": top,
               "same_top_unc": math.sqrt(top * (1 - top) / (k.count - 1)) if k.count > 1 else 0.0}
        return ChunkReport(chunk + 1, self.n_chunk, ppl, self.seconds, row)

    def _state(self, kld_from: int) -> dict:
        st = {"nll": self.nll.hex(), "nll2": self.nll2.hex(), "count": self.count, "seconds": self.seconds}
        if self.mode == "kld":
            k = self.kld
            st["sums"] = {**{n: float(getattr(k, n)).hex() for n in _SCALARS}, "n_same_top": k.n_same_top,
                          "count": k.count}
            st["kld"] = floats_text(np.concatenate(k.kld[kld_from:]) if k.kld[kld_from:] else np.zeros(0))
            st["p_diff"] = floats_text(np.concatenate(k.p_diff[kld_from:]) if k.p_diff[kld_from:] else np.zeros(0))
        return st

    # -- the final record -------------------------------------------------------------------------------
    def _common(self) -> dict:
        m = self.model
        return {"model": m.path, "n_ctx": m.n_ctx, "n_chunk": self.n_chunk, "n_vocab": m.n_vocab,
                "n_batch": self.schedule.n_batch, "n_ubatch": self.schedule.n_ubatch, "numerics": m.numerics,
                "seconds": self.seconds, "tokens_per_second": (self.evaluated / self.seconds if self.seconds else None)}

    def _final(self) -> dict:
        if self.mode != "kld":
            nll, nll2, count = self.nll / self.count, self.nll2 / self.count, self.count
            ppl = math.exp(nll)
            var = nll2 - nll * nll
            unc = math.sqrt(var / (count - 1)) * ppl if var > 0 and count > 1 else None
            rec = {"kind": "perplexity", **self._common(), "scored": count, "ppl": ppl, "ppl_unc": unc}
            if self.mode == "base":
                rec["base_file"] = {"path": self.anchor, "format": "top-k" if self.top_k else "llama.cpp",
                                    "top_k": self.top_k, "bytes": self.header.size}
            return rec
        return {"kind": "kl-divergence", **self._common(), "base_file": {
            "path": self.read_base.path, "format": "top-k" if self.read_base.header.kind == "top-k" else "llama.cpp",
            "top_k": self.read_base.header.k or None}, **kld_statistics(self.kld)}


def kld_statistics(k: lp.KLDSums) -> dict:
    """llama-perplexity's closing statistics (its "Perplexity", "KL divergence" and "Token
    probability" sections) from the sums; with a top-K base file, the bound too."""
    values = np.sort(np.concatenate(k.kld)) if k.kld else np.zeros(0, np.float32)
    p_diff = np.sort(np.concatenate(k.p_diff)) if k.p_diff else np.zeros(0, np.float32)
    n = k.count
    log_ppl = mean_and_uncertainty(k.sum_nll, k.sum_nll2, n)
    ppl = math.exp(log_ppl[0])
    ppl_unc = ppl * log_ppl[1]
    log_base = mean_and_uncertainty(k.sum_nll_base, k.sum_nll_base2, n)
    base = math.exp(log_base[0])
    base_unc = base * log_base[1]
    cov = covariance(k.sum_nll, k.sum_nll_base, k.sum_nll_nll_base, n)
    denom = log_ppl[1] * log_base[1]
    cor = cov / denom if denom else float("nan")
    ln_ratio = log_ppl[0] - log_base[0]
    ln_ratio_unc = math.sqrt(max(0.0, log_ppl[1] ** 2 + log_base[1] ** 2 - 2 * cov))
    ratio = math.exp(ln_ratio)
    ppl_cov = ppl * base * cov
    kl = mean_and_uncertainty(k.sum_kld, k.sum_kld2, n)
    dp = mean_and_uncertainty(k.sum_p_diff, k.sum_p_diff2, n)
    mse = mean_and_uncertainty(k.sum_p_diff2, k.sum_p_diff4, n)
    rms = math.sqrt(mse[0])
    top = k.n_same_top / n if n else 0.0
    pct = {"maximum": float(values[-1]) if n else None, "99.9": None, "99.0": None, "95.0": None, "90.0": None,
           "median": median(values) if n else None, "10.0": None, "5.0": None, "1.0": None, "0.1": None,
           "minimum": float(values[0]) if n else None}
    dpct = {"maximum": float(p_diff[-1]) if n else None, "99.9": None, "99.0": None, "95.0": None, "90.0": None,
            "75.0": None, "median": median(p_diff) if n else None, "25.0": None, "10.0": None, "5.0": None,
            "1.0": None, "0.1": None, "minimum": float(p_diff[0]) if n else None}
    if n:
        for key in pct:
            if key not in ("maximum", "median", "minimum"):
                pct[key] = percentile(values, float(key) / 100)
        for key in dpct:
            if key not in ("maximum", "median", "minimum"):
                dpct[key] = percentile(p_diff, float(key) / 100)
    out = {
        "scored": n,
        "ppl": {"q": ppl, "q_unc": ppl_unc, "base": base, "base_unc": base_unc, "cor": cor,
                "ln_ratio": ln_ratio, "ln_ratio_unc": ln_ratio_unc, "ratio": ratio, "ratio_unc": ratio * ln_ratio_unc,
                "diff": ppl - base,
                "diff_unc": math.sqrt(max(0.0, ppl_unc ** 2 + base_unc ** 2 - 2 * ppl_cov))},
        "kld": {"mean": kl[0], "mean_unc": kl[1], "percentiles": pct},
        "dp": {"mean": dp[0], "mean_unc": dp[1], "percentiles": dpct, "rms": rms,
               "rms_unc": (0.5 / rms * mse[1]) if rms else 0.0},
        "same_top": {"p": top, "unc": math.sqrt(top * (1 - top) / (n - 1)) if n > 1 else 0.0},
    }
    if k.sum_bound or k.sum_rest:
        out["kld"]["top_k"] = {"bound_mean": k.sum_bound / n if n else 0.0, "rest_mean": k.sum_rest / n if n else 0.0}
    return out
