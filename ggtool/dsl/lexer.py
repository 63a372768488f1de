"""Hand-written tokenizer. Newlines separate statements except inside ( ) and [ ]; `{...}` inside
names and strings is lexed on the spot into its own token list, so the parser can parse the
interpolated expression with exact positions."""

from __future__ import annotations

import re
from dataclasses import dataclass

from .errors import DSLError
from .limits import INT64_RANGE, MAX_NESTING, shown

KEYWORDS = {"for", "in", "end", "null", "if", "elif", "else", "def", "return", "include", "and", "or", "not"}
_LETTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
NAME_START = set(_LETTERS + "_")
NAME_CHARS = set(_LETTERS + "0123456789_.")
OPERATORS = ("//", "==", "!=", "<=", ">=", "(", ")", "[", "]", ",", "=", "<", ">", "+", "-", "*", "/", "%", ":", ";")
_CLOSING = {"(": ")", "[": "]"}
_NUMBER = re.compile(r"(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")
_ESCAPES = {"\\": "\\", '"': '"', "n": "\n", "t": "\t"}


@dataclass
class Token:
    kind: str   # NAME KEYWORD NUMBER STRING OP NEWLINE EOF
    value: object  # NAME/STRING: tuple of str | Interp; NUMBER: int | float; else the text
    line: int
    col: int

    @property
    def pos(self) -> tuple[int, int]:
        return (self.line, self.col)

    def describe(self) -> str:
        if self.kind == "NEWLINE":
            return "end of line"
        if self.kind == "EOF":
            return "end of program"
        if self.kind in ("NAME", "STRING"):
            return f"{'name' if self.kind == 'NAME' else 'string'} {shown(self.text())}"
        return f"'{self.value}'"

    def text(self) -> str:
        return "".join(p if isinstance(p, str) else "{...}" for p in self.value)


@dataclass
class Interp:
    """`{expr}` inside a name or string: the tokens of expr, ending with an EOF at the '}'."""
    tokens: list
    line: int
    col: int


