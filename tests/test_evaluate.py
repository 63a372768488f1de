"""`ggtool perplexity` and `ggtool imatrix` (ggtool.evaluate) on stories260K and fixtures/genesis.txt,
against llama-perplexity's and llama-imatrix's own output (tests/golden/evaluate, README there), and
every bad input the commands refuse. gemma-3-270m's bit-exact checks: test_evaluate_gemma.py."""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT, fails, ok

from ggtool.evaluate import BaseFile, EvaluateError, Model, Perplexity, Schedule, read_text, tokenize_text
from ggtool.evaluate import logprobs as lp
from ggtool.evaluate.collect import ImatrixRun
from ggtool.imatrix import read_imatrix, read_imatrix_sums

GOLD = ROOT / "tests" / "golden" / "evaluate"
LLAMA = json.loads((GOLD / "llama-cpp.json").read_text(encoding="utf-8"))
STORIES = ROOT / "fixtures" / "stories260K.gguf"
TEXT = ROOT / "fixtures" / "genesis.txt"
BASE = GOLD / "stories260K-base-c64.bin"
EXACT = "llama.cpp-avx512"        # the build the golden data comes from (emulated on any x86-64)


def ppl_line(reports) -> str:
    return "".join(f"[{r.index}]{r.ppl:.4f}," for r in reports)


def same_print(mine: str, theirs: str) -> bool:
    """Two printed lines with the same words and numbers equal to +/-1 in the last digit printed."""
    import re

    num = r"-?\d+\.\d+"
    if re.sub(num, "#", mine) != re.sub(num, "#", theirs):
        return False
    for a, b in zip(re.findall(num, mine), re.findall(num, theirs)):
        digits = len(b.split(".")[1])
        if abs(float(a) - float(b)) > 1.0001 * 10 ** -digits:
            return False
    return True


@pytest.fixture(scope="module")
def tokens():
    return tokenize_text(Model(STORIES, 64).vocab, read_text(TEXT))


@pytest.fixture(scope="module")
def q4_0(tmp_path_factory) -> Path:
    """stories260K quantized to Q4_0 by ggtool: the file llama-perplexity ran (same sha256)."""
    out = tmp_path_factory.mktemp("q") / "stories-q4_0.gguf"
    from ggtool.quantize_model import QuantizeOptions, quantize_file

    quantize_file(str(STORIES), str(out), QuantizeOptions("Q4_0"))
    assert hashlib.sha256(out.read_bytes()).hexdigest() == LLAMA["stories260K-q4_0-sha256"]
    return out


# -- llama-perplexity's procedure -----------------------------------------------------------------------
@pytest.mark.parametrize("ctx, pieces, n_chunk", [
    (512, [[(0, 128), (128, 256), (256, 384), (384, 512)]] * 2, 8),          # 4 chunks a batch: 128 tokens of each
    (512, [[(0, 170), (170, 340), (340, 510), (510, 512)]], 3),                # 3 left: 512 // 3 of each
    (128, [[(0, 32), (32, 64), (64, 96), (96, 128)]], 16),                    # 16 a batch
])
def test_pieces_are_llama_cpps_micro_batches(ctx, pieces, n_chunk):
    groups = Schedule(ctx).groups(n_chunk)
    assert [list(g.pieces) for g in groups] == pieces
    assert [g.chunks for g in groups] == [range(i, min(i + Schedule(ctx).n_seq, n_chunk))
                                          for i in range(0, n_chunk, Schedule(ctx).n_seq)]


def test_one_stream_evaluates_batch_after_batch():
    s = Schedule(512, n_batch=256, n_ubatch=100)           # n_batch < n_ctx: batches of 256, each in 100s
    assert [list(g.pieces) for g in s.groups(2)] == [[(0, 100), (100, 200), (200, 256), (256, 356), (356, 456),
                                                     (456, 512)]] * 2
    assert Schedule(128, 128).groups(3)[2].pieces == ((0, 128),)


