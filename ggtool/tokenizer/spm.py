"""llama.cpp's SentencePiece tokenizer (llm_tokenizer_spm_session): score-ordered bigram merges.

The text (whitespace already escaped as U+2581) starts as one symbol per character; every adjacent
pair whose concatenation is a token goes into a priority queue by that token's score (ties: the
leftmost pair). The best pair merges, its neighbours' pairs are queued, stale entries (a side that
changed size) are skipped. A final symbol that is no token is emitted as its UTF-8 bytes' `<0xXX>`
tokens (byte fallback).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable


def spm_tokenize(text: str, token_to_id: dict[str, int], scores: list[float],
                 byte_token: Callable[[int], int], out: list[int]) -> None:
    n = len(text)
    if n == 0:
        return
    size = [1] * n                    # characters in the symbol starting at i (0: merged away)
    nxt = list(range(1, n + 1))
    nxt[-1] = -1
    prv = list(range(-1, n - 1))
    heap: list[tuple[float, int, int, int]] = []
    get = token_to_id.get
    push = heapq.heappush

    for i in range(n - 1):
        tok = get(text[i:i + 2])
        if tok is not None:
            heap.append((-scores[tok], i, i + 1, 2))
    heapq.heapify(heap)

    pop = heapq.heappop
    while heap:
        _, left, right, total = pop(heap)
        ls, rs = size[left], size[right]
        if ls == 0 or rs == 0 or ls + rs != total:
            continue
        size[left] = total
        size[right] = 0
        r_next = nxt[right]
        nxt[left] = r_next
        if r_next >= 0:
            prv[r_next] = left
        p = prv[left]
        if p >= 0:
            tok = get(text[p:left + total])
            if tok is not None:
                push(heap, (-scores[tok], p, left, size[p] + total))
        if r_next >= 0:
            t2 = total + size[r_next]
            tok = get(text[left:left + t2])
            if tok is not None:
                push(heap, (-scores[tok], left, r_next, t2))

    i = 0
    while i != -1:
        piece = text[i:i + size[i]]
        tok = get(piece)
        if tok is not None:
            out.append(tok)
        else:
            out.extend(byte_token(b) for b in piece.encode("utf-8", "surrogatepass"))
        i = nxt[i]
