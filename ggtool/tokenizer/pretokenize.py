"""BPE pre-tokenization as llama.cpp's unicode_regex_split does it.

llama.cpp runs each of a pre-tokenizer's regexes over the spans the previous one left, either with a
hand-written matcher (the gpt2 and llama3 patterns) or with std::regex over a "collapsed" text: every
code point >= 128 replaced by one byte standing for its Unicode category (letter 0xD2, number 0xD1,
punctuation 0xD3, mark 0xD4, symbol 0xD5, anything else 0xD0; whitespace 0x0B), and every `\\p{..}`
in the pattern by that byte plus the category's ASCII members. Its `\\s` is then ASCII whitespace
only. Here every pattern goes the collapsed way, through Python's `re` in ASCII mode: the hand-written
matchers give the same splits as their regex over the collapsed text (they test the same flags:
letter, number, whitespace), so one mechanism serves all. The categories come from the `regex`
package's Unicode tables (a fixed Unicode version whatever the Python), the whitespace set is
llama.cpp's (the White_Space property).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

import regex

# -- the patterns, as llama.cpp's llm_tokenizer_bpe spells them ------------------------------------
GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
LLAMA3 = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
          r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2 = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
         r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
PUNCT_RUN = r"[\p{P}\$\+<=>\^~\|]+"


@dataclass(frozen=True)
class PreTokenizer:
    """What `tokenizer.ggml.pre` selects in llama.cpp's vocab loader (BPE vocabularies only)."""

    name: str
    regexes: tuple[str, ...]
    clean_spaces: bool = True     # llama_detokenize's clean-up of " ." " 's" ...
    ignore_merges: bool = False   # a pre-token that is itself a token is taken whole
    add_bos: bool = False         # the default when tokenizer.ggml.add_bos_token is absent