def test_perplexity_is_llama_perplexitys(tokens):
    """Each chunk's running PPL and the final estimate, as llama-perplexity prints them (F32 model)."""
    run = Perplexity(Model(STORIES, 128, numerics=EXACT), tokens=tokens, n_chunks=8)
    line = ppl_line(run)
    r = run.result
    assert [line, f"Final estimate: PPL = {r['ppl']:.4f} +/- {r['ppl_unc']:.5f}"] == LLAMA["stories260K-ppl-c128"]
    assert r["scored"] == 8 * 63 and r["n_chunk"] == 8


def test_chunk_batching_does_not_change_the_default_numerics(tokens):
    """-b / -ub move the pieces; GGML's own order sums each row alike (within float rounding)."""
    a = Perplexity(Model(STORIES, 64), tokens=tokens, n_chunks=4)
    b = Perplexity(Model(STORIES, 64), tokens=tokens, n_chunks=4, schedule=Schedule(64, 64, 16))
    list(a), list(b)
    assert abs(a.result["ppl"] - b.result["ppl"]) < 1e-4 * a.result["ppl"]


def _encode_like_c(row: np.ndarray, tok: int):
    """perplexity.cpp's log_softmax(n_vocab, logits, log_prob, tok), line by line in float32."""
    f = np.float32
    mx, mn = f(row[0]), f(row[0])
    for v in row[1:]:
        mx, mn = max(mx, v), min(mn, v)
    mn = max(mn, f(mx - f(16)))
    s = 0.0
    for v in row:
        s += float(f(np.exp(np.float64(f(v - mx)))))
    lse = f(np.log(s))
    min_lp = f(f(mn - mx) - lse)
    scale = f(f(mx - mn) / f(65535))
    vals = np.zeros(len(row), np.uint16)
    if scale:
        inv = f(f(1) / scale)
        for i, v in enumerate(row):
            vals[i] = int(np.rint(f(inv * f(v - mn)))) if v > mn else 0
    return scale, min_lp, vals, float(f(f(mx + lse) - row[tok]))


def test_base_rows_are_encoded_as_llama_perplexity_encodes_them():
    rng = np.random.default_rng(3)
    rows = (rng.standard_normal((4, 37)) * 6).astype(np.float32)
    rows[1, :] = 2.5                      # flat: scale 0, every value 0
    rows[2, 5] = 40                       # most values more than 16 nats below the top: stored as 0
    toks = np.array([3, 0, 5, 36])
    enc, nll = lp.encode_full(rows, toks)
    assert enc.shape == (4, lp.row_width(37)) == (4, 42)
    for r in range(4):
        scale, min_lp, vals, v = _encode_like_c(rows[r], toks[r])
        head = enc[r, :4].copy().view(np.float32)
        assert (head[0], head[1]) == (scale, min_lp) and np.array_equal(enc[r, 4:41], vals) and enc[r, 41] == 0
        assert nll[r] == v
    assert (enc[2, 4:41] == 0).sum() > 30


def test_llama_cpps_base_file_reads_back_as_its_model(tokens):
    """llama-perplexity's base file (F32 model, c=64, 4 chunks): its tokens are the text's, its PPL(base)
    what llama-perplexity prints reading it, and the same model against it agrees with it."""
    with BaseFile(BASE) as base:
        h = base.header
        assert (h.kind, h.n_ctx, h.n_vocab, h.n_chunk) == ("full", 64, 512, 4)
        assert np.array_equal(base.tokens, tokens[:256])
        run = Perplexity(Model(STORIES, 64, numerics=EXACT), read_base=base)
        list(run)
    r = run.result
    want = LLAMA["stories260K-q4_0-kld-c64"][1]              # "Mean PPL(base)   :  42.404189 ±  13.169851"
    assert f"{r['ppl']['base']:10.6f} ± {r['ppl']['base_unc']:10.6f}" == want.split(":")[1].strip().rjust(23)
    assert r["kld"]["mean"] < 2e-5 and r["same_top"]["p"] == 1.0 and r["scored"] == 124


