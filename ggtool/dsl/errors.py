"""DSLError: every problem with a program, pointing at the line and column it comes from."""

from __future__ import annotations

from collections.abc import Iterable

from ..errors import GGToolError, did_you_mean


class DSLError(GGToolError):
    """A parse or build error. `str()` is the full report: position, message, source line, caret.

    The parts stay available (`message`, `hint`, `line`, `column`, `filename`, `loop`, `context`,
    and `kind`/`details` as for every GGToolError) for callers that want to present them
    differently: `hint` is advice in the DSL's words that follows the message (a front end may
    replace it: `with_hint`), `loop` the innermost loop iterations ("il=3"), `context` what
    encloses them, innermost first ("in attention() called at llama.gg line 58", "in loop
    iteration il=3"). An error that an engine error caused (`__cause__`) ends its message with
    that error's str().
    """

    def __init__(self, message: str, line: int | None = None, column: int | None = None,
                 source: str | None = None, filename: str | None = None, loop: str | None = None,
                 context: list[str] | None = None, *, hint: str = "", kind: str | None = None, **details):
        self.message, self.hint, self.line, self.column = message, hint, line, column
        self.filename, self.loop, self.context = filename, loop, list(context or [])
        self.kind, self.details = kind or type(self).kind, details
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
        head = (", ".join(where) + ": " if where else "") + self.message + self.hint
        if self.source_line is None or self.column is None:
            return head
        text = self.source_line.lstrip()  # shown dedented; the caret follows
        indent = len(self.source_line) - len(text)
        caret = max(0, self.column - 1 - indent)
        return f"{head}\n  {text}\n  {' ' * caret}^"

    def with_message(self, message: str, hint: str | None = None) -> DSLError:
        """The same error (class, position, context) with another message and hint (None: its
        own): how a front end words it its way."""
        e = type(self).__new__(type(self))
        e.__dict__.update(self.__dict__)
        e.__cause__ = self.__cause__
        e.message = message
        if hint is not None:
            e.hint = hint
        e.args = (e._format(),)
        return e

    def with_hint(self, hint: str) -> DSLError:
        return self.with_message(self.message, hint)


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

    kind = "step-limit"


class UnknownOutputError(DSLError):
    """An output asked for by name (build's outputs) that the program does not have: `name`."""

    kind = "unknown-output"

    def __init__(self, message: str, name: str, **where):
        self.name = name
        super().__init__(message, **where)


def suggest(name: str, candidates: Iterable[str]) -> str:
    """' (did you mean 'x'?)' or '' — the tail of an unknown-name message."""
    close = did_you_mean(name, candidates)
    return f" ({close})" if close else ""
