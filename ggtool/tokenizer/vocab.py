"""A GGUF model's vocabulary, tokenized and detokenized exactly as llama.cpp's llama-vocab.cpp does.

`Vocab.from_gguf(path)` reads the `tokenizer.*` metadata as llama_vocab::impl::load does (defaults
included), `tokenize` is llama_tokenize (add_special, parse_special), `token_to_piece` is
llama_token_to_piece, `detokenize` is llama_detokenize (remove_special, unparse_special) and `decode`
is llama-cpp-python's Llama.detokenize (what the golden file records).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from ggtool.errors import GGToolError, InputError

from .bpe import BPE, BYTE_TO_CHAR, decode_text
from .pretokenize import PRE_TOKENIZERS, PreTokenizer, Splitter
from .spm import ESCAPED_SPACE, SPM

# llama_token_attr bits, and tokenizer.ggml.token_type values -> attr (llama_token_type order)
UNDEFINED, UNKNOWN, UNUSED, NORMAL, CONTROL, USER_DEFINED, BYTE = 0, 1, 2, 4, 8, 16, 32
LSTRIP, RSTRIP = 128, 256
TYPE_TO_ATTR = (UNDEFINED, NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE)

MODELS = ("llama", "gpt2")   # tokenizer.ggml.model values this package implements

# token texts llama.cpp marks CONTROL (end of generation, FIM) whatever their type says
_EOT_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>", "<EOT>",
              "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>", "<end_of_utterance>")
_FIM_TEXTS = {
    "fim_pre": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>",
                "<|code_prefix|>", "<|prefix|>"),
    "fim_suf": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>",
                "<|code_suffix|>", "<|suffix|>"),
    "fim_mid": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>",
                "<|code_middle|>", "<|middle|>"),
    "fim_pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    "fim_rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "fim_sep": ("<|file_sep|>",),
    "eom": ("<|eom_id|>",),
    "eot": _EOT_TEXTS,
}
_EOG_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
              "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
              "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
              "<｜end▁of▁sentence｜>", "[e~[")


class VocabError(GGToolError):
    """A vocabulary llama.cpp would refuse (or one that lies about itself), or a token id outside
    it. `path` names the file, `key` the metadata key at fault (None for an id outside it)."""

    kind = "bad-vocabulary"

    def __init__(self, message: str, path: str | None = None, key: str | None = None):
        self.path, self.key, self.message = path, key, message
        super().__init__(f"{path}: {message}" if path else message)


@dataclass
class _Meta:
    """The tokenizer.* keys of a GGUF file, as plain Python values, their types checked."""

    model: str
    pre: str | None
    tokens: list[str]
    scores: list[float] | None
    types: list[int] | None
    merges: list[str] | None
    keys: dict


KEY = "tokenizer.ggml."
# the *_token_id keys llama.cpp reads (llama_vocab::impl::load's special_token_types)
SPECIAL_ID_KEYS = tuple(f"{w}_token_id" for w in (
    "bos", "eos", "eot", "eom", "unknown", "seperator", "padding", "mask",
    "fim_pre", "fim_suf", "fim_mid", "fim_pad", "fim_rep", "fim_sep", "prefix", "suffix", "middle"))
BOOL_KEYS = ("add_bos_token", "add_eos_token", "add_sep_token", "add_space_prefix")
NO_TOKEN = (-1, 2**32 - 1, 2**64 - 1)   # a special id written for "none" (llama.cpp: the default id)
_INTS = ("UINT8", "INT8", "UINT16", "INT16", "UINT32", "INT32", "UINT64", "INT64")
_BYTE_TOKEN = re.compile("<0x[0-9A-Fa-f]{2}>")


def _read_meta(path: str) -> _Meta:
    """The tokenizer.* metadata, refused (one VocabError naming the key) where it lies: a key of
    the wrong type, arrays whose lengths disagree, a token or merge that is not UTF-8 text, a merge
    that is not a pair, a NaN score, a special id outside the vocabulary, an empty vocabulary.
    Duplicate tokens are refused by Vocab."""
    from ggtool.gguf_io import open_gguf
    from ggtool.gguf_io.format import EscapedText

    g = open_gguf(path)
    present = set(g.keys())

    def fail(key: str, message: str):
        raise VocabError(f"{KEY}{key} {message}", path, KEY + key)

    def typed(key: str, want: tuple[str, ...], what: str):
        """The value of tokenizer.ggml.KEY if its GGUF type is one of `want`, None if absent."""
        if KEY + key not in present:
            return None
        t = g.value_type(KEY + key)
        if t not in want and not (g.array_len(KEY + key) == 0 and t.startswith("ARRAY")):
            fail(key, f"is {t}, not {what}")
        return g.metadata(KEY + key)

    def not_text(key: str, items: list) -> None:
        if EscapedText in set(map(type, items)):
            bad = next(i for i, t in enumerate(items) if isinstance(t, EscapedText))
            fail(f"{key}[{bad}]", f"is not UTF-8 text ({items[bad].raw!r})")

    model = typed("model", ("STRING",), "a string")
    if model is None:
        raise VocabError(f"no vocabulary ({KEY}model is absent)", path, KEY + "model")
    pre = typed("pre", ("STRING",), "a string")
    tokens = typed("tokens", ("ARRAY[STRING]",), "an array of strings")
    if tokens is None:
        raise VocabError(f"no vocabulary ({KEY}tokens is absent)", path, KEY + "tokens")
    n = len(tokens)
    if n == 0:
        fail("tokens", "is empty: a vocabulary needs at least one token")
    not_text("tokens", tokens)

    def one_per_token(key: str, values: list | None) -> None:
        if values is not None and len(values) != n:
            fail(key, f"has {len(values)} entries for {n} tokens ({KEY}tokens): one per token")

    scores = typed("scores", ("ARRAY[FLOAT32]", "ARRAY[INT32]"), "an array of FLOAT32 (or INT32)")
    one_per_token("scores", scores)
    if scores is not None:
        arr = np.asarray(scores, np.float32)   # as llama.cpp holds them (INT32 ones rounded to float)
        nan = np.flatnonzero(np.isnan(arr))
        if nan.size:
            fail(f"scores[{nan[0]}]", "is NaN: scores order the merges")
        scores = arr.tolist()
    types = typed("token_type", ("ARRAY[INT32]",), "an array of INT32")
    one_per_token("token_type", types)
    merges = typed("merges", ("ARRAY[STRING]",), 'an array of strings ("left right" pairs)')
    if merges is not None:
        not_text("merges", merges)
        bad = _first_not_a_pair(merges)
        if bad is not None:
            fail(f"merges[{bad}]", f"{merges[bad]!r} is not a pair \"left right\" (two non-empty parts, one space)")

    keys = {}
    for k in sorted(present):
        short = k[len(KEY):]
        if not k.startswith(KEY) or g.array_len(k) is not None:
            continue
        if short in SPECIAL_ID_KEYS:
            v = typed(short, _INTS, "an integer (a token id)")
            if v not in NO_TOKEN and not 0 <= v < n:
                fail(short, f"is {v}, outside the vocabulary ({n} tokens: 0 to {n - 1})")
        elif short in BOOL_KEYS:
            v = typed(short, ("BOOL",), "a BOOL")
        else:
            v = g.metadata(k)
        keys[short] = v
    return _Meta(model, pre, tokens, scores, types, merges, keys)


_NOT_A_PAIR = re.compile(r"^(?![^ \n]+ [^ \n]+$)", re.M)


def _first_not_a_pair(merges: list[str]) -> int | None:
    """The index of the first merge that is not "left right" (two non-empty parts, one space),
    or None: one regex over the merges joined by newlines (a merge holding one: item by item)."""
    joined = "\n".join(merges)
    if joined.count("\n") == len(merges) - 1:
        m = _NOT_A_PAIR.search(joined) if merges else None
        return None if m is None else joined.count("\n", 0, m.start())
    return next((i for i, x in enumerate(merges) if x.count(" ") != 1 or x[0] == " " or x[-1] == " "), None)


class Vocab:
    """One model's tokenizer. Build it with `Vocab.from_gguf(path)`."""

    def __init__(self, meta: _Meta, path: str | None = None):
        self.path = path
        self.model = meta.model
        if meta.model not in MODELS:
            raise VocabError(f"{KEY}model '{meta.model}' is not supported "
                             f"(supported: {', '.join(MODELS)})", path, KEY + "model")
        kv = meta.keys
        self.is_spm = meta.model == "llama"
        self.pre: PreTokenizer | None = None
        if self.is_spm:
            bos, eos, unk = 1, 2, 0
            self.add_space_prefix, self.clean_spaces, add_bos = True, False, True
        else:
            if meta.merges is None:
                raise VocabError(f"{KEY}merges is absent: a gpt2 (BPE) vocabulary needs its merges", path,
                                 KEY + "merges")
            name = meta.pre or "default"   # llama.cpp: missing pre-tokenizer type, using 'default'
            self.pre = PRE_TOKENIZERS.get(name)
            if self.pre is None:
                raise VocabError(f"{KEY}pre '{name}' is not supported (supported: "
                                 f"{', '.join(sorted(PRE_TOKENIZERS))})", path, KEY + "pre")
            bos, eos, unk = 11, 11, -1
            self.add_space_prefix, self.clean_spaces, add_bos = False, self.pre.clean_spaces, self.pre.add_bos
        self.add_space_prefix = bool(kv.get("add_space_prefix", self.add_space_prefix))
        add_eos = False

        tokens = list(meta.tokens)
        n = len(tokens)
        self.token_to_id = dict(zip(tokens, range(n)))
        if "" in self.token_to_id:   # llama.cpp renames empty tokens
            tokens = [t or f"[EMPTY_{i}]" for i, t in enumerate(tokens)]
            self.token_to_id = dict(zip(tokens, range(n)))
        self.tokens = tokens
        if len(self.token_to_id) != n:
            seen: dict[str, int] = {}
            for i, t in enumerate(tokens):
                if t in seen:
                    raise VocabError(f"{KEY}tokens has {t!r} twice (ids {seen[t]} and {i}): llama.cpp refuses "
                                     "a vocabulary with duplicates", path, KEY + "tokens")
                seen[t] = i
        self.scores = meta.scores if meta.scores is not None else [0.0] * n
        if meta.types is not None:
            types = np.asarray(meta.types, np.int64)
            known = (types >= 0) & (types < len(TYPE_TO_ATTR))
            self.attrs = np.asarray(TYPE_TO_ATTR)[np.where(known, types, 0)].tolist()
            for i in np.flatnonzero(types == TYPE_TO_ATTR.index(BYTE)).tolist():
                if not _BYTE_TOKEN.fullmatch(tokens[i]):
                    raise VocabError(f"{KEY}token_type[{i}] says BYTE, but token {i} {tokens[i]!r} is not <0xXX>",
                                     path, KEY + "token_type")
        else:
            self.attrs = [NORMAL] * n

        def special(key: str, default: int) -> int:
            v = kv.get(key)
            if default >= n:
                default = -1
            return v if v is not None and v not in NO_TOKEN else default

        self.bos_id = special("bos_token_id", bos)
        self.eos_id = special("eos_token_id", eos)
        self.unk_id = special("unknown_token_id", unk)
        self.add_bos = bool(kv.get("add_bos_token", add_bos))
        self.add_eos = bool(kv.get("add_eos_token", add_eos))
        for flag, tid, key in ((self.add_bos, self.bos_id, "bos"), (self.add_eos, self.eos_id, "eos")):
            if flag and tid < 0:
                raise VocabError(f"{KEY}add_{key}_token is true, but {KEY}{key}_token_id is not set", path,
                                 f"{KEY}{key}_token_id")
        self._mark_control_tokens(kv)

        # llama.cpp's cache_special_tokens: longest text first
        special = np.flatnonzero(np.asarray(self.attrs) & (CONTROL | USER_DEFINED | UNKNOWN)).tolist()
        self.special_ids = sorted(special, key=lambda i: -len(self.tokens[i].encode("utf-8", "surrogatepass")))
        self._pieces: dict[int, bytes] = {}
        self._merges = meta.merges

    # the tokenizers' tables, made on the first tokenize (detokenizing needs none of them)
    @cached_property
    def _spm(self) -> SPM:
        return SPM(self.tokens, self.scores, self.token_to_id, self.byte_to_token)

    @cached_property
    def _bpe(self) -> BPE:
        return BPE(self.token_to_id, self._merges, self.pre.ignore_merges)

    @cached_property
    def _splitter(self) -> Splitter:
        return Splitter(self.pre.regexes)

    @classmethod
    def from_gguf(cls, path: str | os.PathLike) -> Vocab:
        """The vocabulary of a GGUF model (a tensor-free vocab-*.gguf will do)."""
        p = os.fspath(path)
        return cls(_read_meta(p), p)

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)

    # -- load-time fix-ups, as llama.cpp makes them ------------------------------------------------
    def _mark_control_tokens(self, kv: dict) -> None:
        """End-of-generation and FIM tokens found by their text become CONTROL; a few gpt-oss tokens
        USER_DEFINED (llama_vocab::impl::load)."""
        ids = self.token_to_id
        attrs = self.attrs
        for what, texts in _FIM_TEXTS.items():
            if kv.get(f"{what}_token_id", NO_TOKEN[0]) not in NO_TOKEN:
                continue
            for t in texts:   # llama.cpp takes the first it meets; the lists rarely match twice
                if t in ids:
                    attrs[ids[t]] |= CONTROL
                    break
        eog = {ids[t] for t in _EOG_TEXTS if t in ids}
        # llama_vocab_is_eog: what ends a generation (EOS, and the end-of-turn markers)
        self.eog_ids = frozenset(eog | ({self.eos_id} if self.eos_id >= 0 else set()))
        for i in eog:
            attrs[i] |= CONTROL
        for t in ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"):
            if t in ids:
                attrs[ids[t]] = USER_DEFINED
        texts = {self.tokens[i] for i in eog}
        if "<|end|>" in texts and ({"<|return|>", "<|call|>"} <= texts or {"<|calls|>", "<|flush|>"} <= texts):
            attrs[ids["<|end|>"]] = USER_DEFINED
        if "<|tool_response>" in texts and "</s>" in texts:
            attrs[ids["</s>"]] = NORMAL

    # -- tokenize -----------------------------------------------------------------------------------
    def _partition(self, text: str, parse_special: bool) -> list:
        """tokenizer_st_partition: the text cut at special tokens' texts, longest first; a fragment
        is a str (raw text) or an int (a token). Without parse_special only USER_DEFINED tokens cut."""
        frags: list = [text]
        for tid in self.special_ids:
            attr = self.attrs[tid]
            if not parse_special and attr & (CONTROL | UNKNOWN):
                continue
            t = self.tokens[tid]
            if t not in text:
                continue
            new: list = []
            for f in frags:
                if type(f) is int or t not in f:
                    new.append(f)
                    continue
                parts = f.split(t)
                for k, part in enumerate(parts):
                    if k:
                        new.append(tid)
                    if part:
                        new.append(part)
            frags = new
        return frags

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        """llama_tokenize: the token ids of `text`, which must be Unicode text: a lone surrogate (what
        Python makes of bytes that are not UTF-8, e.g. in argv) is refused, not tokenized as the
        bytes of U+DCxx."""
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise InputError(f"the text is not UTF-8: character {e.start} is U+{ord(text[e.start]):04X}, "
                             "a lone surrogate (bytes that were not UTF-8?)", kind="not-utf8") from None
        frags = self._partition(text, parse_special) if text else []
        out: list[int] = []
        if add_special and self.add_bos:
            out.append(self.bos_id)
        if self.is_spm:
            prev_special = True
            for f in frags:
                if type(f) is int:
                    out.append(f)
                    prev_special = True
                    continue
                if self.add_space_prefix and prev_special:
                    f = " " + f
                self._spm.tokenize(f, out)
                prev_special = False
        else:
            word = self._bpe.word
            pieces = self._splitter.pieces
            for f in frags:
                if type(f) is int:
                    out.append(f)
                else:
                    for w in pieces(f):
                        out.extend(word(w))
        if add_special and self.add_eos:
            out.append(self.eos_id)
        return out

    def byte_to_token(self, b: int) -> int:
        """llama_vocab::byte_to_token: the `<0xXX>` token of a byte (SentencePiece byte fallback)."""
        if self.is_spm:
            tid = self.token_to_id.get(f"<0x{b:02X}>")
            if tid is None and b < 0x80:
                tid = self.token_to_id.get(chr(b))
        else:
            tid = self.token_to_id.get(BYTE_TO_CHAR[b])
        if tid is None:
            raise VocabError(f"the vocabulary has no token for byte 0x{b:02X}", self.path)
        return tid

    # -- detokenize ---------------------------------------------------------------------------------
    def check_id(self, tid: int) -> None:
        if not 0 <= tid < len(self.tokens):
            raise VocabError(f"token id {tid} is outside the vocabulary ({len(self.tokens)} tokens: 0 to "
                             f"{len(self.tokens) - 1})", self.path)

    def token_to_piece(self, tid: int, special: bool = False, lstrip: int = 0) -> bytes:
        """llama_token_to_piece: the bytes token `tid` stands for (a CONTROL or UNKNOWN token is
        empty unless `special`); `lstrip` leading spaces dropped."""
        self.check_id(tid)
        attr = self.attrs[tid]
        if not special and attr & (UNKNOWN | CONTROL):
            return b""
        piece = self._pieces.get(tid)
        if piece is None:
            piece = self._pieces[tid] = self._piece(tid)
        while lstrip > 0 and piece[:1] == b" ":
            piece, lstrip = piece[1:], lstrip - 1
        return piece

    def _piece(self, tid: int) -> bytes:
        text, attr = self.tokens[tid], self.attrs[tid]
        if attr & (UNKNOWN | CONTROL | USER_DEFINED):
            return text.encode("utf-8", "surrogatepass")
        if attr & NORMAL:
            if self.is_spm:
                return text.replace(ESCAPED_SPACE, " ").encode("utf-8", "surrogatepass")
            return decode_text(text)
        if attr & BYTE:
            return bytes([int(text[3:5], 16)])
        return b""

    def detokenize(self, ids: list[int], remove_special: bool = False, unparse_special: bool = False) -> str:
        """llama_detokenize: the text of `ids` (invalid UTF-8 replaced)."""
        ids = list(ids)
        for t in ids:
            self.check_id(t)
        remove_space = self.add_space_prefix
        if remove_special and self.add_bos and ids and ids[0] == self.bos_id:
            remove_space = False
            ids = ids[1:]
        if remove_special and self.add_eos and ids and ids[-1] == self.eos_id:
            ids = ids[:-1]
        parts = []
        for t in ids:
            parts.append(self.token_to_piece(t, unparse_special, int(remove_space)))
            remove_space = False
        raw = b"".join(parts)
        if self.clean_spaces:
            raw = _clean_spaces(raw)
        return raw.decode("utf-8", "replace")

    def decode(self, ids: list[int], special: bool = False) -> str:
        """llama-cpp-python's Llama.detokenize: each id's piece (lstrip 0), concatenated, one leading
        space dropped when the first id is BOS."""
        raw = b"".join(self.token_to_piece(t, special) for t in ids)
        if ids and ids[0] == self.bos_id and raw[:1] == b" ":
            raw = raw[1:]
        return raw.decode("utf-8", "replace")