def test_ggtools_base_file_is_llama_cpps(tmp_path, tokens):
    """Under llama.cpp's numerics stories260K's logits are llama.cpp's to the bit (docs/evaluate.md), so
    the base-logits file is llama-perplexity's, every byte; llama-perplexity's per-chunk PPL while
    writing it."""
    out = tmp_path / "base.bin"
    run = Perplexity(Model(STORIES, 64, numerics=EXACT), tokens=tokens, n_chunks=4, write_base=str(out))
    assert same_print(ppl_line(run), LLAMA["stories260K-base-c64"][0])
    a, b = BASE.read_bytes(), out.read_bytes()
    assert len(a) == len(b) and a[:20 + 4 * 256] == b[:20 + 4 * 256]
    ra = np.frombuffer(a[1044:], np.uint16).reshape(124, 516)
    rb = np.frombuffer(b[1044:], np.uint16).reshape(124, 516)
    assert np.array_equal(ra, rb), f"{int((ra != rb).sum())} values differ"
    assert not list(tmp_path.glob(".*"))                     # no journal, no partial file left


def _kld_run(run, model):
    res = run("perplexity", "--gguf", model, "--kl-divergence-base", BASE, "--kl-divergence", "--numerics", EXACT, "-q")
    ok(res)
    mine = {line.split(":")[0].strip(): line for line in res.stderr.splitlines() if ":" in line}
    theirs = {line.split(":")[0].strip(): line for line in LLAMA["stories260K-q4_0-kld-c64"]}
    assert len(theirs) == 34 and set(theirs) <= set(mine)
    return mine, theirs


def test_q4_0_against_llama_cpps_base_file(run, q4_0):
    """The KL divergence of ggtool's Q4_0 from llama-perplexity's base file: every line llama-perplexity
    prints, to its last digit (the base side is the file's; the model's side is llama.cpp's logits to
    the bit under llama.cpp's numerics, so Q4_0's 8-bit activations round alike)."""
    mine, theirs = _kld_run(run, q4_0)
    assert mine["Mean PPL(base)"] == theirs["Mean PPL(base)"]
    differ = [(mine[k], theirs[k]) for k in theirs if not same_print(mine[k], theirs[k])]
    assert not differ, differ


def test_top_k_base_file(tmp_path, tokens):
    """--kl-top-k: a file of 8K + 8 bytes a row; read back, the same PPL(base) to the float, the KLD a
    lower bound within the stated bound of the full file's."""
    full, top = tmp_path / "full.bin", tmp_path / "top.bin"
    for path, k in ((full, None), (top, 32)):
        list(Perplexity(Model(STORIES, 64), tokens=tokens, n_chunks=4, write_base=str(path), top_k=k))
    assert top.stat().st_size == 28 + 4 * 256 + 124 * (8 * 32 + 8)
    res = {}
    for path in (full, top):
        with BaseFile(path) as b:
            r = Perplexity(Model(STORIES, 64), read_base=b)
            list(r)
            res[path] = r.result
    f, t = res[full], res[top]
    assert abs(f["ppl"]["base"] - t["ppl"]["base"]) < 1e-3 * f["ppl"]["base"]
    assert t["kld"]["mean"] <= f["kld"]["mean"] + 1e-6
    assert f["kld"]["mean"] - t["kld"]["mean"] <= t["kld"]["top_k"]["bound_mean"] + 1e-4
    assert t["kld"]["mean"] < 1e-4 and t["same_top"]["p"] == 1.0       # the model against itself


