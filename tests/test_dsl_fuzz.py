"""A small grammar fuzz of the DSL: every program, however broken, ends in a built graph or in one
DSLError with a line and a column, never in another exception.

Seeded and bounded (a few seconds): random token streams over the lexer's vocabulary, random
calls of every op and builtin on values of every kind, and the
shipped programs (fixtures/*.gg) with tokens deleted, duplicated, swapped or replaced, each parsed
and built over a small model in a measuring context (tensors laid out, no data: a mutant asking
for a huge tensor costs nothing) with a low step limit. `python tests/test_dsl_fuzz.py` prints the
outcomes by kind."""

from __future__ import annotations

import random
import re
from collections import Counter

import numpy as np
from conftest import ROOT, STORIES

import ggtool
from ggtool.dsl import BUILTINS, DictEnv, DSLError, build, parse
from ggtool.dsl.lexer import KEYWORDS, OPERATORS
from ggtool.ops.base import FUNCTIONS
from ggtool.tensor_io import Inputs, parse_named_source

SEED = 19
N_RANDOM, N_CALLS, N_MUTANTS = 200, 300, 300
MAX_STEPS = 5000

VOCABULARY = [*KEYWORDS, *OPERATORS, *sorted(BUILTINS), "range", "relu", "add", "mul_mat", "reshape_2d",
              "soft_max_ext", "rope_ext", "a", "b", "x", "il", "n_layer", "blk.{il}.attn_q.weight", "token_embd.weight",
              "f", "f32", "i32", "q4_0", "0", "1", "-1", "2.5", "1e400", "9223372036854775808", "99999999999",
              '"s"', '"{a}"', '"{x}{x}"', '"general.architecture"', "{", "}", "{x}", "\n", "\n", ";", "#", '"', "  ",
              "9" * 5000, "(" * 80 + "1" + ")" * 80, "not " * 300 + "1", "1" + " + 1" * 100]   # huge literals, deep nesting, long chains
# a token of a program's text: comments, strings, names (dots and {...} joined later), numbers, operators
_TOKEN = re.compile(r'#[^\n]*|"(?:[^"\\\n]|\\.)*"|[A-Za-z_][\w.]*|\d+\.?\d*(?:[eE][+-]?\d+)?|//|==|!=|<=|>=|\s+|.')


class _Gemma3Env:
    """stories260K dressed as a gemma3 model (its metadata under gemma3's keys, the norms gemma3
    has and llama lacks as placeholders), so that mutants of gemma3.gg run as deep as llama.gg's."""

    read_data = False

    def __init__(self):
        self.inner = Inputs([parse_named_source("tokens=i32[3]")], [STORIES], read_data=False)
        self.extra = {f"blk.{il}.{n}.weight": ne for il in range(5)
                      for n, ne in (("attn_q_norm", 8), ("attn_k_norm", 8), ("post_attention_norm", 64),
                                    ("post_ffw_norm", 64))}

    def tensor(self, name, ctx):
        if name in self.extra:
            t = ctx.new_tensor("f32", [self.extra[name]])
            t.name = name
            return t
        return self.inner.tensor(name, ctx)

    def names(self):
        return self.inner.names() + list(self.extra)

    def metadata(self, key):
        if key == "general.architecture":
            return "gemma3"
        return self.inner.metadata(key.replace("gemma3.", "llama.", 1))


def _random_program(rng: random.Random) -> str:
    return " ".join(rng.choice(VOCABULARY) for _ in range(rng.randint(1, 40)))


CALLABLE = sorted(FUNCTIONS) + sorted(BUILTINS)
VALUES = ["a", "b", "t", "0", "1", "3", "-1", "64", "0.5", "-2.5", "1e38", "9223372036854775807", '"a"', '"n"',
          '"general.architecture"', "f32", "i32", "q4_0", "null", "n", "x", "1e300 * 1e300", "4611686018427387904 * 4"]


