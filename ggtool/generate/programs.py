"""The DSL programs generate ships, by GGUF `general.architecture`.

They are the repository's fixtures/*.gg (this package's programs/ holds links to them, which a wheel
turns into copies), so compute on fixtures/llama.gg and generate run one program.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import GGToolError

PROGRAMS_DIR = Path(__file__).resolve().parent / "programs"

# general.architecture -> program file; llama.gg falls back to token_embd.weight when a model ties
# its output to the embedding (no output.weight), as llama.cpp does
SHIPPED = {"llama": "llama.gg", "gemma3": "gemma3.gg", "qwen2": "qwen2.gg", "qwen3": "qwen3.gg"}


class NoProgramError(GGToolError):
    """No shipped program computes this architecture; `architecture` names it."""

    def __init__(self, architecture: str):
        self.architecture, self.kind = architecture, "no-program"
        known = ", ".join(sorted(SHIPPED))
        super().__init__(f"no program ships for architecture '{architecture}' (shipped: {known}); write one in the "
                         "DSL (docs/dsl.md) and pass it as the program")


def shipped_program(architecture: str) -> Path:
    """The shipped program for `architecture` (NoProgramError if there is none)."""
    name = SHIPPED.get(architecture)
    if name is None:
        raise NoProgramError(architecture)
    return PROGRAMS_DIR / name