# -- resume ---------------------------------------------------------------------------------------------
def test_an_interrupted_run_resumes_to_the_same_bytes(tmp_path, tokens):
    """Stopped after two batches of chunks (-b 64: one chunk a batch), continued with --resume: the
    base file and the PPL of an uninterrupted run."""
    whole, cut = tmp_path / "whole.bin", tmp_path / "cut.bin"
    sched = Schedule(64, 64)
    first = Perplexity(Model(STORIES, 64), tokens=tokens, n_chunks=4, write_base=str(whole), schedule=sched)
    list(first)
    run = Perplexity(Model(STORIES, 64), tokens=tokens, n_chunks=4, write_base=str(cut), schedule=sched)
    it = iter(run)
    next(it), next(it)
    it.close()                                    # as Ctrl-C would: GeneratorExit inside the loop
    assert not cut.exists() and (tmp_path / ".cut.bin.ggtool-journal").exists()
    with pytest.raises(EvaluateError, match="resume it") as e:
        list(Perplexity(Model(STORIES, 64), tokens=tokens, n_chunks=4, write_base=str(cut), schedule=sched))
    assert e.value.kind == "resume-exists"
    with pytest.raises(EvaluateError, match="n_batch") as e:
        list(Perplexity(Model(STORIES, 64), tokens=tokens, n_chunks=4, write_base=str(cut), resume=True))
    assert e.value.kind == "resume-mismatch"
    again = Perplexity(Model(STORIES, 64), tokens=tokens, n_chunks=4, write_base=str(cut), schedule=sched, resume=True)
    reports = list(again)
    assert [r.index for r in reports] == [3, 4]
    assert cut.read_bytes() == whole.read_bytes() and again.result["ppl"] == first.result["ppl"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cut.bin", "whole.bin"]


def test_the_command_says_how_to_resume(run, tmp_path, tokens):
    cut = tmp_path / "cut.bin"
    it = iter(Perplexity(Model(STORIES, 64), tokens=tokens, n_chunks=4, write_base=str(cut), schedule=Schedule(64, 64)))
    next(it), next(it)
    it.close()
    args = ("perplexity", "--gguf", STORIES, "-f", TEXT, "-c", "64", "--chunks", "4", "-b", "64",
            "--kl-divergence-base", cut)
    fails(run(*args), "an interrupted run left its progress (2 chunks done)", "(--resume continues it)")
    ok(run(*args, "--resume", "-q"))
    assert cut.stat().st_size == BASE.stat().st_size and not (tmp_path / ".cut.bin.ggtool-journal").exists()


def test_kld_resumes_with_its_percentiles(tmp_path, q4_0):
    """A KL-divergence run anchored on its record: the percentiles need every token's value, kept in the journal."""
    out = tmp_path / "rec.json"
    with BaseFile(BASE) as b:
        whole = Perplexity(Model(q4_0, 64), read_base=b, schedule=Schedule(64, 64))
        list(whole)
        cut = Perplexity(Model(q4_0, 64), read_base=b, schedule=Schedule(64, 64), anchor=str(out))
        it = iter(cut)
        next(it)
        it.close()
        again = Perplexity(Model(q4_0, 64), read_base=b, schedule=Schedule(64, 64), anchor=str(out), resume=True)
        list(again)
    assert again.result["kld"] == whole.result["kld"] and again.result["dp"] == whole.result["dp"]


@pytest.mark.parametrize("damage", ["garbage", "cut", "symlink"])
def test_a_damaged_journal_is_refused(tmp_path, tokens, damage):
    cut = tmp_path / "cut.bin"
    sched = Schedule(64, 64)
    it = iter(Perplexity(Model(STORIES, 64), tokens=tokens, n_chunks=4, write_base=str(cut), schedule=sched))
    next(it), next(it)
    it.close()
    journal, partial = tmp_path / ".cut.bin.ggtool-journal", tmp_path / ".cut.bin.ggtool-partial"
    if damage == "garbage":
        journal.write_text("not json\n")
    elif damage == "cut":
        partial.write_bytes(partial.read_bytes()[:100])
    else:
        target = tmp_path / "elsewhere"
        journal.rename(target)
        journal.symlink_to(target)
    with pytest.raises(EvaluateError, match="cannot resume") as e:
        list(Perplexity(Model(STORIES, 64), tokens=tokens, n_chunks=4, write_base=str(cut), schedule=sched,
                        resume=True))
    assert e.value.kind == "resume-damaged" and not cut.exists()


def test_a_second_run_on_the_same_output_is_refused(tmp_path, tokens):
    out = tmp_path / "b.bin"
    it = iter(Perplexity(Model(STORIES, 64), tokens=tokens, n_chunks=4, write_base=str(out)))
    next(it)
    with pytest.raises(EvaluateError) as e:
        list(Perplexity(Model(STORIES, 64), tokens=tokens, n_chunks=4, write_base=str(out)))
    assert e.value.kind in ("resume-busy", "resume-exists")
    it.close()


# -- imatrix --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name, output", [("stories260K-imatrix-c64.gguf", False),
                                          ("stories260K-imatrix-c64-output.gguf", True)])