class Lexer:
    def __init__(self, source: str, filename: str = "<program>"):
        self.src, self.filename = source, filename
        self.i, self.line, self.line_start = 0, 1, 0
        self.depth = 0   # {...} inside {...}: each level is a recursive _lex

    def error(self, msg: str, line: int, col: int) -> DSLError:
        return DSLError(msg, line, col, self.src, self.filename)

    @property
    def col(self) -> int:
        return self.i - self.line_start + 1

    def peek(self, k: int = 0) -> str:
        j = self.i + k
        return self.src[j] if j < len(self.src) else ""

    def tokens(self) -> list[Token]:
        return self._lex(None)

    def _lex(self, opener: tuple[int, int] | None) -> list[Token]:
        """Tokens up to the end of the source, or up to the '}' closing an interpolation."""
        out: list[Token] = []
        parens: list[Token] = []
        while True:
            c = self.peek()
            if c == "":
                if parens:
                    raise self.error(f"'{parens[-1].value}' was never closed", parens[-1].line, parens[-1].col)
                if opener:
                    raise self.error("'{' was never closed", *opener)
                out.append(Token("EOF", "", self.line, self.col))
                return out
            if c in " \t\r":
                self.i += 1
            elif c == "#":
                while self.peek() not in ("", "\n"):
                    self.i += 1
            elif c == "\n":
                if opener:
                    raise self.error("'{' was never closed", *opener)
                if not parens:
                    out.append(Token("NEWLINE", "\n", self.line, self.col))
                self.i += 1
                self.line += 1
                self.line_start = self.i
            elif c.isdigit() or (c == "." and self.peek(1).isdigit()):
                out.append(self._number())
            elif c in NAME_START or c == "{":
                out.append(self._name())
            elif c == '"':
                out.append(self._string())
            elif c == "}":
                if opener and not parens:
                    out.append(Token("EOF", "", self.line, self.col))
                    self.i += 1
                    return out
                if parens:
                    raise self.error(f"'{parens[-1].value}' was never closed", parens[-1].line, parens[-1].col)
                raise self.error("unmatched '}'", self.line, self.col)
            else:
                op = next((o for o in OPERATORS if self.src.startswith(o, self.i)), None)
                if op is None:
                    raise self.error(f"unexpected character {c!r}", self.line, self.col)
                tok = Token("OP", op, self.line, self.col)
                if op in _CLOSING:
                    parens.append(tok)
                elif op in (")", "]"):
                    if not parens or _CLOSING[parens[-1].value] != op:
                        if parens:
                            opener = parens[-1]
                            raise self.error(f"'{op}' does not close '{opener.value}' (line {opener.line}, "
                                             f"column {opener.col})", self.line, self.col)
                        raise self.error(f"unmatched '{op}'", self.line, self.col)
                    parens.pop()
                out.append(tok)
                self.i += len(op)

    def _number(self) -> Token:
        line, col = self.line, self.col
        m = _NUMBER.match(self.src, self.i)
        text = m.group()
        end = m.end()
        if end < len(self.src) and (self.src[end] in NAME_CHARS or self.src[end] == "{"):
            j = end  # a number glued to letters or dots: report the whole word
            while j < len(self.src) and (self.src[j] in NAME_CHARS or
                                         (self.src[j] in "+-" and self.src[j - 1] in "eE")):
                j += 1
            raise self.error(f"bad number {shown(self.src[self.i:j])}", line, col)
        self.i = end
        if any(ch in text for ch in ".eE"):
            value = float(text)
            if value == float("inf"):
                raise self.error(f"number {shown(text)} is too large for a float (it would be inf)", line, col)
        elif len(text.lstrip("0")) > 19:   # int() of thousands of digits is slow, or refused
            raise self.error(f"integer {shown(text)} is out of range ({INT64_RANGE})", line, col)
        else:
            value = int(text)
        return Token("NUMBER", value, line, col)

    def _interp(self) -> Interp:
        line, col = self.line, self.col
        if self.depth >= MAX_NESTING:
            raise self.error(f"'{{...}}' nests more than {MAX_NESTING} levels deep", line, col)
        self.i += 1  # '{'
        self.depth += 1
        tokens = self._lex((line, col))
        self.depth -= 1
        return Interp(tokens, line, col)

    def _name(self) -> Token:
        line, col = self.line, self.col
        parts: list = []
        buf = ""
        while True:
            c = self.peek()
            if c and c in NAME_CHARS:
                buf += c
                self.i += 1
            elif c == "{":
                if buf:
                    parts.append(buf)
                    buf = ""
                parts.append(self._interp())
            else:
                break
        if buf:
            parts.append(buf)
        if len(parts) == 1 and isinstance(parts[0], str) and parts[0] in KEYWORDS:
            return Token("KEYWORD", parts[0], line, col)
        return Token("NAME", tuple(parts), line, col)

    def _string(self) -> Token:
        line, col = self.line, self.col
        self.i += 1
        parts: list = []
        buf = ""
        while True:
            c = self.peek()
            if c in ("", "\n"):
                raise self.error("unterminated string", line, col)
            if c == '"':
                self.i += 1
                break
            if c == "\\":
                e = self.peek(1)
                if e not in _ESCAPES:
                    raise self.error(f"unknown escape '\\{e}' (use \\\\ \\\" \\n \\t; {{{{ and }}}} for braces)",
                                     self.line, self.col)
                buf += _ESCAPES[e]
                self.i += 2
            elif c == "{" and self.peek(1) == "{":
                buf += "{"
                self.i += 2
            elif c == "}" and self.peek(1) == "}":
                buf += "}"
                self.i += 2
            elif c == "{":
                if buf:
                    parts.append(buf)
                    buf = ""
                parts.append(self._interp())
            elif c == "}":
                raise self.error("single '}' in a string (write '}}')", self.line, self.col)
            else:
                buf += c
                self.i += 1
        if buf or not parts:
            parts.append(buf)
        return Token("STRING", tuple(parts), line, col)


def tokenize(source: str, filename: str = "<program>") -> list[Token]:
    return Lexer(source, filename).tokens()
