"""Vocabularies that lie: the tokenizer.* arrays of a GGUF file with the wrong type, the wrong
length, items that are not what they say, special ids outside the vocabulary. Each named case
gives one VocabError naming the key (and `ggtool tokenize` one `Error:` line); a seeded mutation
fuzz over two small vocabularies (SentencePiece and byte-level BPE) ends every mutant in ids or
one clean GGToolError, never another exception.

`python tests/test_vocab_fuzz.py [SEED]` prints the count of mutants per outcome."""

from __future__ import annotations

import math
import random
import struct
import sys
from collections import Counter
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from conftest import fails, ok  # noqa: E402
from gguf_craft import gguf, gstr, kv  # noqa: E402

from ggtool.errors import GGToolError  # noqa: E402
from ggtool.tokenizer import Vocab, VocabError  # noqa: E402

SEED = 29
K = "tokenizer.ggml."
TYPE = {"u8": 0, "i8": 1, "u16": 2, "i16": 3, "u32": 4, "i32": 5, "f32": 6, "bool": 7, "str": 8, "arr": 9,
        "u64": 10, "i64": 11, "f64": 12}
_FMT = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


def _pack(t: int, v) -> bytes:
    if t == 8:
        return gstr(v)
    if t == 9:
        item, items = v
        return struct.pack("<IQ", TYPE[item], len(items)) + b"".join(_pack(TYPE[item], x) for x in items)
    return struct.pack(_FMT[t], v)


def vocab_bytes(kvs: dict) -> bytes:
    """A tensor-free GGUF of `kvs`: {key: (type name, value)}, an array as ("arr", (item type, items))."""
    return gguf([kv(k, TYPE[t], _pack(TYPE[t], v)) for k, (t, v) in kvs.items()])


SPACE = "\u2581"
BYTES = [f"<0x{b:02X}>" for b in range(256)]
SPM_TOKENS = ["<unk>", "<s>", "</s>", SPACE, "a", "b", "ab", SPACE + "a", SPACE * 2, "aa", "ba", "<sep>"] + BYTES
SPM = {K + "model": ("str", "llama"),
       K + "tokens": ("arr", ("str", SPM_TOKENS)),
       K + "scores": ("arr", ("f32", [0.0] * 3 + [-1.0, -2.0, -3.0, -0.5, -0.25, -0.5, -0.5, -0.75, 0.0] + [0.0] * 256)),
       K + "token_type": ("arr", ("i32", [2, 3, 3] + [1] * 8 + [4] + [6] * 256)),
       K + "padding_token_id": ("u32", 2**32 - 1)}
G = "\u0120"   # GPT-2's byte character for a space
BPE_TOKENS = ["a", "b", "c", G, "ab", G + "a", G + "ab", "abc", "!", "<|endoftext|>", "<|im_end|>"]
BPE = {K + "model": ("str", "gpt2"),
       K + "pre": ("str", "qwen2"),
       K + "tokens": ("arr", ("str", BPE_TOKENS)),
       K + "token_type": ("arr", ("i32", [1] * 9 + [3, 3])),
       K + "merges": ("arr", ("str", ["a b", G + " a", G + "a b", "ab c", G + " ab"])),
       K + "bos_token_id": ("u32", 9),
       K + "eos_token_id": ("u32", 10)}
TEXTS = ["", "ab a ba  aab!", " aaaa bbbb", "<s>ab</s><sep>", "<|endoftext|>abc<|im_end|>", "é\n\t 12 ☃"]


def with_changes(base: dict, **changes) -> dict:
    """`base` with tokenizer.ggml.KEY set to (type, value), or removed for None."""
    d = dict(base)
    for k, v in changes.items():
        if v is None:
            d.pop(K + k, None)
        else:
            d[K + k] = v
    return d


def exercise(path) -> str:
    """'ok' when the vocabulary loads and tokenizes and detokenizes everything, 'error' for one
    GGToolError; anything else raises."""
    try:
        v = Vocab.from_gguf(path)
        for text in [*TEXTS, "".join(v.tokens[:40])]:
            for special in (False, True):
                ids = v.tokenize(text, add_special=special, parse_special=special)
                assert all(0 <= i < v.n_tokens for i in ids), ids
                v.detokenize(ids, remove_special=special, unparse_special=special)
        v.decode(list(range(v.n_tokens)), special=True)
        v.decode(list(range(v.n_tokens)))
    except GGToolError:
        return "error"
    return "ok"