def test_imatrix_is_llama_imatrixs(tmp_path, tokens, name, output):
    """The entries, counts and metadata of llama-imatrix's file; in_sum2 within 1e-5 relative (bit for
    bit where the model's logits are llama.cpp's: gemma, test_evaluate_gemma.py)."""
    run = ImatrixRun(Model(STORIES, 64, numerics=EXACT), tokens, dataset="genesis.txt", n_chunks=4,
                     process_output=output)
    list(run)
    out = tmp_path / "m.gguf"
    out.write_bytes(run.bytes())
    a, b = read_imatrix_sums(GOLD / name, 64), read_imatrix_sums(out, 64)
    assert sorted(a.sums) == sorted(b.sums) and len(a.sums) == 35 + output
    for k in a.sums:
        assert np.array_equal(a.counts[k], b.counts[k]) and a.counts[k].tolist() == [256]
        assert np.allclose(a.sums[k], b.sums[k], rtol=1e-5, atol=0), k
    ra, rb = read_imatrix(GOLD / name), read_imatrix(out)
    assert (ra.datasets, ra.chunk_count, ra.chunk_size) == (rb.datasets, rb.chunk_count, rb.chunk_size) == (
        ("genesis.txt",), 4, 64)
    assert len(out.read_bytes()) == len((GOLD / name).read_bytes())


def test_in_files_merge_as_llama_imatrix_merges(run, tmp_path):
    out = tmp_path / "merged.gguf"
    ok(run("imatrix", "--in-file", GOLD / "stories260K-imatrix-c64.gguf", "--in-file",
           GOLD / "stories260K-imatrix-c64-output.gguf", "-c", "64", "-o", out))
    assert hashlib.sha256(out.read_bytes()).hexdigest() == LLAMA["stories260K-imatrix-merged-sha256"]


def test_imatrix_command_and_quantize(run, tmp_path):
    """The command's file is one `ggtool quantize --imatrix` takes; --in-file adds its sums first."""
    out, twice, q = tmp_path / "i.gguf", tmp_path / "i2.gguf", tmp_path / "q.gguf"
    ok(run("imatrix", "--gguf", STORIES, "-f", TEXT, "-c", "64", "--chunks", "2", "-o", out, "-q"))
    ok(run("imatrix", "--gguf", STORIES, "-f", TEXT, "-c", "64", "--chunks", "2", "-o", twice, "--in-file", out, "-q"))
    a, b = read_imatrix_sums(out, 64), read_imatrix_sums(twice, 64)
    assert all(np.array_equal(b.counts[k], 2 * a.counts[k]) for k in a.sums)
    assert all(np.allclose(b.sums[k], 2 * a.sums[k], rtol=1e-6) for k in a.sums)
    assert read_imatrix(twice).datasets == (str(TEXT), str(TEXT)) and read_imatrix(twice).chunk_count == 4
    ok(run("quantize", STORIES, q, "--type", "IQ4_NL", "--imatrix", twice, "--quiet"))


