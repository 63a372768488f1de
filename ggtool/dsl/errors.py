"""DSLError: every problem with a program, pointing at the line and column it comes from."""

from __future__ import annotations

from collections.abc import Iterable

from ..errors import GGToolError


class DSLError(GGToolError):
    """A parse or build error. `str()` is the full report: position, message, source line, caret.

    The parts stay available (`message`, `line`, `column`, `filename`, `loop`, `context`) for
    callers that want to present them differently: `loop` is the innermost loop iterations
    ("il=3"), `context` what encloses them, innermost first ("in attention() called at
    llama.gg line 58", "in loop iteration il=3").
    """

    def __init__(self, message: str, line: int | None = None, column: int | None = None,
                 source: str | None = None, filename: str | None = None, loop: str | None = None,
                 context: list[str] | None = None):
        self.message, self.line, self.column = message, line, column
        self.filename, self.loop, self.context = filename, loop, list(context or [])
        self.source_line = None
        if source is not None and line is not None:
            lines = source.split("\n")
            if 1 <= line <= len(lines):
                self.source_line = lines[line - 1].rstrip("\r")
        super().__init__(self._format())

    def _format(self) -> str:
        where = []
        if self.filename and not self.filename.startswith("<"):
            where.append(self.filename)
        if self.line is not None:
            where.append(f"line {self.line}, column {self.column}")
        if self.loop:
            where.append(f"in loop iteration {self.loop}")
        where.extend(_condensed(self.context))
        head = (", ".join(where) + ": " if where else "") + self.message
        if self.source_line is None or self.column is None:
            return head
        text = self.source_line.lstrip()  # shown dedented; the caret follows
        indent = len(self.source_line) - len(text)
        caret = max(0, self.column - 1 - indent)
        return f"{head}\n  {text}\n  {' ' * caret}^"


def _condensed(context: list[str], most: int = 8) -> list[str]:
    """What encloses an error, kept to one readable line: repeats counted (a recursion's calls),
    and past `most` parts only the innermost and the outermost."""
    runs: list[list] = []
    for c in context:
        if runs and runs[-1][0] == c:
            runs[-1][1] += 1
        else:
            runs.append([c, 1])
    parts = [c if n == 1 else f"{c} ({n} times)" for c, n in runs]
    if len(parts) > most:
        parts = parts[:most - 3] + [f"... ({len(parts) - most + 1} more)"] + parts[-2:]
    return parts


class StepLimitError(DSLError):
    """The program ran more statements and loop iterations than its limit (build's max_steps)."""


class UnknownOutputError(DSLError):
    """An output asked for by name (build's outputs) that the program does not have: `name`."""

    def __init__(self, message: str, name: str, **where):
        self.name = name
        super().__init__(message, **where)


def suggest(name: str, candidates: Iterable[str]) -> str:
    """' (did you mean 'x'?)' or '' — the tail of an unknown-name message."""
    import difflib  # only for an error

    close = difflib.get_close_matches(name, sorted(set(candidates)), n=3, cutoff=0.6)
    if not close:
        return ""
    return " (did you mean " + " or ".join(f"'{c}'" for c in close) + "?)"