_DEFAULT = ("default", (PUNCT_RUN, GPT2, r"\p{N}+", "[0-9][0-9][0-9]"))
_GROUPS = [
    # (names, regexes, clean_spaces, ignore_merges, add_bos): llama_vocab::impl::load's table
    (("default",), _DEFAULT[1], True, False, False),
    (("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2", "jina-v5-nano"),
     (LLAMA3,), True, True, True),
    (("dbrx", "smaug-bpe"), (LLAMA3,), True, False, False),
    (("falcon",), (PUNCT_RUN, GPT2, "[0-9][0-9][0-9]"), True, False, False),
    (("gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de", "a.x-4.0", "mellum",
      "modern-bert", "exaone4", "mpt", "olmo", "jais"), (GPT2,), True, False, False),
    (("trillion", "granite-docling"), (GPT2,), False, False, False),
    (("starcoder", "refact", "codeshell", "exaone", "minerva-7b", "mellum2"), (r"\p{N}", GPT2), True, False, False),
    (("smollm", "command-r"), (r"\p{N}", GPT2), False, False, False),
    (("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "hunyuan", "solar-open"), (QWEN2,), False, False, False),
    (("stablelm2", "megrez"), (QWEN2,), True, False, False),
]
PRE_TOKENIZERS: dict[str, PreTokenizer] = {
    n: PreTokenizer(n, rx, clean, ignore, bos) for names, rx, clean, ignore, bos in _GROUPS for n in names}


# -- code point classes ------------------------------------------------------------------------------
_WHITESPACE = frozenset([*range(0x09, 0x0E), 0x20, 0x85, 0xA0, 0x1680, *range(0x2000, 0x200B), 0x2028, 0x2029,
                         0x202F, 0x205F, 0x3000])
_CATEGORY = regex.compile(r"(\p{N})|(\p{L})|(\p{P})|(\p{M})|(\p{S})")
_COLLAPSED_BY_GROUP = {1: "\xd1", 2: "\xd2", 3: "\xd3", 4: "\xd4", 5: "\xd5"}
_UCAT = {"N": ("\xd1", "0-9"), "L": ("\xd2", "A-Za-z"), "P": ("\xd3", r"!-#%-*,-/:-;?-@\[-\]_\{\}"),
         "M": ("\xd4", ""), "S": ("\xd5", r"\$\+<->^`\|")}
_UCAT_NAMES = {"N": "N", "L": "L", "P": "P", "M": "M", "S": "S", "Lu": "L", "Ll": "L", "Lt": "L", "Lm": "L", "Lo": "L"}


class _Collapse(dict):
    """str.translate table: a non-ASCII character -> its category byte (filled as characters come)."""

    def __init__(self):
        super().__init__((cp, cp) for cp in range(128))   # ASCII stays itself

    def __missing__(self, cp: int) -> str:
        if cp in _WHITESPACE:
            c = "\x0b"
        else:
            m = _CATEGORY.match(chr(cp))
            c = _COLLAPSED_BY_GROUP[m.lastindex] if m else "\xd0"
        self[cp] = c
        return c


_COLLAPSE = _Collapse()


def collapse(text: str) -> str:
    """The text as llama.cpp's regexes see it: one character per code point, ASCII kept."""
    return text if text.isascii() else text.translate(_COLLAPSE)


def collapse_regex(expr: str) -> str:
    """llama.cpp's rewrite of a pattern for the collapsed text: each \\p{X} becomes its category byte
    and the category's ASCII members (inside a [...] or as one)."""
    out, inside, i = [], False, 0
    while i < len(expr):
        c = expr[i]
        if c == "[" and (i == 0 or expr[i - 1] != "\\"):
            out.append("[")
            inside = True
        elif inside and c == "]" and expr[i - 1] != "\\":
            out.append("]")
            inside = False
        elif expr.startswith("\\p{", i) and (j := expr.find("}", i + 3)) != -1 and expr[i + 3:j] in _UCAT_NAMES:
            byte, members = _UCAT[_UCAT_NAMES[expr[i + 3:j]]]
            out.append(byte + members if inside else f"[{byte}{members}]")
            i = j
        else:
            out.append(c)
        i += 1
    return "".join(out)


def _whitespace_only(text: str) -> str:
    """For a pattern without \\p{..} llama.cpp uses std::wregex on the code points, non-ASCII
    whitespace as 0x0B."""
    return text if text.isascii() else text.translate(_WIDE_WHITESPACE)


_WIDE_WHITESPACE = {cp: "\x0b" for cp in _WHITESPACE if cp > 0x7F}


class Splitter:
    """A pre-tokenizer's regexes, compiled: split(text) -> the pre-tokens (str pieces of text)."""

    def __init__(self, regexes: tuple[str, ...]):
        self.steps = []
        for expr in regexes:
            uses_categories = any(f"\\p{{{n}}}" in expr for n in _UCAT_NAMES)
            pattern = collapse_regex(expr) if uses_categories else expr
            self.steps.append((re.compile(pattern, re.ASCII), uses_categories))

    def split(self, text: str) -> list[str]:
        return list(self.pieces(text))

    def pieces(self, text: str) -> Iterator[str]:
        """The pre-tokens of `text`, one at a time: each regex runs over the spans the one before
        left, lazily, so no list of every piece of a long text is made."""
        if not text:
            return
        subjects: dict[bool, str] = {}

        def subject(uses_categories: bool) -> str:
            s = subjects.get(uses_categories)
            if s is None:
                s = subjects[uses_categories] = collapse(text) if uses_categories else _whitespace_only(text)
            return s

        spans: Iterator[tuple[int, int]] = iter(((0, len(text)),))
        for pattern, uses_categories in self.steps:
            spans = _cut(pattern, subject(uses_categories), spans)
        for a, b in spans:
            yield text[a:b]


def _cut(pattern: re.Pattern, subject: str, spans: Iterator[tuple[int, int]]) -> Iterator[tuple[int, int]]:
    """Each span cut where `pattern`'s matches in it start and end (the text between matches is a
    span of its own, as llama.cpp keeps it)."""
    for a, b in spans:
        at = a
        for m in pattern.finditer(subject, a, b):
            s, e = m.span()
            if s > at:
                yield at, s
                at = s
            if e > at:
                yield at, e
                at = e
        if b > at:
            yield at, b
