"""Recursive-descent parser: tokens -> AST (see docs/dsl.md for the grammar)."""

from __future__ import annotations

from .. import types as T
from .errors import DSLError
from .lexer import Interp, Token, tokenize
from .limits import INT64_RANGE, MAX_NESTING, int_out_of_range
from .nodes import (
    Assign,
    BinOp,
    BoolOp,
    Call,
    Compare,
    Def,
    ExprStmt,
    For,
    If,
    Include,
    Index,
    Keyword,
    Name,
    Neg,
    Not,
    Null,
    Num,
    Param,
    Program,
    Return,
    Str,
    TypeWord,
)

# every GGML type name is a type word: f32 f16 i32 q4_0 q8_0 bf16 q4_K (and q4_k) ...
TYPE_WORDS = frozenset({t.name.lower() for t in T.GGMLType} | {T.type_name(t) for t in T.GGMLType})
_ADD_OPS, _MUL_OPS = ("+", "-"), ("*", "/", "//", "%")
COMPARE_OPS = ("==", "!=", "<", "<=", ">", ">=")
_BLOCK_ENDS = ("end", "elif", "else")


class Parser:
    def __init__(self, tokens: list[Token], source: str, filename: str, depth: int = 0):
        self.toks, self.k = tokens, 0
        self.source, self.filename = source, filename
        self.depth = depth   # blocks, parentheses, brackets, calls, '-' and 'not' open around the token

    def nest(self, at) -> None:
        """One level deeper (each is a recursive call here); past MAX_NESTING an error."""
        self.depth += 1
        if self.depth > MAX_NESTING:
            raise self.error(_too_deep(), at)

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
        body = self.block(None, ())
        return Program(tuple(body), self.source, self.filename)

    def check_depth(self, node) -> None:
        """The tree under `node` nests at most MAX_NESTING deep. Operator chains build depth without
        parentheses (a + b + c is (a + b) + c), and the evaluator, the printer and `==` recurse over
        the tree."""
        stack = [(node, 0)]
        while stack:
            n, d = stack.pop()
            if d > MAX_NESTING:
                raise self.error(_too_deep(), n.pos)
            stack.extend([(c, d + 1) for c in _children(n)])

    def block(self, opener: Token | None, ends: tuple = ("end",), in_def: bool = False) -> list:
        """Statements up to EOF (top level, opener None) or up to one of the keywords `ends` that
        close the block opened by `opener` (a 'for', 'if', 'elif', 'else' or 'def' token)."""
        body = []
        if opener is not None:
            self.nest(opener)
        while True:
            while self.at_sep():
                self.next()
            if self.tok.kind == "EOF":
                if opener is not None:
                    what = "loop" if opener.value == "for" else "function" if opener.value == "def" else "block"
                    raise self.error(f"'{opener.value}' {what} is never closed: expected 'end'", opener)
                return body
            if self.tok.kind == "KEYWORD" and self.tok.value in _BLOCK_ENDS:
                if self.tok.value in ends:
                    self.depth -= 1
                    return body
                if opener is None:
                    what = "a 'for', 'if' or 'def' block" if self.tok.value == "end" else "an 'if'"
                    raise self.error(f"'{self.tok.value}' without {what}", self.tok)
                raise self.error(f"'{self.tok.value}' here does not belong to the '{opener.value}' block "
                                 f"(line {opener.line}); expected {' or '.join(repr(e) for e in ends)}", self.tok)
            body.append(self.statement(opener is None, in_def))
            if opener is None:
                self.check_depth(body[-1])
            if not (self.at_sep() or self.tok.kind == "EOF"
                    or (self.tok.kind == "KEYWORD" and self.tok.value in _BLOCK_ENDS)):
                raise self.error(f"expected a new line or ';' after the statement, got {self.tok.describe()}",
                                 self.tok)

    def statement(self, top: bool = True, in_def: bool = False):
        if self.at_keyword("for"):
            return self.for_loop(in_def)
        if self.at_keyword("if"):
            return self.if_block(in_def)
        if self.at_keyword("def"):
            if not top:
                raise self.error("a function is defined at the top level, not inside a block", self.tok)
            return self.def_block()
        if self.at_keyword("return"):
            kw = self.next()
            if not in_def:
                raise self.error("'return' outside a function", kw)
            if self.at_sep() or self.tok.kind == "EOF" or self.tok.kind == "KEYWORD" and self.tok.value in _BLOCK_ENDS:
                raise self.error("'return' needs a value", kw)
            return Return(self.expression(), kw.pos)
        if self.at_keyword("include"):
            kw = self.next()
            if not top:
                raise self.error("'include' is a top-level statement, not inside a block", kw)
            if self.tok.kind != "STRING":
                raise self.error(f"expected the file to include as a string after 'include', got {self.tok.describe()}",
                                 self.tok)
            path = self.atom()
            return Include(path, kw.pos)
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

    def for_loop(self, in_def: bool = False) -> For:
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
        body = self.block(kw, ("end",), in_def)
        self.next()  # 'end'
        return For(var.value[0], tuple(args), tuple(body), kw.pos)

    def if_block(self, in_def: bool = False) -> If:
        kw = self.next()
        branches, orelse = [], ()
        opener = kw
        while True:
            cond = self.expression()
            self.expect_op(":", f"after the condition of '{opener.value}'")
            branches.append((cond, tuple(self.block(opener, _BLOCK_ENDS, in_def))))
            if self.at_keyword("elif"):
                opener = self.next()
                continue
            if self.at_keyword("else"):
                opener = self.next()
                self.expect_op(":", "after 'else'")
                orelse = tuple(self.block(opener, ("end",), in_def))
            self.next()  # 'end'
            return If(tuple(branches), orelse, kw.pos)

    def def_block(self) -> Def:
        kw = self.next()
        name = self.tok
        if name.kind != "NAME" or len(name.value) != 1 or not isinstance(name.value[0], str) \
                or "." in name.value[0] or name.value[0] in TYPE_WORDS:
            raise self.error(f"expected a function name after 'def', got {name.describe()}", name)
        self.next()
        self.expect_op("(", f"after 'def {name.value[0]}'")
        params: list[Param] = []
        while not self.at_op(")"):
            p = self.tok
            if p.kind != "NAME" or len(p.value) != 1 or not isinstance(p.value[0], str) \
                    or "." in p.value[0] or p.value[0] in TYPE_WORDS:
                raise self.error(f"expected a parameter name, got {p.describe()}", p)
            self.next()
            if any(q.name == p.value[0] for q in params):
                raise self.error(f"parameter '{p.value[0]}' repeated", p)
            default = None
            if self.at_op("="):
                self.next()
                default = self.expression()
            elif params and params[-1].default is not None:
                raise self.error(f"parameter '{p.value[0]}' without a default after one with a default", p)
            params.append(Param(p.value[0], default, p.pos))
            if not self.at_op(")"):
                self.expect_op(",", f"or ')' in the parameters of {name.value[0]}()")
        self.next()
        self.expect_op(":", f"after def {name.value[0]}(...)")
        body = self.block(kw, ("end",), in_def=True)
        self.next()  # 'end'
        return Def(name.value[0], tuple(params), tuple(body), kw.pos)

    # -- expressions ------------------------------------------------------------------------
    def expression(self):
        left = self.conjunction()
        while self.at_keyword("or"):
            op = self.next()
            left = BoolOp("or", left, self.conjunction(), op.pos)
        return left

    def conjunction(self):
        left = self.negation()
        while self.at_keyword("and"):
            op = self.next()
            left = BoolOp("and", left, self.negation(), op.pos)
        return left

    def negation(self):
        if self.at_keyword("not"):
            kw = self.next()
            self.nest(kw)
            operand = self.negation()
            self.depth -= 1
            return Not(operand, kw.pos)
        return self.comparison()

    def comparison(self):
        left = self.sum()
        if self.at_op(*COMPARE_OPS):
            op = self.next()
            right = self.sum()
            if self.at_op(*COMPARE_OPS):
                raise self.error("comparisons can't be chained: write 'a < b and b < c'", self.tok)
            return Compare(op.value, left, right, op.pos)
        return left

    def sum(self):
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
            nxt = self.toks[self.k + 1] if self.k + 1 < len(self.toks) else self.tok
            if self.tok.kind == "NUMBER" and not (nxt.kind == "OP" and nxt.value == "["):
                return self.number(-self.next().value, minus)  # -1 is a literal: printing gives back the same tree
            self.nest(minus)
            operand = self.unary()
            self.depth -= 1
            return Neg(operand, minus.pos)
        return self.postfix()

    def number(self, value, at) -> Num:
        if int_out_of_range(value):
            raise self.error(f"integer {value} is out of range ({INT64_RANGE})", at)
        return Num(value, at.pos)

    def postfix(self):
        value = self.atom()
        while self.at_op("["):
            bracket = self.next()
            if self.at_op("]"):
                raise self.error("expected an index inside '[ ]'", self.tok)
            self.nest(bracket)
            index = self.expression()
            self.depth -= 1
            self.expect_op("]", "to close '['")
            value = Index(value, index, bracket.pos)
        return value

    def atom(self):
        t = self.tok
        if t.kind == "NUMBER":
            self.next()
            return self.number(t.value, t)
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
            self.nest(self.next())
            expr = self.expression()
            self.depth -= 1
            self.expect_op(")", "to close '('")
            return expr
        raise self.error(f"expected an expression, got {t.describe()}", t)

    def call(self, func: str, name_tok: Token) -> Call:
        self.nest(self.next())  # '('
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
        self.depth -= 1
        return Call(func, tuple(args), tuple(kwargs), name_tok.pos)

    def parts(self, raw: tuple) -> tuple:
        """Name/string pieces: interpolations parsed into expressions."""
        out = []
        for p in raw:
            if isinstance(p, Interp):
                sub = Parser(p.tokens, self.source, self.filename, self.depth + 1)
                if sub.depth > MAX_NESTING:
                    raise self.error(_too_deep(), (p.line, p.col))
                if sub.tok.kind == "EOF":
                    raise self.error("empty '{}': expected an expression inside", (p.line, p.col))
                expr = sub.expression()
                if sub.tok.kind != "EOF":
                    raise sub.error(f"expected '}}' after the expression, got {sub.tok.describe()}", sub.tok)
                out.append(expr)
            else:
                out.append(p)
        return tuple(out)


def _too_deep() -> str:
    return f"nests more than {MAX_NESTING} levels deep (blocks, parentheses, calls and operators count)"


# the fields of each node class that hold nodes, or tuples of them (If.branches: (cond, body) pairs)
_NODE_FIELDS = {Str: ("parts",), Name: ("parts",), Neg: ("operand",), Not: ("operand",), BinOp: ("left", "right"),
                Compare: ("left", "right"), BoolOp: ("left", "right"), Index: ("value", "index"),
                Keyword: ("value",), Call: ("args", "kwargs"), Assign: ("target", "value"), ExprStmt: ("value",),
                For: ("range_args", "body"), If: ("branches", "orelse"), Param: ("default",),
                Def: ("params", "body"), Return: ("value",), Include: ("path",)}


def _children(n) -> list:
    """The nodes directly under an AST node."""
    out = []
    for f in _NODE_FIELDS.get(type(n), ()):
        v = getattr(n, f)
        if type(v) is not tuple:
            if v is not None:
                out.append(v)
            continue
        for x in v:
            if type(x) is tuple:   # an If branch: (condition, body)
                out.append(x[0])
                out.extend(x[1])
            elif type(x) is not str:
                out.append(x)
    return out


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
    p.check_depth(expr)
    return expr
