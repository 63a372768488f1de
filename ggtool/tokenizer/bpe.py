"""llama.cpp's byte-level BPE (llm_tokenizer_bpe_session): merge ranks over GPT-2's byte alphabet.

Each pre-token is encoded as GPT-2's printable byte characters, split into characters, and the
adjacent pair of lowest merge rank (ties: the leftmost) merges until none is left, through
llama.cpp's priority queue of bigrams (linear in practice: a run of 100,000 letters is one
pre-token). A final symbol that is no token falls back to its single bytes that are tokens. The
result depends on the pre-token alone, so short pre-tokens' ids are cached (a bounded cache).
"""

from __future__ import annotations

import heapq
from array import array

LONG = 1 << 14   # a pre-token longer than this is merged in 4-byte arrays


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
    """Merge ranks and a bounded cache of pre-token -> ids for one vocabulary. `merges` are
    "left right" strings in rank order, already checked (Vocab): one space, never inside a symbol
    (GPT-2's byte characters have none), so the string is the pair's key."""

    CACHE_WORDS = 1 << 16   # pre-tokens remembered (then forgotten all at once)
    CACHE_CHARS = 64        # longer pre-tokens are not remembered

    def __init__(self, token_to_id: dict[str, int], merges: list[str], ignore_merges: bool):
        self.token_to_id = token_to_id
        # llama.cpp keeps the first rank of a merge listed twice
        n = len(merges)
        self.ranks = dict(zip(reversed(merges), range(n - 1, -1, -1)))
        self.longest = max(map(len, merges), default=3) - 1   # characters in the longest merged pair
        self.ignore_merges = ignore_merges
        self.cache: dict[str, list[int]] = {}

    def word(self, word: str) -> list[int]:
        ids = self.cache.get(word)
        if ids is None:
            ids = self._word(byte_encode(word))
            if len(word) <= self.CACHE_CHARS:
                if len(self.cache) >= self.CACHE_WORDS:
                    self.cache.clear()
                self.cache[word] = ids
        return ids

    def _word(self, enc: str) -> list[int]:
        get = self.token_to_id.get
        if self.ignore_merges:
            tok = get(enc)
            if tok is not None:
                return [tok]
        out: list[int] = []
        for s in self.merge(enc):
            tok = get(s)
            if tok is not None:
                out.append(tok)
            else:   # llama.cpp looks each byte of the symbol up as a one-byte token
                out.extend(t for b in s.encode("utf-8") if b < 0x80 and (t := get(chr(b))) is not None)
        return out

    def merge(self, enc: str) -> list[str]:
        """llm_tokenizer_bpe_session's merges of one pre-token (in GPT-2's byte characters): the
        final symbols. A queue of adjacent pairs by merge rank (ties: the leftmost); the best pair
        merges, its new neighbours' pairs are queued, stale entries (a side that changed) skipped:
        O(n log n) in the pre-token's length."""
        n = len(enc)
        if n < 2:
            return [enc] if n else []
        ranks = self.ranks
        if n == 2:
            return [enc] if enc[0] + " " + enc[1] in ranks else [enc[0], enc[1]]
        # characters in the symbol starting at i (0: merged away), next and previous symbol
        if n > LONG:    # a long run: 4-byte arrays, not lists of Python ints
            size, nxt, prv = array("i", [1]) * n, array("i", range(1, n + 1)), array("i", range(-1, n - 1))
        else:
            size, nxt, prv = [1] * n, list(range(1, n + 1)), list(range(-1, n - 1))
        nxt[n - 1] = -1
        # a queue entry is one int: (merge rank, left position, characters in the pair), in that order
        span = self.longest + 1
        pos = n * span
        get = ranks.get
        heap = [r * pos + i * span + 2 for i in range(n - 1) if (r := get(enc[i] + " " + enc[i + 1])) is not None]
        heapq.heapify(heap)
        pop, push = heapq.heappop, heapq.heappush
        while heap:
            left, total = divmod(pop(heap) % pos, span)
            ls = size[left]
            right = nxt[left]
            if ls == 0 or right < 0 or ls + size[right] != total:
                continue    # stale: a side merged since
            size[left] = total
            size[right] = 0
            r_next = nxt[right]
            nxt[left] = r_next
            if r_next >= 0:
                prv[r_next] = left
            merged = enc[left:left + total]
            p = prv[left]
            if p >= 0:
                t = size[p] + total
                if t < span and (r := get(enc[p:left] + " " + merged)) is not None:
                    push(heap, r * pos + p * span + t)
            if r_next >= 0:
                t = total + size[r_next]
                if t < span and (r := get(merged + " " + enc[r_next:r_next + size[r_next]])) is not None:
                    push(heap, r * pos + left * span + t)
        syms = []
        i = 0
        while i != -1:
            syms.append(enc[i:i + size[i]])
            i = nxt[i]
        return syms
