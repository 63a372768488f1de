"""Text generation: a model's program run token after token over a KV cache (`ggtool generate`).

`Session` holds the model, its program's graphs (one per batch size, built once) and the KV cache;
`generate(session, prompt_ids, ...)` yields the new ids as they come; `Sampling` picks each one;
`shipped_program(architecture)` is the program generate uses when none is given. docs/generate.md.
"""

from __future__ import annotations

from .loop import Event, generate
from .programs import SHIPPED, NoProgramError, shipped_program
from .sampling import Sampling
from .session import ContextFullError, NoCacheError, Session

__all__ = ["SHIPPED", "ContextFullError", "Event", "NoCacheError", "NoProgramError", "Sampling", "Session", "generate",
           "shipped_program"]
