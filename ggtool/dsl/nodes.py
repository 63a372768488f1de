"""The AST. Nodes compare by content only (positions are ignored), so a round trip through the
printer can be checked with `==`."""

from __future__ import annotations

from dataclasses import dataclass, field

Pos = tuple  # (line, column), both 1-based


def _pos():
    return field(default=(0, 0), compare=False, repr=False)


@dataclass(frozen=True)
class Num:
    value: int | float
    pos: Pos = _pos()
    is_float: bool = field(init=False, repr=False)  # so that Num(1) != Num(1.0)

    def __post_init__(self):
        object.__setattr__(self, "is_float", isinstance(self.value, float))


@dataclass(frozen=True)
class Str:
    parts: tuple  # str pieces and interpolated expressions: "{arch}.block_count"
    pos: Pos = _pos()


@dataclass(frozen=True)
class Name:
    parts: tuple  # str pieces and interpolated expressions: blk.{i}.attn_q.weight
    pos: Pos = _pos()

    @property
    def plain(self) -> str | None:
        """The name if it has no interpolation."""
        if len(self.parts) == 1 and isinstance(self.parts[0], str):
            return self.parts[0]
        return None


@dataclass(frozen=True)
class TypeWord:
    name: str  # f32, f16, i32, q4_0, q8_0, ... as written
    pos: Pos = _pos()


@dataclass(frozen=True)
class Null:
    pos: Pos = _pos()


@dataclass(frozen=True)
class Neg:
    operand: Expr
    pos: Pos = _pos()


@dataclass(frozen=True)
class BinOp:
    op: str  # + - * / // %
    left: Expr
    right: Expr
    pos: Pos = _pos()  # the operator


@dataclass(frozen=True)
class Keyword:
    name: str
    value: Expr
    pos: Pos = _pos()


@dataclass(frozen=True)
class Call:
    func: str
    args: tuple = ()
    kwargs: tuple = ()  # Keyword nodes, in source order
    pos: Pos = _pos()


@dataclass(frozen=True)
class Compare:
    op: str  # == != < <= > >=
    left: Expr
    right: Expr
    pos: Pos = _pos()  # the operator


@dataclass(frozen=True)
class BoolOp:
    op: str  # and, or
    left: Expr
    right: Expr
    pos: Pos = _pos()  # the operator


@dataclass(frozen=True)
class Not:
    operand: Expr
    pos: Pos = _pos()


@dataclass(frozen=True)
class Index:
    value: Expr   # an array (a metadata array)
    index: Expr
    pos: Pos = _pos()  # the '['


Expr = Num | Str | Name | TypeWord | Null | Neg | BinOp | Compare | BoolOp | Not | Index | Call


@dataclass(frozen=True)
class Assign:
    target: Name
    value: Expr
    pos: Pos = _pos()


@dataclass(frozen=True)
class ExprStmt:
    value: Expr
    pos: Pos = _pos()


@dataclass(frozen=True)
class For:
    var: str
    range_args: tuple  # 1 to 3 expressions, as Python's range()
    body: tuple
    pos: Pos = _pos()


@dataclass(frozen=True)
class If:
    branches: tuple  # ((condition, body), ...): the if, then each elif, in order
    orelse: tuple = ()  # the else body
    pos: Pos = _pos()


@dataclass(frozen=True)
class Param:
    name: str
    default: Expr | None = None
    pos: Pos = _pos()


@dataclass(frozen=True)
class Def:
    name: str
    params: tuple  # Param nodes
    body: tuple
    pos: Pos = _pos()


@dataclass(frozen=True)
class Return:
    value: Expr
    pos: Pos = _pos()


@dataclass(frozen=True)
class Include:
    path: Str
    pos: Pos = _pos()


Stmt = Assign | ExprStmt | For | If | Def | Return | Include


@dataclass(frozen=True)
class Program:
    body: tuple
    source: str = field(default="", compare=False, repr=False)
    filename: str = field(default="<program>", compare=False, repr=False)