def _clean_spaces(text: bytes) -> bytes:
    """llama_detokenize's three clean-up passes (BPE vocabularies whose pre-tokenizer asks for it)."""
    t = bytearray(text)
    # " ?", " !", " .", " ,": the space goes
    out = bytearray(t[:1])
    for i in range(1, len(t)):
        if t[i - 1] == 0x20 and t[i] in b"?!.,":
            out.pop()
        out.append(t[i])
    t = out
    # " ' ": both spaces go
    out = bytearray(t[:1])
    i = 1
    while i < len(t):
        x = t[i]
        if x == 0x27 and i + 1 < len(t) and t[i - 1] == 0x20 and t[i + 1] == 0x20:
            out.pop()
            out.append(x)
            i += 2   # the space after it is skipped
            continue
        out.append(x)
        i += 1
    t = out
    # " 's", " 'm", " 're", " 've": the space goes
    out = bytearray(t[:1])
    n = len(t)
    for i in range(1, n):
        x = t[i]
        if t[i - 1] == 0x20 and x == 0x27 and i + 1 < n:
            x1 = t[i + 1]
            if x1 in b"sm" or (i + 2 < n and bytes(t[i + 1:i + 3]) in (b"re", b"ve")):
                out.pop()
        out.append(x)
    return bytes(out)
