"""ggtool.json_input: JSON from the user with its nesting bounded, measured without recursion."""

from __future__ import annotations

import json
import random

import pytest

from ggtool.errors import InputError
from ggtool.json_input import DEPTH_KIND, MAX_DEPTH, check_depth, loads, too_deep


def _depth(v) -> int:
    if isinstance(v, list):
        return 1 + max((_depth(x) for x in v), default=0)
    if isinstance(v, dict):
        return 1 + max((_depth(x) for x in v.values()), default=0)
    return 0


def _value(rng: random.Random, depth: int):
    """A random JSON value up to `depth` deep, with brackets, quotes and escapes inside its strings."""
    if depth == 0 or rng.random() < 0.3:
        return rng.choice([1, 2.5, None, True, "[x", '"]"', "\\{", "}]", "é[", ""])
    if rng.random() < 0.8:
        return [_value(rng, depth - 1) for _ in range(rng.randrange(0, 3))]
    return {rng.choice(["k[", "{", "a"]): _value(rng, depth - 1)}


def test_the_depth_is_json_loads_depth():
    """Seeded random JSON (compact and indented): too_deep says yes exactly when the value nests
    deeper than the limit."""
    rng = random.Random(29)
    for _ in range(3000):
        v = _value(rng, rng.randrange(1, 14))
        text, d = json.dumps(v, indent=rng.choice([None, 1]), ensure_ascii=rng.random() < 0.5), _depth(v)
        for limit in (0, 1, 2, 3, 5, 8, 11):
            assert too_deep(text, limit) == (d > limit), (text, limit, d)


@pytest.mark.parametrize("text, deep", [
    ("[" * 65 + "]" * 65, True), ("[" * 64 + "]" * 64, False),
    ("[" * (1 << 20), True),                                   # 1 MB of openers, never closed
    ('{"a":' * 100, True), ("[" + "[1]," * 1000 + "1]", False),  # many brackets, shallow
    ("[[]" * 100, True),                                       # no long run of [, still deep
    ('["' + "[" * 1000 + '"]', False), ('["\\"' + "[" * 1000 + '"]', False),   # inside a string
    ('["\\\\"' + "[" * 1000 + '"]', True),                     # the string ended before them
    ('["abc' + "[" * 1000, False),                             # an unterminated string runs to the end
    ("][" * 1000, False), ("[}" * 1000, False),                # garbage the decoder stops at
])
def test_cases(text, deep):
    assert too_deep(text) is deep


def test_loads_and_its_error():
    assert loads("[[1, 2], [3, 4]]") == [[1, 2], [3, 4]]
    with pytest.raises(json.JSONDecodeError):
        loads("[1,")
    with pytest.raises(InputError, match=f"JSON is nested more than {MAX_DEPTH} levels deep, the most ggtool reads") as e:
        loads("[" * 100_000 + "]" * 100_000)
    assert e.value.kind == DEPTH_KIND and e.value.details["limit"] == MAX_DEPTH
    check_depth("[[[1]]]", limit=3)
    with pytest.raises(InputError, match="more than 2 levels"):
        check_depth("[[[1]]]", limit=2)