# -- each lie, named ------------------------------------------------------------------------------------
N_SPM = len(SPM_TOKENS)
LIES = {
    # key at fault: (base, changes, what the one line says)
    "scores shorter": (SPM, {"scores": ("arr", ("f32", [0.0] * (N_SPM - 1)))},
                       f"tokenizer.ggml.scores has {N_SPM - 1} entries for {N_SPM} tokens"),
    "scores longer": (SPM, {"scores": ("arr", ("f32", [0.0] * (N_SPM + 1)))},
                      f"tokenizer.ggml.scores has {N_SPM + 1} entries for {N_SPM} tokens"),
    "scores as strings": (SPM, {"scores": ("arr", ("str", ["1"] * N_SPM))},
                          "tokenizer.ggml.scores is ARRAY[STRING], not an array of FLOAT32 (or INT32)"),
    "scores a scalar": (SPM, {"scores": ("f32", 1.0)}, "tokenizer.ggml.scores is FLOAT32, not an array"),
    "a NaN score": (SPM, {"scores": ("arr", ("f32", [0.0] * 5 + [math.nan] * (N_SPM - 5)))},
                    "tokenizer.ggml.scores[5] is NaN"),
    "token_type shorter": (SPM, {"token_type": ("arr", ("i32", [1] * 4))},
                           f"tokenizer.ggml.token_type has 4 entries for {N_SPM} tokens"),
    "token_type as floats": (SPM, {"token_type": ("arr", ("f32", [1.0] * N_SPM))},
                             "tokenizer.ggml.token_type is ARRAY[FLOAT32], not an array of INT32"),
    "a BYTE token that is no <0xXX>": (SPM, {"token_type": ("arr", ("i32", [2, 3, 3, 1, 1, 1, 6] + [1] * 5 + [6] * 256))},
                                       "tokenizer.ggml.token_type[6] says BYTE, but token 6 'ab' is not <0xXX>"),
    "tokens a string": (SPM, {"tokens": ("str", "abc")}, "tokenizer.ggml.tokens is STRING, not an array of strings"),
    "tokens as integers": (SPM, {"tokens": ("arr", ("i32", list(range(N_SPM))))},
                           "tokenizer.ggml.tokens is ARRAY[INT32], not an array of strings"),
    "no tokens": (SPM, {"tokens": ("arr", ("str", [])), "scores": None, "token_type": None},
                  "tokenizer.ggml.tokens is empty"),
    "a token not UTF-8": (SPM, {"tokens": ("arr", ("str", SPM_TOKENS[:4] + [b"\xff"] + SPM_TOKENS[5:]))},
                          "tokenizer.ggml.tokens[4] is not UTF-8 text (b'\\xff')"),
    "a duplicate token": (SPM, {"tokens": ("arr", ("str", SPM_TOKENS[:5] + ["a"] + SPM_TOKENS[6:]))},
                          "tokenizer.ggml.tokens has 'a' twice (ids 4 and 5)"),
    "bos id outside": (SPM, {"bos_token_id": ("u32", 600)},
                       f"tokenizer.ggml.bos_token_id is 600, outside the vocabulary ({N_SPM} tokens: 0 to {N_SPM - 1})"),
    "eot id a string": (SPM, {"eot_token_id": ("str", "1")},
                        "tokenizer.ggml.eot_token_id is STRING, not an integer (a token id)"),
    "add_bos_token an integer": (SPM, {"add_bos_token": ("u32", 0)}, "tokenizer.ggml.add_bos_token is UINT32, not a BOOL"),
    "model an integer": (SPM, {"model": ("u32", 5)}, "tokenizer.ggml.model is UINT32, not a string"),
    "merges as integers": (BPE, {"merges": ("arr", ("i32", [1, 2]))},
                           'tokenizer.ggml.merges is ARRAY[INT32], not an array of strings ("left right" pairs)'),
    "a merge without a space": (BPE, {"merges": ("arr", ("str", ["ab", "c d"]))},
                                "tokenizer.ggml.merges[0] 'ab' is not a pair \"left right\""),
    "a merge with an empty side": (BPE, {"merges": ("arr", ("str", ["a b", "c "]))},
                                   "tokenizer.ggml.merges[1] 'c ' is not a pair"),
    "a merge of three": (BPE, {"merges": ("arr", ("str", ["a b c"]))}, "tokenizer.ggml.merges[0] 'a b c' is not a pair"),
    "a merge with a newline, two spaces": (BPE, {"merges": ("arr", ("str", ["a b", "a\nb c d"]))},
                                           "tokenizer.ggml.merges[1] 'a\\nb c d' is not a pair"),
    "a merge not UTF-8": (BPE, {"merges": ("arr", ("str", [b"a \xff"]))},
                          "tokenizer.ggml.merges[0] is not UTF-8 text (b'a \\xff')"),
    "merges a string": (BPE, {"merges": ("str", "a b")}, "tokenizer.ggml.merges is STRING, not an array"),
    "no merges": (BPE, {"merges": None}, "tokenizer.ggml.merges is absent: a gpt2 (BPE) vocabulary needs its merges"),
    "eos id outside": (BPE, {"eos_token_id": ("i32", 11)}, "tokenizer.ggml.eos_token_id is 11, outside the vocabulary"),
    "pre an integer": (BPE, {"pre": ("u32", 1)}, "tokenizer.ggml.pre is UINT32, not a string"),
}


