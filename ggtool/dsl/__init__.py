"""The op DSL: `name = op(args)` programs that build GGML graphs (grammar: docs/dsl.md).

    program = parse(source, filename="model.gg")
    built = build(program, ctx, env)        # env: input tensors and GGUF metadata (Env)
    ggtool.graph_compute(built.graph, 1)
"""

from .builtins import BUILTINS
from .env import DictEnv, Env
from .errors import DSLError, StepLimitError, UnknownOutputError
from .evaluate import Built, build
from .parser import TYPE_WORDS, parse, parse_expression
from .printer import unparse


def format_source(source: str, filename: str = "<program>") -> str:
    """A program in canonical form (comments are dropped)."""
    return unparse(parse(source, filename))


__all__ = [
    "BUILTINS",
    "TYPE_WORDS",
    "Built",
    "DSLError",
    "DictEnv",
    "Env",
    "StepLimitError",
    "UnknownOutputError",
    "build",
    "format_source",
    "parse",
    "parse_expression",
    "unparse",
]