def _expression(rng: random.Random, depth: int = 0) -> str:
    """Any op or builtin on values of any kind, nested: whatever the arguments, a builder must end
    in a result or an error of its own, which the evaluator reports at the call."""
    k = rng.randrange(8) if depth < 3 else 0
    if k <= 2:
        return rng.choice(VALUES)
    if k == 3:
        return f"{_expression(rng, depth + 1)} {rng.choice(['+', '-', '*', '/', '//', '%', '<', '=='])} " \
               f"{_expression(rng, depth + 1)}"
    if k == 4:
        return '"{' + _expression(rng, depth + 1) + '}"'
    args = [_expression(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    return f"{rng.choice(CALLABLE)}({', '.join(args)})"


def _call_program(rng: random.Random) -> str:
    return "\n".join(f"x = {_expression(rng)}" for _ in range(rng.randint(1, 4))) + "\nrelu(a)"


def _kind(piece: str) -> str:
    if piece[0].isdigit():
        return "number"
    if piece[0] == '"':
        return "string"
    if piece[0].isalpha() or piece[0] == "_":
        return "keyword" if piece in KEYWORDS else "name"
    return "operator"


_BY_KIND = {kind: [v for v in VOCABULARY if v.strip() and _kind(v) == kind]
            for kind in ("number", "string", "keyword", "name", "operator")}


def _mutant(rng: random.Random, source: str) -> str:
    """1 to 3 tokens deleted, duplicated, or swapped with or replaced by one of the same kind (a
    name by a name, a number by a number), mostly names and numbers: mutants that parse and then
    fail, if they do, building. A third of the mutants have whole lines deleted, duplicated or
    swapped instead."""
    if rng.randrange(3) == 0:
        lines = source.split("\n")
        for _ in range(rng.randint(1, 2)):
            i, j = rng.randrange(len(lines)), rng.randrange(len(lines))
            how = rng.randrange(3)
            if how == 0:
                lines[i] = ""
            elif how == 1:
                lines.insert(j, lines[i])
            else:
                lines[i], lines[j] = lines[j], lines[i]
        return "\n".join(lines)
    pieces = _TOKEN.findall(source)
    words = [i for i, p in enumerate(pieces) if not p.isspace() and not p.startswith("#")]
    values = [i for i in words if _kind(pieces[i]) in ("name", "number")]
    for _ in range(rng.randint(1, 3)):
        i = rng.choice(values if rng.random() < 0.7 else words)
        if not pieces[i]:
            continue
        kind, how = _kind(pieces[i]), rng.randrange(6)
        if how == 0:
            pieces[i] = ""                                   # deleted
        elif how == 1:
            pieces[i] = pieces[i] + " " + pieces[i]          # duplicated
        elif how in (2, 3):
            same = [j for j in words if pieces[j] and _kind(pieces[j]) == kind]
            j = rng.choice(same)
            pieces[i], pieces[j] = pieces[j], pieces[i]      # swapped
        else:
            pieces[i] = rng.choice(_BY_KIND[kind])           # replaced
    return "".join(pieces)


def _outcome(source: str, filename: str, env) -> str:
    """'result', 'parse error' or 'build error'; anything else fails the test."""
    try:
        program = parse(source, filename)
    except DSLError as e:
        assert e.line is not None and e.column is not None, (source, str(e))
        return "parse error"
    try:
        build(program, ggtool.Context(measure=True), env, max_steps=MAX_STEPS)
    except DSLError as e:
        assert e.line is not None and e.column is not None or "has no statements" in e.message, (source, str(e))
        return "build error"
    return "result"


def fuzz() -> Counter:
    rng = random.Random(SEED)
    outcomes: Counter = Counter()
    small = DictEnv({"a": np.ones((2, 3), np.float32), "b": np.ones(3, np.float32), "t": np.zeros(2, np.int32)},
                    {"general.architecture": "llama", "n": 3}, read_data=False)
    for _ in range(N_RANDOM):
        outcomes["tokens: " + _outcome(_random_program(rng), "<program>", small)] += 1
    for _ in range(N_CALLS):
        outcomes["calls: " + _outcome(_call_program(rng), "<program>", small)] += 1
    programs = {name: (ROOT / "fixtures" / name).read_text() for name in ("llama.gg", "gemma3.gg", "transformer.gg")}
    envs = {"llama.gg": Inputs([parse_named_source("tokens=i32[3]")], [STORIES], read_data=False),
            "gemma3.gg": _Gemma3Env()}
    envs["transformer.gg"] = envs["llama.gg"]
    for k in range(N_MUTANTS):
        name = list(programs)[k % len(programs)]
        # the mutant stands where its original does, so that its include finds transformer.gg
        mutant = _mutant(rng, programs[name])
        outcomes[f"{name}: " + _outcome(mutant, str(ROOT / "fixtures" / name), envs[name])] += 1
    return outcomes


def test_every_program_gives_a_result_or_one_dsl_error_with_its_position():
    outcomes = fuzz()
    assert sum(outcomes.values()) == N_RANDOM + N_CALLS + N_MUTANTS
    # the fuzz reaches all three outcomes
    assert {k.split(": ")[1] for k in outcomes} == {"result", "parse error", "build error"}
    assert outcomes["llama.gg: result"] > 0 and outcomes["gemma3.gg: build error"] > 0


if __name__ == "__main__":
    for kind, n in sorted(fuzz().items()):
        print(f"{n:5d}  {kind}")
