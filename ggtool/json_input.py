"""JSON a user gives (token ids, tensors' arrays, lines of JSON Lines), read with its nesting
bounded: the one reader of JSON input. Python's json recurses once per `[` or `{`, so JSON nested
100,000 deep would end in a RecursionError; here it is one InputError, found without recursion
and without parsing (from the brackets outside strings, at C speed).

No input ggtool takes nests deeper than a tensor's 4 dimensions; MAX_DEPTH leaves room for a
clear error about what the input should be, and stays far below Python's recursion limit
wherever the caller sits. The caller says where (InputError.at, or its own prefix).
"""

from __future__ import annotations

import json
import re
from itertools import accumulate

from .errors import InputError

MAX_DEPTH = 64   # levels of [ and { that loads() reads
DEPTH_KIND = "json-depth"

# A JSON string (escapes included; one left open runs to the end of the text, as far as the
# decoder would read it). Brackets: { and } read as [ and ] (the depth is the same), every other
# byte dropped.
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"?', re.S)
_AS_SQUARE = bytes.maketrans(b"{}", b"[]")
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_STEP = {ord("["): 1, ord("]"): -1}
_CHUNK = 1 << 12


def too_deep(text: str, limit: int = MAX_DEPTH) -> bool:
    """Whether `text`'s brackets outside strings nest deeper than `limit`: they do wherever
    json.loads would recurse deeper (for invalid JSON the answer may be yes where json.loads would
    stop at an error first)."""
    if text.count("[") + text.count("{") <= limit:   # the common case: too few to nest deeper
        return False
    data = text.encode("utf-8", "surrogatepass")
    if b'"' in data:   # strings out: without escapes, every other piece between quotes
        data = _STRING.sub(b"", data) if b"\\" in data else b"".join(data.split(b'"')[::2])
    brackets = data.translate(_AS_SQUARE, _NOT_BRACKETS)
    if re.search(rb"\[{%d}" % (limit + 1), brackets):   # limit + 1 openers in a row: the usual attack
        return True
    # Take away the innermost pairs, a level a round: JSON of depth d is gone after d rounds.
    rounds = 0
    while brackets and rounds < limit:
        fewer = brackets.replace(b"[]", b"")
        if len(fewer) == len(brackets):
            break
        brackets, rounds = fewer, rounds + 1
    if b"[]" in brackets:    # a pair enclosing `limit` levels: depth > limit
        return True
    # What is left pairs nothing up (brackets the decoder would stop at): its prefixes' depth, plus
    # the levels taken away, bounds how deep the decoder would go.
    if brackets.count(b"[") + rounds <= limit:
        return False
    depth = 0
    for at in range(0, len(brackets), _CHUNK):
        steps = list(accumulate(map(_STEP.__getitem__, brackets[at:at + _CHUNK]), initial=depth))
        if max(steps) + rounds > limit:
            return True
        depth = steps[-1]
    return False


def check_depth(text: str, limit: int = MAX_DEPTH) -> None:
    """An InputError (kind DEPTH_KIND) if `text`'s JSON nests deeper than `limit`."""
    if too_deep(text, limit):
        raise InputError(f"JSON is nested more than {limit} levels deep, the most ggtool reads", kind=DEPTH_KIND,
                         limit=limit)


def loads(text: str, limit: int = MAX_DEPTH):
    """json.loads(text) for JSON nested at most `limit` deep (else InputError, kind DEPTH_KIND).
    json.JSONDecodeError passes through for the caller to word."""
    check_depth(text, limit)
    return json.loads(text)