@pytest.mark.parametrize("case", list(LIES))
def test_a_lying_vocabulary_is_one_error_naming_the_key(tmp_path, case):
    """Before: an internal TypeError/IndexError/ValueError/AttributeError (scores or token types
    of the wrong type or length, a BYTE token that is no <0xXX>, tokens as integers), or silently
    other ids (merges as integers or not pairs ignored, NaN scores, out-of-range or mistyped
    special ids replaced by defaults, a non-UTF-8 token escaped). Now: one VocabError."""
    base, changes, message = LIES[case]
    p = tmp_path / "vocab.gguf"
    p.write_bytes(vocab_bytes(with_changes(base, **changes)))
    with pytest.raises(VocabError) as e:
        Vocab.from_gguf(p)
    assert message in str(e.value)
    assert str(e.value).startswith(f"{p}: tokenizer.ggml.") and "\n" not in str(e.value)
    assert e.value.key.startswith("tokenizer.ggml.") and e.value.kind == "bad-vocabulary"


def test_the_command_line_says_it_in_one_line(tmp_path, run):
    p = tmp_path / "vocab.gguf"
    p.write_bytes(vocab_bytes(with_changes(BPE, merges=("arr", ("i32", [1, 2])))))
    fails(run("tokenize", "--gguf", p, "ab"), f"Error: {p}: tokenizer.ggml.merges is ARRAY[INT32]")
    fails(run("detokenize", "--gguf", p, "[0]"), "tokenizer.ggml.merges is ARRAY[INT32]")


def test_what_llama_cpp_accepts_still_loads(tmp_path):
    """A special id written as 2**32-1 (-1: "none", as stories260K's padding id), INT32 scores
    (llama.cpp rounds them to float), an empty token (renamed [EMPTY_i])."""
    p = tmp_path / "vocab.gguf"
    p.write_bytes(vocab_bytes(with_changes(SPM, scores=("arr", ("i32", [0] * 3 + [-1, -2, -3, 5] + [0] * (N_SPM - 7))),
                                           unknown_token_id=("i32", -1), seperator_token_id=("u32", 2**32 - 1))))
    v = Vocab.from_gguf(p)
    assert (v.unk_id, v.bos_id) == (0, 1) and v.tokenize("ab") == [1, 3, 6]
    tokens = ["", *BPE_TOKENS[1:]]
    p.write_bytes(vocab_bytes(with_changes(BPE, tokens=("arr", ("str", tokens)))))
    v = Vocab.from_gguf(p)
    assert v.tokens[0] == "[EMPTY_0]" and v.tokenize("bc") == [1, 2]


def test_the_small_vocabularies_tokenize(tmp_path):
    p = tmp_path / "vocab.gguf"
    p.write_bytes(vocab_bytes(SPM))
    v = Vocab.from_gguf(p)
    # ▁▁ beats ▁a (score 0 against -0.25): the run of spaces pairs from the left
    assert v.tokenize("  a", add_special=False) == [8, 7]
    assert v.tokenize("aab", add_special=False) == [7, 6]
    p.write_bytes(vocab_bytes(BPE))
    v = Vocab.from_gguf(p)
    # "a b" (rank 0) first, then "ab c" (3) before "Ġ ab" (4)
    assert v.tokenize(" ab") == [6] and v.tokenize(" abc") == [3, 7]


# -- the fuzz -------------------------------------------------------------------------------------------
_ITEM_TYPES = ("u8", "i32", "u32", "i64", "f32", "f64", "bool", "str")
_HOSTILE_STR = ("", " ", "a b c", "a", "ab", " a", "a ", "<0xZZ>", "<0x41>", SPACE * 40, "x" * 3000, b"\xff\xfe",
                b"a \xc3", "<s>", "\x00")
_HOSTILE_NUM = (math.nan, math.inf, -math.inf, 1e38, -1e38, -1, 0, 3, 4, 6, 7, 255, 2**31 - 1)


def _convert(item: str, values: list, rng: random.Random) -> list:
    """`values` as items of GGUF type `item` (what a writer of the wrong type would have stored)."""
    if item == "str":
        return [str(x) for x in values]
    if item == "bool":
        return [bool(rng.getrandbits(1)) for _ in values]
    if item in ("f32", "f64"):
        return [float(rng.choice([0, -1, 2.5, *([x] if isinstance(x, (int, float)) else [])])) for x in values]
    lo, hi = {"u8": (0, 255), "i32": (-2**31, 2**31 - 1), "u32": (0, 2**32 - 1), "i64": (-2**63, 2**63 - 1)}[item]
    return [rng.choice([0, 1, lo, hi, rng.randint(lo, hi)]) for _ in values]