# -- the observation hook -------------------------------------------------------------------------------
@pytest.mark.parametrize("threads", [1, 2])
def test_observe_sees_each_wanted_node_with_its_sources(threads):
    """graph_compute(observe=): in one process as each node finishes, on the pool after the compute, the
    wanted nodes' sources hold what the node read (later nodes reuse their memory otherwise)."""
    import ggtool
    from ggtool.pool import get_pool

    ctx = ggtool.Context()
    a = ctx.new_tensor(ggtool.GGMLType.F32, [8, 4]).set_data(np.arange(32, dtype=np.float32).reshape(4, 8))
    w = ctx.new_tensor(ggtool.GGMLType.F32, [8, 3]).set_data(np.ones((3, 8), np.float32))
    from ggtool.ops import FUNCTIONS as F

    x = F["scale"](ctx, a, 2.0)
    y = F["mul_mat"](ctx, w, x)
    z = F["scale"](ctx, F["relu"](ctx, y), 0.5)
    out = F["mul_mat"](ctx, w, F["scale"](ctx, a, 3.0))
    g = ggtool.Graph(ctx).expand(z).expand(out)
    seen = []

    class Obs:
        def wants(self, node):
            return node.op == "MUL_MAT"

        def __call__(self, node):
            seen.append((node.name, np.array(node.src[1].data).reshape(4, 8)))

    ggtool.graph_compute(g, threads, pool=get_pool(threads) if threads > 1 else None, alloc="graph", outputs=[z, out],
                         observe=Obs())
    base = np.arange(32, dtype=np.float32).reshape(4, 8)
    assert [s[0] for s in seen] == [n.name for n in g.nodes if n.op == "MUL_MAT"]
    assert np.array_equal(seen[0][1], base * 2) and np.array_equal(seen[1][1], base * 3)


# -- bad input: one line, nothing written -------------------------------------------------------------
def _no_output(d: Path, *names: str) -> None:
    left = sorted(p.name for p in d.iterdir() if p.name not in names)
    assert not left, left


def test_a_text_shorter_than_two_chunks(run, tmp_path):
    short = tmp_path / "short.txt"
    short.write_text("Once upon a time there was a little girl.\n")
    fails(run("perplexity", "--gguf", STORIES, "-f", short, "--kl-divergence-base", tmp_path / "b.bin"),
          "short.txt", "tokens; a context of 512 needs at least 1024", "smaller -c")
    fails(run("imatrix", "--gguf", STORIES, "-f", short, "-o", tmp_path / "i.gguf"), "needs at least 1024")
    _no_output(tmp_path, "short.txt")


@pytest.mark.parametrize("content, words", [(b"", "the text is empty"), (b"  \n\n", "only white space"),
                                            (b"abc\0def" * 100, "not a text file (a NUL byte at offset 3)"),
                                            (b"caf\xe9 " * 300, "not UTF-8 text (byte 0xe9 at offset 3)")])
def test_empty_or_binary_text(run, tmp_path, content, words):
    t = tmp_path / "t.txt"
    t.write_bytes(content)
    fails(run("perplexity", "--gguf", STORIES, "-f", t, "-o", tmp_path / "r.json"), words)
    fails(run("imatrix", "--gguf", STORIES, "-f", t, "-o", tmp_path / "i.gguf"), words)
    _no_output(tmp_path, "t.txt")


