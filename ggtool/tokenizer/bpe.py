"""llama.cpp's byte-level BPE (llm_tokenizer_bpe_session): merge ranks over GPT-2's byte alphabet.

Each pre-token is encoded as GPT-2's printable byte characters, split into characters, and the
adjacent pair of lowest merge rank (ties: the leftmost) merges until none is left, which is what
llama.cpp's priority queue of bigrams does. A final symbol that is no token falls back to its single
bytes that are tokens. The result depends on the pre-token alone, so it is cached per pre-token.
"""

from __future__ import annotations


def _byte_alphabet() -> list[str]:
    """GPT-2's bytes_to_unicode (llama.cpp's unicode_byte_to_utf8_map): byte -> printable char."""
    keep = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table, n = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + n)
            n += 1
    return [table[b] for b in range(256)]


BYTE_TO_CHAR = _byte_alphabet()
CHAR_TO_BYTE = {c: b for b, c in enumerate(BYTE_TO_CHAR)}
_LATIN1_TO_ALPHABET = {b: c for b, c in enumerate(BYTE_TO_CHAR)}


def byte_encode(word: str) -> str:
    """A pre-token's UTF-8 bytes as GPT-2's byte characters."""
    return word.encode("utf-8", "surrogatepass").decode("latin-1").translate(_LATIN1_TO_ALPHABET)


def decode_text(text: str) -> bytes:
    """llama_decode_text: a token's byte characters back to bytes (an unknown one as llama.cpp
    writes it, `[UNK_BYTE_0x..<token>]`)."""
    out = bytearray()
    for c in text:
        b = CHAR_TO_BYTE.get(c)
        if b is not None:
            out.append(b)
        else:
            out += b"[UNK_BYTE_0x" + c.encode("utf-8").hex().encode() + text.encode("utf-8") + b"]"
    return bytes(out)


class BPE:
    """Merges and the cache of pre-token -> ids for one vocabulary."""

    def __init__(self, token_to_id: dict[str, int], merges: list[str], ignore_merges: bool):
        self.token_to_id = token_to_id
        # llama.cpp keeps the first rank of a merge listed twice
        n = len(merges)
        self.ranks = dict(zip(reversed(merges), range(n - 1, -1, -1)))
        self.ignore_merges = ignore_merges
        self.cache: dict[str, list[int]] = {}

    def word(self, word: str) -> list[int]:
        ids = self.cache.get(word)
        if ids is None:
            ids = self.cache[word] = self._word(byte_encode(word))
        return ids

    def _word(self, enc: str) -> list[int]:
        get = self.token_to_id.get
        if self.ignore_merges:
            tok = get(enc)
            if tok is not None:
                return [tok]
        syms = list(enc)
        ranks = self.ranks
        while len(syms) > 1:
            best, at = None, -1
            for i in range(len(syms) - 1):
                r = ranks.get(syms[i] + " " + syms[i + 1])
                if r is not None and (best is None or r < best):
                    best, at = r, i
            if best is None:
                break
            syms[at:at + 2] = [syms[at] + syms[at + 1]]
        out = []
        for s in syms:
            tok = get(s)
            if tok is not None:
                out.append(tok)
            else:   # llama.cpp looks each byte of the symbol up as a one-byte token
                out.extend(t for b in s.encode("utf-8") if b < 0x80 and (t := get(chr(b))) is not None)
        return out
