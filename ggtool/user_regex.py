"""Regular expressions a user gives (quantize's tensor-type patterns, the patterns inspect and
inspect-graph select names with), run with a time bound.

A pattern such as `(.|.)*\\d$` backtracks exponentially: Python's `re` would search one tensor name
with it for hours. These are compiled with the `regex` module (the syntax of `re`, which it keeps
as its version 0) and searched with its `timeout=`: each pattern has a budget of CPU time for all
its searches together (BUDGET_S), and one that spends it ends the command with a
`RegexTimeoutError` naming the pattern. Legitimate patterns over tensor names and metadata keys
take microseconds; the budget is far above them.
"""

from __future__ import annotations

import time

import regex

from .errors import GGToolError

BUDGET_S = 1.0                 # CPU seconds one pattern may spend on all its searches


def shown(pattern: str) -> str:
    """A pattern in quotes as typed (backslashes not doubled); repr() where it holds control characters."""
    return f"'{pattern}'" if pattern.isprintable() else repr(pattern)


class RegexError(GGToolError):
    """A user's regular expression that cannot be used: `pattern`, `origin` (what it was given
    as: "tensor-type", "only"), `reason` ("syntax" or "timeout"), `problem` (the syntax error)."""

    def __init__(self, pattern: str, origin: str, reason: str, message: str, problem: str | None = None):
        self.pattern, self.origin, self.reason, self.problem = pattern, origin, reason, problem
        self.kind = "regex-" + reason
        super().__init__(message)


class UserRegex:
    """A compiled user pattern whose searches share one time budget (`search(text)`, as re's)."""

    def __init__(self, pattern: str, origin: str = "pattern", budget_s: float = BUDGET_S):
        self.pattern, self.origin, self.budget_s = pattern, origin, budget_s
        self.spent_s = 0.0
        try:
            self._regex = regex.compile(pattern)
        except (regex.error, OverflowError, RecursionError, ValueError) as e:
            raise RegexError(pattern, origin, "syntax", f"{shown(pattern)} is not a regular expression ({e})",
                             str(e)) from None

    def search(self, text: str):
        """regex.search within what is left of the budget (RegexTimeoutError when it runs out)."""
        left = self.budget_s - self.spent_s
        t0 = time.process_time()
        try:
            if left <= 0:
                raise TimeoutError
            return self._regex.search(text, timeout=left)
        except TimeoutError:
            raise RegexError(self.pattern, self.origin, "timeout",
                             f"the regular expression {shown(self.pattern)} took more than {self.budget_s:g} s of "
                             "CPU time on the names it searched (it backtracks without end); simplify it, e.g. no "
                             "nested or overlapping repeats such as (a|a)* or (.*)*") from None
        finally:
            self.spent_s += time.process_time() - t0

    def __repr__(self) -> str:
        return f"UserRegex({self.pattern!r})"