def test_a_base_file_for_another_vocabulary_or_context(run, tmp_path):
    tiny = ROOT / "fixtures" / "llama-2-tiny-random.gguf"
    fails(run("perplexity", "--gguf", tiny, "--kl-divergence-base", BASE, "--kl-divergence"),
          "a vocabulary of 512 tokens, the model has 32000")
    fails(run("perplexity", "--gguf", STORIES, "--kl-divergence-base", BASE, "--kl-divergence", "-c", "128"),
          "computed with a context of 64, not 128 (give the file's -c")
    other = tmp_path / "other.txt"
    other.write_text(TEXT.read_text()[500:], encoding="utf-8")
    fails(run("perplexity", "--gguf", STORIES, "-f", other, "--kl-divergence-base", BASE, "--kl-divergence"),
          "the text's tokens are not those the base logits were computed on")


@pytest.mark.parametrize("cut, words", [(2000, "truncated: 2000 bytes, where 4 chunks of 64 tokens"),
                                        (10, "truncated: 10 bytes, not even its header"),
                                        (-1, "not a base-logits file")])
def test_a_truncated_or_foreign_base_file(run, tmp_path, cut, words):
    b = tmp_path / "b.bin"
    b.write_bytes(BASE.read_bytes()[:cut] if cut > 0 else b"GGUF" + BASE.read_bytes()[4:])
    fails(run("perplexity", "--gguf", STORIES, "--kl-divergence-base", b, "--kl-divergence", "-o", tmp_path / "r.json"),
          words)
    _no_output(tmp_path, "b.bin")


def test_a_base_file_whose_tokens_lie(run, tmp_path):
    raw = bytearray(BASE.read_bytes())
    raw[20:24] = struct.pack("<i", 99999)
    b = tmp_path / "b.bin"
    b.write_bytes(bytes(raw))
    fails(run("perplexity", "--gguf", STORIES, "--kl-divergence-base", b, "--kl-divergence"),
          "token 99999 at position 0 is outside its vocabulary of 512")


def test_an_imatrix_for_another_model(run, tmp_path):
    """llama-2-tiny-random's matrices are 64 wide too, but have other names; a renamed entry of another
    width is refused as well."""
    fails(run("imatrix", "--gguf", ROOT / "fixtures" / "llama-2-tiny-random.gguf", "-f", TEXT, "-c", "64",
              "--in-file", GOLD / "stories260K-imatrix-c64-output.gguf", "-o", tmp_path / "i.gguf"),
          "--in-file", "an importance matrix for another model?")
    _no_output(tmp_path)


def test_usage_errors(run, tmp_path):
    fails(run("perplexity", "--gguf", STORIES, "--kl-divergence"), "needs --kl-divergence-base", code=2)
    fails(run("perplexity", "--gguf", STORIES), "-f TEXT", code=2)
    fails(run("perplexity", "--gguf", STORIES, "-f", TEXT, "--resume"), "--resume needs a file", code=2)
    fails(run("perplexity", "--gguf", STORIES, "-f", TEXT, "--kl-top-k", "4"), "needs --kl-divergence-base", code=2)
    fails(run("imatrix", "-o", tmp_path / "x.gguf"), "importance matrices to merge", code=2)
    fails(run("perplexity", "--gguf", STORIES, "-f", TEXT, "--kl-divergence-base", STORIES), "same file")
    (tmp_path / "there.bin").write_bytes(b"x")
    fails(run("perplexity", "--gguf", STORIES, "-f", TEXT, "--kl-divergence-base", tmp_path / "there.bin"),
          "exists (use --force")
    assert (tmp_path / "there.bin").read_bytes() == b"x"


def test_the_commands_print_what_llama_cpp_prints(run, tmp_path):
    res = run("perplexity", "--gguf", STORIES, "-f", TEXT, "-c", "128", "--chunks", "8", "--numerics", EXACT, "--json")
    rec = json.loads(ok(res))
    assert rec["kind"] == "perplexity" and rec["n_chunk"] == 8
    err = res.stderr.splitlines()
    assert err[0] == "perplexity: calculating perplexity over 8 chunks, n_ctx=128, batch_size=2048, n_seq=16"
    assert err[1:3] == LLAMA["stories260K-ppl-c128"]
