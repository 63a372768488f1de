"""llama.cpp's SentencePiece tokenizer (llm_tokenizer_spm_session): score-ordered bigram merges.

The text (whitespace escaped as U+2581) starts as one symbol per character; every adjacent pair
whose concatenation is a token goes into a priority queue by that token's score (ties: the leftmost
pair). The best pair merges, its neighbours' pairs are queued, stale entries (a side that changed
size) are skipped. A final symbol that is no token is emitted as its UTF-8 bytes' `<0xXX>` tokens
(byte fallback; llama.cpp's resegment, whose split-back path a merged symbol never takes: a merge
only ever makes a token).

In pieces, with bounded memory: the text is cut wherever the two characters either side occur
next to each other in no token. No merge can ever join them, and the two sides' merges never meet
(each side's queue pops keep their order), so each piece tokenized alone gives exactly the ids of
the whole; short pieces' ids are cached, as BPE's pre-tokens are. The cuts are found WINDOW
characters at a time (numpy, over the pairs' code points; a short text in Python). A run with no
such place (a run of one character whose pair is a token: '▁▁' in most vocabularies) is one
piece, merged in 4-byte arrays: 45-75 bytes a character of peak RSS (llama.cpp's: 43-108).
"""

from __future__ import annotations

import heapq
from array import array
from collections.abc import Callable

import numpy as np

ESCAPED_SPACE = "\u2581"
WINDOW = 1 << 14    # characters whose cuts are found at once; longer pieces use 4-byte arrays
SHORT = 256         # a text this short is cut without numpy


class SPM:
    """A vocabulary's merge table: each token's score rank (0: the highest score); the pairs of
    characters that occur inside some token; a bounded cache of piece -> ids."""

    CACHE_PIECES = 1 << 16   # pieces remembered (then forgotten all at once)
    CACHE_CHARS = 64         # longer pieces are not remembered

    def __init__(self, tokens: list[str], scores: list[float], token_to_id: dict[str, int],
                 byte_token: Callable[[int], int]):
        self.token_to_id = token_to_id
        self.byte_token = byte_token
        # each token's score rank, 0 the highest (np.unique: -0.0 and 0.0 are one score, as in C)
        _, order = np.unique(-np.asarray(scores, np.float64), return_inverse=True)
        self.rank_of = order.ravel().tolist()
        lengths = np.fromiter(map(len, tokens), np.int64, len(tokens))
        self.longest = int(lengths.max(initial=1))
        # every pair of adjacent characters in a token, as (first << 21) | second: the tokens of 2
        # characters or more joined by NUL, whose pairs with NUL beside them are extra and harmless
        # (fewer cuts, never a wrong one)
        multi = np.flatnonzero(lengths > 1).tolist()
        cp = np.frombuffer("\0".join([tokens[i] for i in multi]).encode("utf-32-le"), np.uint32).astype(np.int64)
        codes = np.sort((cp[:-1] << 21) | cp[1:])
        self.joined = codes[np.r_[True, codes[1:] != codes[:-1]]] if codes.size else np.array([-1], np.int64)
        # the same pairs as text, with a space for each U+2581 too (short texts: no numpy)
        pairs = {chr(c >> 21) + chr(c & 0x1FFFFF) for c in self.joined.tolist() if c >= 0}
        self.pairs = frozenset(pairs | {p.replace(ESCAPED_SPACE, " ") for p in pairs}
                               | {p[0] + p[1].replace(ESCAPED_SPACE, " ") for p in pairs}
                               | {p[0].replace(ESCAPED_SPACE, " ") + p[1] for p in pairs})
        self.cache: dict[str, list[int]] = {}

    def tokenize(self, text: str, out: list[int]) -> None:
        """The ids of `text` (spaces not yet escaped) appended to `out`."""
        n = len(text)
        start = 0   # of the piece not yet ended
        if n <= SHORT:
            pairs = self.pairs
            for p in range(1, n):
                if text[p - 1:p + 1] not in pairs:
                    self._cached(text[start:p], out)
                    start = p
            if start < n:
                self._cached(text[start:], out)
            return
        joined = self.joined
        for a in range(1, n, WINDOW):   # the cuts at a .. b-1: is text[p-1] + text[p] in a token?
            b = min(a + WINDOW, n)
            cp = np.frombuffer(text[a - 1:b].encode("utf-32-le"), np.uint32).astype(np.int64)
            cp[cp == 0x20] = ord(ESCAPED_SPACE)
            pairs = (cp[:-1] << 21) | cp[1:]
            at = np.searchsorted(joined, pairs)
            cut = joined[np.minimum(at, len(joined) - 1)] != pairs
            for p in (np.flatnonzero(cut) + a).tolist():
                self._cached(text[start:p], out)
                start = p
        if start < n:
            self._cached(text[start:], out)

    def _cached(self, piece: str, out: list[int]) -> None:
        ids = self.cache.get(piece)
        if ids is None:
            ids = []
            self._piece(piece.replace(" ", ESCAPED_SPACE), ids)
            if len(piece) <= self.CACHE_CHARS:
                if len(self.cache) >= self.CACHE_PIECES:
                    self.cache.clear()
                self.cache[piece] = ids
        out.extend(ids)

    def _piece(self, text: str, out: list[int]) -> None:
        n = len(text)
        if n == 0:
            return
        get = self.token_to_id.get
        rank_of = self.rank_of
        if n == 1:
            tok = get(text)
            out.append(tok) if tok is not None else out.extend(map(self.byte_token, text.encode("utf-8")))
            return
        # one symbol per character: size (0: merged away), next and previous symbol
        if n > WINDOW:     # a long run: 4-byte arrays, not lists of Python ints
            size = array("i", [1]) * n
            nxt = array("i", range(1, n + 1))
            prv = array("i", range(-1, n - 1))
        else:
            size = [1] * n
            nxt = list(range(1, n + 1))
            prv = list(range(-1, n - 1))
        nxt[n - 1] = -1
        # a queue entry is one int: (score rank, left position, characters in the pair), in that order
        span = self.longest + 1
        pos = n * span
        heap = [rank_of[t] * pos + i * span + 2 for i in range(n - 1) if (t := get(text[i:i + 2])) is not None]
        heapq.heapify(heap)
        pop, push = heapq.heappop, heapq.heappush
        while heap:
            key = pop(heap)
            left, total = divmod(key % pos, span)
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
            p = prv[left]
            if p >= 0:
                t = size[p] + total
                if t < span and (tok := get(text[p:p + t])) is not None:
                    push(heap, rank_of[tok] * pos + p * span + t)
            if r_next >= 0:
                t = total + size[r_next]
                if t < span and (tok := get(text[left:left + t])) is not None:
                    push(heap, rank_of[tok] * pos + left * span + t)
        i = 0
        while i != -1:
            piece = text[i:i + size[i]]
            tok = get(piece)
            if tok is not None:
                out.append(tok)
            else:
                out.extend(map(self.byte_token, piece.encode("utf-8")))
            i = nxt[i]