def _mutate(base: dict, rng: random.Random) -> tuple[str, dict]:
    d = dict(base)
    keys = [*d, K + "bos_token_id", K + "eos_token_id", K + "unknown_token_id", K + "eot_token_id",
            K + "add_bos_token", K + "add_space_prefix", K + "merges", K + "pre"]
    key = rng.choice(keys)
    t, v = d.get(key, ("u32", 0))
    n = len(base[K + "tokens"][1][1]) if base.get(K + "tokens", ("",))[0] == "arr" else 7
    op = rng.choice(["drop", "retype", "resize", "item", "item", "item", "shuffle", "scalar"])
    if op == "drop":
        d.pop(key, None)
        return f"{key} dropped", d
    if op == "scalar" or t != "arr":
        vt = rng.choice(["u32", "i32", "u64", "f32", "bool", "str", "u8"])
        val = {"u32": rng.choice([0, 1, n - 1, n, n + 1, 2**32 - 1, 2**31]), "i32": rng.choice([-1, -2, 0, 3]),
               "u64": rng.choice([2**64 - 1, 5]), "f32": rng.choice([1.0, math.nan]), "bool": True,
               "str": rng.choice(["llama", "gpt2", "qwen2", "smollm", "default", "bert", "", "x y"]), "u8": 1}[vt]
        d[key] = (vt, val)
        return f"{key} = {vt} {val!r}", d
    item, items = v
    items = list(items)
    if op == "retype":
        new = rng.choice([x for x in _ITEM_TYPES if x != item])
        d[key] = ("arr", (new, _convert(new, items, rng)))
        return f"{key} as ARRAY[{new}]", d
    if op == "resize":
        k = rng.choice([0, 1, len(items) - 1, len(items) + 1, 2 * len(items)])
        items = (items * 3)[:k]
        d[key] = ("arr", (item, items))
        return f"{key} of {k} items", d
    if op == "shuffle":
        rng.shuffle(items)
        d[key] = ("arr", (item, items))
        return f"{key} shuffled", d
    if not items:
        items = [0 if item != "str" else "a"]
    at = rng.randrange(len(items))
    if item == "str":
        new = rng.choice([*_HOSTILE_STR, items[rng.randrange(len(items))]])
    elif item in ("f32", "f64"):
        new = float(rng.choice(_HOSTILE_NUM))
    else:
        new = int(rng.choice([x for x in _HOSTILE_NUM if isinstance(x, int)]))
    items[at] = new
    d[key] = ("arr", (item, items))
    return f"{key}[{at}] = {new!r:.40}", d


def mutants(seed: int = SEED, count: int = 300):
    """(label, GGUF bytes) of `count` mutants of each small vocabulary, one to three mutations each."""
    rng = random.Random(seed)
    for name, base in (("spm", SPM), ("bpe", BPE)):
        for _ in range(count):
            d, labels = base, []
            for _ in range(rng.choice([1, 1, 1, 2, 3])):
                label, d = _mutate(d, rng)
                labels.append(label)
            yield f"{name}: {'; '.join(labels)}", vocab_bytes(d)


def run_fuzz(tmp: Path, seed: int = SEED, on_cli=None) -> Counter:
    counts: Counter = Counter()
    path = tmp / "vocab.gguf"
    for i, (label, data) in enumerate(mutants(seed)):
        path.write_bytes(data)
        try:
            counts[exercise(path)] += 1
        except Exception as e:  # noqa: BLE001 - the point: nothing but GGToolError escapes
            raise AssertionError(f"mutant '{label}': {type(e).__name__}: {e}") from e
        if on_cli is not None and i % 15 == 0:
            on_cli(path, label)
    return counts


def test_vocabulary_mutants_give_ids_or_one_clean_error(tmp_path, run):
    def cli(path, label):
        r = run("tokenize", "--gguf", path, "ab a <s>")
        assert "Traceback" not in r.stderr, label
        if r.exit_code:
            fails(r)
        else:
            ok(r)

    counts = run_fuzz(tmp_path, on_cli=cli)
    assert sum(counts.values()) == 600 and counts["ok"] >= 100 and counts["error"] >= 200, counts


if __name__ == "__main__":
    import tempfile
    import time

    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as d:
        c = run_fuzz(Path(d), int(sys.argv[1]) if len(sys.argv) > 1 else SEED)
    print(f"{sum(c.values())} mutants: {c['ok']} ok, {c['error']} clean errors, 0 bad "
          f"({time.perf_counter() - t0:.1f} s)")
