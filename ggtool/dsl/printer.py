"""AST -> canonical source: one statement a line, loop bodies indented by 4, minimal parentheses.
`parse(unparse(parse(s))) == parse(s)` for every program."""

from __future__ import annotations

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
    Program,
    Return,
    Str,
    TypeWord,
)

INDENT = "    "
# or < and < not < comparisons < + - < * / // % < unary minus < atoms (and x[i])
_OR, _AND, _NOT, _CMP = 1, 2, 3, 4
_PREC = {"+": 5, "-": 5, "*": 6, "/": 6, "//": 6, "%": 6}
_UNARY, _ATOM = 7, 8
_STR_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\t": "\\t", "{": "{{", "}": "}}"}


def unparse(node) -> str:
    """Canonical source of a Program, a statement or an expression."""
    if isinstance(node, Program):
        return "".join(line + "\n" for line in _stmts(node.body, 0))
    if isinstance(node, (Assign, ExprStmt, For, If, Def, Return, Include)):
        return "\n".join(_stmts((node,), 0))
    return _expr(node)


def _stmts(body, depth: int):
    pad = INDENT * depth
    for s in body:
        if isinstance(s, Assign):
            yield f"{pad}{_expr(s.target)} = {_expr(s.value)}"
        elif isinstance(s, ExprStmt):
            yield f"{pad}{_expr(s.value)}"
        elif isinstance(s, For):
            args = ", ".join(_expr(a) for a in s.range_args)
            yield f"{pad}for {s.var} in range({args}):"
            yield from _stmts(s.body, depth + 1)
            yield f"{pad}end"
        elif isinstance(s, If):
            for k, (cond, body) in enumerate(s.branches):
                yield f"{pad}{'if' if k == 0 else 'elif'} {_expr(cond)}:"
                yield from _stmts(body, depth + 1)
            if s.orelse:
                yield f"{pad}else:"
                yield from _stmts(s.orelse, depth + 1)
            yield f"{pad}end"
        elif isinstance(s, Def):
            params = ", ".join(p.name if p.default is None else f"{p.name}={_expr(p.default)}" for p in s.params)
            yield f"{pad}def {s.name}({params}):"
            yield from _stmts(s.body, depth + 1)
            yield f"{pad}end"
        elif isinstance(s, Return):
            yield f"{pad}return {_expr(s.value)}"
        elif isinstance(s, Include):
            yield f"{pad}include {_expr(s.path)}"
        else:
            raise TypeError(f"not a statement: {s!r}")


def _prec(e) -> int:
    if isinstance(e, BinOp):
        return _PREC[e.op]
    if isinstance(e, BoolOp):
        return _OR if e.op == "or" else _AND
    if isinstance(e, Not):
        return _NOT
    if isinstance(e, Compare):
        return _CMP
    if isinstance(e, Neg) or (isinstance(e, Num) and str(e.value).startswith("-")):
        return _UNARY
    return _ATOM


def _wrap(e, parens: bool) -> str:
    s = _expr(e)
    return f"({s})" if parens else s


def _expr(e) -> str:
    if isinstance(e, Num):
        return repr(e.value) if isinstance(e.value, float) else str(e.value)
    if isinstance(e, Str):
        return '"' + "".join(_str_part(p) for p in e.parts) + '"'
    if isinstance(e, Name):
        return "".join(p if isinstance(p, str) else "{" + _expr(p) + "}" for p in e.parts)
    if isinstance(e, TypeWord):
        return e.name
    if isinstance(e, Null):
        return "null"
    if isinstance(e, Neg):
        # -(1) stays Neg(Num(1)); without parentheses it would parse back as the literal -1
        return "-" + _wrap(e.operand, isinstance(e.operand, Num) or _prec(e.operand) < _UNARY)
    if isinstance(e, BinOp):
        p = _PREC[e.op]
        return f"{_wrap(e.left, _prec(e.left) < p)} {e.op} {_wrap(e.right, _prec(e.right) <= p)}"
    if isinstance(e, BoolOp):
        p = _prec(e)
        return f"{_wrap(e.left, _prec(e.left) < p)} {e.op} {_wrap(e.right, _prec(e.right) <= p)}"
    if isinstance(e, Not):
        return "not " + _wrap(e.operand, _prec(e.operand) < _NOT)
    if isinstance(e, Compare):  # comparisons do not chain: both sides bind tighter
        return f"{_wrap(e.left, _prec(e.left) <= _CMP)} {e.op} {_wrap(e.right, _prec(e.right) <= _CMP)}"
    if isinstance(e, Index):
        return f"{_wrap(e.value, _prec(e.value) < _ATOM)}[{_expr(e.index)}]"
    if isinstance(e, Call):
        args = [_expr(a) for a in e.args] + [_keyword(k) for k in e.kwargs]
        return f"{e.func}({', '.join(args)})"
    raise TypeError(f"not an expression: {e!r}")


def _keyword(k: Keyword) -> str:
    return f"{k.name}={_expr(k.value)}"


def _str_part(p) -> str:
    if isinstance(p, str):
        return "".join(_STR_ESCAPES.get(c, c) for c in p)
    s = _expr(p)
    return "{(" + s + ")}" if s.startswith("{") else "{" + s + "}"  # "{{" would be a literal brace
