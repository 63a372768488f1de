"""The DSL programs generate ships, by GGUF `general.architecture`: files of the package folder
ggtool/programs/ (installed with ggtool), so `compute -f ggtool/programs/llama.gg` and generate run
one program. SHIPPED is the one list; the help and docs name the architectures from it."""

from __future__ import annotations

from pathlib import Path

from ..errors import GGToolError
from ..programs import DIR as PROGRAMS_DIR

# general.architecture -> program file; llama.gg falls back to token_embd.weight when a model ties
# its output to the embedding (no output.weight), as llama.cpp does
SHIPPED = {"llama": "llama.gg", "gemma3": "gemma3.gg", "qwen2": "qwen2.gg", "qwen3": "qwen3.gg"}


def shipped_names() -> str:
    """'gemma3, llama, qwen2, qwen3': the architectures a program ships for."""
    return ", ".join(sorted(SHIPPED))


class NoProgramError(GGToolError):
    """No shipped program computes this architecture; `architecture` names it."""

    def __init__(self, architecture: str, path: str | None = None):
        self.architecture, self.path, self.kind = architecture, path, "no-program"
        super().__init__(f"{path + ': ' if path else ''}no program ships for architecture '{architecture}' (shipped: "
                         f"{shipped_names()}); write one in the DSL (docs/dsl.md) and pass it as the program")


def shipped_program(architecture: str, path: str | None = None) -> Path:
    """The shipped program for `architecture` (NoProgramError, naming the model at `path`, if none)."""
    name = SHIPPED.get(architecture)
    if name is None:
        raise NoProgramError(architecture, path)
    return PROGRAMS_DIR / name
