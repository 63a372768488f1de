"""What a program may cost, in one place (docs/dsl.md, "Limits").

A program is text from anywhere, so the work and memory it can ask for are bounded, and crossing
a bound is a DSLError at the line and column that crossed it, never a hang, an exhausted memory
or a Python RecursionError. The bounds sit far above what real programs need: gemma3.gg on
gemma-3-270m (18 layers) runs 1,033 steps and nests 8 levels deep, llama.gg on stories260K (5
layers) 210 steps; a 62-layer model needs some 3,500 steps, a three-hundredth of MAX_STEPS.
"""

from __future__ import annotations

import math

MAX_STEPS = 1_000_000        # statements executed plus loop iterations (build(max_steps=...))
MAX_NESTING = 64             # how deep a statement nests in the text: blocks, parentheses, calls, operators
MAX_CALL_DEPTH = 64          # function calls in progress at once
MAX_RUN_DEPTH = 200          # blocks and expressions in progress at once, through function calls:
                             # at most 3 Python frames each, well inside Python's limit of 1000
MAX_STRING = 4096            # characters of a string or name built with {...}
MAX_SOURCE_BYTES = 1 << 20   # a program file, or a file it includes
MAX_INCLUDE_DEPTH = 16       # files including files
INCLUDE_SUFFIX = ".gg"       # what `include` reads: DSL programs, not whatever a path names

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
INT64_RANGE = f"int64: {INT64_MIN} to {INT64_MAX}"


def int_out_of_range(v) -> bool:
    """An int the program computed that does not fit in int64 (C's int64_t, GGML's ne)."""
    return isinstance(v, int) and not INT64_MIN <= v <= INT64_MAX


def overflowed(result, *operands) -> bool:
    """A float that became inf or nan from finite operands: it overflowed (1e300 * 1e300)."""
    return (isinstance(result, float) and not math.isfinite(result)
            and all(math.isfinite(x) for x in operands))


def shown(text: str, limit: int = 40) -> str:
    """A value from the program as a message quotes it: its repr, cut short."""
    if len(text) > limit:
        return repr(text[:limit]) + f"... ({len(text)} characters)"
    return repr(text)
