"""Recursive-descent parser: tokens -> AST (see docs/dsl.md for the grammar)."""

from __future__ import annotations

from .. import types as T
from .errors import DSLError
from .lexer import Interp, Token, tokenize
from .nodes import Assign, BinOp, Call, ExprStmt, For, Keyword, Name, Neg, Null, Num, Program, Str, TypeWord

# every GGML type name is a type word: f32 f16 i32 q4_0 q8_0 bf16 q4_K (and q4_k) ...
TYPE_WORDS = frozenset({t.name.lower() for t in T.GGMLType} | {T.type_name(t) for t in T.GGMLType})
SEPARATORS = ("NEWLINE", ";")
_ADD_OPS, _MUL_OPS = ("+", "-"), ("*", "/", "//", "%")


class Parser:
    def __init__(self, tokens: list[Token], source: str, filename: str):
        self.toks, self.k = tokens, 0
        self.source, self.filename = source, filename

    # -- helpers ----------------------------------------------------------------------------
    def error(self, msg: str, at) -> DSLError:
        line, col = at.pos if hasattr(at, "pos") else at
        return DSLError(msg, line, col, self.source, self.filename)

    @property
    def tok(self) -> Token:
        return self.toks[self.k]

    def next(self) -> Token:
        t = self.toks[self.k]
        self.k += 1
        return t

    def at_op(self, *ops: str) -> bool:
        return self.tok.kind == "OP" and self.tok.value in ops

    def at_sep(self) -> bool:
        return self.tok.kind == "NEWLINE" or self.at_op(";")

    def at_keyword(self, word: str) -> bool:
        return self.tok.kind == "KEYWORD" and self.tok.value == word

    def expect_op(self, op: str, what: str) -> Token:
        if not self.at_op(op):
            raise self.error(f"expected '{op}' {what}, got {self.tok.describe()}", self.tok)
        return self.next()

    # -- statements -------------------------------------------------------------------------
    def program(self) -> Program:
        body = self.block(None)
        return Program(tuple(body), self.source, self.filename)

    def block(self, loop: Token | None) -> list:
        """Statements up to EOF (top level) or up to the 'end' of the loop opened by `loop`."""
        body = []
        while True:
            while self.at_sep():
                self.next()
            if self.tok.kind == "EOF":
                if loop is not None:
                    raise self.error("'for' loop is never closed: expected 'end'", loop)
                return body
            if self.at_keyword("end"):
                if loop is None:
                    raise self.error("'end' without a 'for' loop", self.tok)
                return body
            body.append(self.statement())
            if not (self.at_sep() or self.tok.kind == "EOF" or self.at_keyword("end")):
                raise self.error(f"expected a new line or ';' after the statement, got {self.tok.describe()}",
                                 self.tok)

    def statement(self):
        if self.at_keyword("for"):
            return self.for_loop()
        start = self.tok
        expr = self.expression()
        if not self.at_op("="):
            return ExprStmt(expr, start.pos)
        self.next()  # '='
        if not isinstance(expr, Name):
            what = {TypeWord: "a type name", Null: "null", Call: "a call"}.get(type(expr), "an expression")
            raise self.error(f"can't assign to {what}; the left of '=' must be a name", start)
        if self.at_sep() or self.tok.kind == "EOF":
            raise self.error(f"expected an expression after '=', got {self.tok.describe()}", self.tok)
        return Assign(expr, self.expression(), start.pos)

    def for_loop(self) -> For:
        kw = self.next()
        var = self.tok
        if var.kind != "NAME" or len(var.value) != 1 or not isinstance(var.value[0], str) \
                or var.value[0] in TYPE_WORDS:
            raise self.error(f"expected a loop variable name after 'for', got {var.describe()}", var)
        self.next()
        if not self.at_keyword("in"):
            raise self.error(f"expected 'in' after 'for {var.value[0]}', got {self.tok.describe()}", self.tok)
        self.next()
        rng = self.tok
        if not (rng.kind == "NAME" and rng.value == ("range",)):
            raise self.error(f"expected 'range(...)' after 'in', got {rng.describe()}", rng)
        self.next()
        paren = self.expect_op("(", "after 'range'")
        args = []
        while not self.at_op(")"):
            if self.tok.kind == "NAME" and self.toks[self.k + 1].kind == "OP" and self.toks[self.k + 1].value == "=":
                raise self.error("range() takes no keyword arguments", self.tok)
            args.append(self.expression())
            if not self.at_op(")"):
                self.expect_op(",", "or ')' in range(...)")
        self.next()
        if not 1 <= len(args) <= 3:
            raise self.error(f"range() takes 1 to 3 arguments (stop | start, stop[, step]), got {len(args)}",
                             paren)
        self.expect_op(":", "after range(...)")
        body = self.block(kw)
        self.next()  # 'end'
        return For(var.value[0], tuple(args), tuple(body), kw.pos)

    # -- expressions ------------------------------------------------------------------------
    def expression(self):
        left = self.term()
        while self.at_op(*_ADD_OPS):
            op = self.next()
            left = BinOp(op.value, left, self.term(), op.pos)
        return left

    def term(self):
        left = self.unary()
        while self.at_op(*_MUL_OPS):
            op = self.next()
            left = BinOp(op.value, left, self.unary(), op.pos)
        return left

    def unary(self):
        if self.at_op("-"):
            minus = self.next()
            if self.tok.kind == "NUMBER":  # -1 is a literal, so printing it gives back the same tree
                return Num(-self.next().value, minus.pos)
            return Neg(self.unary(), minus.pos)
        return self.atom()

    def atom(self):
        t = self.tok
        if t.kind == "NUMBER":
            self.next()
            return Num(t.value, t.pos)
        if t.kind == "STRING":
            self.next()
            return Str(self.parts(t.value), t.pos)
        if t.kind == "KEYWORD" and t.value == "null":
            self.next()
            return Null(t.pos)
        if t.kind == "NAME":
            self.next()
            parts = self.parts(t.value)
            plain = parts[0] if len(parts) == 1 and isinstance(parts[0], str) else None
            if self.at_op("("):
                if plain is None:
                    raise self.error("an op name can't contain '{...}'", t)
                return self.call(plain, t)
            if plain in TYPE_WORDS:
                return TypeWord(plain, t.pos)
            return Name(parts, t.pos)
        if self.at_op("("):
            self.next()
            expr = self.expression()
            self.expect_op(")", "to close '('")
            return expr
        raise self.error(f"expected an expression, got {t.describe()}", t)

    def call(self, func: str, name_tok: Token) -> Call:
        self.next()  # '('
        args, kwargs = [], []
        while not self.at_op(")"):
            nxt = self.toks[self.k + 1]
            if self.tok.kind == "NAME" and nxt.kind == "OP" and nxt.value == "=":
                key = self.next()
                if len(key.value) != 1 or not isinstance(key.value[0], str):
                    raise self.error("a keyword argument name can't contain '{...}'", key)
                self.next()  # '='
                name = key.value[0]
                if any(kw.name == name for kw in kwargs):
                    raise self.error(f"keyword argument '{name}' repeated", key)
                kwargs.append(Keyword(name, self.expression(), key.pos))
            else:
                if kwargs:
                    raise self.error("positional argument after keyword argument", self.tok)
                args.append(self.expression())
            if not self.at_op(")"):
                self.expect_op(",", f"or ')' in the arguments of {func}()")
        self.next()
        return Call(func, tuple(args), tuple(kwargs), name_tok.pos)

    def parts(self, raw: tuple) -> tuple:
        """Name/string pieces: interpolations parsed into expressions."""
        out = []
        for p in raw:
            if isinstance(p, Interp):
                sub = Parser(p.tokens, self.source, self.filename)
                if sub.tok.kind == "EOF":
                    raise self.error("empty '{}': expected an expression inside", (p.line, p.col))
                expr = sub.expression()
                if sub.tok.kind != "EOF":
                    raise sub.error(f"expected '}}' after the expression, got {sub.tok.describe()}", sub.tok)
                out.append(expr)
            else:
                out.append(p)
        return tuple(out)


def parse(source: str, filename: str = "<program>") -> Program:
    """Parse a program. Raises DSLError with line, column and a caret."""
    return Parser(tokenize(source, filename), source, filename).program()


def parse_expression(source: str, filename: str = "<expression>"):
    """Parse one expression (e.g. a command-line value)."""
    p = Parser(tokenize(source, filename), source, filename)
    while p.at_sep():
        p.next()
    expr = p.expression()
    while p.at_sep():
        p.next()
    if p.tok.kind != "EOF":
        raise p.error(f"unexpected {p.tok.describe()} after the expression", p.tok)
    return expr
